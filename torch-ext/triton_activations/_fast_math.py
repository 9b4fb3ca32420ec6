"""When a forward may use NVIDIA's approximate instructions and still give the exact path's bits.

The exact sigmoid and tanh (libdevice ``expf`` / ``tanhf``, IEEE division; equal to ATen's, which the CUDA tests
check) cost more instructions than the forward's memory traffic leaves room for: on an H200 (bf16, 16384 x
2*14336, CUDA graphs) the exact ``silu_and_mul`` ran at 4122 GB/s, the fast forms of ``_math.sigmoid_fast`` /
``_math.tanh_fast`` at 4376 (``gelu_tanh_and_mul`` 4400), as fast as a multiply alone (4374;
``results/activations_fast_math_sweep_2026-12-01.txt``).

Exact by exhaustion: a plain op's bf16 output, and a gated op's ``act(g)`` rounded to bf16 before the multiply
(``rounding="eager"``), depend only on the 16 bits of one bf16 input. So the fast forms are compared with the
exact path on all 65536 bf16 inputs, through the very kernel the ops launch (plain: both roundings; gated:
``rounding="eager"``, multiplier 1), once per device and activation, before first use; a device where any input
differs keeps the exact math, with a warning. Not eligible: fp16, whose 11-bit significand exposes the
approximations (on the H200 2 inputs differ for SILU, 3 for GELU_TANH); fp32; a fused gated ``act(g) * u``
(fp32 values would have to agree); the erf GELU (no fast form); GELU_QUICK, whose ``sigmoid(1.702 x)``
with the approximate reciprocal differed from the exact one on the H200 (in both roundings). The sigmoid form
of the tanh GELU, ``x * sigmoid(2 u)``, is not exact either: below x = -3 it is more accurate than ``1 + tanh(u)``, whose
cancellation decides the bf16 bits there (150 inputs differ), hence ``tanh_fast`` (libdevice's own
large-argument formula).
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional, Tuple

import torch

from ._math import GELU_FAST, GELU_NEW, GELU_TANH, SILU

__all__ = ["FAST_ACTS", "fast_math_eligible", "fast_math_verified"]

FAST_ACTS = tuple(int(a) for a in (SILU, GELU_TANH, GELU_NEW, GELU_FAST))

_VERIFIED: Dict[Tuple[str, Optional[int], int], bool] = {}


def fast_math_eligible(act: int, gated: bool, dtype: torch.dtype, rounding: Optional[torch.dtype],
                       device: torch.device, interpreter: bool) -> bool:
    """Whether the forward of activation ``act`` may take the fast form, before the device check.

    Args:
        act: the activation id (``_math``).
        gated: a ``*_and_mul`` op.
        dtype: x's dtype.
        rounding: the dtype ``act(g)`` is rounded to before a gated multiply (None: fused, no rounding).
        device: x's device.
        interpreter: the kernels run under the Triton interpreter.
    """
    return (act in FAST_ACTS and dtype == torch.bfloat16 and (not gated or rounding == torch.bfloat16)
            and device.type == "cuda" and torch.version.hip is None and not interpreter)


def fast_math_verified(device: torch.device, act: int, check: Callable[[torch.device, int], bool]) -> bool:
    """``check(device, act)`` (True when the fast forms equal the exact path on every bf16 input), run once per
    device and activation. False without running it while the current stream captures a CUDA graph (the check
    synchronises): a call signature first launched inside a capture keeps the exact math (same bits, slower).
    A check that raises (out of memory, a synchronisation forbidden by ``torch.cuda.set_sync_debug_mode``)
    counts as failed. Either failure warns once and keeps the exact (libdevice) math on that device."""
    key = (device.type, device.index, act)
    ok = _VERIFIED.get(key)
    if ok is None:
        if torch.cuda.is_current_stream_capturing():
            return False
        try:
            ok = bool(check(device, act))
            why = "differs from the exact one for some bf16 input"
        except Exception as e:  # noqa: BLE001 - any failure of the check means: no fast math
            ok, why = False, f"could not be checked ({type(e).__name__}: {e})"
        _VERIFIED[key] = ok
        if not ok:
            warnings.warn(f"triton-activations: the fast form of activation {act} {why} on {device}; this device keeps "
                          "the exact (libdevice) math", RuntimeWarning)
    return ok
