"""The backward of ``matmul``'s fused epilogue: dh, the gradient at the pre-activation h, in one elementwise kernel.

Math (fp32, from the upstream gradient dy and the h the forward saved in a's dtype; dh rounded once to that dtype):

    plain:  dh = dy * act'(h)
    gated:  p, g = h[:, :N], h[:, N:]      dh[:, :N] = dy * act(g)      dh[:, N:] = dy * p * act'(g)

with act and act' of ``_epilogue_math.activation_and_grad`` (the forms of the forward's epilogue). Eager PyTorch
computes the same from its own rounded h (``F.gelu``'s backward, ``silu_backward``...), within an fp32 rounding.

Kernel: one program per ``BLOCK_N`` columns of one row: reads dy once (any strides, a broadcast dy included) and h
once, writes dh once: 2 + 2 (+ 2 gated) bytes per output in bf16, where the same chain of PyTorch elementwise ops
made about ten passes over fp32 copies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import check_launch_device, launch_options, next_power_of_2
from ._dispatch import call_op
from ._epilogue_math import ACTIVATIONS, activation_and_grad, store_rounded
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
        g = tl.load(h_cols + N * stride_hn, mask=mask, other=0.0).to(tl.float32)
        act, dact = activation_and_grad(g, ACT, FAST_MATH)
        store_rounded(dh_row + cols, dy * act, mask)
        store_rounded(dh_row + N + cols, dy * p * dact, mask)
    else:
        _, dact = activation_and_grad(tl.load(h_cols, mask=mask, other=0.0).to(tl.float32), ACT, FAST_MATH)
        store_rounded(dh_row + cols, dy * dact, mask)


def _epilogue_grad_impl(dy: Tensor, h: Tensor, activation: str) -> Tensor:
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
    return torch.empty_like(h, memory_format=torch.contiguous_format)


def epilogue_grad(dy: Tensor, h: Tensor, activation: str) -> Tensor:
    """dL/dh from dL/dy for ``matmul``'s ``activation`` (see the module docstring).

    Args:
        dy: (M, N) upstream gradient, h's dtype, any strides.
        h: (M, N), or (M, 2N) for a gated activation (the forward's saved pre-activation), any strides.
        activation: one of gelu, gelu_tanh, silu, relu, geglu, swiglu.

    Returns:
        dh of h's shape and dtype, contiguous.
    """
    return call_op(_epilogue_grad_op, _epilogue_grad_impl, dy, h, activation)
