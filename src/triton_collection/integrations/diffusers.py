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
triton-matmul's Hub layers of those names: one launch with the bias and the activation fused into the store
(cast as ``F.linear`` under autocast); a ``proj`` that is no longer a plain ``nn.Linear`` (a LoRA layer added
later) or has hooks, and float64, run the module's own ops. All three swap the module's class for a subclass
with our forward (parameters, state dict and other instances untouched); a call the norm kernels cannot take
(other ranks, mixed dtypes, float64, autocast) falls back to the original forward, and so do the processors
(the one they replaced runs a float64 call). ``copy.deepcopy`` keeps the swaps; a model pickled whole
(``torch.save(model)``) loads with the original forwards and processors (as the transformers shim's).
A 2-D attention mask of [B, S_k] is a key-padding mask, as diffusers' native backend reads it.

Numerics: RoPE as diffusers computes it (fp32, one rounding); attention equals SDPA within bf16 tolerance (fp32 accumulation), so one
denoising step of the kernelized transformer stays within bf16 tolerance of the original.
"""

from __future__ import annotations

import copy
import copyreg
import logging
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Optional

import kernels
import torch
from kernels import Mode

from .. import DEFAULT_ORG
from .families import DIFFUSERS_RMS, KERNEL_DTYPES, Family
from .transformers import _check_hub_args, _check_mode, _device_type, _kernelize_selected, _load_hint, select_layers

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

    def __init__(self, kernel: ModuleType, backend: str = "triton", original: Any = None):
        if backend not in ("triton", "sdpa"):
            raise ValueError(f"backend must be 'triton' or 'sdpa', got {backend!r}")
        self.kernel = kernel
        self.backend = backend
        self.original = original if original is not None else _diffusers_processor(self.replaces)()

    def _takes(self, hidden_states: torch.Tensor) -> bool:
        """Whether the kernels take this call; otherwise the replaced processor runs it (e.g. a float64 model)."""
        return hidden_states.dtype in KERNEL_DTYPES

    def __deepcopy__(self, memo):  # the loaded package is shared, not copied (a module cannot be)
        new = object.__new__(type(self))  # (not copy.copy: it would pickle-reduce to the original)
        new.__dict__.update(self.__dict__, original=copy.deepcopy(self.original, memo))
        return new

    def __reduce_ex__(self, protocol):  # pickled (torch.save(model)) as the processor it replaced: loads as a copy
        return copy.copy, (self.original,)

    def _attention(self, q, k, v, mask=None):
        if mask is not None and mask.dim() == 2 and mask.shape == (q.shape[0], k.shape[1]):
            mask = mask[:, None, None, :]  # [B, S_k] key padding, as diffusers' native backend reads it
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

        if not self._takes(hidden_states):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
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
        if not self._takes(hidden_states):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)
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

        if not self._takes(hidden_states):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
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


def _diffusers_processor(name: str) -> type:
    """The diffusers processor class ``name`` (one that ``_PROCESSORS`` replaces)."""
    from diffusers.models import attention_processor
    from diffusers.models.transformers import transformer_flux, transformer_wan

    for module in (transformer_flux, transformer_wan, attention_processor):
        if hasattr(module, name):
            return getattr(module, name)
    raise ValueError(f"diffusers has no attention processor {name!r}")


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
    return (x.dim() == 3 and x.shape[-1] <= 32768 and x.dtype in KERNEL_DTYPES
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


def _matmul_layer_forward(name: str):
    """A forward factory running triton-matmul's Hub layer ``layers.<name>`` (diffusers ``GELU`` / ``GEGLU``): the
    projection and its activation in one launch; the layer runs the module's own ops where that cannot fuse (a
    LoRA layer or hooks on ``proj``, which peft / a user may add after kernelize; float64) and casts as
    ``F.linear`` under autocast."""
    def make(base):
        def forward(self, hidden_states, *args, **kwargs):
            layer = getattr(type(self)._triton_kernel.layers, name)
            return layer.forward(self, hidden_states, *args, **kwargs)

        return forward

    return make


_gelu_forward = _matmul_layer_forward("GELU")
_geglu_forward = _matmul_layer_forward("GEGLU")


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
                                                      "__module__": __name__, "__doc__": base.__doc__,
                                                      "__reduce_ex__": _reduce_as_base,
                                                      "__deepcopy__": _deepcopy_keeping_class})
        _SWAP_CLASSES[key] = cls
    module.__class__ = cls
    return cls.__name__


def _reduce_as_base(self, protocol):
    """Pickles a swapped module (``torch.save(model)``) as an instance of the class it had: the class made at run
    time cannot be found by name when loading, so the loaded model has the original forwards (as kernels' own
    swaps, see the transformers shim)."""
    return copyreg._reconstructor, (type(self).__bases__[0], object, None), self.__dict__


def _deepcopy_keeping_class(self, memo):
    """``copy.deepcopy`` of a swapped module keeps the swap (the class is shared, the state copied)."""
    new = type(self).__new__(type(self))
    memo[id(self)] = new
    new.__setstate__(copy.deepcopy(self.__dict__, memo))
    return new


def _get_kernel(package: str, hub: dict) -> ModuleType:
    """``<org>/<package>`` at ``version`` by Hub name; a failure is the RuntimeError :func:`kernelize` documents,
    naming the package (kernels raises ValueError, FileNotFoundError, HFValidationError, ...)."""
    repo_id = f"{hub['org']}/{package}"
    try:
        return kernels.get_kernel(repo_id, version=hub["version"], trust_remote_code=hub["trust_remote_code"])
    except Exception as err:
        raise RuntimeError(f"kernelize: cannot load {repo_id} v{hub['version']}: {str(err).rstrip('.')}. "
                           f"{_load_hint(err)}.") from err


def _check_package(arg: str, given: Any, package: str, needs: tuple) -> None:
    """TypeError unless ``given`` (the ``arg`` argument of :func:`kernelize`: None, or a loaded package) has every
    attribute in ``needs`` (dotted, e.g. ``"layers.GELU"``) that the swaps will call: a string or another of our
    packages is refused before the first swap, not at the model's first forward (an AttributeError there)."""
    for name in needs if given is not None else ():
        obj = given
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            raise TypeError(f"kernelize: {arg} must be the {package} package (as kernels.get_kernel loads it) or None, "
                            f"got {given!r}, which has no {name}")


def _load_package(kernel: Optional[ModuleType], package: str, hub: dict, targets: list) -> Optional[ModuleType]:
    """``kernel``, or ``<org>/<package>`` loaded when it is None and ``targets`` has something to swap."""
    if kernel is None and any(make is not None for _, _, make in targets):
        kernel = _get_kernel(package, hub)
    return kernel


def _apply(targets: list, kernel: Optional[ModuleType], prefix: str, report) -> None:
    """Swaps the forwards of ``targets`` ((name, module, factory or None if swapped before)) to ``kernel``."""
    for name, mod, make in targets:
        report.modules[prefix + name] = type(mod).__name__ if make is None else _swap_forward(mod, make, kernel)


def _ada_targets(model: torch.nn.Module, report, prefix: str) -> list:
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
            report.refused[prefix + name] = (f"{type(mod).__name__} with a {type(norm).__name__} norm (only "
                                             "LayerNorm is fused)")
            continue
        out.append((name, mod, make))
    return out


def _block_targets(model: torch.nn.Module, report, prefix: str) -> list:
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
                report.refused[prefix + name] = "WanTransformerBlock whose norm1/norm3 are not LayerNorms over the last dim"
    return out


def _ff_targets(model: torch.nn.Module, report, prefix: str) -> list:
    """(name, module, forward factory) of every diffusers GELU / GEGLU whose ``proj`` is an ``nn.Linear``."""
    from diffusers.models import activations as da

    kinds = {da.GELU: _gelu_forward, da.GEGLU: _geglu_forward}
    out = []
    for name, mod in model.named_modules():
        if _already_swapped(mod, kinds):
            out.append((name, mod, None))
        elif type(mod) in kinds:
            proj = getattr(mod, "proj", None)
            if type(proj) is torch.nn.Linear:
                out.append((name, mod, kinds[type(mod)]))
            else:
                report.refused[prefix + name] = (f"{type(mod).__name__} whose proj is a {type(proj).__name__}, not an "
                                                 "nn.Linear (e.g. a LoRA layer): its own forward runs")
    return out


def _already_swapped(mod: torch.nn.Module, kinds: dict) -> bool:
    """A module kernelized before (its class is one of our subclasses of a known class)."""
    cls = type(mod)
    return "_triton_kernel" in cls.__dict__ and cls.__bases__[0] in kinds


@dataclass
class DiffusersKernelizeReport:
    """What :func:`kernelize` did.

    Attributes:
        model: the class name of the transformer that was kernelized (a two-expert pipeline, Wan 2.2:
            ``"transformer: <class>, transformer_2: <class>"``, and every module name below starts with
            ``transformer.`` or ``transformer_2.``).
        processors: attention module name -> our processor class name, for every swapped processor.
        refused: module name (or ``"norms"``) -> why it was left alone.
        norms: module name -> Hub layer name for the norm modules swapped (``norms=True``) that run as modules;
            a norm inside a swapped adaLN module or Wan block is computed by that module's kernel (its weights
            read there) and is listed with that module only.
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


def _transformers(pipe_or_model) -> list:
    """(name prefix, model) of what :func:`kernelize` swaps in: a pipeline's ``.transformer`` (and the second
    expert ``.transformer_2`` of two-expert pipelines such as Wan 2.2, then both named with a prefix; one module in
    both places is taken once, without a prefix), or the model itself."""
    found = [(attr, m) for attr in ("transformer", "transformer_2")
             if isinstance(m := getattr(pipe_or_model, attr, None), torch.nn.Module)]
    if len(found) > 1 and found[0][1] is found[1][1]:  # one module as both experts: swapped and reported once
        found = found[:1]
    if len(found) > 1:
        return [(f"{attr}.", m) for attr, m in found]
    if found:
        return [("", found[0][1])]
    if isinstance(pipe_or_model, torch.nn.Module):
        return [("", pipe_or_model)]
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


def _plan(model: torch.nn.Module, prefix: str, report, *, attention: bool, norms: bool, families: tuple,
          modulate: bool, blocks: bool, feed_forward: bool) -> dict:
    """What :func:`kernelize` will swap in ``model``, found without changing it: ``processors`` (attention module
    name -> our processor class), ``norms`` (whether a norm module of ``families`` is there), ``ada`` / ``blocks``
    / ``ff`` (targets of :func:`_apply`); ``norms`` is :func:`.transformers.select_layers`' ``(chosen, refused)``
    where a norm module of ``families`` is there, else None; what is left alone goes to ``report.refused`` (names
    with ``prefix``)."""
    plan = {"processors": {}, "norms": None, "ada": [], "blocks": [], "ff": []}
    if attention:
        procs = getattr(model, "attn_processors", None)
        if procs is None:
            report.refused[prefix + "attention"] = ("the model has no attn_processors (not a diffusers AttentionMixin "
                                                    "model)")
        for name, proc in (procs or {}).items():
            # a processor of an earlier kernelize is made again: this call's backend and package, reported
            cls = type(proc) if isinstance(proc, _TritonProcessor) else _PROCESSORS.get(type(proc).__name__)
            if cls is None:
                report.refused[prefix + name] = f"processor {type(proc).__name__} has no Triton counterpart"
            else:
                plan["processors"][name] = cls
    if norms:
        chosen, refused = select_layers(model, families=families)
        plan["norms"] = (chosen, refused) if chosen else None  # what _kernelize_selected swaps: probed once
        if not chosen:
            report.refused[prefix + "norms"] = (_default_norms_note(model) if families == (DIFFUSERS_RMS,) else
                                                "no norm module of the families "
                                                f"{', '.join(f.name for f in families)} can be swapped"
                                                + "".join(f"; {k}: {v}" for k, v in refused.items()))
    if modulate:
        plan["ada"] = _ada_targets(model, report, prefix)
    if blocks:
        plan["blocks"] = _block_targets(model, report, prefix)
    if feed_forward:
        plan["ff"] = _ff_targets(model, report, prefix)
    return plan


def kernelize(pipe_or_model, *, mode: Mode = Mode.INFERENCE, attention: bool = True, norms: bool = True,
              modulate: bool = True, feed_forward: bool = True, blocks: bool = True,
              attention_backend: str = "sdpa", norm_families: Optional[tuple] = None,
              device: Optional[str] = None, org: str = DEFAULT_ORG,
              version: int = 1, trust_remote_code: bool = False,
              kernel: Optional[ModuleType] = None, norms_kernel: Optional[ModuleType] = None,
              matmul_kernel: Optional[ModuleType] = None) -> DiffusersKernelizeReport:
    """Swaps the attention processors (and norms) of a Flux / SD3 / Wan transformer for triton-collection kernels.

    Args:
        pipe_or_model: a diffusers pipeline (its ``.transformer`` is used, and ``.transformer_2`` too where a
            pipeline has two experts, Wan 2.2) or the transformer model.
        mode: ``kernels.Mode`` for the norm layers, containing ``INFERENCE`` or ``TRAINING`` (the processors serve
            every mode: they have a backward and compile with ``torch.compile``).
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

    Every argument and the models' dtypes are checked, and the packages loaded, before the first swap: an error
    leaves the models as they were.

    Raises:
        TypeError: not a pipeline or module; ``mode`` not a ``kernels.Mode``; a flag (``attention``, ``norms``,
            ``modulate``, ``feed_forward``, ``blocks``) not a bool; ``norm_families`` not a tuple of
            families; ``version`` not an int; ``kernel`` / ``norms_kernel`` / ``matmul_kernel`` lacking what the
            swaps call (not that package, e.g. a string or another of the packages). ValueError: ``org`` not a Hub
            organisation name; ``version`` < 1; ``attention_backend`` neither "sdpa" nor "triton"; ``mode`` without
            ``INFERENCE`` or ``TRAINING``; a ``device`` that is not a device (or not available); a model holding
            parameters of another floating dtype than float16, bfloat16 or float32 (e.g. float64); a norm layer
            that cannot serve ``mode``; nothing at all could be swapped (never a silent no-op).
        RuntimeError: a package cannot be loaded.
    """
    models = _transformers(pipe_or_model)
    _check_hub_args("kernelize", org, version)
    if attention_backend not in ("triton", "sdpa"):
        raise ValueError(f"kernelize: attention_backend must be 'triton' or 'sdpa', got {attention_backend!r}")
    _check_mode(mode)
    for name, flag in (("attention", attention), ("norms", norms), ("modulate", modulate),
                       ("feed_forward", feed_forward), ("blocks", blocks)):
        if not isinstance(flag, bool):  # "no" or "false" would read as True
            raise TypeError(f"kernelize: {name} must be a bool, got {flag!r}")
    if norm_families is not None and (not isinstance(norm_families, (tuple, list))
                                      or not all(isinstance(f, Family) for f in norm_families)):
        raise TypeError("kernelize: norm_families must be a tuple of integrations.families.Family (e.g. "
                        f"families.FAMILIES) or None, got {norm_families!r}")
    families = tuple(norm_families) if norm_families is not None else (DIFFUSERS_RMS,)
    for _, model in models:  # every check before the first swap: a refused call leaves the models as they were
        if norms:
            _device_type(model, device)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point() and p.dtype not in KERNEL_DTYPES),
                     None)
        if dtype is not None:
            raise ValueError(f"kernelize: {type(model).__name__} holds {dtype} parameters; the kernels take float16, "
                             "bfloat16 and float32 (convert the model first, e.g. model.float())")
    report = DiffusersKernelizeReport(model=", ".join(f"{p[:-1]}: {type(m).__name__}" if p else type(m).__name__
                                                      for p, m in models))
    plans = [(prefix, model, _plan(model, prefix, report, attention=attention, norms=norms, families=families,
                                   modulate=modulate, blocks=blocks, feed_forward=feed_forward))
             for prefix, model in models]
    hub = dict(org=org, version=version, trust_remote_code=trust_remote_code)
    if any(plan["processors"] for *_, plan in plans):
        _check_package("kernel", kernel, "triton-attention", ("rotary_embedding", "flash_attention"))
    norms_needs = ()  # what the adaLN swaps (norm_modulate) and the Wan blocks (all three) call
    if any(plan["ada"] or plan["blocks"] for *_, plan in plans):
        norms_needs += ("norm_modulate",)
    if any(plan["blocks"] for *_, plan in plans):
        norms_needs += ("gated_residual", "layer_norm")
    _check_package("norms_kernel", norms_kernel, "triton-norms", norms_needs)
    if any(plan["ff"] for *_, plan in plans):
        _check_package("matmul_kernel", matmul_kernel, "triton-matmul", ("layers.GELU", "layers.GEGLU"))
    if kernel is None and any(plan["processors"] for *_, plan in plans):
        from .transformers_attention import PACKAGE

        kernel = _get_kernel(PACKAGE, hub)
    norms_kernel = _load_package(norms_kernel, "triton-norms", hub,
                                 [t for *_, plan in plans for t in plan["ada"] + plan["blocks"]])
    matmul_kernel = _load_package(matmul_kernel, "triton-matmul", hub, [t for *_, plan in plans for t in plan["ff"]])
    for prefix, model, plan in plans:
        if plan["norms"]:  # all or nothing (transformers.kernelize), before anything else of this model is swapped
            norm_report = _kernelize_selected(model, *plan["norms"], mode=mode,
                                              device_type=_device_type(model, device), org=org, version=version,
                                              trust_remote_code=trust_remote_code, families=families)
            inside = {f"{name}.{child}" for name, _, _ in plan["ada"] + plan["blocks"]
                      for child in ("norm", "norm1", "norm2", "norm3")}
            report.norms.update({prefix + name: layer for name, layer in norm_report.swapped.items()
                                 if name not in inside})
            for what, why in norm_report.refused.items():  # a class, or a module name (an instance left alone)
                report.refused[f"{prefix}norms:{what}"] = why
        if plan["processors"]:
            new = {name: proc for name, proc in model.attn_processors.items()}
            for name, cls in plan["processors"].items():
                original = new[name].original if isinstance(new[name], _TritonProcessor) else new[name]
                new[name] = cls(kernel, attention_backend, original)
                report.processors[prefix + name] = cls.__name__ + ("" if attention_backend == "triton" else "(sdpa)")
            model.set_attn_processor(new)
        _apply(plan["ada"], norms_kernel, prefix, report)
        _apply(plan["blocks"], norms_kernel, prefix, report)
        _apply(plan["ff"], matmul_kernel, prefix, report)
    if not len(report):
        raise ValueError(f"kernelize: nothing to swap in {report.model}:\n{report.summary()}")
    log.info("%s", report.summary())
    return report
