"""Softmax and log-softmax (scale and additive/causal mask folded in): Triton kernels, ops, autograd.

Math, per row of N elements along ``dim`` (all in fp32):

    z   = x * scale + mask                    (mask: additive, broadcast to x; absent = 0)
    z_j = -inf where causal and j > i         (i, j: indices of the last two dims; top-left aligned,
                                               as ``torch.ones(L, S).tril()`` in SDPA's is_causal)
    m   = max_j z_j,  s = sum_j exp(z_j - m)
    softmax:      y = exp(z - m) / s
    log_softmax:  y = (z - m) - log(s)

A fully masked row (every z = -inf) gives NaN, as torch does (-inf - -inf). On NVIDIA GPUs the forward's exps are
one ``ex2.approx.ftz`` each (``_libm.exp_approx``): ``tl.exp``'s values, except that exp(z - m) below 2^-126 (z - m <
-87.3) flushes to 0, a term of a sum that is at least 1 and an output below the smallest normal fp32 / bf16.

Rows that fit in one block (``_launch.MAX_FUSED_BYTES``) are read once and written
once. Wider rows on a GPU go to persistent *teams* of programs (``_team``, ``_launch.team_for``, where
``_launch.TEAM_TUNED`` enables them: the forward from 64 KiB rows, the backward from 128 KiB): each
member keeps one chunk in registers, publishes its chunk's max and sum of exp (backward: its
part of sum(dy * y)), waits for its teammates and combines the partials in member order
(``s = sum_k s_k * exp(m_k - m)``), then writes its chunk (``exp(z - m_k) * exp(m_k - m) / s``: one exp
per element): still one read and one write. fp32 rows of 32-64 KiB (without a mask or causal, at least
``_launch.SPLIT_BELOW_ROWS_PER_SM`` rows per SM) go to "teams" of one, one persistent program per row that loads
its next row while it reduces this one (no meeting, the one-block kernel's math and bits).
Otherwise (CPU, or a row no team fits) a wide row runs an
online max/sum over chunks (the running sum is rescaled by ``exp(m_old - m_new)`` when the
maximum grows; chunks that are entirely -inf so far leave it at 0), then an output pass that
reads the row again: 3 row transfers.

Backward, one kernel per row (y is the saved output, dy the upstream gradient):

    softmax:      dz = y * (dy - sum(dy * y))
    log_softmax:  dz = dy - exp(y) * sum(dy)      (0 where causal masks: masked_fill has no gradient)
    dx = scale * dz;  dmask = dz summed to the mask's shape (only if the mask requires grad)

Second derivatives (``create_graph=True``): the backward op's own gradient is the same math as fp32 PyTorch
ops (``_bwd_model``), differentiated by ``torch.func.vjp``.

``dim`` other than the last is a ``movedim`` view: the kernels read the row with its
column stride (no copy), see ``_common``. Performance on the GPU is best for
``dim=-1`` (unit column stride, coalesced loads).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import (LaunchPlan, broadcast_innermost, check_float_tensor, check_real, check_same_device, meta_like,
                      normalize_dim, row_layout, row_start, run_plan, store_rounded)
from ._dispatch import call_op, eager_autograd, fp32_vjp, inference
from ._fastlaunch import Launch, PlanCache, meta_items
from ._libm import exp_approx, nvidia_approx
from ._launch import PLAN_CACHES, SPLIT_BELOW_ROWS_PER_SM, config_for, split_for, team_for
from ._torch_order import softmax_torch_order
from ._team import sm_count, team_gather, team_gather_pair, team_phases, team_publish, team_publish_pair, team_start
from ._device import cdiv, check_dense, check_flag, check_launch_device, launch_options, next_power_of_2
from ._ops import add_op_namespace_prefix

Tensor = torch.Tensor


@triton.jit
def _load_scores(x_ptr, m_ptr, x_row, m_row, stride_x_col, stride_m_col, offs, mask_n, scale, q,
                 CAUSAL: tl.constexpr, EVICT: tl.constexpr, SCALED: tl.constexpr = True):
    """z = x * scale + mask for one chunk of a row (or a tile of rows), fp32; -inf past the row end and
    where causal masks. ``x_row``/``m_row``/``q`` broadcast against ``offs``. ``SCALED`` False: scale is 1."""
    cols = offs.to(tl.int64)
    if not CAUSAL and m_ptr is None and not SCALED:  # plain softmax: the load fills -inf itself
        return tl.load(x_ptr + x_row + cols * stride_x_col, mask=mask_n, other=float("-inf"),
                       eviction_policy=EVICT).to(tl.float32)
    keep = mask_n
    if CAUSAL:
        keep = keep & (offs <= q)
    x = tl.load(x_ptr + x_row + cols * stride_x_col, mask=keep, other=0.0, eviction_policy=EVICT)
    m = x
    if m_ptr is not None:
        m = tl.load(m_ptr + m_row + cols * stride_m_col, mask=keep, other=0.0, eviction_policy=EVICT)
    return _scores_of(x, m, m_ptr, keep, scale, SCALED)


@triton.jit
def _scores_of(x, m, m_ptr, keep, scale, SCALED: tl.constexpr):
    """z = x * scale + m in fp32 from a chunk as loaded (``m`` ignored without a mask), -inf where not ``keep``
    (None: everywhere kept)."""
    z = x.to(tl.float32)
    if SCALED:
        z = z * scale
    if m_ptr is not None:
        z = z + m.to(tl.float32)
    if keep is not None:
        z = tl.where(keep, z, float("-inf"))
    return z


@triton.jit
def _chunk_start(i, n_chunks, BLOCK_N: tl.constexpr, REVERSE: tl.constexpr):
    """First column of the i-th chunk of the second pass (last chunk first when REVERSE)."""
    if REVERSE:
        return (n_chunks - 1 - i) * BLOCK_N
    else:
        return i * BLOCK_N


@triton.jit
def _softmax_fwd_kernel(
    x_ptr,  # input, any strides
    m_ptr,  # additive mask expanded to x's shape (stride 0 where broadcast), or None
    y_ptr,  # output, x's shape, contiguous in x's original layout
    R1, R2,  # sizes of the two inner leading dims (see _common.row_layout)
    sx0, sx1, sx2, sxc,  # elements x_ptr moves per leading index / per column
    sm0, sm1, sm2, smc,  # the same for the mask
    sy0, sy1, sy2, syc,  # the same for y
    M,  # number of rows
    N,  # row length (size of dim)
    Sq,  # size of the second-to-last dim (causal: query index = row % Sq)
    scale,  # fp32 multiplier of x
    CAUSAL: tl.constexpr,  # mask j > i over the last two dims
    LOG: tl.constexpr,  # log_softmax instead of softmax
    SCALED: tl.constexpr,  # scale != 1
    BLOCK_N: tl.constexpr,  # elements per chunk
    LOOP: tl.constexpr,  # the row spans several chunks
    ROWS: tl.constexpr,  # rows per program (one block: ROWS x BLOCK_N); 1 when LOOP
    REVERSE: tl.constexpr,  # looped: the output pass walks the chunks last to first (the newest in L2)
    EVICT1: tl.constexpr,  # looped: eviction hint of the first pass's loads ("evict_last": keep for the re-read)
    EVICT2: tl.constexpr,  # looped: eviction hint of the output pass's re-read ("evict_first")
    PREFETCH: tl.constexpr,  # looped: load chunk i+1 before working on chunk i
    FTZ: tl.constexpr = False,  # NVIDIA (_libm.nvidia_approx): the exps flush results below 2^-126 to 0
):
    # DRAM bytes: read N*x (+ N*mask), write N*y; a looped row is read twice, the second time
    # right after the first and newest chunks first, so mostly from L2.
    if not LOOP:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
        row_ok = rows < M
        rows = tl.where(row_ok, rows, 0)
        x_row = row_start(rows, R1, R2, sx0, sx1, sx2)[:, None]
        m_row = row_start(rows, R1, R2, sm0, sm1, sm2)[:, None]
        y_row = row_start(rows, R1, R2, sy0, sy1, sy2)[:, None]
        q = (rows % Sq)[:, None]
        offs = tl.arange(0, BLOCK_N)[None, :]
        mask_n = (offs < N) & row_ok[:, None]
        # evict_last: +1-4% at 4096-16384 columns on the H200 (benchmarks/NOTES.md, session 22)
        z = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, mask_n, scale, q, CAUSAL, "evict_last", SCALED)
        zm = z - tl.max(z, axis=1)[:, None]
        e = exp_approx(zm, FTZ)
        s = tl.sum(e, axis=1)[:, None]
        if LOG:
            y = zm - tl.log(s)
        else:
            y = e / s
        store_rounded(y_ptr + y_row, offs.to(tl.int64) * syc, y, mask_n)
    else:
        row = tl.program_id(0).to(tl.int64)
        x_row = row_start(row, R1, R2, sx0, sx1, sx2)
        m_row = row_start(row, R1, R2, sm0, sm1, sm2)
        y_row = row_start(row, R1, R2, sy0, sy1, sy2)
        q = row % Sq
        # pass 1: online max and sum of exp over the chunks (PREFETCH: the next chunk's load is issued
        # before this chunk's reductions, two chunks in flight)
        mx = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        n_chunks = tl.cdiv(N, BLOCK_N)
        if PREFETCH:
            offs0 = tl.arange(0, BLOCK_N)
            z_next = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs0, offs0 < N, scale, q, CAUSAL, EVICT1, SCALED)
        for i in range(0, n_chunks):
            if PREFETCH:
                z = z_next
                offs = (i + 1) * BLOCK_N + tl.arange(0, BLOCK_N)
                z_next = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, offs < N, scale, q, CAUSAL,
                                      EVICT1, SCALED)
            else:
                offs = i * BLOCK_N + tl.arange(0, BLOCK_N)
                z = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, offs < N, scale, q, CAUSAL, EVICT1, SCALED)
            new = tl.maximum(mx, tl.max(z, axis=0))
            base = tl.where(new == float("-inf"), 0.0, new)  # all -inf so far: s stays 0, no NaN
            s = s * tl.exp(mx - base) + tl.sum(exp_approx(z - base, FTZ), axis=0)
            mx = new
        # pass 2: read the row again and write y (mx = -inf, s = 0 for a fully masked row: NaN as torch); y is
        # exp(z - mx) times 1 / s, one division per row (+4-5% at 4096 x 32768 on the H200 against a division per
        # element, three runs; benchmarks/NOTES.md, session 23)
        inv_s = 1.0 / s
        if PREFETCH:
            offs0 = _chunk_start(0, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
            z_next = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs0, offs0 < N, scale, q, CAUSAL, EVICT2, SCALED)
        for i in range(0, n_chunks):
            offs = _chunk_start(i, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
            mask_n = offs < N
            if PREFETCH:
                z = z_next
                offs_next = _chunk_start(i + 1, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
                z_next = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs_next,
                                      (offs_next >= 0) & (offs_next < N), scale, q, CAUSAL, EVICT2, SCALED)
            else:
                z = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, mask_n, scale, q, CAUSAL, EVICT2, SCALED)
            zm = z - mx
            if LOG:
                y = zm - tl.log(s)
            else:
                y = exp_approx(zm, FTZ) * inv_s
            store_rounded(y_ptr + y_row, offs.to(tl.int64) * syc, y, mask_n)


@triton.jit
def _load_bwd(y_ptr, dy_ptr, y_row, dy_row, stride_y_col, stride_dy_col, offs, mask_n, LOG: tl.constexpr,
              EVICT: tl.constexpr):
    """(p, dy) for one chunk, fp32: p = y for softmax, exp(y) for log_softmax; 0 past the row end."""
    cols = offs.to(tl.int64)
    p = tl.load(y_ptr + y_row + cols * stride_y_col, mask=mask_n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if LOG:
        p = tl.where(mask_n, tl.exp(p), 0.0)
    dy = tl.load(dy_ptr + dy_row + cols * stride_dy_col, mask=mask_n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    return p, dy


@triton.jit
def _dz(p, dy, red, offs, q, CAUSAL: tl.constexpr, LOG: tl.constexpr):
    """dz of one chunk given the row's reduction ``red`` (sum(dy*y), or sum(dy) for log_softmax)."""
    if LOG:
        dz = dy - p * red
    else:
        dz = p * (dy - red)
    if CAUSAL:
        dz = tl.where(offs <= q, dz, 0.0)
    return dz


@triton.jit
def _softmax_bwd_kernel(
    y_ptr,  # saved output, contiguous in x's original layout
    dy_ptr,  # upstream gradient, any strides (0 for expanded)
    dx_ptr,  # output gradient, contiguous in x's original layout (never dy's buffer)
    R1, R2,
    sy0, sy1, sy2, syc,
    sdy0, sdy1, sdy2, sdyc,
    sdx0, sdx1, sdx2, sdxc,
    M, N, Sq,
    scale,  # dx = scale * dz
    CAUSAL: tl.constexpr,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LOOP: tl.constexpr,
    ROWS: tl.constexpr,
    REVERSE: tl.constexpr,
    EVICT1: tl.constexpr,
    EVICT2: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    # DRAM bytes: read N*(y + dy), write N*dx; a looped row re-reads y and dy (mostly from L2).
    if not LOOP:
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
        row_ok = rows < M
        rows = tl.where(row_ok, rows, 0)
        y_row = row_start(rows, R1, R2, sy0, sy1, sy2)[:, None]
        dy_row = row_start(rows, R1, R2, sdy0, sdy1, sdy2)[:, None]
        dx_row = row_start(rows, R1, R2, sdx0, sdx1, sdx2)[:, None]
        q = (rows % Sq)[:, None]
        offs = tl.arange(0, BLOCK_N)[None, :]
        mask_n = (offs < N) & row_ok[:, None]
        p, dy = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, mask_n, LOG, "")
        if LOG:
            red = tl.sum(dy, axis=1)[:, None]
        else:
            red = tl.sum(p * dy, axis=1)[:, None]
        dz = _dz(p, dy, red, offs, q, CAUSAL, LOG)
        store_rounded(dx_ptr + dx_row, offs.to(tl.int64) * sdxc, dz * scale, mask_n)
    else:
        row = tl.program_id(0).to(tl.int64)
        y_row = row_start(row, R1, R2, sy0, sy1, sy2)
        dy_row = row_start(row, R1, R2, sdy0, sdy1, sdy2)
        dx_row = row_start(row, R1, R2, sdx0, sdx1, sdx2)
        q = row % Sq
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        n_chunks = tl.cdiv(N, BLOCK_N)
        if PREFETCH:
            offs0 = tl.arange(0, BLOCK_N)
            p_next, dy_next = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs0, offs0 < N, LOG, EVICT1)
        for i in range(0, n_chunks):
            if PREFETCH:
                p, dy = p_next, dy_next
                offs = (i + 1) * BLOCK_N + tl.arange(0, BLOCK_N)
                p_next, dy_next = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, offs < N, LOG, EVICT1)
            else:
                offs = i * BLOCK_N + tl.arange(0, BLOCK_N)
                p, dy = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, offs < N, LOG, EVICT1)
            if LOG:
                acc += dy
            else:
                acc += p * dy
        red = tl.sum(acc, axis=0)
        if PREFETCH:
            offs0 = _chunk_start(0, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
            p_next, dy_next = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs0, offs0 < N, LOG, EVICT2)
        for i in range(0, n_chunks):
            offs = _chunk_start(i, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
            mask_n = offs < N
            if PREFETCH:
                p, dy = p_next, dy_next
                offs_next = _chunk_start(i + 1, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
                p_next, dy_next = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs_next,
                                            (offs_next >= 0) & (offs_next < N), LOG, EVICT2)
            else:
                p, dy = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, mask_n, LOG, EVICT2)
            dz = _dz(p, dy, red, offs, q, CAUSAL, LOG)
            store_rounded(dx_ptr + dx_row, offs.to(tl.int64) * sdxc, dz * scale, mask_n)


@triton.jit
def _split_part(SPLIT, SPAN, N):
    """(row, first column, end column) of this program's part of a split row."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLIT
    lo = (pid % SPLIT) * SPAN
    return pid, row, lo, tl.minimum(lo + SPAN, N)


@triton.jit
def _softmax_split_stats_kernel(
    x_ptr, m_ptr, ws_ptr,  # ws: fp32 (2, rows * SPLIT): each part's max, then its sum of exp
    R1, R2,
    sx0, sx1, sx2, sxc,
    sm0, sm1, sm2, smc,
    M, N, Sq, scale,
    SPLIT,  # programs per row
    SPAN,  # columns per program (a multiple of BLOCK_N)
    CAUSAL: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Wide rows and few of them: SPLIT programs per row, each reduces its SPAN columns (read once).
    pid, row, lo, hi = _split_part(SPLIT, SPAN, N)
    x_row = row_start(row, R1, R2, sx0, sx1, sx2)
    m_row = row_start(row, R1, R2, sm0, sm1, sm2)
    q = row % Sq
    mx = tl.full([], float("-inf"), tl.float32)
    s = tl.full([], 0.0, tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask_n = offs < hi
        z = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, mask_n, scale, q, CAUSAL, "", SCALED)
        new = tl.maximum(mx, tl.max(z, axis=0))
        base = tl.where(new == float("-inf"), 0.0, new)
        s = s * tl.exp(mx - base) + tl.sum(tl.exp(z - base), axis=0)
        mx = new
    tl.store(ws_ptr + pid, mx)
    tl.store(ws_ptr + M * SPLIT + pid, s)


@triton.jit
def _softmax_split_out_kernel(
    x_ptr, m_ptr, y_ptr, ws_ptr,
    R1, R2,
    sx0, sx1, sx2, sxc,
    sm0, sm1, sm2, smc,
    sy0, sy1, sy2, syc,
    M, N, Sq, scale,
    SPLIT, SPAN,
    CAUSAL: tl.constexpr,
    LOG: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_P2: tl.constexpr,  # next power of 2 of SPLIT
):
    # Combines the row's SPLIT partial (max, sum) pairs, then writes its SPAN columns (read again).
    pid, row, lo, hi = _split_part(SPLIT, SPAN, N)
    k = tl.arange(0, SPLIT_P2)
    mi = tl.load(ws_ptr + row * SPLIT + k, mask=k < SPLIT, other=float("-inf"))
    si = tl.load(ws_ptr + M * SPLIT + row * SPLIT + k, mask=k < SPLIT, other=0.0)
    mx, s = _max_sumexp_of(mi, si)
    x_row = row_start(row, R1, R2, sx0, sx1, sx2)
    m_row = row_start(row, R1, R2, sm0, sm1, sm2)
    y_row = row_start(row, R1, R2, sy0, sy1, sy2)
    q = row % Sq
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask_n = offs < hi
        zm = _load_scores(x_ptr, m_ptr, x_row, m_row, sxc, smc, offs, mask_n, scale, q, CAUSAL, "", SCALED) - mx
        if LOG:
            y = zm - tl.log(s)
        else:
            y = tl.exp(zm) / s
        store_rounded(y_ptr + y_row, offs.to(tl.int64) * syc, y, mask_n)


@triton.jit
def _softmax_bwd_split_stats_kernel(
    y_ptr, dy_ptr, ws_ptr,  # ws: fp32 (rows * SPLIT,) partial sums of dy * y (log: of dy)
    R1, R2,
    sy0, sy1, sy2, syc,
    sdy0, sdy1, sdy2, sdyc,
    SPLIT, SPAN, N,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid, row, lo, hi = _split_part(SPLIT, SPAN, N)
    y_row = row_start(row, R1, R2, sy0, sy1, sy2)
    dy_row = row_start(row, R1, R2, sdy0, sdy1, sdy2)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask_n = offs < hi
        p, dy = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, mask_n, LOG, "")
        if LOG:
            acc += dy
        else:
            acc += p * dy
    tl.store(ws_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _softmax_bwd_split_out_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr,
    R1, R2,
    sy0, sy1, sy2, syc,
    sdy0, sdy1, sdy2, sdyc,
    sdx0, sdx1, sdx2, sdxc,
    N, Sq, scale,
    SPLIT, SPAN,
    CAUSAL: tl.constexpr,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_P2: tl.constexpr,
):
    pid, row, lo, hi = _split_part(SPLIT, SPAN, N)
    k = tl.arange(0, SPLIT_P2)
    red = tl.sum(tl.load(ws_ptr + row * SPLIT + k, mask=k < SPLIT, other=0.0), axis=0)
    y_row = row_start(row, R1, R2, sy0, sy1, sy2)
    dy_row = row_start(row, R1, R2, sdy0, sdy1, sdy2)
    dx_row = row_start(row, R1, R2, sdx0, sdx1, sdx2)
    q = row % Sq
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask_n = offs < hi
        p, dy = _load_bwd(y_ptr, dy_ptr, y_row, dy_row, syc, sdyc, offs, mask_n, LOG, "")
        dz = _dz(p, dy, red, offs, q, CAUSAL, LOG)
        store_rounded(dx_ptr + dx_row, offs.to(tl.int64) * sdxc, dz * scale, mask_n)


@triton.jit
def _chunk_max_exp(z, FTZ: tl.constexpr):
    """A team member's chunk ``z`` (fp32, -inf where masked): its max and exp(z - max) (0 for an all -inf chunk).
    ``FTZ``: the exp flushes results below 2^-126 to 0 (``_libm.exp_approx``), terms of a sum that is >= 1."""
    m_own = tl.max(z, axis=0)
    return m_own, exp_approx(z - tl.where(m_own == float("-inf"), 0.0, m_own), FTZ)


@triton.jit
def _team_max_sumexp(slots, k, TEAM):
    """(max, sum of exp(z - max)) of a whole row from its ``TEAM`` members' published pairs (max, sum of exp) in
    ``slots[k]`` (``_team.team_publish_pair``), combined in member order: the same bits in every member and run."""
    mi, si = team_gather_pair(slots, k, TEAM, float("-inf"), 0.0)
    return _max_sumexp_of(mi, si)


@triton.jit
def _max_sumexp_of(mi, si):
    """(max, sum of exp(z - max)) of a row from its members' gathered maxima ``mi`` and sums ``si``."""
    mx = tl.max(mi, axis=0)
    return mx, tl.sum(si * tl.exp(mi - tl.where(mx == float("-inf"), 0.0, mx)), axis=0)


@triton.jit
def _team_softmax_of(e, z, m_own, mx, s, LOG: tl.constexpr):
    """A member's output from its chunk (``e`` = exp(z - m_own)) and the row's (max, sum of exp): one exp per
    element in all. NaN on a fully masked row (mx = -inf), as torch."""
    if LOG:
        return (z - mx) - tl.log(s)
    else:
        return e * (tl.exp(tl.where(m_own == float("-inf"), mx, m_own) - mx) / s)


@triton.jit
def _team_load(a_ptr, b_ptr, row, R1, R2, sa0, sa1, sa2, sac, sb0, sb1, sb2, sbc, offs, N, M,
               EVICT: tl.constexpr, EVEN: tl.constexpr = 0):
    """One chunk of ``row`` of a (and of b, if given) as stored, 0 past the row end and past the last row.
    The persistent team kernels load their next row with it before meeting on the current one: no
    arithmetic on the values yet, so the loads stay in flight while the program waits. ``EVICT``: the loads'
    L2 eviction hint ("" or "evict_last"); ``EVEN``: the team's chunks tile N (no column past the row end): the
    masked loads are only those past the last row, whose values nothing reads (no ``other``)."""
    live = offs < tl.where(row < M, N, 0)
    cols = offs.to(tl.int64)
    other = None if EVEN else 0.0
    a = tl.load(a_ptr + row_start(row, R1, R2, sa0, sa1, sa2) + cols * sac, mask=live, other=other,
                eviction_policy=EVICT)
    b = a
    if b_ptr is not None:
        b = tl.load(b_ptr + row_start(row, R1, R2, sb0, sb1, sb2) + cols * sbc, mask=live, other=other,
                    eviction_policy=EVICT)
    return a, b


@triton.jit
def _team_scores(x, m, m_ptr, offs, mask_n, q, scale, CAUSAL: tl.constexpr, SCALED: tl.constexpr,
                 EVEN: tl.constexpr = 0):
    """z = x * scale + mask from a chunk loaded by ``_team_load`` (as ``_load_scores``); ``EVEN``: no column past
    the row end."""
    if CAUSAL:
        keep = offs <= q
        if not EVEN:
            keep = keep & mask_n
        return _scores_of(x, m, m_ptr, keep, scale, SCALED)
    elif EVEN:
        return _scores_of(x, m, m_ptr, None, scale, SCALED)
    else:
        return _scores_of(x, m, m_ptr, mask_n, scale, SCALED)


@triton.jit
def _softmax_team_fwd_kernel(
    x_ptr, m_ptr, y_ptr,
    ws_ptr,  # int64 (rows, TEAM) zeros: each member's published pair (max, sum of exp) (see _team)
    R1, R2,
    sx0, sx1, sx2, sxc,
    sm0, sm1, sm2, smc,
    sy0, sy1, sy2, syc,
    M, N, Sq, scale,
    TEAM,  # programs per row, each BLOCK_N columns (TEAM * BLOCK_N >= N)
    TEAMS,  # teams in the persistent grid: team t takes rows t, t + TEAMS, ...
    CAUSAL: tl.constexpr,
    LOG: tl.constexpr,
    SCALED: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,  # next power of 2 of TEAM (at least _team.TEAM_P2_MIN)
    PHASE: tl.constexpr,  # 0: publish, wait, write; 1: publish only; 2: wait and write only (interpreter)
    ALONE: tl.constexpr,  # TEAM == 1: a whole row per program, no meeting, ws_ptr unused (the one-block math,
    #                      persistent, the next row's loads in flight during this row's reductions)
    FTZ: tl.constexpr = False,  # NVIDIA (_libm.nvidia_approx): exp(z - m_own) flushes results below 2^-126 to 0
    #                            (as the one-block kernel's, so that ALONE keeps its bits)
    EVEN: tl.constexpr = 0,  # N % BLOCK_N == 0: no column past the row end (no masked columns, no -inf padding)
):
    # Wide rows read once: the row's TEAM programs keep a chunk each in registers, exchange their
    # (max, sum of exp) and write y from registers. DRAM: read N*x, write N*y.
    member, row, offs, mask_n = team_start(TEAM, N, BLOCK_N)
    if EVEN:
        mask_n = None  # (the stores' mask)
    k = tl.arange(0, TEAM_P2)
    # evict_last: +4% / +2% / -1% at N = 65536 / 131072 / 262144 on the H200 (benchmarks/NOTES.md, session 22)
    xr, mr = _team_load(x_ptr, m_ptr, row, R1, R2, sx0, sx1, sx2, sxc, sm0, sm1, sm2, smc, offs, N, M, "evict_last",
                        EVEN)
    while row < M:
        z = _team_scores(xr, mr, m_ptr, offs, mask_n, row % Sq, scale, CAUSAL, SCALED, EVEN)
        # the next row's loads go out before this row's two reductions (session 21: +3-5% from 256 KiB rows)
        nxt = row + TEAMS
        xr, mr = _team_load(x_ptr, m_ptr, nxt, R1, R2, sx0, sx1, sx2, sxc, sm0, sm1, sm2, smc, offs, N, M,
                            "evict_last", EVEN)
        m_own, e = _chunk_max_exp(z, FTZ)
        if ALONE:  # the one-block kernel's rounding: y = e / s, or (z - m) - log(s)
            s = tl.sum(e, axis=0)
            if LOG:
                y = (z - m_own) - tl.log(s)
            else:
                y = e / s
            store_rounded(y_ptr + row_start(row, R1, R2, sy0, sy1, sy2), offs.to(tl.int64) * syc, y, mask_n)
        else:
            slots = ws_ptr + row * TEAM
            if PHASE != 2:
                team_publish_pair(slots + member, m_own, tl.sum(e, axis=0))
            if PHASE != 1:
                mx, s = _team_max_sumexp(slots, k, TEAM)
                y = _team_softmax_of(e, z, m_own, mx, s, LOG)
                store_rounded(y_ptr + row_start(row, R1, R2, sy0, sy1, sy2), offs.to(tl.int64) * syc, y, mask_n)
        row = nxt


@triton.jit
def _softmax_team_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr,
    ws_ptr,  # int64 (rows, TEAM) zeros: each member's published sum of dy * y (log: of dy)
    R1, R2,
    sy0, sy1, sy2, syc,
    sdy0, sdy1, sdy2, sdyc,
    sdx0, sdx1, sdx2, sdxc,
    M, N, Sq, scale,
    TEAM, TEAMS,
    CAUSAL: tl.constexpr,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,
):
    # DRAM: read N*(y + dy), write N*dx, each once.
    member, row, offs, mask_n = team_start(TEAM, N, BLOCK_N)
    k = tl.arange(0, TEAM_P2)
    yr, dyr = _team_load(y_ptr, dy_ptr, row, R1, R2, sy0, sy1, sy2, syc, sdy0, sdy1, sdy2, sdyc, offs, N, M, "")
    while row < M:
        p = yr.to(tl.float32)
        if LOG:
            p = tl.where(mask_n, tl.exp(p), 0.0)
        dy = dyr.to(tl.float32)
        slots = ws_ptr + row * TEAM
        if PHASE != 2:
            if LOG:
                team_publish(slots + member, tl.sum(dy, axis=0))
            else:
                team_publish(slots + member, tl.sum(p * dy, axis=0))
        nxt = row + TEAMS
        yr, dyr = _team_load(y_ptr, dy_ptr, nxt, R1, R2, sy0, sy1, sy2, syc, sdy0, sdy1, sdy2, sdyc, offs, N, M, "")
        if PHASE != 1:
            red = tl.sum(team_gather(slots, k, TEAM, 0.0), axis=0)
            dz = _dz(p, dy, red, offs, row % Sq, CAUSAL, LOG)
            store_rounded(dx_ptr + row_start(row, R1, R2, sdx0, sdx1, sdx2), offs.to(tl.int64) * sdxc, dz * scale,
                          mask_n)
        row = nxt


def _team_phases(device: torch.device, team: int):
    """Launch phases of a team kernel: one spinning launch on a GPU, publish then write under the
    interpreter (programs run one at a time there; a team of one never waits)."""
    return team_phases(device, team)


def _as_1d(t: Optional[Tensor]) -> Optional[Tensor]:
    """A 0-d tensor as shape (1,) (torch treats a scalar as a row of one)."""
    return t.reshape(1) if t is not None and t.dim() == 0 else t


def _softmax_fwd_impl(x: Tensor, mask: Optional[Tensor], dim: int, scale: float, causal: bool, log: bool,
                      torch_order: bool) -> Tensor:
    """y = (log_)softmax(x * scale + mask) over ``dim`` (x's dtype, contiguous); ``torch_order``: in
    torch's CUDA order where ``_torch_order`` models it (plain softmax over rows with inner size 1)."""
    y = torch.empty_like(x, memory_format=torch.contiguous_format)  # a third of torch.empty(shape, ...)'s host time
    if x.numel() == 0:
        return y
    if torch_order:  # a direct call of the registered op may pass a negative dim (the plans' layout normalises it)
        dim = normalize_dim(dim, x.dim())
        if math.prod(x.shape[dim + 1:]) == 1:  # torch's last-dim kernels (inner size 1)
            check_launch_device(x, _softmax_fwd_kernel)
            N = x.shape[dim] if x.dim() else 1
            x2 = x.reshape(-1, N)  # (M, N) rows need a unit column stride: a strided row is copied (torch's too)
            softmax_torch_order(x2 if N == 1 or x2.stride(1) == 1 else x2.contiguous(), y.view(-1, N))
            return y
    key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15,
           mask if mask is None else (mask.shape, mask.stride(), mask.dtype, mask.data_ptr() & 15), dim, scale,
           causal, log)
    plan = _FWD_PLANS.get(key)
    if plan is None:  # the key fixes the inputs' 16-byte alignment (copies and y: new allocations): pinned launches
        plan = _fwd_plan(x, mask, y, dim, scale, causal, log)
        plan = _FWD_PLANS.add(key, plan._replace(launches=tuple((run.pinned(), picks) for run, picks in plan.launches)))
    if plan.copy:  # more than 3 unmergeable leading dims: the one documented copy
        x = x.contiguous()
        mask = mask.expand(x.shape).contiguous() if mask is not None else None
    run_plan(plan, (x, mask, y), y.device)
    return y


_FWD_PLANS = PlanCache()  # the forward's launch plans per call signature (LaunchPlan; _launch.retuned clears them)
_BWD_PLANS = PlanCache()
PLAN_CACHES.extend((_FWD_PLANS, _BWD_PLANS))


def _fwd_plan(x: Tensor, mask: Optional[Tensor], y: Tensor, dim: int, scale: float, causal: bool,
              log: bool) -> LaunchPlan:
    """The launches of the forward for this signature: persistent teams (wide rows), a row split over
    programs (few wide rows), or one program per ``cfg.rows`` rows. Pointers (see run_plan): 0 x, 1 mask,
    2 y, 3 the workspace."""
    check_launch_device(x, _softmax_fwd_kernel)
    xs, ys = _as_1d(x), _as_1d(y)
    ms = _as_1d(mask.expand(x.shape)) if mask is not None else None
    inner = _inner_plan([xs, ms, ys], dim, causal, (float(scale),), x.device, False, LOG=log, SCALED=scale != 1.0)
    if inner is not None:  # dims after the reduced one (y's reduced stride is not 1): tiles along them (_inner)
        return inner
    layout = row_layout([xs, ms, ys], dim)
    copy = layout is None
    if copy:  # the layout of the contiguous copies (no data needed: "meta" tensors of their strides)
        xs, ms = _as_1d(meta_like(x)), ms if ms is None else _as_1d(meta_like(ms))
        layout = row_layout([xs, ms, ys], dim)
    if mask is not None and not causal:  # a mask broadcast over outer dims: its row's readers one after another
        layout = broadcast_innermost(layout, 1)
    N = xs.shape[dim]
    big = x if mask is None or x.element_size() >= mask.element_size() else mask
    sq = xs.shape[-2] if causal else 1
    team = team_for(N, big, layout.rows, "softmax")
    device = x.device
    if team is not None and team.team == 1 and (mask is not None or causal
                                                or layout.rows < SPLIT_BELOW_ROWS_PER_SM * sm_count(device)):
        team = None  # a team of one was measured only without a mask or causal, on >= 4 rows per SM (session 24)
    if team is not None:  # wide rows: persistent teams of programs, the row read once
        fixed = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1), *layout.args(2), layout.rows, N,
                 sq, float(scale), team.team, team.teams)
        alone = team.team == 1  # no meeting, no workspace
        return LaunchPlan(copy, None if alone else (layout.rows * team.team, torch.int64, True), tuple(
            (Launch(_softmax_team_fwd_kernel, team.grid,
                    team.meta(_softmax_team_fwd_kernel, device, phase, CAUSAL=causal, LOG=log, SCALED=scale != 1.0,
                              ALONE=alone, FTZ=nvidia_approx(device, _softmax_team_fwd_kernel),
                              EVEN=int(N % team.block_n == 0)),
                    fixed, device), (0, 1, 2, 3))
            for phase in _team_phases(device, team.team)))
    cfg = config_for(N, big)
    split = split_for(cfg, N, layout.rows, device)
    if split > 1:  # few wide rows: split each row over several programs (two launches)
        span = cdiv(cdiv(N, split), cfg.block_n) * cfg.block_n
        split = cdiv(N, span)
        common = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1))
        stats = Launch(_softmax_split_stats_kernel, (layout.rows * split,),
                       meta_items(CAUSAL=causal, SCALED=scale != 1.0, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                                  **launch_options(_softmax_split_stats_kernel)),
                       (*common, layout.rows, N, sq, float(scale), split, span), device)
        out = Launch(_softmax_split_out_kernel, (layout.rows * split,),
                     meta_items(CAUSAL=causal, LOG=log, SCALED=scale != 1.0, BLOCK_N=cfg.block_n,
                                SPLIT_P2=next_power_of_2(split), num_warps=cfg.num_warps,
                                **launch_options(_softmax_split_out_kernel)),
                     (*common, *layout.args(2), layout.rows, N, sq, float(scale), split, span), device)
        return LaunchPlan(copy, (2 * layout.rows * split, torch.float32, False), ((stats, (0, 1, 3)),
                                                                                   (out, (0, 1, 2, 3))))
    meta = meta_items(CAUSAL=causal, LOG=log, SCALED=scale != 1.0, BLOCK_N=cfg.block_n, LOOP=cfg.loop,
                      ROWS=cfg.rows, **cfg.loop_options, num_warps=cfg.num_warps,
                      FTZ=nvidia_approx(device, _softmax_fwd_kernel), **launch_options(_softmax_fwd_kernel))
    fixed = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1), *layout.args(2), layout.rows, N, sq,
             float(scale))
    return LaunchPlan(copy, None, ((Launch(_softmax_fwd_kernel, (cdiv(layout.rows, cfg.rows),), meta, fixed, device),
                                    (0, 1, 2)),))


def _inner_plan(tensors: list, dim: int, causal: bool, kernel_args: tuple, device: torch.device, backward: bool,
                **consts) -> Optional[LaunchPlan]:
    """The plan of ``_inner`` (softmax over a dim with inner dims after it) for these tensors, or None (the row
    kernels; always with ``causal``: the tiles have no causal mask). Imported here: ``_inner`` takes its jit
    helpers from this module."""
    if causal:
        return None
    from ._inner import inner_layout, inner_plan

    layout = inner_layout(tensors, normalize_dim(dim, tensors[0].dim()))
    return None if layout is None else inner_plan(kernel_args, layout, device, backward, **consts)


_softmax_fwd = torch.library.custom_op(add_op_namespace_prefix("softmax_fwd"), _softmax_fwd_impl, mutates_args=())
"""The registered op (autograd, fake, compile); eager inference calls ``_softmax_fwd_impl`` directly."""


@_softmax_fwd.register_fake
def _(x, mask, dim, scale, causal, log, torch_order):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_bwd_impl(dy: Tensor, y: Tensor, dim: int, scale: float, causal: bool, log: bool, dx_dtype: torch.dtype) -> Tensor:
    """dx = scale * dz (see the module docstring), dtype ``dx_dtype``, contiguous."""
    dx = torch.empty(y.shape, dtype=dx_dtype, device=y.device)
    if y.numel() == 0:
        return dx
    key = (y.shape, y.stride(), y.dtype, y.device, dy.stride(), dy.dtype, dx_dtype, dim, scale, causal, log)
    plan = _BWD_PLANS.get(key)
    if plan is None:
        plan = _BWD_PLANS.add(key, _bwd_plan(dy, y, dx, dim, scale, causal, log))
    if plan.copy:  # contiguous copies (y is one already when it comes from the forward)
        y, dy = y.contiguous(), dy.contiguous()
    run_plan(plan, (y, dy, dx), dx.device)
    return dx


def _bwd_plan(dy: Tensor, y: Tensor, dx: Tensor, dim: int, scale: float, causal: bool, log: bool) -> LaunchPlan:
    """The backward's launches for this signature (as ``_fwd_plan``). Pointers: 0 y, 1 dy, 2 dx, 3 the
    workspace."""
    check_launch_device(y, _softmax_bwd_kernel)
    ys, dys, dxs = _as_1d(y), _as_1d(dy), _as_1d(dx)
    inner = _inner_plan([ys, dys, dxs], dim, causal, (float(scale),), y.device, True, LOG=log)
    if inner is not None:  # dims after the reduced one: tiles along them (_inner)
        return inner
    layout = row_layout([ys, dys, dxs], dim)
    copy = layout is None
    if copy:  # the layout of contiguous copies of y and dy ("meta" tensors of their strides)
        ys, dys = _as_1d(meta_like(y)), _as_1d(meta_like(dy))
        layout = row_layout([ys, dys, dxs], dim)
    N = ys.shape[dim]
    sq = ys.shape[-2] if causal else 1
    device = y.device
    team = team_for(N, ys, layout.rows, "softmax_bwd")
    if team is not None:  # wide rows: persistent teams of programs, y and dy read once
        fixed = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1), *layout.args(2), layout.rows, N,
                 sq, float(scale), team.team, team.teams)
        return LaunchPlan(copy, (layout.rows * team.team, torch.int64, True), tuple(
            (Launch(_softmax_team_bwd_kernel, team.grid,
                    team.meta(_softmax_team_bwd_kernel, device, phase, CAUSAL=causal, LOG=log), fixed, device),
             (0, 1, 2, 3))
            for phase in _team_phases(device, team.team)))
    cfg = config_for(N, ys, "softmax_bwd")
    split = split_for(cfg, N, layout.rows, device)
    if split > 1:  # few wide rows: split each row over several programs (two launches)
        span = cdiv(cdiv(N, split), cfg.block_n) * cfg.block_n
        split = cdiv(N, span)
        common = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1))
        stats = Launch(_softmax_bwd_split_stats_kernel, (layout.rows * split,),
                       meta_items(LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                                  **launch_options(_softmax_bwd_split_stats_kernel)),
                       (*common, split, span, N), device)
        out = Launch(_softmax_bwd_split_out_kernel, (layout.rows * split,),
                     meta_items(CAUSAL=causal, LOG=log, BLOCK_N=cfg.block_n, SPLIT_P2=next_power_of_2(split),
                                num_warps=cfg.num_warps, **launch_options(_softmax_bwd_split_out_kernel)),
                     (*common, *layout.args(2), N, sq, float(scale), split, span), device)
        return LaunchPlan(copy, (layout.rows * split, torch.float32, False), ((stats, (0, 1, 3)), (out, (0, 1, 2, 3))))
    meta = meta_items(CAUSAL=causal, LOG=log, BLOCK_N=cfg.block_n, LOOP=cfg.loop, ROWS=cfg.rows,
                      **cfg.loop_options, num_warps=cfg.num_warps, **launch_options(_softmax_bwd_kernel))
    fixed = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1), *layout.args(2), layout.rows, N, sq,
             float(scale))
    return LaunchPlan(copy, None, ((Launch(_softmax_bwd_kernel, (cdiv(layout.rows, cfg.rows),), meta, fixed, device),
                                    (0, 1, 2)),))


_softmax_bwd = torch.library.custom_op(add_op_namespace_prefix("softmax_bwd"), _softmax_bwd_impl, mutates_args=())
"""The registered backward op (compile, dispatch modes); eager calls ``_softmax_bwd_impl`` directly."""


@_softmax_bwd.register_fake
def _(dy, y, dim, scale, causal, log, dx_dtype):
    return torch.empty(y.shape, dtype=dx_dtype, device=y.device)


def _bwd_model(dy: Tensor, y: Tensor, dim: int, scale: float, causal: bool, log: bool) -> Tuple[Tensor]:
    """The backward kernels' dx (module docstring) as fp32 PyTorch ops, differentiable: the double backward's
    model. Causal positions (j > i over the last two dims) get 0, as the kernels' ``_dz``."""
    if log:
        dz = dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    else:
        dz = y * (dy - (y * dy).sum(dim, keepdim=True))
    if causal:
        keep = torch.ones(y.shape[-2], y.shape[-1], dtype=torch.bool, device=y.device).tril()
        dz = torch.where(keep, dz, 0.0)
    return (dz * scale,)


def _bwd_setup_context(ctx, inputs, output):
    dy, y, dim, scale, causal, log, _ = inputs
    ctx.save_for_backward(dy, y)
    ctx.args = (dim, scale, causal, log)


def _bwd_backward(ctx, ddx):
    """The gradients of dx with respect to dy and y (a second derivative through softmax / log_softmax; y's flows
    on through the forward to x and the mask): ``_bwd_model`` differentiated in fp32 (``_dispatch.fp32_vjp``)."""
    dy, y = ctx.saved_tensors
    ddy, dyy = fp32_vjp(lambda a, b: _bwd_model(a, b, *ctx.args), (dy, y), (ddx,))
    return ddy, dyy, None, None, None, None, None


_SOFTMAX_BWD_AUTOGRAD = eager_autograd(_softmax_bwd, _softmax_bwd_impl, _bwd_setup_context, _bwd_backward)


def _setup_context(ctx, inputs, output):
    x, mask, dim, scale, causal, log, _ = inputs
    ctx.save_for_backward(output)
    ctx.args = (dim, scale, causal, log)
    ctx.x_dtype = x.dtype
    ctx.mask_meta = (mask.shape, mask.dtype) if mask is not None else None


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    dim, scale, causal, log = ctx.args
    need_x, need_mask = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx = dmask = None
    if need_mask:
        dz = call_op(_softmax_bwd, _softmax_bwd_impl, dy, y, dim, 1.0, causal, log, torch.float32,
                     autograd=_SOFTMAX_BWD_AUTOGRAD)
        dx = (dz * scale).to(ctx.x_dtype) if need_x else None
        shape, dtype = ctx.mask_meta
        dmask = dz.sum_to_size(shape).to(dtype)
    elif need_x:
        dx = call_op(_softmax_bwd, _softmax_bwd_impl, dy, y, dim, scale, causal, log, ctx.x_dtype,
                     autograd=_SOFTMAX_BWD_AUTOGRAD)
    return dx, dmask, None, None, None, None, None


# the autograd formula, registered, and the same in a torch.autograd.Function for eager training
_SOFTMAX_AUTOGRAD = eager_autograd(_softmax_fwd, _softmax_fwd_impl, _setup_context, _backward)


def _prepare(x, dim, scale, mask, causal):
    check_float_tensor("x", x)
    dim = normalize_dim(dim, x.dim())
    scale = 1.0 if scale is None else check_real("scale", scale)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
        check_dense("mask", mask)
        if mask.dtype == torch.bool:
            raise TypeError("mask must be an additive float mask (0 keeps, -inf drops); for a boolean keep-mask "
                            "pass torch.zeros_like(x).masked_fill(~keep, float('-inf'))")
        check_float_tensor("mask", mask)
        check_same_device("mask", mask, x)
        try:
            shape = torch.broadcast_shapes(mask.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to x's shape {tuple(x.shape)}")
    check_flag("causal", causal)
    if causal and (x.dim() < 2 or dim != x.dim() - 1):
        raise ValueError(f"causal=True masks over the last two dims and needs dim=-1 on a tensor with >= 2 dims; "
                         f"got dim={dim} for x of shape {tuple(x.shape)}")
    return dim, scale


def softmax(x: Tensor, dim: int = -1, *, scale: Optional[float] = None, mask: Optional[Tensor] = None,
            causal: bool = False, torch_order: bool = False) -> Tensor:
    """Softmax over ``dim`` with an optional scale and additive (tensor or causal) mask folded in.

    ``y = softmax(x * scale + mask, dim)``, causal positions (j > i over the last two dims) set to -inf first.

    Args:
        x: fp16/bf16/fp32 of any shape and strides (a 0-d tensor is one row of one).
        dim: the reduced dim; any dim (not the last: read through its stride, no copy; with dims after it, in
            tiles along them, ``_inner``, a long one split over programs where the tiles alone are too few).
        scale: Python float multiplying x (default 1); a tensor is refused (it would need a host sync).
        mask: additive float mask broadcastable to x (0 keeps, -inf drops; any of the three dtypes, read in
            fp32); its gradient is computed when it requires grad. Boolean masks are refused.
        causal: mask j > i over the last two dims (top-left aligned, SDPA's is_causal); needs dim=-1.
        torch_order: add the exponentials in the order of torch's CUDA kernels and take ``exp`` from the
            vendor math library, so that the output equals ``torch.softmax(x, dim)`` bit for bit on CUDA
            (``_torch_order``; the ``Softmax`` layer sets it). Applies to rows whose dims after ``dim`` all
            have size 1; other dims take the fast kernels. Not with scale, mask or causal. The
            backward is the package's own (not torch's order). Slower than the default path (each
            row read three times, ``expf`` twice): 0.47-2.3x torch's own kernel on an H200.

    Returns:
        Tensor of x's shape and dtype, contiguous. Saves the output for backward.

    Raises:
        TypeError: a non-tensor x, unsupported dtype, a sparse or nested tensor, a boolean or non-tensor mask,
            a dim that is not an int, a scale that is not a Python number (an int is taken as a float), a
            non-bool causal or torch_order.
        ValueError: a mask that does not broadcast to x or is on another device, a non-finite scale, causal
            with dim != -1 (or x of fewer than 2 dims), torch_order with scale, mask or causal.
        IndexError: dim out of range. RuntimeError: CPU tensor without TRITON_INTERPRET=1.

    Precision: scale, mask add, max, exp and sum in fp32; one rounding to x.dtype at the store.
    A fully masked row is NaN (as torch). Performance: x is read once; a row of 64 KiB or more (backward: 128
    KiB) is split over a persistent team of programs on a GPU (the same bits on every run), and the forward's
    fp32 rows of 32-64 KiB (no mask, not causal, many rows) go one row per persistent program; otherwise, and on
    the CPU, a row wider than one block is read twice (online max/sum, then output). On NVIDIA the exps flush
    results below 2^-126 to 0 (``ex2.approx.ftz``, see the module docstring).
    Source: matches ``torch.softmax(x * scale + mask, dim)``.
    """
    return _forward(x, mask, dim, scale, causal, False, torch_order)


def log_softmax(x: Tensor, dim: int = -1, *, scale: Optional[float] = None, mask: Optional[Tensor] = None,
                causal: bool = False) -> Tensor:
    """Log-softmax over ``dim``: ``(z - max z) - log(sum exp(z - max z))`` with ``z = x * scale + mask``.

    Args, Returns, Raises, Precision: as :func:`softmax` (masked positions give -inf; a fully masked
    row NaN, as torch). Backward: ``dx = scale * (dy - exp(y) * sum(dy))``.
    Source: matches ``torch.log_softmax(x * scale + mask, dim)``.
    """
    return _forward(x, mask, dim, scale, causal, True, False)


def _forward(x, mask, dim, scale, causal: bool, log: bool, torch_order) -> Tensor:
    """softmax / log_softmax after their checks. Plain eager inference checks a call signature once (host time
    of small calls): only Python ints, floats and bools, so that no other type (a tensor, a bool dim) can equal
    a checked value."""
    if (inference((x, mask)) and type(dim) is int and (scale is None or type(scale) is float)
            and type(causal) is bool and type(torch_order) is bool):
        try:
            key = (x.shape, x.stride(), x.dtype, x.device,
                   mask if mask is None else (mask.shape, mask.stride(), mask.dtype, mask.device),
                   dim, scale, causal, log, torch_order)
        except RuntimeError:  # a sparse or nested tensor (no strides; a sparse mask has a shape, hence its strides
            pass  # in the key): the checks below name it
        else:
            checked = _CHECKED.get(key)
            if checked is None:
                checked = _CHECKED.add(key, _check_call(x, mask, dim, scale, causal, torch_order))
            return _softmax_fwd_impl(x, mask, *checked, causal, log, torch_order)
    dim, scale = _check_call(x, mask, dim, scale, causal, torch_order)
    return call_op(_softmax_fwd, _softmax_fwd_impl, x, mask, dim, scale, causal, log, torch_order,
                   autograd=_SOFTMAX_AUTOGRAD)


def _check_call(x, mask, dim, scale, causal, torch_order) -> tuple:
    """(dim in [0, x.dim()), scale as a float) of checked arguments; raises as :func:`softmax` documents."""
    dim, scale = _prepare(x, dim, scale, mask, causal)
    check_flag("torch_order", torch_order)
    if torch_order and (scale != 1.0 or mask is not None or causal):
        raise ValueError("torch_order=True follows torch.softmax(x, dim) alone: pass no scale, mask or causal")
    return dim, scale


# a checked call signature of softmax / log_softmax's plain inference -> (dim, scale) (_check_call)
_CHECKED = PlanCache()
