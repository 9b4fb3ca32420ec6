"""What each public op computes, argument validation, and strided row addressing.

* ``OPS``: the op table (activation id, gated or not, which half gets the activation).
* validation for the public functions: ``TypeError``/``ValueError`` naming the
  argument; never ``assert``.
* ``leading_layout``: the leading (row) dims of several same-shaped tensors merged
  into at most 3 dims with per-tensor strides, so any view (``chunk``/``narrow``
  halves, expanded or transposed inputs, outputs with a storage offset) is addressed
  in place, without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from ._device import check_dense
from ._math import ACT_IDS

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"
ROUNDINGS = ("fused", "eager")
MAX_LEADING_DIMS = 3


@dataclass(frozen=True)
class OpSpec:
    """One public op: ``act(x)``, or ``act(gate) * up`` over the two halves of the last dim."""

    act: int  # activation id (``_math.ACT_IDS``)
    gated: bool  # x is (..., 2d): act of one half times the other half
    act_on_second: bool = False  # mul_and_silu: x[..., :d] * silu(x[..., d:])


OPS = {
    "silu_and_mul": OpSpec(ACT_IDS["silu"], True),
    "mul_and_silu": OpSpec(ACT_IDS["silu"], True, act_on_second=True),
    "gelu_and_mul": OpSpec(ACT_IDS["gelu"], True),
    "gelu_tanh_and_mul": OpSpec(ACT_IDS["gelu_tanh"], True),
    "fatrelu_and_mul": OpSpec(ACT_IDS["fatrelu"], True),
    "silu": OpSpec(ACT_IDS["silu"], False),
    "gelu": OpSpec(ACT_IDS["gelu"], False),
    "gelu_tanh": OpSpec(ACT_IDS["gelu_tanh"], False),
    "gelu_new": OpSpec(ACT_IDS["gelu_new"], False),
    "gelu_fast": OpSpec(ACT_IDS["gelu_fast"], False),
    "gelu_quick": OpSpec(ACT_IDS["gelu_quick"], False),
}


def out_shape(x_shape: Sequence[int], gated: bool) -> Tuple[int, ...]:
    if not gated:
        return tuple(x_shape)
    return tuple(x_shape[:-1]) + (x_shape[-1] // 2,)


def check_x(name: str, x, gated: bool) -> None:
    """Validates the input tensor of op ``name``.

    Raises:
        TypeError: not a tensor, or a dtype other than fp16/bf16/fp32.
        ValueError: a 0-d tensor for a gated op, or an odd last dim.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: x must be a torch.Tensor, got {type(x).__name__}")
    check_dense(f"{name}: x", x)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: x must have dtype {_DTYPE_NAMES}, got {x.dtype}")
    if gated:
        if x.dim() < 1:
            raise ValueError(f"{name}: x must have at least one dimension (..., 2 * d), got a 0-d tensor")
        if x.shape[-1] % 2:
            raise ValueError(f"{name}: the last dim of x must be even (2 * d), got x of shape {tuple(x.shape)}")


GATED_ACTIVATIONS = {"silu": "silu_and_mul", "gelu": "gelu_and_mul", "gelu_tanh": "gelu_tanh_and_mul"}
"""``act_and_mul``'s activations -> the gated op whose kernel computes it."""


def check_gate_up(gate, up, activation) -> str:
    """Validates the arguments of ``act_and_mul``; returns the gated op (``GATED_ACTIVATIONS``).

    Raises:
        TypeError: gate or up not a tensor, a dtype other than fp16/bf16/fp32, or up's dtype not gate's.
        ValueError: an unknown activation, shapes that differ, tensors on two devices.
    """
    try:
        op = GATED_ACTIVATIONS.get(activation)
    except TypeError:  # unhashable
        op = None
    if op is None:
        raise ValueError(f"act_and_mul: activation must be one of {sorted(GATED_ACTIVATIONS)}, got {activation!r}")
    for arg, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"act_and_mul: {arg} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(f"act_and_mul: {arg}", t)
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"act_and_mul: {arg} must have dtype {_DTYPE_NAMES}, got {t.dtype}")
    if up.dtype != gate.dtype:
        raise TypeError(f"act_and_mul: up must have gate's dtype {gate.dtype}, got {up.dtype}")
    if up.shape != gate.shape:
        raise ValueError(f"act_and_mul: up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}")
    if up.device != gate.device:
        raise ValueError(f"act_and_mul: up is on {up.device} but gate is on {gate.device}: both must be on one device")
    return op


def check_out(name: str, out, x: torch.Tensor, gated: bool) -> None:
    """Validates ``out`` of the ``(out, x)`` form against ``x``.

    Raises:
        TypeError: out is not a tensor, or its dtype differs from x's.
        ValueError: wrong shape (for gated ops the last dim must be x.shape[-1] // 2),
            another device, or an out whose elements overlap (stride 0).
        RuntimeError: x or out requires grad while grad mode is on: the form records no autograd graph (as
            PyTorch's ``out=`` functions refuse), so the gradient would be lost or a leaf overwritten silently.
    """
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: out must be a torch.Tensor, got {type(out).__name__}")
    check_dense(f"{name}: out", out)
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        which = "x" if x.requires_grad else "out"
        raise RuntimeError(f"{name}: the (out, x) form does not support automatic differentiation, but {which} "
                           f"requires grad: call {name}(x) for a new tensor with a gradient, or call the (out, x) "
                           "form under torch.no_grad()")
    if out.dtype != x.dtype:
        raise TypeError(f"{name}: out must have the dtype of x ({x.dtype}), got {out.dtype}")
    if out.device != x.device:
        raise ValueError(f"{name}: out is on {out.device} but x is on {x.device}: both must be on one device")
    expected = out_shape(x.shape, gated)
    if tuple(out.shape) != expected:
        what = f"shape x.shape[:-1] + (x.shape[-1] // 2,) = {expected}" if gated else f"x's shape {expected}"
        raise ValueError(f"{name}: out must have {what}, got {tuple(out.shape)}")
    if any(st == 0 and sz > 1 for st, sz in zip(out.stride(), out.shape)):
        raise ValueError(f"{name}: out has overlapping elements (a stride-0, expanded dim): it cannot be written")
    if _partial_overlap(out, x, gated):
        raise ValueError(f"{name}: out shares memory with x without being x itself"
                         f"{' or one of its halves' if gated else ''} (a shifted or transposed view): elements of x "
                         "would be overwritten before they are read; write into x, a separate tensor or a copy")


def _partial_overlap(out: torch.Tensor, x: torch.Tensor, gated: bool) -> bool:
    """Whether ``out`` and ``x`` share bytes without ``out`` being x itself or, for a gated op, one of x's halves
    (views a program reads element by element before writing them: safe in place). As PyTorch's ``out=`` functions
    refuse a partial overlap. Conservative: two views whose byte ranges interleave count as overlapping. The halves
    are recognised by address and strides (no views made: host time of every ``(out, x)`` call; shapes are checked
    before)."""
    if torch.compiler.is_compiling() or out.numel() == 0 or x.numel() == 0:
        return False  # (compile traces the op: its graph carries the aliasing; fake tensors have no addresses)
    try:
        base = out.untyped_storage().data_ptr()
        if base == 0 or base != x.untyped_storage().data_ptr():  # (0: meta tensors, no memory)
            return False
    except RuntimeError:  # a tensor without memory (FakeTensor under export / make_fx)
        return False
    a0, b0 = out.data_ptr(), x.data_ptr()
    if out.stride() == x.stride():  # x itself, or a gated x's first or second half (x's strides, shifted start)
        if a0 == b0 or (gated and a0 == b0 + (x.shape[-1] // 2) * x.stride(-1) * x.element_size()):
            return False

    def end(t, start):  # one past the last byte; torch strides are never negative
        return start + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()

    return a0 < end(x, b0) and b0 < end(out, a0)


def check_rounding(name: str, rounding: str) -> bool:
    """Returns True for ``"eager"``; raises ValueError for anything but "fused"/"eager"."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"{name}: rounding must be 'fused' or 'eager', got {rounding!r}")
    return rounding == "eager"


def check_threshold(threshold) -> float:
    if isinstance(threshold, torch.Tensor) or not isinstance(threshold, (int, float)) or isinstance(threshold, bool):
        raise TypeError(f"fatrelu_and_mul: threshold must be a Python float or int, got {type(threshold).__name__}")
    threshold = float(threshold)
    if threshold != threshold:  # NaN; math.isnan is not traceable on symbolic floats (compile)
        raise ValueError("fatrelu_and_mul: threshold must not be NaN")
    return threshold


def leading_layout(
    sizes: Sequence[int], strides: Sequence[Sequence[int]]
) -> Tuple[List[int], List[List[int]]]:
    """Merges leading dims shared by several tensors.

    Size-1 dims are dropped; neighbouring dims ``i, i+1`` are merged when, for every
    tensor, ``stride[i] == stride[i+1] * size[i+1]`` (one row stride covers both).

    Args:
        sizes: the leading sizes (the same for every tensor).
        strides: per tensor, its strides of those dims.

    Returns:
        ``(sizes, strides)`` after merging; empty lists for a single row.
    """
    out_sizes: List[int] = []
    out_strides: List[List[int]] = [[] for _ in strides]
    for i, size in enumerate(sizes):
        if size == 1:
            continue
        if out_sizes and all(st[-1] == s[i] * size for st, s in zip(out_strides, strides)):
            out_sizes[-1] *= size
            for st, s in zip(out_strides, strides):
                st[-1] = s[i]
        else:
            out_sizes.append(size)
            for st, s in zip(out_strides, strides):
                st.append(s[i])
    return out_sizes, out_strides


def padded_layout(t_sizes: List[int], t_strides: List[List[int]]) -> Tuple[List[int], List[List[int]]]:
    """Pads a layout of <= 3 leading dims to exactly 3 (size-1 dims at the end, stride 0).

    At the end, so that the common one-dim layout passes D1 = D2 = 1, which Triton
    specialises as constants: the kernels then need no integer division per row.
    """
    pad = MAX_LEADING_DIMS - len(t_sizes)
    return list(t_sizes) + [1] * pad, [list(s) + [0] * pad for s in t_strides]


def rounding_dtype(x: torch.Tensor, eager: bool) -> Optional[torch.dtype]:
    """The dtype eager intermediate steps round to (None: fp32 or fused, nothing to round)."""
    if not eager or x.dtype == torch.float32:
        return None
    return x.dtype


def pow_rounds_square(x: torch.Tensor) -> bool:
    """Whether ATen's ``torch.pow(x, 3.0)`` rounds ``x * x`` to x.dtype first on x's device.

    CUDA/ROCm/XPU: ``x * x * x`` in the tensor dtype (two roundings). CPU: bf16 the
    same, fp16 computed in fp32 (one rounding). Measured on CPU (torch 2.13); the GPU
    rule follows ATen's CUDA PowKernel.
    """
    return not (x.device.type == "cpu" and x.dtype == torch.float16)
