"""The weight and bias gradients of the norm backwards from their fp32 partial rows, in one launch.

The backward kernels (one program, or one team of programs, per partial row) each write the sum of
``dy * xhat`` (dw) and of ``dy`` (db) over their rows as one fp32 row of a (P, N) partials matrix: no
atomics, so the result is deterministic. :func:`column_sums` adds the P rows of each matrix in fp32
and rounds once to the parameter's dtype. Both gradients come from one kernel launch, where torch's
``part.sum(0).to(dtype)`` took two launches each: on the H200's host a launch through ATen costs
18-30 us, which the backward of a 32768 x 4096 bf16 norm (~220 us of kernels) could not hide.

Order of the sums (fixed, so the bits depend only on P and N): in each program, accumulator row r of
the (BLOCK_P, BLOCK_N) tile adds partial rows r, r + BLOCK_P, r + 2 BLOCK_P, ... in sequence; the
BLOCK_P accumulator rows then meet in Triton's tree reduction.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._fastlaunch import Launch, meta_items
from ._device import is_interpreter, launch_options

__all__ = ["column_sums", "column_sums_plan"]

_BLOCK_P = 64  # partial rows per step: a (64, 32) fp32 tile, 16 per thread over 4 warps
_BLOCK_N = 32  # columns per program: 128 contiguous bytes of each partial row
# Columns per program under the Triton interpreter, which runs programs one after another at a fixed
# cost each: 262144 columns took 8192 programs a sum (~60 s a test). The interpreter sums each column in one order
# whatever the tile, so its bits do not change; on a GPU the tile sets the layout, and with it the order of the tree
# reduction over the BLOCK_P accumulator rows (different bits at 32 and 128, seen on an H100): GPUs keep _BLOCK_N.
_CPU_BLOCK_N = 1024


@triton.jit
def _column_sum(part_ptr, out_ptr, P, N, cols, col_mask, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.arange(0, BLOCK_P)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for p in range(0, P, BLOCK_P):
        r = p + rows
        ptrs = part_ptr + r.to(tl.int64)[:, None] * N + cols[None, :]
        acc += tl.load(ptrs, mask=(r < P)[:, None] & col_mask[None, :], other=0.0)
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _column_sums_kernel(
    dw_part_ptr, db_part_ptr,  # (P, N) fp32 partial rows (contiguous), or None
    dw_ptr, db_ptr,  # (N,) outputs in the parameters' dtypes, or None (with their partials)
    P, N,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # grid (cdiv(N, BLOCK_N), outputs): axis 1 is dw then db (db alone: 0)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if dw_ptr is not None and tl.program_id(1) == 0:
        _column_sum(dw_part_ptr, dw_ptr, P, N, cols, col_mask, BLOCK_P, BLOCK_N)
    if db_ptr is not None:
        if dw_ptr is None or tl.program_id(1) == 1:
            _column_sum(db_part_ptr, db_ptr, P, N, cols, col_mask, BLOCK_P, BLOCK_N)


@functools.lru_cache(maxsize=1024)
def column_sums_plan(P: int, N: int, outputs: int, device: torch.device, block_n: int = 0) -> Launch:
    """The launch of :func:`column_sums` for ``outputs`` (1 or 2) partials of shape (P, N) on ``device``; pointers
    (dw partials, db partials, dw, db), None for an absent pair. ``block_n``: columns per program (a power of two;
    0: 32 compiled, 1024 under the interpreter, whose bits do not depend on it)."""
    block_n = block_n or (_CPU_BLOCK_N if is_interpreter(_column_sums_kernel) else _BLOCK_N)
    meta = meta_items(BLOCK_P=_BLOCK_P, BLOCK_N=block_n, num_warps=4, **launch_options(_column_sums_kernel))
    return Launch(_column_sums_kernel, (triton.cdiv(N, block_n), outputs), meta, (P, N), device)


def column_sums(dw_part: Optional[torch.Tensor], db_part: Optional[torch.Tensor], dw_dtype: Optional[torch.dtype],
                db_dtype: Optional[torch.dtype]) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(dw, db)``: the column sums of the contiguous fp32 (P, N) partials ``dw_part`` / ``db_part``, each (N,)
    rounded once to ``dw_dtype`` / ``db_dtype``; None where that partial is None. Accumulates in fp32 (see the
    module docstring for the order); one kernel launch for both.

    Raises:
        ValueError: a partial that is not a contiguous fp32 (P, N) matrix, two partials of different shapes, or a
            partial without its output dtype."""
    part = dw_part if dw_part is not None else db_part
    if part is None:
        return None, None
    for t, dtype in ((dw_part, dw_dtype), (db_part, db_dtype)):
        if t is not None and (t.dtype != torch.float32 or t.dim() != 2 or not t.is_contiguous()
                              or t.shape != part.shape or dtype is None):
            raise ValueError("column_sums: partials must be contiguous fp32 (P, N) matrices of one shape, each with "
                             f"an output dtype; got {tuple(t.shape)} {t.dtype} (output dtype {dtype})")
    P, N = part.shape
    dw = torch.empty((N,), dtype=dw_dtype, device=part.device) if dw_part is not None else None
    db = torch.empty((N,), dtype=db_dtype, device=part.device) if db_part is not None else None
    if N > 0:
        column_sums_plan(P, N, (dw is not None) + (db is not None), part.device)((dw_part, db_part, dw, db))
    return dw, db
