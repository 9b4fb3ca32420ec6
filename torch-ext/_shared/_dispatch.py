"""Calling a registered op without the dispatcher when nothing needs it.

Every op of the collection is a ``torch.library.custom_op`` (autograd formula, fake implementation,
``torch.compile``, dispatch modes). Going through the dispatcher costs tens of
microseconds per call in Python (custom-op autograd wrapper, redispatch, the
dynamo-disable wrapper), as much as a whole small kernel. In plain eager inference
none of that machinery has anything to do, so the implementation is called directly;
everything else goes through the op.
"""

from __future__ import annotations

import torch

__all__ = ["call_op"]


# Plain tensors: a module's weights are nn.Parameter, which changes nothing for the dispatcher.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_eager(args) -> bool:
    """No compile tracing, no dispatch mode, no tensor subclass, no tensor that needs a gradient."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) not in _PLAIN_TYPES or (grad and a.requires_grad)):
            return False
    return True


def call_op(op, impl, *args):
    """``impl(*args)`` in plain eager inference, else ``op(*args)`` (same results either way)."""
    return impl(*args) if _plain_eager(args) else op(*args)
