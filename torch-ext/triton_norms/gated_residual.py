"""Gated residual add in one kernel: ``out = x + y * gate`` (the adaLN-Zero residual of diffusion transformers).

Diffusion transformers (Wan, Flux, SD3, DiT) add each sub-layer's output ``y`` back to the residual
stream ``x`` through a per-sample, per-column gate from the timestep embedding. Wan writes it as
``(x.float() + y * gate).type_as(x)`` with an fp32 gate: eagerly that is four passes over fp32 copies
of the activations (``x.float()``, the product, the sum, the cast); here it is one read of x and y and
one write.

Math, per element, in fp32 (the operations and the order of the eager expression, no fused multiply-add):

    p   = float(y) * float(gate[b])      rounded to fp32
    s   = float(x) + p                   rounded to fp32
    out = s rounded to out_dtype

so ``out`` equals ``(x.float() + y.float() * gate.float()).to(out_dtype)`` bit for bit (and Wan's
expression, whose gate is fp32).

Backward: ``dx = dout``, ``dy = dout * gate``, ``dgate = sum over the rows of each sample of dout * y``
(summed to the gate's shape), in fp32, rounded to each input's dtype.
Second derivatives (``create_graph=True``): that backward is PyTorch ops, differentiable as it stands.
Source: Peebles & Xie (2023), "Scalable Diffusion Models with Transformers" (adaLN-Zero gating).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import check_float_tensor
from ._device import MAX_GRID_YZ, cdiv, check_launch_device, device_warp_size, is_interpreter, launch_options
from ._dispatch import call_op, eager_autograd
from ._fastlaunch import launch, meta_items
from ._ops import add_op_namespace_prefix
from ._rounding import round_to
from .modulate import MAX_N, _check_vec, _meta, _rows, _vec2, check_out_dtype, per_sample_row

Tensor = torch.Tensor


@triton.jit
def _gated_residual_kernel(X, Y, G, OUT, S, N, sxb, sxs, syb, sys_, sgb, sgn,
                           ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program: ROWS consecutive rows of sample b (the gate row loaded once). Bytes: read x, y; write out.
    b = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    g = per_sample_row(G, b, sgb, sgn, offs, offs < N)
    for r in range(ROWS):
        s = tl.program_id(0).to(tl.int64) * ROWS + r  # int64: S may pass 2^31
        if s < S:
            x = tl.load(X + b * sxb + s * sxs + offs, mask=offs < N, other=0.0).to(tl.float32)
            y = tl.load(Y + b * syb + s * sys_ + offs, mask=offs < N, other=0.0).to(tl.float32)
            out = x + y * g  # two roundings: launched without fp fusion
            tl.store(OUT + (b * S + s) * N + offs, round_to(out, OUT.dtype.element_ty).to(OUT.dtype.element_ty),
                     mask=offs < N)


def _gated_residual_impl(x: Tensor, y: Tensor, gate: Tensor, out_dtype: torch.dtype) -> Tensor:
    B, S, N = x.shape
    out = torch.empty((B, S, N), dtype=out_dtype, device=x.device)
    if out.numel() == 0:
        return out
    check_launch_device(x, _gated_residual_kernel)
    (x, sxb, sxs), (y, syb, sys_) = _rows(x), _rows(y)
    interp = is_interpreter(_gated_residual_kernel)
    block, warps, rows = _meta(N, x.element_size(), device_warp_size(x.device), interp)
    g, sgb, sgn = _vec2(gate)
    launch(_gated_residual_kernel, (cdiv(S, rows), B), (x, y, g, out, S, N, sxb, sxs, syb, sys_, sgb, sgn),
           meta_items(ROWS=rows, BLOCK_N=block, **({} if interp else {"num_warps": warps}),
                      **launch_options(_gated_residual_kernel)), out.device)
    return out


_gated_residual = torch.library.custom_op(add_op_namespace_prefix("gated_residual"), _gated_residual_impl,
                                          mutates_args=())


@_gated_residual.register_fake
def _(x, y, gate, out_dtype):
    return x.new_empty(x.shape, dtype=out_dtype)


def _setup_context(ctx, inputs, output):
    x, y, gate, out_dtype = inputs
    ctx.save_for_backward(y, gate)
    ctx.x_dtype = x.dtype


def _backward(ctx, dout):
    y, gate = ctx.saved_tensors
    need = ctx.needs_input_grad
    d = dout.float()
    g = gate.float()
    g3 = g if g.dim() == 3 else (g[:, None, :] if g.dim() == 2 else g[None, None, :])
    dx = dout.to(ctx.x_dtype) if need[0] else None
    dy = (d * g3).to(y.dtype) if need[1] else None
    dgate = (d * y.float()).sum_to_size(g3.shape).reshape(gate.shape).to(gate.dtype) if need[2] else None
    return dx, dy, dgate, None


_GATED_AUTOGRAD = eager_autograd(_gated_residual, _gated_residual_impl, _setup_context, _backward)


def gated_residual(x: Tensor, y: Tensor, gate: Tensor, *, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``x + y * gate`` in one kernel, fp32 inside and rounded once (adaLN-Zero's gated residual add).

    Args:
        x: [B, S, N] residual stream, fp16/bf16/fp32, any strides with a unit column stride (else copied once).
        y: [B, S, N] the sub-layer's output (attention, feed-forward), fp16/bf16/fp32, same rules as x.
        gate: one value per sample and column: [B, N], [B, 1, N], [1, N] or [N]; fp16/bf16/fp32.
        out_dtype: output dtype (default: x's, as Wan's ``(x.float() + y * gate).type_as(x)``).

    Returns:
        [B, S, N] in ``out_dtype``, contiguous, equal bit for bit to
        ``(x.float() + y.float() * gate.float()).to(out_dtype)``. Differentiable in x, y and gate.

    Raises:
        TypeError: a non-tensor, a sparse or nested tensor, a dtype other than fp16/bf16/fp32, or a bad
            ``out_dtype``.
        ValueError: x not 3-D, N > 32768, a batch above 65535, y not of x's shape, a gate of the wrong shape,
            tensors on different devices.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.
    """
    check_float_tensor("x", x)
    check_float_tensor("y", y)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [B, S, N], got shape {tuple(x.shape)}")
    if x.shape[-1] > MAX_N:
        raise ValueError(f"x rows (N = {x.shape[-1]}) must have at most {MAX_N} elements")
    if x.shape[0] > MAX_GRID_YZ:  # one launch grid axis over the samples
        raise ValueError(f"x's batch ({x.shape[0]}) may be at most {MAX_GRID_YZ} (a launch grid axis): split it")
    if y.shape != x.shape:
        raise ValueError(f"y must have x's shape {tuple(x.shape)}, got {tuple(y.shape)}")
    if y.device != x.device:
        raise ValueError(f"y is on {y.device} but x is on {x.device}: all tensors must be on one device")
    _check_vec("gate", gate, x)
    if out_dtype is None:
        out_dtype = x.dtype
    else:
        check_out_dtype(out_dtype)
    return call_op(_gated_residual, _gated_residual_impl, x, y, gate, out_dtype, autograd=_GATED_AUTOGRAD)


__all__ = ["gated_residual"]
