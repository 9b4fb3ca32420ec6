"""The activation functions and their derivatives as ``@triton.jit`` helpers (fp32 in, fp32 out).

Formulas (``x`` fp32; constants are the fp32 values of the Python literals):

===========  =============================================================  ==============================
ACT          value                                                          reference
===========  =============================================================  ==============================
SILU         ``x / (1 + exp(-x))``                                          ``F.silu`` (ATen's formula)
GELU         ``x * 0.5 * (1 + erf(x * 0.7071067811865476))``               ``F.gelu`` (exact erf)
GELU_TANH    ``0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x*x*x)))``  ``F.gelu(approximate="tanh")``
GELU_NEW     the same formula, written as transformers' ``NewGELUActivation``  transformers
GELU_FAST    ``0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))``  ``FastGELUActivation``
GELU_QUICK   ``x * sigmoid(1.702 * x)``, ``sigmoid(a) = 1 / (1 + exp(-a))``  ``QuickGELUActivation``
FATRELU      ``x if x > threshold else 0``                                  vLLM / kernels-community
===========  =============================================================  ==============================

``R`` (the rounding dtype, a constexpr) selects where intermediate values are rounded:
``None`` computes everything in fp32 (the caller rounds once at the store);
``tl.float16``/``tl.bfloat16`` rounds after every step at which the eager PyTorch
expression of the reference rounds (each eager op computes in fp32 and rounds its
result to the tensor dtype). Only GELU_NEW, GELU_FAST and GELU_QUICK have such steps;
SILU, GELU and GELU_TANH are single ATen ops (one rounding), FATRELU is exact.

``torch.pow(x, 3.0)`` rounds differently by device and dtype: ATen's CUDA kernel
computes ``x * x * x`` in the tensor dtype (two roundings), its CPU kernel does so
for bf16 but computes fp16 in fp32 (one rounding). GELU_NEW therefore takes
``round_square`` (runtime int: 1 = round ``x * x`` too), chosen by the launcher.

Precision: ``LIBDEVICE`` (a constexpr the launcher sets: 1 on CUDA and ROCm, 2 on NVIDIA with torch built with
CUDA 13, 0 elsewhere) takes exp/tanh/erf from the vendor math library (``libdevice``: CUDA's
``expf``/``tanhf``/``erff``, ROCm's ocml), the functions ATen's own CUDA/ROCm kernels call, so fp32 results can
agree bitwise; with 2, erf is CUDA 13's ``erff`` written out without its branches (``_libm.erf_nv``).
Otherwise (the Triton interpreter, XPU) exp is ``tl.exp``, erf ``tl.erf`` and tanh is computed here: an odd
Taylor polynomial for |v| < 0.55, ``(1 - e) / (1 + e)`` with ``e = exp(-2|v|)`` above; measured <= 2 fp32 ulps
against fp64 on the interpreter. Note that
``tl.exp`` compiles to ``ex2.approx`` on NVIDIA (a few ulps), hence libdevice there.
Divisions are IEEE (``div_rn``), and launches disable fp contraction (``_launch``).

``FAST`` (a constexpr, forward kernels only; see ``_fast_math.py`` for when the launcher sets it): the
sigmoid of SILU and the tanh of GELU_TANH, GELU_NEW and GELU_FAST from NVIDIA's single-instruction
``ex2.approx`` / ``rcp.approx`` (:func:`sigmoid_fast`, :func:`tanh_fast`). Their fp32 values differ from the
exact ones in the last bits; the bf16 results are equal to the exact path's on every one of the 65536 bf16
inputs, which the launcher checks on each device before use.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice
from ._libm import erf_f32, ex2_approx_ftz, exp_f32, rcp_approx, rcp_approx_ftz
from ._rounding import round_to

# Activation ids (the ACT constexpr).
SILU: tl.constexpr = tl.constexpr(0)
GELU: tl.constexpr = tl.constexpr(1)
GELU_TANH: tl.constexpr = tl.constexpr(2)
GELU_NEW: tl.constexpr = tl.constexpr(3)
GELU_FAST: tl.constexpr = tl.constexpr(4)
GELU_QUICK: tl.constexpr = tl.constexpr(5)
FATRELU: tl.constexpr = tl.constexpr(6)

ACT_IDS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "gelu_new": 3, "gelu_fast": 4, "gelu_quick": 5, "fatrelu": 6}


@triton.jit
def tanh_f32(v, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.tanh(v)
    else:
        return _tanh_portable(v)


@triton.jit
def _tanh_portable(v):
    """tanh in fp32 from exp only (<= 2 ulps); saturates to +-1, NaN stays NaN."""
    a = tl.abs(v)
    vs = tl.where(a < 0.55, v, 0.0)  # the series only sees its own range (no overflow in z**9)
    z = vs * vs
    # |v| < 0.55: odd Taylor series up to v**19 (truncation below 1e-9 relative)
    p = -443861162.0 / 1856156927625.0
    p = p * z + 6404582.0 / 10854718875.0
    p = p * z - 929569.0 / 638512875.0
    p = p * z + 21844.0 / 6081075.0
    p = p * z - 1382.0 / 155925.0
    p = p * z + 62.0 / 2835.0
    p = p * z - 17.0 / 315.0
    p = p * z + 2.0 / 15.0
    p = p * z - 1.0 / 3.0
    small = vs + vs * (z * p)
    e = tl.exp(-2.0 * tl.minimum(a, 40.0))  # tanh(40) == 1 in fp32; avoids inf - inf
    big = tl.math.div_rn(1.0 - e, 1.0 + e)
    big = tl.where(v < 0, -big, big)
    return tl.where(a < 0.55, small, big)


@triton.jit
def sigmoid_f32(a, LIBDEVICE: tl.constexpr):
    """``1 / (1 + exp(-a))``, ATen's sigmoid formula."""
    return tl.math.div_rn(1.0, 1.0 + exp_f32(-a, LIBDEVICE))


@triton.jit
def sigmoid_fast(a):
    """``1 / (1 + exp(-a))`` as ``rcp(1 + 2^(-a log2 e))`` with NVIDIA's approximate instructions (NVIDIA only).
    The reciprocal keeps subnormals (with the flushing one, SILU of x in [-88.5, -87.5] rounds to 0 instead of
    a tiny value)."""
    return rcp_approx(1.0 + ex2_approx_ftz(a * -1.4426950408889634))


@triton.jit
def tanh_fast(v):
    """tanh from the large-argument branch of libdevice's ``tanhf``, ``sign(v) * (1 - 2 / (2^(2 |v| log2 e) + 1))``,
    for every v (NVIDIA only). libdevice uses an odd polynomial for |v| < 0.6; this differs from it there in the
    last fp32 bits, which the GELU forms' ``1 + tanh`` absorbs."""
    r = rcp_approx_ftz(ex2_approx_ftz(tl.abs(v) * 2.8853900817779268) + 1.0)
    t = 1.0 - 2.0 * r
    return tl.where(v < 0, -t, t)


@triton.jit
def _tanh(v, LIBDEVICE: tl.constexpr, FAST: tl.constexpr):
    if FAST:
        return tanh_fast(v)
    else:
        return tanh_f32(v, LIBDEVICE)


@triton.jit
def activation(x, threshold, round_square, ACT: tl.constexpr, R: tl.constexpr, LIBDEVICE: tl.constexpr,
               FAST: tl.constexpr):
    """The activation of fp32 ``x`` with the eager rounding points of dtype ``R`` (None: none); ``FAST``: the
    sigmoid and tanh from :func:`sigmoid_fast` / :func:`tanh_fast` (NVIDIA only)."""
    if ACT == SILU and FAST:
        y = x * sigmoid_fast(x)
    elif ACT == SILU:
        y = tl.math.div_rn(x, 1.0 + exp_f32(-x, LIBDEVICE))
    elif ACT == GELU:
        y = x * 0.5 * (1.0 + erf_f32(x * 0.7071067811865476, LIBDEVICE))
    elif ACT == GELU_TANH:
        y = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x)), LIBDEVICE, FAST))
    elif ACT == GELU_NEW:
        # 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0))))
        sq = x * x
        sq = tl.where(round_square != 0, round_to(sq, R), sq)
        cube = round_to(sq * x, R)
        inner = round_to(x + round_to(0.044715 * cube, R), R)
        t = round_to(_tanh(round_to(0.7978845608028654 * inner, R), LIBDEVICE, FAST), R)
        y = round_to(0.5 * x, R) * round_to(1.0 + t, R)
    elif ACT == GELU_FAST:
        # 0.5 * x * (1.0 + tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
        a = round_to(x * 0.7978845608, R)
        b = round_to(round_to(0.044715 * x, R) * x, R)
        t = round_to(_tanh(round_to(a * round_to(1.0 + b, R), R), LIBDEVICE, FAST), R)
        y = round_to(0.5 * x, R) * round_to(1.0 + t, R)
    elif ACT == GELU_QUICK:
        # x * sigmoid(1.702 * x)
        y = x * round_to(sigmoid_f32(round_to(1.702 * x, R), LIBDEVICE), R)
    else:  # FATRELU
        y = tl.where(x > threshold, x, 0.0)
    return y


@triton.jit
def activation_grad(x, threshold, ACT: tl.constexpr, LIBDEVICE: tl.constexpr):
    """d activation / dx at fp32 ``x`` (the derivative of the exact formula; roundings count as identity)."""
    if ACT == SILU:
        s = sigmoid_f32(x, LIBDEVICE)
        g = s * (1.0 + x * (1.0 - s))
    elif ACT == GELU:
        cdf = 0.5 * (1.0 + erf_f32(x * 0.7071067811865476, LIBDEVICE))
        g = cdf + x * (exp_f32(-0.5 * x * x, LIBDEVICE) * 0.3989422804014327)  # + x * pdf(x)
    elif ACT == GELU_QUICK:
        s = sigmoid_f32(1.702 * x, LIBDEVICE)
        g = s + 1.702 * x * s * (1.0 - s)
    elif ACT == FATRELU:
        g = tl.where(x > threshold, 1.0, 0.0)
    else:  # GELU_TANH, GELU_NEW, GELU_FAST: 0.5 * x * (1 + tanh(k0 * (x + k1 * x**3)))
        k0 = 0.7978845608028654
        if ACT == GELU_FAST:
            k0 = 0.7978845608
        x2 = x * x
        t = tanh_f32(k0 * x * (1.0 + 0.044715 * x2), LIBDEVICE)
        g = 0.5 * (1.0 + t) + 0.5 * x * ((1.0 - t) * (1.0 + t)) * (k0 * (1.0 + 3.0 * 0.044715 * x2))
    return g


@triton.jit
def activation_and_grad(x, threshold, round_square, ACT: tl.constexpr, R: tl.constexpr, LIBDEVICE: tl.constexpr):
    """``(activation(x), activation_grad(x))`` sharing the transcendental where both use the same one
    (SILU: exp(-x); GELU: erf; GELU_TANH: the tanh of the forward's argument). The value is the
    same bits as :func:`activation`; the derivative is the same formula, evaluated from that shared
    value (for GELU_TANH from the forward's tanh argument, within fp32 rounding of the other's)."""
    if ACT == SILU:
        d = 1.0 + exp_f32(-x, LIBDEVICE)
        y = tl.math.div_rn(x, d)
        s = tl.math.div_rn(1.0, d)
        g = s * (1.0 + x * (1.0 - s))
    elif ACT == GELU:
        e = erf_f32(x * 0.7071067811865476, LIBDEVICE)
        y = x * 0.5 * (1.0 + e)
        g = 0.5 * (1.0 + e) + x * (exp_f32(-0.5 * x * x, LIBDEVICE) * 0.3989422804014327)
    elif ACT == GELU_TANH:
        k0 = 0.7978845608028654
        x2 = x * x
        t = tanh_f32(k0 * (x + 0.044715 * (x2 * x)), LIBDEVICE)
        y = 0.5 * x * (1.0 + t)
        g = 0.5 * (1.0 + t) + 0.5 * x * ((1.0 - t) * (1.0 + t)) * (k0 * (1.0 + 3.0 * 0.044715 * x2))
    else:
        y = activation(x, threshold, round_square, ACT, R, LIBDEVICE, False)
        g = activation_grad(x, threshold, ACT, LIBDEVICE)
    return y, g
