"""The forward a Hub layer replaced on a module: for inputs the layer's kernels do not take.

``kernels.kernelize`` replaces the forward of each module instance (``module.forward``); the module's class keeps
its own. A layer whose kernels refuse an input dtype (float64: a model moved there after kernelize,
``torch.autograd.gradcheck``) runs that class forward instead, which computes what the module always computed.
"""

from __future__ import annotations

from torch import nn

__all__ = ["replaced_forward"]


def replaced_forward(module: nn.Module, layer: type):
    """The forward of ``module``'s class, which ``layer``'s forward replaced on this instance; None where there is
    none to return to: the class forward is the layer's own (the module is an instance of the layer, or its class
    took the layer's forward) or nn.Module's placeholder (a stand-in class without a forward). The caller then runs
    its op, whose checks name what they refuse."""
    forward = type(module).forward
    return None if forward is layer.forward or forward is nn.Module.forward else forward
