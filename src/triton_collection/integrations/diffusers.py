"""Swap the attention processors (and norms) of diffusers Flux, SD3/SD3.5 and Wan transformers for Triton ones.

    from kernels import Mode
    from triton_collection.integrations.diffusers import kernelize

    report = kernelize(pipe, mode=Mode.INFERENCE)   # a pipeline (its .transformer) or the model itself
    print(report.summary())

Attention: diffusers has no public way to add an attention backend (its hub backends are a closed
enum), so every attention module whose processor is one we know gets a processor of ours through
``model.set_attn_processor``:

=====================  ==========================  ================================================
processor replaced      ours                        what changes
=====================  ==========================  ================================================
FluxAttnProcessor       TritonFluxAttnProcessor     RoPE on q and k in one Triton pass each (fp32 math,
                                                    bit-exact to ``apply_rotary_emb``) instead of ~8
                                                    eager ops per tensor; then the attention backend
JointAttnProcessor2_0   TritonJointAttnProcessor    no [B, H, S, D] transposes: flash attention on the
(SD3, SD3.5)                                        [B, S, H, D] projections, output without a copy
WanAttnProcessor        TritonWanAttnProcessor      RoPE (pairs) in one Triton pass per tensor, then the
                                                    attention backend (also for the I2V image context)
=====================  ==========================  ================================================

Everything else a processor does (projections, q/k norms, concatenation of the text and image
tokens, output projections) is the model's own modules, called in the same order. Processors of
other classes (IP-adapters, fused projections we do not know, custom ones) are left alone and
listed in ``report.refused`` with the reason.

Norms (``norms=True``): the norm modules of ``norm_families`` go through :func:`.transformers.kernelize`
(triton-norms layers with the replaced module's numerics). The default swaps only diffusers'
``RMSNorm`` (SD3/SD3.5 q/k norms: several eager ops, fused into one kernel): ``nn.LayerNorm`` and
``nn.RMSNorm`` are already single PyTorch kernels, and swapping them for the exact-order triton-norms
layers made a Flux step slower on the H200 (benchmarks/NOTES.md); pass
``norm_families=families.FAMILIES`` to swap them anyway.

adaLN (``modulate=True``): diffusers' ``AdaLayerNormZero``, ``AdaLayerNormZeroSingle`` and
``AdaLayerNormContinuous`` modules (Flux, SD3/SD3.5 norm1/norm1_context/norm_out) compute
``norm(x) * (1 + scale) + shift`` with triton-norms ``norm_modulate`` (one kernel instead of a
LayerNorm and three elementwise passes); the modulations that models write inline in their block
forwards (Flux/SD3 ``norm2``) are left alone, except Wan's (``blocks=True``: the block's forward with its
norm chains in ``norm_modulate`` / ``layer_norm`` and its two gated residuals in ``gated_residual``; on the
H200 it took a Wan2.1-1.3B step from 1.08x to 1.21x over eager). Feed-forward
(``feed_forward=True``): diffusers ``GELU`` / ``GEGLU`` projections (Flux, SD3, Wan ``FeedForward``) run
as one triton-matmul launch with the bias and the activation fused into the store. All three swap the
module's class for a subclass with our forward (parameters, state dict and other instances untouched);
a call the kernels cannot take (other ranks, mixed dtypes) falls back to the original forward.

Numerics: RoPE as diffusers computes it (fp32, one rounding); attention equals SDPA within bf16 tolerance (fp32 accumulation), so one
denoising step of the kernelized transformer stays within bf16 tolerance of the original.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Optional

import kernels
import torch
from kernels import Mode

from .. import DEFAULT_ORG

__all__ = ["DiffusersKernelizeReport", "TritonFluxAttnProcessor", "TritonJointAttnProcessor", "TritonWanAttnProcessor",
           "kernelize"]

log = logging.getLogger(__name__)


class _TritonProcessor:
    """Base: holds the loaded triton-attention package and the attention backend.

    ``backend="triton"``: triton-attention's ``flash_attention`` on [B, S, H, D]; ``"sdpa"``:
    ``F.scaled_dot_product_attention`` (on transposed views) for the attention itself, our RoPE
    and everything else unchanged -- for GPUs where SDPA's best backend is faster than our kernel.
    """

    replaces = ""

    def __init__(self, kernel: ModuleType, backend: str = "triton"):
        if backend not in ("triton", "sdpa"):
            raise ValueError(f"backend must be 'triton' or 'sdpa', got {backend!r}")
        self.kernel = kernel
        self.backend = backend

    def _attention(self, q, k, v, mask=None):
        if _autocast_on(q):  # SDPA casts its inputs to the autocast dtype
            dtype = torch.get_autocast_dtype(q.device.type)
            q, k, v, mask = (t.to(dtype) if t is not None and t.is_floating_point() else t for t in (q, k, v, mask))
        if self.backend == "sdpa":
            o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), attn_mask=mask)
            return o.transpose(1, 2)
        return self.kernel.flash_attention(q, k, v, attn_mask=mask, layout="bshd")

    def _rope_pairs(self, x, cos, sin):
        return self.kernel.rotary_embedding(x, cos, sin, interleaved=True, fp32_math=True)

    def _rope_attention(self, q, k, v, cos, sin, mask=None):
        """attention(rope(q), rope(k), v): one rotary pass per tensor, then the attention product.

        Not ``flash_attention_rope``: on the H200 the fused kernel (q rotated on load) took 0.795 ms
        against 0.710 ms for rotary passes + ``flash_attention`` at Flux's shape (benchmarks/NOTES.md).
        """
        return self._attention(self._rope_pairs(q, cos, sin), self._rope_pairs(k, cos, sin), v, mask)


class TritonFluxAttnProcessor(_TritonProcessor):
    """Flux (and Flux-like) joint attention: ``FluxAttnProcessor``'s computation with Triton RoPE + flash attention.

    Inputs as ``FluxAttnProcessor``: hidden_states [B, S_img, C], encoder_hidden_states [B, S_txt, C] or None
    (single-stream blocks), image_rotary_emb ``(cos, sin)`` of [S_txt + S_img, D] (fp32), attention_mask
    broadcastable to [B, H, S, S] or None.
    """

    replaces = "FluxAttnProcessor"

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, image_rotary_emb: Any = None) -> Any:
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        q, k, v, eq, ek, ev = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        heads = (-1, attn.head_dim)
        q, k, v = attn.norm_q(q.unflatten(-1, heads)), attn.norm_k(k.unflatten(-1, heads)), v.unflatten(-1, heads)
        if attn.added_kv_proj_dim is not None:
            eq = attn.norm_added_q(eq.unflatten(-1, heads))
            ek = attn.norm_added_k(ek.unflatten(-1, heads))
            ev = ev.unflatten(-1, heads)
            q, k, v = torch.cat([eq, q], dim=1), torch.cat([ek, k], dim=1), torch.cat([ev, v], dim=1)
        if image_rotary_emb is not None:
            cos, sin = image_rotary_emb
            cos, sin = cos.to(q.device)[:, None, :], sin.to(q.device)[:, None, :]  # [S, 1, D] against [B, S, H, D]
            out = self._rope_attention(q, k, v, cos, sin, attention_mask)
        else:
            out = self._attention(q, k, v, attention_mask)
        out = out.flatten(2, 3)
        if encoder_hidden_states is None:
            return out
        n_txt = encoder_hidden_states.shape[1]
        txt, img = out.split_with_sizes([n_txt, out.shape[1] - n_txt], dim=1)
        img = attn.to_out[1](attn.to_out[0](img.contiguous()))
        return img, attn.to_add_out(txt.contiguous())


class TritonJointAttnProcessor(_TritonProcessor):
    """SD3/SD3.5 joint attention: ``JointAttnProcessor2_0``'s computation on [B, S, H, D] with flash attention.

    Like the processor it replaces, ``attention_mask`` is not used.
    """

    replaces = "JointAttnProcessor2_0"

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, *args, **kwargs) -> Any:
        B, n_img = hidden_states.shape[0], hidden_states.shape[1]
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = k.shape[-1] // attn.heads
        split = lambda t: t.view(B, -1, attn.heads, head_dim)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        if encoder_hidden_states is not None:
            eq = split(attn.add_q_proj(encoder_hidden_states))
            ek = split(attn.add_k_proj(encoder_hidden_states))
            ev = split(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            q, k, v = torch.cat([q, eq], dim=1), torch.cat([k, ek], dim=1), torch.cat([v, ev], dim=1)
        out = self._attention(q, k, v).reshape(B, -1, attn.heads * head_dim)
        txt = None
        if encoder_hidden_states is not None:
            out, txt = out[:, :n_img], out[:, n_img:]
            if not attn.context_pre_only:
                txt = attn.to_add_out(txt)
        out = attn.to_out[1](attn.to_out[0](out))
        return (out, txt) if encoder_hidden_states is not None else out


class TritonWanAttnProcessor(_TritonProcessor):
    """Wan self/cross attention: ``WanAttnProcessor``'s computation with Triton RoPE (pairs) + flash attention.

    ``rotary_emb = (cos, sin)`` of [1, S, 1, D] fp32 with equal values within each pair (as
    ``WanRotaryPosEmbed`` builds them with ``repeat_interleave_real=True``). I2V models (``add_k_proj``)
    attend to the image context (the first ``S_ctx - 512`` tokens) separately and add the result.
    """

    replaces = "WanAttnProcessor"

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: Optional[torch.Tensor] = None,
                 attention_mask: Optional[torch.Tensor] = None, rotary_emb: Any = None) -> torch.Tensor:
        from diffusers.models.transformers.transformer_wan import _get_added_kv_projections, _get_qkv_projections

        img_ctx = None
        if attn.add_k_proj is not None:
            n_img = encoder_hidden_states.shape[1] - 512  # the text context is the last 512 tokens
            img_ctx, encoder_hidden_states = encoder_hidden_states[:, :n_img], encoder_hidden_states[:, n_img:]
        q, k, v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        q, k = attn.norm_q(q), attn.norm_k(k)
        heads = (attn.heads, -1)
        q, k, v = q.unflatten(2, heads), k.unflatten(2, heads), v.unflatten(2, heads)
        fused = rotary_emb is not None and img_ctx is None and q.shape[1] == k.shape[1]
        if rotary_emb is not None and not fused:
            cos, sin = rotary_emb
            q, k = self._rope_pairs(q, cos, sin), self._rope_pairs(k, cos, sin)
        extra = None
        if img_ctx is not None:
            ki, vi = _get_added_kv_projections(attn, img_ctx)
            ki = attn.norm_added_k(ki).unflatten(2, heads)
            vi = vi.unflatten(2, heads)
            extra = self._attention(q, ki, vi).flatten(2, 3).type_as(q)
        if fused:
            out = self._rope_attention(q, k, v, *rotary_emb, attention_mask)
        else:
            out = self._attention(q, k, v, attention_mask)
        out = out.flatten(2, 3).type_as(q)
        if extra is not None:
            out = out + extra
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


_PROCESSORS = {cls.replaces: cls for cls in (TritonFluxAttnProcessor, TritonJointAttnProcessor, TritonWanAttnProcessor)}


# ----------------------------------------------------------------------------- adaLN modulate and feed-forward

def _modulate(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``self.norm(x) * (1 + scale[:, None]) + shift[:, None]`` through triton-norms ``norm_modulate``,
    with the eager chain's rounding points (norm output, ``1 + scale`` and the product rounded as eager)."""
    n = self.norm
    return type(self)._triton_kernel.norm_modulate(x, scale, shift, n.weight, n.bias, n.eps, eager_rounding=True,
                                                   out_dtype=torch.promote_types(x.dtype, scale.dtype))


def _autocast_on(x: torch.Tensor) -> bool:
    """Whether ``torch.autocast`` is on for x's device type: the swapped norm and feed-forward forwards then run the
    module's own (autocast changes the dtypes of its LayerNorm and Linear)."""
    return torch.is_autocast_enabled(x.device.type)


def _modulate_ok(self, x: torch.Tensor) -> bool:
    return (x.dim() == 3 and x.shape[-1] <= 32768 and x.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and not _autocast_on(x))


def _ada_zero_forward(base):
    def forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
        if not _modulate_ok(self, x):
            return base.forward(self, x, timestep, class_labels, hidden_dtype, emb)
        if self.emb is not None:
            emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        return _modulate(self, x, scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp

    return forward


def _ada_zero_single_forward(base):
    def forward(self, x, emb=None):
        if not _modulate_ok(self, x):
            return base.forward(self, x, emb)
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
        return _modulate(self, x, scale_msa, shift_msa), gate_msa

    return forward


def _ada_continuous_forward(base):
    def forward(self, x, conditioning_embedding):
        if not _modulate_ok(self, x):
            return base.forward(self, x, conditioning_embedding)
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return _modulate(self, x, scale, shift)

    return forward


def _gelu_forward(base):
    def forward(self, hidden_states):
        w, b = self.proj.weight, self.proj.bias
        if hidden_states.dtype != w.dtype or (b is not None and b.dtype != w.dtype) or hidden_states.device != w.device \
                or _autocast_on(hidden_states):
            return base.forward(self, hidden_states)
        act = "gelu_tanh" if self.approximate == "tanh" else "gelu"
        return type(self)._triton_kernel.matmul(hidden_states, w.t(), b, act)

    return forward


def _geglu_forward(base):
    def forward(self, hidden_states, *args, **kwargs):
        w, b = self.proj.weight, self.proj.bias
        if hidden_states.dtype != w.dtype or (b is not None and b.dtype != w.dtype) or hidden_states.device != w.device \
                or _autocast_on(hidden_states):
            return base.forward(self, hidden_states, *args, **kwargs)
        return type(self)._triton_kernel.matmul(hidden_states, w.t(), b, "geglu")

    return forward


def _wan_block_forward(base):
    """``WanTransformerBlock.forward`` with its inline chains in triton-norms kernels, each one pass, fp32 inside
    and rounded once, where eager runs four to five passes over fp32 copies: norm1 and norm3
    (``norm(x.float()) * (1 + scale) + shift``, then ``.type_as(x)``) through ``norm_modulate``, an affine
    norm2 through ``layer_norm``; the gated residuals ``(x.float() + y * gate).type_as(x)`` through ``gated_residual``
    (bit-exact). The attention and the feed-forward stay the block's own modules (with their own swaps)."""
    def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
        x = hidden_states
        if temb.dim() != 3 or temb.shape[0] != x.shape[0] or not _modulate_ok(self, x):
            return base.forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb)  # e.g. Wan2.2 ti2v
        kernel = type(self)._triton_kernel
        norm_modulate, gated_residual = kernel.norm_modulate, kernel.gated_residual
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
            self.scale_shift_table + temb.float()).chunk(6, dim=1)
        n1, n2, n3 = self.norm1, self.norm2, self.norm3
        h = norm_modulate(x, scale_msa, shift_msa, n1.weight, n1.bias, n1.eps, out_dtype=x.dtype)
        x = gated_residual(x, self.attn1(h, None, None, rotary_emb), gate_msa)
        if isinstance(n2, torch.nn.LayerNorm):  # fp32 LayerNorm rounded once to x's dtype, as norm2(x.float())
            h = kernel.layer_norm(x, n2.weight, n2.bias, n2.eps)
        else:  # nn.Identity without cross-attention norm
            h = n2(x.float()).type_as(x)
        x = x + self.attn2(h, encoder_hidden_states, None, None)
        h = norm_modulate(x, c_scale_msa, c_shift_msa, n3.weight, n3.bias, n3.eps, out_dtype=x.dtype)
        return gated_residual(x, self.ffn(h), c_gate_msa)

    return forward


_SWAP_CLASSES: dict = {}


def _swap_forward(module: torch.nn.Module, make_forward, kernel: ModuleType) -> str:
    """Gives ``module`` a subclass of its class whose forward is ``make_forward(base)`` (kernel on the class);
    other instances, the parameters and the state dict are untouched. Returns the new class name."""
    base = type(module)
    key = (base, make_forward, id(kernel))
    cls = _SWAP_CLASSES.get(key)
    if cls is None:
        cls = type(f"Triton{base.__name__}", (base,), {"forward": make_forward(base), "_triton_kernel": kernel,
                                                      "__module__": __name__, "__doc__": base.__doc__})
        _SWAP_CLASSES[key] = cls
    module.__class__ = cls
    return cls.__name__


def _swap_all(targets: list, kernel: Optional[ModuleType], package: str, hub: dict, report) -> Optional[ModuleType]:
    """Swaps the forwards of ``targets`` ((name, module, factory or None if swapped before)) to ``kernel``,
    loaded as ``<org>/<package>`` first when it is None and something is to be swapped; returns the kernel."""
    if kernel is None and any(make is not None for _, _, make in targets):
        kernel = kernels.get_kernel(f"{hub['org']}/{package}", version=hub["version"],
                                    trust_remote_code=hub["trust_remote_code"])
    for name, mod, make in targets:
        report.modules[name] = type(mod).__name__ if make is None else _swap_forward(mod, make, kernel)
    return kernel


def _ada_targets(model: torch.nn.Module, report) -> list:
    """(name, module, forward factory) of every adaLN module whose norm is a LayerNorm over the last dim."""
    from diffusers.models import normalization as dn

    kinds = {dn.AdaLayerNormZero: _ada_zero_forward, dn.AdaLayerNormZeroSingle: _ada_zero_single_forward,
             dn.AdaLayerNormContinuous: _ada_continuous_forward}
    out = []
    for name, mod in model.named_modules():
        if _already_swapped(mod, kinds):
            out.append((name, mod, None))
            continue
        make = kinds.get(type(mod))
        if make is None:
            continue
        norm = getattr(mod, "norm", None)
        if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
            report.refused[name] = f"{type(mod).__name__} with a {type(norm).__name__} norm (only LayerNorm is fused)"
            continue
        out.append((name, mod, make))
    return out


def _block_targets(model: torch.nn.Module, report) -> list:
    """(name, module, forward factory) of every Wan transformer block whose norm1 / norm3 are LayerNorms."""
    try:
        from diffusers.models.transformers.transformer_wan import WanTransformerBlock
    except ImportError:  # a diffusers without Wan
        return []
    kinds = {WanTransformerBlock: _wan_block_forward}
    out = []
    for name, mod in model.named_modules():
        if _already_swapped(mod, kinds):
            out.append((name, mod, None))
        elif type(mod) is WanTransformerBlock:
            if all(isinstance(n, torch.nn.LayerNorm) and len(n.normalized_shape) == 1 for n in (mod.norm1, mod.norm3)):
                out.append((name, mod, _wan_block_forward))
            else:
                report.refused[name] = "WanTransformerBlock whose norm1/norm3 are not LayerNorms over the last dim"
    return out


def _ff_targets(model: torch.nn.Module) -> list:
    from diffusers.models import activations as da

    kinds = {da.GELU: _gelu_forward, da.GEGLU: _geglu_forward}
    return [(name, mod, None if _already_swapped(mod, kinds) else kinds[type(mod)])
            for name, mod in model.named_modules()
            if _already_swapped(mod, kinds)
            or (type(mod) in kinds and isinstance(getattr(mod, "proj", None), torch.nn.Linear))]


def _already_swapped(mod: torch.nn.Module, kinds: dict) -> bool:
    """A module kernelized before (its class is one of our subclasses of a known class)."""
    cls = type(mod)
    return "_triton_kernel" in cls.__dict__ and cls.__bases__[0] in kinds


@dataclass
class DiffusersKernelizeReport:
    """What :func:`kernelize` did.

    Attributes:
        model: the class name of the transformer that was kernelized.
        processors: attention module name -> our processor class name, for every swapped processor.
        refused: attention module name (or ``"norms"``) -> why it was left alone.
        norms: module name -> Hub layer name for the norm modules swapped (``norms=True``).
        modules: module name -> new class name for the adaLN modules (``modulate=True``), the
            GELU/GEGLU projections (``feed_forward=True``) and the Wan blocks (``blocks=True``) whose
            forward now runs our kernels.
    """

    model: str
    processors: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    norms: dict = field(default_factory=dict)
    modules: dict = field(default_factory=dict)

    @property
    def swapped(self) -> dict:
        """Every swapped module: processors, norms, adaLN and feed-forward modules."""
        return {**self.processors, **self.norms, **self.modules}

    def __len__(self) -> int:
        return len(self.processors) + len(self.norms) + len(self.modules)

    def summary(self) -> str:
        from collections import Counter

        lines = [f"{self.model}: {len(self.processors)} attention processors, {len(self.norms)} norms, "
                 f"{len(self.modules)} adaLN/feed-forward/block modules swapped"]
        for part in (self.processors, self.norms, self.modules):
            for what, n in sorted(Counter(part.values()).items()):
                lines.append(f"  {n} x {what}")
        for name, why in sorted(self.refused.items()):
            lines.append(f"  left alone: {name}: {why}")
        return "\n".join(lines)


def _transformer(pipe_or_model) -> torch.nn.Module:
    model = getattr(pipe_or_model, "transformer", None)
    if isinstance(model, torch.nn.Module):
        return model
    if isinstance(pipe_or_model, torch.nn.Module):
        return pipe_or_model
    raise TypeError(f"kernelize needs a diffusers pipeline with a .transformer or an nn.Module, got "
                    f"{type(pipe_or_model).__name__}")


def _default_norms_note(model: torch.nn.Module) -> str:
    """Why the default norm swap found nothing: the model has no diffusers ``RMSNorm``; torch's own norm modules
    it has (counted) are left as they are unless ``norm_families`` asks for them."""
    counts = Counter(type(m).__name__ for m in model.modules() if type(m) in (torch.nn.LayerNorm, torch.nn.RMSNorm))
    torch_norms = ", ".join(f"torch.nn.{name} x {n}" for name, n in counts.items())
    return ("no diffusers RMSNorm in the model (the default norm swap)"
            + (f"; its {torch_norms} are single PyTorch kernels already and stay (norm_families="
               "families.FAMILIES swaps them too)" if torch_norms else ""))


def kernelize(pipe_or_model, *, mode: Mode = Mode.INFERENCE, attention: bool = True, norms: bool = True,
              modulate: bool = True, feed_forward: bool = True, blocks: bool = True,
              attention_backend: str = "sdpa", norm_families: Optional[tuple] = None,
              device: Optional[str] = None, org: str = DEFAULT_ORG,
              version: int = 1, trust_remote_code: bool = False,
              kernel: Optional[ModuleType] = None, norms_kernel: Optional[ModuleType] = None,
              matmul_kernel: Optional[ModuleType] = None) -> DiffusersKernelizeReport:
    """Swaps the attention processors (and norms) of a Flux / SD3 / Wan transformer for triton-collection kernels.

    Args:
        pipe_or_model: a diffusers pipeline (its ``.transformer`` is used) or the transformer model.
        mode: ``kernels.Mode`` for the norm layers (the processors serve every mode: they have a backward
            and compile with ``torch.compile``).
        attention: swap the known attention processors (loads ``<org>/triton-attention``).
        norms: swap the norm modules through :func:`.transformers.kernelize` (loads ``<org>/triton-norms``);
            a model without a swappable norm is reported, not an error.
        norm_families: the :mod:`.families` to swap (default: diffusers ``RMSNorm`` only, see above).
        modulate: route diffusers ``AdaLayerNormZero`` / ``AdaLayerNormZeroSingle`` / ``AdaLayerNormContinuous``
            (with a LayerNorm) through triton-norms ``norm_modulate``: norm, ``* (1 + scale)`` and ``+ shift``
            in one kernel, rounded where the eager chain rounds (loads ``<org>/triton-norms``).
        feed_forward: route diffusers ``GELU`` / ``GEGLU`` (``proj`` + activation) through triton-matmul's
            fused bias + GELU / GEGLU epilogue (loads ``<org>/triton-matmul``).
        blocks: Wan transformer blocks run their inline norm + modulate chains
            (norm1, norm3) through ``norm_modulate``, the affine norm2 through ``layer_norm`` and their gated
            residuals through ``gated_residual`` (loads ``<org>/triton-norms``); a per-token ``temb`` (Wan2.2
            ti2v) takes the block's own forward.
        attention_backend: ``"sdpa"`` (default: PyTorch's SDPA for the attention product; the processors still
            do RoPE in one Triton pass per tensor) or ``"triton"`` (triton-attention's ``flash_attention``). On
            the H200, SDPA's cuDNN backend is faster than our kernel at d = 128 (Flux, Wan: ~610-650 vs ~470-510
            TFLOP/s forward), and one step with every default swap and "sdpa" / "triton" against eager was SD3.5
            1.31x / 1.26x, Flux 1.22x / 1.18x; Wan2.1-1.3B 1.21x with "sdpa"
            (benchmarks/results/diffusers_step_2026-12-01.md). Since then our d = 64 forward moved to the TMA
            kernel: 440 against cuDNN's 410 TFLOP/s at SD3.5's 2 x 38 x 4429
            (benchmarks/results/attention_tiles_2026-12-02.txt); SD3.5's step with "triton" was not re-timed.
        device, org, version, trust_remote_code: where the packages come from, as in :mod:`.transformers`.
        kernel, norms_kernel, matmul_kernel: already loaded triton-attention / triton-norms / triton-matmul
            packages (else loaded by Hub name).

    Returns:
        :class:`DiffusersKernelizeReport` (``report.summary()`` prints it).

    A second call on a kernelized model makes its Triton processors again with this call's ``attention_backend``
    (and reports them), and reports the modules it swapped before: calling again switches the backend.

    Raises:
        TypeError: not a pipeline or module. ValueError: ``attention_backend`` neither "sdpa" nor "triton";
            nothing at all could be swapped (never a silent no-op).
    """
    model = _transformer(pipe_or_model)
    if attention_backend not in ("triton", "sdpa"):
        raise ValueError(f"kernelize: attention_backend must be 'triton' or 'sdpa', got {attention_backend!r}")
    report = DiffusersKernelizeReport(model=type(model).__name__)
    if attention:
        procs = getattr(model, "attn_processors", None)
        if procs is None:
            report.refused["attention"] = "the model has no attn_processors (not a diffusers AttentionMixin model)"
        else:
            if kernel is None:
                from .transformers_attention import load

                kernel = load(org=org, version=version, trust_remote_code=trust_remote_code)
            new = {}
            for name, proc in procs.items():
                # a processor of an earlier kernelize is made again: this call's backend and package, reported
                cls = type(proc) if isinstance(proc, _TritonProcessor) else _PROCESSORS.get(type(proc).__name__)
                if cls is None:
                    new[name] = proc
                    report.refused[name] = f"processor {type(proc).__name__} has no Triton counterpart"
                    continue
                new[name] = cls(kernel, attention_backend)
                report.processors[name] = cls.__name__ + ("" if attention_backend == "triton" else "(sdpa)")
            if report.processors:
                model.set_attn_processor(new)
    if norms:
        from .families import DIFFUSERS_RMS
        from .transformers import kernelize as kernelize_norms

        try:
            norm_report = kernelize_norms(model, mode=mode, device=device, org=org, version=version,
                                          trust_remote_code=trust_remote_code,
                                          families=norm_families if norm_families is not None else (DIFFUSERS_RMS,))
            report.norms = dict(norm_report.swapped)
            for cls_name, why in norm_report.refused.items():
                report.refused[f"norms:{cls_name}"] = why
        except ValueError as err:
            report.refused["norms"] = str(err) if norm_families is not None else _default_norms_note(model)
    hub = dict(org=org, version=version, trust_remote_code=trust_remote_code)
    if modulate:
        norms_kernel = _swap_all(_ada_targets(model, report), norms_kernel, "triton-norms", hub, report)
    if blocks:
        norms_kernel = _swap_all(_block_targets(model, report), norms_kernel, "triton-norms", hub, report)
    if feed_forward:
        _swap_all(_ff_targets(model), matmul_kernel, "triton-matmul", hub, report)
    if not len(report):
        raise ValueError(f"kernelize: nothing to swap in {report.model}:\n{report.summary()}")
    log.info("%s", report.summary())
    return report
