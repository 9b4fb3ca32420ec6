"""Launch settings for every norm kernel, in one place.

A norm kernel reduces one row of ``N`` elements. When the whole row fits in one
block of registers (``BLOCK_N = next_pow2(N)`` elements, at most
``MAX_FUSED_BYTES`` of input) each program loads the row once and keeps it in
registers. Wider rows (N = 65537, 262144, ...) loop over the row in chunks of
``LOOP_BLOCK_BYTES``, reading it again for each pass (2 passes for RMSNorm, 3
for LayerNorm), so no row is ever too wide. On a GPU, rows wider than one block (the backward's
on NVIDIA: wider than ``BWD_MAX_FUSED_BYTES``) go to persistent teams of programs (``_wide``) where they fit.

Warps are derived from the block's size in bytes (about 32 bytes of input per
thread, i.e. two 16-byte vector loads) and capped so that
``num_warps * warp_size <= 1024`` threads per program, the hardware limit on
both NVIDIA (32-lane warps) and AMD (64-lane wavefronts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ._device import MAX_THREADS_PER_PROGRAM, cdiv, check_config_args, check_int, config_cache, next_power_of_2

# Largest row (in bytes of input) kept in registers in one block.
MAX_FUSED_BYTES = 65536
# ... by the backward on NVIDIA GPUs (``bwd_max_fused_bytes``), which holds x, dy and two fp32 partial rows per
# thread: wider rows go to the persistent teams (``_wide``) where they fit. H200, bf16, 8192 x 16384
# (benchmarks/NOTES.md, session 23): one block 565 GB/s (layer_norm, spilling) and 2909 (rms_norm), teams 2360 and
# 3244.
BWD_MAX_FUSED_BYTES = 16384
# Chunk size (in bytes of input) of the looped path for wider rows.
LOOP_BLOCK_BYTES = 16384
# Bytes of input per thread the warp count aims for (H200, kernel time). The forwards: layer_norm at 32 KiB rows
# 2357 -> 3779 GB/s against 64 bytes, the other widths +0.1..1.2% (benchmarks/results/norms_fwd_warps_2026-12-01.md).
# The backwards, which load the next row before reducing this one: layer_norm 2800 / 2400 -> 3328 / 3006 GB/s,
# rms_norm 3460 / 3264 -> 3632 / 3437 at 32768 x 4096 / 16384 x 8192 against 64 bytes without that prefetch
# (benchmarks/NOTES.md, session 23).
BYTES_PER_THREAD = 32


@dataclass(frozen=True)
class LaunchConfig:
    """How one row of N elements is processed by one program."""

    block_n: int  # BLOCK_N constexpr: elements handled per step
    num_warps: int  # warps per program; num_warps * warp_size <= 1024
    loop: bool  # True: several chunks of BLOCK_N per row (wide rows)


@config_cache(4096)
def pick_config(N: int, element_size: int, warp_size: int = 32,
                bytes_per_thread: Optional[int] = None) -> LaunchConfig:
    """Picks (BLOCK_N, num_warps, loop) for rows of ``N`` elements.

    Args:
        N: row length (the normalised size), >= 1.
        element_size: bytes per input element (2 for fp16/bf16, 4 for fp32).
        warp_size: lanes per warp of the device (32 NVIDIA, 64 on AMD CDNA).
        bytes_per_thread: bytes of a row per thread the warps aim for (None: ``BYTES_PER_THREAD``, read at
            the call, so that a sweep can set it; cached, so call ``pick_config.cache_clear()`` after).

    Raises:
        ValueError: N, element_size or bytes_per_thread not an int >= 1, a warp_size that is not a
            power of two in [1, 1024].
    """
    check_config_args(N, element_size, warp_size)
    if bytes_per_thread is None:
        bytes_per_thread = BYTES_PER_THREAD
    check_int("bytes_per_thread", bytes_per_thread, 1)
    block = next_power_of_2(N)
    loop = block * element_size > MAX_FUSED_BYTES
    if loop:
        block = LOOP_BLOCK_BYTES // element_size
    threads = max(block * element_size // bytes_per_thread, 1)
    num_warps = next_power_of_2(max(threads // warp_size, 1))
    num_warps = min(num_warps, MAX_THREADS_PER_PROGRAM // warp_size)
    return LaunchConfig(block_n=block, num_warps=num_warps, loop=loop)


def bwd_max_fused_bytes(device: torch.device) -> int:
    """Widest row (bytes of input) a backward keeps in one block on ``device``; wider rows try the teams.
    ``BWD_MAX_FUSED_BYTES`` (measured on the H200), except on ROCm and XPU, where teams run one program per
    compute unit and nothing was measured: ``MAX_FUSED_BYTES`` there, as before session 23."""
    if device.type == "xpu" or torch.version.hip is not None:
        return MAX_FUSED_BYTES
    return BWD_MAX_FUSED_BYTES


@functools.lru_cache(maxsize=4096)
def num_partial_programs(device: torch.device, M: int) -> int:
    """Programs of a backward kernel that writes one fp32 dw/db partial each.

    Eight programs per multiprocessor on a GPU (each loops over M / P rows: on an H200,
    32768 x 4096 bf16, the backward ran at 3491 GB/s with 8 per multiprocessor against
    3012 with 4); a handful under the interpreter, where programs run one after another.
    """
    if device.type == "cpu":
        return max(1, min(M, 4))
    units = 256  # a safe default for a GPU whose core count torch does not report
    if device.type == "cuda" and torch.cuda.is_available():
        units = torch.cuda.get_device_properties(device).multi_processor_count
    elif device.type == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
        units = getattr(torch.xpu.get_device_properties(device), "gpu_subslice_count", units)
    return max(1, min(M, 8 * units))


def backward_strides(dy2, x2, dh2) -> tuple:
    """The stride arguments of a one-block norm backward: dy's row and column, x's row, dh's row and column (0, 0
    without dh)."""
    dh = (dh2.stride(0), dh2.stride(1)) if dh2 is not None else (0, 0)
    return (dy2.stride(0), dy2.stride(1), x2.stride(0), *dh)


def partial_grid(device: torch.device, M: int) -> tuple:
    """``(P, rows_per_program)`` of a backward over M rows with one fp32 dw/db partial per program: at most
    :func:`num_partial_programs` programs, each taking ``rows_per_program`` consecutive rows (the last fewer)."""
    rows_per_program = cdiv(M, num_partial_programs(device, M))
    return cdiv(M, rows_per_program), rows_per_program
