"""Fused cross-entropy (label smoothing, ignore_index, z-loss): loss and gradient in one pass per row.

Math, per row i with logits x (V classes, fp32) and target t:

    lse    = log(sum_j exp(x_j))                        (online over chunks: max m, sum s; lse = m + log s)
    nll    = lse - x_t                                  (computed as (m - x_t) + log s, as torch's log-softmax:
    smooth = lse - mean_j x_j                            no fp32 rounding of lse at large logits; p_j likewise;
                                                        smooth as (m - mean_j x_j) + log s, the mean taken of
                                                        x_j - m: torch's sum of log-probabilities)
    loss_i = (1 - eps) * nll + eps * smooth + z * lse^2 (eps = label_smoothing, z = z_loss)
    loss_i = 0 where t == ignore_index;  NaN where t is outside [0, V) (torch raises; no host sync here)

    reduction "none": loss (target's shape); "sum": sum_i loss_i;
    "mean": sum_i loss_i / #{i: t_i != ignore_index}   (a device division: NaN when every target is
            ignored, as torch; the gradient is then 0, as torch)

The z-loss term is PaLM's auxiliary loss (Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311,
section 5: ``z_loss * log(Z)^2`` with log Z the logsumexp of the row's logits), added per
non-ignored row before the reduction, so "mean" averages it over the same count.
With eps = z = 0 the loss equals ``torch.nn.functional.cross_entropy``; with eps > 0 it equals
torch's ``label_smoothing`` (same mean denominator).

Gradient of loss_i with respect to x_j, written by the same kernel (the softmax is never stored):

    g_ij = p_j * (1 + 2 z lse) - eps / V - (1 - eps) [j == t],   p_j = exp((x_j - m) - log s)
    g_ij = 0 on ignored rows

The forward stores ``w * g`` (w = 1/count for "mean", else 1): the gradient of the reduced loss for
an upstream gradient of 1, which is what ``loss.backward()`` asks for. The backward then only checks,
per row and on the device, whether the upstream gradient differs from the one already applied
(``applied``, 1 after the forward) and rescales those rows in place; with an upstream gradient of 1
it reads 12 bytes per row and returns the stored tensor. Logits + gradient traffic of forward +
backward: read V*x once, write V*g once (no host sync, no full-size elementwise pass).

Under torch.compile, under torch.func transforms (whose second derivatives then raise at the backward op
rather than come out 0 from a stored gradient without a graph) and in eager with ``RECOMPUTE = True``, the
"recompute" mode is used instead:
the forward only reads the logits and keeps each row's logsumexp; the backward
(``cross_entropy_bwd``) recomputes ``g * dloss_i * w`` from the logits in one pass (read V*x,
write V*dx). A traced graph cannot update a saved forward output in place, and the fused gradient
would then cost one more elementwise pass. (Ops traced some other way, e.g. make_fx of the fused
mode, get the out-of-place product ``g * dloss``.)

Rows of up to 16 KiB (``_launch.FWD_MAX_FUSED_BYTES``) are read once, in one block (loss and g from
registers). Wider rows (a 32K, 128K or 256K vocabulary) run the online logsumexp over chunks, then a
gradient pass that reads the row again right away, newest chunks first, with L2 eviction hints so that
part of the re-read hits L2 (on the H200 this beat one block per row at 32–64 KiB rows, where a program
holding the whole row left one program per SM: 432 against 530 µs at 8192 x 32000 bf16). On a GPU,
rows of at least 64 KiB whose starts are 16-byte aligned go to persistent teams of programs instead
(``_team``; the tiers of ``_launch.TEAM_TUNED["cross_entropy"]``: on the H200 3089 GB/s against the looped
2546 at 8192 x 128256, session 15): each keeps a chunk of logits in registers, publishes its chunk's max, sum of exp and (label
smoothing) sum of logits, combines all members' partials in member order and writes its chunk of g;
member 0 writes the loss: one read of the logits and one write of g.
Without a gradient (inference, or logits that do not require grad) the kernel only reads.
"""

from __future__ import annotations

import functools
import math
from typing import Tuple

import torch
import triton
import triton.language as tl

from ._cross_entropy_torch_order import NO_SECOND_DERIVATIVE, cross_entropy_torch_order
from .softmax import _chunk_max_exp, _chunk_start, _max_sumexp_of, _team_load, _team_phases
from ._team import team_gather, team_gather_pair, team_publish, team_publish_pair, team_start
from ._common import (LaunchPlan, check_float_tensor, check_real, check_same_device, meta_like, row_layout,
                      row_start, rows_aligned, run_plan, store_rounded)
from ._dispatch import call_op, eager_autograd, legacy_batched, no_second_derivative
from ._fastlaunch import Launch, PlanCache, launch, meta_items
from ._launch import PLAN_CACHES, config_for, team_for
from ._libm import exp_approx, nvidia_approx
from ._device import check_dense, check_flag, check_launch_device, launch_options
from ._ops import add_op_namespace_prefix

Tensor = torch.Tensor
REDUCTIONS = ("mean", "sum", "none")
# Eager training: False = fused (the forward writes the gradient, read the logits once or twice, write
# the gradient once); True = recompute (the forward only reads, the backward reads again and writes).
RECOMPUTE = False


@triton.jit
def _load_logits(x_ptr, x_row, sxc, offs, mask_n, EVICT: tl.constexpr):
    """One chunk of logits as fp32 (-inf past the row end), with an L2 eviction hint."""
    ptrs = x_ptr + x_row + offs.to(tl.int64) * sxc
    return tl.load(ptrs, mask=mask_n, other=float("-inf"), eviction_policy=EVICT).to(tl.float32)


@triton.jit
def _grad_chunk(x, offs, t, mx, log_s, coef, smoothing, V, w, valid, in_range):
    """w * g for one chunk of logits ``x`` (fp32) given the row's max ``mx`` and ``log_s`` (logsumexp = mx + log_s)
    and z-loss factor. ``p = exp((x - mx) - log_s)``:
    subtracting the max first keeps p as accurate as torch's at any logit magnitude (``exp(x - lse)`` with lse
    rounded to fp32 lost ~|lse| * 2^-24: 28 ulp of the loss at logits near 1000)."""
    return _grad_of_p(tl.exp((x - mx) - log_s), offs, t, coef, smoothing, V, w, valid, in_range)


@triton.jit
def _grad_of_p(p, offs, t, coef, smoothing, V, w, valid, in_range):
    """w * g for one chunk from its probabilities ``p`` (``_grad_chunk``); ``t`` the target column."""
    g = p * coef - smoothing / V - tl.where(offs == t, 1.0 - smoothing, 0.0)
    g = tl.where(in_range, g, float("nan"))
    return tl.where(valid, g * w, 0.0)  # after the scaling: 0 on ignored rows even when w = 1/0


@triton.jit
def _team_grad(e, m_own, mx, log_s, coef, smoothing, V, w, valid, in_range):
    """``_grad_of_p`` for a team member's chunk ``e = exp(x - m_own)`` as if no column were the target, with the row-wide
    factors folded into scalars: ``(w * g = e * a - b, a, bt)``; the target column's value is ``e_t * a - bt``, which
    the kernel writes separately, so that no element needs a compare. NaN through ``w`` for a target outside [0, V),
    a scalar branch (not a select per element) for an ignored row. The team kernel is bound by instruction issue
    (benchmarks/NOTES.md, sessions 12 and 14)."""
    if valid:
        w_in = tl.where(in_range, w, float("nan"))
        # p = e * exp((m_own - mx) - log_s): exp(x - lse) from the chunk's own exp, one exp per element in all
        a = tl.exp(tl.where(m_own == float("-inf"), log_s, m_own - mx) - log_s) * coef * w_in
        b = smoothing / V * w_in
        bt = b + (1.0 - smoothing) * w_in
        g = e * a - b
    else:
        a = 0.0
        bt = 0.0
        g = tl.zeros_like(e)
    return g, a, bt


@triton.jit
def _store_loss(loss_ptr, lse_ptr, applied_ptr, row, mx, log_s, x_t, sum_dev, smoothing, z_loss, V, valid, in_range,
                SMOOTH: tl.constexpr):
    """loss_i of a row (module docstring: smoothing and z-loss terms only when on; 0 on an ignored row, NaN
    for a target outside [0, V)) into ``loss_ptr[row]`` (rounded to its dtype), the row's max and the log of its sum
    of exp into ``lse_ptr[2 row]`` and ``lse_ptr[2 row + 1]``, and 1 (the upstream gradient applied to the stored
    gradient) into ``applied_ptr[row]`` (each if given). The logits' terms are taken from the max first,
    ``(mx - x_t) + log_s``, as torch's log-softmax does (``lse - x_t`` rounded lse to fp32 first: off by
    ~|lse| * 2^-24). ``sum_dev``: the sum over the row of ``x - shift(mx)`` (``_shift``; label smoothing), so that
    the mean's term has the size of the row's spread, not of its offset (a sum of the logits themselves rounded
    ``max - sum / V`` by ~|x| * 2^-24 too)."""
    lse = mx + log_s
    loss = (mx - x_t) + log_s
    # the optional terms only when on, so that eps = 0 never multiplies an infinite mean of x
    if SMOOTH:
        loss = (1.0 - smoothing) * loss + smoothing * (((mx - _shift(mx)) - sum_dev / V) + log_s)
    loss = tl.where(z_loss > 0.0, loss + z_loss * lse * lse, loss)
    loss = tl.where(in_range, loss, float("nan"))
    store_rounded(loss_ptr, row, tl.where(valid, loss, 0.0), True)
    if lse_ptr is not None:  # the backward's p = exp((x - mx) - log_s), as the forward's
        tl.store(lse_ptr + 2 * row, mx)
        tl.store(lse_ptr + 2 * row + 1, log_s)
    if applied_ptr is not None:
        tl.store(applied_ptr + row, 1.0)


@triton.jit
def _shift(m):
    """What the sums of label smoothing subtract from a row's (or chunk's) logits: its max ``m``, or 0 where every
    logit is -inf (then the sum is -inf and the loss +inf or NaN, as torch's)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _grad_factors(z_loss, lse, count_ptr):
    """(coef, w) of ``_grad_chunk`` in the forward: the z-loss factor 1 + 2 z lse, and w = 1/count for
    "mean" (``count_ptr`` given), else 1."""
    coef = tl.where(z_loss > 0.0, 1.0 + 2.0 * z_loss * lse, 1.0)
    w = 1.0
    if count_ptr is not None:
        w = 1.0 / tl.load(count_ptr).to(tl.float32)
    return coef, w


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr,  # logits, any strides
    t_ptr,  # int targets, expanded over the class dim (column stride 0)
    loss_ptr,  # (rows,) per-row loss, contiguous: fp32 (reduced afterwards) or the logits' dtype ("none")
    g_ptr,  # w * gradient of loss_i wrt logits, logits' shape, contiguous; None: no gradient
    lse_ptr,  # (rows, 2) fp32 max and log of the sum of exp per row (for a backward that recomputes the gradient)
    count_ptr,  # int64 number of non-ignored targets (reduction "mean": w = 1 / count); None: w = 1
    applied_ptr,  # (rows,) fp32, set to 1 with a stored gradient (see _scale_grad_kernel); None: not set
    R1, R2,  # sizes of the two inner leading dims (see _common.row_layout)
    sx0, sx1, sx2, sxc,  # elements x_ptr moves per leading index / per class
    st0, st1, st2,  # the same for the target (no class stride)
    sg0, sg1, sg2, sgc,  # the same for g
    V,  # number of classes
    ignore_index,
    smoothing,  # label_smoothing eps in [0, 1]
    z_loss,  # z-loss coefficient >= 0
    SMOOTH: tl.constexpr,  # smoothing > 0: also sum the logits
    BLOCK_N: tl.constexpr,  # classes per chunk
    LOOP: tl.constexpr,  # the row spans several chunks
    REVERSE: tl.constexpr,  # looped: the gradient pass walks the chunks last to first (the most recent in L2)
    EVICT1: tl.constexpr,  # looped: eviction hint of the first pass ("evict_last" keeps the row in L2)
    EVICT2: tl.constexpr,  # looped: eviction hint of the gradient pass's re-read ("evict_first")
    PREFETCH: tl.constexpr,  # looped: load chunk i+1 before working on chunk i
):
    # One program per row. DRAM bytes: read V*x, write V*g + 4 (a looped row is read twice, the
    # second time mostly from L2: the row is re-read right after its first pass, newest chunks first).
    row = tl.program_id(0).to(tl.int64)
    x_row = row_start(row, R1, R2, sx0, sx1, sx2)
    g_row = row_start(row, R1, R2, sg0, sg1, sg2)
    t = tl.load(t_ptr + row_start(row, R1, R2, st0, st1, st2)).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    sum_dev = 0.0
    if not LOOP:
        offs = tl.arange(0, BLOCK_N)
        mask_n = offs < V
        x = _load_logits(x_ptr, x_row, sxc, offs, mask_n, "")
        mx = tl.max(x, axis=0)
        s = tl.sum(tl.exp(x - mx), axis=0)
        if SMOOTH:
            sum_dev = tl.sum(tl.where(mask_n, x - _shift(mx), 0.0), axis=0)
    else:
        mx = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        acc_dev = tl.zeros([BLOCK_N], dtype=tl.float32)  # per lane: sum of x - base over chunks 0 .. i
        shift = 0.0  # the base acc_dev holds sums from
        n_chunks = tl.cdiv(V, BLOCK_N)
        if PREFETCH:  # the next chunk's load is issued before this chunk's reductions
            offs0 = tl.arange(0, BLOCK_N)
            x_next = _load_logits(x_ptr, x_row, sxc, offs0, offs0 < V, EVICT1)
        for i in range(0, n_chunks):
            offs = i * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs < V
            if PREFETCH:
                x = x_next
                offs_next = offs + BLOCK_N
                x_next = _load_logits(x_ptr, x_row, sxc, offs_next, offs_next < V, EVICT1)
            else:
                x = _load_logits(x_ptr, x_row, sxc, offs, mask_n, EVICT1)
            new = tl.maximum(mx, tl.max(x, axis=0))
            base = tl.where(new == float("-inf"), 0.0, new)  # all -inf so far: s stays 0
            s = s * tl.exp(mx - base) + tl.sum(tl.exp(x - base), axis=0)
            mx = new
            if SMOOTH:  # each lane holds i logits (the chunks before the last are full): rebased to the new base
                acc_dev += i * (shift - base) + tl.where(mask_n, x - base, 0.0)
                shift = base
        if SMOOTH:
            sum_dev = tl.sum(acc_dev, axis=0)
    log_s = tl.log(s)
    lse = mx + log_s
    x_t = tl.load(x_ptr + x_row + tl.where(in_range, t, 0) * sxc, mask=valid & in_range, other=0.0).to(tl.float32)
    _store_loss(loss_ptr, lse_ptr, applied_ptr, row, mx, log_s, x_t, sum_dev, smoothing, z_loss, V, valid, in_range,
                SMOOTH)
    if g_ptr is not None:
        coef, w = _grad_factors(z_loss, lse, count_ptr)
        if not LOOP:
            g = _grad_chunk(x, offs, t, mx, log_s, coef, smoothing, V, w, valid, in_range)
            store_rounded(g_ptr + g_row, offs.to(tl.int64) * sgc, g, mask_n)
        else:
            if PREFETCH:
                offs0 = _chunk_start(0, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
                x_next = _load_logits(x_ptr, x_row, sxc, offs0, offs0 < V, EVICT2)
            for i in range(0, n_chunks):
                offs = _chunk_start(i, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
                mask_n = offs < V
                if PREFETCH:
                    x = x_next
                    offs_next = _chunk_start(i + 1, n_chunks, BLOCK_N, REVERSE) + tl.arange(0, BLOCK_N)
                    x_next = _load_logits(x_ptr, x_row, sxc, offs_next, (offs_next >= 0) & (offs_next < V), EVICT2)
                else:
                    x = _load_logits(x_ptr, x_row, sxc, offs, mask_n, EVICT2)
                g = _grad_chunk(x, offs, t, mx, log_s, coef, smoothing, V, w, valid, in_range)
                store_rounded(g_ptr + g_row, offs.to(tl.int64) * sgc, g, mask_n)


@triton.jit
def _cross_entropy_team_fwd_kernel(
    x_ptr, t_ptr, loss_ptr, g_ptr, lse_ptr, count_ptr, applied_ptr,  # as _cross_entropy_fwd_kernel
    ws_ptr,  # int64 (rows, 2, TEAM) zeros: each member's published pair (max, sum of exp), its sum of logits (SMOOTH)
    M,  # number of rows
    R1, R2,
    sx0, sx1, sx2, sxc,
    st0, st1, st2,
    sg0, sg1, sg2, sgc,
    V, ignore_index, smoothing, z_loss,
    TEAM,  # programs per row, BLOCK_N classes each (TEAM * BLOCK_N >= V)
    TEAMS,  # teams in the persistent grid: team t takes rows t, t + TEAMS, ...
    SMOOTH: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TEAM_P2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: publish, wait, write; 1: publish only; 2: wait and write only (interpreter)
    FTZ: tl.constexpr = False,  # NVIDIA (_libm.nvidia_approx): exp(x - m_own) flushes results below 2^-126 to 0
):
    # A wide row over TEAM programs, each with its chunk of logits in registers: they exchange
    # (max, sum of exp, sum of x) and each writes its chunk of the gradient from registers.
    # DRAM: read V*x once, write V*g once. Member 0 writes the row's loss and logsumexp.
    member, row, offs, mask_n = team_start(TEAM, V, BLOCK_N)
    k = tl.arange(0, TEAM_P2)
    xr, _ = _team_load(x_ptr, None, row, R1, R2, sx0, sx1, sx2, sxc, 0, 0, 0, 0, offs, V, M, "")
    while row < M:
        x = tl.where(mask_n, xr.to(tl.float32), float("-inf"))
        m_own, e = _chunk_max_exp(x, FTZ)
        slots = ws_ptr + row * (2 * TEAM)
        if PHASE != 2:
            team_publish_pair(slots + member, m_own, tl.sum(e, axis=0))
            if SMOOTH:
                team_publish(slots + TEAM + member, tl.sum(tl.where(mask_n, x - _shift(m_own), 0.0), axis=0))
        nxt = row + TEAMS
        xr, _ = _team_load(x_ptr, None, nxt, R1, R2, sx0, sx1, sx2, sxc, 0, 0, 0, 0, offs, V, M, "")
        if PHASE != 1:
            x_row = row_start(row, R1, R2, sx0, sx1, sx2)
            t = tl.load(t_ptr + row_start(row, R1, R2, st0, st1, st2)).to(tl.int64)
            valid = t != ignore_index
            in_range = (t >= 0) & (t < V)
            m_k, s_k = team_gather_pair(slots, k, TEAM, float("-inf"), 0.0)  # each member's (max, sum of exp)
            mx, s = _max_sumexp_of(m_k, s_k)
            log_s = tl.log(s)
            lse = mx + log_s  # fixed order: equal in every member
            if member == 0:
                x_t = tl.load(x_ptr + x_row + tl.where(in_range, t, 0) * sxc, mask=valid & in_range,
                              other=0.0).to(tl.float32)
                sum_dev = 0.0
                if SMOOTH:  # each member's sum of x - its own max, rebased on the row's max (terms <= 0)
                    n_k = tl.minimum(tl.maximum(V - k * BLOCK_N, 0), BLOCK_N).to(tl.float32)
                    dev_k = team_gather(slots + TEAM, k, TEAM, 0.0) + n_k * (_shift(m_k) - _shift(mx))
                    sum_dev = tl.sum(tl.where(k < TEAM, dev_k, 0.0), axis=0)
                _store_loss(loss_ptr, lse_ptr, applied_ptr, row, mx, log_s, x_t, sum_dev, smoothing, z_loss, V,
                            valid, in_range, SMOOTH)
            if g_ptr is not None:
                coef, w = _grad_factors(z_loss, lse, count_ptr)
                g_row = row_start(row, R1, R2, sg0, sg1, sg2)
                g, a, bt = _team_grad(e, m_own, mx, log_s, coef, smoothing, V, w, valid, in_range)
                store_rounded(g_ptr + g_row, offs.to(tl.int64) * sgc, g, mask_n)
                if valid & in_range & (t // BLOCK_N == member):
                    # the target's element, which the chunk's store wrote as a non-target: after a barrier (the
                    # chunk's store came from another thread), e_t * a - bt with e_t as _chunk_max_exp computes it
                    tl.debug_barrier()
                    x_t = tl.load(x_ptr + x_row + t * sxc).to(tl.float32)
                    e_t = exp_approx(x_t - tl.where(m_own == float("-inf"), 0.0, m_own), FTZ)
                    store_rounded(g_ptr + g_row, t * sgc, e_t * a - bt, True)
        row = nxt


@triton.jit
def _scale_grad_kernel(
    g_ptr,  # the stored w * gradient
    out_ptr,  # where the scaled gradient goes: g_ptr (in place) or a fresh tensor of g's layout
    applied_ptr,  # (rows,) fp32: the upstream gradient already multiplied into each row of g (1 after the forward)
    d_ptr,  # upstream gradient of loss_i (the reduced loss's, stride 0, for "mean"/"sum")
    t_ptr,  # targets (ignored rows stay 0, as torch's gradient, whatever the upstream gradient)
    R1, R2,
    sg0, sg1, sg2, sgc,
    sd0, sd1, sd2,
    st0, st1, st2,
    V,
    ignore_index,
    INPLACE: tl.constexpr,  # out_ptr is g_ptr: rows already scaled by their upstream gradient are skipped
    BLOCK_N: tl.constexpr,
):
    # One program per row. In place, a row whose upstream gradient equals the one already applied (1
    # after the forward: loss.backward() of a "mean" or "sum") reads 12 bytes and returns; others read
    # and write the row once. No host sync: the test is on the device, per row.
    row = tl.program_id(0).to(tl.int64)
    d = tl.load(d_ptr + row_start(row, R1, R2, sd0, sd1, sd2)).to(tl.float32)
    a = tl.load(applied_ptr + row)
    if (d != a) or (not INPLACE):
        t = tl.load(t_ptr + row_start(row, R1, R2, st0, st1, st2))
        # IEEE division (Triton's `/` may be approximate on GPUs): d / d is exactly 1, so a later backward
        # with the upstream gradient already applied reproduces the first one's bits; d / 1 = d exactly
        ratio = tl.where(t != ignore_index, tl.math.div_rn(d, a), 0.0)
        g_row = row_start(row, R1, R2, sg0, sg1, sg2)
        for start in range(0, V, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask_n = offs < V
            ptrs = offs.to(tl.int64) * sgc
            g = tl.load(g_ptr + g_row + ptrs, mask=mask_n, other=0.0).to(tl.float32)
            store_rounded(out_ptr + g_row, ptrs, tl.where(t != ignore_index, g * ratio, 0.0), mask_n)
        if INPLACE:
            tl.store(applied_ptr + row, d)


@triton.jit
def _cross_entropy_bwd_kernel(
    x_ptr,  # logits, any strides
    t_ptr,  # targets, expanded over the class dim
    lse_ptr,  # (rows, 2) fp32 max and log of the sum of exp from the forward
    d_ptr,  # upstream gradient of loss_i (stride 0 for a reduced loss)
    count_ptr,  # int64 count of non-ignored targets ("mean"); None: w = 1
    dx_ptr,  # gradient, logits' shape, contiguous
    R1, R2,
    sx0, sx1, sx2, sxc,
    st0, st1, st2,
    sd0, sd1, sd2,
    sdx0, sdx1, sdx2, sdxc,
    V, ignore_index, smoothing, z_loss,
    BLOCK_N: tl.constexpr,
):
    # One program per row, one pass: read V*x (nothing on ignored rows), write V*dx.
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row_start(row, R1, R2, st0, st1, st2)).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    mx = tl.load(lse_ptr + 2 * row)
    log_s = tl.load(lse_ptr + 2 * row + 1)
    lse = mx + log_s
    w = tl.load(d_ptr + row_start(row, R1, R2, sd0, sd1, sd2)).to(tl.float32)
    if count_ptr is not None:
        w = w / tl.load(count_ptr).to(tl.float32)
    coef = tl.where(z_loss > 0.0, 1.0 + 2.0 * z_loss * lse, 1.0)
    x_row = row_start(row, R1, R2, sx0, sx1, sx2)
    dx_row = row_start(row, R1, R2, sdx0, sdx1, sdx2)
    v_read = tl.where(valid, V, 0)  # an ignored row reads nothing
    for start in range(0, V, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask_n = offs < V
        x = _load_logits(x_ptr, x_row, sxc, offs, offs < v_read, "")
        g = _grad_chunk(x, offs, t, mx, log_s, coef, smoothing, V, w, valid, in_range)
        store_rounded(dx_ptr + dx_row, offs.to(tl.int64) * sdxc, g, mask_n)


@triton.jit
def _count_kernel(t_ptr, count_ptr, M, R1, R2, st0, st1, st2, ignore_index, BLOCK: tl.constexpr):
    # One program: the number of the M rows' targets that are not ignore_index (int64), for "mean".
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, M, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        live = rows < M
        t = tl.load(t_ptr + row_start(rows.to(tl.int64), R1, R2, st0, st1, st2), mask=live, other=0)
        acc += (live & (t != ignore_index)).to(tl.int64)
    tl.store(count_ptr, tl.sum(acc, axis=0))


@triton.jit
def _reduce_loss_kernel(rows_ptr, count_ptr, out_ptr, M, BLOCK: tl.constexpr):
    # One program: the M per-row fp32 losses summed in fp32 (a fixed order: the same bits on every run),
    # divided by the count for "mean" (count_ptr given; 0 / 0 = NaN when every target is ignored, as torch),
    # rounded once to out_ptr's dtype.
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, M, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(rows_ptr + offs, mask=offs < M, other=0.0)
    total = tl.sum(acc, axis=0)
    if count_ptr is not None:
        total = tl.math.div_rn(total, tl.load(count_ptr).to(tl.float32))  # IEEE division, as torch's
    store_rounded(out_ptr, 0, total, True)


REDUCE_BLOCK = 1024  # targets / per-row losses per step of the one-program count and loss reductions
# Pointer slots of a forward plan (LaunchPlan picks): the call's pointers, then the workspace.
_LOGITS, _TARGET, _ROWS, _G, _LSE, _W_COUNT, _APPLIED, _COUNT, _LOSS, _WS = range(10)


def _cross_entropy_fwd_impl(
    logits: Tensor, target: Tensor, class_dim: int, ignore_index: int, label_smoothing: float, z_loss: float,
    reduction: str, grad_mode: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Returns (loss, w * g, aux).

    loss: logits' dtype. "mean"/"sum": 0-d, the per-row fp32 losses summed in fp32 by one program (a
    fixed order) and divided by the count in fp32, rounded once; "none": target's shape, each row's loss
    rounded once. ``grad_mode`` 0: no gradient (g and aux empty). 1 (fused): g of logits' shape and dtype,
    the gradient of the reduced loss for an upstream gradient of 1 (w = 1/count for "mean", else 1); aux
    = ``applied``, fp32 (rows,) of ones: the upstream gradient already applied to each row of g (updated
    in place by the backward). 2 (recompute): g empty, aux = fp32 (rows, 2) flat: each row's max and log of its sum
    of exp (their sum is the logsumexp), for a backward that recomputes the gradient from the logits in one pass.
    Launches (one plan per call signature): the count of non-ignored targets ("mean"), the rows, the
    reduction ("mean"/"sum").
    """
    device = logits.device
    reduced = reduction != "none"
    rows = torch.empty(target.shape, dtype=torch.float32 if reduced else logits.dtype, device=device)
    g = torch.empty(logits.shape if grad_mode == 1 else (0,), dtype=logits.dtype, device=device)
    aux = torch.empty(target.numel() * grad_mode, dtype=torch.float32, device=device)  # (rows,) or (rows, 2) flat
    if rows.numel() == 0:  # no row: torch's empty reductions ("mean": 0 / 0), no launch
        return (torch.full((), math.nan if reduction == "mean" else 0.0, dtype=logits.dtype, device=device)
                if reduced else rows), g, aux
    key = (logits.shape, logits.stride(), logits.dtype, device, not logits.data_ptr() & 15, target.stride(),
           target.dtype, class_dim, ignore_index, label_smoothing, z_loss, reduction, grad_mode)
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _FWD_PLANS.add(key, _fwd_plan(logits, target, g, class_dim, ignore_index, label_smoothing, z_loss,
                                             reduction, grad_mode))
    count = torch.empty((), dtype=torch.int64, device=device) if reduction == "mean" else None
    loss = torch.empty((), dtype=logits.dtype, device=device) if reduced else rows
    if plan.copy:  # more than 3 unmergeable leading dims: the one documented copy
        logits, target = logits.contiguous(), target.contiguous()
    run_plan(plan, (logits, target, rows, g if grad_mode == 1 else None, aux if grad_mode == 2 else None,
                    count if grad_mode == 1 else None, aux if grad_mode == 1 else None, count, loss), device)
    return loss, g, aux


_FWD_PLANS = PlanCache()  # launch plans per call signature (LaunchPlan; _launch.retuned clears them)
_SCALE_PLANS = PlanCache()
PLAN_CACHES.extend((_FWD_PLANS, _SCALE_PLANS))


def _fwd_plan(logits, target, g, class_dim, ignore_index, label_smoothing, z_loss, reduction, grad_mode) -> LaunchPlan:
    """The forward's launches for this signature (pointer slots: ``_LOGITS`` ... ``_WS``)."""
    check_launch_device(logits, _cross_entropy_fwd_kernel)
    device = logits.device
    V = logits.shape[class_dim]
    if V == 0:  # torch: no class to pick
        raise ValueError(f"logits have no classes (shape {tuple(logits.shape)})")
    t = target.unsqueeze(class_dim).expand(logits.shape)
    gs = g if grad_mode == 1 else None
    layout = row_layout([logits, t, gs], class_dim)
    copy = layout is None
    if copy:  # the layout of the contiguous copies ("meta" tensors of their strides); settings from the real logits
        xs = meta_like(logits)
        t = meta_like(target).unsqueeze(class_dim).expand(logits.shape)
        layout = row_layout([xs, t, gs], class_dim)
    launches = []
    if reduction == "mean":
        launches.append((Launch(_count_kernel, (1,), _reduce_meta(_count_kernel),
                                (layout.rows, layout.sizes[1], layout.sizes[2], *layout.args(1)[:3], ignore_index),
                                device), (_TARGET, _COUNT)))
    rest = (V, ignore_index, float(label_smoothing), float(z_loss))
    ptrs = (_LOGITS, _TARGET, _ROWS, _G, _LSE, _W_COUNT, _APPLIED)
    team = team_for(V, logits, layout.rows, "cross_entropy",
                    lambda: not copy and rows_aligned(layout, [logits, None, gs]))
    workspace = None
    if team is not None:  # wide rows: persistent teams of programs, the logits read once
        workspace = (2 * layout.rows * team.team, torch.int64, True)
        fixed = (layout.rows, layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1)[:3], *layout.args(2),
                 *rest, team.team, team.teams)
        for phase in _team_phases(device, team.team):
            launches.append((Launch(_cross_entropy_team_fwd_kernel, team.grid,
                                    team.meta(_cross_entropy_team_fwd_kernel, device, phase,
                                              SMOOTH=label_smoothing > 0.0,
                                              FTZ=nvidia_approx(device, _cross_entropy_team_fwd_kernel)),
                                    fixed, device), (*ptrs, _WS)))
    else:  # one program per row (one block, or looped over chunks with a re-read)
        # the training modes (gradient stored, or logsumexp kept for the recompute backward) chunk rows alike, so
        # that both see the same logsumexp bits; inference ("cross_entropy") takes its own setting
        cfg = config_for(V, logits, "cross_entropy_grad" if grad_mode else "cross_entropy")
        meta = meta_items(SMOOTH=label_smoothing > 0.0, BLOCK_N=cfg.block_n, LOOP=cfg.loop, **cfg.loop_options,
                          num_warps=cfg.num_warps, **launch_options(_cross_entropy_fwd_kernel))
        fixed = (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1)[:3], *layout.args(2), *rest)
        launches.append((Launch(_cross_entropy_fwd_kernel, (layout.rows,), meta, fixed, device), ptrs))
    if reduction != "none":
        launches.append((Launch(_reduce_loss_kernel, (1,), _reduce_meta(_reduce_loss_kernel), (layout.rows,), device),
                         (_ROWS, _COUNT, _LOSS)))
    return LaunchPlan(copy, workspace, tuple(launches))


@functools.lru_cache(maxsize=None)
def _reduce_meta(kernel) -> tuple:
    return meta_items(BLOCK=REDUCE_BLOCK, num_warps=4, **launch_options(kernel))


_cross_entropy_fwd = torch.library.custom_op(
    add_op_namespace_prefix("cross_entropy_fwd"), _cross_entropy_fwd_impl, mutates_args=()
)
"""The registered op (autograd, fake, compile); eager inference calls the implementation directly."""


@_cross_entropy_fwd.register_fake
def _(logits, target, class_dim, ignore_index, label_smoothing, z_loss, reduction, grad_mode):
    g = logits.new_empty(logits.shape if grad_mode == 1 else (0,))
    aux = logits.new_empty((target.numel() * grad_mode,), dtype=torch.float32)
    loss = logits.new_empty(target.shape if reduction == "none" else ())
    return loss, g, aux


def _cross_entropy_bwd_impl(logits: Tensor, target: Tensor, lse: Tensor, dloss: Tensor, class_dim: int,
                            ignore_index: int, label_smoothing: float, z_loss: float, reduction: str) -> Tensor:
    """Gradient of the reduced loss wrt the logits for the upstream gradient ``dloss``, recomputed
    from the logits and the forward's logsumexp in one pass (logits' dtype, contiguous)."""
    dx = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    if dx.numel() == 0:
        return dx
    check_launch_device(logits, _cross_entropy_bwd_kernel)
    V = logits.shape[class_dim]
    count = (target != ignore_index).sum() if reduction == "mean" else None
    t = target.unsqueeze(class_dim).expand(logits.shape)
    d = _upstream(dloss, target.dim(), class_dim, logits.shape)
    layout = row_layout([logits, t, d, dx], class_dim)
    if layout is None:
        logits, t, d = logits.contiguous(), t.contiguous(), d.contiguous()
        layout = row_layout([logits, t, d, dx], class_dim)
    cfg = config_for(min(V, 8192), logits)  # bounded chunk: the row is streamed once
    launch(_cross_entropy_bwd_kernel, (layout.rows,),
           (logits, t, lse, d, count, dx, layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1)[:3],
            *layout.args(2)[:3], *layout.args(3), V, ignore_index, float(label_smoothing), float(z_loss)),
           meta_items(BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **launch_options(_cross_entropy_bwd_kernel)),
           logits.device)
    return dx


_cross_entropy_bwd = torch.library.custom_op(
    add_op_namespace_prefix("cross_entropy_bwd"), _cross_entropy_bwd_impl, mutates_args=()
)


@_cross_entropy_bwd.register_fake
def _(logits, target, lse, dloss, class_dim, ignore_index, label_smoothing, z_loss, reduction):
    return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


def _scale_grad_impl(g: Tensor, applied: Tensor, dloss: Tensor, target: Tensor, class_dim: int,
                     ignore_index: int, inplace: bool = True) -> Tensor:
    """The gradient for the upstream gradient ``dloss`` (0-d, or target's shape) from the stored ``g``.

    In place (the first backward through the graph): rows whose ``dloss`` equals ``applied`` (1 after
    the forward) are left untouched, the others are multiplied by ``dloss / applied`` and ``applied``
    is set to ``dloss``; returns ``g``. Out of place (any later backward, e.g. with ``retain_graph``):
    a fresh tensor, so a gradient handed out by an earlier backward is never changed afterwards.
    """
    out = g if inplace else torch.empty_like(g)
    if g.numel() == 0:
        return out
    key = (g.shape, g.stride(), g.dtype, g.device, dloss.shape, dloss.stride(), dloss.dtype, target.stride(),
           target.dtype, class_dim, ignore_index, inplace)
    plan = _SCALE_PLANS.get(key)
    if plan is None:
        plan = _SCALE_PLANS.add(key, _scale_plan(g, dloss, target, class_dim, ignore_index, inplace))
    d, t = dloss, target  # the kernel reads them through the plan's strides (expanded over the classes)
    if plan.copy:
        t = target.unsqueeze(class_dim).expand(g.shape).contiguous()
        d = _upstream(dloss, target.dim(), class_dim, g.shape).contiguous()
    run_plan(plan, (g, out, applied, d, t), g.device)
    return out


def _upstream(dloss: Tensor, target_dims: int, class_dim: int, shape) -> Tensor:
    """The upstream gradient (0-d, or target's shape) as a view of logits' shape (stride 0 over the classes)."""
    d = dloss.reshape(dloss.shape if dloss.dim() else (1,) * target_dims)  # read in fp32 by the kernels
    return d.unsqueeze(class_dim).expand(shape)


def _scale_plan(g, dloss, target, class_dim, ignore_index, inplace) -> LaunchPlan:
    check_launch_device(g, _scale_grad_kernel)
    V = g.shape[class_dim]
    t = target.unsqueeze(class_dim).expand(g.shape)
    d = _upstream(dloss, target.dim(), class_dim, g.shape)
    layout = row_layout([g, d, t], class_dim)
    copy = layout is None
    if copy:  # contiguous copies of d and t ("meta" tensors of their strides)
        d, t = meta_like(d), meta_like(t)
        layout = row_layout([g, d, t], class_dim)
    cfg = config_for(min(V, 8192), g)  # bounded chunk: the loop streams the row once
    run = Launch(_scale_grad_kernel, (layout.rows,),
                 meta_items(INPLACE=inplace, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                            **launch_options(_scale_grad_kernel)),
                 (layout.sizes[1], layout.sizes[2], *layout.args(0), *layout.args(1)[:3], *layout.args(2)[:3], V,
                  ignore_index), g.device)
    return LaunchPlan(copy, None, ((run, (0, 1, 2, 3, 4)),))


def _scaled_grad(g: Tensor, dloss: Tensor, target: Tensor, class_dim: int, ignore_index: int,
                 applied: Tensor) -> Tensor:
    """``g * dloss / applied`` per row, out of place, 0 on ignored rows: the traced (compile) form of the backward,
    also taken for upstream gradients batched by PyTorch's legacy vmap (``applied``: the upstream gradient an
    earlier eager backward multiplied into g, 1 after the forward).

    Under tracing (torch.compile, make_fx) the in-place update of a saved forward output cannot be
    expressed, so the compiled graph gets this elementwise product (inductor fuses it into one kernel:
    it reads g and writes the gradient once more than the eager path when the upstream gradient is 1).
    """
    d = torch.where(target == ignore_index, 0.0, dloss.to(torch.float32) / applied.view(target.shape))
    d = d.unsqueeze(class_dim)
    return (g.to(torch.float32) * d).to(g.dtype)


_CE_BWD_AUTOGRAD = no_second_derivative(_cross_entropy_bwd, _cross_entropy_bwd_impl, NO_SECOND_DERIVATIVE)


def _setup_context(ctx, inputs, output):
    logits, target, class_dim, ignore_index, label_smoothing, z_loss, reduction, grad_mode = inputs
    if grad_mode == 2:  # recompute: keep the logits and the logsumexp
        ctx.save_for_backward(logits, output[2], target)
    else:
        ctx.save_for_backward(output[1], output[2], target)
    ctx.class_dim = class_dim
    ctx.ignore_index = ignore_index
    ctx.grad_mode = grad_mode
    ctx.extra = (label_smoothing, z_loss, reduction)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)  # no logits-sized zeros for the gradient "of" g


def _backward(ctx, dloss, dg, dapplied):
    if ctx.grad_mode == 0:
        raise RuntimeError("cross_entropy: the gradient was not stored (the logits did not require grad "
                           "when the loss was computed)")
    if dloss is None:
        return None, None, None, None, None, None, None, None
    if ctx.grad_mode == 2:
        logits, lse, target = ctx.saved_tensors
        dx = call_op(_cross_entropy_bwd, _cross_entropy_bwd_impl, logits, target, lse, dloss, ctx.class_dim,
                     ctx.ignore_index, *ctx.extra, autograd=_CE_BWD_AUTOGRAD)
        return dx, None, None, None, None, None, None, None
    try:
        g, applied, target = ctx.saved_tensors
    except RuntimeError as e:  # the version check of the saved g: the caller changed the gradient it was handed
        if not getattr(ctx, "used", False):
            raise
        raise RuntimeError("cross_entropy: the gradient handed out by an earlier backward through this graph (the "
                           "stored gradient itself, not a copy) was changed in place (e.g. by a hook or mul_), and "
                           "this later backward (retain_graph=True) needs it; clone the gradient before changing it "
                           "in place") from e
    # g already holds the gradient for dloss = 1; rows with another upstream gradient are scaled in place
    # by the first backward, which hands out g itself; later backwards (retain_graph) write a fresh tensor.
    # Eager launches the kernel directly (no op: it would bump the saved tensors' version counters and a
    # second backward with retain_graph would refuse them, although ``applied`` keeps it correct).
    tracing = (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
               or torch._C._are_functorch_transforms_active()
               or any(type(a) is not torch.Tensor or legacy_batched(a) for a in (g, applied, dloss, target)))
    if tracing:
        return (_scaled_grad(g, dloss, target, ctx.class_dim, ctx.ignore_index, applied),
                None, None, None, None, None, None, None)
    if torch.is_grad_enabled():  # create_graph: the stored g has no graph back to the logits
        raise RuntimeError("cross_entropy: a gradient of the gradient (create_graph=True) is not supported: the "
                           "forward stores the gradient, which has no graph back to the logits; use "
                           "torch.nn.functional.cross_entropy for higher-order gradients")
    first = not getattr(ctx, "used", False)
    ctx.used = True
    # the kernel reads raw memory: an upstream gradient (or target) with the negative bit set is resolved first
    dx = _scale_grad_impl(g, applied, dloss.resolve_neg(), target.resolve_neg(), ctx.class_dim, ctx.ignore_index,
                          inplace=first)
    return dx, None, None, None, None, None, None, None


# the autograd formula, registered, and the same in a torch.autograd.Function for eager training
_CE_AUTOGRAD = eager_autograd(_cross_entropy_fwd, _cross_entropy_fwd_impl, _setup_context, _backward)


def _check(logits, target, ignore_index, reduction, label_smoothing, z_loss):
    check_float_tensor("logits", logits)
    if logits.dim() < 1:
        raise ValueError("logits must have at least one dimension (the classes), got a 0-d tensor")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    check_dense("target", target)
    if target.dtype.is_floating_point:
        raise TypeError(f"target must hold class indices (torch.int64 or torch.int32), got {target.dtype}: "
                        "class-probability targets are not supported")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target must have dtype torch.int64 or torch.int32, got {target.dtype}")
    class_dim = 0 if logits.dim() == 1 else 1
    expected = logits.shape[:class_dim] + logits.shape[class_dim + 1:]
    if target.shape != expected:
        raise ValueError(f"target must have shape {tuple(expected)} for logits of shape {tuple(logits.shape)} "
                         f"(classes in dim {class_dim}), got {tuple(target.shape)}")
    check_same_device("target", target, logits, "logits")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not -(2**63) <= ignore_index < 2**63:  # the kernels compare it with int64 targets (torch: "Overflow")
        raise ValueError(f"ignore_index must fit in int64, got {ignore_index}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    label_smoothing = check_real("label_smoothing", label_smoothing, low=0.0, high=1.0)
    z_loss = check_real("z_loss", z_loss, low=0.0)
    return class_dim, label_smoothing, z_loss


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    torch_order: bool = False,
) -> Tensor:
    """Cross-entropy of class-index targets, fused with its gradient; ``F.cross_entropy`` plus PaLM's z-loss.

    ``loss_i = (1 - eps) (lse_i - x_it) + eps (lse_i - mean_j x_ij) + z_loss * lse_i^2`` (0 where ignored),
    reduced as torch reduces it (see the module docstring for every term).

    Args:
        logits: (C,), (N, C) or (N, C, d1, ...) fp16/bf16/fp32, classes in dim 1 (dim 0 for 1-D), as
            ``F.cross_entropy``; any strides (views such as ``logits[:, :V]``, ``logits[:-1]``, or a
            shifted ``h[:, :-1].transpose(1, 2)`` are read in place).
        target: int64/int32 class indices of logits' shape without the class dim.
        ignore_index: targets equal to it add nothing to the loss or the count.
        reduction: "mean" (over non-ignored targets, on the device), "sum" or "none".
        label_smoothing: eps in [0, 1], torch's definition.
        z_loss: coefficient >= 0 of the per-row ``lse^2`` term (0: off).
        torch_order: compute as torch does, step by step with its roundings and summation orders
            (``_cross_entropy_torch_order``; the ``CrossEntropyLoss`` layer sets it): on CUDA the loss and
            the gradient equal ``F.cross_entropy``'s bit for bit. (C,) or (N, C) logits, without label
            smoothing or z-loss. Costs a second read of the logits in the forward (no fused gradient).

    Returns:
        The loss in logits' dtype: a scalar, or target's shape for "none". When logits require grad, eager
        mode saves the fp32-computed gradient (logits' dtype and shape, already divided by the count for
        "mean"); the backward rescales it in place only where the upstream gradient is not 1. Under
        torch.compile the forward keeps each row's logsumexp and the backward recomputes the gradient.

    Raises:
        TypeError: non-tensor logits or target, a sparse or nested tensor, unsupported dtypes (float
            targets: class probabilities are not supported), an ignore_index that is not an int, a
            label_smoothing or z_loss that is not a Python number, a non-bool torch_order.
        ValueError: 0-d logits, logits with no classes, target shape, devices, an ignore_index outside
            int64, reduction, label_smoothing outside [0, 1], z_loss < 0 or not finite; torch_order with
            label smoothing, z-loss or logits of more than 2 dims.
        RuntimeError: CPU tensor without TRITON_INTERPRET=1; in the backward, a gradient of the gradient
            (``create_graph=True``), which the stored gradient cannot give (under torch.func and in recompute
            mode: at the second backward); in a later backward through the same graph (``retain_graph=True``),
            a gradient handed out by the first one (the stored gradient itself) that was changed in place since.

    Precision: logsumexp, loss and gradient in fp32; per-row losses summed in fp32 by one program (a fixed
    order: the same bits on every run; torch's sum may differ in the last fp32 bits); one rounding
    of the loss to logits' dtype, one of the gradient at the store and, in eager mode, one more where the
    upstream gradient is not 1. An out-of-range target gives NaN (torch raises; that needs a sync). Rows of
    64 KiB or more on NVIDIA (persistent teams): probabilities below 2^-126 in the gradient flush to 0
    (``ex2.approx.ftz``).
    Performance: the forward reads the logits once (a row wider than 16 KiB twice, the second time
    partly from L2) and writes the gradient; with an upstream gradient of 1 the backward touches no
    logits-sized tensor. No
    ``.item()``: CUDA-graph capturable. The first backward hands out the stored gradient itself; a
    later backward through the same graph (``retain_graph=True``) writes a fresh tensor (one more
    rounding when its upstream gradient differs from the first's; NaN where the first one was 0).
    Source: ``torch.nn.functional.cross_entropy``; z-loss from PaLM (arXiv:2204.02311).
    """
    class_dim, label_smoothing, z_loss = _check(logits, target, ignore_index, reduction, label_smoothing, z_loss)
    check_flag("torch_order", torch_order)
    if torch_order:
        if label_smoothing > 0.0 or z_loss > 0.0 or logits.dim() > 2:
            raise ValueError("torch_order=True follows F.cross_entropy for (C,) or (N, C) logits without "
                             f"label_smoothing or z_loss (got logits of {logits.dim()} dims, label_smoothing="
                             f"{label_smoothing}, z_loss={z_loss})")
        return cross_entropy_torch_order(logits, target, ignore_index, reduction)
    grad_mode = 0
    if torch.is_grad_enabled() and logits.requires_grad:
        # fused (the forward writes the gradient) in eager; recompute under torch.compile, where the
        # fused gradient would need one more elementwise pass (see the module docstring), and under torch.func,
        # where the backward op's formula raises for a gradient of the gradient (the fused g has no graph back to
        # the logits: a second derivative would be 0 without a word)
        grad_mode = 2 if (RECOMPUTE or torch.compiler.is_compiling()
                          or torch._C._are_functorch_transforms_active()) else 1
    return call_op(_cross_entropy_fwd, _cross_entropy_fwd_impl, logits, target, class_dim, ignore_index,
                   label_smoothing, z_loss, reduction, grad_mode, autograd=_CE_AUTOGRAD)[0]
