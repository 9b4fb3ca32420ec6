"""Every public op and Hub layer of the collection as data, for the reliability suites.

The reliability tests (``test_reliability_*.py``) do not name ops one by one: they walk
``CATALOG``, which maps each package's conftest fixture name to an :class:`Entry`:

* ``ops(pkg)``: one or more :class:`OpSample` per public function (``__all__``), each a
  callable over freshly generated tensors plus the indices of the inputs that take a
  gradient;
* ``layers(pkg)``: one :class:`LayerSample` per class of ``layers.py``: the module the
  layer replaces (its attributes are what the layer reads) and inputs;
* ``skip``: ``__all__`` names that are not ops (config pickers, ``layers``).

``test_reliability_coverage`` fails when a public name or a layer of a package has no
sample, so a new op cannot silently escape opcheck, compile, CUDA-graph and stream tests.

Extension point: a package added later (triton-attention) calls :func:`register` from a
module of its own tests (or here) with its fixture name and two sample builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

Tensor = torch.Tensor


@dataclass
class OpSample:
    """``fn(*make(device, dtype))``: one call of a public function.

    ``grad``: indices of the inputs that get ``requires_grad`` in training checks (empty:
    forward-only, e.g. the ``(out, x)`` form). ``out_arg``: index of a preallocated output
    the call writes into (its content is poisoned first). ``dtypes``: the dtypes to try.
    """

    name: str
    fn: Callable[..., Tensor]
    make: Callable[[str, torch.dtype], Tuple[Tensor, ...]]
    grad: Sequence[int] = ()
    out_arg: int = -1
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16)
    covers: str = ""  # the public name this sample exercises (default: name up to the first '[')

    @property
    def public(self) -> str:
        return self.covers or self.name.split("[")[0]


@dataclass
class LayerSample:
    """``layer_cls.forward(module, *make(device, dtype))``, as ``kernels.kernelize`` runs it."""

    name: str  # the class name in layers.py
    module: Callable[[str, torch.dtype], nn.Module]
    make: Callable[[str, torch.dtype], Tuple[Tensor, ...]]
    grad: Sequence[int] = (0,)
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16)


@dataclass
class Entry:
    ops: Callable[[object], List[OpSample]]
    layers: Callable[[object], List[LayerSample]]
    skip: Tuple[str, ...] = ("layers", "LaunchConfig", "pick_config")


CATALOG: Dict[str, Entry] = {}


def register(fixture: str, ops: Callable[[object], List[OpSample]], layers: Callable[[object], List[LayerSample]],
             skip: Tuple[str, ...] = ("layers", "LaunchConfig", "pick_config")) -> None:
    """Adds a package (by its conftest fixture name) to every reliability suite."""
    CATALOG[fixture] = Entry(ops, layers, skip)


def randn(shape, device, dtype, scale=1.0):
    return (torch.randn(shape, device=device) * scale).to(dtype)


# ----------------------------------------------------------------------------- triton-norms

N_NORM = 37  # odd, not a power of 2


def _norm_ops(pkg) -> List[OpSample]:
    def x_w_b(device, dtype):
        return randn((3, 5, N_NORM), device, dtype), randn(N_NORM, device, dtype), randn(N_NORM, device, dtype)

    def x_sc_sh_w_b(device, dtype):  # adaLN: scale/shift per sample ([B, N] and [B, 1, N])
        return (randn((3, 5, N_NORM), device, dtype), randn((3, N_NORM), device, dtype),
                randn((3, 1, N_NORM), device, dtype), randn(N_NORM, device, dtype), randn(N_NORM, device, dtype))

    def x_r_w_b(device, dtype):
        return (randn((3, 5, N_NORM), device, dtype), randn((3, 5, N_NORM), device, dtype),
                randn(N_NORM, device, dtype), randn(N_NORM, device, dtype))

    return [
        OpSample("rms_norm", lambda x, w, b: pkg.rms_norm(x, w, None, 1e-6), x_w_b, grad=(0, 1)),
        OpSample("rms_norm[bias,mean]", lambda x, w, b: pkg.rms_norm(x, w, b, 1e-5, torch_order="mean"), x_w_b,
                 grad=(0, 1, 2)),
        OpSample("rms_norm[gemma,fused]", lambda x, w, b: pkg.rms_norm(x, w, eps=1e-6, weight_offset=1.0,
                                                                       cast_dtype=x.dtype, torch_order="fused"),
                 x_w_b, grad=(0, 1)),
        OpSample("layer_norm", lambda x, w, b: pkg.layer_norm(x, w, b, 1e-5), x_w_b, grad=(0, 1, 2)),
        OpSample("layer_norm[fused]", lambda x, w, b: pkg.layer_norm(x, w, b, 1e-5, torch_order="fused"), x_w_b,
                 grad=(0, 1, 2)),
        OpSample("add_rms_norm", lambda x, r, w, b: pkg.add_rms_norm(x, r, w, None, 1e-6), x_r_w_b, grad=(0, 1, 2)),
        OpSample("add_rms_norm[llama,mean]", lambda x, r, w, b: pkg.add_rms_norm(x, r, w, None, 1e-6,
                                                                                  cast_dtype=x.dtype,
                                                                                  torch_order="mean"),
                 x_r_w_b, grad=(0, 1, 2)),
        OpSample("add_layer_norm", lambda x, r, w, b: pkg.add_layer_norm(x, r, w, b, 1e-5), x_r_w_b,
                 grad=(0, 1, 2, 3)),
        OpSample("norm_modulate", lambda x, sc, sh, w, b: pkg.norm_modulate(x, sc, sh, w, b, 1e-6), x_sc_sh_w_b,
                 grad=(0, 1, 2, 3, 4)),
        OpSample("norm_modulate[rms,eager]", lambda x, sc, sh, w, b: pkg.norm_modulate(
            x, sc, sh, eps=1e-6, norm="rms", eager_rounding=True), x_sc_sh_w_b, grad=(0, 1, 2)),
        OpSample("gated_residual", lambda x, r, w, b: pkg.gated_residual(x, r, w), x_r_w_b, grad=(0, 1, 2)),
        OpSample("gated_residual[per-sample gate, fp32 out]", lambda x, sc, sh, w, b: pkg.gated_residual(
            x, sc[:, None, :].expand(x.shape), sh, out_dtype=torch.float32), x_sc_sh_w_b, grad=(0, 1, 2)),
    ]


def _hf_norm(name):
    import transformers.models as m

    return {"LlamaRMSNorm": m.llama.modeling_llama.LlamaRMSNorm, "Olmo2RMSNorm": m.olmo2.modeling_olmo2.Olmo2RMSNorm,
            "GemmaRMSNorm": m.gemma.modeling_gemma.GemmaRMSNorm}[name]


def _randomised(module: nn.Module, device, dtype) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * 0.5 + 1.0)
    return module.to(device=device, dtype=dtype)


def _diffusers_rms_norm(device, dtype):
    from diffusers.models.normalization import RMSNorm

    return _randomised(RMSNorm(N_NORM, eps=1e-6, elementwise_affine=True, bias=True), device, dtype)


D_MODEL = 48  # the decoder layer's hidden size: 4 heads of 12, 2 key/value heads
COMPOSITE_LAYERS = {"layers.LlamaDecoderLayer", "layers.LlamaAttention"}
"""Layers that run the replaced module's own submodules (attention, MLP): under functorch those are PyTorch's own
decompositions, which differ from autograd in the last bits (transformers' layer alone: 1.4e-6), so transforms of
them are compared within tolerance, not bit for bit."""


def _llama_decoder_layer(pkg, device, dtype):
    """transformers' LlamaDecoderLayer with random weights (norm weights around 1), its post_attention_layernorm
    running the package's LlamaRMSNorm layer as kernelize leaves it (the decoder layer fuses only then)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = LlamaConfig(hidden_size=D_MODEL, intermediate_size=D_ACT, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=8, attn_implementation="eager")  # plain ops: exact under
    # functorch and compile (a standalone layer has no model to pick the attention for it)
    layer = LlamaDecoderLayer(config, layer_idx=0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape) * 0.5 + 1.0 if p.dim() == 1 else torch.randn(p.shape) / p.shape[-1] ** 0.5)
    norm = layer.post_attention_layernorm
    norm.forward = MethodType(pkg.layers.LlamaRMSNorm.forward, norm)
    return layer.to(device=device, dtype=dtype)


def _decoder_inputs(device, dtype):
    """(hidden_states, attention_mask, position_ids, past_key_values, use_cache, position_embeddings): 5 tokens,
    no mask, the rotary (cos, sin) of positions 0..4."""
    inv = 1.0 / 10000 ** (torch.arange(0, 12, 2).float() / 12)
    angles = torch.arange(5).float()[:, None] * inv[None, :]
    emb = torch.cat((angles, angles), dim=-1)[None]
    return (randn((1, 5, D_MODEL), device, dtype), None, None, None, False,
            (emb.cos().to(device, dtype), emb.sin().to(device, dtype)))


def _norm_layers(pkg) -> List[LayerSample]:
    x = lambda device, dtype: (randn((2, 3, N_NORM), device, dtype),)  # noqa: E731
    return [
        LayerSample("LlamaDecoderLayer", lambda d, t: _llama_decoder_layer(pkg, d, t), _decoder_inputs),
        LayerSample("LlamaRMSNorm", lambda d, t: _randomised(_hf_norm("LlamaRMSNorm")(N_NORM, eps=1e-6), d, t), x),
        LayerSample("Olmo2RMSNorm", lambda d, t: _randomised(_hf_norm("Olmo2RMSNorm")(N_NORM, eps=1e-6), d, t), x),
        LayerSample("GemmaRMSNorm", lambda d, t: _randomised(_hf_norm("GemmaRMSNorm")(N_NORM, eps=1e-6), d, t), x),
        LayerSample("TorchRMSNorm", lambda d, t: _randomised(nn.RMSNorm(N_NORM, eps=1e-6), d, t), x),
        LayerSample("DiffusersRMSNorm", _diffusers_rms_norm, x),
        LayerSample("LayerNorm", lambda d, t: _randomised(nn.LayerNorm(N_NORM), d, t), x),
    ]


register("norms", _norm_ops, _norm_layers)


# ----------------------------------------------------------------------------- triton-activations

ACT_PLAIN = ["silu", "gelu", "gelu_tanh", "gelu_new", "gelu_fast", "gelu_quick"]
ACT_GATED = ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul"]
D_ACT = 23  # half width of gated inputs: odd


def _act_ops(pkg) -> List[OpSample]:
    samples = []
    for name in ACT_PLAIN + ACT_GATED:
        f = getattr(pkg, name)
        gated = name in ACT_GATED
        width = 2 * D_ACT if gated else D_ACT

        def make(device, dtype, width=width):
            return (randn((2, 3, width), device, dtype, 2.0),)

        def make_out(device, dtype, width=width, gated=gated):
            x = randn((2, 3, width), device, dtype, 2.0)
            out = torch.full((2, 3, width // 2 if gated else width), float("nan"), device=device, dtype=dtype)
            return out, x

        samples.append(OpSample(name, (lambda x, f=f: f(x)), make, grad=(0,)))
        samples.append(OpSample(f"{name}[eager]", (lambda x, f=f: f(x, rounding="eager")), make, grad=(0,)))
        samples.append(OpSample(f"{name}[out]", (lambda out, x, f=f: f(out, x)), make_out, out_arg=0))

    def gate_up(device, dtype):  # up transposed: two tensors of one shape, their own strides
        return randn((2, 3, D_ACT), device, dtype, 2.0), randn((D_ACT, 3, 2), device, dtype).permute(2, 1, 0)

    for activation in ("silu", "gelu", "gelu_tanh"):
        samples.append(OpSample(f"act_and_mul[{activation}]",
                                (lambda g, u, a=activation: pkg.act_and_mul(g, u, activation=a)), gate_up,
                                grad=(0, 1)))
    return samples


class _Gated(nn.Module):
    """Stands for kernels-community's stateless gated modules (FatreluAndMul reads ``threshold``)."""

    def __init__(self, threshold: float = 0.0):
        super().__init__()
        self.threshold = threshold


def _hf_act(name, **kwargs):
    from transformers import activations

    return getattr(activations, name)(**kwargs)


def _act_layers(pkg) -> List[LayerSample]:
    gated = lambda device, dtype: (randn((2, 3, 2 * D_ACT), device, dtype, 2.0),)  # noqa: E731
    plain = lambda device, dtype: (randn((2, 3, D_ACT), device, dtype, 2.0),)  # noqa: E731
    out = [LayerSample(n, lambda d, t: _Gated(), gated) for n in
           ("SiluAndMul", "MulAndSilu", "GeluAndMul", "GeluTanhAndMul")]
    out.append(LayerSample("FatreluAndMul", lambda d, t: _Gated(0.25), gated))
    out += [LayerSample(n, lambda d, t: _Gated(), plain) for n in
            ("FastGELU", "NewGELU", "QuickGELU", "Silu", "Gelu", "GeluTanh")]
    out += [LayerSample(n, (lambda d, t, n=n: _hf_act(n)), plain) for n in
            ("SiLUActivation", "GELUActivation", "GELUTanh", "NewGELUActivation", "FastGELUActivation",
             "QuickGELUActivation")]
    hidden = lambda device, dtype: (randn((2, 3, N_HIDDEN), device, dtype),)  # noqa: E731
    out.append(LayerSample("LlamaMLP", _gated_mlp("llama.modeling_llama.LlamaMLP"), hidden))
    out.append(LayerSample("Phi3MLP", _gated_mlp("phi3.modeling_phi3.Phi3MLP"), hidden))
    return out


N_HIDDEN = 19  # the gated MLP's hidden size (prime); intermediate D_ACT


def _gated_mlp(path: str):
    """A factory of transformers' gated MLP ``transformers.models.<path>`` with random weights."""

    def make(device, dtype):
        import importlib

        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(f"transformers.models.{module}"), name)
        # the attributes the MLPs' __init__ read (a model config would also validate attention sizes)
        mlp = cls(SimpleNamespace(hidden_size=N_HIDDEN, intermediate_size=D_ACT, hidden_act="silu", mlp_bias=True))
        with torch.no_grad():
            for p in mlp.parameters():
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
        return mlp.to(device=device, dtype=dtype)

    return make


register("activations", _act_ops, _act_layers)


# ----------------------------------------------------------------------------- triton-softmax

def _softmax_ops(pkg) -> List[OpSample]:
    def x3(device, dtype):
        return (randn((2, 3, 37), device, dtype, 3.0),)

    def x_long(device, dtype):  # a reduced dim of 600 with 20 inner positions: the looped tiles of _inner, N split
        return (randn((1, 600, 20), device, dtype, 3.0),)  # over 2 programs (2 column blocks: < 2 per SM)

    def x_long_whole(device, dtype):  # ... with 16 column blocks of 16: both passes in one program (CPU's 8 SMs)
        return (randn((2, 520, 128), device, dtype, 3.0),)

    def x_mask(device, dtype):
        mask = torch.zeros((2, 1, 37), device=device, dtype=dtype)
        mask[..., ::5] = float("-inf")
        return randn((2, 3, 37), device, dtype, 3.0), mask

    def logits_target(device, dtype):
        t = torch.randint(0, 37, (6,), device=device)
        t[2] = -100
        return randn((6, 37), device, dtype, 3.0), t

    def logits_3d(device, dtype):
        return randn((2, 37, 3), device, dtype, 3.0), torch.randint(0, 37, (2, 3), device=device)

    out = []
    for name in ("softmax", "log_softmax"):
        f = getattr(pkg, name)
        out.append(OpSample(name, (lambda x, f=f: f(x)), x3, grad=(0,)))
        out.append(OpSample(f"{name}[dim=1]", (lambda x, f=f: f(x, 1)), x3, grad=(0,)))
        out.append(OpSample(f"{name}[dim=1,long]", (lambda x, f=f: f(x, 1)), x_long, grad=(0,)))
        out.append(OpSample(f"{name}[dim=1,long,whole]", (lambda x, f=f: f(x, 1)), x_long_whole, grad=(0,)))
        out.append(OpSample(f"{name}[scale,mask]", (lambda x, m, f=f: f(x, scale=0.5, mask=m)), x_mask, grad=(0,)))
        out.append(OpSample(f"{name}[causal]", (lambda x, f=f: f(x, causal=True)), x3, grad=(0,)))
    ce = pkg.cross_entropy
    out.append(OpSample("cross_entropy", lambda x, t: ce(x, t), logits_target, grad=(0,)))
    out.append(OpSample("cross_entropy[sum,smooth,z]", lambda x, t: ce(x, t, reduction="sum", label_smoothing=0.1,
                                                                      z_loss=1e-4), logits_target, grad=(0,)))
    out.append(OpSample("cross_entropy[none,3d]", lambda x, t: ce(x, t, reduction="none"), logits_3d, grad=(0,)))
    out.append(OpSample("cross_entropy[torch_order]", lambda x, t: ce(x, t, torch_order=True), logits_target, grad=(0,)))
    out.append(OpSample("cross_entropy[torch_order,none]", lambda x, t: ce(x, t, reduction="none", torch_order=True),
                        logits_target, grad=(0,)))
    out.append(OpSample("softmax[torch_order]", lambda x: pkg.softmax(x, torch_order=True), x3, grad=(0,)))
    return out


def _softmax_layers(pkg) -> List[LayerSample]:
    def logits_target(device, dtype):
        return randn((6, 37), device, dtype, 3.0), torch.randint(0, 37, (6,), device=device)

    return [
        LayerSample("Softmax", lambda d, t: nn.Softmax(dim=-1), lambda d, t: (randn((2, 3, 37), d, t, 3.0),)),
        LayerSample("CrossEntropyLoss", lambda d, t: nn.CrossEntropyLoss(label_smoothing=0.05), logits_target),
    ]


register("softmax", _softmax_ops, _softmax_layers)


# ----------------------------------------------------------------------------- triton-matmul

def _matmul_ops(pkg) -> List[OpSample]:
    def abw(device, dtype):
        return randn((2, 5, 24), device, dtype), randn((40, 24), device, dtype, 0.2).t(), randn(40, device, dtype)

    out = []
    for act in (None, "gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu"):
        out.append(OpSample(f"matmul[{act}]", (lambda a, b, bias, act=act: pkg.matmul(a, b, bias, act)), abw,
                            grad=(0, 1, 2), dtypes=(torch.float16, torch.bfloat16)))
    out.append(OpSample("matmul[nobias]", lambda a, b, bias: pkg.matmul(a, b), abw, grad=(0, 1),
                        dtypes=(torch.float16,)))
    return out


def _matmul_layers(pkg) -> List[LayerSample]:
    def diffusers(cls, **kw):
        from diffusers.models import activations

        return lambda d, t: _randomised(getattr(activations, cls)(24, 20, **kw), d, t)

    x = lambda d, t: (randn((2, 5, 24), d, t),)  # noqa: E731
    return [
        LayerSample("GELU", diffusers("GELU", approximate="tanh"), x, dtypes=(torch.float16, torch.bfloat16)),
        LayerSample("GEGLU", diffusers("GEGLU"), x, dtypes=(torch.float16, torch.bfloat16)),
        LayerSample("Linear", lambda d, t: _randomised(nn.Linear(24, 20), d, t), x,
                    dtypes=(torch.float16, torch.bfloat16)),
    ]


register("matmul", _matmul_ops, _matmul_layers, skip=("layers", "MatmulConfig", "pick_config"))


# ----------------------------------------------------------------------------- triton-attention


def _attention_ops(pkg) -> List[OpSample]:
    def qkv(hq, hk, s_q=5, s_k=7, d=16, bshd=False):
        def make(device, dtype):
            shape = (lambda h, s: (1, s, h, d)) if bshd else (lambda h, s: (1, h, s, d))
            return randn(shape(hq, s_q), device, dtype), randn(shape(hk, s_k), device, dtype), \
                randn(shape(hk, s_k), device, dtype)
        return make

    def with_mask(kind):
        def make(device, dtype):
            q, k, v = qkv(4, 2)(device, dtype)
            keep = torch.rand((1, 1, 5, 7), device=device) > 0.3
            keep[..., 0] = True
            mask = keep if kind == "bool" else torch.zeros((1, 1, 5, 7), device=device, dtype=dtype).masked_fill(
                ~keep, float("-inf"))
            return q, k, v, mask
        return make

    def rope(device, dtype):
        x = randn((1, 2, 5, 16), device, dtype)
        ang = torch.arange(5, device=device)[:, None] * torch.linspace(0.1, 1.0, 16, device=device)[None]
        return x, ang.cos()[None, None].to(dtype), ang.sin()[None, None].to(dtype)

    def rope_qk(device, dtype):
        q, k = randn((1, 2, 5, 16), device, dtype), randn((1, 1, 5, 16), device, dtype)
        ang = torch.arange(5, device=device)[:, None] * torch.linspace(0.1, 1.0, 16, device=device)[None]
        return q, k, ang.cos()[None].to(dtype), ang.sin()[None].to(dtype)

    def qkv_rope(bshd=False):
        def make(device, dtype):
            q, k, v = qkv(2, 2, 6, 6, bshd=bshd)(device, dtype)
            ang = torch.arange(6, device=device)[:, None] * torch.linspace(0.1, 1.0, 16, device=device)[None]
            cos, sin = ang.cos(), ang.sin()
            if bshd:  # [S, 1, D] for [B, S, H, D]
                cos, sin = cos[:, None], sin[:, None]
            return q, k, v, cos.to(dtype), sin.to(dtype)
        return make

    class _Attn(nn.Module):
        is_causal = True

    fa = pkg.flash_attention
    return [
        OpSample("flash_attention", lambda q, k, v: fa(q, k, v), qkv(2, 2), grad=(0, 1, 2)),
        OpSample("flash_attention[causal,gqa]", lambda q, k, v: fa(q, k, v, causal=True), qkv(4, 2, 7, 7),
                 grad=(0, 1, 2)),
        OpSample("flash_attention[bool mask]", lambda q, k, v, m: fa(q, k, v, attn_mask=m), with_mask("bool"),
                 grad=(0, 1, 2)),
        OpSample("flash_attention[additive mask,scale]", lambda q, k, v, m: fa(q, k, v, attn_mask=m, scale=0.3),
                 with_mask("add"), grad=(0, 1, 2)),
        OpSample("flash_attention[bshd,mqa]", lambda q, k, v: fa(q, k, v, layout="bshd"), qkv(2, 1, bshd=True),
                 grad=(0, 1, 2)),
        OpSample("flash_attention_rope", lambda q, k, v, c, s: pkg.flash_attention_rope(q, k, v, c, s, causal=True),
                 qkv_rope(), grad=(0, 1, 2)),
        OpSample("flash_attention_rope[bshd,interleaved]",
                 lambda q, k, v, c, s: pkg.flash_attention_rope(q, k, v, c, s, interleaved=True, layout="bshd"),
                 qkv_rope(bshd=True), grad=(0, 1, 2)),
        OpSample("rotary_embedding", lambda x, c, s: pkg.rotary_embedding(x, c, s), rope, grad=(0,)),
        OpSample("apply_rotary_pos_emb", lambda q, k, c, s: pkg.apply_rotary_pos_emb(q, k, c, s), rope_qk,
                 grad=(0, 1)),
        OpSample("transformers_attention_forward",
                 lambda q, k, v: pkg.transformers_attention_forward(_Attn(), q, k, v, None)[0], qkv(4, 2, 6, 6),
                 grad=(0, 1, 2)),
    ]


def _attention_layers(pkg) -> List[LayerSample]:
    def rope_qk(device, dtype):
        q, k = randn((1, 2, 5, 16), device, dtype), randn((1, 1, 5, 16), device, dtype)
        ang = torch.arange(5, device=device)[:, None] * torch.linspace(0.1, 1.0, 16, device=device)[None]
        return q, k, ang.cos()[None].to(dtype), ang.sin()[None].to(dtype)

    def llama_attention(device, dtype):
        """transformers' LlamaAttention with random weights (eager attention: plain ops, as the decoder sample)."""
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention

        config = LlamaConfig(hidden_size=D_MODEL, intermediate_size=D_ACT, num_attention_heads=4,
                             num_key_value_heads=2, num_hidden_layers=1, vocab_size=8, attn_implementation="eager")
        layer = LlamaAttention(config, layer_idx=0)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
        return layer.to(device=device, dtype=dtype)

    def attention_inputs(device, dtype):  # (hidden_states, position_embeddings)
        inputs = _decoder_inputs(device, dtype)
        return inputs[0], inputs[5]

    return [LayerSample("RotaryPosEmb", lambda d, t: nn.Module(), rope_qk, grad=(0, 1)),
            LayerSample("LlamaAttention", llama_attention, attention_inputs)]


register("attention", _attention_ops, _attention_layers,
         skip=("layers", "BwdConfig", "FwdConfig", "pick_bwd_config", "pick_fwd_config"))


# ----------------------------------------------------------------------------- helpers


def public_names(pkg, entry: Entry) -> List[str]:
    return [n for n in pkg.__all__ if n not in entry.skip]


def layer_names(pkg) -> List[str]:
    return [n for n, v in vars(pkg.layers).items()
            if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == pkg.layers.__name__
            and not n.startswith("_")]


def clone_inputs(inputs: Sequence, grad: Sequence[int] = ()) -> List:
    """Fresh copies (leaves), ``requires_grad`` on the ``grad`` positions (float tensors only)."""
    out = []
    for i, t in enumerate(inputs):
        if isinstance(t, Tensor):
            c = t.detach().clone()
            if i in grad and c.is_floating_point():
                c.requires_grad_(True)
            out.append(c)
        else:
            out.append(t)
    return out


def as_tuple(result) -> Tuple[Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def loss_of(result) -> Tensor:
    """A scalar depending on every output (weights so no gradient is a plain sum)."""
    total = 0
    for k, t in enumerate(as_tuple(result)):
        if isinstance(t, Tensor) and t.is_floating_point():
            w = torch.linspace(0.5, 1.5, t.numel(), device=t.device).reshape(t.shape)
            total = total + ((t.float() * w).sum() * (k + 1))
    return total


__all__ = [
    "CATALOG", "Entry", "LayerSample", "OpSample", "as_tuple", "clone_inputs", "layer_names", "loss_of",
    "public_names", "randn", "register",
]
