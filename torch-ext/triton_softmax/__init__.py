"""triton-softmax: softmax, log-softmax and fused cross-entropy in Triton, at any row width.

Forward and backward for fp16/bf16/fp32 with fp32 accumulation, rows of 1 to
262144+ elements (one pass when the row fits on chip, an online max/sum over chunks
when it does not), any strides (``dim`` other than the last, sliced and expanded
views are read in place), an optional scale and additive or causal mask folded into
the softmax. ``cross_entropy`` computes the loss and its gradient in one pass per
row with an online logsumexp, without materialising the softmax and without host
syncs (label smoothing, ignore_index, z-loss). Each op is a
``torch.library.custom_op`` with a fake implementation and an autograd formula, so
it runs under ``torch.compile(fullgraph=True)``. ``softmax(..., torch_order=True)`` adds the
exponentials in the order of torch's CUDA kernels with the same ``expf`` (``_torch_order``): its
output equals ``torch.softmax``'s bit for bit; ``cross_entropy(..., torch_order=True)`` follows
``F.cross_entropy``'s steps and roundings (loss and gradient bit-exact, ``_cross_entropy_torch_order``).
``layers`` holds the Hub layers (``Softmax`` and ``CrossEntropyLoss``, in torch's order: see ``layers.py``).

On CPU tensors the kernels run under the Triton interpreter: set
``TRITON_INTERPRET=1`` before importing triton and this package.
"""

from . import layers
from ._launch import LaunchConfig, pick_config
from .cross_entropy import cross_entropy
from .softmax import log_softmax, softmax

__all__ = [
    "LaunchConfig",
    "cross_entropy",
    "layers",
    "log_softmax",
    "pick_config",
    "softmax",
]
