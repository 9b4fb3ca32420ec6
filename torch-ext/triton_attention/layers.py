"""Hub layers for ``kernels.kernelize``: drop-in forwards, exact to the modules (and functions) they replace.

=================  ============================================  =========================================
layer              replaces                                      numerics
=================  ============================================  =========================================
RotaryPosEmb       transformers' ``apply_rotary_pos_emb``        bit-exact (each product and the sum rounded
                   (kernelizable function ``rotary_pos_emb``)    to the promoted dtype, as eager)
=================  ============================================  =========================================

transformers turns functions decorated with ``use_kernel_forward_from_hub("rotary_pos_emb")`` into
modules whose ``forward(q, k, cos, sin, unsqueeze_dim=1)`` is the function; ``kernelize`` swaps that
forward for ``RotaryPosEmb.forward`` on models that attach it (``use_kernelized_func``).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from .rotary import apply_rotary_pos_emb


class RotaryPosEmb(nn.Module):
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` as a layer.

    Shapes:
        - q: [B, Hq, S, D], k: [B, Hk, S, D] (D even), fp16/bf16/fp32
        - cos, sin: [B, S, D] (unsqueezed at ``unsqueeze_dim``)
        - output: (q_embed, k_embed), new tensors in the promoted dtype
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1) -> Tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
