"""triton-attention in transformers: ``attn_implementation="triton"`` and the kernelized rotary function.

    from triton_collection.integrations.transformers_attention import register, kernelize_rotary

    register()                                     # loads triton-collection/triton-attention v1
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="triton")
    # or, on a loaded model: model.set_attn_implementation("triton")
    n = kernelize_rotary(model, mode=Mode.INFERENCE)   # apply_rotary_pos_emb -> RotaryPosEmb layer

``register`` adds the package's ``transformers_attention_forward`` to transformers'
``AttentionInterface`` and transformers' own ``sdpa_mask`` to ``AttentionMaskInterface`` under the
same name, so the model builds exactly the masks its SDPA path builds (boolean, or None when a
plain causal mask can be skipped) and our kernel consumes them.

``kernelize_rotary`` maps transformers' kernelizable function ``rotary_pos_emb`` (the
``apply_rotary_pos_emb`` of 120+ models, attached with ``use_kernelized_func``) to the
package's ``RotaryPosEmb`` layer through ``kernels.use_kernel_mapping`` + ``kernels.kernelize``.
transformers makes each decorated function one module shared by every model that uses it, so
the swap applies to that function everywhere in the process, as transformers' own
``use_kernels=True`` does.
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType

import kernels
import torch
from kernels import Mode

from .. import DEFAULT_ORG
from .families import _rotary_mismatch
from .transformers import _check_hub_args, _check_mode, _device_type, _load_layer, _repository

__all__ = ["PACKAGE", "kernelize_rotary", "load", "register"]

log = logging.getLogger(__name__)

PACKAGE = "triton-attention"
ROTARY_NAME = "rotary_pos_emb"  # transformers' kernel layer name of apply_rotary_pos_emb
ROTARY_LAYER = "RotaryPosEmb"


def load(*, org: str = DEFAULT_ORG, version: int = 1, trust_remote_code: bool = False) -> ModuleType:
    """``kernels.get_kernel("<org>/triton-attention", version=version)`` (cache, LOCAL_KERNELS or the Hub).

    Raises:
        TypeError: ``version`` not an int. ValueError: ``org`` not a Hub organisation name, ``version`` < 1 (both
            before the cache is read), or kernels' own errors for a version or package that is not there.
    """
    _check_hub_args("load", org, version)
    return kernels.get_kernel(f"{org}/{PACKAGE}", version=version, trust_remote_code=trust_remote_code)


def register(name: str = "triton", *, kernel: ModuleType | None = None, org: str = DEFAULT_ORG, version: int = 1,
             trust_remote_code: bool = False) -> str:
    """Registers triton-attention with transformers as ``attn_implementation=name``; returns ``name``.

    Args:
        name: the implementation name (must not be one of transformers' own: "sdpa", "eager", ...).
        kernel: an already loaded triton-attention package (default: :func:`load` with org/version).

    Raises:
        ValueError: ``name`` is not a non-empty string, or is one of transformers' own implementations (names
            starting with "triton" may be registered again).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty string (the attn_implementation to register), got {name!r}")
    if name == "eager" or (name in AttentionInterface._global_mapping and not name.startswith("triton")):
        raise ValueError(f"name {name!r} is one of transformers' own attention implementations; pick another")
    kernel = kernel if kernel is not None else load(org=org, version=version, trust_remote_code=trust_remote_code)
    AttentionInterface.register(name, kernel.transformers_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The distinct kernelizable ``rotary_pos_emb`` function modules of ``model``: each one attached to a module
    (``_kernel_funcs``), and the module-level function of the same class in the file that defines the module's class:
    the one its forward calls (transformers 5.22's attention forwards call the module-level
    ``apply_rotary_pos_emb``; after ``copy.deepcopy`` the attached one is a copy that nothing calls)."""
    found: dict[int, torch.nn.Module] = {}
    globals_of: dict[str, list] = {}  # defining module name -> its module-level function modules
    for module in model.modules():
        for fn in getattr(module, "_kernel_funcs", {}).values():
            if getattr(type(fn), "kernel_layer_name", None) != ROTARY_NAME:
                continue
            found[id(fn)] = fn
            for name in {c.__module__ for c in type(module).__mro__}:  # an inherited forward's module too
                if name not in globals_of:
                    defining = sys.modules.get(name)
                    globals_of[name] = [g for g in vars(defining).values() if isinstance(g, torch.nn.Module)] \
                        if defining is not None else []
                for g in globals_of[name]:
                    if type(g) is type(fn):
                        found[id(g)] = g
    return list(found.values())


def kernelize_rotary(model: torch.nn.Module, *, mode: Mode = Mode.INFERENCE, device: str | None = None,
                     org: str = DEFAULT_ORG, version: int = 1, trust_remote_code: bool = False) -> int:
    """Swaps transformers' kernelizable ``apply_rotary_pos_emb`` for triton-attention's ``RotaryPosEmb``.

    Only functions that compute what ``RotaryPosEmb`` computes are swapped: each is probed first
    (:func:`_rotary_mismatch`: bitwise against Llama's formula in fp32, fp16, bf16 and with fp32 cos / sin);
    the others (e.g. NanoChat, GPT-OSS, ESM, ModernBERT, OLMo) are left as they are and logged at WARNING.

    The module-level function that the attention forwards call is swapped with the ones attached to the model's
    modules (they differ after ``copy.deepcopy``, whose attached copies nothing calls), so the swap applies to
    every model of that family in the process.

    Returns:
        How many rotary function modules were swapped, attached and module-level (at least 1: when none can be, a
        ValueError is raised instead, so nothing is silently left as it was).

    Raises:
        TypeError: ``mode`` not a ``kernels.Mode``; ``version`` not an int.
        ValueError: the model has no kernelizable rotary function, none of its rotary functions is Llama's
            formula (the reasons listed), the mode cannot be served, a ``device`` that is not a device (or not
            available), ``org`` not a Hub organisation name, ``version`` < 1.
        RuntimeError: the package cannot be loaded.
    """
    _check_mode(mode)
    _check_hub_args("kernelize_rotary", org, version)
    found = _rotary_modules(model)
    if not found:
        raise ValueError("kernelize_rotary: the model attaches no kernelizable `rotary_pos_emb` function "
                         "(transformers' use_kernelized_func(apply_rotary_pos_emb))")
    funcs, refused = [], {}
    for fn in found:
        why = _rotary_mismatch(fn)
        if why is None:
            funcs.append(fn)
        else:
            refused[type(fn).__qualname__] = why
            log.warning("kernelize_rotary: not swapping %s: %s", type(fn).__qualname__, why)
    if not funcs:
        raise ValueError("kernelize_rotary: no rotary function of the model is one RotaryPosEmb replaces exactly: "
                         + "; ".join(f"{name}: {why}" for name, why in refused.items()))
    if device is None and next(model.parameters(), None) is None:
        device = "cpu"  # a bare holder of the function: nothing to infer the device from
    else:  # "cuda:0" / torch.device -> the device type kernels maps (it refused "cuda:0"; "cuda" on a CPU-only
        device = _device_type(model, device)  # torch failed with an AssertionError)
    repo_id = f"{org}/{PACKAGE}"
    repo = _repository(repo_id, ROTARY_LAYER, version=version, trust_remote_code=trust_remote_code)
    _load_layer(repo, repo_id, ROTARY_LAYER, mode)
    with kernels.use_kernel_mapping({ROTARY_NAME: {device: repo}}, inherit_mapping=False):
        for fn in funcs:
            kernels.kernelize(fn, mode=mode, device=device, use_fallback=False)
    log.info("kernelize_rotary: %d rotary function module(s) -> %s:%s", len(funcs), repo_id, ROTARY_LAYER)
    return len(funcs)
