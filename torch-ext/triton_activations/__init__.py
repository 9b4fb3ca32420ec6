"""triton-activations: a portable Triton port of kernels-community/activation.

The functions carry kernels-community/activation's names and ``(out, x)`` call
convention (so code switches by changing the repo id) and, called with x alone,
allocate their output and support autograd:

    y = silu_and_mul(x)          # (..., 2d) -> (..., d), differentiable
    silu_and_mul(out, x)         # writes into out (any strides), returns out
    y = act_and_mul(gate, up)    # silu(gate) * up for two tensors (a gated MLP's two projections)

Inputs and outputs may be views (``chunk``/``narrow`` halves, expanded tensors,
storage offsets): the kernels address them through their strides, with no copy.
fp16/bf16/fp32; math in fp32. ``rounding="eager"`` (default of the gated ops, as
kernels-community's kernels) reproduces the rounding points of the eager PyTorch /
transformers expression; ``rounding="fused"`` (default of the plain ops) rounds once
(see ``functional``). Every op is a ``torch.library``
custom op with a fake implementation, so it runs under ``torch.compile(fullgraph=True)``.
``layers`` holds the Hub layers for ``kernels.kernelize``: kernels-community's
layer names, and layers exact to transformers' decorated activation classes.

On CPU tensors the kernels run under the Triton interpreter: set
``TRITON_INTERPRET=1`` before importing triton and this package.
"""

from . import layers
from ._launch import LaunchConfig, pick_config
from .functional import (
    act_and_mul,
    fatrelu_and_mul,
    gelu,
    gelu_and_mul,
    gelu_fast,
    gelu_new,
    gelu_quick,
    gelu_tanh,
    gelu_tanh_and_mul,
    mul_and_silu,
    silu,
    silu_and_mul,
)

__all__ = [
    "LaunchConfig",
    "act_and_mul",
    "fatrelu_and_mul",
    "gelu",
    "gelu_and_mul",
    "gelu_fast",
    "gelu_new",
    "gelu_quick",
    "gelu_tanh",
    "gelu_tanh_and_mul",
    "layers",
    "mul_and_silu",
    "pick_config",
    "silu",
    "silu_and_mul",
]
