"""The public functions: kernels-community/activation's names, two call forms each.

Call forms (every function):

* ``y = silu_and_mul(x)``: allocates a contiguous output of x's dtype and supports
  autograd (forward and backward kernels), ``torch.compile(fullgraph=True)``.
* ``silu_and_mul(out, x)``: kernels-community/activation's convention: writes into
  ``out`` in place (any strides, storage offsets included) and returns ``out``. No
  autograd (as in kernels-community): with grad mode on, an x or out that requires grad raises
  RuntimeError (as PyTorch's ``out=`` functions do); under ``torch.no_grad()`` it writes.

Shapes: the ``*_and_mul`` ops take x of shape (..., 2 * d) and return (..., d); the
activation is applied to ``x[..., :d]`` (``mul_and_silu``: to ``x[..., d:]``) and
multiplied by the other half. Plain activations keep x's shape. x may be any view
(``chunk``/``narrow`` halves with row stride 2x the width, expanded or transposed
tensors): it is read in place, never copied. dtypes: fp16, bf16, fp32; out has x's dtype.

Rounding (keyword ``rounding``; the defaults give kernels-community/activation's numerics):

* ``"eager"`` (default of the ``*_and_mul`` ops): the rounding points of the eager PyTorch
  expression the op stands for: ``act(x[..., :d]) * x[..., d:]`` for the ``*_and_mul`` ops
  (the activation is rounded to x.dtype before the multiply, as torch does and as
  kernels-community/activation's CUDA kernels do); transformers' ``NewGELUActivation`` /
  ``FastGELUActivation`` / ``QuickGELUActivation`` forward for ``gelu_new`` / ``gelu_fast`` /
  ``gelu_quick``.
* ``"fused"`` (default of the plain ops): all math in fp32, one rounding to the output dtype.
  For ``silu``, ``gelu``, ``gelu_tanh`` (one ATen op each) and ``fatrelu_and_mul``
  (exact in any dtype) both settings give the same result; for fp32 inputs every op
  gives the same result with both (the eager steps round to fp32 anyway).

Precision: bit-identical to the PyTorch expression where the rounding says so. On NVIDIA GPUs
the bf16 forwards of ``silu``, ``gelu_tanh``, ``gelu_new``, ``gelu_fast`` and
of ``silu_and_mul``, ``mul_and_silu``, ``gelu_tanh_and_mul`` with ``rounding="eager"`` take
NVIDIA's approximate exp2 / reciprocal, after checking on the device that this gives the exact
path's result for every one of the 65536 bf16 inputs (``_fast_math``); otherwise libdevice's
exact functions.

Raises: each function's docstring ends with its errors (``_raises`` appends the part they share).

Performance: one program per (row, block of columns), one read of x and one write
of the output; see ``activation.py``. Source: kernels-community/activation (names,
call convention, layers), PyTorch and transformers (numerics).
"""

from __future__ import annotations

import torch

from ._common import OPS, check_gate_up, check_out, check_rounding, check_threshold, check_x
from ._dispatch import inference
from ._fastlaunch import PlanCache
from .activation import act_forward, act_forward_out, act_mul_forward, act_mul_infer, act_mul_plan, infer, infer_plan

Tensor = torch.Tensor

_RAISES = """
    Raises:
        TypeError: x or out not a tensor, a sparse or nested tensor, a dtype other than fp16/bf16/fp32, an
            out of another dtype than x's{type_extra}.
        ValueError: {gated}an out of the wrong shape, on another device, with overlapping (stride-0)
            elements or sharing memory with x other than as x itself{half}; an unknown rounding{value_extra}.
        RuntimeError: a CPU tensor without ``TRITON_INTERPRET=1``; an ``(out, x)`` call whose x or out
            requires grad in grad mode.
"""


def _raises(gated: bool, type_extra: str = "", value_extra: str = ""):
    """Appends the errors the ``(out, x)`` functions share (``_apply``'s checks) to a function's docstring."""
    def deco(f):
        if f.__doc__ is not None:  # (python -OO strips docstrings)
            f.__doc__ += _RAISES.format(
                gated="a 0-d x or an odd last dim of x;\n            " if gated else "",
                half=" or one of its halves" if gated else "", type_extra=type_extra, value_extra=value_extra)
        return f
    return deco


class _OneArgument:
    """The default of the functions' second positional argument: the call ``f(x)``. An explicit None there is the
    ``(out, x)`` form with x missing, which raises (a None default made ``f(out, None)`` compute ``f(out)`` and
    leave out unwritten)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<absent: the f(x) form>"


_ONE_ARG = _OneArgument()
_INFER_PLANS = PlanCache()
_GATE_UP_PLANS = PlanCache()  # act_and_mul's
_GENERAL = object()  # plan of a call the general path serves


def _apply(name: str, first: Tensor, second, rounding: str, threshold: float = 0.0) -> Tensor:
    """``name``(first) where ``second`` is _ONE_ARG, else the ``(out, x)`` form: ``name``(second) written into
    first (a second that is not a tensor, None included, raises naming x)."""
    if second is _ONE_ARG and inference((first,)):
        # plain eager inference: one validated plan per call signature (host time of small calls), x's 16-byte
        # alignment included (the plan's launch is pinned to it)
        try:
            key = (name, rounding, threshold, first.dtype, first.shape, first.stride(), first.device,
                   first.data_ptr() & 15)
            plan = _INFER_PLANS.get(key)
        except (TypeError, RuntimeError):  # an unhashable rounding, a sparse or nested x (no strides or storage):
            plan = _GENERAL  # the general path names it
        if plan is None:
            eager = check_rounding(name, rounding)
            check_x(name, first, OPS[name].gated)
            plan = _INFER_PLANS.add(key, infer_plan(first, name, eager, threshold) or _GENERAL)
        if plan is not _GENERAL:
            return infer(plan, first)
    spec = OPS[name]
    eager = check_rounding(name, rounding)
    if second is _ONE_ARG:
        check_x(name, first, spec.gated)
        return act_forward(first, name, eager, threshold)
    out, x = first, second
    check_x(name, x, spec.gated)
    check_out(name, out, x, spec.gated)
    act_forward_out(out, x, name, eager, threshold)
    return out


@_raises(gated=True)
def silu_and_mul(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "eager") -> Tensor:
    """SwiGLU gate: ``silu(x[..., :d]) * x[..., d:]``, ``silu(a) = a / (1 + exp(-a))``.

    ``silu_and_mul(x)`` -> new (..., d) tensor with autograd; ``silu_and_mul(out, x)`` -> out.
    See the module docstring for shapes, ``rounding`` and precision.
    """
    return _apply("silu_and_mul", out_or_x, x, rounding)


def act_and_mul(gate: Tensor, up: Tensor, *, activation: str = "silu", rounding: str = "eager") -> Tensor:
    """``act(gate) * up`` for two tensors of one shape: a gated MLP's activation (SwiGLU, GeGLU) where gate and up
    come from two projections, as in transformers' ``LlamaMLP``: ``act_fn(gate_proj(x)) * up_proj(x)``.

    The ``*_and_mul`` ops' math and kernel (:func:`silu_and_mul` for ``activation="silu"``, :func:`gelu_and_mul`
    for ``"gelu"``, :func:`gelu_tanh_and_mul` for ``"gelu_tanh"``) on operands read through their own pointers
    and strides: no concatenation, no copy. With ``rounding="eager"`` (default) the result is bit-identical to
    eager ``F.silu(gate) * up`` (``F.gelu(gate)``, ``F.gelu(gate, approximate="tanh")``) in fp16/bf16 (checked on
    an H100: every activation; fp32 silu and erf gelu too, fp32 gelu_tanh within a few ulps of ATen's CUDA
    kernel, as :func:`gelu_tanh`); ``"fused"`` rounds once.

    Args:
        gate: (...), fp16/bf16/fp32, any strides; the activation's input.
        up: gate's shape, dtype and device, any strides; the multiplier.
        activation: ``"silu"``, ``"gelu"`` (erf) or ``"gelu_tanh"``.
        rounding: ``"eager"`` or ``"fused"`` (module docstring).

    Returns:
        a new contiguous tensor of gate's shape and dtype, differentiable with respect to gate and up
        (backward: ``dgate = dy * up * act'(gate)``, ``dup = dy * act(gate)``, in fp32, one rounding each).

    Raises:
        TypeError: a non-tensor, a sparse or nested tensor, a dtype other than fp16/bf16/fp32, or dtypes that
            differ.
        ValueError: an unknown activation or rounding, shapes that differ, two devices.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.
    """
    if inference((gate, up), 2):
        # plain eager inference: one validated plan per call signature (host time of a decode step's MLP)
        try:
            key = (activation, rounding, gate.dtype, gate.shape, gate.stride(), gate.device, gate.data_ptr() & 15,
                   up.dtype, up.shape, up.stride(), up.device, up.data_ptr() & 15)
            plan = _GATE_UP_PLANS.get(key)
        except (TypeError, RuntimeError):  # an unhashable activation or rounding, a sparse or nested tensor: the
            plan = _GENERAL  # general path names it
        if plan is None:
            op = check_gate_up(gate, up, activation)
            eager = check_rounding("act_and_mul", rounding)
            plan = _GATE_UP_PLANS.add(key, act_mul_plan(gate, up, op, eager) or _GENERAL)
        if plan is not _GENERAL:
            return act_mul_infer(plan, gate, up)
    op = check_gate_up(gate, up, activation)
    return act_mul_forward(gate, up, op, check_rounding("act_and_mul", rounding))


@_raises(gated=True)
def mul_and_silu(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "eager") -> Tensor:
    """``x[..., :d] * silu(x[..., d:])`` (the activation on the second half).

    ``mul_and_silu(x)`` -> new (..., d) tensor with autograd; ``mul_and_silu(out, x)`` -> out.
    """
    return _apply("mul_and_silu", out_or_x, x, rounding)


@_raises(gated=True)
def gelu_and_mul(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "eager") -> Tensor:
    """GeGLU gate: ``gelu(x[..., :d]) * x[..., d:]`` with the exact (erf) GELU.

    ``gelu_and_mul(x)`` -> new (..., d) tensor with autograd; ``gelu_and_mul(out, x)`` -> out.
    """
    return _apply("gelu_and_mul", out_or_x, x, rounding)


@_raises(gated=True)
def gelu_tanh_and_mul(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "eager") -> Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` with ``F.gelu(approximate="tanh")``'s formula.

    ``gelu_tanh_and_mul(x)`` -> new (..., d) tensor with autograd; ``gelu_tanh_and_mul(out, x)`` -> out.
    """
    return _apply("gelu_tanh_and_mul", out_or_x, x, rounding)


@_raises(gated=True, type_extra=", a threshold that is not a Python number",
         value_extra=", a NaN threshold")
def fatrelu_and_mul(
    out_or_x: Tensor, x=_ONE_ARG, /, threshold: float = 0.0, *, rounding: str = "eager"
) -> Tensor:
    """FATReLU gate: ``where(a > threshold, a, 0) * x[..., d:]`` with ``a = x[..., :d]``.

    ``fatrelu_and_mul(x, threshold=0.0)`` -> new (..., d) tensor with autograd (no
    gradient for threshold); ``fatrelu_and_mul(out, x, threshold=0.0)`` -> out, as in
    kernels-community. ``fatrelu_and_mul(x, 0.5)`` also reads 0.5 as the threshold.
    """
    if x is not _ONE_ARG and x is not None and not isinstance(x, torch.Tensor):
        x, threshold = _ONE_ARG, x  # fatrelu_and_mul(x, threshold)
    elif isinstance(x, torch.Tensor) and x.dim() == 0:  # fatrelu_and_mul(x, torch.tensor(0.5)): no x is 0-d
        raise TypeError("fatrelu_and_mul: the second argument is a 0-d tensor: threshold must be a Python float "
                        "or int (fatrelu_and_mul(x, threshold) or (out, x, threshold)), and x needs a last dim "
                        "(..., 2 * d)")
    return _apply("fatrelu_and_mul", out_or_x, x, rounding, check_threshold(threshold))


@_raises(gated=False)
def silu(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """``x / (1 + exp(-x))``, equal to ``F.silu`` (one rounding).

    ``silu(x)`` -> new tensor with autograd; ``silu(out, x)`` -> out.
    """
    return _apply("silu", out_or_x, x, rounding)


@_raises(gated=False)
def gelu(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))``, equal to ``F.gelu`` (exact erf, one rounding).

    ``gelu(x)`` -> new tensor with autograd; ``gelu(out, x)`` -> out.
    """
    return _apply("gelu", out_or_x, x, rounding)


@_raises(gated=False)
def gelu_tanh(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``, equal to ``F.gelu(approximate="tanh")``.

    ``gelu_tanh(x)`` -> new tensor with autograd; ``gelu_tanh(out, x)`` -> out.
    """
    return _apply("gelu_tanh", out_or_x, x, rounding)


@_raises(gated=False)
def gelu_new(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """transformers' ``NewGELUActivation``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))``.

    ``rounding="eager"`` rounds after each of its eager ops in x.dtype, as the
    transformers module does (``torch.pow(x, 3.0)`` rounds as ATen does on x's device);
    ``"fused"`` equals :func:`gelu_tanh`'s math. ``gelu_new(x)`` -> new tensor with
    autograd; ``gelu_new(out, x)`` -> out.
    """
    return _apply("gelu_new", out_or_x, x, rounding)


@_raises(gated=False)
def gelu_fast(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """transformers' ``FastGELUActivation``: ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))``.

    ``rounding="eager"`` reproduces the module's rounding points in x.dtype.
    ``gelu_fast(x)`` -> new tensor with autograd; ``gelu_fast(out, x)`` -> out.
    """
    return _apply("gelu_fast", out_or_x, x, rounding)


@_raises(gated=False)
def gelu_quick(out_or_x: Tensor, x: Tensor = _ONE_ARG, /, *, rounding: str = "fused") -> Tensor:
    """transformers' ``QuickGELUActivation``: ``x * sigmoid(1.702 * x)``.

    ``rounding="eager"`` rounds ``1.702 * x`` and the sigmoid to x.dtype, as the module
    does; ``"fused"`` rounds once (kernels-community's ``gelu_quick``).
    ``gelu_quick(x)`` -> new tensor with autograd; ``gelu_quick(out, x)`` -> out.
    """
    return _apply("gelu_quick", out_or_x, x, rounding)
