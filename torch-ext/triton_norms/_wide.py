"""Wide rows of RMSNorm and LayerNorm (free summation order) over persistent teams: read once.

A row wider than one program's registers was read twice by one program (statistics, then the
output) or three times (LayerNorm: mean, variance, output), the re-reads mostly from DRAM. Here a
row goes to a team of K programs (``_team``, persistent teams): member k keeps columns
``[k * BLOCK_N, (k + 1) * BLOCK_N)`` of x (or of ``h = round(x + residual)``) in registers and
publishes its partial statistics; the members combine the K partials in member order (the same
bits on every run) and write their chunk of y (and h). The grid holds ``teams * K`` programs, all
resident; team t takes rows t, t + teams, ... and loads its next row's chunk before it waits for
its teammates, so the loads of one row overlap the meeting of the previous one.

    RMSNorm:   ss = sum_k ss_k,  rstd = rsqrt(ss / N + eps)
    LayerNorm: each member publishes s_k = sum x and q_k = sum (x - s_k / n_k)^2 over its n_k columns;
               mean = sum_k s_k / N,  var = sum_k (q_k + n_k (s_k / n_k - mean)^2) / N
               (Chan et al.'s pairwise combination: one meeting, no cancellation)

The outputs use the rounding points of ``rms_norm`` / ``layer_norm`` (``_common.rms_affine`` /
``ln_affine``, shared with their kernels; a setting's ``affine`` picks where a member loads its w / b, its ``hold``
whether x waits for the meeting in bf16 rather than fp32);
member 0 stores the row's statistics. DRAM bytes: read N*x (+ N*residual), write N*y (+ N*h), once each.
On an H200 (bf16, 2026-12-01) this moved
4096x65536 at 3398 GB/s and 1024x262144 at 3124, against torch.compile's 2849 / 2009.

The backward works the same way: a member holds its chunk of x (h) and dy, publishes its part of
``sum(g * xn)`` (LayerNorm: also ``sum(g)``), writes its chunk of dx, and sums dw (db) over its team's
rows in registers (its columns are the same on every row), so that dw / db are ``teams`` partial rows
summed afterwards (``_partials``). The looped backward re-read each row and read-modified-wrote an fp32 partial
row per row: 1199 GB/s at 4096x65536 against 2938 here (torch.compile 1756). On NVIDIA the backward takes teams
from rows of more than ``BWD_MAX_FUSED_BYTES`` (16 KiB, ``_launch.bwd_max_fused_bytes``), where one program's
block of x, dy and the fp32 dw / db sums spills: 8192x16384 bf16 moved 2360 GB/s here against 565 in one block
(layer_norm; rms_norm 3244 / 2909).

``rms_wide_forward`` / ``ln_wide_forward`` / ``wide_backward`` serve the free-order forwards and the
backwards of ``rms_norm`` / ``layer_norm`` for rows of at least the ``min_row_bytes`` of ``WIDE_TUNED[kind]``
(a setting, or a list of settings by row width: ``_team.tier_for``)
when a team fits the device (CPU tensors keep the looped kernels unless ``WIDE_ON_CPU``, tests) and
otherwise return False / None (the looped kernel runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import affine_f32, input_of, ln_affine, load_affine, load_grad_raw, rms_affine, round_to, store_dx
from ._device import is_interpreter
from ._fastlaunch import launch
from ._launch import BWD_MAX_FUSED_BYTES, backward_strides
from ._rounding import round_dtype
from ._team import (sum_pair, team_gather, team_gather_two, team_phases, team_publish, team_publish_first,
                    team_publish_second, team_publish_sums, team_split, team_start)

# Per kind: rows of at least min_row_bytes (input element size) go to teams of ceil(bytes / chunk_bytes)
# programs of num_warps warps, programs_per_sm of them per SM with at most maxnreg registers per thread
# (NVIDIA; one per compute unit elsewhere); a list holds tiers by row width (``_team.tier_for``: the first
# whose team has at most max_team members); None: never. Each setting is the best of a sweep on the H200
# (bf16, 2026-12-01/02; benchmarks/NOTES.md); too few registers spill and too few programs per SM leave
# DRAM idle while teams meet (the backward at 8 KiB / 4 per SM: 1687 GB/s, at 8 KiB / 3 per SM with 168
# registers: 2938). The rms_norm forward without a residual (session 15, results/team_tiers_2026-12-02.txt,
# M x N = 2^28): 64 elements per thread and 16 warps per SM, 4 KiB chunks up to 64 members, then 8 KiB:
# 3720 / 3501 / 3295 GB/s at N = 65536 / 131072 / 262144 against 3616 / 3417 / 3250 on the 8 KiB, 4-warp,
# 6-per-SM setting. Session 20 (benchmarks/norms_wide_affine_sweep.py, results/norms_wide_affine_2026-12-02.txt):
# 168 registers and fewer programs per SM, w loaded before the meeting (4 KiB) or once per program (8 KiB):
# 4096 x 65536 3756-3779 -> 3859-3877 GB/s, 2048 x 131072 3591-3600 -> 3674-3693, 1024 x 262144 3291-3314 ->
# 3470-3481 (without the weight at all: 3935 at 65536, so the per-row w loads had cost 4%). With a residual
# (x, r, h, y counted): 4 KiB chunks over 2 warps, 12 per SM, up to 32 members, then that setting:
# 3740 / 3701 / 3576 (3605 at 65536 before). LayerNorm, since its two statistics meet in one word (session 29,
# results/session29_2026-12-03.txt, w and b loaded after the meeting): 4 KiB / 1 warp / 12 per SM / 168 registers
# up to 32 members, 8 KiB / 2 warps / 6 per SM up to 32, then 16 KiB / 4 warps / 4 per SM: 4096 x 65536
# 3348-3386 GB/s and 2048 x 131072 3315-3327 against 3048-3201 and 3042-3129 on session 24's tiers (8 KiB /
# 4 warps / 5 per SM up to 16 members, 4 KiB / 1 warp / 16 per SM up to 64). ``pair_max_team``: teams of more
# members meet on two words, gathered one after the other, as before session 29; there the pair word lost: the
# forward at 1024 x 262144 (32 members of 4 warps) 3.6%, the backward 1.5 / 6.1 / 3.7% at 4096 x 65536 / 2048 x
# 131072 / 1024 x 262144 (32, 32 and 128 members), while it won 1.5-2.5% at 8192 x 12288 (6 members).
# The backwards: rows over BWD_MAX_FUSED_BYTES (session 23); layer_norm's rows of 128-256 KiB over 8 KiB chunks
# of 8 warps, 2 per SM (session 24, results/session24_softmax_teams_2026-12-03.txt): 2048 x 131072 2124 -> 2253
# GB/s (2122 -> 2267 in a second sweep), but 1024 x 262144 2057 -> 1804, so wider rows keep the 4 KiB setting
# (the last tier). Session 31 (results/session31_2026-12-03.txt), with both backward sums in one joint reduction
# on a pair word (``_team.team_publish_sums``) and the row's mean / rstd loaded with it: rows of 64-128 KiB take
# the 8 KiB tier (teams of 9-16 on a pair word), 4096 x 65536 2578-2606 -> 2648-2678 GB/s against 4 KiB teams of
# 32 on a pair word (2465-2473 on two words); 16384 x 16384 stays on 4 KiB (2940 against 2890); at 131072 and
# 262144 the alternatives (pair words, the other chunk) were within 1%. Session 32 (results/session32_2026-12-04.txt):
# the layer_norm forward's per-row w / b loads after the meeting cost 7-14% (without them: 3393 -> 3857 GB/s at
# 4096 x 65536); loaded before the wait (AFFINE 1) they spilled at 168 registers (10-18 bytes, -3 to -17%), but with x
# held in bf16 meanwhile (``hold``, the kernels' HOLD; 0 spills) 4096 x 65536 went 3405-3448 -> 3620-3643, 2048 x
# 131072 3296 (8 KiB) -> 3398-3427 (4 KiB, 64 members) and 1024 x 262144 3069-3073 (16 KiB) -> 3218-3224 (8 KiB, 64
# members). The rms_norm 8 KiB tier (w once per program) spilled 14 bytes at 262144 columns; holding x removes that:
# 2048 x 131072 3711-3713 (4 KiB, 64 members) -> 3843-3851 (8 KiB, 32) and 1024 x 262144 3491-3496 -> 3571-3584,
# while 4096 x 65536 stays on 4 KiB teams (3907-3912 against 3769-3797 on 8 KiB). Session 45 (H100; results/
# norms_bwd_hold_session45_h100_2026-12-05.txt, the backward op alone, CUDA graphs, M = 2^28 / N): the backwards
# with dy, x and w held in bf16 while a team meets (``hold``; 0 spills where the 8 KiB rms_norm tier spilled 36 bytes
# and the 4 KiB layer_norm one 40 in Triton 3.9's sm_90 compile): rms_norm 2660-2700 -> 2855-2862 GB/s at 16384 x
# 16384 and 2598-2601 -> 2690-2702 at 4096 x 65536 on 4 KiB chunks of 2 warps (the old 8 KiB tier held: 2733 /
# 2586-2611), 2256-2267 -> 2500-2504 at 1024 x 262144 on the held 8 KiB tier; layer_norm 1903-1906 -> 2214-2219
# at 1024 x 262144 on 8 KiB / 4 warps / 3 per SM held (its narrower rows lost 1-13% with any hold; unheld that
# setting fell to 1519-1522). The layer_norm teams of 17-32 members (rows of 136-256 KiB): 8 KiB / 4 warps / 2 per SM
# at 255 registers, unheld, on one pair word: 2100-2112 -> 2237-2249 at 2048 x 131072 (results/
# norms_ln_bwd_wide_session45_h100_2026-12-05.txt; held 2141-2154); not measured at other widths.
WIDE_TUNED: dict = {
    "rms_norm": [{"min_row_bytes": 65537, "chunk_bytes": 4096, "num_warps": 1, "programs_per_sm": 12,
                  "maxnreg": 168, "max_team": 32, "affine": 1},
                 {"min_row_bytes": 65537, "chunk_bytes": 8192, "num_warps": 2, "programs_per_sm": 6,
                  "maxnreg": 168, "affine": 2, "hold": True}],
    "add_rms_norm": [{"min_row_bytes": 65537, "chunk_bytes": 4096, "num_warps": 2, "programs_per_sm": 12,
                      "maxnreg": 80, "max_team": 32},
                     {"min_row_bytes": 65537, "chunk_bytes": 8192, "num_warps": 4, "programs_per_sm": 6,
                      "maxnreg": 80}],
    "layer_norm": [{"min_row_bytes": 65537, "chunk_bytes": 4096, "num_warps": 1, "programs_per_sm": 12,
                    "maxnreg": 168, "max_team": 64, "fp_fusion": True, "affine": 1, "hold": True},
                   {"min_row_bytes": 65537, "chunk_bytes": 8192, "num_warps": 2, "programs_per_sm": 6,
                    "maxnreg": 168, "max_team": 64, "fp_fusion": True, "affine": 1, "hold": True},
                   {"min_row_bytes": 65537, "chunk_bytes": 16384, "num_warps": 4, "programs_per_sm": 4,
                    "maxnreg": 128, "pair_max_team": 16}],
    "rms_norm_bwd": [{"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 4096, "num_warps": 2,
                      "programs_per_sm": 6, "maxnreg": 168, "max_team": 32, "hold": True},
                     {"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 8192, "num_warps": 4,
                      "programs_per_sm": 3, "maxnreg": 168, "hold": True}],
    "layer_norm_bwd": [{"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 4096, "num_warps": 4,
                        "programs_per_sm": 4, "maxnreg": 128, "max_team": 16},
                       {"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 8192, "num_warps": 8,
                        "programs_per_sm": 2, "maxnreg": 128, "max_team": 16},
                       {"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 8192, "num_warps": 4,
                        "programs_per_sm": 2, "maxnreg": 255, "max_team": 32},
                       {"min_row_bytes": BWD_MAX_FUSED_BYTES + 1, "chunk_bytes": 8192, "num_warps": 4,
                        "programs_per_sm": 3, "maxnreg": 168, "hold": True}],
}
# Teams on CPU tensors (interpreter: one launch publishes, a second gathers and writes); off by default.
WIDE_ON_CPU = False


def team_for(kind: str, N: int, elem: int, M: int, device: torch.device):
    """The ``_team.TeamPlan`` for M rows of N elements of ``elem`` bytes, or None (the looped kernel)."""
    return team_split(N, elem, M, device, WIDE_TUNED.get(kind), WIDE_ON_CPU)


@triton.jit
def _load_raw(x_ptr, res_ptr, row, M, N, stride_x_row, stride_res_row, offs):
    """One chunk of x (and of the residual) as stored, for the row after this one: no arithmetic
    on it yet, so its loads stay in flight while the program waits for its team."""
    live = offs < tl.where(row < M, N, 0)  # the mask, or nothing past the last row
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=live, other=0.0)
    r = x
    if res_ptr is not None:
        r = tl.load(res_ptr + row * stride_res_row + offs, mask=live, other=0.0)
    return x, r


@triton.jit
def widen(v):
    """``v`` (bf16, fp16 or fp32) as fp32; bf16 by its bits, an operation the compiler does not merge with an
    earlier ``.to(tl.float32)`` of the same value (so that fp32 copy need not stay in registers meanwhile)."""
    if v.dtype == tl.bfloat16:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _rms_team_publish(xr, rr, res_ptr, h_ptr, ws_ptr, row, member, TEAM, N, offs, mask,
                      PHASE: tl.constexpr, HOLD: tl.constexpr, STORE_DTYPE: tl.constexpr):
    """A member's first half of a row: ``(x in fp32, x as held)`` from its raw chunk, its sum of squares published."""
    x = input_of(xr, rr, res_ptr, h_ptr, row, N, offs, mask, PHASE != 2)
    xs = x
    if HOLD:
        xs = x.to(STORE_DTYPE)  # exact: x is a value of that dtype
    if PHASE != 2:
        team_publish(ws_ptr + row * TEAM + member, tl.sum(x * x, axis=0))
    return x, xs


@triton.jit
def _rms_team_finish(x, xs, w_raw, b_raw, w_ptr, b_ptr, y_ptr, rstd_ptr, ws_ptr, row, member, k, TEAM, N, offs, mask,
                     eps, weight_offset, PHASE: tl.constexpr, AFFINE: tl.constexpr, HOLD: tl.constexpr,
                     CAST_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """A member's second half of a row: its team's statistics gathered, its chunk of y written."""
    if PHASE != 1:
        if AFFINE == 1:
            w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
        ss = tl.sum(team_gather(ws_ptr + row * TEAM, k, TEAM, 0.0), axis=0)
        rstd = tl.math.rsqrt(ss / N + eps)
        if rstd_ptr is not None:
            if member == 0:
                tl.store(rstd_ptr + row, rstd)
        if AFFINE == 0:
            w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
        w, b = affine_f32(w_raw, b_raw, w_ptr, b_ptr)
        if HOLD:
            x = widen(xs)
        y = rms_affine(x, rstd, w, b, w_ptr, b_ptr, weight_offset, CAST_DTYPE, OUT_DTYPE)
        tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)


@triton.jit
def _rms_team_fwd_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, h_ptr, rstd_ptr,  # as rms_norm._rms_norm_fwd_kernel
    ws_ptr,  # int64 (rows * TEAM,) zeros: each member's published sum of squares
    stride_x_row, stride_res_row,
    M, N, eps, weight_offset,
    TEAM,  # programs per row (TEAM * BLOCK_N >= N)
    TEAMS,  # teams in the grid; team t takes rows t, t + TEAMS, ...
    CAST_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: one launch; 1: publish only; 2: gather and write (interpreter)
    AFFINE: tl.constexpr = 0,  # w / b loaded 0: after the team meets, 1: before waiting on it, 2: once for all rows
    HOLD: tl.constexpr = 0,  # x kept in its storage dtype (bf16) while the team meets, widened again after: registers
    DEPTH: tl.constexpr = 1,  # rows of a member's chunk loaded ahead of the one it works on (1 or 2)
):
    member, row, offs, mask = team_start(TEAM, N, BLOCK_N)
    k = tl.arange(0, TEAM_P2)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    STORE_DTYPE: tl.constexpr = x_ptr.dtype.element_ty if res_ptr is None else h_ptr.dtype.element_ty
    w_raw, b_raw = None, None  # loaded per row by the finish (AFFINE 0 / 1)
    if AFFINE == 2:  # a member's columns are the same on every row
        w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
    xr, rr = _load_raw(x_ptr, res_ptr, row, M, N, stride_x_row, stride_res_row, offs)
    # two loops, not one with a constexpr branch: a name assigned in any branch of a loop's body is carried by it
    if DEPTH == 2:
        xr2, rr2 = _load_raw(x_ptr, res_ptr, row + TEAMS, M, N, stride_x_row, stride_res_row, offs)
        while row < M:
            x, xs = _rms_team_publish(xr, rr, res_ptr, h_ptr, ws_ptr, row, member, TEAM, N, offs, mask,
                                      PHASE, HOLD, STORE_DTYPE)
            nxt = row + TEAMS
            xr, rr = xr2, rr2
            xr2, rr2 = _load_raw(x_ptr, res_ptr, nxt + TEAMS, M, N, stride_x_row, stride_res_row, offs)
            _rms_team_finish(x, xs, w_raw, b_raw, w_ptr, b_ptr, y_ptr, rstd_ptr, ws_ptr, row, member, k, TEAM, N,
                             offs, mask, eps, weight_offset, PHASE, AFFINE, HOLD, CAST_DTYPE, OUT_DTYPE)
            row = nxt
    else:
        while row < M:
            x, xs = _rms_team_publish(xr, rr, res_ptr, h_ptr, ws_ptr, row, member, TEAM, N, offs, mask,
                                      PHASE, HOLD, STORE_DTYPE)
            nxt = row + TEAMS
            xr, rr = _load_raw(x_ptr, res_ptr, nxt, M, N, stride_x_row, stride_res_row, offs)
            _rms_team_finish(x, xs, w_raw, b_raw, w_ptr, b_ptr, y_ptr, rstd_ptr, ws_ptr, row, member, k, TEAM, N,
                             offs, mask, eps, weight_offset, PHASE, AFFINE, HOLD, CAST_DTYPE, OUT_DTYPE)
            row = nxt


@triton.jit
def _ln_team_fwd_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, h_ptr, mean_ptr, rstd_ptr,  # as layer_norm._layer_norm_fwd_kernel
    ws_ptr,  # int64 (rows, 2, TEAM) zeros: each member's sum and squared deviations (PAIR_WORD: one word)
    stride_x_row, stride_res_row,
    M, N, eps,
    TEAM, TEAMS,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # as the RMSNorm kernel's
    AFFINE: tl.constexpr = 0,  # as the RMSNorm kernel's
    HOLD: tl.constexpr = 0,  # as the RMSNorm kernel's
    PAIR_WORD: tl.constexpr = 1,  # the two statistics meet in one word (1) or in two, gathered one after the other
    EVEN: tl.constexpr = 0,  # N is a multiple of BLOCK_N: every member holds a full chunk (no masked deviations)
):
    member, row, offs, mask = team_start(TEAM, N, BLOCK_N)
    k = tl.arange(0, TEAM_P2)
    if AFFINE == 2:
        w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
    # columns each member holds (the last one may hold fewer)
    counts = tl.minimum(tl.maximum(N - k * BLOCK_N, 0), BLOCK_N).to(tl.float32)
    n_mine = tl.minimum(N - member * BLOCK_N, BLOCK_N).to(tl.float32)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    STORE_DTYPE: tl.constexpr = x_ptr.dtype.element_ty if res_ptr is None else h_ptr.dtype.element_ty
    xr, rr = _load_raw(x_ptr, res_ptr, row, M, N, stride_x_row, stride_res_row, offs)
    while row < M:
        x = input_of(xr, rr, res_ptr, h_ptr, row, N, offs, mask, PHASE != 2)
        if HOLD:
            xs = x.to(STORE_DTYPE)  # exact: x is a value of that dtype
        slots = ws_ptr + row * (2 * TEAM)
        if PHASE != 2:
            s = tl.sum(x, axis=0)
            team_publish_first(slots, member, s, PAIR_WORD)
            if EVEN:
                d = x - s / BLOCK_N
            else:
                d = tl.where(mask, x - s / n_mine, 0.0)
            team_publish_second(slots, member, TEAM, s, tl.sum(d * d, axis=0), PAIR_WORD)
        nxt = row + TEAMS
        xr, rr = _load_raw(x_ptr, res_ptr, nxt, M, N, stride_x_row, stride_res_row, offs)
        if PHASE != 1:
            if AFFINE == 1:
                w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
            sums, sq = team_gather_two(slots, k, TEAM, 0.0, 0.0, PAIR_WORD)
            mean = tl.sum(sums, axis=0) / N
            dev = tl.where(counts > 0, sums / tl.maximum(counts, 1.0) - mean, 0.0)
            var = tl.sum(sq + counts * dev * dev, axis=0) / N
            rstd = tl.math.rsqrt(var + eps)
            if rstd_ptr is not None:
                if member == 0:
                    tl.store(mean_ptr + row, mean)
                    tl.store(rstd_ptr + row, rstd)
            if AFFINE == 0:
                w_raw, b_raw = load_affine(w_ptr, b_ptr, offs, mask, True, "")
            w, b = affine_f32(w_raw, b_raw, w_ptr, b_ptr)
            if HOLD:
                x = widen(xs)
            y = ln_affine(x, mean, rstd, w, b, w_ptr, b_ptr, OUT_DTYPE)
            tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)
        row = nxt


@triton.jit
def _store_partials(dw_ptr, db_ptr, part, offs, mask, dw_acc, db_acc):
    """A team member's sums of dw / db over its team's rows into the team's partial row (where wanted)."""
    if dw_ptr is not None:
        tl.store(dw_ptr + part + offs, dw_acc, mask=mask)
    if db_ptr is not None:
        tl.store(db_ptr + part + offs, db_acc, mask=mask)


@triton.jit
def _rms_bwd_values(dyr, xr, wr, rstd, weight_offset, WIDEN: tl.constexpr):
    """``(dy, xn, g)`` in fp32 of a chunk of the rms_norm backward from dy, x and w (None: no weight) as stored;
    ``WIDEN``: bf16 by its bits (:func:`widen`), so that the compiler does not keep the first fp32 copies alive."""
    if WIDEN:
        dy = widen(dyr)
        xn = widen(xr) * rstd
    else:
        dy = dyr.to(tl.float32)
        xn = xr.to(tl.float32) * rstd
    g = dy
    if wr is not None:
        g = dy * ((widen(wr) if WIDEN else wr.to(tl.float32)) + weight_offset)
    return dy, xn, g


@triton.jit
def _rms_team_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dh_ptr, dx_ptr, dres_ptr,  # as rms_norm._rms_norm_bwd_kernel
    dw_ptr, db_ptr,  # (TEAMS, N) fp32 partials (each team's rows), or None
    ws_ptr,  # int64 (rows * TEAM,) zeros: each member's published sum of g * xn
    stride_dy_row, stride_dy_col, stride_x_row, stride_dh_row, stride_dh_col,
    M, N, weight_offset,
    TEAM, TEAMS,
    CAST_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: one launch; 1: publish only; 2: gather, write dx and the partials (interpreter)
    HOLD: tl.constexpr = 0,  # dy, x and w kept as stored (bf16) while the team meets, widened again after
):
    # dx = rstd * (g - xn * sum(g * xn) / N), g = dy * (w + offset): one meeting per row. A member's
    # columns are the same on every row of its team, so it sums dw / db over the team's rows in registers.
    # DRAM: read N*(x + dy), write N*dx, once each; + TEAMS partial rows of dw / db.
    member, row, offs, mask = team_start(TEAM, N, BLOCK_N)
    part = row * N  # the first row is the team's index: its partial row
    k = tl.arange(0, TEAM_P2)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    dyr, xr = load_grad_raw(dy_ptr, x_ptr, row, M, N, stride_dy_row, stride_dy_col, stride_x_row, offs)
    while row < M:
        rstd = tl.load(rstd_ptr + row)
        wr = None
        if w_ptr is not None:
            wr = tl.load(w_ptr + offs, mask=mask, other=0.0)
        dy, xn, g = _rms_bwd_values(dyr, xr, wr, rstd, weight_offset, False)
        slots = ws_ptr + row * TEAM
        if PHASE != 2:
            team_publish(slots + member, tl.sum(g * xn, axis=0))
        nxt = row + TEAMS
        dyh, xh = dyr, xr  # this row's chunk as stored (HOLD: the values kept across the meeting)
        dyr, xr = load_grad_raw(dy_ptr, x_ptr, nxt, M, N, stride_dy_row, stride_dy_col, stride_x_row, offs)
        if PHASE != 1:
            dot = tl.sum(team_gather(slots, k, TEAM, 0.0), axis=0) / N
            if HOLD:  # the same values again from the stored ones (widen: not merged with the first widening)
                dy, xn, g = _rms_bwd_values(dyh, xh, wr, rstd, weight_offset, True)
            store_dx((g - xn * dot) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row, stride_dh_col, N,
                        offs, mask)
            if dw_ptr is not None:
                dw_acc += dy * round_to(xn, CAST_DTYPE)
            if db_ptr is not None:
                db_acc += dy
        row = nxt
    if PHASE != 1:
        _store_partials(dw_ptr, db_ptr, part, offs, mask, dw_acc, db_acc)


@triton.jit
def _ln_bwd_values(dyr, xr, wr, mean, rstd, mask, WIDEN: tl.constexpr):
    """``(dy, xhat, g)`` in fp32 of a chunk of the layer_norm backward from dy, x and w as stored (as
    :func:`_rms_bwd_values`)."""
    if WIDEN:
        dy = widen(dyr)
        xhat = tl.where(mask, (widen(xr) - mean) * rstd, 0.0)
    else:
        dy = dyr.to(tl.float32)
        xhat = tl.where(mask, (xr.to(tl.float32) - mean) * rstd, 0.0)
    g = dy
    if wr is not None:
        g = dy * (widen(wr) if WIDEN else wr.to(tl.float32))
    return dy, xhat, g


@triton.jit
def _ln_team_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, dh_ptr, dx_ptr, dres_ptr,  # as layer_norm._layer_norm_bwd_kernel
    dw_ptr, db_ptr,  # (TEAMS, N) fp32 partials, or None
    ws_ptr,  # int64 (rows, 2, TEAM) zeros: each member's sum of g * xhat and sum of g (PAIR_WORD: one word)
    stride_dy_row, stride_dy_col, stride_x_row, stride_dh_row, stride_dh_col,
    M, N,
    TEAM, TEAMS,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,
    PAIR_WORD: tl.constexpr = 1,  # as the forward's
    JOINT: tl.constexpr = 1,  # both sums in one reduction (_team.sum_pair; 0 under the interpreter)
    HOLD: tl.constexpr = 0,  # as the RMSNorm backward's
):
    # dx = rstd * (g - sum(g) / N - xhat * sum(g * xhat) / N), g = dy * w; dw, db summed in registers per team.
    member, row, offs, mask = team_start(TEAM, N, BLOCK_N)
    part = row * N
    k = tl.arange(0, TEAM_P2)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    dyr, xr = load_grad_raw(dy_ptr, x_ptr, row, M, N, stride_dy_row, stride_dy_col, stride_x_row, offs)
    mean_n = tl.load(mean_ptr + row, mask=row < M, other=0.0)  # the row's statistics, loaded with its dy and x
    rstd_n = tl.load(rstd_ptr + row, mask=row < M, other=1.0)
    while row < M:
        mean = mean_n
        rstd = rstd_n
        wr = None
        if w_ptr is not None:
            wr = tl.load(w_ptr + offs, mask=mask, other=0.0)
        dy, xhat, g = _ln_bwd_values(dyr, xr, wr, mean, rstd, mask, False)
        slots = ws_ptr + row * (2 * TEAM)
        if PHASE != 2:
            team_publish_sums(slots, member, TEAM, g * xhat, g, PAIR_WORD, JOINT)
        nxt = row + TEAMS
        dyh, xh = dyr, xr  # as the RMSNorm backward's
        dyr, xr = load_grad_raw(dy_ptr, x_ptr, nxt, M, N, stride_dy_row, stride_dy_col, stride_x_row, offs)
        mean_n = tl.load(mean_ptr + nxt, mask=nxt < M, other=0.0)
        rstd_n = tl.load(rstd_ptr + nxt, mask=nxt < M, other=1.0)
        if PHASE != 1:
            gx, gs = team_gather_two(slots, k, TEAM, 0.0, 0.0, PAIR_WORD)
            if HOLD:
                dy, xhat, g = _ln_bwd_values(dyh, xh, wr, mean, rstd, mask, True)
            c1, c2 = sum_pair(gx, gs, JOINT)
            c1 = c1 / N
            c2 = c2 / N
            store_dx((g - c2 - xhat * c1) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row, stride_dh_col, N,
                        offs, mask)
            if dw_ptr is not None:
                dw_acc += dy * xhat
            if db_ptr is not None:
                db_acc += dy
        row = nxt
    if PHASE != 1:
        _store_partials(dw_ptr, db_ptr, part, offs, mask, dw_acc, db_acc)


def rms_wide_forward(x2, r2, w, b, y, h, rstd, M, N, stride_x, stride_r, eps, weight_offset, cast_dtype, elem) -> bool:
    """Launches the team forward of RMSNorm when the rows are wide enough (arguments as the looped
    kernel's; ``h`` None without a residual, ``rstd`` None in inference); False: nothing launched."""
    plan = team_for("rms_norm" if r2 is None else "add_rms_norm", N, elem, M, x2.device)
    if plan is None:
        return False
    hold = _holds(plan, x2, h, w, b)
    ws = torch.zeros(M * plan.team, dtype=torch.int64, device=x2.device)
    args = (x2, r2, w, b, y, h, rstd, ws, stride_x, stride_r, M, N, eps, weight_offset, plan.team, plan.teams)
    for phase in team_phases(x2.device, plan.team):
        launch(_rms_team_fwd_kernel, plan.grid, args,
               plan.meta(_rms_team_fwd_kernel, x2.device, phase, CAST_DTYPE=round_dtype(cast_dtype),
                         AFFINE=plan.affine, HOLD=int(hold), DEPTH=plan.depth), x2.device)
    return True


def can_hold(stored: torch.dtype, *weights) -> bool:
    """Whether a team forward may keep x in its storage dtype ``stored`` while it waits (``HOLD``): where that frees
    registers, bf16 x (or h) with 16-bit (or absent) weights; fp32 weights or an fp32 x would not fit the tiers that
    hold, and an fp16 x is widened by a conversion the compiler may merge with the first one."""
    return stored == torch.bfloat16 and all(t is None or t.element_size() == 2 for t in weights)


def _holds(plan, x2, h, w, b) -> bool:
    """``HOLD`` for a launch of ``plan``: its tier holds and :func:`can_hold` allows it (x is stored as h with a
    residual)."""
    return plan.hold and can_hold(x2.dtype if h is None else h.dtype, w, b)


def ln_wide_forward(x2, r2, w, b, y, h, mean, rstd, M, N, stride_x, stride_r, eps, elem) -> bool:
    """Launches the team forward of LayerNorm when the rows are wide enough; False: nothing launched."""
    plan = team_for("layer_norm", N, elem, M, x2.device)
    if plan is None:
        return False
    hold = _holds(plan, x2, h, w, b)
    # w / b before the wait fit the registers only with x held: else after the meeting
    affine = 0 if plan.hold and not hold and plan.affine == 1 else plan.affine
    ws = torch.zeros(2 * M * plan.team, dtype=torch.int64, device=x2.device)
    args = (x2, r2, w, b, y, h, mean, rstd, ws, stride_x, stride_r, M, N, eps, plan.team, plan.teams)
    consts = {"AFFINE": affine, "HOLD": int(hold), "PAIR_WORD": int(plan.pair_word), "EVEN": int(N % plan.block_n == 0)}
    for phase in team_phases(x2.device, plan.team):
        launch(_ln_team_fwd_kernel, plan.grid, args, plan.meta(_ln_team_fwd_kernel, x2.device, phase, **consts),
               x2.device)
    return True


def wide_backward(kind: str, dy2, dh2, x2, w, stats, dx, dres, need_dw: bool, need_db: bool, M: int, N: int,
                  **scalars):
    """The team backward of ``kind`` ("rms_norm": ``stats`` = (rstd,), scalars weight_offset and cast_dtype;
    "layer_norm": (mean, rstd)) for wide rows: ``(dw_part, db_part)`` fp32 (teams, N) partials (None where
    not needed) to be summed over dim 0, or None when the looped kernel should run."""
    plan = team_for(kind + "_bwd", N, x2.element_size(), M, x2.device)
    if plan is None:
        return None
    device = x2.device
    dw_part = torch.empty((plan.teams, N), dtype=torch.float32, device=device) if need_dw else None
    db_part = torch.empty((plan.teams, N), dtype=torch.float32, device=device) if need_db else None
    ws = torch.zeros(len(stats) * M * plan.team, dtype=torch.int64, device=device)
    head = (dy2, x2, w, *stats, dh2, dx, dres, dw_part, db_part, ws, *backward_strides(dy2, x2, dh2), M, N)
    hold = int(plan.hold and dy2.dtype == x2.dtype and can_hold(x2.dtype, w))
    if kind == "rms_norm":
        kernel, args = _rms_team_bwd_kernel, (*head, scalars["weight_offset"], plan.team, plan.teams)
        consts = {"CAST_DTYPE": round_dtype(scalars["cast_dtype"]), "HOLD": hold}
    else:
        kernel, args = _ln_team_bwd_kernel, (*head, plan.team, plan.teams)
        consts = {"PAIR_WORD": int(plan.pair_word), "JOINT": int(not is_interpreter(kernel)), "HOLD": hold}
    for phase in team_phases(device, plan.team):
        launch(kernel, plan.grid, args, plan.meta(kernel, device, phase, **consts), device)
    return dw_part, db_part
