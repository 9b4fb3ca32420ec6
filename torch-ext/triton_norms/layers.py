"""Hub layers for ``kernels.kernelize``: drop-in forwards, exact to the modules they replace.

On CUDA the row statistics are summed in the order of the replaced module's own
CUDA kernels (``torch_order``, see ``_torch_order.py``), so half-precision
outputs are bit-identical, not just within an ulp.

Each class is stateless (no ``__init__``, no methods besides ``forward``) and
reads the replaced module's own attributes. Under ``torch.autocast``, ``LayerNorm`` and
``TorchRMSNorm`` compute in the dtype PyTorch's op would (``_autocast.autocast_to``: on CUDA
``F.layer_norm`` runs in fp32); the RMSNorm modules of transformers and diffusers upcast by
themselves, and autocast changes nothing in them. Every forward is one call of the
functional API with the rounding points of the original module:

=================  ==========================================  ===================  ======================
layer              replaces                                    cast_dtype           out dtype
=================  ==========================================  ===================  ======================
LlamaRMSNorm       transformers LlamaRMSNorm family            x.dtype              promote(w, x)
Olmo2RMSNorm       Olmo2/Olmo3, GptOss, NemotronH RMSNorm      None (w * xn fp32)   x.dtype
GemmaRMSNorm       transformers GemmaRMSNorm (1 + w)           None                 x.dtype
TorchRMSNorm       torch.nn.RMSNorm                            None                 x.dtype
DiffusersRMSNorm   diffusers.models.normalization.RMSNorm      w.dtype if half      w.dtype if half, else fp32
LayerNorm          torch.nn.LayerNorm                          --                   x.dtype
=================  ==========================================  ===================  ======================

``LlamaDecoderLayer`` (transformers' Llama-form decoder layers) is the one layer that is not a norm: it runs the
module's own ``input_layernorm``, ``self_attn`` and ``mlp`` and replaces ``residual + attention output`` and
``post_attention_layernorm`` (when it runs the LlamaRMSNorm layer) by one ``add_rms_norm`` call in the mean order,
which gives the same bits on CUDA: one launch and one dispatch fewer per layer, which is host time in batch-1
decoding.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from ._autocast import autocast_to, cast
from ._common import SUPPORTED_DTYPES
from ._replaced import LayerValueError, replaced_forward
from .layer_norm import layer_norm
from .rms_norm import add_rms_norm, rms_norm

_HALF = (torch.float16, torch.bfloat16)


class LlamaRMSNorm(nn.Module):
    """RMSNorm with transformers' LlamaRMSNorm numerics (Llama, Mistral, Qwen2/3, Phi3, ...).

    ``weight * (x_f32 * rsqrt(mean(x_f32**2) + eps)).to(x.dtype)``: the normalised
    value is rounded to the input dtype, then multiplied by the weight in the
    promoted dtype of weight and input.

    Shapes:
        - hidden_states: (..., N), fp16/bf16/fp32
        - weight: (N,)
        - output: (..., N), dtype ``torch.promote_types(weight.dtype, hidden_states.dtype)``
    """

    weight: torch.Tensor
    variance_epsilon: float

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, LlamaRMSNorm)) is not None:
            return own(self, hidden_states)
        weight, dtype = self.weight, hidden_states.dtype
        return rms_norm(hidden_states, weight, eps=self.variance_epsilon, cast_dtype=dtype,
                        out_dtype=dtype if weight.dtype == dtype else torch.promote_types(weight.dtype, dtype),
                        torch_order="mean")


def _runs_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` would run any hook (``nn.Module._call_impl``'s test): its own forward, forward-pre
    and backward hooks, or global module hooks (``torch.nn.modules.module.register_module_forward_hook`` ...)."""
    hooks = torch.nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or hooks._global_forward_hooks or hooks._global_forward_pre_hooks
                or hooks._global_backward_hooks or hooks._global_backward_pre_hooks)


class LlamaDecoderLayer(nn.Module):
    """transformers' LlamaDecoderLayer (and the decoder layers of the same forward: Mistral, Qwen2, ...) with the
    residual add after attention fused into ``post_attention_layernorm``.

    ``h = residual + attn_out`` (rounded to the model dtype) and ``LlamaRMSNorm(h)`` come from one
    ``add_rms_norm(attn_out, residual, w, eps, cast_dtype=h.dtype, torch_order="mean")``: the same bits as the two
    steps on CUDA. Everything else is the module's own (``input_layernorm``, ``self_attn``, ``mlp``, and the second
    residual add). The fusion needs ``post_attention_layernorm`` to run this package's LlamaRMSNorm layer (kernelize
    swaps it there only after its class probed as a llama-family norm): otherwise (a norm left as it was, replaced
    after kernelize, or swapped for something else), where calling it would run a hook (its forward, forward-pre or
    backward hooks, global module hooks), or where the attention output and the residual differ in dtype (torch
    would promote), the layer takes the original steps.

    Shapes: hidden_states (batch, seq, hidden), fp16/bf16/fp32; the rest as the replaced module's forward.
    """

    input_layernorm: nn.Module
    self_attn: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.Tensor] = None, past_key_values=None, use_cache: Optional[bool] = False,
                position_embeddings: Optional[Tuple[torch.Tensor, torch.Tensor]] = None, **kwargs) -> torch.Tensor:
        if (hidden_states.dtype not in SUPPORTED_DTYPES
                and (own := replaced_forward(self, LlamaDecoderLayer)) is not None):
            return own(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=past_key_values, use_cache=use_cache, position_embeddings=position_embeddings,
                       **kwargs)
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        norm = self.post_attention_layernorm
        if (hidden_states.dtype != residual.dtype or _runs_hooks(norm)
                or getattr(vars(norm).get("forward"), "__func__", None) is not LlamaRMSNorm.forward):
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = norm(hidden_states)
        else:
            weight, dtype = norm.weight, residual.dtype
            hidden_states, residual = add_rms_norm(
                hidden_states, residual, weight, eps=norm.variance_epsilon, cast_dtype=dtype,
                out_dtype=dtype if weight.dtype == dtype else torch.promote_types(weight.dtype, dtype),
                torch_order="mean")
        hidden_states = self.mlp(hidden_states)
        return residual + hidden_states


class Olmo2RMSNorm(nn.Module):
    """RMSNorm that multiplies by the weight in fp32 and casts once (Olmo2/Olmo3, GptOss, NemotronH).

    ``(weight * (x_f32 * rsqrt(mean(x_f32**2) + eps))).to(x.dtype)``.

    Shapes:
        - hidden_states: (..., N), fp16/bf16/fp32
        - weight: (N,)
        - output: (..., N), dtype of hidden_states
    """

    weight: torch.Tensor
    variance_epsilon: float

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, Olmo2RMSNorm)) is not None:
            return own(self, hidden_states)
        return rms_norm(hidden_states, self.weight, eps=self.variance_epsilon, torch_order="mean")


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``(xn_f32 * (1 + weight.float())).type_as(x)``, all in fp32.

    Shapes:
        - x: (..., N), fp16/bf16/fp32
        - weight: (N,) (stored as w, applied as 1 + w)
        - output: (..., N), dtype of x
    """

    weight: torch.Tensor
    eps: float

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, GemmaRMSNorm)) is not None:
            return own(self, x)
        return rms_norm(x, self.weight, eps=self.eps, weight_offset=1.0, torch_order="mean")


class TorchRMSNorm(nn.Module):
    """``torch.nn.RMSNorm``: upcast to fp32, multiply by the weight in fp32, cast to x.dtype.

    ``eps=None`` means ``torch.finfo(torch.float32).eps`` for every supported input
    dtype: ATen takes the epsilon of the fp32 compute type (checked against the module).
    ``normalized_shape`` may span several trailing dims; they are flattened into N.

    Shapes:
        - x: (..., *normalized_shape), fp16/bf16/fp32
        - weight: normalized_shape or None
        - output: shape of x, dtype of x

    Raises:
        ValueError (also a RuntimeError, the module's type): an empty ``normalized_shape`` (``nn.RMSNorm(())``,
            which ``F.rms_norm`` refuses), or an x that does not end with ``normalized_shape``.
    """

    normalized_shape: Tuple[int, ...]
    eps: Optional[float]
    weight: Optional[torch.Tensor]

    has_backward = True
    can_torch_compile = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, TorchRMSNorm)) is not None:
            return own(self, x)
        shape = tuple(self.normalized_shape)
        if not shape:  # as F.rms_norm: no dim to normalise over (N would be 1 and every element its own row)
            raise LayerValueError("normalized_shape must have at least one dimension, got ()")
        if tuple(x.shape[x.dim() - len(shape):]) != shape or x.dim() < len(shape):
            raise LayerValueError(f"x of shape {tuple(x.shape)} does not end with normalized_shape {shape}")
        eps = torch.finfo(torch.float32).eps if self.eps is None else self.eps
        N = math.prod(shape)
        w = self.weight
        to = autocast_to("rms_norm", x)
        if to is not None:  # under autocast F.rms_norm computes in another dtype
            x, w = cast(to, x, w)
        w = w.reshape(N) if w is not None else None
        # F.rms_norm runs its fused kernel only when the weight has x's dtype; else x.pow(2).mean()
        order = "fused" if w is None or w.dtype == x.dtype else "mean"
        y = rms_norm(x.reshape(*x.shape[: x.dim() - len(shape)], N), w, eps=eps, torch_order=order)
        return y.reshape(x.shape)


class DiffusersRMSNorm(nn.Module):
    """``diffusers.models.normalization.RMSNorm`` (diffusers 0.42.1), non-NPU path.

    ``xn = x * rsqrt(mean(x_f32**2) + eps)`` in fp32; with a half (fp16/bf16)
    weight ``xn.to(w.dtype) * w`` in w.dtype, then ``+ bias`` in the promoted dtype of
    w and bias (rounded again); with an fp32 weight ``xn * w (+ bias)`` in fp32 and an **fp32 output**
    even for half inputs; without a weight ``xn.to(x.dtype)``.

    Shapes:
        - hidden_states: (..., N), fp16/bf16/fp32
        - weight: (N,) or None; bias: (N,) or None
        - output: (..., N), dtype as described above
    """

    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    eps: float

    has_backward = True
    can_torch_compile = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if (hidden_states.dtype not in SUPPORTED_DTYPES
                and (own := replaced_forward(self, DiffusersRMSNorm)) is not None):
            return own(self, hidden_states)
        w = self.weight
        if w is None:
            return rms_norm(hidden_states, eps=self.eps, torch_order="mean")
        b = getattr(self, "bias", None)
        if w.dtype in _HALF:
            if b is not None and b.dtype != w.dtype:  # the product rounds to w's dtype, then + b in the promoted one
                return rms_norm(hidden_states, w, eps=self.eps, cast_dtype=w.dtype, out_dtype=w.dtype,
                                torch_order="mean") + b
            return rms_norm(hidden_states, w, b, eps=self.eps, cast_dtype=w.dtype, out_dtype=w.dtype,
                            torch_order="mean")
        out = torch.promote_types(torch.float32, w.dtype)
        if b is not None:
            out = torch.promote_types(out, b.dtype)
        return rms_norm(hidden_states, w, b, eps=self.eps, out_dtype=out, torch_order="mean")


class LayerNorm(nn.Module):
    """``torch.nn.LayerNorm``: mean and biased variance in fp32, output in x.dtype.

    ``normalized_shape`` may span several trailing dims; they are flattened into N.
    weight and bias may be None (``elementwise_affine=False`` / ``bias=False``).

    Shapes:
        - input: (..., *normalized_shape), fp16/bf16/fp32
        - weight, bias: normalized_shape or None
        - output: shape and dtype of input

    Raises:
        ValueError (also a RuntimeError, the module's type): an empty ``normalized_shape`` (``nn.LayerNorm(())``,
            which ``F.layer_norm`` refuses), or an input that does not end with ``normalized_shape``.
    """

    normalized_shape: Tuple[int, ...]
    eps: float
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, LayerNorm)) is not None:
            return own(self, input)
        shape, w, b = self.normalized_shape, self.weight, self.bias
        to = autocast_to("layer_norm", input)
        if to is not None:  # under autocast F.layer_norm computes in another dtype (fp32 on CUDA)
            input, w, b = cast(to, input, w, b)
        if len(shape) == 1 and input.dim() >= 1 and input.shape[-1] == shape[0]:  # one dim: no reshapes (host time)
            return layer_norm(input, w, b, eps=self.eps, torch_order="fused")
        shape = tuple(shape)
        if not shape:  # as F.layer_norm: no dim to normalise over (N would be 1 and every output 0 + bias)
            raise LayerValueError("normalized_shape must have at least one dimension, got ()")
        if tuple(input.shape[input.dim() - len(shape):]) != shape or input.dim() < len(shape):
            raise LayerValueError(f"input of shape {tuple(input.shape)} does not end with normalized_shape {shape}")
        N = math.prod(shape)
        w = w.reshape(N) if w is not None else None
        b = b.reshape(N) if b is not None else None
        y = layer_norm(input.reshape(*input.shape[: input.dim() - len(shape)], N), w, b, eps=self.eps,
                       torch_order="fused")
        return y.reshape(input.shape)
