"""Launch settings for the activation kernels, in one place.

Every kernel is elementwise over rows: one program handles a tile of ``ROWS`` rows x
``BLOCK_N`` columns (for ``*_and_mul`` a row has ``d = x.shape[-1] // 2`` output
columns). The grid is ``(cdiv(rows, ROWS), cdiv(d, BLOCK_N))``: rows wider than a tile
get a second grid axis of column blocks, so no row is ever too wide; narrow rows are
stacked ``ROWS`` to a tile. (``activation`` may lay the same tiles on one grid axis: ``_one_axis_grid``,
``_flat_tiles``.) (A one-axis grid in row-major tile order, where programs launched
one after another read neighbouring memory, ran 4.7% faster with trivial math but 3% slower
with the exact silu / gelu_tanh math on the H200: ``benchmarks/NOTES.md``.)

A tile holds ``GATED_TILE_BYTES`` of each operand (forward of the ``*_and_mul`` ops on rows of at most
``GATED_NARROW_ROW_BYTES``), ``TILE_BYTES`` (forward of the other ``*_and_mul`` rows, and of the plain
ops over ``PLAIN_THREADS`` threads, ``ONE_WAVE_PLAIN_THREADS`` with the exact math in a launch that fits in one
wave) or ``BWD_TILE_BYTES`` (backward), at most
``THREADS`` threads and one 16-byte vector per thread and operand otherwise. On an H200 (bf16,
``benchmarks/NOTES.md``): at 16384 x 2*14336 one row x 1024 bf16 forward (4078 GB/s silu, 3858
gelu_tanh; 2 rows x 1024: 3914 / 3660) and one row x 2048 backward (4124 / 4152) ran fastest; on
2026-12-01, 512-wide gated tiles (2 warps) ran 65536 x 2*1536 at 4009 GB/s against 2905 with
1024-wide tiles (16384 x 2*1536: 3532 / 2649, gelu_tanh 3812 / 3286), 16384 x 2*14336 as fast and
8192 x 2*11008 2.6% slower (hence the narrow-row bound), and the plain gelu / gelu_tanh ran at 2996 /
3348 GB/s with 2 warps per 2 KiB tile against 2783 / 3225 with 4 (silu unchanged): the math
(libdevice exp/tanh/erf, IEEE division) then overlaps the memory traffic. Narrow rows are stacked to fill a
tile; inputs too small to fill the GPU get smaller tiles and one element per thread (a tiny kernel's time is one thread's chain of exp / division: with
8 elements per thread, 5 x 96 bf16 silu_and_mul ran 2.5 us against the CUDA fixture's 1.2). Threads per program are capped so
that ``num_warps * warp_size <= 1024``, the hardware limit on both NVIDIA (32-lane warps) and
AMD (64-lane wavefronts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ._device import MAX_THREADS_PER_PROGRAM, cdiv, check_bool, check_config_args, check_int, config_cache, next_power_of_2

# Bytes of one operand one program handles: forward of the gated ops on rows of at most
# GATED_NARROW_ROW_BYTES of an operand (wider rows: TILE_BYTES), forward of the plain ops; backward.
GATED_TILE_BYTES = 1024
GATED_NARROW_ROW_BYTES = 4096
TILE_BYTES = 2048
BWD_TILE_BYTES = 4096
# Threads per program (fewer for tiles under 16 bytes of an operand per thread); the plain forwards'.
THREADS = 128
PLAIN_THREADS = 64
# ... and the plain forwards' with the exact math in a launch that fits in one wave (one 16-byte vector per thread;
# activation._one_vector_per_thread).
ONE_WAVE_PLAIN_THREADS = 128
# Inputs too small to give MIN_PROGRAMS programs (4 per multiprocessor of an H100/H200) get
# smaller tiles, down to MIN_TILE_BYTES of an operand (port-check: 67 x 5003 bf16 ran at 0.64-0.92
# of a one-block-per-row CUDA kernel with full tiles).
MIN_PROGRAMS = 528
MIN_TILE_BYTES = 512
# Elements per thread in the tiles of such small inputs.
SMALL_ELEMS = 1
# Threads an H100/H200 holds at once (132 multiprocessors x 2048): a launch of at most this many threads runs in
# one wave, its time one program's chain of loads and math rather than throughput. The same figure is used on
# other GPUs (it only chooses between layouts that give the same bits).
WAVE_THREADS = 132 * 2048
# Largest second grid dimension on CUDA (gridDim.y).
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class LaunchConfig:
    """How rows and columns are split over programs."""

    block_n: int  # BLOCK_N constexpr: columns of a tile
    rows: int  # ROWS constexpr: rows of a tile
    num_warps: int  # warps per program; num_warps * warp_size <= 1024
    column_blocks: int  # programs per row (second grid axis)
    row_blocks: int  # programs along the rows (first grid axis)
    one_wave: bool = False  # every program fits on the GPU at once (WAVE_THREADS): the launch is latency-bound


def tile_for(backward: bool, gated: bool, row_bytes: int) -> tuple:
    """``(tile_bytes, threads)`` arguments of :func:`pick_config` for a kernel: the backward's, a gated
    forward's on rows of ``row_bytes`` of an operand (small tiles up to GATED_NARROW_ROW_BYTES), a plain forward's."""
    if backward:
        return BWD_TILE_BYTES, THREADS
    if gated:
        return (GATED_TILE_BYTES if row_bytes <= GATED_NARROW_ROW_BYTES else TILE_BYTES), THREADS
    return TILE_BYTES, PLAIN_THREADS


@config_cache(4096)
def pick_config(N: int, element_size: int, warp_size: int = 32, M: int = 1, tile_bytes: int = TILE_BYTES,
                fill_gpu: bool = True, threads: int = THREADS) -> LaunchConfig:
    """Picks the tile (ROWS x BLOCK_N), warps and grid for ``M`` rows of ``N`` output columns.

    Args:
        N: columns per row (``d`` for the ``*_and_mul`` ops), >= 1.
        element_size: bytes per element of the input (2 for fp16/bf16, 4 for fp32).
        warp_size: lanes per warp of the device (32 NVIDIA, 64 on AMD CDNA).
        M: rows (the product of the leading dims), >= 1.
        tile_bytes: bytes of an operand per program (TILE_BYTES forward, BWD_TILE_BYTES backward).
        fill_gpu: shrink the tiles of small inputs to give MIN_PROGRAMS programs (not under the
            interpreter, which runs programs one after another).
        threads: most threads per program of a full-size tile (THREADS; PLAIN_THREADS for the plain forwards,
            ONE_WAVE_PLAIN_THREADS for their one-wave launches with the exact math).

    Raises:
        ValueError: N, M, element_size, tile_bytes or threads not an int >= 1, a warp_size that is not a
            power of two in [1, 1024], fill_gpu not a bool.
    """
    check_config_args(N, element_size, warp_size)
    for name, value in (("M", M), ("tile_bytes", tile_bytes), ("threads", threads)):
        check_int(name, value, 1)
    check_bool("fill_gpu", fill_gpu)
    tile = max(tile_bytes // element_size, 1)
    block = min(next_power_of_2(N), tile)
    # keep the second grid axis within CUDA's gridDim.y limit for absurdly wide rows
    block = max(block, next_power_of_2(cdiv(N, MAX_GRID_Y)))
    rows = min(max(tile // block, 1), next_power_of_2(M))
    # small inputs: smaller tiles, so that the work spreads over the GPU's multiprocessors
    while fill_gpu and cdiv(M, rows) * cdiv(N, block) < MIN_PROGRAMS \
            and rows * block * element_size > MIN_TILE_BYTES:
        if rows > 1:
            rows //= 2
        else:
            block //= 2
    if fill_gpu and cdiv(M, rows) * cdiv(N, block) < MIN_PROGRAMS:
        # still too few programs (a few thousand elements): the kernel's time is one thread's chain
        # of dependent math (exp, division), so each thread takes SMALL_ELEMS elements, not a
        # 16-byte vector
        threads = min(MAX_THREADS_PER_PROGRAM, max(rows * block // SMALL_ELEMS, 1))
    else:
        threads = min(threads, max(rows * block * element_size // 16, 1))
    num_warps = next_power_of_2(max(threads // warp_size, 1))
    num_warps = min(num_warps, MAX_THREADS_PER_PROGRAM // warp_size)
    return LaunchConfig(block_n=block, rows=rows, num_warps=num_warps, column_blocks=cdiv(N, block),
                        row_blocks=cdiv(M, rows),
                        one_wave=fill_gpu and cdiv(M, rows) * cdiv(N, block) * num_warps * warp_size <= WAVE_THREADS)


