"""Which triton-norms layer reproduces a given norm module, decided by class and by a bitwise probe.

Hugging Face code has several RMSNorm *numerics* behind look-alike classes. With ``x`` the
input, ``h = x.float() * rsqrt(mean(x.float()**2) + eps)`` and ``w`` the weight:

=================  ==============================  ==========================================
family             output                           classes (examples)
=================  ==============================  ==========================================
``llama``          ``w * h.to(x.dtype)``            LlamaRMSNorm, Qwen2/3, Mistral, Phi3, ...
``fp32_weight``    ``(w * h).to(x.dtype)``          Olmo2/3, GptOss, NemotronH, DeepseekV4
``gemma``          ``(h * (1 + w.float())).type_as(x)``  Gemma/Gemma2/Gemma3, Qwen3.5 zero-centred
``torch_rms``      ``F.rms_norm(x, shape, w, eps)``  torch.nn.RMSNorm (exact type)
``layer_norm``     ``F.layer_norm(...)``             torch.nn.LayerNorm (exact type, not FP32LayerNorm)
``diffusers_rms``  ``h.to(w.dtype) * w`` (+ bias)    diffusers.models.normalization.RMSNorm
=================  ==============================  ==========================================

Activations (package ``triton-activations``, opt-in through :data:`ALL_FAMILIES`): the six
classes transformers decorates with ``use_kernel_forward_from_hub`` (``SiLUActivation``,
``GELUActivation``, ``GELUTanh``, ``NewGELUActivation``, ``FastGELUActivation``,
``QuickGELUActivation``), each to the layer of the same name that keeps its rounding points;
and transformers' gated MLPs (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: ``LlamaMLP``,
``MistralMLP``, ``Qwen2MLP``, ``GemmaMLP``, ... any class with those three projections and an
``act_fn``) to the ``LlamaMLP`` layer, which computes ``act_fn(gate) * up`` in one kernel; those
with one gate-and-up projection (``Phi3MLP``, ``GlmMLP``, ...: ``gate_up_proj``, ``down_proj``,
``activation_fn``) to the ``Phi3MLP`` layer.

In fp32 the first three coincide for ``w = 1``; in half precision with a random weight they
differ in the last bits, and one Llama-exact kernel is off by 3e-2 on the fp32-weight
family. So a class is mapped only when its own ``forward``, run on a randomised copy of
one instance with half-precision input, equals the family's reference formula *bitwise*
(:func:`probe`). The class-name lists below are only expectations: a known class whose
probe disagrees is refused, an unknown ``*RMSNorm`` class is accepted on its probe alone.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import math
import textwrap
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ACTIVATION_FAMILIES", "ALL_FAMILIES", "FAMILIES", "Family", "KERNEL_DTYPES", "LLAMA_ATTENTION",
           "LLAMA_DECODER", "ProbeResult", "STRUCTURE_FAMILIES", "candidate_families", "probe", "signature_form"]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The floating dtypes every triton-collection kernel and layer takes (the shims refuse models holding others)."""

NORMS_PACKAGE = "triton-norms"
"""Hub package (``<org>/triton-norms``) that serves the norm families."""
ACTIVATIONS_PACKAGE = "triton-activations"
"""Hub package (``<org>/triton-activations``) that serves the activation families."""
ATTENTION_PACKAGE = "triton-attention"
"""Hub package (``<org>/triton-attention``) that serves the attention family."""


def _normalise_fp32(x: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.to(torch.float32)
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def _ref_llama(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # cast the normalised value to the input dtype, then multiply by the weight
    return m.weight * _normalise_fp32(x, m.variance_epsilon).to(x.dtype)


def _ref_fp32_weight(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # multiply by the weight in fp32 (type promotion), cast once
    return (m.weight.to(torch.float32) * _normalise_fp32(x, m.variance_epsilon)).to(x.dtype)


def _ref_gemma(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (_normalise_fp32(x, m.eps) * (1.0 + m.weight.float())).type_as(x)


def _ref_torch_rms(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, m.normalized_shape, m.weight, m.eps)


def _ref_layer_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _ref_diffusers_rms(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + m.eps)
    if m.weight is None:
        return h.to(x.dtype)
    if m.weight.dtype in (torch.float16, torch.bfloat16):
        h = h.to(m.weight.dtype)
    h = h * m.weight
    return h + m.bias if m.bias is not None else h


def _ref_silu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def _ref_gelu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def _ref_gelu_tanh(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _ref_new_gelu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def _ref_fast_gelu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _ref_quick_gelu(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _ref_gated_mlp(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))


def _ref_gate_up_mlp(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up = m.gate_up_proj(x).chunk(2, dim=-1)
    return m.down_proj(up * m.activation_fn(gate))


@dataclass(frozen=True)
class Family:
    """One numerics family and the Hub layer that reproduces it.

    Attributes:
        name: short key (``"llama"``, ``"fp32_weight"``, ...).
        layer: layer name inside the Hub package's ``layers`` module.
        package: Hub package name that ships ``layer``.
        reference: pure-torch formula ``(module, x) -> y`` the module must equal bitwise.
        attrs: attributes of the replaced module that the Hub layer reads (must exist).
        known_classes: class names expected in this family (a hint; the probe decides).
        forms: where not empty, the sources of the forwards the layer reproduces: the class's ``forward`` must be
            one of them up to names, annotations and a docstring (:func:`forward_form`) before it is probed.
            For modules whose forward could hide steps that inputs of the probe's scale never reach (a clamp
            at 10, dropout in training, a branch on an attribute of another instance).
    """

    name: str
    layer: str
    package: str
    reference: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    attrs: tuple[str, ...]
    known_classes: frozenset[str] = frozenset()
    forms: tuple[str, ...] = ()


LLAMA = Family(
    "llama", "LlamaRMSNorm", NORMS_PACKAGE, _ref_llama, ("weight", "variance_epsilon"),
    frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm",
               "Phi3RMSNorm", "DeepseekV3RMSNorm", "Glm4RMSNorm", "SmolLM3RMSNorm", "GraniteRMSNorm"}),
)
FP32_WEIGHT = Family(
    "fp32_weight", "Olmo2RMSNorm", NORMS_PACKAGE, _ref_fp32_weight, ("weight", "variance_epsilon"),
    frozenset({"Olmo2RMSNorm", "Olmo3RMSNorm", "GptOssRMSNorm", "NemotronHRMSNorm", "DeepseekV4RMSNorm"}),
)
GEMMA = Family(
    "gemma", "GemmaRMSNorm", NORMS_PACKAGE, _ref_gemma, ("weight", "eps"),
    frozenset({"GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm"}),
)
TORCH_RMS = Family("torch_rms", "TorchRMSNorm", NORMS_PACKAGE, _ref_torch_rms, ("normalized_shape", "eps", "weight"))
LAYER_NORM = Family("layer_norm", "LayerNorm", NORMS_PACKAGE, _ref_layer_norm, ("normalized_shape", "eps", "weight", "bias"))
DIFFUSERS_RMS = Family("diffusers_rms", "DiffusersRMSNorm", NORMS_PACKAGE, _ref_diffusers_rms, ("weight", "bias", "eps"))

FAMILIES: tuple[Family, ...] = (LLAMA, FP32_WEIGHT, GEMMA, TORCH_RMS, LAYER_NORM, DIFFUSERS_RMS)
"""The norm families: what ``kernelize`` maps by default, in probe order."""


def _activation(name: str, layer: str, ref, attrs: tuple[str, ...] = ()) -> Family:
    return Family(name, layer, ACTIVATIONS_PACKAGE, ref, attrs, frozenset({layer}))


# transformers' decorator name -> family; each Hub layer is named after the class it replaces
_HF_ACTIVATIONS = {
    "SiLU": _activation("silu", "SiLUActivation", _ref_silu),
    "GeLU": _activation("gelu", "GELUActivation", _ref_gelu, ("act",)),
    "GeluTanh": _activation("gelu_tanh", "GELUTanh", _ref_gelu_tanh, ("act",)),
    "NewGELU": _activation("new_gelu", "NewGELUActivation", _ref_new_gelu),
    "FastGELU": _activation("fast_gelu", "FastGELUActivation", _ref_fast_gelu),
    "QuickGELU": _activation("quick_gelu", "QuickGELUActivation", _ref_quick_gelu),
}
GATED_MLP = Family("gated_mlp", "LlamaMLP", ACTIVATIONS_PACKAGE, _ref_gated_mlp,
                   ("gate_proj", "up_proj", "down_proj", "act_fn"),
                   frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP"}),
                   forms=("def forward(self, x):\n"
                          "    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n"
                          "    return down_proj\n",
                          "def forward(self, x):\n"
                          "    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))\n",
                          "def forward(self, x):\n"
                          "    gate = self.act_fn(self.gate_proj(x))\n"
                          "    return self.down_proj(gate * self.up_proj(x))\n"))
"""transformers' gated MLPs: ``act_fn(gate) * up`` in one kernel, the projections the module's own."""
GATE_UP_MLP = Family("gate_up_mlp", "Phi3MLP", ACTIVATIONS_PACKAGE, _ref_gate_up_mlp,
                     ("gate_up_proj", "down_proj", "activation_fn"),
                     frozenset({"Phi3MLP", "Phi4MultimodalMLP", "GlmMLP", "Glm4MLP"}),
                     forms=("def forward(self, x):\n"
                            "    up_states = self.gate_up_proj(x)\n"
                            "    gate, up_states = up_states.chunk(2, dim=-1)\n"
                            "    up_states = up_states * self.activation_fn(gate)\n"
                            "    return self.down_proj(up_states)\n",))
"""transformers' gated MLPs with one gate-and-up projection (Phi-3, GLM): ``up * activation_fn(gate)`` in one
kernel."""
ACTIVATION_FAMILIES: tuple[Family, ...] = (*_HF_ACTIVATIONS.values(), GATED_MLP, GATE_UP_MLP)
"""transformers' decorated activation classes and gated MLPs (``kernelize(..., families=ALL_FAMILIES)``)."""


def _ref_by_form(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("a decoder layer or an attention is classified by its form and probes of its parts, "
                              "not run")


LLAMA_DECODER = Family(
    "llama_decoder", "LlamaDecoderLayer", NORMS_PACKAGE, _ref_by_form,
    ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"),
    frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"}),
    forms=("def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,\n"
           "            use_cache=False, position_embeddings=None, **kwargs):\n"
           "    residual = hidden_states\n"
           "    hidden_states = self.input_layernorm(hidden_states)\n"
           "    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,\n"
           "        position_ids=position_ids, past_key_values=past_key_values, use_cache=use_cache,\n"
           "        position_embeddings=position_embeddings, **kwargs)\n"
           "    hidden_states = residual + hidden_states\n"
           "    residual = hidden_states\n"
           "    hidden_states = self.post_attention_layernorm(hidden_states)\n"
           "    hidden_states = self.mlp(hidden_states)\n"
           "    hidden_states = residual + hidden_states\n"
           "    return hidden_states\n",))
"""transformers' Llama-form decoder layers (transformers 5.x): the residual add after attention and
``post_attention_layernorm`` in one ``add_rms_norm``; mapped where the class's forward is this one (up to
annotations and a docstring) and its ``post_attention_layernorm`` probes as the ``llama`` family."""
LLAMA_ATTENTION = Family(
    "llama_attention", "LlamaAttention", ATTENTION_PACKAGE, _ref_by_form,
    ("q_proj", "k_proj", "v_proj", "o_proj", "config", "head_dim", "layer_idx", "scaling", "attention_dropout"),
    frozenset({"LlamaAttention"}),
    forms=("def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,\n"
           "            **kwargs):\n"
           "    input_shape = hidden_states.shape[:-1]\n"
           "    hidden_shape = (*input_shape, -1, self.head_dim)\n"
           "    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
           "    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
           "    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)\n"
           "    cos, sin = position_embeddings\n"
           "    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)\n"
           "    if past_key_values is not None:\n"
           "        key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)\n"
           "    attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(\n"
           "        self.config._attn_implementation, eager_attention_forward)\n"
           "    attn_output, attn_weights = attention_interface(self, query_states, key_states, value_states,\n"
           "        attention_mask, dropout=0.0 if not self.training else self.attention_dropout,\n"
           "        scaling=self.scaling, **kwargs)\n"
           "    attn_output = attn_output.reshape(*input_shape, -1).contiguous()\n"
           "    attn_output = self.o_proj(attn_output)\n"
           "    return attn_output, attn_weights\n",))
"""transformers' Llama-form attention (transformers 5.x): the rotary embedding in one kernel; mapped where the
class's forward is this one (up to annotations and a docstring) and the ``apply_rotary_pos_emb`` it calls computes
Llama's formula bit for bit (:func:`_rotary_mismatch`)."""
STRUCTURE_FAMILIES: tuple[Family, ...] = (LLAMA_DECODER, LLAMA_ATTENTION)
"""Layers that fuse steps across a model's modules (``kernelize(..., families=ALL_FAMILIES)``)."""
ALL_FAMILIES: tuple[Family, ...] = FAMILIES + ACTIVATION_FAMILIES + STRUCTURE_FAMILIES
"""Norms, activations, gated MLPs, decoder layers and attentions."""

_HF_RMS_FAMILIES = (LLAMA, FP32_WEIGHT, GEMMA)
_HF_KERNEL_LAYER_NAMES = {"RMSNorm", "RMSNormZeroCentered"}  # transformers' decorator names


def _is_diffusers_rms_norm(cls: type) -> bool:
    return cls.__module__ == "diffusers.models.normalization" and cls.__qualname__ == "RMSNorm"


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, a, None), nn.Linear) for a in ("gate_proj", "up_proj", "down_proj")) \
        and isinstance(getattr(module, "act_fn", None), nn.Module)


def _is_gate_up_mlp(module: nn.Module) -> bool:
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gate_up, nn.Linear) and isinstance(down, nn.Linear) \
        and gate_up.out_features == 2 * down.in_features and isinstance(getattr(module, "activation_fn", None), nn.Module)


def candidate_families(module: nn.Module) -> tuple[Family, ...]:
    """Families a module *might* belong to, from its class alone (empty: not a norm we serve).

    ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` / diffusers' ``RMSNorm`` count only as their exact
    type: subclasses such as diffusers' ``FP32LayerNorm`` change the numerics.
    """
    cls = type(module)
    if cls is nn.LayerNorm:
        return (LAYER_NORM,)
    if cls is nn.RMSNorm:
        return (TORCH_RMS,)
    if _is_diffusers_rms_norm(cls):
        return (DIFFUSERS_RMS,)
    if _is_gated_mlp(module):
        return (GATED_MLP,)
    if all(isinstance(getattr(module, a, None), nn.Module) for a in LLAMA_DECODER.attrs):
        return (LLAMA_DECODER,)
    if all(isinstance(getattr(module, a, None), nn.Module) for a in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return (LLAMA_ATTENTION,)
    if _is_gate_up_mlp(module):
        return (GATE_UP_MLP,)
    # `kernel_layer_name` is read from the class dict of the transformers-decorated class only.
    layer_name = cls.__dict__.get("kernel_layer_name")
    if cls.__module__ == "transformers.activations":  # decorated or not (USE_HUB_KERNELS=0)
        return tuple(f for f in ACTIVATION_FAMILIES if cls.__name__ in f.known_classes)
    if layer_name in _HF_ACTIVATIONS:  # a model's own class decorated with an activation name
        return (_HF_ACTIVATIONS[layer_name],)
    decorated = layer_name in _HF_KERNEL_LAYER_NAMES
    if decorated or "rmsnorm" in cls.__name__.lower():
        return _HF_RMS_FAMILIES
    if cls.__module__.startswith("transformers.") and "layernorm" in cls.__name__.lower():
        return (LAYER_NORM,)  # a model's own LayerNorm (Cohere, OLMo, Nemotron): swapped if the probe finds it exact
    return ()


def _plain_def(source: str) -> tuple:
    """``(the undecorated function definition of source, its body without the docstring)``, or ``(None, None)``."""
    tree = ast.parse(textwrap.dedent(source))
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        return None, None
    body = fn.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    return fn, body


def forward_form(source: str) -> str | None:
    """The shape of a one-tensor ``forward``'s source: its body's syntax tree with the docstring dropped, the two
    parameters named ``self`` and ``x`` and every other name numbered in order of appearance (annotations are not
    part of it); None for anything but a plain ``def`` of two positional parameters."""
    fn, body = _plain_def(source)
    if fn is None or fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs \
            or len(fn.args.args) != 2:
        return None
    names = {fn.args.args[0].arg: "self", fn.args.args[1].arg: "x"}

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.Name(id=names.setdefault(node.id, f"v{len(names)}"), ctx=node.ctx)

    return ast.dump(ast.Module(body=[Rename().visit(s) for s in body], type_ignores=[]), annotate_fields=False)


class _DropAnnotation(ast.NodeTransformer):
    """``x: T = v`` -> ``x = v`` (the same statement at run time); a declaration without a value stays."""

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            return node
        return ast.Assign(targets=[node.target], value=node.value, type_comment=None)


def signature_form(source: str) -> str | None:
    """The shape of a ``forward``'s whole definition (parameters, defaults and body; names kept) without its
    docstring and annotations (of parameters and of assignments with a value); None for anything but an
    undecorated ``def``, or for a body with an annotation without a value (not normalised)."""
    fn, body = _plain_def(source)
    if fn is None:
        return None
    args = fn.args
    for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if a is not None:
            a.annotation = None
    body = [_DropAnnotation().visit(s) for s in body]
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.AnnAssign):
            return None
    return ast.dump(ast.Module(body=[ast.FunctionDef(name="forward", args=args, body=body, decorator_list=[],
                                                     returns=None, type_comment=None, type_params=[])],
                               type_ignores=[]), annotate_fields=False)


def _llama_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """The formula ``RotaryPosEmb`` reproduces bit for bit: transformers' Llama ``apply_rotary_pos_emb``
    (``x * cos + rotate_half(x) * sin``, ``rotate_half(x) = cat(-x2, x1)``, each op in the promoted dtype)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rotary_mismatch(fn: torch.nn.Module, seed: int = 0) -> str | None:
    """Why the function module ``fn`` is not one ``RotaryPosEmb`` replaces exactly, or None: its own forward (the
    class's, not a kernelized one) against :func:`_llama_rotary` on random q [1, 4, 8, 16], k [1, 2, 8, 16] and
    Llama-form cos / sin [1, 8, 16] (angles repeated over the two halves), in fp32, fp16 and bf16 and with fp16 /
    bf16 q and k against fp32 cos / sin: output dtypes, shapes and every bit must agree; and a cos / sin half as
    wide as q must fail, as in Llama's formula (a partial rotary, Bamba's, takes it). 13 of transformers
    5.22's 97 functions differ (NanoChat's opposite rotation, GPT-OSS's half-width cos, ESM's and ModernBERT's
    fp32 math, OLMo's cast back to q's dtype). ``fn`` may also be a plain function (Bamba's is)."""
    forward = type(fn).forward if isinstance(fn, nn.Module) else lambda _, *args: fn(*args)  # or a plain function
    gen = torch.Generator().manual_seed(seed)
    for dtype, trig_dtype in ((torch.float32,) * 2, (torch.float16,) * 2, (torch.bfloat16,) * 2,
                              (torch.float16, torch.float32), (torch.bfloat16, torch.float32)):
        q, k = torch.randn(1, 4, 8, 16, generator=gen).to(dtype), torch.randn(1, 2, 8, 16, generator=gen).to(dtype)
        angles = (torch.rand(1, 8, 8, generator=gen) * 6).repeat(1, 1, 2)
        cos, sin = angles.cos().to(trig_dtype), angles.sin().to(trig_dtype)
        want = _llama_rotary(q, k, cos, sin)
        try:
            got = forward(fn, q, k, cos, sin)
        except Exception as err:  # noqa: BLE001 -- any failure of the probe call is a refusal, reported
            return f"its forward fails on Llama-form inputs ({dtype}, cos {trig_dtype}): {type(err).__name__}: {err}"
        if not (isinstance(got, (tuple, list)) and len(got) == 2
                and all(isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape
                        and torch.equal(g, w) for g, w in zip(got, want))):
            return (f"its values differ from Llama's apply_rotary_pos_emb ({dtype} q/k, {trig_dtype} cos/sin), "
                    "which RotaryPosEmb reproduces")
    # a cos / sin narrower than q: Llama's formula cannot broadcast it, a partial rotary (Bamba's) rotates part of q
    q, k = torch.randn(1, 4, 8, 16, generator=gen), torch.randn(1, 2, 8, 16, generator=gen)
    angles = (torch.rand(1, 8, 4, generator=gen) * 6).repeat(1, 1, 2)
    try:
        forward(fn, q, k, angles.cos(), angles.sin())
    except Exception:  # noqa: BLE001 - as Llama's formula
        return None
    return "it takes a cos / sin narrower than q (a partial rotary), which RotaryPosEmb does not"


@functools.lru_cache(maxsize=None)
def _class_signature_form(forward) -> str | None:
    try:
        return signature_form(inspect.getsource(forward))
    except (OSError, TypeError, SyntaxError, IndexError):
        return None


@functools.lru_cache(maxsize=None)
def _signature_forms(family: Family) -> frozenset:
    return frozenset(signature_form(f) for f in family.forms)


def _has_signature_form(module: nn.Module, family: Family) -> bool:
    """Whether ``module``'s class forward is one of ``family``'s forms, whole definition compared
    (:func:`signature_form`): the structure families' test."""
    return _class_signature_form(type(module).forward) in _signature_forms(family)


def _probe_decoder(module: nn.Module) -> ProbeResult:
    """A Llama-form decoder layer: its class's forward is the family's form, and its ``post_attention_layernorm``
    probes as the ``llama`` norm (whose numerics the fused ``add_rms_norm`` reproduces)."""
    if not _has_signature_form(module, LLAMA_DECODER):
        return ProbeResult(None, "its forward is not the Llama decoder layer's that the LlamaDecoderLayer layer "
                                 "reproduces")
    norm = probe(module.post_attention_layernorm, (LLAMA,))
    if norm.family is not LLAMA:
        return ProbeResult(None, f"its post_attention_layernorm is not a LlamaRMSNorm-family norm ({norm.reason})")
    return ProbeResult(LLAMA_DECODER, "its forward is the Llama decoder layer's and its post_attention_layernorm "
                                      "probes as llama")


def _probe_attention(module: nn.Module) -> ProbeResult:
    """A Llama-form attention: its class's forward is the family's form, the module has what the layer reads, and
    the ``apply_rotary_pos_emb`` that forward calls (its module's) computes Llama's formula bit for bit."""
    forward = type(module).forward
    if not _has_signature_form(module, LLAMA_ATTENTION):
        return ProbeResult(None, "its forward is not the Llama attention's that the LlamaAttention layer reproduces")
    missing = _missing_attrs(module, LLAMA_ATTENTION)
    if missing:
        return ProbeResult(None, f"it lacks attributes the LlamaAttention layer reads ({', '.join(missing)})")
    names = getattr(forward, "__globals__", {})
    absent = [n for n in ("ALL_ATTENTION_FUNCTIONS", "eager_attention_forward", "apply_rotary_pos_emb")
              if n not in names]
    if absent:
        return ProbeResult(None, f"its forward's module has no {', '.join(absent)}")
    why = _rotary_mismatch(names["apply_rotary_pos_emb"])
    if why is not None:
        return ProbeResult(None, f"the apply_rotary_pos_emb its forward calls is not Llama's: {why}")
    return ProbeResult(LLAMA_ATTENTION, "its forward is the Llama attention's and its apply_rotary_pos_emb is Llama's")


_STRUCTURE_PROBES = {LLAMA_DECODER: _probe_decoder, LLAMA_ATTENTION: _probe_attention}


@functools.lru_cache(maxsize=None)
def _class_forward_form(forward) -> str | None:
    try:
        return forward_form(inspect.getsource(forward))
    except (OSError, TypeError, SyntaxError, IndexError):  # no source (built in, compiled, interactive)
        return None


@functools.lru_cache(maxsize=None)
def _family_forms(family: Family) -> frozenset:
    return frozenset(forward_form(f) for f in family.forms)


def _form_matches(module: nn.Module, family: Family) -> bool:
    return not family.forms or _class_forward_form(type(module).forward) in _family_forms(family)


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of :func:`probe`: the matching family, or ``None`` and why not."""

    family: Family | None
    reason: str


def _structure_problem(module: nn.Module) -> str | None:
    """Why ``module`` cannot be probed or served at all, or ``None``."""
    params = [p for p in inspect.signature(type(module).forward).parameters.values()][1:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) != 1 or params[0].kind not in positional:
        return f"forward{inspect.signature(type(module).forward)} does not take exactly one tensor"
    if any(p.is_meta for p in module.parameters()):
        return "its parameters are on the meta device"
    return None


def _missing_attrs(module: nn.Module, family: Family) -> list[str]:
    missing = [a for a in family.attrs if not hasattr(module, a)]
    if family in _HF_RMS_FAMILIES and not missing:
        if not isinstance(module.weight, torch.Tensor) or module.weight.dim() != 1:
            missing.append("1-D weight")
    return missing


def _feature_shape(module: nn.Module) -> tuple[int, ...]:
    """The trailing dims a probe input needs: the normalized shape (one or several dims: torch's LayerNorm and
    RMSNorm layers flatten several), a gated MLP's hidden size, any width for an elementwise activation."""
    if _is_gated_mlp(module):
        return (module.gate_proj.in_features,)
    if _is_gate_up_mlp(module):
        return (module.gate_up_proj.in_features,)
    if module.__class__.__dict__.get("kernel_layer_name") in _HF_ACTIVATIONS or not hasattr(module, "weight"):
        return (64,)  # an elementwise activation: any width
    shape = getattr(module, "normalized_shape", None) or getattr(module, "dim", None)
    if shape is not None:
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        if len(shape) != 1 and type(module) not in (nn.LayerNorm, nn.RMSNorm):
            raise ValueError(f"normalises over {len(shape)} dims; only the last dim is served")
        return shape
    return (module.weight.shape[0],)


@torch.no_grad()
def probe(module: nn.Module, families: tuple[Family, ...] | None = None, *, seed: int = 0) -> ProbeResult:
    """Find the family whose reference formula equals ``type(module).forward`` bitwise.

    A deep copy of ``module`` gets random parameters (vectors ``1 + 0.5 * randn``, so that ``w`` and
    ``1 + w`` differ and the weight multiply rounds; matrices ``randn / sqrt(fan_in)``, so that a
    gated MLP's values stay finite in fp16); the class's own ``forward`` (not an
    already-kernelized instance forward, not hooks) runs on random input of shape
    (3, 5, *features) in fp16 and, if different, in the module's parameter dtype, then with fp16 input and
    fp32 parameters and with fp32 input and bf16 parameters (runs whose forward refuses mixed dtypes
    are skipped), on the module's device. A family matches when output dtype, shape and every bit
    agree in all runs.

    Args:
        module: an instance of the class to classify (left untouched).
        families: candidates; default :func:`candidate_families`.
        seed: seed of the probe's random numbers.

    Returns:
        the single matching family, or ``family=None`` with the reason (no match, several
        matches, or a structural problem such as extra forward arguments).
    """
    families = candidate_families(module) if families is None else families
    if not families:
        return ProbeResult(None, "not a class the collection's layers serve")
    if len(families) == 1 and families[0] in _STRUCTURE_PROBES:  # classified by form and probes of their parts
        return _STRUCTURE_PROBES[families[0]](module)
    problem = _structure_problem(module)
    if problem is not None:
        return ProbeResult(None, problem)
    lacking = {f.name: _missing_attrs(module, f) for f in families}
    families = tuple(f for f in families if not lacking[f.name])
    if not families:
        detail = "; ".join(f"{name} layer needs {', '.join(attrs)}" for name, attrs in lacking.items())
        return ProbeResult(None, f"it lacks attributes the layers read ({detail})")
    formed = tuple(f for f in families if _form_matches(module, f))
    if not formed:
        return ProbeResult(None, f"its forward is not one the {', '.join(f.layer for f in families)} layer "
                                 "reproduces (steps beyond the formula: a clamp, dropout, a scale, a branch)")
    families = formed
    try:
        features = _feature_shape(module)
    except ValueError as err:
        return ProbeResult(None, str(err))

    params = list(module.parameters())
    device = params[0].device if params else torch.device("cpu")
    own_dtype = params[0].dtype if params else torch.float32
    dtypes = [torch.float16] + ([own_dtype] if own_dtype != torch.float16 else [])
    gen = torch.Generator().manual_seed(seed)
    forward = type(module).forward

    matches = list(families)
    # same-dtype runs, then an input of another dtype than the parameters (autocast, an fp32 weight under bf16
    # activations): formulas that agree when the dtypes agree (Llama's w * h.to(x.dtype) and one that casts h to
    # the weight's dtype, e.g. IdeficsRMSNorm) part there; a forward that refuses mixed dtypes skips those runs
    runs = [(dtype, dtype) for dtype in dtypes] + [(torch.float16, torch.float32), (torch.float32, torch.bfloat16)]
    for dtype, param_dtype in runs:
        mixed = dtype != param_dtype
        twin = copy.deepcopy(module).to(param_dtype)
        for p in twin.parameters():
            r = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.5 * r if p.dim() < 2 else r / p.shape[-1] ** 0.5)  # matrices: unit-scale outputs
        x = torch.randn((3, 5, *features), generator=gen).to(device=device, dtype=dtype)
        with warnings.catch_warnings():  # torch's "Mismatch dtype ... fused implementation" of mixed runs
            warnings.simplefilter("ignore")
            try:
                out = forward(twin, x)
            except Exception as err:  # noqa: BLE001 - any failure means "cannot classify"
                if mixed:
                    continue
                return ProbeResult(None, f"its forward failed on a {dtype} probe: {err!r}")
            refs = {}
            for family in matches:
                try:
                    refs[family.name] = family.reference(twin, x)
                except Exception:  # noqa: BLE001 - e.g. a non-float eps: not this family
                    pass
        if mixed:
            dtype = f"{dtype} input with {param_dtype} parameters"
        still = []
        for family in matches:
            ref = refs.get(family.name)
            if ref is None:
                continue
            if ref.dtype == out.dtype and ref.shape == out.shape and torch.equal(ref, out):
                still.append(family)
        matches = still
        if not matches:
            tried = ", ".join(f.name for f in families)
            return ProbeResult(None, f"its {dtype} output matches no family bitwise (tried {tried})")
    if len(matches) > 1:
        return ProbeResult(None, f"ambiguous: matches {', '.join(f.name for f in matches)}")
    family = matches[0]
    expected = [f for f in families if type(module).__name__ in f.known_classes]
    if expected and expected[0] is not family:
        return ProbeResult(None, f"known as {expected[0].name} but its probe matches {family.name}")
    return ProbeResult(family, f"probe matches {family.name} bitwise in {', '.join(map(str, dtypes))} "
                               "(and with mixed input and parameter dtypes where the forward takes them)")
