"""The dtype eager PyTorch computes an op in under ``torch.autocast``, for layers that replace such a module.

Autocast casts the inputs of some ops, per device type and PyTorch version: on CUDA ``F.linear`` and
``scaled_dot_product_attention`` to the autocast dtype, ``F.layer_norm``, ``softmax``, ``cross_entropy``
and ``pow`` to fp32 (on the CPU other lists apply). A layer that replaces a module calling such an op
gives the module's result only if it computes in the same dtype. Rather than copy PyTorch's lists,
:func:`autocast_to` asks PyTorch: once per op, device type, autocast dtype and input dtype it runs the
op on a one-element tensor under the autocast state of the call and keeps the dtype of the result.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["autocast_to", "cast"]


def _ones(dtype, device):
    return torch.ones((1, 1, 1, 1), dtype=dtype, device=device)


# op name -> the PyTorch call whose autocast policy it probes, on a (1, 1, 1, 1) tensor
_PROBES = {
    "linear": lambda t: F.linear(t, t[0, 0]),
    "layer_norm": lambda t: F.layer_norm(t, (1,)),
    "rms_norm": lambda t: F.rms_norm(t, (1,)),
    "softmax": lambda t: torch.softmax(t, -1),
    "cross_entropy": lambda t: F.cross_entropy(t[0, 0], torch.zeros(1, dtype=torch.long, device=t.device)),
    "pow": lambda t: torch.pow(t, 3.0),
    "scaled_dot_product_attention": lambda t: F.scaled_dot_product_attention(t, t, t),
}

# (op, device type, autocast dtype) -> the dtype autocast casts the op's floating arguments to, or None
_TARGETS: dict = {}
# the dtypes autocast casts (never fp64)
_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)


def _probe(op: str, device: torch.device, low: torch.dtype) -> Optional[torch.dtype]:
    """Where autocast sends ``op``'s floating arguments: the autocast dtype ``low`` (lower-precision ops such as
    linear), fp32 (ops autocast runs in fp32), or None (ops it leaves alone)."""
    probe = _PROBES[op]
    with torch.no_grad():
        if probe(_ones(torch.float32, device)).dtype != torch.float32:
            return low
        if probe(_ones(low, device)).dtype == torch.float32:
            return torch.float32
    return None


def autocast_to(op: str, t: torch.Tensor) -> Optional[torch.dtype]:
    """The dtype that eager PyTorch's ``op`` (a key of ``_PROBES``) casts its floating arguments to under the
    autocast state of this call, for a call on ``t``'s device; None where autocast is off for that device type or
    leaves the op alone, and for an fp64 ``t`` (autocast never casts fp64). A layer then passes its floating inputs
    and parameters through :func:`cast`: every one of them, whatever ``t``'s own dtype, as autocast does."""
    if not torch._C._is_any_autocast_enabled():
        return None
    kind = t.device.type
    if not torch.is_autocast_enabled(kind) or t.dtype not in _ELIGIBLE:
        return None
    if torch.compiler.is_compiling():  # traced: the probe's dtypes are known while tracing, nothing is kept
        return _probe(op, t.device, torch.get_autocast_dtype(kind))
    key = (op, kind, torch.get_autocast_dtype(kind))
    try:
        return _TARGETS[key]
    except KeyError:
        return _TARGETS.setdefault(key, _probe(op, t.device, key[2]))


def cast(dtype: torch.dtype, *tensors):
    """``tensors`` with each fp16 / bf16 / fp32 tensor cast to ``dtype`` (None, fp64 and other tensors as they are),
    as autocast casts an op's arguments."""
    return tuple(t.to(dtype) if t is not None and t.dtype in _ELIGIBLE else t for t in tensors)
