"""Fused cross-entropy (label smoothing, ignore_index, z-loss): loss and gradient in one pass per row.

Math, per row i with logits x (V classes, fp32) and target t:

    lse    = log(sum_j exp(x_j))                        (online over chunks: max m, sum s; lse = m + log s)
    nll    = lse - x_t
    smooth = lse - mean_j x_j                           (= -(1/V) sum_j log p_j)
    loss_i = (1 - eps) * nll + eps * smooth + z * lse^2 (eps = label_smoothing, z = z_loss)
    loss_i = 0 where t == ignore_index;  NaN where t is outside [0, V) (torch raises; no host sync here)

    reduction "none": loss (target's shape); "sum": sum_i loss_i;
    "mean": sum_i loss_i / #{i: t_i != ignore_index}   (a device division: NaN when every target is
            ignored, as torch; the gradient is then 0, as torch)

The z-loss term is PaLM's auxiliary loss (Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311,
section 5: ``z_loss * log(Z)^2`` with log Z the logsumexp of the row's logits), added per
non-ignored row before the reduction, so "mean" averages it over the same count.
With eps = z = 0 the loss equals ``torch.nn.functional.cross_entropy``; with eps > 0 it equals
torch's ``label_smoothing`` (same mean denominator).

Gradient of loss_i with respect to x_j, written by the same kernel (the softmax is never stored):

    g_ij = p_j * (1 + 2 z lse) - eps / V - (1 - eps) [j == t],   p_j = exp(x_j - m) / s
    g_ij = 0 on ignored rows

and the backward multiplies it by the upstream gradient of loss_i (the reduction's 1 or 1/count,
times the caller's gradient): ``dlogits = g * dloss_i`` (one elementwise pass, no host sync).

Rows that fit in one block are read once (loss and g from registers); wider rows (a 128K or 256K
vocabulary) run the online logsumexp over chunks, then a gradient pass that reads the row again.
Without a gradient (inference, or logits that do not require grad) the kernel only reads.
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from ._common import check_float_tensor, check_real, check_same_device, row_layout, row_start, store_rounded
from ._dispatch import call_op
from ._launch import config_for
from ._device import check_launch_device, launch_options
from ._ops import add_op_namespace_prefix

Tensor = torch.Tensor
REDUCTIONS = ("mean", "sum", "none")


@triton.jit
def _grad_chunk(x, offs, t, mx, s, coef, smoothing, V, valid, in_range):
    """g for one chunk of logits ``x`` (fp32) given the row's max, sum of exp and z-loss factor."""
    p = tl.exp(x - mx) / s
    g = p * coef - smoothing / V - tl.where(offs == t, 1.0 - smoothing, 0.0)
    g = tl.where(in_range, g, float("nan"))
    return tl.where(valid, g, 0.0)


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr,  # logits, any strides
    t_ptr,  # int targets, expanded over the class dim (column stride 0)
    loss_ptr,  # (rows,) fp32 per-row loss, contiguous
    g_ptr,  # gradient of loss_i wrt logits, logits' shape, contiguous; None: no gradient
    R1, R2,  # sizes of the two inner leading dims (see _common.row_layout)
    sx0, sx1, sx2, sxc,  # elements x_ptr moves per leading index / per class
    st0, st1, st2,  # the same for the target (no class stride)
    sg0, sg1, sg2, sgc,  # the same for g
    V,  # number of classes
    ignore_index,
    smoothing,  # label_smoothing eps in [0, 1]
    z_loss,  # z-loss coefficient >= 0
    BLOCK_N: tl.constexpr,  # classes per chunk
    LOOP: tl.constexpr,  # the row spans several chunks
):
    # One program per row. Bytes: read V*x (+ V*x again for a wide row with gradient), write V*g + 4.
    row = tl.program_id(0).to(tl.int64)
    x_row = row_start(row, R1, R2, sx0, sx1, sx2)
    g_row = row_start(row, R1, R2, sg0, sg1, sg2)
    t = tl.load(t_ptr + row_start(row, R1, R2, st0, st1, st2)).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask_n = offs < V
        x = tl.load(x_ptr + x_row + offs.to(tl.int64) * sxc, mask=mask_n, other=float("-inf")).to(tl.float32)
        mx = tl.max(x, axis=0)
        s = tl.sum(tl.exp(x - mx), axis=0)
        sum_x = tl.sum(tl.where(mask_n, x, 0.0), axis=0)
    else:
        mx = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        acc_x = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, V, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask_n = offs < V
            x = tl.load(x_ptr + x_row + offs.to(tl.int64) * sxc, mask=mask_n, other=float("-inf")).to(tl.float32)
            new = tl.maximum(mx, tl.max(x, axis=0))
            base = tl.where(new == float("-inf"), 0.0, new)  # all -inf so far: s stays 0
            s = s * tl.exp(mx - base) + tl.sum(tl.exp(x - base), axis=0)
            mx = new
            acc_x += tl.where(mask_n, x, 0.0)
        sum_x = tl.sum(acc_x, axis=0)
    lse = mx + tl.log(s)
    x_t = tl.load(x_ptr + x_row + tl.where(in_range, t, 0) * sxc, mask=valid & in_range, other=0.0).to(tl.float32)
    loss = lse - x_t
    # the optional terms only when on, so that eps = 0 never multiplies an infinite mean of x
    loss = tl.where(smoothing > 0.0, (1.0 - smoothing) * loss + smoothing * (lse - sum_x / V), loss)
    loss = tl.where(z_loss > 0.0, loss + z_loss * lse * lse, loss)
    loss = tl.where(in_range, loss, float("nan"))
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    if g_ptr is not None:
        coef = tl.where(z_loss > 0.0, 1.0 + 2.0 * z_loss * lse, 1.0)
        if not LOOP:
            g = _grad_chunk(x, offs, t, mx, s, coef, smoothing, V, valid, in_range)
            store_rounded(g_ptr + g_row, offs.to(tl.int64) * sgc, g, mask_n)
        else:
            for start in range(0, V, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                mask_n = offs < V
                x = tl.load(x_ptr + x_row + offs.to(tl.int64) * sxc, mask=mask_n, other=float("-inf")).to(tl.float32)
                g = _grad_chunk(x, offs, t, mx, s, coef, smoothing, V, valid, in_range)
                store_rounded(g_ptr + g_row, offs.to(tl.int64) * sgc, g, mask_n)


def _cross_entropy_fwd_impl(
    logits: Tensor, target: Tensor, class_dim: int, ignore_index: int, label_smoothing: float, z_loss: float,
    need_grad: bool,
) -> Tuple[Tensor, Tensor]:
    """Returns (loss fp32 of target's shape, g of logits' shape and dtype, or an empty tensor without gradient)."""
    loss = torch.empty(target.shape, dtype=torch.float32, device=logits.device)
    g = torch.empty(logits.shape if need_grad else (0,), dtype=logits.dtype, device=logits.device)
    if loss.numel() == 0:
        return loss, g
    check_launch_device(logits, _cross_entropy_fwd_kernel)
    V = logits.shape[class_dim]
    if V == 0:  # torch: no class to pick
        raise ValueError(f"logits have no classes (shape {tuple(logits.shape)})")
    t = target.unsqueeze(class_dim).expand(logits.shape)
    gs = g if need_grad else None
    layout = row_layout([logits, t, gs], class_dim)
    if layout is None:  # more than 3 unmergeable leading dims: the one documented copy
        logits, t = logits.contiguous(), target.contiguous().unsqueeze(class_dim).expand(logits.shape)
        layout = row_layout([logits, t, gs], class_dim)
    cfg = config_for(V, logits)
    _cross_entropy_fwd_kernel[(layout.rows,)](
        logits, t, loss, gs, layout.sizes[1], layout.sizes[2],
        *layout.args(0), *layout.args(1)[:3], *layout.args(2),
        V, ignore_index, label_smoothing, z_loss,
        BLOCK_N=cfg.block_n, LOOP=cfg.loop, num_warps=cfg.num_warps, **launch_options(_cross_entropy_fwd_kernel),
    )
    return loss, g


_cross_entropy_fwd = torch.library.custom_op(
    add_op_namespace_prefix("cross_entropy_fwd"), _cross_entropy_fwd_impl, mutates_args=()
)
"""The registered op (autograd, fake, compile); eager inference calls the implementation directly."""


@_cross_entropy_fwd.register_fake
def _(logits, target, class_dim, ignore_index, label_smoothing, z_loss, need_grad):
    g = logits.new_empty(logits.shape if need_grad else (0,))
    return logits.new_empty(target.shape, dtype=torch.float32), g


def _setup_context(ctx, inputs, output):
    logits, target, class_dim, ignore_index, label_smoothing, z_loss, need_grad = inputs
    ctx.save_for_backward(output[1], target)
    ctx.class_dim = class_dim
    ctx.ignore_index = ignore_index
    ctx.need_grad = need_grad


def _backward(ctx, dloss, dg):
    g, target = ctx.saved_tensors
    if not ctx.need_grad:
        raise RuntimeError("cross_entropy: the gradient was not stored (the logits did not require grad "
                           "when the loss was computed)")
    # ignored rows get 0 even when dloss is inf/NaN (a mean over no targets), as torch
    dl = dloss.masked_fill(target == ctx.ignore_index, 0.0).unsqueeze(ctx.class_dim).to(g.dtype)
    return g * dl, None, None, None, None, None, None


_cross_entropy_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(logits, target, ignore_index, reduction, label_smoothing, z_loss):
    check_float_tensor("logits", logits)
    if logits.dim() < 1:
        raise ValueError("logits must have at least one dimension (the classes), got a 0-d tensor")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype.is_floating_point:
        raise TypeError(f"target must hold class indices (torch.int64 or torch.int32), got {target.dtype}: "
                        "class-probability targets are not supported")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target must have dtype torch.int64 or torch.int32, got {target.dtype}")
    class_dim = 0 if logits.dim() == 1 else 1
    expected = logits.shape[:class_dim] + logits.shape[class_dim + 1:]
    if target.shape != expected:
        raise ValueError(f"target must have shape {tuple(expected)} for logits of shape {tuple(logits.shape)} "
                         f"(classes in dim {class_dim}), got {tuple(target.shape)}")
    check_same_device("target", target, logits, "logits")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    label_smoothing = check_real("label_smoothing", label_smoothing, low=0.0, high=1.0)
    z_loss = check_real("z_loss", z_loss, low=0.0)
    return class_dim, label_smoothing, z_loss


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
) -> Tensor:
    """Cross-entropy of class-index targets, fused with its gradient; ``F.cross_entropy`` plus PaLM's z-loss.

    ``loss_i = (1 - eps) (lse_i - x_it) + eps (lse_i - mean_j x_ij) + z_loss * lse_i^2`` (0 where ignored),
    reduced as torch reduces it (see the module docstring for every term).

    Args:
        logits: (C,), (N, C) or (N, C, d1, ...) fp16/bf16/fp32, classes in dim 1 (dim 0 for 1-D), as
            ``F.cross_entropy``; any strides (views such as ``logits[:, :V]``, ``logits[:-1]``, or a
            shifted ``h[:, :-1].transpose(1, 2)`` are read in place).
        target: int64/int32 class indices of logits' shape without the class dim.
        ignore_index: targets equal to it add nothing to the loss or the count.
        reduction: "mean" (over non-ignored targets, on the device), "sum" or "none".
        label_smoothing: eps in [0, 1], torch's definition.
        z_loss: coefficient >= 0 of the per-row ``lse^2`` term (0: off).

    Returns:
        The loss in logits' dtype: a scalar, or target's shape for "none". Saves the fp32-computed
        gradient (logits' dtype, logits' shape) for backward when logits require grad.

    Raises:
        TypeError: unsupported dtypes (float targets: class probabilities are not supported).
        ValueError: target shape, reduction, label_smoothing outside [0, 1], z_loss < 0, devices.
        RuntimeError: CPU tensor without TRITON_INTERPRET=1.

    Precision: logsumexp, loss and gradient in fp32; per-row losses summed in fp32 by torch; one rounding
    of the loss to logits' dtype, one of the gradient at the store and one at the backward multiply (none
    when the upstream gradient is 1). An out-of-range target gives NaN (torch raises; that needs a sync).
    Performance: one program per row; reads the logits once and writes the gradient once (a row wider than
    64 KiB is read twice); the backward is one elementwise multiply. No ``.item()``: CUDA-graph capturable.
    Source: ``torch.nn.functional.cross_entropy``; z-loss from PaLM (arXiv:2204.02311).
    """
    class_dim, label_smoothing, z_loss = _check(logits, target, ignore_index, reduction, label_smoothing, z_loss)
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    loss, _ = call_op(_cross_entropy_fwd, _cross_entropy_fwd_impl, logits, target, class_dim, ignore_index,
                      label_smoothing, z_loss, need_grad)
    if reduction == "none":
        return loss.to(logits.dtype)
    total = loss.sum()
    if reduction == "mean":
        total = total / (target != ignore_index).sum()
    return total.to(logits.dtype)
