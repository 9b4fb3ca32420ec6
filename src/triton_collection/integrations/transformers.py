"""Swap the norms of a transformers (or diffusers, or plain torch) model for triton-norms Hub layers.

    from kernels import Mode
    from triton_collection.integrations.transformers import kernelize

    report = kernelize(model, mode=Mode.INFERENCE)        # loads "triton-collection/triton-norms" v1
    print(report.swapped)   # {"model.layers.0.input_layernorm": "LlamaRMSNorm", ...}

Why not ``model.kernelize()`` / ``use_kernels=True``: transformers decorates every RMSNorm
class with the one layer name ``"RMSNorm"``, whatever its numerics (Llama casts before the
weight multiply, Olmo2/GptOss multiply in fp32, Gemma scales by ``1 + w``), so one mapping
cannot be exact for all of them. This module picks the layer per class
(:mod:`.families`: known classes plus a bitwise probe of the class's own forward), names
each selected class for the duration of the call with
:func:`kernels.replace_kernel_forward_from_hub`, registers the layers with
:func:`kernels.use_kernel_mapping` and lets :func:`kernels.kernelize` swap the forwards.
The class attributes are restored afterwards: the swap lives on the instances only, and a
later ``kernels.kernelize`` of the model by someone else behaves as if we never ran.

Only the selected modules are handed to ``kernels.kernelize`` (one call each), with
``use_fallback=False``: other kernelizable layers of the model (activations, rotary
functions) are left as they are, and a mode the layer cannot serve raises instead of
silently keeping the original forward.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import kernels
import torch
from kernels import LayerRepository, LocalLayerRepository, Mode
from torch import nn

from .. import DEFAULT_ORG
from ..manifest import check_org
from .families import (FAMILIES, KERNEL_DTYPES, LLAMA, LLAMA_DECODER, STRUCTURE_FAMILIES, Family, ProbeResult,
                       candidate_families, probe)

__all__ = ["KernelizeReport", "kernelize", "select_layers"]

log = logging.getLogger(__name__)

_MAPPING_PREFIX = "triton-collection"  # mapping keys "<prefix>/<package>:<layer>" never collide with others'
_DEVICE_TYPES = {"cpu", "cuda", "rocm", "xpu"}  # backends triton-norms ships a build for


@dataclass(frozen=True)
class KernelizeReport:
    """What :func:`kernelize` did.

    Attributes:
        device: device key the layers were mapped for (``"cuda"``, ``"rocm"``, ``"xpu"``, ``"cpu"``).
        mode: the ``kernels.Mode`` requested.
        swapped: qualified module name -> Hub layer name, for every module whose forward was replaced.
        layers: class (``module.QualName``) -> ``"<repo_id>:<layer>"`` chosen for it.
        refused: class -> reason, for norm-like classes left untouched; module name -> reason for an instance
            left untouched while its class is swapped elsewhere (configured unlike the swapped instances, or a
            decoder layer whose post_attention_layernorm is not swapped for the LlamaRMSNorm layer).
    """

    device: str
    mode: Mode
    swapped: dict[str, str] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.swapped)


def _class_key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _device_type(model: nn.Module, device: str | torch.device | None) -> str:
    if device is None:
        param = next(model.parameters(), None)
        if param is None:
            raise ValueError("kernelize: the model has no parameters to infer the device from; pass device=")
        kind = param.device.type
    elif isinstance(device, str) and device in _DEVICE_TYPES:
        kind = device
    else:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"kernelize: device must be a device type ({', '.join(sorted(_DEVICE_TYPES))}) or a "
                             f"torch.device, got {device!r}") from err
    if kind == "cuda" and torch.version.hip is not None:
        kind = "rocm"
    if kind not in _DEVICE_TYPES:
        raise ValueError(f"kernelize: the kernel packages have no build for device type {kind!r} (has {sorted(_DEVICE_TYPES)})")
    available = {"cuda": torch.cuda.is_available, "rocm": torch.cuda.is_available,
                 "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available()}.get(kind, lambda: True)
    if not available():
        raise ValueError(f"kernelize: device {device!r}: this PyTorch has no {kind} device")
    if kind == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        log.warning("Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (set before triton is imported)")
    return kind


def _config_value(value, module: nn.Module):
    """``value`` as part of an instance's configuration key: plain values themselves, sequences element-wise, a
    ``functools.partial`` by its function and arguments (transformers' GELUTanh makes one per instance), a method
    bound to the module by its function, any other object by identity (instances sharing one config or function
    object share the key)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_config_value(v, module) for v in value)
    if isinstance(value, functools.partial):
        return ("partial", _config_value(value.func, module), _config_value(value.args, module),
                tuple(sorted((k, _config_value(v, module)) for k, v in value.keywords.items())))
    if getattr(value, "__self__", None) is module and hasattr(value, "__func__"):
        return ("method", id(value.__func__))
    return ("object", id(value))


def _instance_config(module: nn.Module, candidates: tuple[Family, ...]) -> tuple:
    """What may make two instances of one class compute differently besides their parameter values: the instance's
    own public attributes (a ConvNeXt LayerNorm's ``data_format``, a grouped RMSNorm's ``group_size``, an
    activation's function, ``eps``), which a forward may branch on. Empty for the families classified by their
    forward's form (decoder layers, attention: the form admits no such branch; their attributes, ``layer_idx``,
    differ in every instance); a decoder layer's own norm instance is checked in :func:`_targets`."""
    if all(f in STRUCTURE_FAMILIES for f in candidates):
        return ()
    return tuple((k, _config_value(v, module)) for k, v in sorted(vars(module).items())
                 if not k.startswith("_") and k not in ("training", "forward"))  # an instance forward (accelerate's
    # hooks, an earlier kernelize) is not what the probe runs: it runs the class's


def _shown(config: tuple) -> str:
    """An :func:`_instance_config` for a message: its plain values (objects keyed by identity say nothing)."""
    return ", ".join(f"{k}={v!r}" for k, v in config if not (isinstance(v, tuple) and v[:1] == ("object",)))


def select_layers(model: nn.Module, *, families: tuple[Family, ...] = FAMILIES) -> tuple[dict[type, Family], dict[str, str]]:
    """Classify the norm classes of ``model``: ``({class: family}, {class or module name: refusal reason})``.

    A class is probed (:func:`.families.probe`) on its first instance of each configuration
    (:func:`_instance_config`: a forward may branch on an instance's attribute) and maps to the family of the
    first configuration that matches; an instance of a configuration that does not match that family is listed by
    its module name and left alone (:func:`_targets`). A class no configuration of which matches is listed by its
    name. Classes that are not norm-like at all are not listed.
    """
    chosen: dict[type, Family] = {}
    refused: dict[str, str] = {}
    results: dict[tuple, ProbeResult] = {}
    instances: dict[type, list[tuple[str, tuple]]] = {}
    for name, module in model.named_modules():
        candidates = tuple(f for f in candidate_families(module) if f in families)
        if not candidates:
            continue
        key = (type(module), candidates, _instance_config(module, candidates))
        if key not in results:
            results[key] = probe(module, candidates)
        instances.setdefault(type(module), []).append((name or type(model).__name__, key))
    for cls, found in instances.items():
        family = next((results[key].family for _, key in found if results[key].family is not None), None)
        if family is None:
            refused[_class_key(cls)] = results[found[0][1]].reason
            log.info("not swapping %s: %s", _class_key(cls), refused[_class_key(cls)])
            continue
        chosen[cls] = family
        log.debug("%s -> %s", _class_key(cls), family.layer)
        for name, key in found:
            result = results[key]
            if result.family is not family:
                why = result.reason if result.family is None else f"it matches the {result.family.layer} layer"
                refused[name] = (f"a {cls.__name__} configured unlike the instances swapped for the {family.layer} "
                                 f"layer ({_shown(key[2])}): {why}")
                log.info("not swapping %s: %s", name, refused[name])
    return chosen, refused


def _targets(model: nn.Module, chosen: dict[type, Family], refused: dict[str, str]) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every instance of a chosen class not refused by name, but a decoder layer only where its own
    ``post_attention_layernorm`` is an instance of a class chosen for the llama norm layer and not refused by name
    (a user's norm subclass in one layer is another class; an instance configured otherwise is refused by name):
    others go to ``refused`` by module name. Classes left without an instance leave ``chosen``."""
    targets = []
    for name, module in model.named_modules():
        family = chosen.get(type(module))
        if family is not None and (name or type(model).__name__) in refused:  # configured otherwise (select_layers)
            continue
        norm_name = f"{name}.post_attention_layernorm" if name else "post_attention_layernorm"
        if family is LLAMA_DECODER and (chosen.get(type(module.post_attention_layernorm)) is not LLAMA
                                        or norm_name in refused):
            refused[name or type(model).__name__] = (
                f"its post_attention_layernorm ({type(module.post_attention_layernorm).__name__}) is not swapped for "
                "the LlamaRMSNorm layer (its class is refused, or the llama family is not among the families), so "
                "the fused add_rms_norm would not be that norm")
        elif family is not None:
            targets.append((name, module))
    for cls in set(chosen) - {type(m) for _, m in targets}:
        del chosen[cls]
    return targets


def _local_override(repo_id: str) -> Path | None:
    """The path ``LOCAL_KERNELS="org/name=/path:..."`` gives ``repo_id``, as ``kernels.get_kernel`` reads it.

    ``LayerRepository(version=...)`` resolves the version in the cache before it looks at
    ``LOCAL_KERNELS``, so an override would fail offline; a ``LocalLayerRepository`` honours it.
    """
    for entry in filter(None, os.environ.get("LOCAL_KERNELS", "").split(":")):
        name, sep, path = entry.partition("=")
        if sep and name == repo_id:
            return Path(path)
    return None


def _repository(repo_id: str, layer: str, *, version: int, trust_remote_code: bool | list[str]):
    local = _local_override(repo_id)
    if local is not None:
        log.info("kernelize: %s from LOCAL_KERNELS path %s", repo_id, local)
        return LocalLayerRepository(repo_path=local, layer_name=layer)
    return LayerRepository(repo_id=repo_id, layer_name=layer, version=version, trust_remote_code=trust_remote_code)


def _load_hint(err: Exception) -> str:
    """What to do about a package that did not load: trust_remote_code is the remedy only for a publisher check;
    a missing version or package needs another."""
    if "trust" in str(err).lower():
        return "pass trust_remote_code=True for a Hub download from an untrusted publisher"
    return ("check the org, the package and the version (Hub branch v<version>), or install it locally "
            "(`triton-collection install-local`, then HF_HUB_OFFLINE=1)")


def _load_layer(repo: LayerRepository | LocalLayerRepository, repo_id: str, layer: str, mode: Mode) -> type[nn.Module]:
    """Load the Hub layer class and check that it can serve ``mode`` (clear errors, no silent fallback)."""
    try:
        layer_cls = repo.load()
    except Exception as err:
        raise RuntimeError(f"kernelize: cannot load layer {layer!r} of {repo_id}: {err}. {_load_hint(err)}.") from err
    if Mode.TRAINING in mode and not getattr(layer_cls, "has_backward", True):
        raise ValueError(f"kernelize: layer {layer!r} of {repo_id} has no backward, so it cannot serve {mode}")
    if Mode.TORCH_COMPILE in mode and not getattr(layer_cls, "can_torch_compile", False):
        raise ValueError(f"kernelize: layer {layer!r} of {repo_id} does not support torch.compile, so it cannot serve {mode}")
    return layer_cls


class _DropPerModuleRepoLine(logging.Filter):
    """``kernels`` logs "Using function/layer from repo ..." on the root logger once per module."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Using function/layer from repo")


@contextlib.contextmanager
def _quiet_kernels_root_log():
    # A logger filter only sees records logged on that logger itself, i.e. `logging.info(...)` calls.
    root, flt = logging.getLogger(), _DropPerModuleRepoLine()
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


def _check_hub_args(caller: str, org: str, version: int) -> None:
    """``org`` a Hub organisation name and ``version`` a whole number >= 1 (the Hub branch ``v<version>``), checked
    before anything is loaded: ``kernels`` would report ``version="1"`` as "Version 1 not found, available versions:
    1", and a bad org as a package that cannot be loaded."""
    try:
        check_org(org)
    except ValueError as err:
        raise ValueError(f"{caller}: {err}") from None
    if type(version) is not int:
        raise TypeError(f"{caller}: version must be an int >= 1 (the Hub branch v<version>), got {version!r}")
    if version < 1:
        raise ValueError(f"{caller}: version must be >= 1 (the Hub branch v<version>), got {version}")


def _check_families(families) -> tuple[Family, ...]:
    if not isinstance(families, (tuple, list)) or not families or not all(isinstance(f, Family) for f in families):
        raise TypeError("kernelize: families must be a non-empty tuple of integrations.families.Family (e.g. "
                        f"families.FAMILIES or families.ALL_FAMILIES), got {families!r}")
    return tuple(families)


def _check_mode(mode: Mode) -> None:
    if not isinstance(mode, Mode):
        raise TypeError(f"kernelize: mode must be a kernels.Mode, got {mode!r}")
    if mode == Mode.FALLBACK or (Mode.INFERENCE not in mode and Mode.TRAINING not in mode):
        raise ValueError(f"kernelize: mode must contain Mode.INFERENCE or Mode.TRAINING, got {mode}")


def kernelize(
    model: nn.Module,
    *,
    mode: Mode,
    device: str | torch.device | None = None,
    org: str = DEFAULT_ORG,
    version: int = 1,
    trust_remote_code: bool | list[str] = False,
    families: tuple[Family, ...] = FAMILIES,
) -> KernelizeReport:
    """Replace the forward of every norm module of ``model`` by the exactly matching triton-norms layer.

    Args:
        model: any ``nn.Module``; its modules are walked with ``named_modules()``.
        mode: ``kernels.Mode`` (``INFERENCE``, ``TRAINING``, optionally ``| TORCH_COMPILE``).
        device: device the layers are mapped for; default the device of the model's first parameter.
        org: Hub organisation of ``<org>/triton-norms``.
        version: package version (the Hub branch ``v<version>``).
        trust_remote_code: passed to ``LayerRepository`` (the org need not be a trusted publisher;
            with ``HF_HUB_OFFLINE=1`` the check is skipped by ``kernels``).
        families: families allowed to be swapped (default the norms, :data:`.families.FAMILIES`;
            :data:`.families.ALL_FAMILIES` also swaps transformers' decorated activations for
            triton-activations layers, e.g. the ``SiLUActivation`` of Llama MLPs).

    Returns:
        a :class:`KernelizeReport`; also logged at INFO level.

    Raises:
        TypeError: ``model`` not an ``nn.Module``; ``mode`` not a ``kernels.Mode``; ``version`` not an int;
            ``families`` not a non-empty tuple of :class:`.families.Family`.
        ValueError: no module of the model can be replaced; a mode the layer cannot serve
            (training without backward, torch.compile without ``can_torch_compile``); bad mode/device; ``org`` not a
            Hub organisation name; ``version`` < 1; a module
            to replace holding parameters of another dtype than float16, bfloat16 or float32 (e.g. float64).
        RuntimeError: the package cannot be loaded, or a forward was not replaced after ``kernels.kernelize``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"kernelize: model must be a torch.nn.Module, got {type(model).__name__}")
    _check_mode(mode)
    _check_hub_args("kernelize", org, version)
    families = _check_families(families)
    device_type = _device_type(model, device)
    return _kernelize_selected(model, *select_layers(model, families=families), mode=mode, device_type=device_type,
                               org=org, version=version, trust_remote_code=trust_remote_code, families=families)


def _kernelize_selected(model: nn.Module, chosen: dict[type, Family], refused: dict[str, str], *, mode: Mode,
                        device_type: str, org: str, version: int, trust_remote_code: bool | list[str],
                        families: tuple[Family, ...]) -> KernelizeReport:
    """:func:`kernelize` after :func:`select_layers` (``chosen, refused``) for a caller that has classified the
    model itself (the diffusers shim plans before it swaps): the same swaps, report and errors, no second probe.
    ``mode`` checked and ``device_type`` resolved (``_device_type``) by the caller."""
    targets = _targets(model, chosen, refused)
    if not chosen:
        detail = "; ".join(f"{k}: {v}" for k, v in refused.items()) \
            or f"no module of the families {', '.join(f.name for f in families)} found"
        packages = " or ".join(sorted({f.package for f in families}, reverse=True))
        raise ValueError(f"kernelize: {type(model).__name__} has no module that {packages} can replace ({detail})")

    # One repository and one loaded layer class per family.
    repos: dict[Family, tuple[str, LayerRepository | LocalLayerRepository, type[nn.Module]]] = {}
    for family in dict.fromkeys(chosen.values()):
        repo_id = f"{org}/{family.package}"
        repo = _repository(repo_id, family.layer, version=version, trust_remote_code=trust_remote_code)
        repos[family] = (repo_id, repo, _load_layer(repo, repo_id, family.layer, mode))
    key = {family: f"{_MAPPING_PREFIX}/{family.package}:{family.layer}" for family in repos}
    mapping = {key[family]: {device_type: repo} for family, (_, repo, _) in repos.items()}

    for name, module in targets:  # before any swap: the layers would refuse these dtypes at the first forward
        dtype = next((t.dtype for t in module.parameters() if t.dtype not in KERNEL_DTYPES), None)
        if dtype is not None:
            raise ValueError(f"kernelize: {name or type(model).__name__} ({type(module).__name__}) holds {dtype} "
                             "parameters; the triton layers serve float16, bfloat16 and float32 (convert the model "
                             "first, e.g. model.float())")
    target_ids = {id(module) for _, module in targets}
    # decorated classes inside a target that this call does not swap (a gated MLP's act_fn whose family is not
    # chosen): kernels.kernelize walks a target's children and, with no mapping for them, would raise
    passed_over = {type(m) for _, t in targets for m in t.modules()
                   if m is not t and hasattr(type(m), "kernel_layer_name") and type(m) not in chosen}
    saved = {cls: {a: cls.__dict__[a] for a in ("kernel_layer_name", "kernel_condition") if a in cls.__dict__}
             for cls in (*chosen, *passed_over)}
    try:
        for cls, family in chosen.items():
            # exact type and this call's instances only: subclasses (FP32LayerNorm) inherit the attribute
            kernels.replace_kernel_forward_from_hub(
                cls, key[family], condition=lambda m, cls=cls: type(m) is cls and id(m) in target_ids
            )
        for cls in passed_over:
            cls.kernel_condition = staticmethod(lambda m: False)
        prior = [(module, vars(module).get("forward")) for _, module in targets]
        # kernel functions attached inside a target (a decoder layer's attention holds transformers' rotary_pos_emb):
        # kernels.kernelize would look each up in this call's mapping, which maps none (kernelize_rotary does)
        hidden = {id(m): (m, vars(m).pop("_kernel_funcs")) for _, t in targets for m in t.modules()
                  if "_kernel_funcs" in vars(m)}
        # accelerate's hooks (dispatch_model, device_map="auto": one on each block it places, moving inputs and
        # offloaded weights) wrap the forward and call module._old_forward: the swap goes there, under the hook
        hooked = {id(module): (module, vars(module)["forward"]) for _, module in targets
                  if hasattr(module, "_hf_hook") and hasattr(module, "_old_forward") and "forward" in vars(module)}
        try:
            with kernels.use_kernel_mapping(mapping), _quiet_kernels_root_log():
                for _, module in targets:
                    kernels.kernelize(module, mode=mode, device=device_type, use_fallback=False)
            for module, wrapper in hooked.values():
                module._old_forward, module.forward = module.forward, wrapper
        except BaseException:
            for module, forward in prior:  # all or nothing: no half-kernelized model
                if forward is None:
                    vars(module).pop("forward", None)
                else:
                    module.forward = forward
            raise
        finally:
            for module, funcs in hidden.values():
                vars(module)["_kernel_funcs"] = funcs
    finally:
        for cls, attrs in saved.items():
            for attr in ("kernel_layer_name", "kernel_condition"):
                if attr in attrs:
                    setattr(cls, attr, attrs[attr])
                elif attr in cls.__dict__:
                    delattr(cls, attr)

    report = KernelizeReport(device=device_type, mode=mode, refused=refused)
    for cls, family in chosen.items():
        report.layers[_class_key(cls)] = f"{repos[family][0]}:{family.layer}"
    for name, module in targets:
        family = chosen[type(module)]
        expected = repos[family][2].forward
        func = getattr(module._old_forward if id(module) in hooked else module.forward, "__func__", None)
        if func is None or (func.__module__, func.__qualname__) != (expected.__module__, expected.__qualname__):
            raise RuntimeError(f"kernelize: {name or type(model).__name__} still runs {module.forward!r}, not {family.layer}")
        report.swapped[name] = family.layer
        log.debug("kernelize: %s -> %s", name, family.layer)
    for cls_name, layer in report.layers.items():
        count = sum(1 for _, m in targets if _class_key(type(m)) == cls_name)
        log.info("kernelize: %d x %s -> %s", count, cls_name, layer)
    log.info("kernelize: swapped %d modules on %s for %s", len(report.swapped), device_type, mode)
    return report
