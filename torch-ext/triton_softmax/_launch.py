"""Launch settings for the softmax and cross-entropy kernels, in one place.

Every kernel reduces one row of ``N`` elements per program. When the row fits in
one block of registers (``BLOCK_N = next_pow2(N)`` elements, at most
``MAX_FUSED_BYTES`` of input) the program reads the row once and keeps it in
registers (single pass: read once, write once). Wider rows (131072, 262147, a
128K vocabulary) loop over the row in chunks of ``LOOP_BLOCK_BYTES``: an online
max/sum pass, then an output pass that reads the row again right away (last chunk first, with L2
eviction hints, so the re-read mostly hits L2). No row is too wide. Narrow rows go several to a
program (``rows``) so that a program moves at least ``MIN_TILE_BYTES``.

Where ``TEAM_TUNED[kind]`` is set (a setting, or a list of settings by row width), rows of at least its
``min_row_bytes`` go to persistent teams of programs instead (``team_for``; see ``_team``): each keeps
``chunk_bytes`` of a row in registers and the row is read once however wide it is, as long as one team
fits the device at once.

Warps follow from the block's size in bytes (``BYTES_PER_THREAD`` of input per
thread: four 16-byte vectors) and are capped so that
``num_warps * warp_size <= 1024`` threads per program, the hardware limit on both
NVIDIA (32-lane warps) and AMD (64-lane wavefronts).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ._device import MAX_THREADS_PER_PROGRAM, cdiv, check_config_args, config_cache, device_warp_size, next_power_of_2
from ._team import CPU_SMS, TeamPlan, sm_count as _sm_count, team_split  # noqa: F401 (CPU_SMS: split_for on CPU)

# Largest row (bytes of input) kept in registers in one block: 16K fp32 / 32K bf16 elements.
MAX_FUSED_BYTES = 65536
# Chunk size (bytes of input) of the looped path for wider rows.
LOOP_BLOCK_BYTES = 16384
# Bytes of input per thread the warp count aims for.
BYTES_PER_THREAD = 64
# Narrow rows: several rows per program until the tile holds this many bytes of input.
MIN_TILE_BYTES = 2048
# Looped rows: the output pass walks the chunks last to first (the ones most recently read are the
# likeliest still in L2), and the loads carry these eviction hints (first pass, re-read).
LOOP_REVERSE = True
LOOP_EVICT = ("evict_last", "evict_first")
# Looped rows: issue the next chunk's loads before reducing the current one (two chunks in flight).
LOOP_PREFETCH = True


@dataclass(frozen=True)
class LaunchConfig:
    """How one row of N elements is processed by one program."""

    block_n: int  # BLOCK_N constexpr: elements handled per step
    num_warps: int  # warps per program; num_warps * warp_size <= 1024
    loop: bool  # True: several chunks of BLOCK_N per row (online max/sum, then an output pass)
    rows: int = 1  # ROWS constexpr: rows per program (a ROWS x BLOCK_N tile); 1 when loop
    reverse: bool = False  # looped: output pass from the last chunk to the first
    evict: tuple = ("", "")  # looped: eviction hints of the first pass and of the re-read
    split: int = 0  # looped softmax: programs per row (0: chosen by split_for from the row count)
    prefetch: bool = False  # looped: load chunk i+1 before working on chunk i

    @property
    def loop_options(self) -> dict:
        """The looped path's constexpr keywords (REVERSE, EVICT1, EVICT2, PREFETCH)."""
        return {"REVERSE": self.reverse, "EVICT1": self.evict[0], "EVICT2": self.evict[1], "PREFETCH": self.prefetch}


@config_cache(4096)
def pick_config(N: int, element_size: int, warp_size: int = 32) -> LaunchConfig:
    """Picks (BLOCK_N, num_warps, loop) for rows of ``N`` elements.

    Args:
        N: row length (the reduced size), >= 1.
        element_size: bytes per input element (2 for fp16/bf16, 4 for fp32).
        warp_size: lanes per warp of the device (32 NVIDIA, 64 on AMD CDNA).

    Raises:
        ValueError: N or element_size not an int >= 1, a warp_size that is not a
            power of two in [1, 1024].
    """
    check_config_args(N, element_size, warp_size)
    block = next_power_of_2(N)
    loop = block * element_size > MAX_FUSED_BYTES
    rows = 1
    if loop:
        block = LOOP_BLOCK_BYTES // element_size
    else:
        rows = max(MIN_TILE_BYTES // (block * element_size), 1)
    threads = max(rows * block * element_size // BYTES_PER_THREAD, 1)
    num_warps = next_power_of_2(max(threads // warp_size, 1))
    num_warps = min(num_warps, MAX_THREADS_PER_PROGRAM // warp_size)
    if loop:
        return LaunchConfig(block_n=block, num_warps=num_warps, loop=True, reverse=LOOP_REVERSE, evict=LOOP_EVICT,
                            prefetch=LOOP_PREFETCH)
    return LaunchConfig(block_n=block, num_warps=num_warps, loop=False, rows=rows)


# Measured per kernel kind (benchmarks/NOTES.md): replacements for the looped path's
# (block_n in bytes -> elements, num_warps, ...) where a kind prefers other settings than the general rule.
# H200 round 2 (benchmarks/results/softmax_2026-11-30.md): the softmax forward is fastest one block per
# row only up to 32 KiB and without prefetch when looped (B8192 w8: 3466 GB/s at N=32768 against 3024 in one
# block; 3087/2757/2573 at 65536/131072/262144); the backward loops best over 32 KiB chunks with 16 warps and
# prefetch (3778/3112/2723 against 3154/2725/2535). The cross-entropy (benchmarks/results/
# cross_entropy_2026-12-01.md, CUDA-graph kernel time, bf16): the training forwards ("cross_entropy_grad": the
# gradient written, or the logsumexp kept for the recompute backward, chunked alike so both see the same
# logsumexp) over 4 KiB chunks with 4 warps (8192 x 128256: 1638 us against 1703 over 8 KiB; 8192 x
# 32000: 432 us against 530 in one block), the forward alone over 8 KiB chunks with 4 warps (575 us at
# 8192 x 128256; 158 us against 240 in one block at 8192 x 32000).
LOOP_TUNED: dict = {
    "softmax": {"prefetch": False},
    "softmax_bwd": {"block_bytes": 32768, "num_warps": 16, "prefetch": True},
    "cross_entropy": {"block_bytes": 8192, "num_warps": 4, "prefetch": True},
    "cross_entropy_grad": {"block_bytes": 4096, "num_warps": 4, "prefetch": True},
}
# The kinds that keep a row in one block only up to this many bytes and loop over wider rows (the others:
# up to MAX_FUSED_BYTES). The cross-entropy in one block at 64 KiB rows held the whole row in fp32
# registers of 32 warps: one program per SM, its loads not overlapped with the math (see LOOP_TUNED).
FWD_MAX_FUSED_BYTES = {"softmax": 32768, "cross_entropy": 16384, "cross_entropy_grad": 16384}


def config_for(N: int, t: torch.Tensor, kind: str = "softmax") -> LaunchConfig:
    """:func:`pick_config` for rows of ``N`` elements of ``t`` on ``t``'s device; a looped row takes the
    settings measured for ``kind`` ("softmax", "softmax_bwd", "cross_entropy", "cross_entropy_grad") from
    ``LOOP_TUNED``, and rows wider than ``FWD_MAX_FUSED_BYTES[kind]`` loop."""
    cfg = pick_config(N, t.element_size(), device_warp_size(t.device))
    limit = FWD_MAX_FUSED_BYTES.get(kind)
    if limit is not None and not cfg.loop and cfg.block_n * t.element_size() > limit \
            and LOOP_TUNED.get(kind) is not None:
        block = LOOP_BLOCK_BYTES // t.element_size()
        warps = next_power_of_2(max(LOOP_BLOCK_BYTES // BYTES_PER_THREAD // device_warp_size(t.device), 1))
        cfg = LaunchConfig(block_n=block, num_warps=min(warps, MAX_THREADS_PER_PROGRAM // device_warp_size(t.device)),
                           loop=True, reverse=LOOP_REVERSE, evict=LOOP_EVICT, prefetch=LOOP_PREFETCH)
    tuned = LOOP_TUNED.get(kind) if cfg.loop else None
    if tuned:
        tuned = dict(tuned)
        if "block_bytes" in tuned:
            tuned["block_n"] = tuned.pop("block_bytes") // t.element_size()
        if "num_warps" in tuned:
            tuned["num_warps"] = min(tuned["num_warps"], MAX_THREADS_PER_PROGRAM // device_warp_size(t.device))
        cfg = dataclasses.replace(cfg, **tuned)
    return cfg


# Few wide rows: split a row over several programs when there are fewer than this many rows per SM.
SPLIT_BELOW_ROWS_PER_SM = 4
# ... aiming at this many programs per SM in all.
SPLIT_PROGRAMS_PER_SM = 4
def split_for(cfg: LaunchConfig, N: int, rows: int, device: torch.device) -> int:
    """Programs per row for a looped softmax: 1 (one program reads its row twice, the second time
    mostly from L2) unless there are too few rows to fill the GPU, then enough to give every SM
    ``SPLIT_PROGRAMS_PER_SM`` programs (each row read once per launch of a two-launch pass)."""
    if not cfg.loop:
        return 1
    if cfg.split:
        return cfg.split
    sms = _sm_count(device)
    if rows >= SPLIT_BELOW_ROWS_PER_SM * sms:
        return 1
    return max(1, min(cdiv(N, cfg.block_n), cdiv(SPLIT_PROGRAMS_PER_SM * sms, rows)))


# Team path per kernel kind (``_team``: persistent teams, each row read once): rows of at least
# ``min_row_bytes`` of input go to teams of ceil(row bytes / chunk_bytes) programs of ``num_warps`` warps,
# ``programs_per_sm`` of them per SM with at most ``maxnreg`` registers per thread (NVIDIA; one per
# compute unit elsewhere); a list holds tiers by row width (``_team.tier_for``: the first whose team has at
# most ``max_team`` members, for rows of at most ``max_elems`` elements); None: never (the looped path). Measured on the H200 (bf16, 2026-12-01/02,
# benchmarks/NOTES.md):
# - the forward and the cross-entropy are fastest where a team has about 32 members, the chunk growing
#   with the row at 16 warps and 64 elements per thread on each SM (session 15,
#   results/team_tiers_2026-12-02.txt, results/cross_entropy_team_2026-12-02.txt): softmax forward at
#   N = 65536 / 131072 / 262144 (M x N = 2^28) 3485 / 3445 / 3259 GB/s against 3097 / 2766 / 2577 looped (and
#   3212 at 131072 on the single 16 KiB setting before); 64 KiB bf16 rows stay looped (3501 against 3437);
#   cross-entropy at V = 65536 / 100000 / 128256 / 200064 / 262144: 3071 / 2907 / 3089 / 2909 / 2954 against
#   2532 / 2441 / 2546 / 2446 / 2484 looped (at 100000 the 4 KiB tier, 49 members, was 1.4% faster than
#   the 8 KiB one). The cross-entropy matches torch within tolerances, not bit for bit, so a * b + c may
#   contract in its team kernel (``fp_fusion``, loss and logsumexp included: +1.5%);
# - the backward over 8 KiB chunks moved 4158 / 3839 / 3570 GB/s at N = 65536 / 131072 / 262144 against
#   3857 / 3094 / 2715 looped, and 2-3% more from N = 16384 (session 8); session 15 re-measured it at
#   3876 / 3791 / 3577 and found 4 KiB chunks (32 elements per thread, team of 32) faster at 65536: 4039.
#   Rows under 128 KiB stay looped since session 16 (results/team_tiers_bwd_session16_2026-12-02.txt): at
#   16384 x 16384 the looped backward moved 4191 GB/s against 3892 for the 8 KiB team tier (best team 3978),
#   at 8192 x 32768 4032 against 3846 (best team 3909).
_BY_WIDTH = ({"chunk_bytes": 4096, "num_warps": 1, "programs_per_sm": 16},
             {"chunk_bytes": 8192, "num_warps": 2, "programs_per_sm": 8},
             {"chunk_bytes": 16384, "num_warps": 4, "programs_per_sm": 4})
# - since the exps are one ex2.approx.ftz each (session 30, results/session30_2026-12-03.txt), 64 KiB rows too: 4096 x
#   32768 bf16 3643 -> 3856 GB/s on a team of 16 (A/B against the looped kernel, both with the ftz exps, 5 rounds;
#   session 29 had measured a tie, 3631 against 3625, before). fp32 rows of 64-128 KiB follow unmeasured;
# - fp32 rows of 32-64 KiB (8193-16384 elements), looped before, go one row per program of 32 warps ("teams" of
#   one, the kernel's ALONE path: no meeting), persistent, each program loading its next row while it reduces this
#   one (session 24, results/session24_softmax_teams_2026-12-03.txt): 4096 x 16384 3310 -> 3803 GB/s, 8192 x 12007
#   3204 -> 3886. Not for 16-bit rows of those bytes (twice the elements: 4096 x 32768 bf16 3249 against 3529
#   looped), nor for narrower rows (16384 x 8192 fp32 4095 against 4292 one block per program). Measured without
#   a mask, not causal, with thousands of rows: ``softmax._fwd_plan`` keeps masked, causal rows and fewer than
#   SPLIT_BELOW_ROWS_PER_SM rows per SM (the split path's case) off it.
_ALONE_FP32 = {"min_row_bytes": 32769, "chunk_bytes": 65536, "max_team": 1, "max_elems": 16384, "num_warps": 32,
               "programs_per_sm": 1, "maxnreg": 64}
TEAM_TUNED: dict = {
    "softmax": [_ALONE_FP32, *({"min_row_bytes": 65536, "maxnreg": 128, "max_team": 32, **s} for s in _BY_WIDTH)],
    "softmax_bwd": [{"min_row_bytes": 131072, "chunk_bytes": 4096, "num_warps": 2, "programs_per_sm": 8,
                     "maxnreg": 128, "max_team": 32},
                    {"min_row_bytes": 131072, "chunk_bytes": 8192, "num_warps": 4, "programs_per_sm": 4,
                     "maxnreg": 128}],
    "cross_entropy": [{"min_row_bytes": 65536, "maxnreg": 128, "max_team": 32, "fp_fusion": True, **s}
                      for s in _BY_WIDTH],
}
# Teams only for rows that start on 16 bytes where the caller says (``team_for``'s ``aligned``); the tests
# switch this off to run teams on any row.
TEAM_ALIGNED_ROWS_ONLY = True
# Teams on CPU tensors (the interpreter runs a team as two launches, publish then write). Off by default
# (the looped kernels are the CPU path); the tests switch it on.
TEAM_ON_CPU = False


def team_for(N: int, t: torch.Tensor, rows: int, kind: str,
             aligned: Optional[Callable[[], bool]] = None) -> Optional[TeamPlan]:
    """The persistent teams (``_team.TeamPlan``) for ``rows`` rows of ``N`` elements of ``t`` (kind as in
    ``TEAM_TUNED``), or None for the one-program-per-row kernels (also when not even one team fits the
    device at once: the forward-progress condition of ``_team``).

    ``aligned``: None, or a test whether every row starts on 16 bytes (``_common.rows_aligned``), called only
    when a team would be planned (host time). Rows that do not stay off the
    teams (``TEAM_ALIGNED_ROWS_ONLY``), where the cross-entropy passes it: loads and stores are scalar there
    and teams gained nothing (16384 x 50257 bf16: 1654-1813 GB/s on three team settings, 1825 looped;
    session 15)."""
    plan = team_split(N, t.element_size(), rows, t.device, TEAM_TUNED.get(kind), TEAM_ON_CPU)
    if plan is not None and aligned is not None and TEAM_ALIGNED_ROWS_ONLY and not aligned():
        return None
    return plan


# The launch plans of softmax.py and cross_entropy.py (one per call signature: shapes, strides, dtypes, device,
# flags) are worked out from the settings above once; their caches register here.
PLAN_CACHES: list = []
_CACHED_PICK_CONFIG = pick_config


def retuned() -> None:
    """Drops every launch plan and cached config made so far. Call it after changing a setting of this module
    (a sweep timing settings, a test forcing a path), so that the next call of each signature plans with the
    new settings."""
    _CACHED_PICK_CONFIG.cache_clear()  # the lru-cached function (a sweep may have rebound the name)
    for cache in PLAN_CACHES:
        cache.clear()
