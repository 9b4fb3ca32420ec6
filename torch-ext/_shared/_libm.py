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

__all__ = ["erf_f32", "ex2_approx_ftz", "exp_f32", "log_f32", "rcp_approx", "rcp_approx_ftz", "use_libdevice"]


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


# NVIDIA's single-instruction approximations (PTX ISA, "Floating Point Instructions"): only for kernels compiled
# for NVIDIA GPUs (inline PTX), never under the interpreter. Callers that promise exact results prove them.


@triton.jit
def ex2_approx_ftz(x):
    """2^x in fp32: one ``ex2.approx.ftz.f32`` (max relative error 2^-22.5; results below 2^-126 flush to 0)."""
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def rcp_approx(x):
    """1 / x in fp32: one ``rcp.approx.f32`` (max error 1 ulp; subnormal inputs and results kept)."""
    return tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def rcp_approx_ftz(x):
    """1 / x in fp32: one ``rcp.approx.ftz.f32`` (max error 1 ulp; subnormals flush to 0)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


def use_libdevice(device: torch.device, kernel) -> int:
    """The LIBDEVICE constexpr of a launch: where exp (tanh, erf) come from.

    1 on CUDA and ROCm devices (torch calls both ``cuda``): their ``libdevice`` holds the
    functions ATen's kernels call. 0 under the interpreter and on other backends (XPU).
    """
    return int(device.type == "cuda" and not is_interpreter(kernel))
