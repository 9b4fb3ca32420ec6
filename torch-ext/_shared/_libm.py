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

__all__ = ["erf_f32", "erf_nv", "ex2_approx_ftz", "exp_approx", "exp_f32", "log_f32", "nvidia_approx", "rcp_approx",
           "rcp_approx_ftz", "use_libdevice"]


@triton.jit
def exp_f32(x, LIBDEVICE: tl.constexpr):
    """exp of fp32 x: libdevice's ``expf`` when LIBDEVICE (see :func:`use_libdevice`), else ``tl.exp``."""
    if LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def erf_f32(x, LIBDEVICE: tl.constexpr):
    """erf of fp32 x: :func:`erf_nv` (CUDA 13's ``erff``) when LIBDEVICE is 2, the vendor library's ``erff`` when 1
    (libdevice, ROCm's ocml), else ``tl.erf``."""
    if LIBDEVICE == 2:
        return erf_nv(x)
    elif LIBDEVICE:
        return libdevice.erf(x)
    else:
        return tl.erf(x)


@triton.jit
def erf_nv(z):
    """erf of fp32 z by the operations of CUDA 13's ``erff`` (its libdevice's PTX for sm_90; NVIDIA only), written
    without branches.

    ``erff`` evaluates one degree-6 polynomial ``p`` by FMAs, in ``u = |z|`` with one set of coefficients where
    ``|z| >= 1.00296`` and in ``u = z * z`` with another below; then ``r = p * m + m`` (one FMA) with ``m = -|z|``
    resp. ``z``, and returns ``r`` below the threshold, ``copysign(1 - 2^r, z)`` above (``ex2.approx.ftz``). Its
    PTX branches to choose the coefficients; here they and the arguments are selected (a bf16 GELU tile of 8
    elements per thread: 264 instead of 304 sm_90 instructions; H200, bf16 gelu 16384 x 14336: 2967 -> 3164
    GB/s). The values are ``erff``'s except where its FMAs flush subnormals (subnormal ``z``: it gives +-0, this
    ``z`` times ~1.13), which ``1 + erf`` (the GELU) absorbs. Checked on the H200 against ``torch.erf`` and
    ``F.gelu`` of torch built with CUDA 13.0 over every fp32, fp16 and bf16 input (GPU tests). The libdevice that
    Triton 3.6 bundles has an older ``erff`` (other coefficients): through it, 4.9M fp32, 151 fp16 and 11 bf16
    GELU values differed from ``F.gelu`` there."""
    t = tl.abs(z)
    big = t >= 1.002959966659546
    u = tl.where(big, t, z * z)
    p = tl.where(big, 0.00011219871521461755, 8.483494457323104e-05)
    p = tl.fma(p, u, tl.where(big, -0.0013275252422317863, -0.0008213091641664505))
    p = tl.fma(p, u, tl.where(big, 0.00839653518050909, 0.005213488824665546))
    p = tl.fma(p, u, tl.where(big, -0.04024658352136612, -0.026868773624300957))
    p = tl.fma(p, u, tl.where(big, 0.15950430929660797, 0.11284004896879196))
    p = tl.fma(p, u, tl.where(big, 0.9129176735877991, -0.37612664699554443))
    p = tl.fma(p, u, tl.where(big, 0.6290600299835205, 0.12837915122509003))
    m = tl.where(big, -t, z)
    r = tl.fma(p, m, m)
    tail = 1.0 - ex2_approx_ftz(r)  # in (0, 1]: z's sign bit or-ed in is copysign
    signed = (z.to(tl.uint32, bitcast=True) & 0x80000000) | tail.to(tl.uint32, bitcast=True)
    return tl.where(big, signed.to(tl.float32, bitcast=True), r)


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
def exp_approx(x, FTZ: tl.constexpr):
    """exp of fp32 x as ``tl.exp`` computes it on NVIDIA (x * log2(e), then ``ex2.approx``). ``FTZ`` (see
    :func:`nvidia_approx`): ``ex2.approx.ftz``, one sm_90 instruction instead of ``ex2.approx``'s four (its
    subnormal-result scaling); results below 2^-126 (x < -87.3) flush to 0, subnormal x counts as 0."""
    if FTZ:
        return ex2_approx_ftz(x * 1.4426950408889634)
    else:
        return tl.exp(x)


@triton.jit
def rcp_approx(x):
    """1 / x in fp32: one ``rcp.approx.f32`` (max error 1 ulp; subnormal inputs and results kept)."""
    return tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def rcp_approx_ftz(x):
    """1 / x in fp32: one ``rcp.approx.ftz.f32`` (max error 1 ulp; subnormals flush to 0)."""
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


def nvidia_approx(device: torch.device, kernel) -> bool:
    """Whether ``kernel`` launched on ``device`` may use the inline-PTX approximations above: NVIDIA GPUs, not
    ROCm, not the interpreter (which cannot run inline PTX)."""
    return device.type == "cuda" and torch.version.hip is None and not is_interpreter(kernel)


def use_libdevice(device: torch.device, kernel) -> int:
    """The LIBDEVICE constexpr of a launch: where exp (tanh, erf) come from.

    1 on CUDA and ROCm devices (torch calls both ``cuda``): their ``libdevice`` holds the functions ATen's
    kernels call. 2 on NVIDIA with a torch built with CUDA 13, whose ``erff`` :func:`erf_nv` writes out (Triton's
    bundled libdevice may be older than torch's toolkit; a later toolkit's ``erff`` is not assumed to be the
    same). 0 under the interpreter and on other backends (XPU).
    """
    if device.type != "cuda" or is_interpreter(kernel):
        return 0
    return 2 if torch.version.hip is None and _cuda_major() == 13 else 1


def _cuda_major() -> int:
    """The major version of the CUDA toolkit torch was built with (0 if unknown): ATen's math functions are that
    toolkit's."""
    try:
        return int(str(torch.version.cuda).split(".")[0])
    except ValueError:
        return 0
