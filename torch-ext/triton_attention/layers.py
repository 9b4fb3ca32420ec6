"""Hub layers for ``kernels.kernelize``: drop-in forwards, exact to the modules (and functions) they replace.

=================  ============================================  =========================================
layer              replaces                                      numerics
=================  ============================================  =========================================
RotaryPosEmb       transformers' ``apply_rotary_pos_emb``        bit-exact (each product and the sum rounded
                   (kernelizable function ``rotary_pos_emb``)    to the promoted dtype, as eager)
LlamaAttention     transformers' ``LlamaAttention`` (and the     bit-exact (the rotary above; everything
                   classes of its forward)                       else is the module's own steps)
=================  ============================================  =========================================

transformers turns functions decorated with ``use_kernel_forward_from_hub("rotary_pos_emb")`` into
modules whose ``forward(q, k, cos, sin, unsqueeze_dim=1)`` is the function; ``kernelize`` swaps that
forward for ``RotaryPosEmb.forward`` on models that attach it (``use_kernelized_func``).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from .rotary import rotary_or_reference


class RotaryPosEmb(nn.Module):
    """transformers' ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` as a layer.

    Shapes:
        - q: [B, Hq, S, D], k: [B, Hk, S, D] (D even), fp16/bf16/fp32
        - cos, sin: [B, S, D] (unsqueezed at ``unsqueeze_dim``)
        - output: (q_embed, k_embed), new tensors in the promoted dtype

    ``kernelize_rotary`` swaps the module-level function, which every model of the family in the process calls:
    tensors the kernel does not take (another dtype such as float64, CPU tensors of a GPU build, cos / sin that
    require grad) get transformers' formula in PyTorch ops (the same ops, so the same bits) instead of an error.
    Other bad input raises as :func:`~.rotary.apply_rotary_pos_emb`.
    """

    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1) -> Tuple[torch.Tensor, torch.Tensor]:
        return rotary_or_reference(q, k, cos, sin, unsqueeze_dim)


class LlamaAttention(nn.Module):
    """transformers' ``LlamaAttention`` (5.x; and every class of the same forward) with the rotary embedding in one
    kernel (:func:`~.rotary.apply_rotary_pos_emb`, bit-exact to Llama's formula, which kernelize checks the class's
    own ``apply_rotary_pos_emb`` computes): a decode step runs two launches instead of transformers' ten (mul,
    neg, cat, mul, add for q and k).

    Everything else is the module's own steps: the projections (its modules), the cache update, the attention
    function its config selects (transformers' ``ALL_ATTENTION_FUNCTIONS`` lookup, read from the file that defines
    the class's forward, as that forward does), the output projection. Unlike ``kernelize_rotary`` (process-wide:
    it swaps the module-level function), this swaps the model's own modules only.

    Shapes: hidden_states (batch, seq, hidden); cos, sin (batch, seq, head_dim); returns (attn_output (batch, seq,
    hidden), attn_weights or None), as the replaced module. Tensors the rotary kernel does not take (a model moved
    to float64, CPU tensors of a GPU build, cos / sin that require grad) get transformers' formula in PyTorch ops,
    as :class:`RotaryPosEmb`: the same bits.
    """

    q_proj: nn.Module
    k_proj: nn.Module
    v_proj: nn.Module
    o_proj: nn.Module
    config: object  # transformers' config: _attn_implementation
    head_dim: int
    layer_idx: int
    scaling: float
    attention_dropout: float

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                past_key_values=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = rotary_or_reference(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
        names = type(self).forward.__globals__  # the replaced forward's module (transformers' modeling file)
        attention_interface = names["ALL_ATTENTION_FUNCTIONS"].get_interface(
            self.config._attn_implementation, names["eager_attention_forward"])
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights
