"""triton-norms: RMSNorm and LayerNorm (with fused residual add), adaLN modulation and gated residuals in Triton.

Forward and backward for fp16/bf16/fp32 inputs with fp32 accumulation, any
leading shape and any row width (rows wider than one block loop over the row).
Each op is a ``torch.library.custom_op`` with a fake implementation and an
autograd formula, so it runs under ``torch.compile(fullgraph=True)``.
``layers`` holds the Hub layers that ``kernels.kernelize`` swaps in; each is
exact to the module it replaces (see ``layers.py``).

On CPU tensors the kernels run under the Triton interpreter: set
``TRITON_INTERPRET=1`` before importing triton and this package.
"""

from . import layers
from ._launch import LaunchConfig, pick_config
from .gated_residual import gated_residual
from .layer_norm import add_layer_norm, layer_norm
from .modulate import norm_modulate
from .rms_norm import add_rms_norm, rms_norm

__all__ = [
    "LaunchConfig",
    "add_layer_norm",
    "add_rms_norm",
    "gated_residual",
    "layer_norm",
    "layers",
    "norm_modulate",
    "pick_config",
    "rms_norm",
]
