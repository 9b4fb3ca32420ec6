"""Flash attention (forward and backward) in Triton: online softmax, no S x S matrix in memory.

Math (per batch b, query head h, kv head g = h // (Hq / Hkv); everything in fp32):

    s_ij = scale * <q_i, k_j> + mask_ij          (mask: additive float, or boolean keep-mask -> 0 / -inf)
    s_ij = -inf  where causal and j > i          (top-left aligned, as SDPA's ``is_causal``)
    o_i  = sum_j softmax_j(s_i)_j * v_j
    lse_i = log sum_j exp(s_ij)

The forward visits the keys BLOCK_N at a time, keeping a running maximum ``m`` and sum ``l``
(rescaled by ``exp(m_old - m_new)`` when the maximum grows) and the unnormalised output in
registers; exponentials are taken in base 2 with ``log2(e)`` folded into the scale. A row
whose every score is -inf (fully masked) gives an output of 0 (as SDPA's math backend since
torch 2.5) and ``lse = +inf`` internally, so the backward gives it zero gradients.

Backward (FlashAttention-2 scheme), with ``p_ij = exp(s_ij - lse_i)`` recomputed from q, k:

    delta_i = <do_i, o_i>
    dv_j = sum_i p_ij do_i
    ds_ij = p_ij (<do_i, v_j> - delta_i)
    dk_j = scale * sum_i ds_ij q_i          (summed over the query heads of the group for GQA/MQA)
    dq_i = scale * sum_j ds_ij k_j
    dmask = ds (summed to the mask's shape; only when the mask requires grad)

Where one program per (query block, head, batch) would leave most of a GPU idle (decode steps over a KV
cache), the pointer forward splits the keys over several programs per query block, each writing its
unnormalised output, running maximum and sum in fp32, and a second kernel merges them (as flash-decoding;
``_key_splits``, ``_split_combine_kernel``). With GQA, a decode step's program takes the query heads of one kv
head as its rows (``PACK``), so each k/v tile is read once per kv head instead of once per query head.

One kernel computes dk, dv per block of keys and kv head (looping over the group's query
heads: no atomics, deterministic), another dq per block of queries (and ds when needed).

Fused RoPE (``flash_attention_rope``): the forward kernel rotates q as it loads it (fp32, one
rounding, see ``rotary.py``); k arrives rotated by one pass of the rotary kernel (every query
block reads k, so rotating it once is cheaper than on every load). The backward recomputes the
rotated q, runs the same backward kernels and applies the rotation's transpose to dq.

Second derivatives are not implemented: a backward through the backward op (``create_graph=True``, then a
gradient of dq, dk or dv) raises naming SDPA's math backend; ``create_graph=True`` alone works.

Layouts: q, k, v are read through their strides as [B, H, S, D] (transformers) or
[B, S, H, D] (diffusers); nothing is copied. Head dims that are not a power of two are
padded in registers (masked loads), up to 256. Offsets along the batch, head and sequence
dims are 64-bit.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from . import flash_sm90, flash_sm90_bwd
from ._device import MAX_GRID_YZ, cdiv, check_dense, check_flag, check_launch_device, is_interpreter, launch_options, next_power_of_2, tma_descriptor_ok
from ._dispatch import call_op, eager_autograd, inference, no_second_derivative
from ._fastlaunch import FixedLaunch, PlanCache, descriptor_template, meta_items, rebase, signature
from ._launch import MAX_HEAD_DIM, BwdConfig, FwdConfig, bwd_config_for, fwd_config_for, padded_head_dim
from ._ops import add_op_namespace_prefix
from ._rounding import round_to
from ._team import sm_count

Tensor = torch.Tensor

LOG2E = 1.4426950408889634
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# mask kinds (constexpr MASK_KIND)
_NO_MASK, _ADD_MASK, _BOOL_MASK = 0, 1, 2


@triton.jit
def _dot(a, b, PREC: tl.constexpr, F32: tl.constexpr):
    """a @ b with fp32 accumulation; F32: operands widened to fp32 first (the interpreter's bf16 dot is unusable)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _dot_acc(a, b, acc, PREC: tl.constexpr, F32: tl.constexpr):
    """acc + a @ b, accumulated inside the matrix instruction (no separate add)."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _mask_base2(add):
    """An additive mask in the base-2 score domain, add * log2(e) in fp32: -inf stays -inf (dropped) and +inf +inf
    (NaN, as in SDPA), a finite value stays finite: an entry beyond FLT_MAX / log2(e) in size, such as a bf16
    finfo.min or an fp32 finfo.max, would otherwise overflow to -inf (dropping a key SDPA weighs) or to +inf (a NaN
    row where SDPA gives that key all the weight)."""
    big = 3.4028234663852886e38
    scaled = tl.minimum(tl.maximum(add * 1.4426950408889634, -big, propagate_nan=tl.PropagateNan.ALL), big,
                        propagate_nan=tl.PropagateNan.ALL)
    return tl.where((add == float("-inf")) | (add == float("inf")), add, scaled)


@triton.jit
def _scores(q, k_t, qk_scale, m_ptrs, row_ok, col_ok, offs_m, offs_n,
            MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, PREC: tl.constexpr, F32: tl.constexpr):
    """Base-2 scores (BLOCK_M, BLOCK_N) of q (M, D) against k_t (D, N): -inf where masked."""
    s = _dot(q, k_t, PREC, F32) * qk_scale
    if MASK_KIND == 1:
        add = tl.load(m_ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        s = s + _mask_base2(add)
    if MASK_KIND == 2:
        keep = tl.load(m_ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0)
        s = tl.where(keep != 0, s, float("-inf"))
    if BOUNDS:
        s = tl.where(col_ok[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
    return s


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_ptr, v_ptr, m_ptr, offs_m, row_ok, lo, hi, Sk, D: tl.constexpr, DV: tl.constexpr,
                sks, skd, svs, svd, smq, smk, qk_scale,
                MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, PREC: tl.constexpr, F32: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Online-softmax update over keys [lo, hi); BOUNDS/CAUSAL: apply the tail and diagonal masks."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    offs_0 = (lo + tl.arange(0, BLOCK_N)).to(tl.int64)
    k_ptrs = k_ptr + offs_0[None, :] * sks + offs_d[:, None].to(tl.int64) * skd
    v_ptrs = v_ptr + offs_0[:, None] * svs + offs_dv[None, :].to(tl.int64) * svd
    m_ptrs = m_ptr + offs_m[:, None].to(tl.int64) * smq + offs_0[None, :] * smk
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        col_ok = offs_n < Sk
        if BOUNDS:
            k_t = tl.load(k_ptrs, mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        elif D == BLOCK_D:
            k_t = tl.load(k_ptrs)
        else:
            k_t = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        s = _scores(q, k_t, qk_scale, m_ptrs, row_ok, col_ok, offs_m, offs_n, MASK_KIND, CAUSAL, BOUNDS, PREC, F32)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MASK_KIND != 0 or CAUSAL or BOUNDS:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # row all -inf so far: p = 0, no NaN
        else:
            m_use = m_new
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if BOUNDS:
            v = tl.load(v_ptrs, mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        elif DV == BLOCK_DV:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        acc = _dot_acc(p.to(v.dtype), v, acc * alpha[:, None], PREC, F32)
        m_i = m_new
        k_ptrs += BLOCK_N * tl.cast(sks, tl.int64)
        v_ptrs += BLOCK_N * tl.cast(svs, tl.int64)
        m_ptrs += BLOCK_N * tl.cast(smk, tl.int64)
    return acc, l_i, m_i


@triton.jit
def _rope_rows(x, x_ptr, c_ptr, s_ptr, offs_m, row_ok, sxs, sxd, scs, scd, sss, ssd,
               D: tl.constexpr, ROPE: tl.constexpr, BLOCK_D: tl.constexpr):
    """x (BLOCK_M, BLOCK_D) rotated: x*cos + sign*x[partner]*sin in fp32, rounded once to x's dtype (see rotary.py)."""
    d = tl.arange(0, BLOCK_D)
    if ROPE == 2:
        p = d ^ 1
        first = (d % 2) == 0
    else:
        HALF: tl.constexpr = D // 2
        p = tl.where(d < HALF, d + HALF, d - HALF)
        first = d < HALF
    ok = row_ok[:, None] & (d < D)[None, :]
    rows = offs_m[:, None].to(tl.int64)
    xp = tl.load(x_ptr + rows * sxs + p[None, :] * sxd, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(c_ptr + rows * scs + d[None, :].to(tl.int64) * scd, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + rows * sss + d[None, :].to(tl.int64) * ssd, mask=ok, other=0.0).to(tl.float32)
    a = x.to(tl.float32) * c
    b = xp * s
    y = tl.where(first[None, :], a - b, a + b)
    return round_to(y, x.dtype).to(x.dtype)


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, M, O, LSE, COS, SIN,
    PART,  # SPLIT: the fp32 partials (o [n_split, rows, DV], then m and l [n_split, rows]); else unused
    split_len, n_split,  # SPLIT: keys per split (a multiple of BLOCK_N), splits per query block
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    smb, smh, smq, smk,
    sob, soh, sos, sod,
    scb, sch, scs, scd,  # cos, broadcast to q's [B, H, S, D] (ROPE only)
    ssb, ssh, sss, ssd,  # sin
    Sq, Sk, GROUP,
    qk_scale,  # scale * log2(e)
    D: tl.constexpr, DV: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, F32: tl.constexpr,
    ROPE: tl.constexpr,  # 0: none; 1: rotate halves; 2: rotate pairs -- applied to q on load (fp32, one rounding)
    SPLIT: tl.constexpr,  # split the keys over n_split programs per query block (_split_combine_kernel merges)
    PACK: tl.constexpr,  # GQA decode: a program's rows are the GROUP query heads of one kv head x the Sq queries
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    # One program per (BLOCK_M queries, query head, batch), or per (BLOCK_M queries, key split, head, batch) when
    # SPLIT. Reads q once, k/v once per program. PACK (no causal mask, no RoPE, a mask shared by the heads): axis 1
    # numbers kv heads and row r of the block is query r % Sq of query head hk * GROUP + r // Sq, so the group's
    # heads share each k/v tile (a decode step reads the cache once per kv head, not once per query head).
    pid_m = tl.program_id(0)
    if SPLIT:
        split = pid_m % n_split
        pid_m = pid_m // n_split
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    if PACK:
        hk = h
        n_heads = tl.num_programs(1).to(tl.int64) * GROUP
        offs_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_r < GROUP * Sq
        head = hk * GROUP + (offs_r // Sq).to(tl.int64)  # per row
        offs_m = offs_r % Sq
    else:
        hk = h // GROUP
        n_heads = tl.num_programs(1).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Sq
        head = h
    k_ptr = K + b * skb + hk * skh
    v_ptr = V + b * svb + hk * svh
    m_ptr = M + b * smb + h * smh  # PACK: smh is 0
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_rows = head * sqh + offs_m.to(tl.int64) * sqs
    q = tl.load(Q + b * sqb + q_rows[:, None] + offs_d[None, :].to(tl.int64) * sqd,
                mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    if ROPE != 0:
        q = _rope_rows(q, Q + b * sqb + h * sqh, COS + b * scb + h * sch, SIN + b * ssb + h * ssh, offs_m, row_ok,
                       sqs, sqd, scs, scd, sss, ssd, D, ROPE, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # keys [0, full): valid for every query of the block (no tail, below the diagonal)
    full = (Sk // BLOCK_N) * BLOCK_N
    hi = Sk
    if CAUSAL:
        q_lo = pid_m * BLOCK_M
        full = tl.minimum(full, ((q_lo + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(Sk, q_lo + BLOCK_M)
    lo = 0
    if SPLIT:  # this program's keys [split * split_len, + split_len): both ranges below cut to them
        lo = split * split_len
        full = tl.maximum(tl.minimum(full, lo + split_len), lo)
        hi = tl.minimum(hi, lo + split_len)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptr, v_ptr, m_ptr, offs_m, row_ok, lo, full, Sk, D, DV,
                                sks, skd, svs, svd, smq, smk, qk_scale,
                                MASK_KIND, False, False, PREC, F32, BLOCK_N, BLOCK_D, BLOCK_DV)
    # keys [full, hi): the diagonal blocks and the tail, masked
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_ptr, v_ptr, m_ptr, offs_m, row_ok, full, hi, Sk, D, DV,
                                sks, skd, svs, svd, smq, smk, qk_scale,
                                MASK_KIND, CAUSAL, True, PREC, F32, BLOCK_N, BLOCK_D, BLOCK_DV)

    rows = (b * n_heads + head) * Sq + offs_m  # numbered as in LSE
    if SPLIT:  # this split's unnormalised output, running maximum and sum
        n_rows = tl.num_programs(2).to(tl.int64) * n_heads * Sq
        at = split * n_rows + rows
        tl.store(PART + at[:, None] * DV + offs_dv[None, :], acc, mask=row_ok[:, None] & (offs_dv < DV)[None, :])
        stats = PART + n_split * n_rows * DV
        tl.store(stats + at, m_i, mask=row_ok)
        tl.store(stats + n_split * n_rows + at, l_i, mask=row_ok)
    else:
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # base 2
        tl.store(LSE + rows, lse, mask=row_ok)
        o_rows = b * sob + head * soh + offs_m.to(tl.int64) * sos
        tl.store(O + o_rows[:, None] + offs_dv[None, :].to(tl.int64) * sod, out.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_dv < DV)[None, :])


@triton.jit
def _split_combine_kernel(PART, O, LSE, n_split, n_rows, H, Sq, sob, soh, sos, sod,
                          DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    """o and lse of one row (numbered as in LSE) from the n_split partials of _attn_fwd_kernel's SPLIT form, BLOCK_S
    splits per load: with M = max_s m_s, l = sum_s l_s 2^(m_s - M), o = sum_s acc_s 2^(m_s - M) / l, lse = M +
    log2 l (base 2); a row with no key anywhere (l = 0) gets o = 0 and lse = +inf, as the unsplit kernel gives it."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < DV
    stats = PART + tl.cast(n_split, tl.int64) * n_rows * DV  # int64: the partials may pass 2^31 elements
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start in range(0, n_split, BLOCK_S):
        ok = start + offs_s < n_split
        at = (start + offs_s).to(tl.int64) * n_rows + row
        m_s = tl.load(stats + at, mask=ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(m_s, axis=0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key so far: every weight below is 0
        alpha = tl.exp2(m - m_use)
        w = tl.exp2(m_s - m_use)
        l = l * alpha + tl.sum(w * tl.load(stats + n_split * n_rows + at, mask=ok, other=0.0), axis=0)
        part = tl.load(PART + at[:, None] * DV + offs_dv[None, :], mask=ok[:, None] & dv_ok[None, :], other=0.0)
        acc = acc * alpha + tl.sum(w[:, None] * part, axis=0)
        m = m_new
    empty = l == 0.0
    out = acc / tl.where(empty, 1.0, l)
    tl.store(LSE + row, tl.where(empty, float("inf"), m + tl.log2(tl.where(empty, 1.0, l))))
    b = row // (H * Sq)
    h = (row // Sq) % H
    q = row % Sq
    tl.store(O + b * sob + h * soh + q * sos + offs_dv * sod, out.to(O.dtype.element_ty), mask=dv_ok)


@triton.jit
def _tma_blocks(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, lo, hi, Sk, qk_scale,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                WS: tl.constexpr):
    """As _fwd_blocks, with k/v tiles loaded by the TMA unit (rows past Sk arrive as zeros).

    The scale is folded into the exponent: ``p = exp2(qk * qk_scale - m)``, one FMA per score (the
    running maximum ``m`` is kept on the scaled scores). WS: ``tl.range(warp_specialize=True)``
    (Triton splits the loop into TMA-producer and MMA/softmax-consumer warps where it can).
    """
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([b, hk, start, 0]).reshape(BLOCK_N, D)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            offs_n = start + tl.arange(0, BLOCK_N)
            keep = (offs_n < Sk)[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
        if MASKED:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_use = m_new
        p = tl.exp2(qk * qk_scale - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        v = desc_v.load([b, hk, start, 0]).reshape(BLOCK_N, D)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tma_kernel(
    desc_q, desc_k, desc_v, desc_o, LSE, Q, COS, SIN,
    sqb, sqh, sqs, sqd,
    scb, sch, scs, scd,
    ssb, ssh, sss, ssd,
    Sq, Sk, GROUP,
    qk_scale,
    D: tl.constexpr, CAUSAL: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr, REVERSE: tl.constexpr,
):
    # The forward of _attn_fwd_kernel for the common case (no mask, D = DV = BLOCK_D, fp16/bf16) on
    # GPUs with a TMA unit (NVIDIA sm90+): q/k/v tiles and the output move through tensor descriptors.
    # REVERSE (causal): the longest query blocks are scheduled first, so the short ones fill the tail.
    if REVERSE:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    if ROPE != 0:
        row_ok = offs_m < Sq
        d = tl.arange(0, D)
        q_ptr = Q + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        q = tl.load(q_ptr + offs_m[:, None].to(tl.int64) * sqs + d[None, :].to(tl.int64) * sqd, mask=row_ok[:, None],
                    other=0.0)
        q = _rope_rows(q, q_ptr, COS + b.to(tl.int64) * scb + h.to(tl.int64) * sch,
                       SIN + b.to(tl.int64) * ssb + h.to(tl.int64) * ssh, offs_m, row_ok,
                       sqs, sqd, scs, scd, sss, ssd, D, ROPE, D)
    else:
        q = desc_q.load([b, h, m0, 0]).reshape(BLOCK_M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    full = (Sk // BLOCK_N) * BLOCK_N
    hi = Sk
    if CAUSAL:
        full = tl.minimum(full, ((m0 + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(Sk, m0 + BLOCK_M)
    acc, l_i, m_i = _tma_blocks(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, 0, full, Sk, qk_scale,
                                False, False, BLOCK_N, D, WS)
    acc, l_i, m_i = _tma_blocks(acc, l_i, m_i, q, desc_k, desc_v, b, hk, offs_m, full, hi, Sk, qk_scale,
                                True, CAUSAL, BLOCK_N, D, False)
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))  # base 2
    tl.store(LSE + (b.to(tl.int64) * tl.num_programs(1) + h) * Sq + offs_m, lse, mask=offs_m < Sq)
    desc_o.store([b, h, m0, 0], out.to(desc_o.dtype).reshape(1, 1, BLOCK_M, D))


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, sob, soh, sos, sod, sdb, sdh, sds, sdd, Sq, DV,
                      BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """delta_i = <do_i, o_i> (fp32), one program per (BLOCK_M rows, head, batch)."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    ok = (offs_m < Sq)[:, None] & (offs_dv < DV)[None, :]
    rows = offs_m[:, None].to(tl.int64)
    cols = offs_dv[None, :].to(tl.int64)
    o = tl.load(O + b * sob + h * soh + rows * sos + cols * sod, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + rows * sds + cols * sdd, mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + (b * tl.num_programs(1) + h) * Sq + offs_m, tl.sum(o * do, axis=1), mask=offs_m < Sq)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_ptr, do_ptr, m_ptr, lse_ptr, delta_ptr, offs_n, col_ok, lo, hi, Sq,
                 sqs, sqd, sds, sdd, smq, smk, qk_scale,
                 D: tl.constexpr, DV: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                 PREC: tl.constexpr, F32: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dk, dv updates from query blocks [lo, hi). Rows past Sq load lse = +inf, so their p is 0."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_0 = lo + tl.arange(0, BLOCK_M)
    q_ptrs = q_ptr + offs_0[None, :].to(tl.int64) * sqs + offs_d[:, None].to(tl.int64) * sqd
    do_ptrs = do_ptr + offs_0[:, None].to(tl.int64) * sds + offs_dv[None, :].to(tl.int64) * sdd
    m_ptrs = m_ptr + offs_0[None, :].to(tl.int64) * smq + offs_n[:, None].to(tl.int64) * smk
    for start in range(lo, hi, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Sq
        q_t = tl.load(q_ptrs, mask=row_ok[None, :] & (offs_d < D)[:, None], other=0.0)
        lse = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
        # scores transposed: (BLOCK_N keys, BLOCK_M queries)
        s_t = _dot(k, q_t, PREC, F32) * qk_scale
        if MASK_KIND == 1:
            add = tl.load(m_ptrs, mask=row_ok[None, :] & col_ok[:, None], other=0.0).to(tl.float32)
            s_t = s_t + _mask_base2(add)
        if MASK_KIND == 2:
            keep = tl.load(m_ptrs, mask=row_ok[None, :] & col_ok[:, None], other=0)
            s_t = tl.where(keep != 0, s_t, float("-inf"))
        if CAUSAL:
            s_t = tl.where(offs_m[None, :] >= offs_n[:, None], s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse[None, :])
        do = tl.load(do_ptrs, mask=row_ok[:, None] & (offs_dv < DV)[None, :], other=0.0)
        dv = _dot_acc(p_t.to(do.dtype), do, dv, PREC, F32)
        dp_t = _dot(v, tl.trans(do), PREC, F32)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _dot_acc(ds_t.to(q_t.dtype), tl.trans(q_t), dk, PREC, F32)
        q_ptrs += BLOCK_M * tl.cast(sqs, tl.int64)
        do_ptrs += BLOCK_M * tl.cast(sds, tl.int64)
        m_ptrs += BLOCK_M * tl.cast(smq, tl.int64)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, M, DO, LSE, DELTA, DK, DV_,
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    smb, smh, smq, smk,
    sdb, sdh, sds, sdd,  # do
    skgb, skgh, skgs, skgd,  # dk
    svgb, svgh, svgs, svgd,  # dv
    H, Sq, Sk, GROUP,
    qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    # One program per (BLOCK_N keys, kv head, batch); loops over the group's query heads and query blocks.
    pid_n = tl.program_id(0)
    hk = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < Sk
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    rows_n = offs_n[:, None].to(tl.int64)
    k = tl.load(K + b * skb + hk * skh + rows_n * sks + offs_d[None, :].to(tl.int64) * skd,
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(V + b * svb + hk * svh + rows_n * svs + offs_dv[None, :].to(tl.int64) * svd,
                mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    # causal: query blocks before `lo` see none of these keys; [lo, mid) cross the diagonal; [mid, Sq) see all
    lo = 0
    mid = 0
    if CAUSAL:
        n0 = pid_n * BLOCK_N
        lo = (n0 // BLOCK_M) * BLOCK_M
        mid = tl.minimum(((n0 + BLOCK_N + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, ((Sq + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
        mid = tl.maximum(mid, lo)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_ptr = Q + b * sqb + h * sqh
        do_ptr = DO + b * sdb + h * sdh
        m_ptr = M + b * smb + h * smh
        row_base = (b * H + h) * Sq
        if CAUSAL:
            dk, dv = _dkdv_blocks(dk, dv, k, v, q_ptr, do_ptr, m_ptr, LSE + row_base, DELTA + row_base, offs_n, col_ok,
                                  lo, mid, Sq, sqs, sqd, sds, sdd, smq, smk, qk_scale, D, DV, MASK_KIND, True,
                                  PREC, F32, BLOCK_M, BLOCK_D, BLOCK_DV)
        dk, dv = _dkdv_blocks(dk, dv, k, v, q_ptr, do_ptr, m_ptr, LSE + row_base, DELTA + row_base, offs_n, col_ok,
                              mid, Sq, Sq, sqs, sqd, sds, sdd, smq, smk, qk_scale, D, DV, MASK_KIND, False,
                              PREC, F32, BLOCK_M, BLOCK_D, BLOCK_DV)
    dk = dk * scale
    tl.store(DK + b * skgb + hk * skgh + rows_n * skgs + offs_d[None, :].to(tl.int64) * skgd,
             dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None] & d_ok[None, :])
    tl.store(DV_ + b * svgb + hk * svgh + rows_n * svgs + offs_dv[None, :].to(tl.int64) * svgd,
             dv.to(DV_.dtype.element_ty),
             mask=col_ok[:, None] & dv_ok[None, :])


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, k_ptr, v_ptr, m_ptr, ds_ptr, offs_m, row_ok, lo, hi, Sk,
               sks, skd, svs, svd, smq, smk, qk_scale,
               D: tl.constexpr, DV: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr,
               PREC: tl.constexpr, F32: tl.constexpr, STORE_DS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """dq update from key blocks [lo, hi). Keys past Sk load k = v = 0: they add nothing to dq."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_0 = (lo + tl.arange(0, BLOCK_N)).to(tl.int64)
    k_ptrs = k_ptr + offs_0[None, :] * sks + offs_d[:, None].to(tl.int64) * skd
    v_ptrs = v_ptr + offs_0[None, :] * svs + offs_dv[:, None].to(tl.int64) * svd
    m_ptrs = m_ptr + offs_m[:, None].to(tl.int64) * smq + offs_0[None, :] * smk
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        col_ok = offs_n < Sk
        k_t = tl.load(k_ptrs, mask=col_ok[None, :] & (offs_d < D)[:, None], other=0.0)
        v_t = tl.load(v_ptrs, mask=col_ok[None, :] & (offs_dv < DV)[:, None], other=0.0)
        s = _scores(q, k_t, qk_scale, m_ptrs, row_ok, col_ok, offs_m, offs_n, MASK_KIND, CAUSAL, BOUNDS, PREC, F32)
        p = tl.exp2(s - lse[:, None])
        dp = _dot(do, v_t, PREC, F32)
        ds = p * (dp - delta[:, None])
        dq = _dot_acc(ds.to(k_t.dtype), tl.trans(k_t), dq, PREC, F32)
        if STORE_DS:
            tl.store(ds_ptr + offs_m[:, None].to(tl.int64) * Sk + offs_n[None, :], ds,
                     mask=row_ok[:, None] & col_ok[None, :])
        k_ptrs += BLOCK_N * tl.cast(sks, tl.int64)
        v_ptrs += BLOCK_N * tl.cast(svs, tl.int64)
        m_ptrs += BLOCK_N * tl.cast(smk, tl.int64)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, M, DO, LSE, DELTA, DQ, DS,
    sqb, sqh, sqs, sqd,
    skb, skh, sks, skd,
    svb, svh, svs, svd,
    smb, smh, smq, smk,
    sdb, sdh, sds, sdd,  # do
    sqgb, sqgh, sqgs, sqgd,  # dq
    H, Sq, Sk, GROUP,
    qk_scale, scale,
    D: tl.constexpr, DV: tl.constexpr,
    MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, F32: tl.constexpr, STORE_DS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    # One program per (BLOCK_M queries, query head, batch); loops over the key blocks.
    pid_m = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < Sq
    d_ok = offs_d < D
    dv_ok = offs_dv < DV
    rows_m = offs_m[:, None].to(tl.int64)
    q = tl.load(Q + b * sqb + h * sqh + rows_m * sqs + offs_d[None, :].to(tl.int64) * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows_m * sds + offs_dv[None, :].to(tl.int64) * sdd,
                 mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    row_base = (b * H + h) * Sq
    lse = tl.load(LSE + row_base + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
    k_ptr = K + b * skb + hk * skh
    v_ptr = V + b * svb + hk * svh
    m_ptr = M + b * smb + h * smh
    ds_ptr = DS + row_base * Sk
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # keys [0, full): no diagonal inside; [full, hi): the diagonal blocks (causal) and the tail
    full = (Sk // BLOCK_N) * BLOCK_N
    hi = Sk
    if CAUSAL:
        m0 = pid_m * BLOCK_M
        full = tl.minimum(full, ((m0 + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(Sk, m0 + BLOCK_M)
    dq = _dq_blocks(dq, q, do, lse, delta, k_ptr, v_ptr, m_ptr, ds_ptr, offs_m, row_ok, 0, full, Sk,
                    sks, skd, svs, svd, smq, smk, qk_scale, D, DV, MASK_KIND, False, False, PREC, F32, STORE_DS,
                    BLOCK_N, BLOCK_D, BLOCK_DV)
    dq = _dq_blocks(dq, q, do, lse, delta, k_ptr, v_ptr, m_ptr, ds_ptr, offs_m, row_ok, full, hi, Sk,
                    sks, skd, svs, svd, smq, smk, qk_scale, D, DV, MASK_KIND, CAUSAL, True, PREC, F32, STORE_DS,
                    BLOCK_N, BLOCK_D, BLOCK_DV)
    dq = dq * scale
    tl.store(DQ + b * sqgb + h * sqgh + rows_m * sqgs + offs_d[None, :].to(tl.int64) * sqgd, dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _dkdv_tma_blocks(dk, dv, k, v, desc_q, desc_do, lse_ptr, delta_ptr, b, h, offs_n, lo, hi, Sq, qk_scale,
                     CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr):
    for start in range(lo, hi, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Sq
        q = desc_q.load([b, h, start, 0]).reshape(BLOCK_M, D)
        lse = tl.load(lse_ptr + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(delta_ptr + offs_m, mask=row_ok, other=0.0)
        s_t = tl.dot(k, tl.trans(q)) * qk_scale
        if CAUSAL:
            s_t = tl.where(offs_m[None, :] >= offs_n[:, None], s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse[None, :])
        do = desc_do.load([b, h, start, 0]).reshape(BLOCK_M, D)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_tma_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, DK, DV_,
                              skgb, skgh, skgs, skgd, svgb, svgh, svgs, svgd,
                              H, Sq, Sk, GROUP, qk_scale, scale,
                              D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # _attn_bwd_dkdv_kernel without a mask, tiles through tensor descriptors (sm90+).
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
    b = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    k = desc_k.load([b, hk, n0, 0]).reshape(BLOCK_N, D)
    v = desc_v.load([b, hk, n0, 0]).reshape(BLOCK_N, D)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    lo = 0
    mid = 0
    if CAUSAL:
        lo = (n0 // BLOCK_M) * BLOCK_M
        mid = tl.minimum(((n0 + BLOCK_N + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, ((Sq + BLOCK_M - 1) // BLOCK_M) * BLOCK_M)
        mid = tl.maximum(mid, lo)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        row_base = (b.to(tl.int64) * H + h) * Sq
        if CAUSAL:
            dk, dv = _dkdv_tma_blocks(dk, dv, k, v, desc_q, desc_do, LSE + row_base, DELTA + row_base, b, h, offs_n,
                                      lo, mid, Sq, qk_scale, True, BLOCK_M, D)
        dk, dv = _dkdv_tma_blocks(dk, dv, k, v, desc_q, desc_do, LSE + row_base, DELTA + row_base, b, h, offs_n,
                                  mid, Sq, Sq, qk_scale, False, BLOCK_M, D)
    d = tl.arange(0, D)
    rows = offs_n[:, None].to(tl.int64)
    ok = (offs_n < Sk)[:, None]
    tl.store(DK + b.to(tl.int64) * skgb + hk.to(tl.int64) * skgh + rows * skgs + d[None, :].to(tl.int64) * skgd,
             (dk * scale).to(DK.dtype.element_ty), mask=ok)
    tl.store(DV_ + b.to(tl.int64) * svgb + hk.to(tl.int64) * svgh + rows * svgs + d[None, :].to(tl.int64) * svgd,
             dv.to(DV_.dtype.element_ty), mask=ok)


@triton.jit
def _dq_tma_blocks(dq, q, do, lse, delta, desc_k, desc_v, b, hk, offs_m, lo, hi, Sk, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    for start in range(lo, hi, BLOCK_N):
        k = desc_k.load([b, hk, start, 0]).reshape(BLOCK_N, D)
        v = desc_v.load([b, hk, start, 0]).reshape(BLOCK_N, D)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            offs_n = start + tl.arange(0, BLOCK_N)
            keep = (offs_n < Sk)[None, :]
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(keep, s, float("-inf"))
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _attn_bwd_dq_tma_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, DQ,
                            sqgb, sqgh, sqgs, sqgd,
                            H, Sq, Sk, GROUP, qk_scale, scale,
                            D: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # _attn_bwd_dq_kernel without a mask, tiles through tensor descriptors (sm90+).
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    row_ok = offs_m < Sq
    q = desc_q.load([b, h, m0, 0]).reshape(BLOCK_M, D)
    do = desc_do.load([b, h, m0, 0]).reshape(BLOCK_M, D)
    row_base = (b.to(tl.int64) * H + h) * Sq
    lse = tl.load(LSE + row_base + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + row_base + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    full = (Sk // BLOCK_N) * BLOCK_N
    hi = Sk
    if CAUSAL:
        full = tl.minimum(full, ((m0 + 1) // BLOCK_N) * BLOCK_N)
        hi = tl.minimum(Sk, m0 + BLOCK_M)
    dq = _dq_tma_blocks(dq, q, do, lse, delta, desc_k, desc_v, b, hk, offs_m, 0, full, Sk, qk_scale,
                        False, False, BLOCK_N, D)
    dq = _dq_tma_blocks(dq, q, do, lse, delta, desc_k, desc_v, b, hk, offs_m, full, hi, Sk, qk_scale,
                        True, CAUSAL, BLOCK_N, D)
    d = tl.arange(0, D)
    tl.store(DQ + b.to(tl.int64) * sqgb + h.to(tl.int64) * sqgh + offs_m[:, None].to(tl.int64) * sqgs
             + d[None, :].to(tl.int64) * sqgd,
             (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


# ----------------------------------------------------------------------------- host side

def _bhsd(t: Tensor, bshd: bool) -> Tensor:
    """A [B, H, S, D] view of ``t`` (no copy)."""
    return t.transpose(1, 2) if bshd else t


def _bhsd_shape(t: Tensor, bshd: bool) -> Tuple[int, int, int, int]:
    """(B, H, S, D) of ``t`` in its layout, without making a view (host time)."""
    B, X, Y, D = t.shape
    return (B, Y, X, D) if bshd else (B, X, Y, D)


def _empty_layout(B: int, H: int, S: int, D: int, like: Tensor, bshd: bool) -> Tensor:
    """A new contiguous tensor of like's dtype and device, [B, S, H, D] if ``bshd`` else [B, H, S, D]. The plans
    take it as it is (their launches read its address; strides come from the view ``_bhsd`` gives at plan build)."""
    return torch.empty((B, S, H, D) if bshd else (B, H, S, D), dtype=like.dtype, device=like.device)


def _mask_strides(mask: Optional[Tensor], B: int, H: int, Sq: int, Sk: int):
    """(strides of mask expanded to [B, H, Sq, Sk], 0 where broadcast; the kind): the mask's own memory is read
    through these strides."""
    if mask is None:
        return (0, 0, 0, 0), _NO_MASK
    m = mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    m = m.expand(B, H, Sq, Sk)
    return tuple(m.stride(i) if m.shape[i] > 1 else 0 for i in range(4)), (_BOOL_MASK if mask.dtype == torch.bool
                                                                           else _ADD_MASK)


def _as4(t: Tensor) -> Tensor:
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _bcast_strides(t: Tensor) -> Tuple[int, int, int, int]:
    return tuple(t.stride(i) if t.shape[i] > 1 else 0 for i in range(4))


def _prec(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


# The tensor-descriptor (TMA) kernels: used by default where they apply (see _tma_eligible: sm90+, fp16/bf16,
# no mask, d = 64 or 128, aligned strides); FORCE_TMA makes the tests run them under the interpreter too.
FORCE_TMA = False
# The TMA forward runs without the fused RoPE (measured slower with it on 2026-11-30), with tiles per head dim.
# H200, bf16, session 20 (benchmarks/attention_tile_sweep.py, results/attention_tiles_2026-12-02.txt), TFLOP/s
# against the pointer kernel's (128 x 128 tiles, 8 warps, 3 stages, the default for both head dims then):
# d = 128: 509 / 452 / 512 / 506 / 482 against 491-503 / 429-433 / 505 / 492-496 / 458-472 at S = 4096,
# 4096 causal, 16384, 16384 causal and Flux's 4608 x 24 heads; d = 64: 431 against 334 at SD3.5's 2 x 38 x 4429,
# 383 against 309 at S = 4096 causal (the 64 x 64 tiles: 416 / 390).
TMA_FWD = True
# The warp-specialised Gluon forward of flash_sm90.py where it applies (compute capability 9.0, no mask, d = 64 or
# 128; with the fused RoPE, q is rotated by one pass first). H200, bf16, session 25's two harness runs, TFLOP/s at
# d = 128, S = 4096 / 16384: 584-640 / 613-632 non-causal and 531-532 / 597-610 causal against SDPA's (cuDNN)
# 586-599 / 602-613 and 514-524 / 552-575; this file's TMA kernel 486-506 / 432-495 in the same runs.
SM90_FWD = True
TMA_CONFIGS = {128: FwdConfig(128, 128, 8, 3), 64: FwdConfig(64, 128, 4, 3)}
TMA_WS = False  # warp-specialised main loop (tl.range(warp_specialize=True)) in the TMA forward
TMA_REVERSE = True  # causal: longest query blocks first
# the tensor-descriptor backward kernels where they apply (_tma_eligible, no mask gradient), with these tiles:
# H200 (bf16, session 20, benchmarks/attention_tile_sweep.py) d = 128: 421 / 362 / 420 / 375 TFLOP/s against the
# pointer kernels' 386 / 319 / 386 / 349 at S = 4096 / 4096 causal / 16384 / 16384 causal; d = 64: 353 / 294
# against 260 / 250 at SD3.5's 2 x 38 x 4429 and S = 4096 causal
TMA_BWD = True
TMA_BWD_CONFIG = BwdConfig(64, 64, 64, 64, 4, 2)
# The warp-specialised Gluon dQ and dK/dV kernels of flash_sm90_bwd.py where they apply (compute capability 9.0, no
# mask, d = 128; d = 64 keeps the kernels above): see that file for their measurements against those.
SM90_BWD = True
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: the pointer kernel everywhere
    TensorDescriptor = None


@functools.lru_cache(maxsize=64)
def _has_tma(device: torch.device) -> bool:
    return (device.type == "cuda" and torch.version.hip is None and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device)[0] >= 9)


def _tma_eligible(qv: Tensor, kv: Tensor, vv: Tensor, mask, interp: bool) -> bool:
    if TensorDescriptor is None or mask is not None or qv.dtype not in (torch.float16, torch.bfloat16):
        return False
    if FORCE_TMA:
        return True
    if interp or not _has_tma(qv.device):
        return False
    D = qv.shape[3]
    return (D in TMA_CONFIGS and vv.shape[3] == D and qv.shape[2] >= TMA_CONFIGS[D].block_m
            and tma_descriptor_ok(qv) and tma_descriptor_ok(kv) and tma_descriptor_ok(vv))


def _descriptor_template(t: Tensor, block_rows: int):
    """A host tensor descriptor of all of the [B, H, S, D] view ``t`` with [1, 1, block_rows, D] tiles, keeping no
    tensor: a call's own is this rebased on its tensor (``rebase``)."""
    return descriptor_template(TensorDescriptor, t, [1, 1, block_rows, t.shape[3]])


def _fwd_tma_plan(qv, kv, vv, o, scale, causal, cfg, interp, cs, ss, rope):
    """``(launch, args)`` of the tensor-descriptor forward for these [B, H, S, D] views: ``launch(args(q, k, v, o,
    lse, cos, sin))`` runs one call (cos / sin None without the fused RoPE); the tensors may be those the views were
    taken of, with the views' first elements."""
    B, H, Sq, D = qv.shape
    Hk, Sk = kv.shape[1], kv.shape[2]
    BM, BN = cfg.block_m, cfg.block_n
    q_t, k_t, v_t, o_t = (_descriptor_template(t, bs) for t, bs in ((qv, BM), (kv, BN), (vv, BN), (o, BM)))
    extra = {} if interp else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                               **launch_options(_attn_fwd_tma_kernel, fp_fusion=True)}
    meta = meta_items(D=D, CAUSAL=causal, ROPE=rope, BLOCK_M=BM, BLOCK_N=BN, WS=bool(TMA_WS),
                      REVERSE=TMA_REVERSE and causal, **extra)
    scalars = (*qv.stride(), *cs, *ss, Sq, Sk, H // Hk, scale * LOG2E)

    def args(q, k, v, o, lse, cos, sin):
        return (rebase(q_t, q), rebase(k_t, k), rebase(v_t, v), rebase(o_t, o), lse, q,
                q if cos is None else cos, q if sin is None else sin)

    return FixedLaunch(_attn_fwd_tma_kernel, (cdiv(Sq, BM), H, B), meta, qv.device, scalars), args


def _fwd_plan(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
              o: Tensor, scale: float, causal: bool, bshd: bool, rope: int, cfg: Optional[FwdConfig]):
    """The forward's plan for a call signature (the key in ``_attn_fwd_launch``): picks the kernel (the Gluon kernel of
    ``flash_sm90``, the tensor-descriptor kernel or the pointer kernel) and its tiles, and returns ``run(q, k, v,
    mask, cos, sin, o, lse)``, which launches one call of the signature. ``o`` is the [B, H, Sq, DV] view of the
    output. The plan keeps no tensor of this call."""
    qv, kv, vv = _bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd)
    B, H, Sq, D = qv.shape
    Hk, Sk, DV = kv.shape[1], kv.shape[2], vv.shape[3]
    check_launch_device(q, _attn_fwd_kernel)
    interp = is_interpreter(_attn_fwd_kernel)
    BD, BDV = padded_head_dim(D), padded_head_dim(DV)
    ms, kind = _mask_strides(mask, B, H, Sq, Sk)
    group = H // Hk
    # GQA decode (the pointer kernel's PACK): the group's query heads share one program's tile
    pack = PACK_GQA and group > 1 and not causal and not rope and ms[1] == 0 and Sq * group <= PACK_ROWS
    rows = Sq * group if pack else Sq  # query rows per (kv head if pack, else query head) and batch
    default_cfg = cfg is None
    if cfg is None:
        cfg = fwd_config_for(q, max(BD, BDV), interp, masked=mask is not None)
        if rows < cfg.block_m:  # short queries (decode, small images): no idle rows in the tile
            decode = not interp and rows <= 16 and q.element_size() == 2 and max(BD, BDV) <= 128
            tile = DECODE_TILE if decode else (cfg.block_n, min(cfg.num_warps, 4), cfg.num_stages)
            cfg = FwdConfig(max(16, next_power_of_2(rows)), *tile)
    if rope:
        cv, sv = _bhsd(_as4(cos).expand(q.shape), bshd), _bhsd(_as4(sin).expand(q.shape), bshd)
        cs, ss = _bcast_strides(cv), _bcast_strides(sv)
    else:
        cs = ss = (0, 0, 0, 0)
    if default_cfg and SM90_FWD and not FORCE_TMA and not interp and flash_sm90.eligible(qv, kv, vv, o, mask, scale):
        if not rope:
            launch, args = flash_sm90.plan(qv, kv, vv, o, scale * LOG2E, causal)
            return lambda q, k, v, mask, cos, sin, o, lse: launch(args(q, k, v, o, lse))
        # the Gluon kernel does not rotate on load: q is rotated by one pass, as k was (the layout of the rotated
        # copy follows from q's, so this call's copy gives the plan's)
        from .rotary import _rope_impl

        interleaved = rope == 2
        q_rot = _rope_impl(q, cos, sin, interleaved, True)
        launch, args = flash_sm90.plan(_bhsd(q_rot, bshd), kv, vv, o, scale * LOG2E, causal)
        return lambda q, k, v, mask, cos, sin, o, lse: launch(args(_rope_impl(q, cos, sin, interleaved, True), k, v,
                                                                   o, lse))
    # scale > 0: the TMA forward masks before it scales (a scale of 0 would turn -inf into NaN)
    if default_cfg and (FORCE_TMA or TMA_FWD and not rope) and scale > 0 \
            and _tma_eligible(qv, kv, vv, mask, interp):
        # FORCE_TMA (the tests' switch) skips _tma_eligible's D check: other head dims run the d = 128 tiles
        tma_cfg = FwdConfig(16, 16, 1, 1) if interp else TMA_CONFIGS.get(D, TMA_CONFIGS[128])
        launch, args = _fwd_tma_plan(qv, kv, vv, o, scale, causal, tma_cfg, interp, cs, ss, rope)
        return lambda q, k, v, mask, cos, sin, o, lse: launch(args(q, k, v, o, lse, cos, sin))
    extra = {} if interp else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                               **launch_options(_attn_fwd_kernel, fp_fusion=True)}
    q_blocks = cdiv(rows, cfg.block_m)
    heads = Hk if pack else H
    keys = min(Sk, Sq) if causal else Sk  # causal (top-left): no query sees a key past the last query
    n_split = _key_splits(q_blocks * heads * B, keys, cfg.block_n, q.device, interp)
    split_len = cdiv(cdiv(keys, n_split), cfg.block_n) * cfg.block_n
    n_split = cdiv(keys, split_len) if keys else 1
    meta = meta_items(D=D, DV=DV, MASK_KIND=kind, CAUSAL=causal, PREC=_prec(q.dtype),
                      F32=interp and q.dtype == torch.bfloat16, ROPE=rope, SPLIT=n_split > 1, PACK=pack,
                      BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=BD, BLOCK_DV=BDV, **extra)
    scalars = (split_len, n_split, *qv.stride(), *kv.stride(), *vv.stride(), *ms, *o.stride(), *cs, *ss, Sq, Sk,
               group, scale * LOG2E)
    launch = FixedLaunch(_attn_fwd_kernel, (q_blocks * n_split, heads, B), meta, q.device, scalars)
    combine = None
    if n_split > 1:
        n_rows = B * H * Sq
        combine = FixedLaunch(_split_combine_kernel, (n_rows,),
                              meta_items(DV=DV, BLOCK_S=min(next_power_of_2(n_split), 64), BLOCK_DV=BDV,
                                         **({} if interp else {"num_warps": 4,
                                                               **launch_options(_split_combine_kernel)})), q.device,
                              (n_split, n_rows, H, Sq, *o.stride()))
        part_size = n_split * n_rows * (DV + 2)  # the partial outputs, maxima and sums (fp32)

    def run(q, k, v, mask, cos, sin, o, lse):  # an absent mask / cos / sin / partials: q stands in (never read)
        part = q if combine is None else torch.empty(part_size, dtype=torch.float32, device=q.device)
        launch((q, k, v, q if mask is None else mask, o, lse, q if cos is None else cos, q if sin is None else sin,
                part))
        if combine is not None:
            combine((part, o, lse))

    return run


# Key splits of the pointer forward (see _key_splits); a positive value forces that many (the tests' switch: the
# interpreter never splits on its own)
FORCE_SPLITS = 0
# GQA decode: the pointer forward packs the query heads of a kv head into one program's rows (the kernel's PACK)
# where the group's query rows (heads x queries) number at most PACK_ROWS
PACK_GQA = True
PACK_ROWS = 64
# (BLOCK_N, num_warps, num_stages) of the pointer forward for at most 16 rows per program (decode steps) of fp16 /
# bf16 with padded head dims up to 128: 64-key tiles in 3 stages leave room for two programs per H200 multiprocessor
# (see _key_splits); fp32 or wider heads keep the general tiles (fp32 at d = 256 would need 276 KiB here)
DECODE_TILE = (64, 4, 3)


def _key_splits(programs: int, keys: int, block_n: int, device: torch.device, interp: bool) -> int:
    """How many programs share the keys of one query block in the pointer forward: where one program per (query
    block, head, batch) would leave most multiprocessors idle (decode steps, a few heads), as many splits as fit
    two programs per multiprocessor (``DECODE_TILE``'s residency) in one wave, each at least one key block
    (``_split_combine_kernel`` merges them). Rounded down: 64 programs on 132 multiprocessors take 4 splits (256
    programs, one wave of 264) where 5 would start a second wave of 56."""
    if FORCE_SPLITS:
        return max(1, min(FORCE_SPLITS, cdiv(keys, block_n)))
    if interp or device.type != "cuda":
        return 1
    sms = sm_count(device)
    if programs * 2 > sms:
        return 1
    return max(1, min(cdiv(keys, block_n), 2 * sms // programs))


def _switches() -> tuple:
    """The module's kernel switches (the tests and sweeps set them): part of every plan key."""
    return (FORCE_TMA, TMA_FWD, SM90_FWD, TMA_WS, TMA_REVERSE, TMA_BWD, SM90_BWD, TMA_BWD_CONFIG, FORCE_SPLITS,
            PACK_GQA, PACK_ROWS, DECODE_TILE)


# a call signature -> its plan (_fwd_plan, _bwd_plan): the kernel, tiles, grid, scalars and descriptor templates.
# The tile tables (TMA_CONFIGS, flash_sm90.CONFIGS, flash_sm90_bwd's) are read when a plan is built: a sweep that
# changes them clears these.
_FWD_PLANS = PlanCache()
_BWD_PLANS = PlanCache()


def _attn_fwd_launch(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, causal: bool,
                     bshd: bool, out_bshd: bool, cfg: Optional[FwdConfig] = None, cos: Optional[Tensor] = None,
                     sin: Optional[Tensor] = None, rope: int = 0, signatures: Optional[tuple] = None
                     ) -> Tuple[Tensor, Tensor]:
    """(o, lse): the output in ``out_bshd``'s layout and the base-2 log-sum-exp (fp32 [B, H, Sq]). Each call
    signature picks its kernel once (``_fwd_plan``); output buffers are new allocations, which start on 16 bytes.
    ``signatures``: q's, k's, v's and mask's ``signature()`` where the caller has them."""
    B, H, Sq, _ = _bhsd_shape(q, bshd)
    o = _empty_layout(B, H, Sq, v.shape[3], q, out_bshd)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if signatures is None:
        signatures = signature(q), signature(k), signature(v), signature(mask)
    key = (*signatures, *((signature(cos), signature(sin)) if rope else ()), scale, causal, bshd, out_bshd, rope, cfg,
           _switches())
    plan = _FWD_PLANS.get(key)
    if plan is None:
        plan = _FWD_PLANS.add(key, _fwd_plan(q, k, v, mask, cos, sin, _bhsd(o, out_bshd), scale, causal, bshd, rope,
                                             cfg))
    plan(q, k, v, mask, cos, sin, o, lse)
    return o, lse


def _bwd_plan(do: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], o: Tensor, grads, scale: float,
              causal: bool, bshd: bool, out_bshd: bool, need_dmask: bool, cfg: Optional[BwdConfig],
              tma_bwd: Optional[bool]):
    """The backward's plan for this call signature: the delta kernel, then the Gluon kernels of ``flash_sm90_bwd``,
    the tensor-descriptor kernels or the pointer kernels; returns ``run(do, q, k, v, mask, o, lse, delta, dq, dk, dv,
    ds)``, which launches one call. ``grads`` = (dq, dk, dv) as [B, H, S, D] views. The plan keeps no tensor."""
    qv, kv, vv = _bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd)
    ov, dov = _bhsd(o, out_bshd), _bhsd(do, out_bshd)
    dq, dk, dv = grads
    B, H, Sq, D = qv.shape
    Hk, Sk, DV = kv.shape[1], kv.shape[2], vv.shape[3]
    check_launch_device(q, _attn_bwd_dq_kernel)
    interp = is_interpreter(_attn_bwd_dq_kernel)
    BD, BDV = padded_head_dim(D), padded_head_dim(DV)
    default_cfg = cfg is None
    cfg = cfg or bwd_config_for(q, max(BD, BDV), interp)
    ms, kind = _mask_strides(mask, B, H, Sq, Sk)
    extra = {} if interp else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                               **launch_options(_attn_bwd_dkdv_kernel, fp_fusion=True)}
    extra2 = {} if interp else {**cfg.dq_launch, **launch_options(_attn_bwd_dq_kernel, fp_fusion=True)}
    block_delta = 16 if interp else 64
    delta_launch = FixedLaunch(
        _bwd_delta_kernel, (cdiv(Sq, block_delta), H, B),
        meta_items(BLOCK_M=block_delta, BLOCK_DV=BDV,
                   **({} if interp else {"num_warps": 4, **launch_options(_bwd_delta_kernel, fp_fusion=True)})),
        q.device, (*ov.stride(), *dov.stride(), Sq, DV))

    def with_delta(grads_run):
        def run(do, q, k, v, mask, o, lse, delta, dq, dk, dv, ds):
            delta_launch((o, do, delta))
            grads_run(do, q, k, v, mask, lse, delta, dq, dk, dv, ds)
        return run

    if (TMA_BWD if tma_bwd is None else tma_bwd) and not need_dmask and _tma_eligible(qv, kv, vv, mask, interp) \
            and tma_descriptor_ok(dov) and D == DV and D == BD:
        if default_cfg and SM90_BWD and not FORCE_TMA and not interp \
                and flash_sm90_bwd.eligible(qv, kv, vv, dov, grads, mask):
            sm90 = flash_sm90_bwd.plan(qv, kv, vv, dov, grads, scale, causal)
            return with_delta(lambda do, q, k, v, mask, lse, delta, dq, dk, dv, ds:
                              sm90(q, k, v, do, lse, delta, dq, dk, dv))
        tcfg = BwdConfig(16, 16, 16, 16, 1, 1) if interp else TMA_BWD_CONFIG if default_cfg else cfg
        t = _descriptor_template
        q1, k1, v1, do1 = t(qv, tcfg.block_m1), t(kv, tcfg.block_n1), t(vv, tcfg.block_n1), t(dov, tcfg.block_m1)
        q2, k2, v2, do2 = t(qv, tcfg.block_m2), t(kv, tcfg.block_n2), t(vv, tcfg.block_n2), t(dov, tcfg.block_m2)
        dkdv = FixedLaunch(_attn_bwd_dkdv_tma_kernel, (cdiv(Sk, tcfg.block_n1), Hk, B),
                           meta_items(D=D, CAUSAL=causal, BLOCK_M=tcfg.block_m1, BLOCK_N=tcfg.block_n1, **extra),
                           q.device, (*dk.stride(), *dv.stride(), H, Sq, Sk, H // Hk, scale * LOG2E, scale))
        dq_launch = FixedLaunch(_attn_bwd_dq_tma_kernel, (cdiv(Sq, tcfg.block_m2), H, B),
                                meta_items(D=D, CAUSAL=causal, BLOCK_M=tcfg.block_m2, BLOCK_N=tcfg.block_n2, **extra2),
                                q.device, (*dq.stride(), H, Sq, Sk, H // Hk, scale * LOG2E, scale))

        def tma_run(do, q, k, v, mask, lse, delta, dq, dk, dv, ds):
            dkdv((rebase(q1, q), rebase(k1, k), rebase(v1, v), rebase(do1, do), lse, delta, dk, dv))
            dq_launch((rebase(q2, q), rebase(k2, k), rebase(v2, v), rebase(do2, do), lse, delta, dq))

        return with_delta(tma_run)
    common = dict(D=D, DV=DV, MASK_KIND=kind, CAUSAL=causal, PREC=_prec(q.dtype),
                  F32=interp and q.dtype == torch.bfloat16, BLOCK_D=BD, BLOCK_DV=BDV)
    inputs = (*qv.stride(), *kv.stride(), *vv.stride(), *ms, *dov.stride())
    dkdv = FixedLaunch(_attn_bwd_dkdv_kernel, (cdiv(Sk, cfg.block_n1), Hk, B),
                       meta_items(BLOCK_M=cfg.block_m1, BLOCK_N=cfg.block_n1, **common, **extra), q.device,
                       (*inputs, *dk.stride(), *dv.stride(), H, Sq, Sk, H // Hk, scale * LOG2E, scale))
    dq_launch = FixedLaunch(_attn_bwd_dq_kernel, (cdiv(Sq, cfg.block_m2), H, B),
                            meta_items(STORE_DS=need_dmask, BLOCK_M=cfg.block_m2, BLOCK_N=cfg.block_n2, **common,
                                       **extra2), q.device,
                            (*inputs, *dq.stride(), H, Sq, Sk, H // Hk, scale * LOG2E, scale))

    def pointer_run(do, q, k, v, mask, lse, delta, dq, dk, dv, ds):  # no mask: q stands in (never read)
        m = q if mask is None else mask
        dkdv((q, k, v, m, do, lse, delta, dk, dv))
        dq_launch((q, k, v, m, do, lse, delta, dq, ds))

    return with_delta(pointer_run)


def _attn_bwd_launch(do: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], o: Tensor, lse: Tensor,
                     scale: float, causal: bool, bshd: bool, out_bshd: bool, need_dmask: bool,
                     cfg: Optional[BwdConfig] = None, tma_bwd: Optional[bool] = None):
    """(dq, dk, dv, ds): gradients in the inputs' layouts, ds (fp32 [B, H, Sq, Sk]) only if ``need_dmask``. Each
    call signature picks its kernels once (``_bwd_plan``)."""
    B, H, Sq, D = _bhsd_shape(q, bshd)
    _, Hk, Sk, _ = _bhsd_shape(k, bshd)
    DV = v.shape[3]
    dq = _empty_layout(B, H, Sq, D, q, bshd)
    dk = _empty_layout(B, Hk, Sk, D, k, bshd)
    dv = _empty_layout(B, Hk, Sk, DV, v, bshd)
    ds = torch.zeros(B, H, Sq, Sk, dtype=torch.float32, device=q.device) if need_dmask else q.new_empty(0)
    if B * H * Sq == 0 or Sk == 0:
        dq.zero_(), dk.zero_(), dv.zero_()
    else:
        delta = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
        key = (signature(do), signature(q), signature(k), signature(v), signature(mask), signature(o),
               signature(lse), scale, causal, bshd, out_bshd, need_dmask, cfg, tma_bwd, _switches())
        plan = _BWD_PLANS.get(key)
        if plan is None:
            grads = _bhsd(dq, bshd), _bhsd(dk, bshd), _bhsd(dv, bshd)
            plan = _BWD_PLANS.add(key, _bwd_plan(do, q, k, v, mask, o, grads, scale, causal, bshd, out_bshd,
                                                 need_dmask, cfg, tma_bwd))
        plan(do, q, k, v, mask, o, lse, delta, dq, dk, dv, ds)
    return dq, dk, dv, ds


def _attn_fwd_impl(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, causal: bool,
                   bshd: bool, out_bshd: bool) -> Tuple[Tensor, Tensor]:
    return _attn_fwd_launch(q, k, v, mask, scale, causal, bshd, out_bshd)


_attn_fwd = torch.library.custom_op(add_op_namespace_prefix("flash_attn_fwd"), _attn_fwd_impl, mutates_args=())
"""The registered forward op (autograd, fake, compile); eager inference calls ``_attn_fwd_impl`` directly."""


def _out_shape(q: Tensor, v: Tensor, bshd: bool, out_bshd: bool):
    B = q.shape[0]
    H, Sq = (q.shape[2], q.shape[1]) if bshd else (q.shape[1], q.shape[2])
    DV = v.shape[3]
    return (B, Sq, H, DV) if out_bshd else (B, H, Sq, DV), (B, H, Sq)


@_attn_fwd.register_fake
def _(q, k, v, mask, scale, causal, bshd, out_bshd):
    oshape, lshape = _out_shape(q, v, bshd, out_bshd)
    return q.new_empty(oshape), q.new_empty(lshape, dtype=torch.float32)


@torch.library.custom_op(add_op_namespace_prefix("flash_attn_bwd"), mutates_args=())
def _attn_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], o: Tensor, lse: Tensor,
              scale: float, causal: bool, bshd: bool, out_bshd: bool, need_dmask: bool
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, ds): gradients in the inputs' layouts; ds (fp32 [B, H, Sq, Sk]) only if need_dmask."""
    return _attn_bwd_launch(do, q, k, v, mask, o, lse, scale, causal, bshd, out_bshd, need_dmask)


@_attn_bwd.register_fake
def _(do, q, k, v, mask, o, lse, scale, causal, bshd, out_bshd, need_dmask):
    if need_dmask:
        B, H, Sq = lse.shape
        Sk = k.shape[1] if bshd else k.shape[2]
        ds = q.new_empty((B, H, Sq, Sk), dtype=torch.float32)
    else:
        ds = q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ds


# a gradient of the gradient raises, at the second backward, so that create_graph=True works wherever it does not
# differentiate attention's backward (a penalty on a gradient that does not flow through dq, dk, dv)
_ATTN_BWD_AUTOGRAD = no_second_derivative(
    _attn_bwd, _attn_bwd_launch,
    "flash_attention: a gradient of the gradient (create_graph=True) is not supported: its backward (also "
    "flash_attention_rope's and the transformers attention function's) has no derivative; for higher-order gradients "
    "use torch.nn.functional.scaled_dot_product_attention with the math backend "
    "(torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH))")


def _setup_context(ctx, inputs, output):
    q, k, v, mask, scale, causal, bshd, out_bshd = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, mask, o, lse)
    ctx.args = (scale, causal, bshd, out_bshd)
    ctx.mask_meta = (mask.shape, mask.dtype) if mask is not None else None
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, dlse):
    q, k, v, mask, o, lse = ctx.saved_tensors
    scale, causal, bshd, out_bshd = ctx.args
    need_dmask = ctx.needs_input_grad[3]
    dq, dk, dv, ds = call_op(_attn_bwd, _attn_bwd_launch, do, q, k, v, mask, o, lse, scale, causal, bshd, out_bshd,
                             need_dmask, autograd=_ATTN_BWD_AUTOGRAD)
    dmask = None
    if need_dmask:
        shape, dtype = ctx.mask_meta
        dmask = ds.sum_to_size(shape).to(dtype)
    return dq, dk, dv, dmask, None, None, None, None


# the autograd formula, registered, and the same in a torch.autograd.Function for eager training
_ATTN_AUTOGRAD = eager_autograd(_attn_fwd, _attn_fwd_impl, _setup_context, _backward)


# ----------------------------------------------------------------------------- public API

def _check_inputs(q, k, v, attn_mask, scale, causal, layout):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({layout.upper()}), got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be torch.float16, torch.bfloat16 or torch.float32, got {t.dtype}")
    device = q.device
    for name, t in (("k", k), ("v", v)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}: all tensors must be on one device")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout must be 'bhsd' ([B, H, S, D], transformers) or 'bshd' ([B, S, H, D], diffusers), "
                         f"got {layout!r}")
    bshd = layout == "bshd"
    B, H, Sq, D = _bhsd_shape(q, bshd)
    Bk, Hk, Sk, Dk = _bhsd_shape(k, bshd)
    Bv, Hv, Sv, Dv = _bhsd_shape(v, bshd)
    if Bk != B or Bv != B:
        raise ValueError(f"q, k and v must share the batch size, got {B}, {Bk}, {Bv}")
    if (Hk, Sk) != (Hv, Sv):
        raise ValueError(f"k and v must have the same heads and sequence length, got k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} ({layout})")
    if (H % Hk if Hk else H):  # no heads at all (H = Hk = 0): an empty result, as SDPA gives
        raise ValueError(f"the query heads ({H}) must be a multiple of the key/value heads ({Hk}) (MHA, GQA, MQA)")
    if Dk != D:
        raise ValueError(f"q and k must have the same head dim, got {D} and {Dk}")
    if max(D, Dv) > MAX_HEAD_DIM or min(D, Dv) < 1:
        raise ValueError(f"head dims must be in [1, {MAX_HEAD_DIM}], got q/k {D}, v {Dv}")
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:  # the launch grids' axes over heads and batch
        raise ValueError(f"the batch ({B}) and the query heads ({H}) may be at most {MAX_GRID_YZ} each (launch grid "
                         "axes): split the batch into calls of at most that many")
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
        check_dense("attn_mask", attn_mask)
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"attn_mask must be boolean (True = attend) or an additive float mask, got {attn_mask.dtype}")
        if attn_mask.device != device:
            raise ValueError(f"attn_mask is on {attn_mask.device} but q is on {device}")
        if attn_mask.dim() > 4:
            raise ValueError(f"attn_mask must have at most 4 dims, got shape {tuple(attn_mask.shape)}")
        try:
            ok = torch.broadcast_shapes(attn_mask.shape, (B, H, Sq, Sk)) == (B, H, Sq, Sk)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                             f"[B, H, Sq, Sk] = {(B, H, Sq, Sk)}")
    check_flag("causal", causal)
    if scale is None:
        return bshd, 1.0 / math.sqrt(D)
    if isinstance(scale, (Tensor, bool)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number (a Python or NumPy float or int) or None, got "
                        f"{type(scale).__name__}")
    try:
        value = float(scale)
    except OverflowError:  # an int beyond the float range
        value = math.inf
    if not -math.inf < value < math.inf:  # NaN, infinite, or a wider float (np.longdouble) beyond fp64
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    return bshd, value


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Optional[Tensor] = None, causal: bool = False,
                    scale: Optional[float] = None, layout: str = "bhsd", out_layout: Optional[str] = None) -> Tensor:
    """Scaled dot-product attention, ``softmax(scale * q k^T + mask) v``, without an S x S matrix in memory.

    Args:
        q: queries, [B, Hq, Sq, D] (``layout="bhsd"``, transformers) or [B, Sq, Hq, D] (``"bshd"``, diffusers);
            fp16, bf16 or fp32, any strides (read in place).
        k: keys, [B, Hk, Sk, D] or [B, Sk, Hk, D] with ``Hq % Hk == 0`` (MHA, GQA, MQA: query head h uses kv
            head ``h // (Hq // Hk)``, as ``repeat_interleave`` / transformers' ``repeat_kv``).
        v: values, k's shape with head dim Dv (may differ from D). D and Dv up to 256; any size (padded
            in registers to a power of two).
        attn_mask: optional mask broadcastable to [B, Hq, Sq, Sk] (in both layouts): boolean (True = attend,
            as SDPA) or additive float (fp16/bf16/fp32, added to the scaled scores in fp32; -inf drops).
            An additive mask that requires grad gets a gradient (costs a [B, Hq, Sq, Sk] fp32 buffer).
        causal: drop key j for query i when j > i (top-left aligned, as SDPA's ``is_causal``).
        scale: softmax scale (default ``1 / sqrt(D)``), a Python float.
        layout: ``"bhsd"`` or ``"bshd"`` for q, k, v (and their gradients).
        out_layout: layout of the output (default: ``layout``); ``"bshd"`` with ``"bhsd"`` inputs writes
            transformers' [B, S, H, D] attention output directly (no transpose copy).

    Returns:
        [B, Hq, Sq, Dv] or [B, Sq, Hq, Dv] in q's dtype, contiguous in ``out_layout``. A query whose every key is
        masked gets 0 (as SDPA's math backend). Differentiable in q, k, v (and a float mask).

    Raises:
        TypeError: non-tensors, a sparse or nested tensor, unsupported dtypes, mixed dtypes, a non-tensor or
            integer mask, a non-bool causal, a scale that is not a real number (Python or NumPy; an int is
            taken as a float; a bool or a tensor is refused).
        ValueError: a NaN or infinite scale, wrong ranks, shapes that do not agree (batch, heads, head dims, kv
            lengths), Hq not a multiple of Hk, a head dim outside [1, 256], a batch or Hq above 65535, tensors
            (mask included) on different devices, a mask of more than 4 dims or that does not broadcast, an
            unknown layout or out_layout.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``; a gradient of the gradient (a backward through
            dq, dk or dv made with ``create_graph=True``: use SDPA's math backend for second derivatives).

    Precision: scores, softmax and output accumulated in fp32; P and dS cast to the input dtype before
    their matmuls (as FlashAttention-2); fp32 inputs use IEEE fp32 dot products. The backward recomputes P from an
    fp32 logsumexp: a query row whose every key carries a huge additive mask (-1e9, finfo.min) gets the forward's
    average of v but inexact gradients for a nonzero upstream gradient, as SDPA's fused kernels (such rows are
    padding queries, whose upstream gradient is normally zero). Additive mask entries are taken in base 2 within
    +-FLT_MAX: two entries beyond +-FLT_MAX / log2(e) (2.36e38) in one row tie where SDPA weighs only the larger.
    Source: Dao, "FlashAttention-2"
    (2023), online softmax of Milakov & Gimelshein (2018); equals ``F.scaled_dot_product_attention``.
    """
    if inference((q, k, v, attn_mask), 3) and (scale is None or type(scale) is float) and type(causal) is bool:
        # plain eager inference: the checks run once per call signature (host time of decode steps). Python
        # floats and bools only, so that no other type (an int, a tensor) can equal a checked value
        try:
            signatures = signature(q), signature(k), signature(v), signature(attn_mask)
            key = (*signatures, scale, causal, layout, out_layout)
            checked = _CHECKED.get(key)
        except (TypeError, RuntimeError):  # an unhashable layout, a sparse or nested tensor: the checks name it
            checked = _check_call(q, k, v, attn_mask, scale, causal, layout, out_layout)
        if checked is None:
            checked = _CHECKED.add(key, _check_call(q, k, v, attn_mask, scale, causal, layout, out_layout))
        return _attn_fwd_launch(q, k, v, attn_mask, *checked, signatures=signatures)[0]
    o, _ = call_op(_attn_fwd, _attn_fwd_impl, q, k, v, attn_mask,
                   *_check_call(q, k, v, attn_mask, scale, causal, layout, out_layout), autograd=_ATTN_AUTOGRAD)
    return o


def _check_call(q, k, v, attn_mask, scale, causal, layout, out_layout) -> Tuple[float, bool, bool, bool]:
    """``flash_attention``'s arguments checked (raising as it documents): (scale, causal, bshd, out_bshd)."""
    bshd, scale = _check_inputs(q, k, v, attn_mask, scale, causal, layout)
    out_layout = layout if out_layout is None else out_layout
    if out_layout not in ("bhsd", "bshd"):
        raise ValueError(f"out_layout must be 'bhsd' or 'bshd', got {out_layout!r}")
    return scale, causal, bshd, out_layout == "bshd"


# a checked call signature of flash_attention's plain inference (tensor signatures, scale, causal, layouts) -> its
# checked arguments (_check_call)
_CHECKED = PlanCache()


# ----------------------------------------------------------------------------- fused RoPE variant

def _attn_rope_fwd_impl(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor],
                        scale: float, causal: bool, bshd: bool, out_bshd: bool, interleaved: bool
                        ) -> Tuple[Tensor, Tensor]:
    return _attn_fwd_launch(q, k, v, mask, scale, causal, bshd, out_bshd, cos=cos, sin=sin,
                            rope=2 if interleaved else 1)


_attn_rope_fwd = torch.library.custom_op(add_op_namespace_prefix("flash_attn_rope_fwd"), _attn_rope_fwd_impl,
                                         mutates_args=())
"""Forward with q rotated on load (k arrives rotated); eager inference calls the implementation directly."""


@_attn_rope_fwd.register_fake
def _(q, k, v, cos, sin, mask, scale, causal, bshd, out_bshd, interleaved):
    oshape, lshape = _out_shape(q, v, bshd, out_bshd)
    return q.new_empty(oshape), q.new_empty(lshape, dtype=torch.float32)


def _setup_rope_context(ctx, inputs, output):
    q, k, v, cos, sin, mask, scale, causal, bshd, out_bshd, interleaved = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, cos, sin, mask, o, lse)
    ctx.args = (scale, causal, bshd, out_bshd, interleaved)
    ctx.mask_meta = (mask.shape, mask.dtype) if mask is not None else None
    ctx.mark_non_differentiable(lse)


def _rope_backward(ctx, do, dlse):
    from .rotary import _ROPE_AUTOGRAD, _ROPE_BWD_AUTOGRAD, _rope, _rope_bwd, _rope_bwd_impl, _rope_impl

    q, k, v, cos, sin, mask, o, lse = ctx.saved_tensors
    scale, causal, bshd, out_bshd, interleaved = ctx.args
    need_dmask = ctx.needs_input_grad[5]
    q_rot = call_op(_rope, _rope_impl, q, cos, sin, interleaved, True, autograd=_ROPE_AUTOGRAD)
    dq_rot, dk, dv, ds = call_op(_attn_bwd, _attn_bwd_launch, do, q_rot, k, v, mask, o, lse, scale, causal, bshd,
                                 out_bshd, need_dmask, autograd=_ATTN_BWD_AUTOGRAD)
    dq = call_op(_rope_bwd, _rope_bwd_impl, dq_rot, cos, sin, interleaved, q.dtype, autograd=_ROPE_BWD_AUTOGRAD)
    dmask = None
    if need_dmask:
        shape, dtype = ctx.mask_meta
        dmask = ds.sum_to_size(shape).to(dtype)
    return dq, dk, dv, None, None, dmask, None, None, None, None, None


_ATTN_ROPE_AUTOGRAD = eager_autograd(_attn_rope_fwd, _attn_rope_fwd_impl, _setup_rope_context,
                                     _rope_backward)


def flash_attention_rope(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False,
                         attn_mask: Optional[Tensor] = None, causal: bool = False, scale: Optional[float] = None,
                         layout: str = "bhsd", out_layout: Optional[str] = None) -> Tensor:
    """``flash_attention(rope(q), rope(k), v)`` with the rotary embedding fused: q is rotated on load.

    ``rope(x) = x * cos + rotate(x) * sin`` in fp32, rounded once to x's dtype (diffusers'
    ``apply_rotary_emb``; :func:`rotary_embedding` with ``fp32_math=True``). q is rotated inside the
    attention kernel as it is loaded (no rotated copy of q is written), except where the forward runs the
    sm90 Gluon kernel (``flash_sm90.py``), which reads a copy rotated by one pass; k, which every query block
    reads, is rotated once by one Triton pass. Backward: the rotation's transpose applied to dq and dk.

    Args:
        q, k, v, attn_mask, causal, scale, layout, out_layout: as :func:`flash_attention` (Sq == Sk).
        cos, sin: broadcastable to q's and k's shapes in ``layout`` (e.g. [S, D] or [B, 1, S, D] for
            [B, H, S, D]; [S, 1, D] or [1, S, 1, D] (Wan) for [B, S, H, D], where a 2-D [S, D] would broadcast
            over the heads, not the positions); fp16/bf16/fp32; no gradient.
        interleaved: rotate pairs (2j, 2j+1) (Flux, Wan) instead of halves (j, j + D/2).

    Returns / Raises: as :func:`flash_attention` and :func:`rotary_embedding` (odd D, cos/sin that do not
    broadcast, Sq != Sk: ValueError).

    Precision: rotated q equals :func:`rotary_embedding`'s to within one rounding of the input dtype (the
    kernel may contract ``x * cos + y * sin`` into one fused multiply-add); the attention as
    :func:`flash_attention`.
    """
    from .rotary import _check as _check_rope, rotary_embedding

    check_flag("interleaved", interleaved)
    bshd, scale = _check_inputs(q, k, v, attn_mask, scale, causal, layout)
    out_layout = layout if out_layout is None else out_layout
    if out_layout not in ("bhsd", "bshd"):
        raise ValueError(f"out_layout must be 'bhsd' or 'bshd', got {out_layout!r}")
    if _bhsd_shape(q, bshd)[2] != _bhsd_shape(k, bshd)[2]:
        raise ValueError("flash_attention_rope needs q and k of the same sequence length (self-attention), got "
                         f"{_bhsd_shape(q, bshd)[2]} and {_bhsd_shape(k, bshd)[2]}")
    _check_rope("q", q, cos, sin)
    _check_rope("k", k, cos, sin)
    k_rot = rotary_embedding(k, cos, sin, interleaved=interleaved, fp32_math=True)
    o, _ = call_op(_attn_rope_fwd, _attn_rope_fwd_impl, q, k_rot, v, cos, sin, attn_mask, scale, causal, bshd,
                   out_layout == "bshd", interleaved, autograd=_ATTN_ROPE_AUTOGRAD)
    return o
