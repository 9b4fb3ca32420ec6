"""The fp32 activations of triton-matmul's epilogues, one definition for every kernel (the ``tl`` kernels of
``matmul`` and the Gluon kernel of ``matmul_sm90``, which calls these ``triton.jit`` functions too), and their
derivatives for the backward (``epilogue_grad``)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._libm import ex2_approx_ftz, rcp_approx_ftz
from ._rounding import round_to

__all__ = ["ACTIVATIONS", "activation_and_grad", "apply_activation", "backprop", "store_rounded"]

# ``matmul``'s activation name -> (ACT id of the functions below, gated)
ACTIVATIONS = {
    None: (0, False), "gelu": (1, False), "gelu_tanh": (2, False), "silu": (3, False), "relu": (4, False),
    "geglu": (1, True), "swiglu": (3, True),
}


@triton.jit
def store_rounded(ptr, value, mask):
    """Stores fp32 ``value`` at ``ptr`` rounded once (nearest even) to the pointer's dtype."""
    DTYPE: tl.constexpr = ptr.dtype.element_ty
    tl.store(ptr, round_to(value, DTYPE).to(DTYPE), mask=mask)


@triton.jit
def _exp2(x, FAST_MATH: tl.constexpr):
    """2^x in fp32; FAST_MATH (NVIDIA): one ``ex2.approx.ftz`` (2 ulp; results below 2^-126 flush to 0)."""
    if FAST_MATH:
        return ex2_approx_ftz(x)
    else:
        return tl.exp2(x)


@triton.jit
def _rcp(x, FAST_MATH: tl.constexpr):
    """1 / x in fp32; FAST_MATH (NVIDIA): one ``rcp.approx.ftz`` (1 ulp)."""
    if FAST_MATH:
        return rcp_approx_ftz(x)
    else:
        return 1.0 / x


@triton.jit
def _normal_cdf(x, FAST_MATH: tl.constexpr):
    """(Phi(x), exp(-x^2 / 2)): the standard normal CDF from erfc(|x| / sqrt 2) = poly(t) exp(-x^2 / 2) (Abramowitz &
    Stegun 7.1.26, t = 1 / (1 + 0.3275911 |x| / sqrt 2), |error| <= 1.5e-7), and the Gaussian factor it used."""
    z = tl.abs(x) * 0.7071067811865476
    t = _rcp(1.0 + 0.3275911 * z, FAST_MATH)
    e = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    g = _exp2(x * x * -0.7213475204444817, FAST_MATH)
    e = e * g
    return tl.where(x >= 0.0, 1.0 - 0.5 * e, 0.5 * e), g


@triton.jit
def _tanh_gate(x, FAST_MATH: tl.constexpr):
    """0.5 (1 + tanh u) = 1 / (1 + exp(-2 u)), u = sqrt(2 / pi) (x + 0.044715 x^3): gelu_tanh(x) / x; exp via exp2."""
    return _rcp(1.0 + _exp2(x * (-2.302208198144325 - 0.1029432395800235 * x * x), FAST_MATH), FAST_MATH)


@triton.jit
def _sigmoid(x, FAST_MATH: tl.constexpr):
    """1 / (1 + exp(-x)); exp via exp2."""
    return _rcp(1.0 + _exp2(x * -1.4426950408889634, FAST_MATH), FAST_MATH)


@triton.jit
def apply_activation(x, ACT: tl.constexpr, FAST_MATH: tl.constexpr):
    """fp32 epilogue activation: 0 identity, 1 gelu (erf), 2 gelu_tanh, 3 silu, 4 relu.

    Cheap forms of the same functions (the epilogue runs while the tensor cores wait, so its
    instruction count is GEMM time): gelu = x * Phi(x) with erfc from Abramowitz & Stegun 7.1.26
    (|error| <= 1.5e-7, one exp and one reciprocal; below 0 Phi comes from erfc directly, so the
    tail keeps its relative accuracy better than ``1 + erf``); gelu_tanh = x * sigmoid(2 u) (equal to
    0.5 x (1 + tanh u)); silu = x * sigmoid(x). Measured against fp64 in bf16 ulps: < 0.01 ulp for
    |x| < 3, and never worse than the erf / tanh formulas in fp32 (tests and the GPU check).
    ``FAST_MATH``: the exp2 / reciprocal as single NVIDIA approximate instructions (see ``_exp2``);
    elsewhere (AMD, Intel, the interpreter) ``tl.exp2`` and a division.
    """
    if ACT == 1:
        return x * _normal_cdf(x, FAST_MATH)[0]  # (+inf -> +inf, NaN -> NaN)
    elif ACT == 2:
        return x * _tanh_gate(x, FAST_MATH)
    elif ACT == 3:
        return x * _sigmoid(x, FAST_MATH)
    elif ACT == 4:
        return tl.where(x < 0.0, 0.0, x)  # NaN stays NaN, as torch.relu (tl.maximum would drop it)
    else:
        return x


@triton.jit
def activation_and_grad(x, ACT: tl.constexpr, FAST_MATH: tl.constexpr):
    """(act(x), act'(x)) in fp32 for ACT 0 identity, 1 gelu (erf), 2 gelu_tanh, 3 silu, 4 relu, with the forms of
    :func:`apply_activation`:

    - gelu: x Phi(x); derivative Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi);
    - gelu_tanh: x s, s = 0.5 (1 + tanh u); derivative s + 2 x s (1 - s) u' (1 - tanh^2 u = 4 s (1 - s)),
      u' = sqrt(2 / pi) (1 + 3 * 0.044715 x^2);
    - silu: x s, s = sigmoid(x); derivative s (1 + x (1 - s));
    - relu: derivative 0 where x <= 0, else 1 (NaN passes the gradient on, as ``torch.relu``'s backward).
    """
    if ACT == 1:
        cdf, g = _normal_cdf(x, FAST_MATH)
        return x * cdf, cdf + x * g * 0.3989422804014327
    elif ACT == 2:
        s = _tanh_gate(x, FAST_MATH)
        du = 0.7978845608028654 + 0.10703222440890037 * x * x
        return x * s, s + 2.0 * x * s * (1.0 - s) * du
    elif ACT == 3:
        s = _sigmoid(x, FAST_MATH)
        return x * s, s * (1.0 + x * (1.0 - s))
    elif ACT == 4:
        return tl.where(x < 0.0, 0.0, x), tl.where(x <= 0.0, 0.0, 1.0)
    else:
        return x, tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def backprop(dy, x, ACT: tl.constexpr, FAST_MATH: tl.constexpr):
    """dy * act'(x) in fp32 (:func:`activation_and_grad`); relu selects instead, as torch's ``threshold_backward``:
    dy where x > 0 (or NaN), else 0, so that a NaN or inf dy at x <= 0 gives 0."""
    if ACT == 4:
        return tl.where(x <= 0.0, 0.0, dy)
    else:
        return dy * activation_and_grad(x, ACT, FAST_MATH)[1]
