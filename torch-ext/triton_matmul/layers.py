"""Hub layers for ``kernels.kernelize``: the projection and its activation in one ``matmul`` launch.

* ``GELU``: diffusers' ``diffusers.models.activations.GELU`` (``proj`` = nn.Linear, ``approximate``
  "none" or "tanh"): ``gelu(proj(hidden_states))``.
* ``GEGLU``: diffusers' ``GEGLU``: ``hidden_states, gate = proj(hidden_states).chunk(2, -1);
  hidden_states * gelu(gate)``.
* ``Linear``: ``torch.nn.Linear``: ``F.linear(input, weight, bias)``.

Rules of ``kernels``: no ``__init__``, no members but ``has_backward`` / ``can_torch_compile``;
a layer reads the replaced module's own attributes (``proj``, ``approximate``, ``weight``, ``bias``).
Values equal the modules' within matmul tolerances: the kernel rounds once from fp32 where the
modules round the linear output before the activation (~1 ulp of the dtype), and sums K in a
different order. Under ``torch.autocast`` the inputs and parameters are cast as ``F.linear``'s are.
"""

from __future__ import annotations

import torch
from torch import nn

from ._autocast import autocast_to, cast
from .matmul import matmul


def _linear(x: torch.Tensor, linear: nn.Module, activation=None) -> torch.Tensor:
    """``activation(F.linear(x, linear.weight, linear.bias))`` in one ``matmul``; under ``torch.autocast`` in the
    dtype ``F.linear`` computes in (the autocast dtype), as the module does."""
    w, b = linear.weight, linear.bias
    to = autocast_to("linear", x)
    if to is not None:
        x, w, b = cast(to, x, w, b)
    try:
        return matmul(x, w.t(), b, activation)
    except (TypeError, ValueError) as err:  # matmul names its operands a and b: say which tensors they are here
        raise type(err)(f"{type(linear).__name__} layer: input {tuple(x.shape)} {x.dtype}, weight {tuple(w.shape)} "
                        f"{w.dtype} (out_features, in_features): matmul(input, weight.T) refused them: {err}") from err


class GELU(nn.Module):
    """diffusers ``GELU``: ``gelu(proj(hidden_states), approximate=self.approximate)``.

    Shapes:
        - hidden_states: (..., dim_in), proj's dtype
        - output: (..., dim_out)
    """

    proj: nn.Linear
    approximate: str

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _linear(hidden_states, self.proj, "gelu_tanh" if self.approximate == "tanh" else "gelu")


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
        return _linear(hidden_states, self.proj, "geglu")


class Linear(nn.Module):
    """``torch.nn.Linear``: ``input @ weight.T + bias`` (the weight read transposed in place).

    Shapes:
        - input: (..., in_features)
        - output: (..., out_features)
    """

    weight: torch.Tensor
    bias: torch.Tensor

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _linear(input, self)
