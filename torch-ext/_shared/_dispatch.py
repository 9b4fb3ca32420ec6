"""Calling a registered op without the dispatcher when nothing needs it.

Every op of the collection is a ``torch.library.custom_op`` (autograd formula, fake implementation,
``torch.compile``, dispatch modes). Going through the dispatcher costs tens of
microseconds per call in Python (custom-op autograd wrapper, redispatch, the
dynamo-disable wrapper), as much as a whole small kernel. In plain eager code
none of that machinery has anything to do: inference calls the implementation
directly, and training calls it through a ``torch.autograd.Function`` built from the
op's own autograd formula (:func:`eager_autograd`). Everything else (compile
tracing, dispatch modes, tensor subclasses) goes through the op. Results are the
same bits either way. :func:`inference` answers the same question for a caller that
keeps a validated launch plan per call signature and runs it itself.
"""

from __future__ import annotations

import torch

__all__ = ["call_op", "eager_autograd", "inference"]

# Plain tensors: a module's weights are nn.Parameter, which changes nothing for the dispatcher.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
OP, IMPL, AUTOGRAD = 0, 1, 2


def _route(args) -> int:
    """OP under compile tracing, a dispatch mode, a functorch transform or a tensor subclass; else
    AUTOGRAD when a tensor needs a gradient, IMPL when none does."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active()):
        return OP
    grad = torch.is_grad_enabled()
    route = IMPL
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TYPES:
                return OP
            if grad and a.requires_grad:
                route = AUTOGRAD
    return route


def inference(tensors: tuple) -> bool:
    """True where :func:`call_op` would call the implementation directly (plain eager code, no
    gradient needed) for these arguments: ``tensors`` holds every tensor argument of the call (None for
    an absent one); anything that is neither None nor a plain tensor answers False."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active()):  # vmap / jvp wrap their tensors: no data_ptr()
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TYPES or grad and t.requires_grad):
            return False
    return True


def eager_autograd(impl, setup_context, backward) -> type:
    """A ``torch.autograd.Function`` running ``impl`` with the op's ``setup_context``/``backward``
    (the functions given to ``register_autograd``), for eager training without the dispatcher.

    Written in the form whose ``forward`` takes ``ctx``: a Function with a separate ``setup_context``
    binds its arguments with ``inspect.signature`` on every call (about 25 us of host time per call on
    our CPU machine, 3x that on the GPU host), and functorch transforms, which need the separate form,
    never reach it (``_route`` sends them to the op)."""

    class EagerAutograd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            output = impl(*args)
            setup_context(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    EagerAutograd.__name__ = EagerAutograd.__qualname__ = f"EagerAutograd_{impl.__name__}"
    return EagerAutograd


def call_op(op, impl, *args, autograd=None, infer=None):
    """``impl(*args)`` in plain eager inference (``infer(*args)`` when given: an implementation
    that skips what only backward needs, e.g. saved statistics, or returns None for an output
    the op fills with an empty tensor), ``autograd.apply(*args)`` in plain eager training (when
    given), else ``op(*args)``; the same values every way (a caller of ``infer`` takes either form)."""
    route = _route(args)
    if route == IMPL:
        return (infer or impl)(*args)
    if route == AUTOGRAD and autograd is not None:
        return autograd.apply(*args)
    return op(*args)
