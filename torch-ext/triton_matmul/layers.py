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
different order.
"""

from __future__ import annotations

import torch
from torch import nn

from .matmul import matmul


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
        act = "gelu_tanh" if self.approximate == "tanh" else "gelu"
        return matmul(hidden_states, self.proj.weight.t(), self.proj.bias, act)


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
        return matmul(hidden_states, self.proj.weight.t(), self.proj.bias, "geglu")


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
        return matmul(input, self.weight.t(), self.bias)
