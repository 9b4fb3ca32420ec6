"""Hub layers for ``kernels.kernelize``: stateless drop-in forwards.

Three sets, resolved by name (no clashes):

* **kernels-community/activation's names** (``SiluAndMul``, ``MulAndSilu``,
  ``GeluAndMul``, ``GeluTanhAndMul``, ``FatreluAndMul``, ``FastGELU``, ``NewGELU``,
  ``QuickGELU``, ``Silu``, ``Gelu``, ``GeluTanh``): same ``forward(x)``, shapes and
  dtypes as kernels-community's layers, with kernels-community's numerics where they
  follow a PyTorch expression: the gated layers round the activation to x.dtype before
  the multiply (``rounding="eager"``: equal to eager ``act(a) * b`` and to
  kernels-community's CUDA kernels); the plain ones compute in fp32 and round once
  (equal to ``F.silu``/``F.gelu``/kernels-community's ``gelu_quick``; kernels-community's
  CUDA ``gelu_new``/``gelu_fast`` round at ad-hoc intermediate points that match
  neither transformers nor the math, which is not reproduced).
* **transformers' decorated activation classes**, named after the class each replaces
  exactly (the names transformers' ``use_kernel_forward_from_hub`` gives them in
  parentheses): ``SiLUActivation`` (``SiLU``), ``GELUActivation`` (``GeLU``),
  ``GELUTanh`` (``GeluTanh``), ``NewGELUActivation`` (``NewGELU``),
  ``FastGELUActivation`` (``FastGELU``), ``QuickGELUActivation`` (``QuickGELU``):
  ``forward(input)`` with the module's own rounding points in fp16/bf16.
* **transformers' gated MLPs**: ``LlamaMLP`` (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``)
  and ``Phi3MLP`` (``gate_up_proj``, ``down_proj``, ``activation_fn``), exact, with the activation
  and the multiply in one kernel between the module's own projections.

Rules of ``kernels``: no ``__init__``, no members but ``has_backward`` /
``can_torch_compile``; a layer reads the replaced module's attributes.
``FatreluAndMul`` reads ``self.threshold`` (the attribute kernels-community's and
vLLM's ``FatreluAndMul`` modules set in ``__init__``); there is no default: a module
without ``threshold`` raises AttributeError instead of silently using 0.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _nn_module

from ._common import SUPPORTED_DTYPES
from ._replaced import replaced_forward
from . import functional
from ._autocast import autocast_to
from ._common import GATED_ACTIVATIONS
from .functional import (
    act_and_mul, fatrelu_and_mul, gelu, gelu_and_mul, gelu_fast, gelu_new, gelu_quick, gelu_tanh, gelu_tanh_and_mul,
    mul_and_silu, silu, silu_and_mul,
)


# ----------------------------------------------------------------------------- kernels-community names


class SiluAndMul(nn.Module):
    """SwiGLU: ``silu(x[..., :d]) * x[..., d:]``, silu rounded to x.dtype before the multiply.

    Shapes:
        - x: (..., 2 * d), fp16/bf16/fp32, any strides
        - output: (..., d), x's dtype, contiguous
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, SiluAndMul)) is not None:
            return own(self, x)
        return silu_and_mul(x, rounding="eager")


class MulAndSilu(nn.Module):
    """``x[..., :d] * silu(x[..., d:])``, silu rounded to x.dtype before the multiply.

    Shapes:
        - x: (..., 2 * d)
        - output: (..., d), x's dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, MulAndSilu)) is not None:
            return own(self, x)
        return mul_and_silu(x, rounding="eager")


class GeluAndMul(nn.Module):
    """GeGLU: ``gelu(x[..., :d]) * x[..., d:]`` (exact erf GELU), rounded to x.dtype before the multiply.

    Shapes:
        - x: (..., 2 * d)
        - output: (..., d), x's dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GeluAndMul)) is not None:
            return own(self, x)
        return gelu_and_mul(x, rounding="eager")


class GeluTanhAndMul(nn.Module):
    """``gelu_tanh(x[..., :d]) * x[..., d:]``, rounded to x.dtype before the multiply.

    Shapes:
        - x: (..., 2 * d)
        - output: (..., d), x's dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GeluTanhAndMul)) is not None:
            return own(self, x)
        return gelu_tanh_and_mul(x, rounding="eager")


class FatreluAndMul(nn.Module):
    """FATReLU gate ``where(a > self.threshold, a, 0) * x[..., d:]``, ``a = x[..., :d]``.

    Reads the replaced module's ``threshold`` (a Python float).

    Shapes:
        - x: (..., 2 * d)
        - output: (..., d), x's dtype
    """

    threshold: float

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, FatreluAndMul)) is not None:
            return own(self, x)
        return fatrelu_and_mul(x, threshold=self.threshold)


class Silu(nn.Module):
    """``F.silu(x)``.

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, Silu)) is not None:
            return own(self, x)
        return silu(x)


class Gelu(nn.Module):
    """``F.gelu(x)`` (exact erf).

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, Gelu)) is not None:
            return own(self, x)
        return gelu(x)


class GeluTanh(nn.Module):
    """``F.gelu(x, approximate="tanh")``.

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GeluTanh)) is not None:
            return own(self, x)
        return gelu_tanh(x)


class NewGELU(nn.Module):
    """The tanh GELU of ``gelu_new``, computed in fp32 and rounded once.

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, NewGELU)) is not None:
            return own(self, x)
        return gelu_new(x)


class FastGELU(nn.Module):
    """``gelu_fast``, computed in fp32 and rounded once.

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, FastGELU)) is not None:
            return own(self, x)
        return gelu_fast(x)


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 * x)`` in fp32, rounded once.

    Shapes:
        - x: any
        - output: x's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, QuickGELU)) is not None:
            return own(self, x)
        return gelu_quick(x)


# ----------------------------------------------------------------------------- exact to transformers


def _is_partial_gelu_tanh(act) -> bool:
    return (
        isinstance(act, functools.partial) and act.func is F.gelu and not act.args
        and act.keywords == {"approximate": "tanh"}
    )


class SiLUActivation(nn.Module):
    """transformers' ``SiLUActivation`` (``F.silu``), exact.

    Shapes:
        - input: any, fp16/bf16/fp32
        - output: input's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, SiLUActivation)) is not None:
            return own(self, input)
        return silu(input)


class GELUActivation(nn.Module):
    """transformers' ``GELUActivation``: ``self.act(input)``, exact.

    ``act`` is ``F.gelu`` (the default): the erf GELU kernel (one rounding, as ATen).
    ``use_gelu_python=True`` modules run their own Python formula (no kernel): its
    ``input / math.sqrt(2.0)`` is a true division in ATen's CPU kernel (measured) and a
    multiply by the reciprocal in its CUDA kernel, so no one rounding emulation fits both.

    Shapes:
        - input: any
        - output: input's shape and dtype
    """

    act: Callable

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GELUActivation)) is not None:
            return own(self, input)
        if self.act is F.gelu:
            return gelu(input)
        return self.act(input)


class GELUTanh(nn.Module):
    """transformers' ``GELUTanh``: ``self.act(input)``, exact.

    ``act`` is ``partial(F.gelu, approximate="tanh")`` (the default): the tanh GELU
    kernel (one rounding). ``use_gelu_tanh_python=True``: the NewGELU formula with its
    eager rounding points (the same ops in the same order). Any other ``act`` runs as is.

    Shapes:
        - input: any
        - output: input's shape and dtype
    """

    act: Callable

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GELUTanh)) is not None:
            return own(self, input)
        act = self.act
        if _is_partial_gelu_tanh(act):
            return gelu_tanh(input)
        if getattr(getattr(act, "__func__", None), "__name__", None) == "_gelu_tanh_python":
            return _new_gelu_formula(input)
        return act(input)


class NewGELUActivation(nn.Module):
    """transformers' ``NewGELUActivation``, exact: its eager rounding points in fp16/bf16.

    Shapes:
        - input: any
        - output: input's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, NewGELUActivation)) is not None:
            return own(self, input)
        return _new_gelu_formula(input)


def _new_gelu_formula(input: torch.Tensor) -> torch.Tensor:
    """transformers' NewGELU formula with its eager rounding points; under ``torch.autocast`` in the dtype its
    ``torch.pow`` computes in (on CUDA fp32, which the rest of the formula then follows by type promotion)."""
    to = autocast_to("pow", input)
    return gelu_new(input if to is None else input.to(to), rounding="eager")


class FastGELUActivation(nn.Module):
    """transformers' ``FastGELUActivation``, exact: its eager rounding points in fp16/bf16.

    Shapes:
        - input: any
        - output: input's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, FastGELUActivation)) is not None:
            return own(self, input)
        return gelu_fast(input, rounding="eager")


class QuickGELUActivation(nn.Module):
    """transformers' ``QuickGELUActivation``, exact: ``1.702 * input`` and the sigmoid rounded to the input dtype.

    Shapes:
        - input: any
        - output: input's shape and dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, QuickGELUActivation)) is not None:
            return own(self, input)
        return gelu_quick(input, rounding="eager")


# ----------------------------------------------------------------------------- transformers' gated MLP


class LlamaMLP(nn.Module):
    """transformers' gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, exact, with ``act_fn(gate) * up``
    in one kernel (:func:`~.functional.act_and_mul`, the eager rounding points) instead of two eager ops.

    Serves every class of that forward (``LlamaMLP``, ``MistralMLP``, ``Qwen2MLP``, ``Qwen3MLP``, ``GemmaMLP``, ...;
    one gate-and-up projection: :class:`Phi3MLP`). The projections are the module's own (called as
    modules: hooks, quantised linears and device maps keep working). ``act_fn`` decides the kernel on every call:
    transformers' ``SiLUActivation`` / ``nn.SiLU`` -> silu, ``GELUTanh`` with ``F.gelu(approximate="tanh")`` ->
    gelu_tanh, ``GELUActivation`` with ``F.gelu`` / ``nn.GELU`` -> gelu (erf or tanh as its ``approximate``). Any
    other ``act_fn``, or one with hooks or its own ``forward``, runs as the module would: ``act_fn(gate) * up``.

    Shapes:
        - x: (..., hidden_size), the projections' dtype
        - output: (..., hidden_size)
    """

    gate_proj: nn.Module
    up_proj: nn.Module
    down_proj: nn.Module
    act_fn: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, LlamaMLP)) is not None:
            return own(self, x)
        activation = _fusable_activation(self.act_fn)
        if activation is None:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(act_and_mul(self.gate_proj(x), self.up_proj(x), activation=activation))


class Phi3MLP(nn.Module):
    """transformers' gated MLP with one gate-and-up projection, ``down_proj(up * activation_fn(gate))`` where
    ``gate, up = gate_up_proj(x).chunk(2, -1)``, exact, with ``up * activation_fn(gate)`` in one kernel
    (:func:`~.functional.silu_and_mul` and its siblings read the projection's two halves in place; the
    multiply commutes bit for bit).

    Serves every class of that forward (``Phi3MLP``, ``Phi4MultimodalMLP``, ``GlmMLP``, ``Glm4MLP``, ...); the
    projections are the module's own. ``activation_fn`` decides the kernel on every call, as in :class:`LlamaMLP`;
    anything else runs as the module would.

    Shapes:
        - hidden_states: (..., hidden_size), the projections' dtype
        - output: (..., hidden_size)
    """

    gate_up_proj: nn.Module
    down_proj: nn.Module
    activation_fn: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, Phi3MLP)) is not None:
            return own(self, hidden_states)
        activation = _fusable_activation(self.activation_fn)
        gate_up = self.gate_up_proj(hidden_states)
        if activation is None:
            gate, up = gate_up.chunk(2, dim=-1)
            return self.down_proj(up * self.activation_fn(gate))
        gated = _GATED_OPS[activation]
        return self.down_proj(gated(gate_up, rounding="eager"))


# act_and_mul's activation -> the public gated op on one tensor's halves (_common's table of the two)
_GATED_OPS = {activation: getattr(functional, op) for activation, op in GATED_ACTIVATIONS.items()}

_ACTIVATION_CLASSES = {  # (module, class name) -> act_and_mul's activation, for classes whose forward is fixed
    ("transformers.activations", "SiLUActivation"): "silu",
    ("torch.nn.modules.activation", "SiLU"): "silu",
    ("transformers.activations", "PytorchGELUTanh"): "gelu_tanh",  # transformers < 5: F.gelu(approximate="tanh")
}


def _fusable_activation(act) -> str | None:
    """``act_and_mul``'s activation equal to calling ``act`` (a module), or None when ``act`` must run itself:
    an unknown class, a class whose ``forward`` was replaced, module hooks (its own or global ones: the module
    call would run them) or an instance ``forward`` other than this package's layers'."""
    try:
        state = act.__dict__
        if (state["_forward_hooks"] or state["_forward_pre_hooks"] or state["_backward_hooks"]
                or state["_backward_pre_hooks"]):
            return None
    except (AttributeError, KeyError):  # not an nn.Module
        return None
    if (_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
            or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks):
        return None
    own = state.get("forward")
    if own is not None and getattr(getattr(own, "__func__", None), "__module__", None) != __name__:
        return None
    cls = type(act)
    if not _own_forward(cls):
        return None
    key = (cls.__module__, cls.__name__)
    known = _ACTIVATION_CLASSES.get(key)
    if known is not None:
        return known
    if key == ("transformers.activations", "GELUTanh"):
        return "gelu_tanh" if _is_partial_gelu_tanh(getattr(act, "act", None)) else None
    if key == ("transformers.activations", "GELUActivation"):
        return "gelu" if getattr(act, "act", None) is F.gelu else None
    if cls is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(act.approximate)
    return None


_OWN_FORWARDS: dict = {}  # act class -> its forward, where that is the class's own (checked once per class)


def _own_forward(cls: type) -> bool:
    """Whether ``cls.forward`` is the one its class defines, not a function patched in from elsewhere."""
    forward = getattr(cls, "forward", None)
    known = _OWN_FORWARDS.get(cls)
    if known is not None:
        return known is forward
    own = getattr(forward, "__module__", None) == cls.__module__ \
        and getattr(forward, "__qualname__", None) == f"{cls.__qualname__}.forward"
    if own:
        _OWN_FORWARDS[cls] = forward
    return own
