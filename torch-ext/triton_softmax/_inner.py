"""Softmax over a dim that has inner dims after it: ``softmax(x, dim=1)`` of (B, C, H, W), ``softmax(x.t(), dim=0)``.

The output is contiguous, so its reduced dim then has stride I (the product of the sizes after ``dim``): a program
per row (the row kernels of ``softmax``) writes each element into a memory sector of its own, and reads x the same
way where x is contiguous too. On an H100 that ran at 2-8% of the copy bandwidth (``benchmarks/options_probe.py``,
session 50). Here the tensors are seen as (O, N, I): every dim before ``dim`` merged into O, the reduced dim N,
every dim after it merged into I. A program owns BLOCK_I consecutive inner positions of one outer index and reduces
over N in [BLOCK_N, BLOCK_I] tiles, so the stores (and x's loads where x's inner stride is 1) are contiguous along
the inner axis; where x's reduced dim has unit stride instead (a transposed view), its loads are contiguous along N
and the compiler converts the tile's layout between the load and the store. One pass when N fits a tile, else two
(the statistics, then the output), as the row kernels' looped form. Where the outer and inner positions give too
few programs to fill the GPU (fewer than the multiprocessors, half of them in the backward; a long reduced dim:
(2, 32768, 1024) over dim 1, attention pooling over the tokens of (B, S, heads)), the two passes are two launches
and N is split over several programs per column block: each
part writes its (max, sum of exp) (backward: its sum of y * dy) per inner position to an fp32 workspace, and the
second launch combines the parts' partials before it writes its part of the output (the row kernels' split, along
N). Forward and backward; any mask that merges the same way. Same math as the row kernels (fp32, max first, one
rounding at the store); the reduction order differs.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from ._common import LaunchPlan, store_rounded
from ._device import cdiv, launch_options, next_power_of_2
from ._fastlaunch import Launch, meta_items
from ._team import sm_count
from .softmax import _dz, _load_bwd, _load_scores, _max_sumexp_of

TILE = 8192  # elements per [BLOCK_N, BLOCK_I] tile of the two-pass form
ONE_PASS_TILE = 4096  # at most this many in the one-pass form
SHORT_TILE = 2048  # ... where N needs at most SHORT_N rows (class dims of segmentation heads: 12, 19, 21, 50)
SHORT_N = 64
PER_WARP = 2048  # elements a warp holds in the one-pass form (64 a thread): fewer warps than 8 for smaller tiles
TALL_PER_WARP = 1024  # the same where N needs more than TALL_N rows, and in the two-pass form (8 warps on a TILE)
TALL_N = 128
MIN_INNER = 16  # inner positions per program where occupancy asks for narrower blocks (32-byte bf16 stores)
SPLIT_BELOW_PER_SM = 1.0  # forward: two passes with fewer programs than this per SM: N split over programs ...
SPLIT_BELOW_PER_SM_BWD = 0.5  # backward: the same, below this many per SM
SPLIT_PER_SM = 4  # ... to about this many per SM


@triton.jit
def _tile_start(I, IBLOCKS, SPLIT, SPAN, N, BLOCK_I: tl.constexpr):
    """This program's outer index (int64), its inner positions ([1, BLOCK_I], int64) and their mask < I, its part
    of N (0 ... SPLIT - 1; the programs of one column block are consecutive) and that part's [lo, hi)."""
    pid = tl.program_id(0)
    part = pid % SPLIT
    block = pid // SPLIT
    i = ((block % IBLOCKS) * BLOCK_I + tl.arange(0, BLOCK_I)).to(tl.int64)[None, :]
    lo = part * SPAN
    return (block // IBLOCKS).to(tl.int64), i, i < I, part, lo, tl.minimum(lo + SPAN, N)


@triton.jit
def _parts(ws_ptr, o, i, i_ok, SPLIT, I, SPLIT_P2: tl.constexpr):
    """Pointers ([SPLIT_P2, BLOCK_I]) to the workspace words of outer index ``o`` and inner positions ``i``, one row
    per part of N, and their mask."""
    k = tl.arange(0, SPLIT_P2)[:, None]
    return ws_ptr + (o * SPLIT + k) * I + i, (k < SPLIT) & i_ok


@triton.jit
def _inner_fwd_kernel(
    x_ptr,  # input, (O, N, I) strides below
    m_ptr,  # additive mask expanded to x's shape (stride 0 where broadcast), or None
    y_ptr,  # output
    ws_ptr,  # split: fp32 workspace, each part's max per inner position, then (grid * BLOCK_I words on) its sum of exp
    I,  # inner size (product of the dims after the reduced one)
    N,  # reduced size
    IBLOCKS,  # programs per outer index: cdiv(I, BLOCK_I)
    sxo, sxn, sxi,  # elements x moves per outer / reduced / inner index
    smo, smn, smi,  # the same for the mask
    syo, syn, syi,  # the same for y
    scale,  # fp32 multiplier of x
    SPLIT,  # parts of N per column block (1: not split)
    SPAN,  # reduced positions per part (N when not split)
    LOG: tl.constexpr,  # log_softmax
    SCALED: tl.constexpr,  # scale != 1
    BLOCK_N: tl.constexpr,  # reduced positions per tile
    BLOCK_I: tl.constexpr,  # inner positions per program
    LOOP: tl.constexpr,  # N spans several tiles: two passes
    PHASE: tl.constexpr = 0,  # looped: 0 both passes; split: 1 the parts' statistics, 2 combine them and write
    SPLIT_P2: tl.constexpr = 1,  # next power of 2 of SPLIT
):
    # DRAM bytes: read N*I*x (+ mask), write N*I*y; looped: x is read twice.
    o, i, i_ok, part, lo, hi = _tile_start(I, IBLOCKS, SPLIT, SPAN, N, BLOCK_I)
    x_col, m_col, y_col = o * sxo + i * sxi, o * smo + i * smi, o * syo + i * syi
    n = tl.arange(0, BLOCK_N)[:, None]
    if not LOOP:
        keep = (n < N) & i_ok
        z = _load_scores(x_ptr, m_ptr, x_col, m_col, sxn, smn, n, keep, scale, 0, False, "", SCALED)
        zm = z - tl.max(z, axis=0)[None, :]  # a column of -inf: NaN, as torch
        e = tl.exp(zm)
        s = tl.sum(e, axis=0)[None, :]
        if LOG:
            y = zm - tl.log(s)
        else:
            y = e / s
        store_rounded(y_ptr + y_col, n.to(tl.int64) * syn, y, keep)
    else:
        half = tl.num_programs(0).to(tl.int64) * BLOCK_I  # O * SPLIT * I rounded up to whole column blocks
        if PHASE != 2:  # this program's statistics over its [lo, hi)
            mx = tl.full([BLOCK_I], float("-inf"), tl.float32)
            s = tl.zeros([BLOCK_I], dtype=tl.float32)
            for start in range(lo, hi, BLOCK_N):
                keep = (start + n < hi) & i_ok
                z = _load_scores(x_ptr, m_ptr, x_col, m_col, sxn, smn, start + n, keep, scale, 0, False,
                                 "evict_last", SCALED)
                new = tl.maximum(mx, tl.max(z, axis=0))
                base = tl.where(new == float("-inf"), 0.0, new)  # all -inf so far: s stays 0
                s = s * tl.exp(mx - base) + tl.sum(tl.exp(z - base[None, :]), axis=0)
                mx = new
            if PHASE == 1:
                w = ws_ptr + (o * SPLIT + part) * I + i
                tl.store(w, mx[None, :], mask=i_ok)
                tl.store(w + half, s[None, :], mask=i_ok)
        else:  # the parts' (max, sum of exp) of these inner positions, combined
            w, ok = _parts(ws_ptr, o, i, i_ok, SPLIT, I, SPLIT_P2)
            mx, s = _max_sumexp_of(tl.load(w, mask=ok, other=float("-inf")), tl.load(w + half, mask=ok, other=0.0))
        if PHASE != 1:
            mx2, s2 = mx[None, :], s[None, :]
            log_s = tl.log(s2)
            for start in range(lo, hi, BLOCK_N):
                keep = (start + n < hi) & i_ok
                z = _load_scores(x_ptr, m_ptr, x_col, m_col, sxn, smn, start + n, keep, scale, 0, False,
                                 "evict_first", SCALED)
                zm = z - mx2
                if LOG:
                    y = zm - log_s
                else:
                    y = tl.exp(zm) / s2
                store_rounded(y_ptr + y_col, (start + n).to(tl.int64) * syn, y, keep)


@triton.jit
def _inner_bwd_kernel(
    y_ptr,  # saved output
    dy_ptr,  # upstream gradient (stride 0 where expanded)
    dx_ptr,  # input gradient (never dy's buffer)
    ws_ptr,  # split: fp32 workspace (O * SPLIT * I), each part's sum of y * dy (log: of dy); else None
    I, N, IBLOCKS,
    syo, syn, syi,
    sdyo, sdyn, sdyi,
    sdxo, sdxn, sdxi,
    scale,  # dx = scale * dz
    SPLIT, SPAN,  # as the forward's
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_I: tl.constexpr,
    LOOP: tl.constexpr,
    PHASE: tl.constexpr = 0,
    SPLIT_P2: tl.constexpr = 1,
):
    # DRAM bytes: read N*I*(y + dy), write N*I*dx; looped: y and dy are read twice.
    o, i, i_ok, part, lo, hi = _tile_start(I, IBLOCKS, SPLIT, SPAN, N, BLOCK_I)
    y_col, dy_col, dx_col = o * syo + i * syi, o * sdyo + i * sdyi, o * sdxo + i * sdxi
    n = tl.arange(0, BLOCK_N)[:, None]
    if not LOOP:
        keep = (n < N) & i_ok
        p, dy = _load_bwd(y_ptr, dy_ptr, y_col, dy_col, syn, sdyn, n, keep, LOG, "")
        if LOG:
            red = tl.sum(dy, axis=0)[None, :]
        else:
            red = tl.sum(p * dy, axis=0)[None, :]
        store_rounded(dx_ptr + dx_col, n.to(tl.int64) * sdxn, _dz(p, dy, red, n, 0, False, LOG) * scale, keep)
    else:
        if PHASE != 2:  # this program's sum over its [lo, hi)
            acc = tl.zeros([BLOCK_I], dtype=tl.float32)
            for start in range(lo, hi, BLOCK_N):
                keep = (start + n < hi) & i_ok
                p, dy = _load_bwd(y_ptr, dy_ptr, y_col, dy_col, syn, sdyn, start + n, keep, LOG, "evict_last")
                if LOG:
                    acc += tl.sum(dy, axis=0)
                else:
                    acc += tl.sum(p * dy, axis=0)
            if PHASE == 1:
                tl.store(ws_ptr + (o * SPLIT + part) * I + i, acc[None, :], mask=i_ok)
        else:  # the parts' sums of these inner positions
            w, ok = _parts(ws_ptr, o, i, i_ok, SPLIT, I, SPLIT_P2)
            acc = tl.sum(tl.load(w, mask=ok, other=0.0), axis=0)
        if PHASE != 1:
            red = acc[None, :]
            for start in range(lo, hi, BLOCK_N):
                keep = (start + n < hi) & i_ok
                p, dy = _load_bwd(y_ptr, dy_ptr, y_col, dy_col, syn, sdyn, start + n, keep, LOG, "evict_first")
                store_rounded(dx_ptr + dx_col, (start + n).to(tl.int64) * sdxn,
                              _dz(p, dy, red, start + n, 0, False, LOG) * scale, keep)


def _merged(t: Optional[torch.Tensor], dims: range) -> Optional[tuple]:
    """(size, stride) of ``t``'s dims ``dims`` seen as one (sizes of 1 skipped; (1, 0) when all are), or None where
    they do not merge (a dim's stride is not the next one's times its size)."""
    size, stride = 1, 0
    for d in reversed(dims):
        n = t.shape[d]
        if n == 1:
            continue
        if size == 1:
            size, stride = n, t.stride(d)
        elif t.stride(d) == stride * size:
            size *= n
        else:
            return None
    return size, stride


def inner_layout(tensors: Sequence[Optional[torch.Tensor]], dim: int) -> Optional[tuple]:
    """``(O, N, I, strides)`` of same-shaped tensors reduced over ``dim`` (in [0, ndim)) where the dims after it
    hold more than one element (I > 1) and, in every tensor, the dims before it merge into one (O) and the dims
    after it into one (I); ``strides``: per tensor (outer, reduced, inner) strides, zeros for a None entry. None
    otherwise (the row kernels' layout serves it)."""
    shape = next(t for t in tensors if t is not None).shape
    size_i = math.prod(shape[dim + 1:])
    if size_i == 1:
        return None
    strides = []
    for t in tensors:
        if t is None:
            strides.append((0, 0, 0))
            continue
        outer, inner = _merged(t, range(dim)), _merged(t, range(dim + 1, len(shape)))
        if outer is None or inner is None:
            return None
        strides.append((outer[1], t.stride(dim) if shape[dim] > 1 else 0, inner[1]))
    return math.prod(shape[:dim]), shape[dim], size_i, tuple(strides)


def _config(O: int, N: int, I: int, device: torch.device) -> tuple:
    """``(BLOCK_N, BLOCK_I, LOOP, num_warps)``: one pass where N fits a tile of ``TILE`` with ``MIN_INNER`` inner
    positions (up to ``ONE_PASS_TILE`` elements where N leaves room for more inner positions, ``SHORT_TILE`` where
    N needs at most ``SHORT_N`` rows), else two passes over tiles of ``TILE`` with 64 inner positions; narrower
    (down to ``MIN_INNER``) while there are fewer than two programs per multiprocessor; a warp per ``PER_WARP``
    elements (``TALL_PER_WARP`` where N needs more than ``TALL_N`` rows, and in two passes). H100, bf16
    (O, N, I) forwards over N (``benchmarks/softmax_inner_sweep.py``; copy ~2990 GB/s):
    - session 50: a warp per 1024 elements and one-pass tiles of up to 8192 gave 2576 GB/s at 8 x 128 x 65536 and
      1030 at 16 x 19 x 262144 (tiles of 4096 and a warp per 2048: 2701 and 2228). Two passes: 8 warps 882 and
      1831 GB/s at 2 x 32768 x 1024 and over dim 0 of a transposed 4096 x 32768, 4 warps 816 and 1574.
    - session 51, class dims (session 50's rule -> this one): 16 x 19 x 262144 2213 -> 2569, 16 x 21 x 65536
      2008 -> 2294 ([32, 128] of 2 warps -> [32, 64] of 1), 16 x 50 x 65536 2510 -> 2672 ([64, 64] of 2 ->
      [64, 32] of 1), 8 x 150 x 16384 1766 -> 1889 ([256, 16] of 2 -> 4 warps), 8 x 400 x 16384 2176 -> 2222
      (4 -> 8 warps); 64 x 32 x 32768 2839 -> 2802 (-1.3%); 4, 8, 12 and 128 rows unchanged (2564-2893)."""
    block_i = min(next_power_of_2(I), 128)
    full_n = next_power_of_2(N)
    loop = full_n * min(block_i, MIN_INNER) > TILE
    if loop:
        block_i = min(block_i, 64)
    else:
        block_i = min(block_i, max((SHORT_TILE if full_n <= SHORT_N else ONE_PASS_TILE) // full_n, MIN_INNER))
    while O * cdiv(I, block_i) < 2 * sm_count(device) and block_i > MIN_INNER:
        block_i //= 2
    block_n = TILE // block_i if loop else full_n
    per_warp = TALL_PER_WARP if loop or full_n > TALL_N else PER_WARP
    return block_n, block_i, loop, min(8, max(1, block_n * block_i // per_warp))


def _split(programs: int, N: int, block_n: int, loop: bool, device: torch.device, backward: bool = False) -> int:
    """Parts of N per column block: 1 unless two passes would run fewer than ``SPLIT_BELOW_PER_SM`` programs per
    multiprocessor (``SPLIT_BELOW_PER_SM_BWD`` in the backward; after ``_config`` narrowed the blocks), then enough
    for about ``SPLIT_PER_SM`` of them, each part at least a tile. H100, bf16, against the same tiles unsplit
    (session 52, ``options_probe.py --only inner``): 8 x 131072 x 64 (0.24 programs per SM) forward 292 -> 1026 GB/s,
    forward + backward 377 -> 1036; 2 x 32768 x 1024 (0.97) forward 900 -> 1086 but forward + backward 1067 -> 975;
    4 x 1024 x 1024 (1.94, 16 MiB) forward 1629 -> 1132 (the second launch)."""
    sms = sm_count(device)
    if not loop or programs >= (SPLIT_BELOW_PER_SM_BWD if backward else SPLIT_BELOW_PER_SM) * sms:
        return 1
    return min(cdiv(N, block_n), cdiv(SPLIT_PER_SM * sms, programs))


def inner_plan(kernel_args: tuple, layout: tuple, device: torch.device, backward: bool, **consts) -> Optional[LaunchPlan]:
    """The plan of the forward (pointers x, mask, y; ``consts``: LOG, SCALED) or the backward (y, dy, dx; LOG) over
    ``layout`` (:func:`inner_layout`): one launch, or two over a workspace where N is split (:func:`_split`); None
    where the grid would not fit int32. ``kernel_args``: the scalars after the strides (scale)."""
    O, N, I, strides = layout
    block_n, block_i, loop, warps = _config(O, N, I, device)
    iblocks = cdiv(I, block_i)
    split = _split(O * iblocks, N, block_n, loop, device, backward)
    span = cdiv(cdiv(N, split), block_n) * block_n  # whole tiles per part: the last part takes the rest
    split = cdiv(N, span)
    grid = O * iblocks * split
    if grid >= 2**31:
        return None
    kernel = _inner_bwd_kernel if backward else _inner_fwd_kernel
    fixed = (I, N, iblocks, *[s for per in strides for s in per], *kernel_args)

    def launch(phase: int) -> tuple:  # (Launch, picks): the call's three pointers and the workspace (None)
        meta = meta_items(BLOCK_N=block_n, BLOCK_I=block_i, LOOP=loop, num_warps=warps, PHASE=phase,
                          SPLIT_P2=next_power_of_2(split), **consts, **launch_options(kernel))
        return Launch(kernel, (grid,), meta, (*fixed, split, span), device), (0, 1, 2, 3)

    if split == 1:
        return LaunchPlan(False, None, (launch(0),))
    # one word per (outer, part, inner position) and statistic; the kernel indexes the second half from its grid
    words = grid * block_i * (1 if backward else 2)
    return LaunchPlan(False, (words, torch.float32, False), (launch(1), launch(2)))
