"""How triton-matmul's GELU epilogue constants were made (``_epilogue_math._normal_cdf``): a degree-7 polynomial q(a)
with Phi(-a) = 2^q(a), a = |x|, so that Phi costs one exp2 and no reciprocal.

    python3 benchmarks/fit_normal_cdf.py

Weighted minimax (Lawson's iteration on least squares in the Chebyshev basis) of log2 Phi(-a) on [0, 7], weight 1 up
to a = 4 and exp(-2 (a - 4)) beyond (Phi(-4) = 3.2e-5: past it only the absolute error matters), then the power-basis
coefficients rounded to fp32. Prints them (ascending) and the errors of an fp32 Horner evaluation (one rounding per
fused multiply-add) against math.erfc in fp64. numpy and the standard library only.
"""

import math

import numpy as np
from numpy.polynomial import chebyshev as C

B, KNEE, DEGREE = 7.0, 4.0, 7


def log2_tail(a):
    """log2 Phi(-a) in fp64."""
    return np.array([math.log2(0.5 * math.erfc(v / math.sqrt(2.0))) for v in a])


def fit():
    a = np.cos(np.linspace(0.0, np.pi, 8001)) * B / 2 + B / 2  # Chebyshev points of [0, B]
    target, base = log2_tail(a), np.where(a <= KNEE, 1.0, np.exp(-2.0 * (a - KNEE)))
    w = np.ones_like(a)
    for _ in range(80):  # Lawson: reweight by the error until the weighted error levels out (minimax)
        cheb = C.chebfit(a / B * 2 - 1, target, DEGREE, w=np.sqrt(w) * base)
        r = np.abs(C.chebval(a / B * 2 - 1, cheb) - target) * base
        w = np.maximum(w * r / r.sum() * len(r), 1e-12)
    power = C.cheb2poly(cheb)  # in t = 2 a / B - 1; expand (2 / B a - 1)^k
    coeffs = np.zeros(DEGREE + 1)
    for k, ck in enumerate(power):
        coeffs[:k + 1] += ck * np.array([math.comb(k, j) * (2 / B) ** j * (-1.0) ** (k - j) for j in range(k + 1)])
    return coeffs.astype(np.float32)


def horner_fp32(coeffs, a):
    a32, acc = a.astype(np.float32), np.full(a.shape, coeffs[-1], dtype=np.float32)
    for c in coeffs[-2::-1]:
        acc = (acc.astype(np.float64) * a32 + float(c)).astype(np.float32)  # an FMA: one rounding
    return acc.astype(np.float64)


def main():
    coeffs = fit()
    print("ascending:", [np.format_float_positional(c, unique=True) for c in coeffs])
    a = np.linspace(0.0, 12.0, 240001)
    exact = log2_tail(a)
    rel = np.abs(horner_fp32(coeffs, a) - exact) * math.log(2)  # relative error of 2^q
    print(f"Phi(-a) relative error: a <= 4 {rel[a <= 4].max():.2e}, 4 < a <= 6 {rel[(a > 4) & (a <= 6)].max():.2e}; "
          f"Phi absolute error {(rel * 2 ** exact).max():.2e}")
    far = np.logspace(math.log10(B), 38, 4000)
    with np.errstate(over="ignore", invalid="ignore"):
        q = horner_fp32(coeffs, far)
    print(f"past a = {B}: max q {q.max():.1f} (2^q <= {2 ** q.max():.1e}), q at a = 1e38: {q[-1]}")


if __name__ == "__main__":
    main()
