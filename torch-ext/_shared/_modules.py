"""Calls of a layer's sub-modules without ``nn.Module.__call__``'s host time, where that call would run nothing but
the forward: a kernelized decode step makes about ten such calls per decoder layer (~5 us each on our CPU machine).

Anything a module call does besides its forward puts the module call back: hooks (the module's own or global ones;
transformers' output capture installs forward hooks), ``module.compile()``, a class with its own ``__call__``, a
global wrapper of ``nn.Module.__call__`` (non-strict ``torch.export`` records module scopes that way) and tracing
(``torch.jit.trace``, Dynamo), which record the module scopes in the call.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _nn_module

__all__ = ["call", "project", "runs_hooks", "unwatched_state"]

_MODULE_CALL = nn.Module._wrapped_call_impl  # nn.Module.__call__, unless replaced (a global wrapper: torch.export)
# nn.Linear's own forward (None where something patched it before this import: then never bypassed)
_LINEAR_FORWARD = nn.Linear.forward if (nn.Linear.forward.__module__, nn.Linear.forward.__qualname__) == (
    "torch.nn.modules.linear", "Linear.forward") else None


def unwatched_state(module) -> Optional[dict]:
    """``module.__dict__`` where ``module`` is an ``nn.Module`` that no hook watches (its own forward, forward-pre
    and backward hooks, global module hooks: calling it would run them), else None."""
    try:
        state = module.__dict__
        if (state["_forward_hooks"] or state["_forward_pre_hooks"] or state["_backward_hooks"]
                or state["_backward_pre_hooks"]):
            return None
    except (AttributeError, KeyError):  # not an nn.Module
        return None
    if (_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
            or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks):
        return None
    return state


def runs_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` would run a hook (its own forward, forward-pre or backward hooks, global ones)."""
    return unwatched_state(module) is None


def _forward_only(module, state: Optional[dict]) -> bool:
    """Whether calling ``module`` (whose unwatched ``state`` is given) runs its forward and nothing else."""
    return (state is not None and type(module).__call__ is _MODULE_CALL and state.get("_compiled_call_impl") is None
            and not torch._C._get_tracing_state() and not torch.compiler.is_compiling())


def call(module: nn.Module, *args, **kwargs):
    """``module(*args, **kwargs)``, by its ``forward`` directly where that is all the call would run."""
    if _forward_only(module, unwatched_state(module)):
        return module.forward(*args, **kwargs)
    return module(*args, **kwargs)


def project(proj, x: torch.Tensor) -> torch.Tensor:
    """``proj(x)``: ``F.linear`` itself where that is all the call would run (an ``nn.Linear``, not a subclass, with
    nn.Linear's own forward, no instance forward, and nothing else in the call); otherwise the module call
    (quantised, LoRA and parametrized linears are other classes; accelerate's device-map hooks set an instance
    forward)."""
    if type(proj) is nn.Linear and nn.Linear.forward is _LINEAR_FORWARD:
        state = unwatched_state(proj)
        if "forward" not in (state or ()) and _forward_only(proj, state):
            return F.linear(x, proj.weight, proj.bias)  # attributes: torch.func.functional_call swaps them
    return proj(x)
