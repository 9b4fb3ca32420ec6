"""Device-side teams: a wide row split over K programs that meet on the device, without a second launch.

A *team* is K programs that each keep one chunk of a row in registers, publish a few fp32
partial statistics of their chunk, wait until all K teammates have published, combine the K
partials in a fixed order (the same bits on every run and in every member) and then write their
chunk's output from registers: one DRAM read and one write per element, however wide the row.

Teams are **persistent**: the grid holds ``teams * K`` programs, all resident on the device at
once, and team ``t`` takes rows ``t, t + teams, ...``. A member issues the loads of its next row's
chunk before it waits for its teammates on the current row, so that DRAM keeps streaming while a
team meets (without that overlap the teams of the first version, one program per chunk, ran
slower than one program reading the row twice).

Publishing. Each statistic of a row goes into its own int64 slot of a zeroed workspace as one word,
``1 << 32 | fp32 bits``, written with a relaxed atomic exchange (``team_publish``): the word is its
own flag, so no fence orders it behind the program's other stores. ``team_gather`` polls the K
words of a statistic with ``volatile`` loads (from L2, never a stale L1 line) until all carry the
flag. Two statistics of a member (softmax's and the cross-entropy's max and sum of exp; layer_norm's two sums in
the tiers that choose it, ``TeamPlan.pair_word``) may share one word (``team_publish_pair``: the first's bits above
the complement of the second's, never 0), so such a meeting polls one word per member, not two (session 29). The
workspace is ``torch.zeros`` made by the host per call: one memset, no host sync, fine in CUDA graphs and under
torch.compile (a kernel that never meets, such as the softmax forward's team of one, gets none).

Forward progress: a waiting program only waits on its teammates, and all programs of the grid are
resident at once, because the grid never exceeds the multiprocessor count times the programs one
multiprocessor is sure to hold (``programs_per_sm``: on NVIDIA bounded by threads and by the
``maxnreg`` register cap the launch sets; 1 per compute unit elsewhere, which any program that
launches at all satisfies).

The Triton interpreter runs programs one after the other, so a waiting program would spin for
ever there. The kernels take a ``PHASE`` constexpr: 0 = everything in one launch (the GPU path);
1 = publish every row's partials only; 2 = gather and write only. Under the interpreter the host
launches phase 1 then phase 2 (``team_phases``), which runs the same publish and combine code
without ever spinning. A team of one (K = 1) never waits on anybody.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ._device import MAX_THREADS_PER_PROGRAM, cdiv, device_warp_size, launch_options, next_power_of_2

# Streaming multiprocessors assumed for a CPU tensor (the interpreter), so that CPU tests split rows too.
CPU_SMS = 8
# The partials are read as a vector of at least this many (one compiled kernel across row widths).
TEAM_P2_MIN = 16


@triton.jit
def team_publish(slot_ptr, value):
    """Publishes the fp32 scalar ``value`` into the zeroed int64 slot ``slot_ptr``."""
    bits = value.to(tl.uint32, bitcast=True).to(tl.int64)
    tl.atomic_xchg(slot_ptr, bits | 4294967296, sem="relaxed")


@triton.jit
def team_gather(slots_ptr, k, count, other):
    """The fp32 statistics ``slots_ptr[k]`` (``k`` = arange over a power of 2) of the first ``count``
    members, once every one is published; ``other`` beyond ``count``."""
    live = k < count
    words = tl.load(slots_ptr + k, mask=live, other=4294967296, volatile=True)
    while tl.min((words >> 32).to(tl.int32), 0) == 0:
        words = tl.load(slots_ptr + k, mask=live, other=4294967296, volatile=True)
    return tl.where(live, (words & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True), other)


@triton.jit
def team_publish_pair(slot_ptr, a, b):
    """Publishes the fp32 scalars ``a`` and ``b`` together into the zeroed int64 slot ``slot_ptr``: one word,
    ``a``'s bits above the complement of ``b``'s. No pair reads as the zero of an empty slot: that needs ``b``'s bits
    0xFFFFFFFF, a NaN, published as the NaN 0x7FFFFFFF instead (the combine gives NaN either way)."""
    lo = b.to(tl.uint32, bitcast=True)
    lo = tl.where(lo == 0xFFFFFFFF, 0x7FFFFFFF, lo) ^ 0xFFFFFFFF
    hi = a.to(tl.uint32, bitcast=True).to(tl.int64)
    tl.atomic_xchg(slot_ptr, (hi << 32) | lo.to(tl.int64), sem="relaxed")


@triton.jit
def team_gather_pair(slots_ptr, k, count, other_a, other_b):
    """The two fp32 statistics that ``team_publish_pair`` put in ``slots_ptr[k]`` for the first ``count``
    members, once every one is published (``other_a`` / ``other_b`` beyond ``count``): one word per member, so a
    row's meeting polls as many words as for one statistic and waits one L2 round trip."""
    live = k < count
    words = tl.load(slots_ptr + k, mask=live, other=-1, volatile=True)
    while tl.min((words != 0).to(tl.int32), 0) == 0:
        words = tl.load(slots_ptr + k, mask=live, other=-1, volatile=True)
    a = (words >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    b = (words.to(tl.int32) ^ -1).to(tl.float32, bitcast=True)
    return tl.where(live, a, other_a), tl.where(live, b, other_b)


@triton.jit
def team_publish_first(slots_ptr, member, a, PAIR_WORD: tl.constexpr):
    """The first of a member's two statistics, as soon as it exists: into ``slots_ptr[member]`` (``team_publish``)
    in the two-word form; nothing in the pair-word form (the pair goes out with the second, ``team_publish_second``).
    Publishing the first word before the second statistic is reduced lets the teammates' gathers of it overlap that
    reduction: publishing both at the end cost the layer_norm backward's 4-warp teams 7-10% (session 30)."""
    if PAIR_WORD == 0:
        team_publish(slots_ptr + member, a)


@triton.jit
def team_publish_second(slots_ptr, member, count, a, b, PAIR_WORD: tl.constexpr):
    """The second statistic ``b``: one pair word ``(a, b)`` at ``slots_ptr[member]`` (``team_publish_pair``), or
    ``b`` alone at ``slots_ptr[count + member]`` after ``team_publish_first`` sent ``a``; for kernels whose tiers
    choose (``TeamPlan.pair_word``: the layer_norm forward, whose second statistic needs the first)."""
    if PAIR_WORD:
        team_publish_pair(slots_ptr + member, a, b)
    else:
        team_publish(slots_ptr + count + member, b)


@triton.jit
def add_pair(a0, b0, a1, b1):
    """The ``tl.reduce`` combine of two sums at once: one pass of a block's barriers instead of two."""
    return a0 + a1, b0 + b1


@triton.jit
def sum_pair(va, vb, JOINT: tl.constexpr):
    """``(sum(va), sum(vb))`` over axis 0: one ``tl.reduce`` of both where ``JOINT`` (one pass of a block's barriers),
    else two ``tl.sum``, the same numbers on a GPU. The launchers pass ``JOINT`` 0 under the interpreter, which runs
    a ``tl.reduce`` with a combine function element by element in Python (a test of 64 KiB rows: 3 s -> 29 s)."""
    if JOINT:
        a, b = tl.reduce((va, vb), 0, add_pair)
    else:
        a = tl.sum(va, axis=0)
        b = tl.sum(vb, axis=0)
    return a, b


@triton.jit
def team_publish_sums(slots_ptr, member, count, va, vb, PAIR_WORD: tl.constexpr, JOINT: tl.constexpr = 1):
    """This member's ``sum(va)`` and ``sum(vb)`` (fp32 chunks), published as ``team_gather_two`` reads them, for two
    statistics that need not wait on each other. Two words: ``sum(va)`` goes out as soon as it is reduced
    (``team_publish_first``). Pair word: both sums in one joint reduction, which shares the block's barriers (11
    ``bar.sync`` per row instead of 14 in the layer_norm backward's 4-warp tier): +4.3 / +4.9% on its teams of 6 / 8
    members (H200, session 31); the same joint reduction in the two-word form delays the first word and lost 3.6-5.4%
    on teams of 32-128 members. ``JOINT``: as ``sum_pair``'s."""
    if PAIR_WORD:
        a, b = sum_pair(va, vb, JOINT)
    else:
        a = tl.sum(va, axis=0)
        team_publish_first(slots_ptr, member, a, PAIR_WORD)
        b = tl.sum(vb, axis=0)
    team_publish_second(slots_ptr, member, count, a, b, PAIR_WORD)


@triton.jit
def team_gather_two(slots_ptr, k, count, other_a, other_b, PAIR_WORD: tl.constexpr):
    """The team's two statistics as ``team_publish_first`` / ``team_publish_second`` or ``team_publish_sums`` put
    them (two words: the second gathered after the first)."""
    if PAIR_WORD:
        a, b = team_gather_pair(slots_ptr, k, count, other_a, other_b)
    else:
        a = team_gather(slots_ptr, k, count, other_a)
        b = team_gather(slots_ptr + count, k, count, other_b)
    return a, b


@triton.jit
def team_start(TEAM, N, BLOCK_N: tl.constexpr):
    """This program's ``(member, first row (int64), columns of its chunk, their mask < N)``."""
    pid = tl.program_id(0)
    member = pid % TEAM
    offs = member * BLOCK_N + tl.arange(0, BLOCK_N)
    return member, (pid // TEAM).to(tl.int64), offs, offs < N


def team_phases(device, team: int) -> tuple:
    """The PHASE values to launch a team kernel with: ``(0,)`` (one launch, members spin) on a GPU or
    for a team of one; ``(1, 2)`` under the interpreter (CPU tensors), which runs programs one at a time."""
    return (0,) if device.type != "cpu" or team == 1 else (1, 2)


@functools.lru_cache(maxsize=64)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; ``CPU_SMS`` for anything else."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return CPU_SMS


def _nvidia(device: torch.device) -> bool:
    return device.type == "cuda" and torch.version.hip is None


def programs_per_sm(device: torch.device, num_warps: int, tuned: dict) -> int:
    """Programs of ``num_warps`` warps that one multiprocessor is sure to hold at once: on NVIDIA
    ``tuned["programs_per_sm"]`` capped by 2048 threads and by 65536 registers at ``tuned["maxnreg"]`` per
    thread (the launch caps the kernel's registers there); 1 elsewhere."""
    if not _nvidia(device):
        return 1
    threads = num_warps * 32
    return max(1, min(tuned["programs_per_sm"], 2048 // threads, 65536 // (tuned["maxnreg"] * threads)))


@dataclass(frozen=True)
class TeamPlan:
    """A persistent grid of ``teams`` teams of ``team`` programs, each ``block_n`` columns wide."""

    team: int  # programs per row (team * block_n >= N)
    teams: int  # teams in the grid (<= rows); the grid is teams * team programs
    block_n: int  # BLOCK_N constexpr (a power of 2)
    num_warps: int
    maxnreg: int  # register cap per thread (NVIDIA launches only)
    fp_fusion: bool = False  # contract a * b + c everywhere in the kernel (where no result must round as eager)
    affine: int = 0  # the norm forwards' AFFINE constexpr: where a member loads its weight / bias (see _wide)
    hold: bool = False  # the norm forwards' HOLD: x kept in its storage dtype while the team meets (see _wide)
    pair_word: bool = True  # kernels that choose: two statistics meet in one word (team_publish_pair), else two
    depth: int = 1  # the rms_norm forward's DEPTH: rows of a member's chunk loaded ahead (see _wide)

    @property
    def grid(self) -> tuple:
        return (self.teams * self.team,)

    def meta(self, kernel, device: torch.device, phase: int, **constexprs) -> tuple:
        """Constexprs and launch options of one launch of ``kernel`` (``meta_items`` pairs)."""
        options = launch_options(kernel, self.fp_fusion)  # nothing under the interpreter
        if _nvidia(device):
            options["maxnreg"] = self.maxnreg
        return tuple({**constexprs, "BLOCK_N": self.block_n, "TEAM_P2": max(next_power_of_2(self.team),
                      TEAM_P2_MIN), "PHASE": phase, "num_warps": self.num_warps, **options}.items())


def tier_for(tuned, row_bytes: int, elems: int) -> Optional[dict]:
    """The setting for rows of ``row_bytes`` bytes (``elems`` elements): ``tuned`` itself (a dict or None), or for
    a list of tiers the first that the row reaches (``min_row_bytes``) and whose team, ceil(row_bytes / chunk_bytes)
    programs, has at most its ``max_team`` members, for rows of at most its ``max_elems`` elements (no limit
    without one), else the last."""
    if not isinstance(tuned, (list, tuple)):
        return tuned
    for s in tuned:  # a plain loop: this runs on every call of the ops that may take teams
        if row_bytes >= s["min_row_bytes"] and -(-row_bytes // s["chunk_bytes"]) <= s.get("max_team", math.inf) \
                and elems <= s.get("max_elems", math.inf):
            return s
    return tuned[-1]


def team_split(N: int, elem: int, rows: int, device: torch.device, tuned, on_cpu: bool) -> Optional[TeamPlan]:
    """The persistent teams for ``rows`` rows of ``N`` elements of ``elem`` bytes, or None (no team).

    ``tuned``: ``{"min_row_bytes", "chunk_bytes", "num_warps", "programs_per_sm", "maxnreg"}`` and optionally
    ``"fp_fusion"`` (default False: the launch keeps eager rounding, ``_device.launch_options``), ``"affine"``
    (default 0: the norm forwards' ``AFFINE``), ``"hold"`` (default False: their ``HOLD``), ``"depth"`` (default 1: the
    rms_norm forward's ``DEPTH``) and ``"pair_max_team"``
    (``pair_word`` for teams of at most this many members; default: every team), a list of such
    settings by row width (``tier_for``), or None (never); ``on_cpu``: teams on CPU tensors (the interpreter).
    Rows of at least ``min_row_bytes`` go to ceil(N / block_n) programs of ``block_n`` = chunk_bytes / elem (a
    power of 2) columns; None when not even one team fits the device at once.
    """
    if tuned is None or (device.type == "cpu" and not on_cpu):
        return None
    tuned = tier_for(tuned, N * elem, N)
    if N * elem < tuned["min_row_bytes"]:
        return None
    block = next_power_of_2(max(tuned["chunk_bytes"] // elem, 1))
    team = cdiv(N, block)
    warps = max(min(tuned["num_warps"], MAX_THREADS_PER_PROGRAM // device_warp_size(device)), 1)
    teams = min(rows, sm_count(device) * programs_per_sm(device, warps, tuned) // team)
    if teams < 1 or rows * team >= 2**31:
        return None
    return TeamPlan(team, teams, block, warps, tuned["maxnreg"], bool(tuned.get("fp_fusion", False)),
                    int(tuned.get("affine", 0)), bool(tuned.get("hold", False)),
                    team <= tuned.get("pair_max_team", team), int(tuned.get("depth", 1)))
