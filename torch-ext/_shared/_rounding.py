"""Rounding fp32 values to the storage dtype inside kernels, shared by every package.

Bit-exactness to PyTorch needs the same round-to-nearest-even at the same points as the
replaced ops, on GPUs and under the Triton interpreter alike (whose own fp32 -> bf16
conversion truncates).
"""

import triton
import triton.language as tl


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Rounds fp32 ``x`` to ``DTYPE`` (nearest even) and back to fp32.

    ``DTYPE`` None or fp32 returns ``x`` unchanged. bf16 rounding uses integer ops
    on the fp32 bits, exact on GPUs and under the Triton interpreter (whose own
    fp32 -> bf16 conversion truncates). NaN stays NaN.
    """
    if DTYPE is None:
        return x
    elif DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        # add 0x7FFF plus the lowest kept bit, then drop the 16 low bits: ties go to even
        bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x
