"""LayerNorm over the last dimension (optionally fused with a residual add).

Math, per row of N elements (all in fp32, ``torch.nn.functional.layer_norm`` numerics):

    h    = round_res(x + residual)            (add_layer_norm only)
    mean = sum(h) / N
    rstd = rsqrt(sum((h - mean)**2) / N + eps)    (biased variance, two passes)
    out  = round_out((h - mean) * rstd * w + b)

Backward, with xhat = (h - mean) * rstd and g = dy * w:

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (+ dh for add_layer_norm)
    dw = sum_rows(dy * xhat), db = sum_rows(dy)

dw/db: fp32 partials per program, summed afterwards in one launch (``_partials``: deterministic, no atomics).

Second derivatives (``create_graph=True``): the backward op's own gradient is the same math as fp32 PyTorch
ops (``_bwd_model``, mean and rstd recomputed from x), differentiated by ``torch.func.vjp``.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import (
    addressed_signature, bwd_op_fake, bwd_op_outputs, check_db_dtype, check_eps, check_float_tensor, check_inputs,
    column_sum, grad_rows, empty_rows, ln_apply, load_grad_chunk, load_grad_raw, load_input_chunk, normalized_model,
    rows_of, rows_view, store_dx, vector,
)
from ._exact import ln_exact_forward, ln_exact_plan
from ._launch import MAX_FUSED_BYTES, backward_strides, bwd_max_fused_bytes, partial_grid, pick_config
from ._device import check_launch_device, device_warp_size, launch_options
from ._ops import add_op_namespace_prefix
from ._dispatch import AUTOGRAD, IMPL, call_op, eager_autograd, eager_mode, fp32_vjp
from ._fastlaunch import Launch, PlanCache, launch, meta_items
from ._torch_order import ORDER_FAST, ORDER_FUSED, fused_vectorized, parse_order
from ._partials import column_sums
from ._train_plans import planned_grads, run_forward_plan
from ._wide import ln_wide_forward, wide_backward

Tensor = torch.Tensor


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,  # (M, N) input, unit column stride
    res_ptr,  # (M, N) residual or None
    w_ptr,  # (N,) weight or None
    b_ptr,  # (N,) bias or None
    y_ptr,  # (M, N) output, contiguous
    h_ptr,  # (M, N) x + residual, contiguous, or None
    mean_ptr,  # (M,) fp32, saved for backward; None in inference (not stored)
    rstd_ptr,  # (M,) fp32, saved for backward; None in inference
    stride_x_row,  # elements x_ptr moves for one row
    stride_res_row,  # elements res_ptr moves for one row
    N,
    eps,
    BLOCK_N: tl.constexpr,
    LOOP: tl.constexpr,
):
    # One program per row. Bytes: read M*N*(x [+ res]) (3x when LOOP), write M*N*(y [+ h]) + 8M.
    row = tl.program_id(0).to(tl.int64)
    OUT_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask = offs < N
        # evict_last on x (not on w, b): +1.5-3.6% at 2048-16384 columns on the H200 (benchmarks/NOTES.md, session 22)
        x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, True,
                             "evict_last")
        mean = tl.sum(x, axis=0) / N
        d = tl.where(mask, x - mean, 0.0)
        rstd = tl.math.rsqrt(tl.sum(d * d, axis=0) / N + eps)
        if rstd_ptr is not None:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
        y = ln_apply(x, mean, rstd, w_ptr, b_ptr, offs, mask, OUT_DTYPE)
        tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)
    else:
        # pass 1: mean (h stored); pass 2: variance around the mean; pass 3: output
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            acc += load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, True,
                                    "")
        mean = tl.sum(acc, axis=0) / N
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, False, "")
            d = tl.where(mask, x - mean, 0.0)
            acc += d * d
        rstd = tl.math.rsqrt(tl.sum(acc, axis=0) / N + eps)
        if rstd_ptr is not None:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            x = load_input_chunk(x_ptr, res_ptr, h_ptr, row, stride_x_row, stride_res_row, N, offs, mask, False, "")
            y = ln_apply(x, mean, rstd, w_ptr, b_ptr, offs, mask, OUT_DTYPE)
            tl.store(y_ptr + row * N + offs, y.to(OUT_DTYPE), mask=mask)


@triton.jit
def _ln_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row, offs, mask, mean, rstd):
    """(dy, xhat, g = dy * w) for one chunk of a row, fp32, masked lanes 0."""
    dy = load_grad_chunk(dy_ptr, row, stride_dy_row, stride_dy_col, offs, mask)
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    g = dy
    if w_ptr is not None:
        g = dy * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return dy, xhat, g


@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr,  # (M, N) gradient of y, any strides
    x_ptr,  # (M, N) normalised input (h for add_layer_norm), unit column stride
    w_ptr,  # (N,) weight or None
    mean_ptr, rstd_ptr,  # (M,) fp32
    dh_ptr,  # (M, N) gradient of h, any strides, or None
    dx_ptr,  # (M, N) contiguous, x dtype
    dres_ptr,  # (M, N) contiguous, residual dtype, or None
    dw_ptr, db_ptr,  # (P, N) fp32 partials, or None
    stride_dy_row, stride_dy_col, stride_x_row, stride_dh_row, stride_dh_col,
    M, N,
    rows_per_program,
    BLOCK_N: tl.constexpr,
    LOOP: tl.constexpr,
):
    pid = tl.program_id(0)
    row_start = pid.to(tl.int64) * rows_per_program  # int64 bounds: the loop index is int64 too
    row_end = tl.minimum(row_start + rows_per_program, M)
    part = pid.to(tl.int64) * N
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask = offs < N
        dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        # the next row's dy and x are loaded before this row's reductions (two rows in flight: +19% / +25% at
        # 32768 x 4096 / 16384 x 8192 on the H200, benchmarks/NOTES.md, session 23)
        dyr, xr = load_grad_raw(dy_ptr, x_ptr, row_start, row_end, N, stride_dy_row, stride_dy_col, stride_x_row,
                                offs)
        for row in range(row_start, row_end):
            mean = tl.load(mean_ptr + row)
            rstd = tl.load(rstd_ptr + row)
            dy = dyr.to(tl.float32)
            xhat = tl.where(mask, (xr.to(tl.float32) - mean) * rstd, 0.0)
            dyr, xr = load_grad_raw(dy_ptr, x_ptr, row + 1, row_end, N, stride_dy_row, stride_dy_col,
                                    stride_x_row, offs)
            g = dy
            if w_ptr is not None:
                g = dy * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            c1 = tl.sum(g * xhat, axis=0) / N
            c2 = tl.sum(g, axis=0) / N
            store_dx((g - c2 - xhat * c1) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row,
                     stride_dh_col, N, offs, mask)
            if dw_ptr is not None:
                dw_acc += dy * xhat
            if db_ptr is not None:
                db_acc += dy
        if dw_ptr is not None:
            tl.store(dw_ptr + part + offs, dw_acc, mask=mask)
        if db_ptr is not None:
            tl.store(db_ptr + part + offs, db_acc, mask=mask)
    else:
        for start in range(0, N, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < N
            if dw_ptr is not None:
                tl.store(dw_ptr + part + offs, tl.zeros([BLOCK_N], dtype=tl.float32), mask=mask)
            if db_ptr is not None:
                tl.store(db_ptr + part + offs, tl.zeros([BLOCK_N], dtype=tl.float32), mask=mask)
        for row in range(row_start, row_end):
            mean = tl.load(mean_ptr + row)
            rstd = tl.load(rstd_ptr + row)
            acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                mask = offs < N
                dy, xhat, g = _ln_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row,
                                           offs, mask, mean, rstd)
                acc1 += g * xhat
                acc2 += g
            c1 = tl.sum(acc1, axis=0) / N
            c2 = tl.sum(acc2, axis=0) / N
            for start in range(0, N, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                mask = offs < N
                dy, xhat, g = _ln_bwd_load(dy_ptr, x_ptr, w_ptr, row, stride_dy_row, stride_dy_col, stride_x_row,
                                           offs, mask, mean, rstd)
                store_dx((g - c2 - xhat * c1) * rstd, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row,
                                 stride_dh_col, N, offs, mask)
                if dw_ptr is not None:
                    p = dw_ptr + part + offs
                    tl.store(p, tl.load(p, mask=mask, other=0.0) + dy * xhat, mask=mask)
                if db_ptr is not None:
                    p = db_ptr + part + offs
                    tl.store(p, tl.load(p, mask=mask, other=0.0) + dy, mask=mask)


def _layer_norm_fwd_impl(
    x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor], eps: float, order: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (y, h, mean, rstd); y in h's dtype (x.dtype without residual), h empty without residual.
    ``order``: ORDER_FUSED follows ``F.layer_norm``'s CUDA order (not with a residual)."""
    return _layer_norm_forward(x, residual, weight, bias, eps, order, True)


def _layer_norm_infer(x, residual, weight, bias, eps, order):
    """Inference: (y, h or None, None, None); mean and rstd are neither stored nor allocated."""
    return _layer_norm_forward(x, residual, weight, bias, eps, order, False)


def _layer_norm_forward(x, residual, weight, bias, eps, order, save_stats):
    h_dtype = (residual if residual is not None else x).dtype
    y = empty_rows(x, h_dtype)
    if residual is not None:
        h = empty_rows(x, h_dtype)
    else:
        h = x.new_empty((0,)) if save_stats else None
    mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if save_stats else None
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device) if save_stats else None
    if x.numel() == 0:
        return y, h, mean, rstd
    check_launch_device(x, _layer_norm_fwd_kernel)
    N = x.shape[-1]
    if order == ORDER_FUSED and residual is None:
        ln_exact_forward(rows_view(x), vector(weight), vector(bias), y, mean, rstd, eps, x)
        return y, h, mean, rstd
    x2, M, stride_x = rows_of(x)
    r2, _, stride_r = rows_of(residual) if residual is not None else (None, 0, 0)
    elem = max(x.element_size(), residual.element_size() if residual is not None else 1)
    if N * elem > MAX_FUSED_BYTES and ln_wide_forward(
            x2, r2, vector(weight), vector(bias), y, h if residual is not None else None, mean, rstd, M, N,
            stride_x, stride_r, eps, elem):
        # wide rows: a team of programs per row, read once (_wide)
        return y, h, mean, rstd
    launch(_layer_norm_fwd_kernel, (M,), (
        x2, r2, vector(weight), vector(bias), y, h if residual is not None else None, mean, rstd,
        stride_x, stride_r, N, eps,
    ), _fwd_meta(N, elem, x.device), x.device)
    return y, h, mean, rstd


@functools.lru_cache(maxsize=1024)
def _fwd_meta(N: int, elem: int, device: torch.device) -> tuple:
    """Constexprs and launch options of the free-order forward (a pure function, cached: host time)."""
    cfg = pick_config(N, elem, device_warp_size(device))
    return meta_items(BLOCK_N=cfg.block_n, LOOP=cfg.loop, num_warps=cfg.num_warps,
                      **launch_options(_layer_norm_fwd_kernel))


_layer_norm_fwd = torch.library.custom_op(add_op_namespace_prefix("layer_norm_fwd"), _layer_norm_fwd_impl, mutates_args=())
"""The registered op (autograd, fake, compile); eager inference calls ``_layer_norm_fwd_impl`` directly."""


@_layer_norm_fwd.register_fake
def _(x, residual, weight, bias, eps, order):
    h_dtype = (residual if residual is not None else x).dtype
    stat = x.new_empty(x.shape[:-1], dtype=torch.float32)
    return (x.new_empty(x.shape, dtype=h_dtype), x.new_empty(x.shape if residual is not None else (0,), dtype=h_dtype),
            stat, torch.empty_like(stat))


def _layer_norm_bwd_grads(
    dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor,
    dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype], need_dw: bool, db_dtype: Optional[torch.dtype],
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
    check_launch_device(x, _layer_norm_bwd_kernel)
    x2 = rows_view(x)
    dy2 = grad_rows(dy, N)
    dh2 = grad_rows(dh, N) if dh is not None else None
    M = x2.shape[0]
    need_db = db_dtype is not None
    parts = wide_backward("layer_norm", dy2, dh2, x2, vector(weight), (mean, rstd), dx, dres, need_dw, need_db,
                          M, N) if N * x.element_size() > bwd_max_fused_bytes(x.device) else None
    if parts is not None:  # wide rows: persistent teams, x and dy read once (_wide)
        dw_part, db_part = parts
    else:
        P, run = _bwd_plan(M, N, x.element_size(), x.device, backward_strides(dy2, x2, dh2))
        dw_part = torch.empty((P, N), dtype=torch.float32, device=x.device) if need_dw else None
        db_part = torch.empty((P, N), dtype=torch.float32, device=x.device) if need_db else None
        run((dy2, x2, vector(weight), mean, rstd, dh2, dx, dres, dw_part, db_part))
    return (dx, dres, *column_sums(dw_part, db_part, weight.dtype if need_dw else None, db_dtype))


def _layer_norm_bwd_impl(
    dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], mean: Tensor, rstd: Tensor,
    dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype], need_dw: bool, db_dtype: Optional[torch.dtype],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The registered op: :func:`_layer_norm_bwd_grads` with an empty tensor for each output not requested.

    Raises:
        TypeError: ``db_dtype`` neither None nor a floating dtype (e.g. the bool flag this argument replaced).
    """
    check_db_dtype(db_dtype)
    return bwd_op_outputs(_layer_norm_bwd_grads(dy, dh, x, weight, mean, rstd, dx_dtype, dres_dtype, need_dw,
                                                db_dtype), x, dx_dtype)


@functools.lru_cache(maxsize=1024)
def _bwd_plan(M: int, N: int, elem: int, device: torch.device, strides: tuple) -> tuple:
    """``(P, Launch)``: the backward of M rows of N elements (``strides``: dy's row and column, x's row, dh's row
    and column strides, 0 without dh) over P programs, each writing one fp32 row of dw / db partial sums; the
    pointers (dy, x, w, mean, rstd, dh, dx, dres, dw partials, db partials) are given per call. Cached like
    ``rms_norm._bwd_plan`` (host time)."""
    cfg = pick_config(N, elem, device_warp_size(device))
    P, rows_per_program = partial_grid(device, M)
    meta = meta_items(BLOCK_N=cfg.block_n, LOOP=cfg.loop, num_warps=cfg.num_warps,
                      **launch_options(_layer_norm_bwd_kernel))
    return P, Launch(_layer_norm_bwd_kernel, (P,), meta, (*strides, M, N, rows_per_program), device)


_layer_norm_bwd = torch.library.custom_op(add_op_namespace_prefix("layer_norm_bwd"), _layer_norm_bwd_impl,
                                          mutates_args=())


@_layer_norm_bwd.register_fake
def _(dy, dh, x, weight, mean, rstd, dx_dtype, dres_dtype, need_dw, db_dtype):
    return bwd_op_fake(x, weight, dx_dtype, dres_dtype, need_dw, db_dtype)


def _bwd_model(dy: Tensor, dh: Optional[Tensor], x: Tensor, weight: Optional[Tensor], rstd: Tensor
               ) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward kernels' (dx, dw, db) (module docstring; dres is dx) as fp32 PyTorch ops, differentiable: the
    double backward's model, mean and rstd recomputed from x (``normalized_model``)."""
    xhat, rstd = normalized_model(x, rstd, rms=False)
    g = dy if weight is None else dy * weight
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx if dh is None else dx + dh, column_sum(dy * xhat), column_sum(dy)


def _bwd_setup_context(ctx, inputs, output):
    dy, dh, x, weight, _, rstd, _, dres_dtype, need_dw, db_dtype = inputs
    ctx.save_for_backward(dy, dh, x, weight, rstd)
    ctx.args = (dres_dtype is not None, need_dw, db_dtype is not None)


def _bwd_backward(ctx, ddx, ddres, ddw, ddb):
    """The gradients of (dx, dres, dw, db) with respect to dy, dh, x and the weight (a second derivative through
    layer_norm; x's flows on through the forward, for add_layer_norm from h to x and the residual): ``_bwd_model``
    differentiated in fp32."""
    dy, dh, x, weight, rstd = ctx.saved_tensors
    dres, need_dw, need_db = ctx.args
    grads = (ddx + ddres if dres else ddx, ddw if need_dw else None, ddb if need_db else None)
    ddy, ddh, dxx, dweight, _ = fp32_vjp(_bwd_model, (dy, dh, x, weight, rstd), grads)
    return ddy, ddh, dxx, dweight, None, None, None, None, None, None


_LN_BWD_AUTOGRAD = eager_autograd(_layer_norm_bwd, _layer_norm_bwd_impl, _bwd_setup_context, _bwd_backward)


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, eps, order = inputs
    y, h, mean, rstd = output
    ctx.save_for_backward(h if residual is not None else x, weight, mean, rstd)
    # mean and rstd have no gradient, and an unused y or h gets None, not a zeros tensor (host time)
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)
    ctx.x_dtype = x.dtype
    ctx.res_dtype = residual.dtype if residual is not None else None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.out_dtype = y.dtype


def _backward(ctx, dy, dh, dmean, drstd):
    return _backward_of(ctx, ctx.saved_tensors, dy, dh)


def _backward_of(ctx, saved, dy, dh):
    """``_backward`` with the saved tensors already unpacked (``_LayerNormEagerAutograd`` unpacks them once: a
    second ``ctx.saved_tensors`` raises under non-reentrant activation checkpointing)."""
    xs, weight, mean, rstd = saved
    if dy is None:  # only h was used
        dy = torch.zeros(xs.shape, dtype=ctx.out_dtype, device=xs.device)
    need = ctx.needs_input_grad
    need_dw = weight is not None and need[2]
    need_db = ctx.bias_dtype is not None and need[3]
    dx, dres, dw, db = call_op(
        _layer_norm_bwd, _layer_norm_bwd_impl, dy, dh if ctx.res_dtype is not None else None, xs, weight, mean, rstd,
        ctx.x_dtype, ctx.res_dtype, need_dw, ctx.bias_dtype if need_db else None, autograd=_LN_BWD_AUTOGRAD,
        infer=_layer_norm_bwd_grads,
    )
    return (dx, dres if ctx.res_dtype is not None else None, dw if need_dw else None, db if need_db else None,
            None, None)


_LN_AUTOGRAD = eager_autograd(_layer_norm_fwd, _layer_norm_fwd_impl, _setup_context, _backward)


def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5, *,
               torch_order: Optional[str] = None) -> Tensor:
    """Layer normalisation over the last dimension (``F.layer_norm(x, (N,), weight, bias, eps)``).

    ``y = (x - mean) * rsqrt(var + eps) * weight + bias`` with the biased variance.

    Args:
        x: (..., N) fp16/bf16/fp32; any leading shape and row strides (a
            non-contiguous last dim is copied once).
        weight, bias: (N,) or None, fp16, bf16 or fp32, read in fp32.
        eps: >= 0.
        torch_order: None (fastest) or ``"fused"``: mean and variance in the
            order of ``F.layer_norm``'s CUDA kernels (bit-exact on CUDA).

    Returns:
        (..., N) tensor of x.dtype, contiguous. Saves x, weight, fp32 mean and rstd (M,) for backward.

    Raises:
        TypeError: unsupported dtype (only fp16, bf16, fp32), non-tensor arguments, a sparse or nested
            tensor, an eps that is not a Python number, a torch_order that is neither None nor a string.
        ValueError: a 0-d x, weight/bias shape != (N,), tensors on different devices, eps < 0 or not
            finite, a torch_order other than None and ``"fused"``.
        RuntimeError: CPU tensor without TRITON_INTERPRET=1; a meta tensor (no data to run on).

    Precision: mean and variance in fp32 (two passes, like PyTorch), one rounding
    at the store. Performance: one program per row, x read once; a row above one block (64 KiB; in
    the backward on NVIDIA above 16 KiB) over a persistent team of programs on a GPU, still read once, forward and
    backward (``_wide``). Source: Ba et al. 2016, https://arxiv.org/abs/1607.06450.
    """
    mode = eager_mode((x, weight, bias)) if type(eps) is float else None
    if mode == IMPL or mode == AUTOGRAD:
        # plain eager code: one validated plan per call signature, 16-byte alignment included (its launch is pinned
        # and takes the addresses: host time of small calls and of training steps); a Python float eps only, so
        # that no other type can equal a planned one
        plans = _INFER_PLANS if mode == IMPL else _TRAIN_PLANS
        try:
            xp, wp, bp, tensors = addressed_signature(x, weight, bias)
            key = (tensors, eps, torch_order)
            plan = plans.get(key)
        except (TypeError, RuntimeError):  # an unhashable torch_order, a sparse or nested tensor (no storage or
            plan = _GENERAL  # strides): the general path names it
        if plan is None:
            plan = _infer_plan(x, weight, bias, eps, torch_order)
            if mode == AUTOGRAD and plan is not _GENERAL:  # its own launch (compiled with the mean and rstd
                plan = (*plan, PlanCache())  # pointers) and the backward plans (_train_plans)
            plan = plans.add(key, plan)
        if plan is not _GENERAL:
            if mode == AUTOGRAD:
                return _LayerNormEagerAutograd.apply(x, None, weight, bias, eps, plan)
            exact, run = plan
            y = torch.empty_like(x)
            if exact:
                if not run.at((xp, wp, bp, y.data_ptr(), None, None)):
                    run((x, weight, bias, y, None, None))
            elif not run.at((xp, None, wp, bp, y.data_ptr(), None, None, None)):
                run((x, None, weight, bias, y, None, None, None))
            return y
    order = _check_order(x, weight, bias, torch_order)
    return call_op(_layer_norm_fwd, _layer_norm_fwd_impl, x, None, weight, bias, check_eps(eps), order,
                   autograd=_LN_AUTOGRAD, infer=_layer_norm_infer)[0]


def _check_order(x, weight, bias, torch_order) -> int:
    """Checks layer_norm's tensors (``check_inputs``) and returns its order (ORDER_FAST or ORDER_FUSED)."""
    check_inputs(x, None, weight, bias)
    return parse_order(torch_order, ("fused",))


_INFER_PLANS = PlanCache()
_GENERAL = object()  # plan of a call the general path serves


def _infer_plan(x, weight, bias, eps, torch_order):
    """Validates a plain eager call of :func:`layer_norm` (raising as it does) and returns its plan: ``(torch-order
    kernel, FixedLaunch)``, the launch :func:`_layer_norm_infer` makes for every call of this signature (a training
    plan keeps a FixedLaunch of its own, compiled with the mean and rstd pointers; the key
    fixes the pointers' alignment, which also decides ``F.layer_norm``'s kernel; y is a new allocation, which
    starts on 16 bytes), or ``_GENERAL`` for calls it leaves to the general path (empty or non-contiguous
    tensors, wide rows in the free order)."""
    order = _check_order(x, weight, bias, torch_order)
    eps = check_eps(eps)
    N, elem, device = x.shape[-1], x.element_size(), x.device
    if (x.numel() == 0 or not x.is_contiguous() or any(t is not None and not t.is_contiguous() for t in (weight, bias))
            or order == ORDER_FAST and N * elem > MAX_FUSED_BYTES):
        return _GENERAL
    check_launch_device(x, _layer_norm_fwd_kernel)
    M = x.numel() // N
    if order == ORDER_FUSED:
        run = ln_exact_plan(M, N, N, elem, device, eps, fused_vectorized(x, N, weight, bias))
    else:
        run = Launch(_layer_norm_fwd_kernel, (M,), _fwd_meta(N, elem, device), (N, 0, N, eps), device)
    return order == ORDER_FUSED, run.pinned()


class _LayerNormEagerAutograd(torch.autograd.Function):
    """Plain eager training of :func:`layer_norm` for a call signature with a plan (:func:`_infer_plan`, kept apart
    from the inference plans): the forward of ``_layer_norm_fwd_impl`` through the plan's pinned launch,
    ``_setup_context``, and a backward planned per upstream gradient's signature (``_train_plans``) where the op's
    ``_backward`` would call ``_layer_norm_bwd_grads``, else that ``_backward``; the same values and gradients as
    the op, with less host time per call. ``launch`` (the plan) takes the place of the op's ``order`` argument.
    It returns y alone: h (empty without a residual), mean and rstd (saved, no gradient) are not outputs, which
    spares the autograd engine three outputs per call."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, launch):
        exact, run, ctx.bwd_plans = launch  # the backward plans (_train_plans)
        y = torch.empty_like(x)
        mean = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        run_forward_plan(exact, run, x, weight, bias, y, (mean, rstd))
        _setup_context(ctx, (x, residual, weight, bias, eps, None), (y, None, mean, rstd))
        return y

    @staticmethod
    def backward(ctx, dy):
        xs, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_dw, need_db = weight is not None and need[2], ctx.bias_dtype is not None and need[3]
        grads = planned_grads(ctx.bwd_plans, dy, xs, weight, (mean, rstd), ctx.x_dtype, ctx.bias_dtype, need_dw,
                              need_db, _bwd_plan)
        if grads is None:  # create_graph, a dispatch mode, wide rows, ...: the op's backward
            return _backward_of(ctx, (xs, weight, mean, rstd), dy, None)
        dx, dw, db = grads
        return dx, None, dw, db, None, None


_TRAIN_PLANS = PlanCache()


def add_layer_norm(
    x: Tensor, residual: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5,
) -> Tuple[Tensor, Tensor]:
    """Fused ``h = x + residual``; ``out = layer_norm(h)`` in one kernel pass.

    Args: x, weight, bias, eps as :func:`layer_norm` (no ``torch_order``), plus ``residual`` of x's shape
    (fp16/bf16/fp32).

    Returns:
        ``(out, h)``: h = x + residual in fp32 rounded once to residual.dtype; out
        (residual.dtype) normalised from that rounded h. Gradients flow to x and residual.

    Raises: as :func:`layer_norm`; also TypeError for a residual that is not a dense fp16/bf16/fp32 tensor
    (None included), ValueError for a residual not of x's shape or on another device.
    """
    check_float_tensor("residual", residual)  # required here (None would silently be layer_norm)
    check_inputs(x, residual, weight, bias)
    y, h, _, _ = call_op(_layer_norm_fwd, _layer_norm_fwd_impl, x, residual, weight, bias, check_eps(eps), ORDER_FAST,
                            autograd=_LN_AUTOGRAD, infer=_layer_norm_infer)
    return y, h
