"""Cross-entropy in PyTorch's CUDA order: the bits of ``F.cross_entropy`` and of its gradient (the
``CrossEntropyLoss`` layer, ``cross_entropy(..., torch_order=True)``).

For class-index targets without label smoothing or class weights, torch computes
``nll_loss(log_softmax(x, 1), target)`` and differentiates through both ops. Every step rounds
at a fixed point (``aten/src/ATen/native/cuda/SoftMax.cu``, ``PersistentSoftmax.cuh`` and
``Loss.cu``, torch 2.x; read from the public source, checked bitwise on an H200):

1. per row, the max m and ``s = sum_j exp(x_j - m)`` in the order of the softmax kernel torch
   picks (``_torch_order.row_stats_torch_order``);
2. ``logp_j = round((x_j - m) - logf(s))``, rounded to x's dtype (LogSoftMax's epilogue);
3. "none": ``loss_i = -logp_it`` (0 where ignored). "mean"/"sum" (``nll_loss_forward_reduce_
   cuda_kernel_2d``, one block of ``T = nll_loss_threads(N)`` threads): fp32 slot k subtracts
   ``logp_it`` of rows k, k + T, ... in order and counts them; a halving tree
   (``s[k] += s[k + stride]``) adds the slots into one sum and one count; "mean" is
   ``round(sum / count)`` (IEEE division), "sum" ``round(sum)``. 1-D logits (one row) give
   ``-logp_t`` for both, 0 if ignored;
4. backward: nll's gradient at the target is ``g = -round(dloss / round(count))`` ("mean"; the
   count is stored in x's dtype), ``-dloss`` otherwise; log-softmax's backward is
   ``dx_j = round(g_j - expf(logp_j) * g)`` with ``g_j`` = g at the target and 0 elsewhere (the
   row's sum of g_j is g itself), the multiply-add fused as nvcc compiles it (``FMA_BACKWARD``).

The forward reads the logits twice (max, then sum) and writes nothing logits-sized; the backward
recomputes ``logp_j`` from the logits and the row statistics: one read, one write. torch itself
writes and re-reads the full log-softmax and a zero-filled gradient.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
import triton
import triton.language as tl

from ._device import MAX_GRID_YZ, cdiv, check_launch_device, launch_options
from ._dispatch import call_op, eager_autograd, no_second_derivative
from ._fastlaunch import launch, meta_items
from ._libm import exp_f32, log_f32, use_libdevice
from ._ops import add_op_namespace_prefix
from ._rounding import round_dtype, round_to
from ._torch_order import _tree, row_stats_torch_order

Tensor = torch.Tensor
# log-softmax backward's `grad - exp(out) * sum` as one fused multiply-add (nvcc's default contraction)
FMA_BACKWARD = True
_ROWS_BLOCK = 128  # rows per program of the per-row kernel
_BWD_BLOCK = 2048  # classes per program of the backward
_TILE = 8  # rows of slots the reduction loads per step


def nll_loss_threads(n_rows: int) -> int:
    """Threads (= fp32 slots) of ATen's nll_loss reduction for ``n_rows`` rows:
    ``clamp(1 << round(log2(n_rows / 16)), 32, 1024)`` with an integer quotient (0 rows / 16: 32)."""
    q = n_rows // 16
    return 32 if q == 0 else min(max(1 << round(math.log2(q)), 32), 1024)


@triton.jit
def _target_logp(x_ptr, t_ptr, stats_ptr, rows, rmask, stride_x, stride_t, V, ignore_index,
                 LIBDEVICE: tl.constexpr, DTYPE: tl.constexpr):
    """(logp at each row's target, rounded to DTYPE, as fp32; NaN for a target outside [0, V)) and
    whether the row counts (target != ignore_index)."""
    rows64 = rows.to(tl.int64)
    t = tl.load(t_ptr + rows64 * stride_t, mask=rmask, other=ignore_index).to(tl.int64)
    valid = rmask & (t != ignore_index)
    in_range = (t >= 0) & (t < V)
    ok = valid & in_range
    xt = tl.load(x_ptr + rows64 * stride_x + tl.where(ok, t, 0), mask=ok, other=0.0).to(tl.float32)
    mx = tl.load(stats_ptr + 2 * rows64, mask=ok, other=0.0)
    s = tl.load(stats_ptr + 2 * rows64 + 1, mask=ok, other=1.0)
    lp = round_to((xt - mx) - log_f32(s, LIBDEVICE), DTYPE)
    return tl.where(in_range, lp, float("nan")), valid


@triton.jit
def _nll_rows_kernel(x_ptr, t_ptr, stats_ptr, nll_ptr, M, V, stride_x, stride_t, ignore_index,
                     BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr, DTYPE: tl.constexpr):
    # nll_ptr[i] = -logp at row i's target (exact in DTYPE), 0 on an ignored row
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # int64: M may pass 2^31
    rmask = rows < M
    lp, valid = _target_logp(x_ptr, t_ptr, stats_ptr, rows, rmask, stride_x, stride_t, V, ignore_index,
                             LIBDEVICE, DTYPE)
    tl.store(nll_ptr + rows, tl.where(valid, -lp, 0.0), mask=rmask)


@triton.jit
def _nll_reduce_kernel(nll_ptr, t_ptr, out_ptr, count_ptr, M, stride_t, ignore_index, MEAN: tl.constexpr,
                       THREADS: tl.constexpr, LOG_THREADS: tl.constexpr, TILE: tl.constexpr):
    # One program, ATen's order: slot k adds rows k, k + THREADS, ... (TILE rows of slots per load),
    # then a halving tree adds the slots.
    k = tl.arange(0, THREADS)
    r = tl.arange(0, TILE)
    acc = tl.zeros((THREADS,), tl.float32)
    cnt = tl.zeros((THREADS,), tl.float32)
    for start in range(0, M, THREADS * TILE):
        rows = start + r[:, None] * THREADS + k[None, :]
        rmask = rows < M
        v = tl.load(nll_ptr + rows, mask=rmask, other=0.0)
        t = tl.load(t_ptr + rows.to(tl.int64) * stride_t, mask=rmask, other=ignore_index).to(tl.int64)
        w = tl.where(rmask & (t != ignore_index), 1.0, 0.0)
        for i in tl.static_range(TILE):  # row i of the tile, in order (a sum of one nonzero term is exact)
            pick = r[:, None] == i
            acc = acc + tl.sum(tl.where(pick, v, 0.0), axis=0)
            cnt = cnt + tl.sum(tl.where(pick, w, 0.0), axis=0)
    # the (1, 1) results of the trees as scalars (a max over one element)
    total = tl.max(tl.max(_tree(tl.reshape(acc, (1, THREADS)), LOG_THREADS), axis=1), axis=0)
    count = tl.max(tl.max(_tree(tl.reshape(cnt, (1, THREADS)), LOG_THREADS), axis=1), axis=0)
    if MEAN:
        total = tl.math.div_rn(total, count)
    tl.store(out_ptr, total)
    tl.store(count_ptr, count)


@triton.jit
def _cross_entropy_torch_order_bwd_kernel(x_ptr, t_ptr, stats_ptr, dloss_ptr, count_ptr, dx_ptr, V, stride_x,
                                          stride_t, stride_d, stride_dx, ignore_index, MEAN: tl.constexpr,
                                          FMA: tl.constexpr, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr,
                                          DTYPE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < V
    t = tl.load(t_ptr + row * stride_t).to(tl.int64)
    d = tl.load(dloss_ptr + row * stride_d).to(tl.float32)
    if MEAN:  # grad_output / total_weight, both in DTYPE, the quotient rounded to DTYPE
        d = round_to(tl.math.div_rn(d, round_to(tl.load(count_ptr), DTYPE)), DTYPE)
    g = tl.where(t != ignore_index, -d, 0.0)  # nll's gradient at the target = the row's sum of gradients
    # a target outside [0, V) (torch raises): a NaN row, as its NaN loss and the fused path's gradient (a finite
    # gradient would pass a check of the gradients only, e.g. GradScaler's)
    g = tl.where((t != ignore_index) & ((t < 0) | (t >= V)), float("nan"), g)
    mx = tl.load(stats_ptr + 2 * row)
    logsum = log_f32(tl.load(stats_ptr + 2 * row + 1), LIBDEVICE)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    e = exp_f32(round_to((x - mx) - logsum, DTYPE), LIBDEVICE)
    g_j = tl.where(offs == t, g, 0.0)
    if FMA:
        dx = tl.fma(-e, g, g_j)
    else:
        dx = g_j - e * g
    tl.store(dx_ptr + row * stride_dx + offs, round_to(dx, DTYPE).to(dx_ptr.dtype.element_ty), mask=mask)


def _rows(logits: Tensor) -> Tensor:
    """(M, V) with unit class stride: 1-D logits as one row; a class-strided tensor copied (torch copies too)."""
    x2 = logits.reshape(1, -1) if logits.dim() == 1 else logits
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _fwd_impl(logits: Tensor, target: Tensor, ignore_index: int, reduction: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(loss in logits' dtype, per-row (max, sum of exp) fp32 (M, 2), fp32 count of counted rows (0-d))."""
    x2 = _rows(logits)
    M, V = x2.shape
    t1 = target.reshape(M)
    dev = logits.device
    stats = torch.empty((M, 2), dtype=torch.float32, device=dev)
    nll = torch.empty(M, dtype=torch.float32, device=dev)
    count = torch.zeros((), dtype=torch.float32, device=dev)
    if M > 0:
        check_launch_device(logits, _nll_rows_kernel)
        if V == 0:
            raise ValueError(f"logits have no classes (shape {tuple(logits.shape)})")
        row_stats_torch_order(x2, stats)
        libdev = use_libdevice(dev, _nll_rows_kernel)
        launch(_nll_rows_kernel, (cdiv(M, _ROWS_BLOCK),),
               (x2, t1, stats, nll, M, V, x2.stride(0), t1.stride(0), ignore_index),
               meta_items(BLOCK=_ROWS_BLOCK, LIBDEVICE=libdev, DTYPE=round_dtype(logits.dtype),
                          **launch_options(_nll_rows_kernel)), dev)
    if reduction == "none" or logits.dim() == 1:  # 1-D: -logp_t for "mean" and "sum" alike (0 if ignored)
        if logits.dim() == 1:
            count = (t1 != ignore_index).to(torch.float32).reshape(())
        return nll.reshape(target.shape).to(logits.dtype), stats, count
    if M == 0:  # torch: NaN for "mean" of nothing, 0 for "sum"
        loss = torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=logits.dtype, device=dev)
        return loss, stats, count
    total = torch.empty((), dtype=torch.float32, device=dev)
    threads = nll_loss_threads(M)
    launch(_nll_reduce_kernel, (1,), (nll, t1, total, count, M, t1.stride(0), ignore_index),
           meta_items(MEAN=reduction == "mean", THREADS=threads, LOG_THREADS=threads.bit_length() - 1, TILE=_TILE,
                      **launch_options(_nll_reduce_kernel)), dev)
    return total.to(logits.dtype), stats, count


_fwd = torch.library.custom_op(add_op_namespace_prefix("cross_entropy_torch_order_fwd"), _fwd_impl,
                               mutates_args=())


@_fwd.register_fake
def _(logits, target, ignore_index, reduction):
    M = 1 if logits.dim() == 1 else logits.shape[0]
    loss = logits.new_empty(target.shape if reduction == "none" else ())
    return loss, logits.new_empty((M, 2), dtype=torch.float32), logits.new_empty((), dtype=torch.float32)


def _bwd_impl(logits: Tensor, target: Tensor, stats: Tensor, count: Tensor, dloss: Tensor, ignore_index: int,
              reduction: str) -> Tensor:
    """Gradient wrt the logits (logits' dtype and shape, contiguous) for the upstream gradient ``dloss``."""
    x2 = _rows(logits)
    M, V = x2.shape
    dx = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    if dx.numel() == 0:
        return dx
    check_launch_device(logits, _cross_entropy_torch_order_bwd_kernel)
    t1 = target.reshape(M)
    d1 = dloss.reshape(-1)
    mean = reduction == "mean" and logits.dim() == 2  # 1-D "mean" divides by a weight of 1
    launch(_cross_entropy_torch_order_bwd_kernel, (M, cdiv(V, _BWD_BLOCK)),
           (x2, t1, stats, d1, count, dx, V, x2.stride(0), t1.stride(0), d1.stride(0) if reduction == "none" else 0,
            V, ignore_index),  # dx is contiguous: row stride V
           meta_items(MEAN=mean, FMA=FMA_BACKWARD, BLOCK=_BWD_BLOCK, num_warps=4,
                      LIBDEVICE=use_libdevice(logits.device, _cross_entropy_torch_order_bwd_kernel),
                      DTYPE=round_dtype(logits.dtype), **launch_options(_cross_entropy_torch_order_bwd_kernel)),
           logits.device)
    return dx


_bwd = torch.library.custom_op(add_op_namespace_prefix("cross_entropy_torch_order_bwd"), _bwd_impl,
                               mutates_args=())


@_bwd.register_fake
def _(logits, target, stats, count, dloss, ignore_index, reduction):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


# what the formulas of the cross-entropy backward ops (this one, and cross_entropy's recompute mode, also under
# torch.func) raise at a second backward: a gradient of the gradient, naming what to use instead
NO_SECOND_DERIVATIVE = ("cross_entropy: a gradient of the gradient (create_graph=True) is not supported: its "
                        "backward has no derivative; use torch.nn.functional.cross_entropy for higher-order gradients")
_BWD_AUTOGRAD = no_second_derivative(_bwd, _bwd_impl, NO_SECOND_DERIVATIVE)


def _setup_context(ctx, inputs, output):
    logits, target, ignore_index, reduction = inputs
    _, stats, count = output
    ctx.save_for_backward(logits, target, stats, count)
    ctx.ignore_index, ctx.reduction = ignore_index, reduction


def _backward(ctx, dloss, dstats, dcount):
    logits, target, stats, count = ctx.saved_tensors
    dx = None
    if ctx.needs_input_grad[0]:
        dx = call_op(_bwd, _bwd_impl, logits, target, stats, count, dloss.to(logits.dtype), ctx.ignore_index,
                     ctx.reduction, autograd=_BWD_AUTOGRAD)
    return dx, None, None, None


_AUTOGRAD = eager_autograd(_fwd, _fwd_impl, _setup_context, _backward)


def cross_entropy_torch_order(logits: Tensor, target: Tensor, ignore_index: int, reduction: str) -> Tensor:
    """``F.cross_entropy(logits, target, ignore_index=..., reduction=...)`` bit for bit on CUDA (module
    docstring); logits (C,) or (N, C), checked by the caller.

    Raises:
        ValueError: more classes than the backward's grid takes (a program per 2048 classes on a grid axis of 65535).
    """
    if logits.shape[-1] > MAX_GRID_YZ * _BWD_BLOCK:
        raise ValueError(f"torch_order=True takes at most {MAX_GRID_YZ * _BWD_BLOCK} classes, got {logits.shape[-1]}")
    loss, _, _ = call_op(_fwd, _fwd_impl, logits, target, ignore_index, reduction, autograd=_AUTOGRAD)
    return loss


__all__ = ["cross_entropy_torch_order"]
