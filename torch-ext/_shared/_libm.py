"""The vendor math library for kernels that must match ATen's bits (written once, copied into every package).

ATen's CUDA/ROCm kernels call ``expf`` and ``logf`` (and ``erff``, ``tanhf``) from the vendor math library; Triton
reaches the same functions through ``libdevice`` (CUDA's libdevice, ROCm's ocml), so fp32 results can
agree bitwise. ``tl.exp`` compiles to ``ex2.approx`` on NVIDIA (a few ulps off). Under the interpreter
and on other backends (XPU) the portable ``tl`` functions are used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._device import is_interpreter

__all__ = ["erf_f32", "exp_f32", "log_f32", "use_libdevice"]


@triton.jit
def exp_f32(x, LIBDEVICE: tl.constexpr):
    """exp of fp32 x: libdevice's ``expf`` when LIBDEVICE (see :func:`use_libdevice`), else ``tl.exp``."""
    if LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def erf_f32(x, LIBDEVICE: tl.constexpr):
    """erf of fp32 x: libdevice's ``erff`` when LIBDEVICE, else ``tl.erf``."""
    if LIBDEVICE:
        return libdevice.erf(x)
    else:
        return tl.erf(x)


@triton.jit
def log_f32(x, LIBDEVICE: tl.constexpr):
    """Natural log of fp32 x: libdevice's ``logf`` when LIBDEVICE, else ``tl.log``."""
    if LIBDEVICE:
        return libdevice.log(x)
    else:
        return tl.log(x)


def use_libdevice(device: torch.device, kernel) -> int:
    """The LIBDEVICE constexpr of a launch: where exp (tanh, erf) come from.

    1 on CUDA and ROCm devices (torch calls both ``cuda``): their ``libdevice`` holds the
    functions ATen's kernels call. 0 under the interpreter and on other backends (XPU).
    """
    return int(device.type == "cuda" and not is_interpreter(kernel))
