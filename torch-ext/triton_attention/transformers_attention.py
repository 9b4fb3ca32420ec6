"""transformers' attention interface backed by :func:`flash_attention` (``attn_implementation="triton"``).

``attention_forward`` has the signature transformers calls registered attention functions with
(``AttentionInterface.register(name, fn)``) and the semantics of its ``sdpa`` implementation:
q, k, v in [B, H, S, D] (kv heads may be fewer: GQA/MQA, no ``repeat_kv`` copy), the mask from
transformers' ``sdpa_mask`` (boolean, True = attend, or None), ``is_causal`` resolved as SDPA's path
does (causal only for more than one query and no mask), output [B, S, H, D] written directly; under
``torch.autocast`` q, k, v and a float mask are cast as SDPA's are.
Registering the name is done by ``triton_collection.integrations.transformers_attention.register``
(this module imports nothing from transformers).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import torch

from ._autocast import autocast_to, cast
from ._device import check_dense
from .flash import flash_attention

_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs) -> Tuple[torch.Tensor, None]:
    """One attention call of a transformers model: ``(attn_output [B, S, Hq, Dv], None)``.

    Args:
        module: the attention module (reads ``is_causal`` when the call does not pass it).
        query: [B, Hq, Sq, D]; key, value: [B, Hk, Sk, D] / [B, Hk, Sk, Dv], Hq % Hk == 0.
        attention_mask: boolean or additive float mask broadcastable to [B, Hq, Sq, Sk], or None.
        dropout: must be 0 (attention dropout is not implemented: ValueError otherwise).
        scaling: softmax scale (default 1/sqrt(D)).
        is_causal: overrides ``module.is_causal``; causal masking applies only when Sq > 1 and no mask
            is given (as transformers' SDPA path), top-left aligned.
        kwargs: other arguments transformers passes (ignored), except ``softcap``, ``s_aux``/``sinks`` and
            ``position_bias``, which are refused with ValueError when set.

    Returns:
        (output [B, Sq, Hq, Dv] contiguous in q's dtype, None); no attention weights.

    Raises:
        TypeError: query / key / value not tensors, or sparse or nested (and as :func:`flash_attention`, its
            messages naming this function's arguments: query, key, value, attention_mask, scaling).
        ValueError: query / key / value not 4-D, dropout, ``output_attentions=True``, the refused kwargs above
            (and as :func:`flash_attention`, named as above).
    """
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise ValueError(f"triton attention does not support `{name}`; use attn_implementation='eager' or 'sdpa'")
    if kwargs.get("output_attentions", False):
        raise ValueError("triton attention does not return attention weights (output_attentions=True)")
    if dropout:
        raise ValueError(f"triton attention has no attention dropout; got dropout={dropout} (use model.eval())")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"triton attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(f"triton attention: {name}", t)
        if t.dim() != 4:
            raise ValueError(f"triton attention: {name} must be 4-D [B, H, S, D], got shape {tuple(t.shape)}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    to = autocast_to("scaled_dot_product_attention", query)
    if to is not None:  # under autocast SDPA computes in another dtype (the autocast dtype)
        query, key, value, attention_mask = cast(to, query, key, value, attention_mask)
    try:
        out = flash_attention(query, key, value, attn_mask=attention_mask, causal=causal, scale=scaling,
                              layout="bhsd", out_layout="bshd")
    except (TypeError, ValueError) as e:  # flash_attention's checks, told in this interface's argument names
        raise type(e)(f"triton attention: {_INTERFACE_NAMES.sub(lambda m: _RENAMED[m[0]], str(e))}") from e
    return out, None


# flash_attention's argument names -> the names transformers passes them by
_RENAMED = {"q": "query", "k": "key", "v": "value", "attn_mask": "attention_mask", "scale": "scaling"}
_INTERFACE_NAMES = re.compile(r"\b(?:q|k|v|attn_mask|scale)\b")
