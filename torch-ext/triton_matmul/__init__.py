"""triton-matmul: a Triton GEMM with bias and activation (gelu, gelu_tanh, silu, relu, geglu, swiglu) fused
into the store, forward and backward.

    y = matmul(x, W.t(), bias, activation="gelu")   # == F.gelu(F.linear(x, W, bias)), one kernel
    y = matmul(x, W.t(), bias, activation="geglu")  # == diffusers GEGLU: proj, gate = chunk(2); proj * gelu(gate)

Tile settings come from per-GPU JSON files in ``configs/`` (nearest shape bucket, with entries for one
activation where a file has them; ``default.json`` for unknown GPUs), see ``_launch``. ``layers`` holds Hub
layers for ``kernels.kernelize``: diffusers' ``GELU`` and ``GEGLU`` and ``torch.nn.Linear``.

On CPU tensors the kernel runs under the Triton interpreter: set ``TRITON_INTERPRET=1``
before importing triton and this package.
"""

from . import layers
from ._launch import MatmulConfig, pick_config
from .matmul import matmul

__all__ = ["MatmulConfig", "layers", "matmul", "pick_config"]
