"""Forward kernels whose row statistics follow PyTorch's CUDA summation order (bit-exact layers).

Two passes per block of ``ROWS`` rows: the statistics (``_exact_stats``, in the
order chosen by ``_torch_order``), then the normalisation, which reads the rows
again (from L1/L2) and writes y. Only the forward differs from the fast kernels;
the backward of the custom ops is shared.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import offset_for_kernel, round_to
from ._exact_stats import fused_ln_stats_vec, fused_rms_sumsq_vec, mean_sq_torch_order, row_values, rowwise_welford
from ._device import cdiv, is_interpreter, launch_options, next_power_of_2
from ._fastlaunch import Launch, meta_items
from ._rounding import round_dtype
from ._torch_order import (
    LN_VEC_THREADS, ORDER_FUSED, ORDER_MEAN, ROWWISE_THREADS, device_limits, fused_vectorized,
    mean_config, mean_constexprs,
)

# statistics of the order: 1 generic reduce (mean of squares), 2 fused vectorized, 3 fused row-wise Welford
STATS_MEAN, STATS_VEC, STATS_ROWWISE = 1, 2, 3
# widest row (bytes of input) normalised in one tile; wider rows go in chunks of this size
MAX_ROW_BYTES = 16384
# rows whose tiles have at most SMALL_ROW_TILE elements share a program, up to SMALL_TILE elements
SMALL_ROW_TILE = 512
SMALL_TILE = 4096
# LayerNorm: which product cuWelfordCombine fuses into its fma (0: nA * mean_A, 1: nB * mean_B, 2: none)
LN_MEAN_FMA = 0


@triton.jit
def _rms_stats(base, rbase, rm, rows, N, factor, STATS: tl.constexpr, ROWS: tl.constexpr, ITERS: tl.constexpr,
               VEC: tl.constexpr, BW: tl.constexpr, BHR: tl.constexpr, CTAS: tl.constexpr, CP: tl.constexpr,
               LOG_BHR: tl.constexpr, LOG_BW: tl.constexpr, LOG_PAD: tl.constexpr, LOG_WRAP: tl.constexpr,
               ALIGNED: tl.constexpr, UNROLL: tl.constexpr, SPLIT: tl.constexpr):
    """Mean of squares of ROWS rows, (ROWS,) fp32; ``rbase`` (a residual's rows: the mean order only) or None."""
    if STATS == 1:
        var = mean_sq_torch_order(base, rbase, rm, rows, N, factor, ROWS, VEC, BW, BHR, CTAS, CP, ITERS, LOG_BHR,
                                  LOG_BW, LOG_PAD, LOG_WRAP, ALIGNED, UNROLL, SPLIT)
    elif STATS == 2:
        ss = fused_rms_sumsq_vec(base, rm, N, ROWS, ITERS, UNROLL, SPLIT)
        var = tl.math.div_rn(ss, tl.zeros_like(ss) + N)
    else:
        mean, var = rowwise_welford(base, rm, N, ROWS, ITERS, UNROLL)
        var = tl.fma(mean, mean, var)  # rsqrt(m2 + m1 * m1 + eps)
    return var


@triton.jit
def _rms_apply_chunk(base, rbase, w_ptr, b_ptr, y_ptr, h_ptr, rows64, rm, r, start, N, weight_offset,
                     CAST_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    offs = start + tl.arange(0, BLOCK_N)
    cm = offs < N
    m = rm & cm[None, :]
    # the re-read of rows the statistics loaded evict_last (see _exact_stats' docstring): evict_first now
    x = row_values(base, rbase, offs[None, :], m, "evict_first")
    if h_ptr is not None:  # x + residual, rounded (exactly representable in h's dtype)
        tl.store(h_ptr + rows64[:, None] * N + offs[None, :], x.to(h_ptr.dtype.element_ty), mask=m)
    y = round_to(x * r, CAST_DTYPE)
    if w_ptr is not None:
        w = tl.load(w_ptr + offs, mask=cm, other=0.0).to(tl.float32)
        y = y * (w + weight_offset)[None, :]
    if b_ptr is not None:
        if CAST_DTYPE is not None:
            y = round_to(y, OUT_DTYPE)
        y = y + tl.load(b_ptr + offs, mask=cm, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows64[:, None] * N + offs[None, :], round_to(y, OUT_DTYPE).to(OUT_DTYPE), mask=m)


@triton.jit
def _ln_apply_chunk(base, w_ptr, b_ptr, y_ptr, rows64, rm, mu, r, start, N, STATS: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    offs = start + tl.arange(0, BLOCK_N)
    cm = offs < N
    m = rm & cm[None, :]
    # the re-read of rows the statistics loaded evict_last (see _exact_stats' docstring): evict_first now
    d = tl.load(base + offs[None, :], mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32) - mu
    t = r * d
    if w_ptr is not None:
        w = tl.load(w_ptr + offs, mask=cm, other=0.0).to(tl.float32)[None, :]
        if b_ptr is not None:
            y = tl.fma(w, t, tl.load(b_ptr + offs, mask=cm, other=0.0).to(tl.float32)[None, :])
        else:
            y = w * t
    elif b_ptr is not None:
        b = tl.load(b_ptr + offs, mask=cm, other=0.0).to(tl.float32)[None, :]
        if STATS == 2:
            y = tl.fma(r, d, b)  # (rstd * (x - mean)) + beta, contracted by nvcc
        else:
            y = t + b  # fma(t, gamma = 1, beta)
    else:
        y = t
    tl.store(y_ptr + rows64[:, None] * N + offs[None, :], round_to(y, OUT_DTYPE).to(OUT_DTYPE), mask=m)


@triton.jit
def _rms_exact_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, rstd_ptr,
    res_ptr,  # (M, N) residual rows, or None
    h_ptr,  # (M, N) contiguous output for x + residual, or None
    M, N, stride_x_row, stride_res_row, eps, weight_offset, factor,
    CAST_DTYPE: tl.constexpr, STATS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr,
    ITERS: tl.constexpr, VEC: tl.constexpr, BW: tl.constexpr, BHR: tl.constexpr, CTAS: tl.constexpr,
    CP: tl.constexpr, LOG_BHR: tl.constexpr, LOG_BW: tl.constexpr, LOG_PAD: tl.constexpr, LOG_WRAP: tl.constexpr,
    ALIGNED: tl.constexpr, UNROLL: tl.constexpr, SPLIT: tl.constexpr,
):
    # Bytes: read M*N*x twice (the second time mostly from cache) + N*(w [+ b]); write M*N*y + 4M. With a residual
    # (the mean order only: transformers' decoder layer's ``hidden_states = residual + hidden_states`` and
    # ``post_attention_layernorm`` in one launch) the rows normalised are x + residual rounded to the residual's
    # dtype (``row_values``), recomputed in both passes from the same loads and stored to h by the second: reads
    # M*N*(x + residual) twice, writes M*N*h more.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: M may pass 2^31
    rmask = rows < M
    base = x_ptr + rows[:, None] * stride_x_row
    if res_ptr is not None:
        rbase = res_ptr + rows[:, None] * stride_res_row
    else:
        rbase = None
    rm = rmask[:, None]
    var = _rms_stats(base, rbase, rm, rows, N, factor, STATS, ROWS, ITERS, VEC, BW, BHR, CTAS, CP, LOG_BHR, LOG_BW,
                     LOG_PAD, LOG_WRAP, ALIGNED, UNROLL, SPLIT)
    rstd = tl.math.rsqrt(var + eps)
    if rstd_ptr is not None:  # None in inference
        tl.store(rstd_ptr + rows, rstd, mask=rmask)
    r = rstd[:, None]
    if LOOP:
        for start in range(0, N, BLOCK_N):
            _rms_apply_chunk(base, rbase, w_ptr, b_ptr, y_ptr, h_ptr, rows, rm, r, start, N, weight_offset,
                             CAST_DTYPE, BLOCK_N)
    else:
        _rms_apply_chunk(base, rbase, w_ptr, b_ptr, y_ptr, h_ptr, rows, rm, r, 0, N, weight_offset, CAST_DTYPE,
                         BLOCK_N)


@triton.jit
def _ln_exact_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    M, N, stride_x_row, eps,
    STATS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, LOOP: tl.constexpr, ITERS: tl.constexpr,
    MEAN_FMA: tl.constexpr, UNROLL: tl.constexpr, FULL: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: M may pass 2^31
    rmask = rows < M
    base = x_ptr + rows[:, None] * stride_x_row
    rm = rmask[:, None]
    if STATS == 2:
        mean, s = fused_ln_stats_vec(base, rm, N, ROWS, ITERS, MEAN_FMA, UNROLL, FULL)
        var = tl.math.div_rn(s, tl.zeros_like(s) + N)
    else:
        mean, var = rowwise_welford(base, rm, N, ROWS, ITERS, UNROLL)
    rstd = tl.math.rsqrt(var + eps)
    if rstd_ptr is not None:  # None in inference
        tl.store(mean_ptr + rows, mean, mask=rmask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)
    mu = mean[:, None]
    r = rstd[:, None]
    if LOOP:
        for start in range(0, N, BLOCK_N):
            _ln_apply_chunk(base, w_ptr, b_ptr, y_ptr, rows, rm, mu, r, start, N, STATS, BLOCK_N)
    else:
        _ln_apply_chunk(base, w_ptr, b_ptr, y_ptr, rows, rm, mu, r, 0, N, STATS, BLOCK_N)


def _interp_rows(M: int, kernel, rows: Optional[int]) -> Optional[int]:
    """Under the interpreter (numpy, one program after another) many rows per program run far faster;
    rows are independent, so this changes no result."""
    if rows is not None or not is_interpreter(kernel):
        return rows
    return min(64, next_power_of_2(M))


def default_schedule(stats: int, N: int, elem: int, stats_width: int, iters: int, layer_norm: bool = False) -> dict:
    """The tuned schedule of an exact forward: a subset of ``rows``, ``num_warps``, ``unroll``, ``apply_bytes``
    (:func:`_tiles` fills what is missing) and, for the RMS orders, ``split`` (the sum trees' layout,
    ``_exact_stats._fold_mid``; default False). ``stats`` is STATS_*, ``stats_width`` the elements one trip of the
    statistics loop reads per row (128 / 2048: a warp / 512 of torch's threads for the mean order, 512 for the fused
    orders), ``iters`` the trips, ``layer_norm`` the LayerNorm kernel (else RMS).

    From ``benchmarks/norms_exact_sweep.py`` on an H200 (bf16, Triton 3.6; every schedule bit-equal to the torch
    module; ``results/norms_exact_2026-12-02_session19.md``), M x N = 2^27 at N = 2048 / 4096 / 5120 / 8192 /
    16384 / 65536:

    * mean order, one warp of torch's threads per row (``stats_width`` 128): two warps, 2048-element chunks, the
      whole loop unrolled up to 32 trips, split trees above 2048 elements (3888 GB/s at 4096 against 3252 with
      the shuffle trees);
    * mean order, 512 torch threads per row: two rows over 16 warps with 8192-element chunks below 32768 elements
      (16384: 3742 -> 3936 GB/s), 16 warps for one row from 32768;
    * fused RMS order: 4 warps with 2-trip groups and 1024-element chunks up to 4096 (split trees at 4096: 3474 ->
      3944 GB/s); wider rows keep the whole statistics loop unrolled up to 128 trips (4 rows over 16 warps were
      2% faster at 8192 and 3% slower at 5120), 8-trip groups beyond (not measured);
    * LayerNorm, by bytes of a row (bf16 elements in parentheses; fp32 rows take the rule of their bytes, not
      measured): one row over 2 / 4 warps up to 4 / 8 KiB (2048 / 4096; 2048: 3315 -> 3795 GB/s), two rows over 8
      warps up to 32 KiB (16384), the whole loop unrolled up to 32 trips and 8 KiB chunks; 2 rows over 4 warps in
      8-trip groups and 4 KiB chunks above (65536: 2304 GB/s, every schedule 2300-2340; 4 rows over 8 warps spill
      8 bytes under Triton 3.9).

    Narrower rows (the mean order below 2048 elements, every order at most 512) keep :func:`_tiles`' rules."""
    if N <= SMALL_ROW_TILE:
        return {}
    if stats == STATS_MEAN and stats_width == 128 and N >= 2048:
        return dict(rows=1, num_warps=2, unroll=min(iters, 32), apply_bytes=2048 * elem, split=N > 2048)
    if stats == STATS_MEAN and stats_width == 2048 and N >= 32768:
        return dict(rows=1, num_warps=16, unroll=min(iters, 32), apply_bytes=16384 * elem)
    if stats == STATS_MEAN and stats_width == 2048 and N >= 8192:
        return dict(rows=2, num_warps=16, unroll=min(iters, 8), apply_bytes=8192 * elem)
    if stats == STATS_VEC and layer_norm:  # in bytes of a row: measured on bf16 rows only
        if N * elem <= 8192:
            warps = 2 if N * elem <= 4096 else 4
            return dict(rows=1, num_warps=warps, unroll=iters, apply_bytes=2048 * warps)
        if N * elem <= 32768:
            return dict(rows=2, num_warps=8, unroll=min(iters, 32), apply_bytes=8192)
        return dict(rows=2, num_warps=4, unroll=8, apply_bytes=4096)
    if stats == STATS_VEC and N <= 4096:
        return dict(rows=1, num_warps=4, unroll=2, apply_bytes=1024 * elem, split=N > 2048)
    if stats == STATS_VEC:
        return dict(unroll=iters if iters <= 128 else 8)
    return {}


def _tiles(N: int, elem: int, rows_default: int, rows: Optional[int], num_warps: Optional[int],
           stats_width: int = 0, iters: int = 1, unroll: Optional[int] = None, apply_bytes: Optional[int] = None,
           stats: int = 0, layer_norm: bool = False, split: Optional[bool] = None):
    """(ROWS, BLOCK_N, LOOP, num_warps, UNROLL, SPLIT): rows per program, the normalisation tile, warps, the
    statistics loop's unrolled group and the sum trees' layout (``_exact_stats._fold_mid``; the RMS orders). None
    picks :func:`default_schedule`'s value, else the generic rule (SPLIT False):
    4 warps; one row per program for the mean order, two for the fused orders; narrow rows
    (statistics and normalisation tiles of at most SMALL_ROW_TILE elements) share a program up to
    SMALL_TILE elements (one row of 64 per program ran the SD3.5 q/k norms, 155,648 rows, at
    210 us per call); rows above ``apply_bytes`` (MAX_ROW_BYTES) are normalised in chunks (they
    are re-read from cache anyway); the whole statistics loop unrolled up to 64 trips. Rows are
    independent and each thread adds its elements in order however the loop is unrolled: none of
    these choices changes a result.
    """
    tuned = default_schedule(stats, N, elem, stats_width, iters, layer_norm) if stats else {}
    rows = tuned.get("rows") if rows is None else rows
    num_warps = tuned.get("num_warps") if num_warps is None else num_warps
    unroll = tuned.get("unroll") if unroll is None else unroll
    apply_bytes = tuned.get("apply_bytes") if apply_bytes is None else apply_bytes
    split = tuned.get("split", False) if split is None else split
    max_bytes = MAX_ROW_BYTES if apply_bytes is None else apply_bytes
    block_n = next_power_of_2(N)
    loop = block_n * elem > max_bytes
    if loop:
        block_n = max(max_bytes // elem, 1)
    if rows is None:
        width = max(block_n, stats_width)
        rows = 1 if loop else rows_default
        if not loop and width <= SMALL_ROW_TILE:
            rows = max(rows, SMALL_TILE // width)
    if unroll is None:
        unroll = iters if iters <= 64 else 1
    return rows, block_n, loop, 4 if num_warps is None else num_warps, max(1, min(unroll, iters)), split


def _fused_stats(N: int, vectorized: bool) -> tuple:
    """(STATS, trips, elements per trip) of the fused orders (``F.rms_norm`` / ``F.layer_norm``): the vectorised
    kernel's 128 threads x 4, or the row-wise Welford's 512 threads."""
    if vectorized:
        return STATS_VEC, cdiv(N, 4 * LN_VEC_THREADS), 4 * LN_VEC_THREADS
    return STATS_ROWWISE, cdiv(N, ROWWISE_THREADS), ROWWISE_THREADS


@functools.lru_cache(maxsize=4096)
def rms_exact_plan(M: int, N: int, stride_row: int, elem: int, device: torch.device, eps: float, weight_offset: float,
                   cast_dtype: Optional[torch.dtype], order: int, vectorized: bool, rows: Optional[int] = None,
                   num_warps: Optional[int] = None, unroll: Optional[int] = None,
                   apply_bytes: Optional[int] = None, split: Optional[bool] = None,
                   residual_stride: Optional[int] = None) -> Launch:
    """The launch of the RMS forward in torch's order ``order`` (ORDER_MEAN / ORDER_FUSED; ``vectorized``:
    :func:`fused_vectorized` of the call) on M rows of N elements ``stride_row`` apart, whose pointer
    arguments are (x, weight, bias, y, rstd): a pure function of its arguments, cached because it runs on
    every call of a layer (host time matters for small inputs). ``rows`` ... ``apply_bytes``: see :func:`_tiles`;
    ``split``: the sum trees' layout, as ``rows`` ... . ``residual_stride``: None, or the row stride of a residual
    added first (ORDER_MEAN only): then the pointer arguments are (x, weight, bias, y, rstd, residual, h)."""
    if residual_stride is not None and order != ORDER_MEAN:
        raise ValueError("a residual is added in the exact forward only in the 'mean' order")
    factor = 1.0
    meta = dict(VEC=False, BW=1, BHR=1, CTAS=1, CP=1, LOG_BHR=0, LOG_BW=0, LOG_PAD=0, LOG_WRAP=0)
    if order == ORDER_MEAN:
        cfg = mean_config(M, N, *device_limits(device))
        stats, iters, factor, rows_default = STATS_MEAN, cfg.iters, cfg.factor, 1
        meta.update(mean_constexprs(cfg))
        width = 4 * cfg.bw * cfg.bhr
    else:
        (stats, iters, width), rows_default = _fused_stats(N, vectorized), 2
    R, block_n, loop, warps, unroll, split = _tiles(N, elem, rows_default,
                                                    _interp_rows(M, _rms_exact_fwd_kernel, rows), num_warps, width,
                                                    iters, unroll, apply_bytes, stats, split=split)
    meta.update(STATS=stats, ROWS=R, BLOCK_N=block_n, LOOP=loop, ITERS=iters, num_warps=warps,
                ALIGNED=stats == STATS_MEAN and N % 4 == 0, UNROLL=unroll, SPLIT=split)
    scalars = (M, N, stride_row, residual_stride or 0, eps, offset_for_kernel(weight_offset), factor)
    return Launch(_rms_exact_fwd_kernel, (cdiv(M, R),),
                  meta_items(CAST_DTYPE=round_dtype(cast_dtype), **meta, **launch_options(_rms_exact_fwd_kernel)),
                  scalars if residual_stride is not None else (None, None, *scalars), device)


def rms_exact_forward(x2: torch.Tensor, M: int, stride_row: int, weight, bias, y, rstd, eps: float,
                      weight_offset: float, cast_dtype: Optional[torch.dtype], order: int, x_orig: torch.Tensor,
                      rows: Optional[int] = None, num_warps: Optional[int] = None, unroll: Optional[int] = None,
                      apply_bytes: Optional[int] = None, split: Optional[bool] = None, residual: tuple = ()):
    """Launches the RMS forward with torch's order ``order`` (ORDER_MEAN / ORDER_FUSED) on the M rows of
    x2 (row 0 at its data pointer, ``stride_row`` elements apart, unit last-dim stride). ``residual``: empty, or
    ``(r2, stride, h)`` (ORDER_MEAN): r2's rows (as x2's) are added to x2's first, rounded to h's dtype, and
    stored to h (contiguous)."""
    N = x2.shape[-1]
    vectorized = order != ORDER_MEAN and fused_vectorized(x_orig, N, weight)
    plan = rms_exact_plan(M, N, stride_row, x2.element_size(), x2.device, eps, weight_offset, cast_dtype, order,
                          vectorized, rows, num_warps, unroll, apply_bytes, split,
                          residual[1] if residual else None)
    plan((x2, weight, bias, y, rstd, residual[0], residual[2]) if residual else (x2, weight, bias, y, rstd))


@functools.lru_cache(maxsize=4096)
def ln_exact_plan(M: int, N: int, stride_row: int, elem: int, device: torch.device, eps: float, vectorized: bool,
                  rows: Optional[int] = None, num_warps: Optional[int] = None, mean_fma: Optional[int] = None,
                  unroll: Optional[int] = None, apply_bytes: Optional[int] = None) -> Launch:
    """The launch of the LayerNorm forward in ``F.layer_norm``'s CUDA order (``vectorized``: the kernel
    :func:`fused_vectorized` picks for the call) on M rows of N elements ``stride_row`` apart, whose pointer
    arguments are (x, weight, bias, y, mean, rstd): a pure function of its arguments, cached like
    :func:`rms_exact_plan` (host time). ``rows`` ... ``apply_bytes``: see :func:`_tiles`."""
    stats, iters, width = _fused_stats(N, vectorized)
    R, block_n, loop, warps, unroll, _ = _tiles(N, elem, 2, _interp_rows(M, _ln_exact_fwd_kernel, rows), num_warps,
                                                width, iters, unroll, apply_bytes, stats, True)
    meta = meta_items(STATS=stats, ROWS=R, BLOCK_N=block_n, LOOP=loop, ITERS=iters,
                      MEAN_FMA=LN_MEAN_FMA if mean_fma is None else mean_fma, UNROLL=unroll,
                      FULL=stats == STATS_VEC and N % (4 * LN_VEC_THREADS) == 0,
                      num_warps=warps, **launch_options(_ln_exact_fwd_kernel))
    return Launch(_ln_exact_fwd_kernel, (cdiv(M, R),), meta, (M, N, stride_row, eps), device)


def ln_exact_forward(x2: torch.Tensor, weight, bias, y, mean, rstd, eps: float, x_orig: torch.Tensor,
                     rows: Optional[int] = None, num_warps: Optional[int] = None, mean_fma: Optional[int] = None,
                     unroll: Optional[int] = None, apply_bytes: Optional[int] = None):
    """Launches the LayerNorm forward in ``F.layer_norm``'s CUDA order on x2 (M, N)."""
    M, N = x2.shape
    ln_exact_plan(M, N, x2.stride(0), x2.element_size(), x2.device, eps, fused_vectorized(x_orig, N, weight, bias),
                  rows, num_warps, mean_fma, unroll, apply_bytes)((x2, weight, bias, y, mean, rstd))


__all__ = ["ORDER_FUSED", "ORDER_MEAN", "ln_exact_forward", "ln_exact_plan", "rms_exact_forward", "rms_exact_plan"]
