"""Calling the registered op without the dispatcher when nothing needs it.

``matmul`` is a ``torch.library.custom_op`` (autograd formula, fake implementation,
``torch.compile``, dispatch modes). The dispatcher path costs tens of microseconds
of Python per call; in plain eager inference (no tracing, no dispatch mode, no
subclass, nothing requiring grad) the implementation is called directly instead.
Results are the same either way.
"""

from __future__ import annotations

import torch

__all__ = ["call_op"]


def _plain_eager(args) -> bool:
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if isinstance(a, torch.Tensor) and (type(a) is not torch.Tensor or (grad and a.requires_grad)):
            return False
    return True


def call_op(op, impl, *args):
    """``impl(*args)`` in plain eager inference, else ``op(*args)``."""
    return impl(*args) if _plain_eager(args) else op(*args)
