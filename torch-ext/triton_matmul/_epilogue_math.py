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
    """Phi(x), the standard normal CDF, with one exp2 and no division: Phi(-a) = 2^q(a) for a = |x|, where q is
    a degree-7 polynomial fit of log2 Phi(-a) (weighted minimax on [0, 7]: ``benchmarks/fit_normal_cdf.py``);
    Phi(x) = 1 - Phi(-x) for x >= 0. In fp32: Phi(-a) within 4.2e-6 relative for a <= 4 and 7.1e-5 up to 6, Phi
    within 1.5e-6 absolute. q decreases past a = 7 (Phi(-a) <= 1.3e-12 there) to q(+inf) = -inf, so the tail
    goes to 0; NaN stays NaN."""
    a = tl.abs(x)
    q = -1.7059467e-06 * a + 5.940301e-05
    q = q * a - 0.0009162036
    q = q * a + 0.0084628025
    q = q * a - 0.05388936
    q = q * a - 0.4585154
    q = q * a - 1.1512378
    q = q * a - 0.9999958
    h = _exp2(q, FAST_MATH)
    return tl.where(x >= 0.0, 1.0 - h, h)


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
    instruction count is GEMM time): gelu = x * Phi(x) with Phi from one exp2 of a polynomial
    (``_normal_cdf``: no reciprocal; below 0 Phi(x) is computed directly, so the tail keeps its
    relative accuracy, which ``1 + erf`` loses); gelu_tanh = x * sigmoid(2 u) (equal to
    0.5 x (1 + tanh u)); silu = x * sigmoid(x). Against fp64: gelu within 4.2e-6 relative for x >= -4
    (0.0011 bf16 ulp) and 7.1e-5 down to -6; the other gates within a few fp32 ulps (tests, GPU check).
    ``FAST_MATH``: the exp2 / reciprocal as single NVIDIA approximate instructions (see ``_exp2``);
    elsewhere (AMD, Intel, the interpreter) ``tl.exp2`` and a division.
    """
    if ACT == 1:
        return x * _normal_cdf(x, FAST_MATH)  # (+inf -> +inf; -inf and NaN -> NaN)
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
        cdf = _normal_cdf(x, FAST_MATH)
        density = _exp2(x * x * -0.7213475204444817, FAST_MATH) * 0.3989422804014327  # exp(-x^2 / 2) / sqrt(2 pi)
        return x * cdf, cdf + x * density
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
