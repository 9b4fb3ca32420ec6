"""triton-attention: flash attention (forward + backward) and rotary embeddings in Triton.

``flash_attention`` computes ``softmax(scale * q k^T + mask) v`` with an online softmax
(no S x S matrix in memory), forward and backward, causal or not, with an optional boolean
or additive mask, MHA/GQA/MQA, head dims up to 256 (others padded), fp16/bf16/fp32, in the
[B, H, S, D] (transformers) and [B, S, H, D] (diffusers) layouts read in place.
``flash_attention_rope`` fuses the rotary embedding (q rotated on load); ``rotary_embedding``
and ``apply_rotary_pos_emb`` (bit-exact to transformers) are the rotary op on its own;
``transformers_attention_forward`` plugs into transformers' ``AttentionInterface``; ``layers``
holds ``RotaryPosEmb`` for transformers' kernelizable ``rotary_pos_emb`` function.
Each op is a ``torch.library.custom_op`` with a fake implementation and an autograd
formula, so it runs under ``torch.compile(fullgraph=True)`` and in CUDA graphs. Second derivatives
(``create_graph=True``): the rotary embedding has them; flash attention's raise (use SDPA's math backend).

On CPU tensors the kernels run under the Triton interpreter: set
``TRITON_INTERPRET=1`` before importing triton and this package.
"""

from . import layers
from ._launch import BwdConfig, FwdConfig, pick_bwd_config, pick_fwd_config
from .flash import flash_attention, flash_attention_rope
from .rotary import apply_rotary_pos_emb, rotary_embedding
from .transformers_attention import attention_forward as transformers_attention_forward

__all__ = [
    "BwdConfig",
    "FwdConfig",
    "apply_rotary_pos_emb",
    "flash_attention",
    "flash_attention_rope",
    "layers",
    "pick_bwd_config",
    "pick_fwd_config",
    "rotary_embedding",
    "transformers_attention_forward",
]
