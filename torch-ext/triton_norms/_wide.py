"""Wide rows of RMSNorm and LayerNorm (free summation order) over a team of programs: read once.

A row wider than one program's registers was read twice by one program (statistics, then the
output) or three times (LayerNorm: mean, variance, output), the re-reads mostly from DRAM. Here a
row goes to a team of K programs (``_team``): each keeps ``BLOCK_N`` columns of x (or of
``h = round(x + residual)``) in registers and the members exchange partial sums through a small
fp32 workspace, combined in member order (the same bits on every run):

    RMSNorm:   ss = sum_k ss_k,  rstd = rsqrt(ss / N + eps)                        (one meeting)
    LayerNorm: mean = sum_k s_k / N;  var = sum_k sum_{j in k} (x_j - mean)^2 / N   (two meetings: the
               variance is taken around the combined mean, as the one-program kernel does)

then every member writes its chunk of y (and h) with the rounding points of ``rms_norm`` /
``layer_norm`` (``_common.rms_apply`` / ``_common.ln_apply``, shared with their kernels); member 0
stores the row's statistics. DRAM bytes: read N*x (+ N*residual), write N*y (+ N*h), once each.

The free-order forwards of ``rms_norm`` / ``layer_norm`` call ``rms_wide_forward`` /
``ln_wide_forward`` for rows wider than one block; they launch a team for rows of at least
``WIDE_TUNED[kind]["min_row_bytes"]`` when the team fits the SM count (CPU tensors keep the looped
kernels unless ``WIDE_ON_CPU``, tests) and otherwise return False (the looped kernel runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import ln_apply, load_input_chunk, rms_apply
from ._device import launch_options
from ._fastlaunch import launch, meta_items
from ._rounding import round_dtype
from ._team import team_arrive, team_load, team_member, team_p2, team_phases, team_split, team_wait

# Per kind: rows of at least min_row_bytes (input element size) go to a team of ceil(bytes / chunk_bytes)
# programs of num_warps warps; None: never.
WIDE_TUNED: dict = {
    "rms_norm": {"min_row_bytes": 65537, "chunk_bytes": 16384, "num_warps": 8},
    "layer_norm": {"min_row_bytes": 65537, "chunk_bytes": 16384, "num_warps": 8},
}
# Teams on CPU tensors (interpreter: one launch per meeting, never spinning); off by default.
WIDE_ON_CPU = False


def team_for(kind: str, N: int, elem: int, M: int, device: torch.device):
    """(team, BLOCK_N, num_warps) for M rows of N elements of ``elem`` bytes, or None (looped kernel)."""
    return team_split(N, elem, M, device, WIDE_TUNED.get(kind), WIDE_ON_CPU)


@triton.jit
def _rms_team_fwd_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, h_ptr, rstd_ptr,  # as rms_norm._rms_norm_fwd_kernel
    ws_ptr,  # fp32 (rows * TEAM,): each member's sum of squares
    sync_ptr,  # int32 (1 + rows,) zeros: ticket counter, then one arrival count per row
    stride_x_row, stride_res_row,
    M, N, eps, weight_offset,
    TEAM,  # programs per row (TEAM * BLOCK_N >= N)
    CAST_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: one launch (spins); 1: publish; 2: wait and write (interpreter)
):
    row, member, offs, mask, part, flag = team_member(sync_ptr, ws_ptr, M, TEAM, N, BLOCK_N)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, PHASE != 2)
    if PHASE != 2:
        tl.store(part + member, tl.sum(x * x, axis=0))
        team_arrive(flag)
    if PHASE != 1:
        team_wait(flag, TEAM)
        ss = tl.sum(team_load(part, tl.arange(0, TEAM_P2), TEAM, 0.0), axis=0)
        rstd = tl.math.rsqrt(ss / N + eps)
        if rstd_ptr is not None:
            if member == 0:
                tl.store(rstd_ptr + row, rstd)
        y = rms_apply(x, rstd, w_ptr, b_ptr, offs, mask, weight_offset, CAST_DTYPE, OUT_DTYPE)
        tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)


@triton.jit
def _ln_team_fwd_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, h_ptr, mean_ptr, rstd_ptr,  # as layer_norm._layer_norm_fwd_kernel
    ws_ptr,  # fp32 (2, rows * TEAM): each member's sum, then its sum of squared deviations from the mean
    sync_ptr,  # int32 (1 + rows,) zeros
    stride_x_row, stride_res_row,
    M, N, eps,
    TEAM,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: one launch; 1: publish sums; 2: mean, publish deviations; 3: write
):
    row, member, offs, mask, part, flag = team_member(sync_ptr, ws_ptr, M, TEAM, N, BLOCK_N)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, PHASE <= 1)
    k = tl.arange(0, TEAM_P2)
    if PHASE <= 1:
        tl.store(part + member, tl.sum(x, axis=0))
        team_arrive(flag)
    if PHASE != 1:
        team_wait(flag, TEAM)
        mean = tl.sum(team_load(part, k, TEAM, 0.0), axis=0) / N
        d = tl.where(mask, x - mean, 0.0)
        if PHASE != 3:
            tl.store(part + M * TEAM + member, tl.sum(d * d, axis=0))
            team_arrive(flag)
        if PHASE != 2:
            team_wait(flag, 2 * TEAM)
            rstd = tl.math.rsqrt(tl.sum(team_load(part + M * TEAM, k, TEAM, 0.0), axis=0) / N + eps)
            if rstd_ptr is not None:
                if member == 0:
                    tl.store(mean_ptr + row, mean)
                    tl.store(rstd_ptr + row, rstd)
            y = ln_apply(x, mean, rstd, w_ptr, b_ptr, offs, mask, OUT_DTYPE)
            tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)


def rms_wide_forward(x2, r2, w, b, y, h, rstd, M, N, stride_x, stride_r, eps, weight_offset, cast_dtype, elem) -> bool:
    """Launches the team forward of RMSNorm when the rows are wide enough (arguments as the looped
    kernel's; ``h`` None without a residual, ``rstd`` None in inference); False: nothing launched."""
    plan = team_for("rms_norm", N, elem, M, x2.device)
    if plan is None:
        return False
    team, block, warps = plan
    ws = torch.empty(M * team, dtype=torch.float32, device=x2.device)
    sync = torch.zeros(1 + M, dtype=torch.int32, device=x2.device)
    args = (x2, r2, w, b, y, h, rstd, ws, sync, stride_x, stride_r, M, N, eps, weight_offset, team)
    for phase in team_phases(x2.device, team):
        launch(_rms_team_fwd_kernel, (M * team,), args,
               meta_items(CAST_DTYPE=round_dtype(cast_dtype), BLOCK_N=block,
                          TEAM_P2=team_p2(team), PHASE=phase, num_warps=warps,
                          **launch_options(_rms_team_fwd_kernel)), x2.device)
    return True


def ln_wide_forward(x2, r2, w, b, y, h, mean, rstd, M, N, stride_x, stride_r, eps, elem) -> bool:
    """Launches the team forward of LayerNorm when the rows are wide enough; False: nothing launched."""
    plan = team_for("layer_norm", N, elem, M, x2.device)
    if plan is None:
        return False
    team, block, warps = plan
    ws = torch.empty(2 * M * team, dtype=torch.float32, device=x2.device)
    sync = torch.zeros(1 + M, dtype=torch.int32, device=x2.device)
    args = (x2, r2, w, b, y, h, mean, rstd, ws, sync, stride_x, stride_r, M, N, eps, team)
    for phase in team_phases(x2.device, team, meetings=2):
        launch(_ln_team_fwd_kernel, (M * team,), args,
               meta_items(BLOCK_N=block, TEAM_P2=team_p2(team), PHASE=phase,
                          num_warps=warps, **launch_options(_ln_team_fwd_kernel)), x2.device)
    return True
