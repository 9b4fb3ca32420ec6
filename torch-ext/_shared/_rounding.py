"""Rounding fp32 values to the storage dtype inside kernels, shared by every package.

Bit-exactness to PyTorch needs the same round-to-nearest-even at the same points as the
replaced ops, on GPUs and under the Triton interpreter alike. Compiled kernels convert with
the hardware's round-to-nearest-even (``cvt.rn``, one instruction); the Triton interpreter's
own fp32 -> bf16 conversion truncates, so there bf16 rounding is done with integer ops.
"""

import os

import torch
import triton
import triton.language as tl

# Kernels are built for the interpreter exactly when TRITON_INTERPRET=1 is set at import time.
_NATIVE_BF16: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """Rounds fp32 ``x`` to ``DTYPE`` (nearest even) and back to fp32.

    ``DTYPE`` None or fp32 returns ``x`` unchanged. NaN stays NaN.
    """
    if DTYPE is None:
        return x
    elif DTYPE == tl.bfloat16:
        if _NATIVE_BF16:
            return x.to(tl.bfloat16).to(tl.float32)
        else:
            bits = x.to(tl.uint32, bitcast=True)
            # add 0x7FFF plus the lowest kept bit, then drop the 16 low bits: ties go to even
            bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
            return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


_ROUND_DTYPES = {None: None, torch.float32: None, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def round_dtype(dtype):
    """The ``DTYPE`` argument of :func:`round_to` (a constexpr) for a torch dtype: ``tl.float16`` /
    ``tl.bfloat16``, or None (no rounding) for fp32 and None.

    Raises:
        KeyError: any other dtype (callers validate dtypes before they launch).
    """
    return _ROUND_DTYPES[dtype]
