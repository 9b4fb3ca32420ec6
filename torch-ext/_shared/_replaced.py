"""The forward a Hub layer replaced on a module: for inputs the layer's kernels do not take.

``kernels.kernelize`` replaces the forward of each module instance (``module.forward``); the module's class keeps
its own. A layer whose kernels refuse an input dtype (float64: a model moved there after kernelize,
``torch.autograd.gradcheck``) runs that class forward instead, which computes what the module always computed.
Where a layer refuses an input the module refuses too (a shape, mixed dtypes), its error is also the module's
RuntimeError (:class:`LayerValueError`, :class:`LayerTypeError`), so code that catches either keeps working.
"""

from __future__ import annotations

from torch import nn

__all__ = ["LayerTypeError", "LayerValueError", "also_runtime_error", "replaced_forward"]


class LayerValueError(ValueError, RuntimeError):
    """A layer's ValueError for an input its module refuses with a RuntimeError (``nn.LayerNorm`` given an input
    that does not end with its normalized_shape): ``except ValueError`` and ``except RuntimeError`` both catch it."""


class LayerTypeError(TypeError, RuntimeError):
    """A layer's TypeError for an input its module refuses with a RuntimeError (``nn.Linear`` given fp16 input and
    fp32 weight): ``except TypeError`` and ``except RuntimeError`` both catch it."""


def also_runtime_error(err: TypeError | ValueError) -> type:
    """The class to re-raise ``err`` (an op's TypeError or ValueError) as from a layer: the matching Layer*Error."""
    return LayerTypeError if isinstance(err, TypeError) else LayerValueError


def replaced_forward(module: nn.Module, layer: type):
    """The forward of ``module``'s class, which ``layer``'s forward replaced on this instance; None where there is
    none to return to: the class forward is the layer's own (the module is an instance of the layer, or its class
    took the layer's forward) or nn.Module's placeholder (a stand-in class without a forward). The caller then runs
    its op, whose checks name what they refuse."""
    forward = type(module).forward
    return None if forward is layer.forward or forward is nn.Module.forward else forward
