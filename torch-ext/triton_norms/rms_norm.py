"""RMSNorm (optionally fused with a residual add): Triton kernels, ops, autograd.

Math, per row of N elements (all in fp32):

    h    = round_res(x + residual)                    (add_rms_norm only)
    rstd = rsqrt(sum(h * h) / N + eps)
    xn   = round_cast(h * rstd)                        (cast_dtype; identity if None)
    y    = xn * (w + weight_offset)                   (if weight)
    y    = round_out(y) + b                           (if bias; the extra rounding only with cast_dtype)
    out  = round_out(y)

Each ``round_*`` is one round-to-nearest-even to a dtype. The rounding points
are those of the modules matched in ``layers.py``: products of rounded values
computed in fp32 equal torch's fp16/bf16 elementwise multiply (the exact product
of two 8- or 11-bit mantissas fits in fp32, so one rounding happens either way).

Backward (rounding treated as identity, as autograd does for ``.to``):

    g  = dy * (w + weight_offset)
    dx = rstd * (g - xn * sum(g * xn) / N)   (+ dh, the gradient of h, for add_rms_norm)
    dw = sum_rows(dy * xn), db = sum_rows(dy)

dw/db are deterministic: each program of the backward grid sums its rows into
its own fp32 partial row, and the partials are summed afterwards in one launch (``_partials``).

Second derivatives (``create_graph=True``): the backward op's own gradient is the same math as fp32 PyTorch
ops (``_bwd_model``, rstd recomputed from x), differentiated by ``torch.func.vjp``.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import (
    addressed_signature, bwd_op_fake, bwd_op_outputs, check_db_dtype, check_float_tensor, check_weight_offset,
    column_sum, grad_rows, load_affine, load_grad_chunk, load_grad_raw, load_input_chunk, normalized_model, store_dx,
    empty_rows, offset_for_kernel, prepare_rms_args, rms_affine, rms_apply, round_to, rows_of, rows_view, vector,
)
from ._exact import rms_exact_forward, rms_exact_plan
from ._launch import MAX_FUSED_BYTES, backward_strides, bwd_max_fused_bytes, partial_grid, pick_config
from ._device import check_launch_device, device_warp_size, is_interpreter, launch_options
from ._ops import add_op_namespace_prefix
from ._dispatch import AUTOGRAD, IMPL, call_op, eager_autograd, eager_mode, fp32_vjp
from ._fastlaunch import Launch, PlanCache, launch, meta_items
from ._rounding import round_dtype
from ._torch_order import ORDER_FAST, ORDER_FUSED, fused_vectorized, parse_order
from ._partials import column_sums
from ._train_plans import planned_grads, run_forward_plan
from ._wide import rms_wide_forward, wide_backward

Tensor = torch.Tensor


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,  # (M, N) input, unit column stride
    res_ptr,  # (M, N) residual or None
    w_ptr,  # (N,) weight or None
    b_ptr,  # (N,) bias or None
    y_ptr,  # (M, N) output, contiguous
    h_ptr,  # (M, N) x + residual, contiguous, or None
    rstd_ptr,  # (M,) fp32 1/rms, saved for backward; None in inference (not stored)
    stride_x_row,  # elements x_ptr moves for one row
    stride_res_row,  # elements res_ptr moves for one row
    N,  # row length
    eps,
    weight_offset,  # added to the weight in fp32 (1.0 for Gemma)
    CAST_DTYPE: tl.constexpr,  # None, or dtype xn is rounded to before the weight multiply
    BLOCK_N: tl.constexpr,  # elements per chunk
    LOOP: tl.constexpr,  # several chunks per row
    W_FIRST: tl.constexpr,  # one chunk: load w/b before the row's reduction (_w_first)
):
    # One program per row. Bytes moved: read M*N*(x [+ res]) + N*(w [+ b]); write M*N*(y [+ h]) + 4M.
    row = tl.program_id(0).to(tl.int64)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask = offs < N
        # evict_last on x and w: +1-4% at 2048-16384 columns on the H200 (benchmarks/NOTES.md, session 22)
        x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, True,
                             "evict_last")
        if W_FIRST:
            w, b = load_affine(w_ptr, b_ptr, offs, mask, False, "evict_last")
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)
        if rstd_ptr is not None:
            tl.store(rstd_ptr + row, rstd)
        if not W_FIRST:
            w, b = load_affine(w_ptr, b_ptr, offs, mask, False, "evict_last")
        y = rms_affine(x, rstd, w, b, w_ptr, b_ptr, weight_offset, CAST_DTYPE, OUT_DTYPE)
        tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)
    else:
        # pass 1: sum of squares (and h stored); pass 2: reload (recompute h) and write y
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, True, "")
            acc += x * x
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
        if rstd_ptr is not None:
            tl.store(rstd_ptr + row, rstd)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, False, "")
            y = rms_apply(x, rstd, w_ptr, b_ptr, offs, mask, weight_offset, CAST_DTYPE, OUT_DTYPE)
            tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)


@triton.jit
def _rms_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row, offs, mask, rstd, weight_offset):
    """(dy, xn, g = dy * (w + offset)) for one chunk of a row, fp32, masked lanes 0."""
    dy = load_grad_chunk(dy_ptr, row, stride_dy_row, stride_dy_col, offs, mask)
    xn = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32) * rstd
    g = dy
    if w_ptr is not None:
        g = dy * (tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset)
    return dy, xn, g


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr,  # (M, N) gradient of y, any strides
    x_ptr,  # (M, N) normalised input (h for add_rms_norm), unit column stride
    w_ptr,  # (N,) weight or None
    rstd_ptr,  # (M,) fp32
    dh_ptr,  # (M, N) gradient of h, any strides, or None
    dx_ptr,  # (M, N) contiguous, x dtype (never dy's buffer)
    dres_ptr,  # (M, N) contiguous, residual dtype, or None
    dw_ptr,  # (P, N) fp32 partials, or None
    db_ptr,  # (P, N) fp32 partials, or None
    stride_dy_row, stride_dy_col,  # elements dy_ptr moves for one row / one column
    stride_x_row,
    stride_dh_row, stride_dh_col,
    M, N,
    rows_per_program,  # rows handled by each of the P programs
    weight_offset,
    CAST_DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOOP: tl.constexpr,
):
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program  # int64 bounds: the loop index is int64 too
    row_end = tl.minimum(row_start + rows_per_program, M)
    part = pid.to(tl.int64) * N  # this program's partial row in dw/db
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask = offs < N
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        # the next row's dy and x are loaded before this row's reduction (two rows in flight: +5% at 32768 x 4096
        # and 16384 x 8192 on the H200, benchmarks/NOTES.md, session 23)
        dyr, xr = load_grad_raw(dy_ptr, x_ptr, row_start, row_end, N, stride_dy_row, stride_dy_col, stride_x_row,
                                offs)
        for row in range(row_start, row_end):
            rstd = tl.load(rstd_ptr + row)
            dy = dyr.to(tl.float32)
            xn = xr.to(tl.float32) * rstd
            dyr, xr = load_grad_raw(dy_ptr, x_ptr, row + 1, row_end, N, stride_dy_row, stride_dy_col,
                                    stride_x_row, offs)
            g = dy
            if w_ptr is not None:
                g = dy * (tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset)
            dot = tl.sum(g * xn, axis=0) / N
            store_dx((g - xn * dot) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row, stride_dh_col,
                     N, offs, mask)
            if dw_ptr is not None:
                dw_acc += dy * round_to(xn, CAST_DTYPE)
            if db_ptr is not None:
                db_acc += dy
        if dw_ptr is not None:
            tl.store(dw_ptr + part + offs, dw_acc, mask=mask)
        if db_ptr is not None:
            tl.store(db_ptr + part + offs, db_acc, mask=mask)
    else:
        # partials live in memory (this program's own row): zero them first
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            if dw_ptr is not None:
                tl.store(dw_ptr + part + offs, tl.zeros([BLOCK_N], dtype=tl.float32), mask=mask)
            if db_ptr is not None:
                tl.store(db_ptr + part + offs, tl.zeros([BLOCK_N], dtype=tl.float32), mask=mask)
        for row in range(row_start, row_end):
            rstd = tl.load(rstd_ptr + row)
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                mask = offs < N
                dy, xn, g = _rms_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row,
                                          offs, mask, rstd, weight_offset)
                acc += g * xn
            dot = tl.sum(acc, axis=0) / N
            for start in range(0, N, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                mask = offs < N
                dy, xn, g = _rms_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row,
                                          offs, mask, rstd, weight_offset)
                store_dx((g - xn * dot) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row,
                                  stride_dh_col, N, offs, mask)
                if dw_ptr is not None:
                    p = dw_ptr + part + offs
                    tl.store(p, tl.load(p, mask=mask, other=0.0) + dy * round_to(xn, CAST_DTYPE), mask=mask)
                if db_ptr is not None:
                    p = db_ptr + part + offs
                    tl.store(p, tl.load(p, mask=mask, other=0.0) + dy, mask=mask)


def _rms_norm_fwd_impl(
    x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
    weight_offset: float, cast_dtype: Optional[torch.dtype], out_dtype: torch.dtype, order: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (y, h, rstd); h is x + residual (empty without residual), rstd fp32 of shape x.shape[:-1].
    ``order``: ``_torch_order.ORDER_*``, the summation order of the statistics (with a residual: ORDER_FAST or
    ORDER_MEAN)."""
    return _rms_norm_forward(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order, True)


def _rms_norm_infer(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order):
    """Inference: (y, h or None, None); rstd is neither stored nor allocated."""
    return _rms_norm_forward(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order, False)


def _rms_norm_forward(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order, save_stats):
    y = empty_rows(x, out_dtype)
    if residual is not None:
        h = empty_rows(x, residual.dtype)
    else:
        h = x.new_empty((0,)) if save_stats else None
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if save_stats else None
    if x.numel() == 0:
        return y, h, rstd
    check_launch_device(x, _rms_norm_fwd_kernel)
    N = x.shape[-1]
    x2, M, stride_x = rows_of(x)
    r2, _, stride_r = rows_of(residual) if residual is not None else (None, 0, 0)
    if order != ORDER_FAST:
        rms_exact_forward(x2, M, stride_x, vector(weight), vector(bias), y, rstd, eps, weight_offset,
                          cast_dtype, order, x, residual=() if residual is None else (r2, stride_r, h))
        return y, h, rstd
    elem = max(x.element_size(), residual.element_size() if residual is not None else 1)
    if N * elem > MAX_FUSED_BYTES and rms_wide_forward(
            x2, r2, vector(weight), vector(bias), y, h if residual is not None else None, rstd, M, N, stride_x,
            stride_r, eps, weight_offset, cast_dtype, elem):
        # wide rows: a team of programs per row, read once (_wide)
        return y, h, rstd
    launch(_rms_norm_fwd_kernel, (M,), (
        x2, r2, vector(weight), vector(bias), y, h if residual is not None else None, rstd,
        stride_x, stride_r, N, eps, weight_offset,
    ), _fwd_meta(N, elem, x.device, cast_dtype, residual is not None), x.device)
    return y, h, rstd


@functools.lru_cache(maxsize=1024)
def _fwd_meta(N: int, elem: int, device: torch.device, cast_dtype: Optional[torch.dtype], residual: bool) -> tuple:
    """Constexprs and launch options of the free-order forward (a pure function, cached: host time)."""
    cfg = pick_config(N, elem, device_warp_size(device))
    return meta_items(CAST_DTYPE=round_dtype(cast_dtype), BLOCK_N=cfg.block_n, LOOP=cfg.loop,
                      W_FIRST=_w_first(N * elem, cfg.loop, residual), num_warps=cfg.num_warps,
                      **launch_options(_rms_norm_fwd_kernel))


def _w_first(row_bytes: int, loop: bool, residual: bool) -> bool:
    """Whether the one-chunk forward loads w/b before the row's reduction: for rows of at most 8 KiB without a
    residual. A load written after the reduction is issued after its barrier, so each row then waits for w at
    its end; loaded first, w arrives during the reduction (more registers live). H200 (bf16, CUDA graphs,
    5 interleaved rounds, session 13): 32768 x 4096 130.9 -> 129.5 us (4087 -> 4144 GB/s, Liger 4169);
    16384 x 8192 131.4 -> 132.7 us (-1%), so not for wider rows. add_rms_norm not measured: kept after."""
    return not loop and not residual and row_bytes <= 8192


_rms_norm_fwd = torch.library.custom_op(add_op_namespace_prefix("rms_norm_fwd"), _rms_norm_fwd_impl, mutates_args=())
"""The registered op (autograd, fake, compile); eager inference calls ``_rms_norm_fwd_impl`` directly."""


@_rms_norm_fwd.register_fake
def _(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order):
    h_shape = x.shape if residual is not None else (0,)
    h_dtype = (residual if residual is not None else x).dtype
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty(h_shape, dtype=h_dtype), \
        x.new_empty(x.shape[:-1], dtype=torch.float32)


def _rms_norm_bwd_grads(
    dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], rstd: Tensor, weight_offset: float,
    cast_dtype: Optional[torch.dtype], dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype], need_dw: bool,
    db_dtype: Optional[torch.dtype],
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """``(dx, dres, dw, db)``; dres / dw / db None when not requested (dres_dtype / need_dw / db_dtype); dw in
    weight's dtype, db in db_dtype. Plain eager backwards call this directly (no placeholders: host time)."""
    N = x.shape[-1]
    dx = torch.empty_like(x, dtype=dx_dtype, memory_format=torch.contiguous_format)
    dres = torch.empty_like(x, dtype=dres_dtype, memory_format=torch.contiguous_format) \
        if dres_dtype is not None else None
    if x.numel() == 0:
        return (dx, dres, x.new_zeros((N,), dtype=weight.dtype) if need_dw else None,
                x.new_zeros((N,), dtype=db_dtype) if db_dtype is not None else None)
    check_launch_device(x, _rms_norm_bwd_kernel)
    x2 = rows_view(x)
    dy2 = grad_rows(dy, N)
    dh2 = grad_rows(dh, N) if dh is not None else None
    M = x2.shape[0]
    need_db = db_dtype is not None
    parts = wide_backward("rms_norm", dy2, dh2, x2, vector(weight), (rstd,), dx, dres, need_dw, need_db, M, N,
                          weight_offset=weight_offset, cast_dtype=cast_dtype) \
        if N * x.element_size() > bwd_max_fused_bytes(x.device) else None
    if parts is not None:  # wide rows: persistent teams, x and dy read once (_wide)
        dw_part, db_part = parts
    else:
        P, run = _bwd_plan(M, N, x.element_size(), x.device, backward_strides(dy2, x2, dh2), cast_dtype,
                           weight_offset, dh2 is not None or need_db)
        dw_part = torch.empty((P, N), dtype=torch.float32, device=x.device) if need_dw else None
        db_part = torch.empty((P, N), dtype=torch.float32, device=x.device) if need_db else None
        run((dy2, x2, vector(weight), rstd, dh2, dx, dres, dw_part, db_part))
    return (dx, dres, *column_sums(dw_part, db_part, weight.dtype if need_dw else None, db_dtype))


def _rms_norm_bwd_impl(
    dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], rstd: Tensor, weight_offset: float,
    cast_dtype: Optional[torch.dtype], dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype], need_dw: bool,
    db_dtype: Optional[torch.dtype],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The registered op: :func:`_rms_norm_bwd_grads` with an empty tensor for each output not requested.

    Raises:
        TypeError: ``db_dtype`` neither None nor a floating dtype (e.g. the bool flag this argument replaced).
    """
    check_db_dtype(db_dtype)
    return bwd_op_outputs(_rms_norm_bwd_grads(dy, dh, x, weight, rstd, weight_offset, cast_dtype, dx_dtype,
                                              dres_dtype, need_dw, db_dtype), x, dx_dtype)


@functools.lru_cache(maxsize=1024)
def _bwd_plan(M: int, N: int, elem: int, device: torch.device, strides: tuple, cast_dtype: Optional[torch.dtype],
              weight_offset: float, more_state: bool) -> tuple:
    """``(P, Launch)``: the backward of M rows of N elements (``strides``: dy's row and column, x's row, dh's row
    and column strides, 0 without dh) over P programs, each writing one fp32 row of dw / db partial sums; the
    pointers (dy, x, w, rstd, dh, dx, dres, dw partials, db partials) are given per call. A pure function of its
    arguments, cached like the forwards' plans: the meta-parameters and the scalars' specialisation are worked out
    once per signature, not on every backward (host time)."""
    warp = device_warp_size(device)
    cfg = pick_config(N, elem, warp)
    P, rows_per_program = partial_grid(device, M)
    meta = meta_items(CAST_DTYPE=round_dtype(cast_dtype), BLOCK_N=cfg.block_n, LOOP=cfg.loop, num_warps=cfg.num_warps,
                      **launch_options(_rms_norm_bwd_kernel), **_bwd_register_cap(cfg, warp, device, more_state))
    return P, Launch(_rms_norm_bwd_kernel, (P,), meta,
                     (*strides, M, N, rows_per_program, offset_for_kernel(weight_offset)), device)


def _bwd_register_cap(cfg, warp_size: int, device: torch.device, more_state: bool) -> dict:
    """``{"maxnreg": 128}`` for the one-chunk backward of 256 threads on NVIDIA, else ``{}``. Measured when 256
    threads served bf16 rows of 8192 (64 bytes per thread, no next-row prefetch): uncapped, that kernel took ~170
    registers per thread, so one program held a multiprocessor; at 128 two fit. H200 (bf16 16384 x 8192, CUDA
    graphs, session 13): 293.6 -> 247.1 us (2742 -> 3259 GB/s); at 128 threads the cap cost 2%. Since session 23
    256 threads serve bf16 rows of 4096 (fp32 of 2048), which a CPU compile for sm_90 puts at ~103 registers with
    the prefetch, under the cap: it bounds them, as measured in that session's A/B (3632 GB/s at 32768 x 4096).
    With a bias gradient or an incoming dh (``more_state``) it was never measured, so those keep the compiler's
    choice."""
    if (cfg.loop or more_state or cfg.num_warps * warp_size != 256 or device.type != "cuda"
            or torch.version.hip is not None or is_interpreter(_rms_norm_bwd_kernel)):
        return {}
    return {"maxnreg": 128}


_rms_norm_bwd = torch.library.custom_op(add_op_namespace_prefix("rms_norm_bwd"), _rms_norm_bwd_impl, mutates_args=())


@_rms_norm_bwd.register_fake
def _(dy, dh, x, weight, rstd, weight_offset, cast_dtype, dx_dtype, dres_dtype, need_dw, db_dtype):
    return bwd_op_fake(x, weight, dx_dtype, dres_dtype, need_dw, db_dtype)


def _bwd_model(dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], rstd: Tensor,
               weight_offset: float) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward kernels' (dx, dw, db) (module docstring; dres is dx) as fp32 PyTorch ops, differentiable: the
    double backward's model, rstd recomputed from x (``normalized_model``)."""
    xn, rstd = normalized_model(x, rstd, rms=True)
    g = dy if weight is None else dy * (weight + weight_offset)
    dx = rstd * (g - xn * (g * xn).mean(-1, keepdim=True))
    return dx if dh is None else dx + dh, column_sum(dy * xn), column_sum(dy)


def _bwd_setup_context(ctx, inputs, output):
    dy, dh, x, weight, rstd, weight_offset, _, _, dres_dtype, need_dw, db_dtype = inputs
    ctx.save_for_backward(dy, dh, x, weight, rstd)
    ctx.args = (weight_offset, dres_dtype is not None, need_dw, db_dtype is not None)


def _bwd_backward(ctx, ddx, ddres, ddw, ddb):
    """The gradients of (dx, dres, dw, db) with respect to dy, dh, x and the weight (a second derivative through
    rms_norm; x's flows on through the forward, for add_rms_norm from h to x and the residual): ``_bwd_model``
    differentiated in fp32."""
    dy, dh, x, weight, rstd = ctx.saved_tensors
    weight_offset, dres, need_dw, need_db = ctx.args
    grads = (ddx + ddres if dres else ddx, ddw if need_dw else None, ddb if need_db else None)
    ddy, ddh, dxx, dweight, _ = fp32_vjp(lambda *t: _bwd_model(*t, weight_offset), (dy, dh, x, weight, rstd), grads)
    return ddy, ddh, dxx, dweight, None, None, None, None, None, None, None


_RMS_BWD_AUTOGRAD = eager_autograd(_rms_norm_bwd, _rms_norm_bwd_impl, _bwd_setup_context, _bwd_backward)


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order = inputs
    y, h, rstd = output
    ctx.save_for_backward(h if residual is not None else x, weight, rstd)
    # rstd has no gradient, and an unused y or h gets None, not a zeros tensor (host time)
    ctx.mark_non_differentiable(rstd)
    ctx.set_materialize_grads(False)
    ctx.x_dtype = x.dtype
    ctx.res_dtype = residual.dtype if residual is not None else None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.weight_offset = weight_offset
    ctx.cast_dtype = cast_dtype
    ctx.out_dtype = out_dtype


def _backward(ctx, dy, dh, drstd):
    return _backward_of(ctx, ctx.saved_tensors, dy, dh)


def _backward_of(ctx, saved, dy, dh):
    """``_backward`` with the saved tensors already unpacked (``_RmsNormEagerAutograd`` unpacks them once: a second
    ``ctx.saved_tensors`` raises under non-reentrant activation checkpointing)."""
    xs, weight, rstd = saved
    if dy is None:  # only h was used
        dy = torch.zeros(xs.shape, dtype=ctx.out_dtype, device=xs.device)
    need = ctx.needs_input_grad
    need_dw = weight is not None and need[2]
    need_db = ctx.bias_dtype is not None and need[3]
    dx, dres, dw, db = call_op(
        _rms_norm_bwd, _rms_norm_bwd_impl, dy, dh if ctx.res_dtype is not None else None, xs, weight, rstd,
        ctx.weight_offset, ctx.cast_dtype, ctx.x_dtype, ctx.res_dtype, need_dw, ctx.bias_dtype if need_db else None,
        autograd=_RMS_BWD_AUTOGRAD, infer=_rms_norm_bwd_grads,
    )
    return (dx, dres if ctx.res_dtype is not None else None, dw if need_dw else None, db if need_db else None,
            None, None, None, None, None)


_RMS_AUTOGRAD = eager_autograd(_rms_norm_fwd, _rms_norm_fwd_impl, _setup_context, _backward)


def rms_norm(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    cast_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    torch_order: Optional[str] = None,
) -> Tensor:
    """Root-mean-square normalisation over the last dimension.

    ``y = round_out(round_cast(x * rsqrt(mean(x**2) + eps)) * (weight + weight_offset) [+ bias])``

    Args:
        x: (..., N) fp16/bf16/fp32; any leading shape and row strides; a last dim
            that is not contiguous is copied once.
        weight: (N,) or None; fp16, bf16 or fp32, read in fp32.
        bias: (N,) or None.
        eps: >= 0, added to the mean square in fp32.
        weight_offset: added to the weight in fp32 (1.0 for Gemma's ``1 + w``).
        cast_dtype: round the normalised value to this dtype before the weight
            multiply (LlamaRMSNorm: x.dtype); with a bias, the product is also
            rounded to out_dtype before the bias add (diffusers RMSNorm).
        out_dtype: output dtype (default x.dtype).
        torch_order: None (fastest), ``"mean"`` (sum the squares in the order of
            CUDA ``x.float().pow(2).mean(-1)``: transformers' RMSNorms) or
            ``"fused"`` (``F.rms_norm``'s CUDA kernel): bit-exact rstd on CUDA.

    Returns:
        (..., N) tensor of out_dtype, contiguous. Saves x, weight and fp32 rstd (M,) for backward.

    Raises:
        TypeError: unsupported dtype (only fp16, bf16, fp32) of a tensor, cast_dtype or out_dtype, non-tensor
            arguments, a sparse or nested tensor, an eps or weight_offset that is not a Python number, a
            torch_order that is neither None nor a string.
        ValueError: a 0-d x, weight/bias shape != (N,), tensors on different devices, eps < 0 or not
            finite, a non-finite weight_offset, an unknown torch_order.
        RuntimeError: CPU tensor without TRITON_INTERPRET=1; a meta tensor (no data to run on).

    Precision: sum of squares, normalisation and affine in fp32; roundings only at
    the points above. Performance: one program per row reads x once and writes y once; a row
    above one block (64 KiB; in the backward on NVIDIA above 16 KiB) goes to a persistent team of programs on a
    GPU, still read once, forward and backward (``_wide``). Source: Zhang & Sennrich 2019,
    https://arxiv.org/abs/1910.07467; numerics of transformers' LlamaRMSNorm et al.
    """
    mode = eager_mode((x, weight, bias)) if type(eps) is float and type(weight_offset) is float else None
    if mode == IMPL or mode == AUTOGRAD:
        # plain eager code: one validated plan per call signature (host time of small calls and of training
        # steps), the inputs' 16-byte alignment included (its launch is pinned and takes their addresses); Python
        # floats only, so that no other type (a bool or a tensor) can equal a planned value
        plans = _INFER_PLANS if mode == IMPL else _TRAIN_PLANS
        try:
            xp, wp, bp, tensors = addressed_signature(x, weight, bias)
            key = (tensors, eps, weight_offset, cast_dtype, out_dtype, torch_order)
            plan = plans.get(key)
        except (TypeError, RuntimeError):  # an unhashable argument, a sparse or nested tensor (no storage or
            plan = _GENERAL  # strides): the general path names it
        if plan is None:
            plan = plans.add(key, _infer_plan(x, None, weight, bias, eps, weight_offset, cast_dtype, out_dtype,
                                              torch_order)
                             if mode == IMPL else
                             _train_plan(x, weight, bias, eps, weight_offset, cast_dtype, out_dtype, torch_order))
        if plan is not _GENERAL:
            if mode == AUTOGRAD:
                return _RmsNormEagerAutograd.apply(x, None, weight, bias, *plan)
            new_dtype, exact, run = plan
            y = torch.empty_like(x) if new_dtype is None else torch.empty_like(x, dtype=new_dtype)
            if exact:
                if not run.at((xp, wp, bp, y.data_ptr(), None)):
                    run((x, weight, bias, y, None))
            elif not run.at((xp, None, wp, bp, y.data_ptr(), None, None)):
                run((x, None, weight, bias, y, None, None))
            return y
    eps, out_dtype = prepare_rms_args(x, None, weight, bias, eps, cast_dtype, out_dtype)
    order = parse_order(torch_order)
    return call_op(_rms_norm_fwd, _rms_norm_fwd_impl, x, None, weight, bias, eps, check_weight_offset(weight_offset), cast_dtype, out_dtype, order,
                   autograd=_RMS_AUTOGRAD, infer=_rms_norm_infer)[0]


_INFER_PLANS = PlanCache()
_GENERAL = object()  # plan of a call the general path serves


def _infer_plan(x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, torch_order):
    """Validates a plain eager call of :func:`rms_norm` (``residual`` None) or of :func:`add_rms_norm` (raising as
    they do) and returns its inference plan (of which :func:`_train_plan` takes the launch):
    ``(output dtype, or None for x's; torch-order kernel; FixedLaunch)``, the launch :func:`_rms_norm_infer`
    makes for every call of this signature (the key fixes the pointers' alignment, which also decides
    ``F.rms_norm``'s kernel; y is a new allocation, which starts on 16 bytes), or ``_GENERAL`` for calls it leaves
    to the general path (empty or non-contiguous tensors, wide rows in the free order). Its pointers: (x, weight,
    bias, y, rstd[, residual, h]) in a torch order, (x, residual, weight, bias, y, h, rstd) in the free order."""
    if residual is not None:
        check_float_tensor("residual", residual)
    eps, out_dtype = prepare_rms_args(x, residual, weight, bias, eps, cast_dtype, out_dtype)
    order = parse_order(torch_order) if residual is None else parse_order(torch_order, ("mean",))
    weight_offset = check_weight_offset(weight_offset)
    N, device = x.shape[-1], x.device
    elem = max(x.element_size(), residual.element_size() if residual is not None else 1)
    if (x.numel() == 0 or not all(t is None or t.is_contiguous() for t in (x, residual, weight, bias))
            or order == ORDER_FAST and N * elem > MAX_FUSED_BYTES):
        return _GENERAL
    check_launch_device(x, _rms_norm_fwd_kernel)
    M = x.numel() // N
    if order != ORDER_FAST:
        run = rms_exact_plan(M, N, N, x.element_size(), device, eps, weight_offset, cast_dtype, order,
                             order == ORDER_FUSED and fused_vectorized(x, N, weight),
                             residual_stride=None if residual is None else N)
    else:
        run = Launch(_rms_norm_fwd_kernel, (M,), _fwd_meta(N, elem, device, cast_dtype, residual is not None),
                     (N, 0 if residual is None else N, N, eps, weight_offset), device)
    return (None if out_dtype == x.dtype else out_dtype), order != ORDER_FAST, run.pinned()


def _train_plan(x, weight, bias, eps, weight_offset, cast_dtype, out_dtype, torch_order):
    """The plan of an eager training call of :func:`rms_norm`: the rest of :class:`_RmsNormEagerAutograd`'s arguments
    after (x, residual, weight, bias), i.e. the validated op arguments (eps, weight_offset, cast_dtype, out_dtype,
    order), then ``(exact order, the forward launch that stores rstd, the backward plans)``; or ``_GENERAL`` where
    :func:`_infer_plan` leaves the call to the general path. The launch is a plan of its own: its kernel is
    compiled with an rstd pointer."""
    infer = _infer_plan(x, None, weight, bias, eps, weight_offset, cast_dtype, out_dtype, torch_order)
    if infer is _GENERAL:
        return _GENERAL
    eps, out_dtype = prepare_rms_args(x, None, weight, bias, eps, cast_dtype, out_dtype)
    _, exact, run = infer
    return (eps, check_weight_offset(weight_offset), cast_dtype, out_dtype, parse_order(torch_order),
            (exact, run, PlanCache()))


class _RmsNormEagerAutograd(torch.autograd.Function):
    """Plain eager training of :func:`rms_norm` for a call signature with a plan (:func:`_train_plan`): the forward
    of ``_rms_norm_fwd_impl`` through the plan's pinned launch, ``_setup_context``, and a backward planned per
    upstream gradient's signature (``_train_plans``) where the op's ``_backward`` would call
    ``_rms_norm_bwd_grads``, else that ``_backward``; the same values and gradients as the op, with less host time
    per call. It returns y alone: h (empty without a residual) and rstd (saved, no gradient) are not outputs, which
    spares the autograd engine two outputs per call."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order, launch):
        exact, run, ctx.bwd_plans = launch  # the backward plans (_train_plans)
        y = torch.empty_like(x, dtype=out_dtype)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        run_forward_plan(exact, run, x, weight, bias, y, (rstd,))
        _setup_context(ctx, (x, residual, weight, bias, eps, weight_offset, cast_dtype, out_dtype, order),
                       (y, None, rstd))
        return y

    @staticmethod
    def backward(ctx, dy):
        xs, weight, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_dw, need_db = weight is not None and need[2], ctx.bias_dtype is not None and need[3]
        grads = planned_grads(ctx.bwd_plans, dy, xs, weight, (rstd,), ctx.x_dtype, ctx.bias_dtype, need_dw, need_db,
                              _bwd_plan, (ctx.cast_dtype, ctx.weight_offset, need_db))
        if grads is None:  # create_graph, a dispatch mode, wide rows, ...: the op's backward
            return (*_backward_of(ctx, (xs, weight, rstd), dy, None), None)
        dx, dw, db = grads
        return dx, None, dw, db, None, None, None, None, None, None


_TRAIN_PLANS = PlanCache()


def add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    cast_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    torch_order: Optional[str] = None,
) -> Tuple[Tensor, Tensor]:
    """Fused ``h = x + residual``; ``out = rms_norm(h)`` in one kernel pass.

    Args: as :func:`rms_norm`, plus ``residual`` of x's shape (fp16/bf16/fp32).
    ``out_dtype`` defaults to residual.dtype (the dtype of h). ``torch_order``: None (fastest) or ``"mean"``
    (h's squares summed in the order of CUDA ``h.float().pow(2).mean(-1)``: with ``cast_dtype=h.dtype``,
    transformers' ``hidden_states = residual + hidden_states`` then its LlamaRMSNorm, bit for bit on CUDA);
    ``"fused"`` is not offered with a residual (ValueError).

    Returns:
        ``(out, h)``: h = x + residual computed in fp32 and rounded once to
        residual.dtype (HF's ``residual + hidden_states`` in the model dtype); out
        is normalised from that rounded h. Gradients flow to x and residual
        (both receive dh_total = d(out)/dh + d(h)).

    Raises: as :func:`rms_norm`; also TypeError for a residual that is not a dense fp16/bf16/fp32 tensor
    (None included), ValueError for a residual not of x's shape or on another device and for
    ``torch_order="fused"``.
    """
    if type(eps) is float and type(weight_offset) is float and eager_mode((x, residual, weight, bias), 2) == IMPL:
        # plain eager inference: one validated plan per call signature, as rms_norm's (a decoder layer's call per
        # token at batch 1 is host time)
        try:
            xp, wp, bp, tensors = addressed_signature(x, weight, bias)
            rp = residual.data_ptr()
            key = (tensors, residual.dtype, residual.shape, residual.device, residual.is_contiguous(), rp & 15, eps,
                   weight_offset, cast_dtype, out_dtype, torch_order)
            plan = _ADD_PLANS.get(key)
        except (TypeError, RuntimeError):  # an unhashable argument, a sparse or nested tensor: the general path
            plan = _GENERAL  # names it
        if plan is None:
            plan = _ADD_PLANS.add(key, _infer_plan(x, residual, weight, bias, eps, weight_offset, cast_dtype,
                                                   out_dtype, torch_order))
        if plan is not _GENERAL:
            y_dtype, exact, run = plan
            y, h = torch.empty_like(x, dtype=y_dtype), torch.empty_like(residual)
            if exact:
                if not run.at((xp, wp, bp, y.data_ptr(), None, rp, h.data_ptr())):
                    run((x, weight, bias, y, None, residual, h))
            elif not run.at((xp, rp, wp, bp, y.data_ptr(), h.data_ptr(), None)):
                run((x, residual, weight, bias, y, h, None))
            return y, h
    check_float_tensor("residual", residual)  # required here (None would silently be rms_norm)
    eps, out_dtype = prepare_rms_args(x, residual, weight, bias, eps, cast_dtype, out_dtype)
    order = parse_order(torch_order, ("mean",))
    y, h, _ = call_op(_rms_norm_fwd, _rms_norm_fwd_impl, x, residual, weight, bias, eps,
                      check_weight_offset(weight_offset), cast_dtype, out_dtype, order,
                      autograd=_RMS_AUTOGRAD, infer=_rms_norm_infer)
    return y, h


_ADD_PLANS = PlanCache()
