"""Calling a registered op without the dispatcher when nothing needs it.

Every op of the collection is a ``torch.library.custom_op`` (autograd formula, fake implementation,
``torch.compile``, dispatch modes). Going through the dispatcher costs tens of
microseconds per call in Python (custom-op autograd wrapper, redispatch, the
dynamo-disable wrapper), as much as a whole small kernel. In plain eager code
none of that machinery has anything to do: inference calls the implementation
directly, and training calls it through a ``torch.autograd.Function`` built from the
op's own autograd formula (:func:`eager_autograd`). Functorch transforms
(``torch.func.grad``, ``vjp``, ``jacrev``, ``vmap``) call the op through a second
Function built from the same formula, in the form they require (PyTorch's own
wrapper of a custom op's formula lacks it: pytorch/pytorch#168393). Everything else
(compile tracing, dispatch modes, tensor subclasses) goes through the op, and so does
a tensor with the negative bit set (``z.conj().imag``, ``torch._neg_view``): its memory
holds the negated values, which the kernels would read as they are, while the
dispatcher's Negative fallback materialises it first. Results are the same bits either
way. :func:`eager_mode` (and :func:`inference`) answers the same question for a caller that keeps a
validated launch plan per call signature and runs it itself.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _forward_ad

__all__ = ["AUTOGRAD", "IMPL", "OP", "call_op", "eager_autograd", "eager_mode", "fp32_vjp", "inference",
           "legacy_batched", "no_second_derivative", "sigmoid_pair"]

# Plain tensors: a module's weights are nn.Parameter, which changes nothing for the dispatcher.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
# The batched tensors of PyTorch's legacy vmap (``autograd.grad(is_grads_batched=True)``,
# ``autograd.functional.jacobian / hessian(vectorize=True)``, which batch the upstream gradients): plain tensors
# without storage, which the dispatcher's batching fallback runs one slice at a time through the op. Checked only
# where the implementation has failed (call_op) or on an upstream gradient: a check per tensor and call cost 4-8% of
# a small call's host time.
legacy_batched = torch._C._functorch.is_legacy_batchedtensor
OP, IMPL, AUTOGRAD, FUNCTORCH = 0, 1, 2, 3


def _route(args) -> int:
    """OP under compile tracing, ``torch.jit.trace``, a dispatch mode or for a tensor subclass; FUNCTORCH under a functorch
    transform; AUTOGRAD when forward-mode AD is on (a dual level entered: the ops have no forward-mode
    formula, and a Function raises for a tangent where the op would drop it; :func:`call_op` resolves
    negative bits first); OP for a tensor with the negative bit set (the op resolves it; the implementation
    would read the negated memory); else AUTOGRAD when a tensor needs a gradient, IMPL otherwise. (The
    conjugate bit needs no check: only complex tensors carry it, and every op rejects complex dtypes.)"""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0 or torch._C._is_tracing():
        return OP  # torch.jit.trace records the custom op (its launch planning would see traced sizes)
    if torch._C._are_functorch_transforms_active():
        return FUNCTORCH
    grad = torch.is_grad_enabled()
    route = IMPL
    neg = False
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TYPES:
                return OP
            if a.is_neg():
                neg = True
            if grad and a.requires_grad:
                route = AUTOGRAD
    if _forward_ad._current_level >= 0:  # forward-mode AD: a Function, which refuses tangents without a jvp formula
        return AUTOGRAD
    return OP if neg else route


def eager_mode(tensors: tuple, required: int = 1) -> int:
    """Whether a call with these tensor arguments (``tensors``: every tensor argument, None for an absent one; the
    first ``required`` must be present: a None there is OP, whose checks name it) is plain eager code, which a
    caller that keeps a validated launch plan per call signature may run itself: IMPL
    where no tensor needs a gradient (:func:`call_op` would call the implementation), AUTOGRAD where grad mode is on
    and one does (:func:`call_op` would run the eager ``torch.autograd.Function``); OP otherwise, where the caller
    leaves the call to :func:`call_op`, which decides: compile tracing, a dispatch mode, a functorch transform
    (vmap / jvp wrap their tensors: no data_ptr()), a dual level (tangents), an argument that is neither None nor a
    plain tensor, or a tensor with the negative bit set; ``torch.jit.trace`` (it records the custom op)."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0 or torch._C._is_tracing()):
        return OP
    grad = torch.is_grad_enabled()
    route = IMPL
    for t in tensors:
        if t is None:
            if required > 0:
                return OP
        elif type(t) not in _PLAIN_TYPES or t.is_neg():
            return OP
        elif grad and t.requires_grad:
            route = AUTOGRAD
        required -= 1
    return route


def inference(tensors: tuple, required: int = 1) -> bool:
    """True where :func:`call_op` would call the implementation directly (plain eager code, no
    gradient needed) for these arguments: :func:`eager_mode` is IMPL."""
    return eager_mode(tensors, required) == IMPL


def eager_autograd(op, impl, setup_context, backward) -> type:
    """Registers ``setup_context``/``backward`` as ``op``'s autograd formula (``op.register_autograd``) and returns
    a ``torch.autograd.Function`` running ``impl`` with the same two, for eager training without the dispatcher;
    its attribute ``functorch`` is the Function that functorch transforms call (see :func:`_functorch_autograd`).

    Written in the form whose ``forward`` takes ``ctx``: a Function with a separate ``setup_context``
    binds its arguments with ``inspect.signature`` on every call (about 25 us of host time per call on
    our CPU machine, 3x that on the GPU host); functorch transforms, which need the separate form, get
    their own."""

    op.register_autograd(backward, setup_context=setup_context)

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
    EagerAutograd.functorch = _functorch_autograd(op, setup_context, backward)
    return EagerAutograd


def no_second_derivative(op, impl, message: str) -> type:
    """:func:`eager_autograd` for an op that computes a gradient and has no derivative of its own: the formula raises
    ``RuntimeError(message)`` when it is used (a second derivative through the op), so ``create_graph=True`` that
    never differentiates the op still works."""

    def setup_context(ctx, inputs, output):
        pass  # nothing to save: the backward raises

    def backward(ctx, *grads):
        raise RuntimeError(message)

    return eager_autograd(op, impl, setup_context, backward)


def _functorch_autograd(op, setup_context=None, backward=None) -> type:
    """The Function that functorch transforms call: ``op`` with its autograd formula in the separate-
    ``setup_context`` form they require, its vmap rule generated (the forward and backward then run
    under ``vmap`` on batched tensors, which :func:`_route` sends to the ops). Without a formula (the
    ops that compute gradients) a backward through it raises, as the op itself does. Forward-mode
    transforms (``jvp``, ``jacfwd``) have no formula and raise."""

    def no_formula(ctx, *grads):
        raise RuntimeError(f"{op._name} has no derivative (it computes a gradient; a gradient of it is not "
                           f"implemented)")

    class FunctorchAutograd(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(*args):
            return op(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            if setup_context is not None:
                setup_context(ctx, inputs, output)

        @staticmethod
        def backward(ctx, *grads):
            return (backward or no_formula)(ctx, *grads)

    FunctorchAutograd.__name__ = FunctorchAutograd.__qualname__ = f"FunctorchAutograd_{op._name}"
    return FunctorchAutograd


# op -> its Function for functorch transforms, for the ops called without a formula (_functorch_autograd)
_NO_FORMULA: dict = {}


def call_op(op, impl, *args, autograd=None, infer=None):
    """``impl(*args)`` in plain eager inference (``infer(*args)`` when given: an implementation
    that skips what only backward needs, e.g. saved statistics, or returns None for an output
    the op fills with an empty tensor), ``autograd.apply(*args)`` in plain eager training (when
    given; under a functorch transform its ``functorch`` twin), else ``op(*args)``; the same values every
    way (a caller of ``infer`` takes either form)."""
    route = _route(args)
    if route == IMPL:
        try:
            return (infer or impl)(*args)
        except (NotImplementedError, RuntimeError):  # no storage: a legacy-vmap batched tensor goes through the op
            if not any(isinstance(a, torch.Tensor) and legacy_batched(a) for a in args):
                raise
            return op(*args)
    if route == FUNCTORCH:
        if autograd is not None:
            return autograd.functorch.apply(*args)
        if op._opoverload._schema.is_mutable:  # the custom op would drop a jvp's tangents without a word
            raise RuntimeError(f"{op._name}: a form that writes into a given output does not support functorch "
                               f"transforms (grad, vmap, jvp); call the form that returns a new tensor")
        function = _NO_FORMULA.get(op) or _NO_FORMULA.setdefault(op, _functorch_autograd(op))
        return function.apply(*args)
    if route == AUTOGRAD:
        if _forward_ad._current_level >= 0:
            # the Function reads raw memory: negative bits resolved first (resolve_neg keeps tangents); without a
            # Function, the op would drop a tangent silently
            args = tuple(a.resolve_neg() if isinstance(a, torch.Tensor) else a for a in args)
            if autograd is None and any(
                    isinstance(a, torch.Tensor) and _forward_ad.unpack_dual(a).tangent is not None for a in args):
                raise NotImplementedError(f"{op._name} has no forward-mode AD (jvp) formula: a tangent would be "
                                          f"dropped")
        if autograd is not None:
            return autograd.apply(*args)
    return op(*args)


def fp32_vjp(model, tensors: tuple, grads: tuple) -> tuple:
    """The double backward of an op that computes a gradient: the vector-Jacobian product of ``model`` (the op's
    math written as fp32 PyTorch ops, one argument per entry of ``tensors``, returning a tuple of outputs) at
    ``tensors`` in fp32, for the upstream ``grads`` of its outputs (None: a zero gradient). An entry of ``tensors``
    may be None (an absent optional argument): the model gets None there, and its gradient is None. Returns one
    gradient per entry, in that tensor's dtype.

    ``torch.func.vjp``, which functorch transforms allow where ``requires_grad_`` is refused. The tensors are not
    detached: with ``create_graph=True`` the results keep their graph to ``tensors`` and ``grads`` (the model is
    PyTorch ops), so third and higher derivatives are right; detached copies left only the path through ``grads``,
    and a third derivative silently dropped every term through ``tensors``."""
    present = [t for t in tensors if t is not None]

    def of_present(*given):
        given = iter(given)
        return model(*(None if t is None else next(given) for t in tensors))

    outputs, vjp = torch.func.vjp(of_present, *(t.float() for t in present))
    cotangents = tuple(torch.zeros_like(o) if g is None else g.float() for o, g in zip(outputs, grads))
    got = iter(g.to(t.dtype) for g, t in zip(vjp(cotangents), present))
    return tuple(None if t is None else next(got) for t in tensors)


def sigmoid_pair(z: torch.Tensor) -> tuple:
    """``(sigmoid(z), 1 - sigmoid(z))`` as differentiable PyTorch ops, for the models :func:`fp32_vjp`
    differentiates. Both come from ``r = sigmoid(-|z|) <= 1/2``, so neither the values nor their derivatives lose
    digits where the sigmoid is near 1: torch's sigmoid backward ``s * (1 - s)`` keeps only the digits of ``1 - s``
    that ``s`` holds (fp32 at z = 13.6, gelu_quick's x = 8: 5% off). ``1 + tanh(z) = 2 s``, ``1 - tanh(z) = 2 c``
    for ``(s, c) = sigmoid_pair(2 z)``."""
    pos = z >= 0
    r = torch.sigmoid(torch.where(pos, -z, z))  # not -z.abs(): abs's derivative at 0 is 0
    return torch.where(pos, 1.0 - r, r), torch.where(pos, r, 1.0 - r)
