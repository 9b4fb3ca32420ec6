"""Hub layers for ``kernels.kernelize``: the projection and its activation in one ``matmul`` launch.

* ``GELU``: diffusers' ``diffusers.models.activations.GELU`` (``proj`` = nn.Linear, ``approximate``
  "none" or "tanh"): ``gelu(proj(hidden_states))``.
* ``GEGLU``: diffusers' ``GEGLU``: ``hidden_states, gate = proj(hidden_states).chunk(2, -1);
  hidden_states * gelu(gate)``.
* ``Linear``: ``torch.nn.Linear``: ``F.linear(input, weight, bias)``.

Rules of ``kernels``: no ``__init__``, no members but ``has_backward`` / ``can_torch_compile``;
a layer reads the replaced module's own attributes (``proj``, ``approximate``, ``weight``, ``bias``). A ``proj``
that is not a plain ``nn.Linear`` (a LoRA layer) or has hooks, and float64 modules, run the module's own ops.
Values equal the modules' within matmul tolerances: the kernel rounds once from fp32 where the
modules round the linear output before the activation (~1 ulp of the dtype), and sums K in a
different order. Under ``torch.autocast`` the inputs and parameters are cast as ``F.linear``'s are.
"""

from __future__ import annotations

import torch
from torch import nn

from ._autocast import autocast_to, cast
from ._replaced import also_runtime_error
from .matmul import SUPPORTED_DTYPES, matmul


def _fused(x: torch.Tensor, proj: nn.Module) -> bool:
    """Whether ``proj`` (a GELU / GEGLU module's projection) can run inside the fused launch: a plain ``nn.Linear``
    without hooks (a LoRA layer or a hook put there must run as the module would run it) and a dtype the kernel
    takes (a float64 module runs the module's own ops)."""
    return (type(proj) is nn.Linear and not proj._forward_hooks and not proj._forward_pre_hooks
            and x.dtype in SUPPORTED_DTYPES and proj.weight.dtype in SUPPORTED_DTYPES)


def _linear(x: torch.Tensor, linear: nn.Module, activation=None, layer=None) -> torch.Tensor:
    """``activation(F.linear(x, linear.weight, linear.bias))`` in one ``matmul``; under ``torch.autocast`` in the
    dtype ``F.linear`` computes in (the autocast dtype), as the module does."""
    w, b = linear.weight, linear.bias
    to = autocast_to("linear", x)
    if to is not None:
        x, w, b = cast(to, x, w, b)
    try:
        return matmul(x, w.t(), b, activation)
    except (TypeError, ValueError) as err:  # matmul names its operands a and b: say which tensors they are here
        raise also_runtime_error(err)(  # (also the RuntimeError F.linear raises for them)
            f"{layer or type(linear).__name__} layer: input {tuple(x.shape)} {x.dtype}, weight {tuple(w.shape)} "
            f"{w.dtype} (out_features, in_features): matmul(input, weight.T) refused them: {err}") from err


class GELU(nn.Module):
    """diffusers ``GELU``: ``gelu(proj(hidden_states), approximate=self.approximate)``.

    Raises:
        RuntimeError / TypeError: ``approximate`` neither "none" nor "tanh" (``F.gelu``'s own error, as the module).

    Shapes:
        - hidden_states: (..., dim_in), proj's dtype
        - output: (..., dim_out)
    """

    proj: nn.Linear
    approximate: str

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # an ``approximate`` F.gelu does not know (not "none" / "tanh") runs the module's ops, which raise as it does
        if not _fused(hidden_states, self.proj) or self.approximate not in ("none", "tanh"):
            return torch.nn.functional.gelu(self.proj(hidden_states), approximate=self.approximate)
        return _linear(hidden_states, self.proj, "gelu_tanh" if self.approximate == "tanh" else "gelu", "GELU")


class GEGLU(nn.Module):
    """diffusers ``GEGLU``: ``proj`` output split into ``[hidden_states | gate]``, ``hidden_states * gelu(gate)``.

    Shapes:
        - hidden_states: (..., dim_in), proj's dtype
        - output: (..., dim_out), proj having 2 * dim_out outputs
    """

    proj: nn.Linear

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if not _fused(hidden_states, self.proj):
            hidden_states, gate = self.proj(hidden_states).chunk(2, dim=-1)
            return hidden_states * torch.nn.functional.gelu(gate)
        return _linear(hidden_states, self.proj, "geglu", "GEGLU")


class Linear(nn.Module):
    """``torch.nn.Linear``: ``input @ weight.T + bias`` (the weight read transposed in place).

    Raises:
        TypeError / ValueError, each also a RuntimeError (what ``F.linear`` raises for them): an input whose dtype,
            device or last dim does not match the weight's, naming input and weight.

    Shapes:
        - input: (..., in_features)
        - output: (..., out_features)
    """

    weight: torch.Tensor
    bias: torch.Tensor

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES or self.weight.dtype not in SUPPORTED_DTYPES:  # e.g. a float64 module
            return torch.nn.functional.linear(input, self.weight, self.bias)
        return _linear(input, self)
