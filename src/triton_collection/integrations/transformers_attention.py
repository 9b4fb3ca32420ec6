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
from types import ModuleType

import kernels
import torch
from kernels import Mode

from .. import DEFAULT_ORG
from .transformers import _load_layer, _repository

__all__ = ["PACKAGE", "kernelize_rotary", "load", "register"]

log = logging.getLogger(__name__)

PACKAGE = "triton-attention"
ROTARY_NAME = "rotary_pos_emb"  # transformers' kernel layer name of apply_rotary_pos_emb
ROTARY_LAYER = "RotaryPosEmb"


def load(*, org: str = DEFAULT_ORG, version: int = 1, trust_remote_code: bool = False) -> ModuleType:
    """``kernels.get_kernel("<org>/triton-attention", version=version)`` (cache, LOCAL_KERNELS or the Hub)."""
    return kernels.get_kernel(f"{org}/{PACKAGE}", version=version, trust_remote_code=trust_remote_code)


def register(name: str = "triton", *, kernel: ModuleType | None = None, org: str = DEFAULT_ORG, version: int = 1,
             trust_remote_code: bool = False) -> str:
    """Registers triton-attention with transformers as ``attn_implementation=name``; returns ``name``.

    Args:
        name: the implementation name (must not be one of transformers' own: "sdpa", "eager", ...).
        kernel: an already loaded triton-attention package (default: :func:`load` with org/version).

    Raises:
        ValueError: ``name`` is one of transformers' own implementations (names starting with "triton" may be
            registered again).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if name == "eager" or (name in AttentionInterface._global_mapping and not name.startswith("triton")):
        raise ValueError(f"name {name!r} is one of transformers' own attention implementations; pick another")
    kernel = kernel if kernel is not None else load(org=org, version=version, trust_remote_code=trust_remote_code)
    AttentionInterface.register(name, kernel.transformers_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The distinct kernelizable ``rotary_pos_emb`` function modules attached to ``model``'s modules."""
    found: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        for fn in getattr(module, "_kernel_funcs", {}).values():
            if getattr(type(fn), "kernel_layer_name", None) == ROTARY_NAME:
                found[id(fn)] = fn
    return list(found.values())


def kernelize_rotary(model: torch.nn.Module, *, mode: Mode = Mode.INFERENCE, device: str | None = None,
                     org: str = DEFAULT_ORG, version: int = 1, trust_remote_code: bool = False) -> int:
    """Swaps transformers' kernelizable ``apply_rotary_pos_emb`` for triton-attention's ``RotaryPosEmb``.

    Returns:
        How many rotary function modules were swapped (0 when the model attaches none: then a
        ValueError is raised instead, so nothing is silently left as it was).

    Raises:
        ValueError: the model has no kernelizable rotary function, or the mode cannot be served.
        RuntimeError: the package cannot be loaded.
    """
    funcs = _rotary_modules(model)
    if not funcs:
        raise ValueError("kernelize_rotary: the model attaches no kernelizable `rotary_pos_emb` function "
                         "(transformers' use_kernelized_func(apply_rotary_pos_emb))")
    if device is None:
        param = next(model.parameters(), None)
        device = param.device.type if param is not None else "cpu"
    repo_id = f"{org}/{PACKAGE}"
    repo = _repository(repo_id, ROTARY_LAYER, version=version, trust_remote_code=trust_remote_code)
    _load_layer(repo, repo_id, ROTARY_LAYER, mode)
    with kernels.use_kernel_mapping({ROTARY_NAME: {device: repo}}, inherit_mapping=False):
        for fn in funcs:
            kernels.kernelize(fn, mode=mode, device=device, use_fallback=False)
    log.info("kernelize_rotary: %d rotary function module(s) -> %s:%s", len(funcs), repo_id, ROTARY_LAYER)
    return len(funcs)
