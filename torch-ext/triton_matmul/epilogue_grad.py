"""The backward of ``matmul``'s fused epilogue: dh, the gradient at the pre-activation h, in one elementwise kernel.

Math (fp32, from the upstream gradient dy and the h the forward saved in a's dtype; dh rounded once to that dtype):

    plain:  dh = dy * act'(h)
    gated:  p, g = h[:, :N], h[:, N:]      dh[:, :N] = dy * act(g)      dh[:, N:] = dy * p * act'(g)

with act and act' of ``_epilogue_math.activation_and_grad`` (the forms of the forward's epilogue). Eager PyTorch
computes the same from its own rounded h (``F.gelu``'s backward, ``silu_backward``...) within fp32 roundings, for
finite h of moderate size: at h = +-inf, or |h| above ~1e19 for gelu_tanh, the kernel gives the function's limit
where eager PyTorch may give NaN.

Kernel: one program per ``BLOCK_N`` columns of one row: reads dy once (any strides, a broadcast dy included) and h
once, writes dh once: 2 + 2 (+ 2 gated) bytes per output in bf16, where the same chain of PyTorch elementwise ops
made about ten passes over fp32 copies. A double backward (``create_graph=True``) differentiates the same math
written as PyTorch ops (``_double_backward``).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
import triton
import triton.language as tl

from ._device import check_launch_device, launch_options, next_power_of_2
from ._dispatch import call_op, eager_autograd, fp32_vjp, sigmoid_pair
from ._epilogue_math import ACTIVATIONS, activation_and_grad, backprop, store_rounded
from ._fastlaunch import launch, meta_items
from ._libm import nvidia_approx
from ._ops import add_op_namespace_prefix

Tensor = torch.Tensor

__all__ = ["epilogue_grad"]

BLOCK_MAX = 1024


@triton.jit
def _epilogue_grad_kernel(dy_ptr, h_ptr, dh_ptr, N, blocks_n, stride_dym, stride_dyn, stride_hm, stride_hn,
                          stride_dhm, GATED: tl.constexpr, ACT: tl.constexpr, BLOCK_N: tl.constexpr,
                          FAST_MATH: tl.constexpr):
    """dh of one row's BLOCK_N columns (N: dy's columns; h and dh have 2N when GATED; dh has unit column
    stride)."""
    pid = tl.program_id(0)
    row = (pid // blocks_n).to(tl.int64)
    cols = (pid % blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    dy = tl.load(dy_ptr + row * stride_dym + cols.to(tl.int64) * stride_dyn, mask=mask, other=0.0).to(tl.float32)
    h_cols = h_ptr + row * stride_hm + cols.to(tl.int64) * stride_hn
    dh_row = dh_ptr + row * stride_dhm
    if GATED:
        p = tl.load(h_cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(h_cols + tl.cast(N, tl.int64) * stride_hn, mask=mask, other=0.0).to(tl.float32)
        act, dact = activation_and_grad(g, ACT, FAST_MATH)
        store_rounded(dh_row + cols, dy * act, mask)
        store_rounded(dh_row + N + cols, dy * p * dact, mask)
    else:
        x = tl.load(h_cols, mask=mask, other=0.0).to(tl.float32)
        store_rounded(dh_row + cols, backprop(dy, x, ACT, FAST_MATH), mask)


def _check(dy: Tensor, h: Tensor, activation: str) -> None:
    if not isinstance(activation, str) or activation not in ACTIVATIONS:  # (a list is unhashable)
        raise ValueError(f"activation must be one of {', '.join(a for a in ACTIVATIONS if a)}, got {activation!r}")
    if not isinstance(dy, Tensor) or not isinstance(h, Tensor) or dy.dim() != 2 or h.dim() != 2:
        raise ValueError("dy and h must be 2-D tensors")
    width = dy.shape[1] * (2 if ACTIVATIONS[activation][1] else 1)
    if h.shape != (dy.shape[0], width):
        raise ValueError(f"h of shape {tuple(h.shape)} does not match dy of shape {tuple(dy.shape)} for "
                         f"activation={activation!r}: expected ({dy.shape[0]}, {width})")
    if dy.dtype != h.dtype or dy.device != h.device:
        raise TypeError(f"dy and h must share dtype and device, got {dy.dtype} on {dy.device} and {h.dtype} on "
                        f"{h.device}")


def _epilogue_grad_impl(dy: Tensor, h: Tensor, activation: str) -> Tensor:
    _check(dy, h, activation)
    dh = torch.empty_like(h, memory_format=torch.contiguous_format)
    M, N = dy.shape
    if dh.numel() == 0:
        return dh
    check_launch_device(h, _epilogue_grad_kernel)
    act, gated = ACTIVATIONS[activation]
    block = min(BLOCK_MAX, next_power_of_2(N))
    blocks = -(-N // block)
    meta = meta_items(GATED=gated, ACT=act, BLOCK_N=block, FAST_MATH=nvidia_approx(h.device, _epilogue_grad_kernel),
                      num_warps=4 if block >= 512 else 1, **launch_options(_epilogue_grad_kernel, fp_fusion=True))
    launch(_epilogue_grad_kernel, (M * blocks,),
           (dy, h, dh, N, blocks, dy.stride(0), dy.stride(1), h.stride(0), h.stride(1), dh.stride(0)), meta, h.device)
    return dh


_epilogue_grad_op = torch.library.custom_op(add_op_namespace_prefix("matmul_epilogue_grad"), _epilogue_grad_impl,
                                            mutates_args=())


@_epilogue_grad_op.register_fake
def _(dy, h, activation):
    _check(dy, h, activation)
    return torch.empty_like(h, memory_format=torch.contiguous_format)


def _act_and_grad(x: Tensor, activation: str) -> Tuple[Tensor, Tensor]:
    """(act(x), act'(x)) for the base activation of ``activation`` as differentiable PyTorch ops (the sigmoids and
    ``1 + tanh(z) = 2 sigmoid(2 z)`` from ``sigmoid_pair``: accurate second derivatives where they are near 1)."""
    if activation in ("gelu", "geglu"):
        cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
        return x * cdf, cdf + x * torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    if activation == "gelu_tanh":
        k0, k1 = math.sqrt(2.0 / math.pi), 0.044715
        s, c = sigmoid_pair(2.0 * k0 * (x + k1 * x * x * x))  # 0.5 (1 + t) = s, 1 - t * t = 4 s c
        return x * s, s + 2.0 * x * s * c * k0 * (1.0 + 3.0 * k1 * x * x)
    if activation in ("silu", "swiglu"):
        s, c = sigmoid_pair(x)
        return x * s, s * (1.0 + x * c)
    return x.clamp_min(0.0), (x > 0).to(x.dtype)  # relu: its second derivative is 0 wherever it exists


def _setup_context(ctx, inputs, output):
    dy, h, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(dy, h)


def _dh(dy: Tensor, h: Tensor, activation: str) -> Tensor:
    """dL/dh from dL/dy in PyTorch ops (fp32 in, fp32 out): what the kernel computes, differentiable."""
    if ACTIVATIONS[activation][1]:
        p, g = h.chunk(2, dim=-1)
        act, dact = _act_and_grad(g, activation)
        return torch.cat([dy * act, dy * p * dact], dim=-1)
    return dy * _act_and_grad(h, activation)[1]


def _double_backward(ctx, ddh):
    """The gradients of dh with respect to dy and h (a double backward through ``matmul``): the same math in fp32
    PyTorch ops, differentiated by ``_dispatch.fp32_vjp``."""
    dy, h = ctx.saved_tensors
    return (*fp32_vjp(lambda a, b: (_dh(a, b, ctx.activation),), (dy, h), (ddh,)), None)


# the double backward, registered, and its Function for eager code (functorch transforms through its twin)
_EPILOGUE_GRAD_AUTOGRAD = eager_autograd(_epilogue_grad_op, _epilogue_grad_impl, _setup_context, _double_backward)


def epilogue_grad(dy: Tensor, h: Tensor, activation: str) -> Tensor:
    """dL/dh from dL/dy for ``matmul``'s ``activation`` (see the module docstring).

    Args:
        dy: (M, N) upstream gradient, h's dtype, any strides.
        h: (M, N), or (M, 2N) for a gated activation (the forward's saved pre-activation), any strides.
        activation: one of gelu, gelu_tanh, silu, relu, geglu, swiglu.

    Returns:
        dh of h's shape and dtype, contiguous.

    Raises:
        ValueError: an activation that is not one of these, shapes that do not match (h (M, N), or (M, 2N) gated).
        TypeError: dy and h of different dtypes or devices.
    """
    return call_op(_epilogue_grad_op, _epilogue_grad_impl, dy, h, activation, autograd=_EPILOGUE_GRAD_AUTOGRAD)
