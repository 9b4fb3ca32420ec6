"""Launch settings for the activation kernels, in one place.

Every kernel is elementwise over rows: the grid is ``(rows, column_blocks)``, one
program per chunk of ``BLOCK_N`` columns of one row (``rows`` = the product of the
leading dims; for ``*_and_mul`` a row has ``d = x.shape[-1] // 2`` output columns).
Rows narrower than a block get one program each; wider rows get a second grid
axis of ``cdiv(d, BLOCK_N)`` programs, so no row is ever too wide.

``BLOCK_N`` is the next power of two of the row, capped at ``MAX_BLOCK_BYTES`` of
one operand. Warps follow from the block's size in bytes (``BYTES_PER_THREAD`` of
each operand per thread: one 16-byte vector) and are capped so that
``num_warps * warp_size <= 1024`` threads per program, the hardware limit on both
NVIDIA (32-lane warps) and AMD (64-lane wavefronts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ._device import is_interpreter

# Largest block (in bytes of one operand) one program handles.
MAX_BLOCK_BYTES = 8192
# Bytes of each operand per thread the warp count aims for (one 16-byte vector).
BYTES_PER_THREAD = 16
# Threads per program allowed by NVIDIA and AMD hardware alike.
MAX_THREADS_PER_PROGRAM = 1024
# Largest second grid dimension on CUDA (gridDim.y).
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class LaunchConfig:
    """How the columns of one row are split over programs."""

    block_n: int  # BLOCK_N constexpr: columns handled by one program
    num_warps: int  # warps per program; num_warps * warp_size <= 1024
    column_blocks: int  # programs per row (second grid axis)


def pick_config(N: int, element_size: int, warp_size: int = 32) -> LaunchConfig:
    """Picks (BLOCK_N, num_warps, column blocks) for rows of ``N`` output columns.

    Args:
        N: columns per row (``d`` for the ``*_and_mul`` ops), >= 1.
        element_size: bytes per element of the input (2 for fp16/bf16, 4 for fp32).
        warp_size: lanes per warp of the device (32 NVIDIA, 64 on AMD CDNA).

    Raises:
        ValueError: for N < 1, element_size < 1 or a warp_size that is not a power
            of two in [1, 1024].
    """
    if N < 1:
        raise ValueError(f"N must be >= 1, got {N}")
    if element_size < 1:
        raise ValueError(f"element_size must be >= 1, got {element_size}")
    if warp_size < 1 or warp_size > MAX_THREADS_PER_PROGRAM or warp_size & (warp_size - 1):
        raise ValueError(f"warp_size must be a power of two in [1, 1024], got {warp_size}")
    block = min(triton.next_power_of_2(N), max(MAX_BLOCK_BYTES // element_size, 1))
    # keep the second grid axis within CUDA's gridDim.y limit for absurdly wide rows
    block = max(block, triton.next_power_of_2(triton.cdiv(N, MAX_GRID_Y)))
    threads = max(block * element_size // BYTES_PER_THREAD, 1)
    num_warps = triton.next_power_of_2(max(threads // warp_size, 1))
    num_warps = min(num_warps, MAX_THREADS_PER_PROGRAM // warp_size)
    return LaunchConfig(block_n=block, num_warps=num_warps, column_blocks=triton.cdiv(N, block))


def use_libdevice(device: torch.device, kernel) -> bool:
    """Whether exp/tanh/erf come from the vendor math library (the LIBDEVICE constexpr).

    True on CUDA and ROCm devices (torch calls both ``cuda``), whose ``libdevice`` holds the
    functions ATen's kernels call; False under the interpreter and on other backends (XPU),
    which use Triton's portable ``tl.exp``/``tl.erf`` and our own tanh.
    """
    return device.type == "cuda" and not is_interpreter(kernel)
