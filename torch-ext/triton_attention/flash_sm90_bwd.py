"""Flash attention backward for Hopper (sm_90), warp-specialised, in Gluon: the dQ and the dK/dV kernels.

The math of ``flash.py``'s backward (FlashAttention-2, Dao 2023, arXiv:2307.08691, algorithm 2, with p recomputed
from the forward's base-2 lse and ``delta = rowsum(do * o)``), in two kernels laid out as ``flash_sm90.py``'s
forward (FlashAttention-3, Shah et al. 2024, arXiv:2407.08608: a one-warp TMA producer feeding a ring of tiles to
two consumer warpgroups that multiply with ``wgmma``):

- **dQ** (``_attn_bwd_dq_sm90_kernel``): a program per 128 query rows; each consumer keeps 64 rows' q and do tiles
  and walks the key blocks: ``s = q k^T`` and ``dp = do v^T`` issued together, ``p = exp2(s * qk_scale - lse)``,
  ``ds = p (dp - delta)``, ``dq += ds k``; block j-1's ``ds k`` is still on the tensor cores when block j's products
  are issued. ``dq * scale`` leaves through the consumer's q tile and the TMA unit.
- **dK/dV** (``_attn_bwd_dkdv_sm90_kernel``): a program per 128 keys of one kv head; each consumer keeps 64 keys'
  k and v tiles and walks the query tiles of every query head of the group (GQA): ``s^T = k q^T``,
  ``p^T``, ``dv += p^T do``, ``dp^T = v do^T``, ``ds^T``, ``dk += ds^T q``. ``dk * scale`` and ``dv`` leave through the
  consumer's k and v tiles.

dq is not fused into the dK/dV kernel (FlashAttention-3 adds each step's ds k into an fp32 buffer with TMA
reduce-adds, which Gluon in Triton 3.6 does not expose): the `tl` form of that fusion (session 26) and a Gluon form
with relaxed atomics (session 27) measured slower than these two kernels (``benchmarks/NOTES.md``). Both kernels are
deterministic. Causal grids run their longest blocks first (``flash_sm90._heavy_first``).

Used by ``flash._attn_bwd_launch`` where ``eligible`` holds; everything else keeps the ``tl`` kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._device import cdiv, launch_options, tma_descriptor_ok
from ._fastlaunch import FixedLaunch, descriptor_template, meta_items, rebase
from ._gluon import shared_layout
from . import flash_sm90
from .flash_sm90 import AVAILABLE, _capability_90

Tensor = torch.Tensor

if AVAILABLE:
    from ._gluon import TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store
    from ._gluon import warpgroup_mma, warpgroup_mma_wait
    from .flash_sm90 import _heavy_first, _kv_ring, _query_program


class Sm90BwdConfig(NamedTuple):
    """One sm_90 backward kernel's setting: ``block_n`` keys per step (dQ) or per consumer (dK/dV), a ring of
    ``stages`` tiles (k/v for dQ, q/do for dK/dV), ``consumer_regs`` registers per thread of the second consumer (the
    first gets what is left of ``maxnreg`` x 12 warps after it and the producer's 24)."""
    block_n: int
    stages: int
    consumer_regs: int
    maxnreg: int = 168


BLOCK_M = 64  # query rows per dQ consumer; query rows per dK/dV step
# H200, bf16, session 26 (results/attention_sm90_bwd_session26_2026-12-03.txt). Each kernel alone, TFLOP/s of its
# own matmuls at d = 128, 4 x 32 x 4096 non-causal / causal and 1 x 32 x 16384 non-causal, against flash.py's TMA
# kernels: dQ 660 / 659 / 678 (64-key blocks, 4 stages; 3 stages 630 / 650 / 647) against 607 / 542 / 614; dK/dV
# 601 / 506 / 601 (240 registers, 2 stages; 232 and 3 stages 581 / 526 / 580) against 569 / 468 / 556. The whole
# backward (2.5x the forward's FLOPs): 400-458 against the TMA pair's 352-425. Keyed by head dim: at d = 64 (SD3.5's
# 2 x 38 x 4429) the same settings gave 337 against the TMA pair's 345, so d = 64 keeps those.
DQ_CONFIGS = {128: Sm90BwdConfig(64, 4, 224)}
DKDV_CONFIGS = {128: Sm90BwdConfig(64, 2, 240)}


if AVAILABLE:

    @gluon.jit
    def _dq_p(s, lse, start, mc, Sk, qk_scale, causal, row_s: gl.constexpr, col_s: gl.constexpr, BM: gl.constexpr,
              BLOCK_N: gl.constexpr):
        """p = exp2(s * qk_scale - lse) of one key block, 0 for keys >= Sk (their zero-filled tiles would give
        exp2(-lse)) and, causal, for keys after the query row; masks only in the blocks that hold such keys."""
        p = gl.exp2(s * qk_scale - lse[:, None])
        if (start + BLOCK_N > Sk) | ((causal != 0) & (start + BLOCK_N > mc + 1)):
            offs_n = start + gl.arange(0, BLOCK_N, layout=col_s)
            offs_m = mc + gl.arange(0, BM, layout=row_s)
            keep = (offs_n < Sk)[None, :] & ((offs_n[None, :] <= offs_m[:, None]) | (causal == 0))
            p = gl.where(keep, p, 0.0)
        return p

    @gluon.jit
    def _dq_consumer(desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale,
                     scale, causal, C: gl.constexpr):
        """Consumer warpgroup C: dq of query rows m0 + 64 C ... of (b, h) over the n key blocks."""
        bar_q, full_k, full_v, empty_k, empty_v = bars
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = k_smem.shape[4]
        BM: gl.constexpr = q_smem.shape[3]
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = desc_dq.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, D, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        mc = m0 + C * BM
        q_buf = q_smem.index(C)
        q2 = q_buf.reshape([BM, D])
        do2 = do_smem.index(C).reshape([BM, D])
        zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
        dq = gl.zeros([BM, D], gl.float32, a_layout)
        offs_m = mc + gl.arange(0, BM, layout=row_s)
        row_base = (b.to(gl.int64) * H + h) * Sq
        lse = gl.load(LSE + row_base + offs_m, mask=offs_m < Sq, other=float("inf"))  # rows >= Sq: p = 0
        delta = gl.load(DELTA + row_base + offs_m, mask=offs_m < Sq, other=0.0)
        mbarrier.wait(bar_q, 0)
        mbarrier.wait(full_k.index(0), 0)
        s_tok = warpgroup_mma(q2, k_smem.index(0).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
        mbarrier.wait(full_v.index(0), 0)
        dp_tok = warpgroup_mma(do2, v_smem.index(0).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        p = _dq_p(s, lse, 0, mc, Sk, qk_scale, causal, row_s, col_s, BM, BLOCK_N)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        mbarrier.arrive(empty_v.index(0), count=1)
        ds16 = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), op_layout)
        dq_tok = warpgroup_mma(ds16, k_smem.index(0).reshape([BLOCK_N, D]), dq, is_async=True)
        for j in range(1, n):
            st = j % STAGES
            stp = (j - 1) % STAGES
            mbarrier.wait(full_k.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q2, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s,
                                  use_acc=False, is_async=True)
            mbarrier.wait(full_v.index(st), (j // STAGES) & 1)
            dp_tok = warpgroup_mma(do2, v_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s,
                                   use_acc=False, is_async=True)
            dq, ds16 = warpgroup_mma_wait(2, deps=[dq_tok, ds16])  # block j-1's ds k is done with k_{j-1}
            mbarrier.arrive(empty_k.index(stp), count=1)
            s = warpgroup_mma_wait(1, deps=[s_tok])
            p = _dq_p(s, lse, j * BLOCK_N, mc, Sk, qk_scale, causal, row_s, col_s, BM, BLOCK_N)
            dp = warpgroup_mma_wait(0, deps=[dp_tok])
            mbarrier.arrive(empty_v.index(st), count=1)
            ds16 = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), op_layout)
            dq_tok = warpgroup_mma(ds16, k_smem.index(st).reshape([BLOCK_N, D]), dq, is_async=True)
        dq, ds16 = warpgroup_mma_wait(0, deps=[dq_tok, ds16])
        mbarrier.arrive(empty_k.index((n - 1) % STAGES), count=1)
        q2.store((dq * scale).to(dtype))  # rows >= Sq are clipped by the store
        fence_async_shared()
        tma_store(desc_dq, [b, h, mc, 0], q_buf)
        tma.store_wait(0)

    @gluon.jit
    def _dq_first(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b, h,
                  hk, m0, n, Sq, Sk, H, qk_scale, scale, causal):
        _dq_consumer(desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale,
                     scale, causal, 0)

    @gluon.jit
    def _dq_second(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b,
                   h, hk, m0, n, Sq, Sk, H, qk_scale, scale, causal):
        _dq_consumer(desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale,
                     scale, causal, 1)

    @gluon.jit
    def _dq_producer(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b,
                     h, hk, m0, n, Sq, Sk, H, qk_scale, scale, causal):
        """One warp: both q and do tiles, then v_j and k_j into ring slot j % STAGES as the consumers free it (v is
        freed first: k also feeds block j's ds k)."""
        bar_q, full_k, full_v, empty_k, empty_v = bars
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = k_smem.shape[4]
        BM: gl.constexpr = q_smem.shape[3]
        mbarrier.expect(bar_q, 4 * BM * D * 2)
        tma_load(desc_q, [b, h, m0, 0], bar_q, q_smem.index(0))  # rows >= Sq arrive as zeros
        tma_load(desc_q, [b, h, m0 + BM, 0], bar_q, q_smem.index(1))
        tma_load(desc_do, [b, h, m0, 0], bar_q, do_smem.index(0))
        tma_load(desc_do, [b, h, m0 + BM, 0], bar_q, do_smem.index(1))
        for j in range(n):
            st = j % STAGES
            phase = ((j // STAGES) & 1) ^ 1  # the first pass over the ring finds every slot free
            mbarrier.wait(empty_v.index(st), phase)
            mbarrier.expect(full_v.index(st), BLOCK_N * D * 2)
            tma_load(desc_v, [b, hk, j * BLOCK_N, 0], full_v.index(st), v_smem.index(st))  # keys >= Sk: zeros
            mbarrier.wait(empty_k.index(st), phase)
            mbarrier.expect(full_k.index(st), BLOCK_N * D * 2)
            tma_load(desc_k, [b, hk, j * BLOCK_N, 0], full_k.index(st), k_smem.index(st))

    @gluon.jit
    def _attn_bwd_dq_sm90_kernel(desc_q, desc_k, desc_v, desc_do, desc_dq, LSE, DELTA, Sq, Sk, GROUP, qk_scale,
                                 scale, D: gl.constexpr, BM: gl.constexpr, BLOCK_N: gl.constexpr,
                                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                 HEAD_GROUP: gl.constexpr):
        gl.static_assert(STAGES >= 2, "k is released a block late: one ring slot would deadlock")
        b, h, hk, H, m0 = _query_program(GROUP, BM, CAUSAL, HEAD_GROUP)
        dtype: gl.constexpr = desc_q.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BM, D], desc_q.layout)
        do_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BM, D], desc_do.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_v.layout)
        bar_q = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar_q, count=1)
        full_k, full_v, empty_k, empty_v = _kv_ring(STAGES)
        fence_async_shared()
        hi = Sk
        if CAUSAL:
            hi = gl.minimum(Sk, m0 + 2 * BM)
        n = gl.cdiv(hi, BLOCK_N)  # >= 1: Sk >= 1, and causal row 0 sees key 0
        causal = CAUSAL  # a run-time value (warp_specialize's arguments cannot carry constexprs in Triton 3.6)
        bars = (bar_q, full_k, full_v, empty_k, empty_v)
        args = (desc_q, desc_k, desc_v, desc_do, desc_dq, LSE, DELTA, q_smem, do_smem, k_smem, v_smem, bars, b, h,
                hk, m0, n, Sq, Sk, H, qk_scale, scale, causal)
        gl.warp_specialize([(_dq_first, args), (_dq_second, args), (_dq_producer, args)], [4, 1],
                           [CONSUMER_REGS, 24])

    @gluon.jit
    def _dkdv_consumer(desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, bars, b, hk, n0, lo, n_q, H,
                       Sq, GROUP, qk_scale, scale, causal, C: gl.constexpr):
        """Consumer warpgroup C: dk and dv of keys n0 + 64 C ... of (b, hk) over n_q query tiles of each of the
        GROUP query heads."""
        bar_kv, full, empty = bars
        STAGES: gl.constexpr = q_smem.shape[0]
        BM: gl.constexpr = q_smem.shape[3]
        BK: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = q_smem.shape[4]
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = desc_dk.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, BM, 16])
        a_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, D, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        k2 = k_smem.index(C).reshape([BK, D])
        v2 = v_smem.index(C).reshape([BK, D])
        offs_n = n0 + C * BK + gl.arange(0, BK, layout=row_s)
        zero_s = gl.zeros([BK, BM], gl.float32, s_layout)
        dk = gl.zeros([BK, D], gl.float32, a_layout)
        dv = gl.zeros([BK, D], gl.float32, a_layout)
        mbarrier.wait(bar_kv, 0)
        for i in range(GROUP * n_q):
            st = i % STAGES
            start = lo + (i % n_q) * BM
            row_base = (b.to(gl.int64) * H + hk * GROUP + i // n_q) * Sq
            mbarrier.wait(full.index(st), (i // STAGES) & 1)
            q2 = q_smem.index(st).reshape([BM, D])
            do2 = do_smem.index(st).reshape([BM, D])
            s_tok = warpgroup_mma(k2, q2.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            offs_m = start + gl.arange(0, BM, layout=col_s)
            lse = gl.load(LSE + row_base + offs_m, mask=offs_m < Sq, other=float("inf"))  # rows >= Sq: p = 0
            s = warpgroup_mma_wait(0, deps=[s_tok])
            p = gl.exp2(s * qk_scale - lse[None, :])
            # causal: keys after the query row; keys >= Sk only reach rows of dk and dv that the store clips
            p = gl.where((offs_m[None, :] >= offs_n[:, None]) | (causal == 0), p, 0.0)
            p16 = gl.convert_layout(p.to(dtype), op_layout)
            dp_tok = warpgroup_mma(v2, do2.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            dv_tok = warpgroup_mma(p16, do2, dv, is_async=True)
            delta = gl.load(DELTA + row_base + offs_m, mask=offs_m < Sq, other=0.0)
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            ds16 = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), op_layout)
            dk_tok = warpgroup_mma(ds16, q2, dk, is_async=True)
            dv, dk, p16, ds16 = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, p16, ds16])
            mbarrier.arrive(empty.index(st), count=1)
        # dk and dv leave through this consumer's k and v tiles (its MMAs are done with them); rows >= Sk are clipped
        k2.store((dk * scale).to(dtype))
        v2.store(dv.to(dtype))
        fence_async_shared()
        tma_store(desc_dk, [b, hk, n0 + C * BK, 0], k_smem.index(C))
        tma_store(desc_dv, [b, hk, n0 + C * BK, 0], v_smem.index(C))
        tma.store_wait(0)

    @gluon.jit
    def _dkdv_first(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem,
                    bars, b, hk, n0, lo, n_q, H, Sq, GROUP, qk_scale, scale, causal):
        _dkdv_consumer(desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, bars, b, hk, n0, lo, n_q, H,
                       Sq, GROUP, qk_scale, scale, causal, 0)

    @gluon.jit
    def _dkdv_second(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem,
                     bars, b, hk, n0, lo, n_q, H, Sq, GROUP, qk_scale, scale, causal):
        _dkdv_consumer(desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, bars, b, hk, n0, lo, n_q, H,
                       Sq, GROUP, qk_scale, scale, causal, 1)

    @gluon.jit
    def _dkdv_producer(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem,
                       do_smem, bars, b, hk, n0, lo, n_q, H, Sq, GROUP, qk_scale, scale, causal):
        """One warp: both consumers' k and v tiles, then q_i and do_i into ring slot i % STAGES as both free it."""
        bar_kv, full, empty = bars
        STAGES: gl.constexpr = q_smem.shape[0]
        BM: gl.constexpr = q_smem.shape[3]
        BK: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = q_smem.shape[4]
        mbarrier.expect(bar_kv, 4 * BK * D * 2)
        tma_load(desc_k, [b, hk, n0, 0], bar_kv, k_smem.index(0))  # keys >= Sk arrive as zeros
        tma_load(desc_k, [b, hk, n0 + BK, 0], bar_kv, k_smem.index(1))
        tma_load(desc_v, [b, hk, n0, 0], bar_kv, v_smem.index(0))
        tma_load(desc_v, [b, hk, n0 + BK, 0], bar_kv, v_smem.index(1))
        for i in range(GROUP * n_q):
            st = i % STAGES
            h = hk * GROUP + i // n_q
            start = lo + (i % n_q) * BM
            mbarrier.wait(empty.index(st), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(full.index(st), 2 * BM * D * 2)
            tma_load(desc_q, [b, h, start, 0], full.index(st), q_smem.index(st))  # rows >= Sq: zeros
            tma_load(desc_do, [b, h, start, 0], full.index(st), do_smem.index(st))

    @gluon.jit
    def _attn_bwd_dkdv_sm90_kernel(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, H, Sq, GROUP,
                                   qk_scale, scale, D: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr,
                                   BK: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                   HEAD_GROUP: gl.constexpr):
        lo = 0
        if CAUSAL:  # the first key blocks have the most query tiles: _heavy_first's rank is the block
            rank, bh = _heavy_first(HEAD_GROUP)
            n0 = rank * (2 * BK)
            hk = bh % gl.num_programs(1)
            b = bh // gl.num_programs(1)
            lo = (n0 // BM) * BM  # query tiles before the block's first key see none of it
        else:
            n0 = gl.program_id(0) * (2 * BK)
            hk = gl.program_id(1)
            b = gl.program_id(2)
        n_q = gl.cdiv(Sq - lo, BM)  # <= 0 where no query sees these keys: dk = dv = 0
        dtype: gl.constexpr = desc_q.dtype
        k_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BK, D], desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BK, D], desc_v.layout)
        q_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BM, D], desc_q.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BM, D], desc_do.layout)
        bar_kv = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bar_kv, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        fence_async_shared()
        causal = CAUSAL
        bars = (bar_kv, full, empty)
        args = (desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, LSE, DELTA, k_smem, v_smem, q_smem, do_smem, bars,
                b, hk, n0, lo, n_q, H, Sq, GROUP, qk_scale, scale, causal)
        gl.warp_specialize([(_dkdv_first, args), (_dkdv_second, args), (_dkdv_producer, args)], [4, 1],
                           [CONSUMER_REGS, 24])


def eligible(qv: Tensor, kv: Tensor, vv: Tensor, dov: Tensor, grads, mask) -> bool:
    """Whether ``plan`` runs these [B, H, S, D] views: an NVIDIA GPU of compute capability 9.0, fp16/bf16, no
    mask, one dtype and one head dim in ``DQ_CONFIGS`` (128) for q, k, v and do, at least 128 queries and one key,
    and strides a TMA descriptor accepts for q, k, v, do and the gradients ``grads`` (dq, dk, dv)."""
    D = qv.shape[3]
    return (AVAILABLE and mask is None and qv.dtype in (torch.float16, torch.bfloat16) and D in DQ_CONFIGS
            and all(t.dtype == qv.dtype for t in (kv, vv, dov)) and dov.shape[3] == D
            and kv.shape[3] == D and vv.shape[3] == D and kv.shape[2] > 0 and qv.shape[2] >= 2 * BLOCK_M
            and _capability_90(qv.device) and all(tma_descriptor_ok(t) for t in (qv, kv, vv, dov, *grads)))


def plan(qv: Tensor, kv: Tensor, vv: Tensor, dov: Tensor, grads, scale: float, causal: bool):
    """The backward's launches for q, k, v and do as [B, H, S, D] views writing the gradients ``grads`` = (dq [B, H,
    Sq, D], dk and dv [B, Hk, Sk, D], summed over each kv head's query heads), for every call of this signature
    (shapes, strides, dtype, device; ``eligible`` must hold). Returns ``run(q, k, v, do, lse, delta, dq, dk, dv)``,
    which launches both kernels for one call: ``lse`` ([B, H, Sq] fp32, base 2, from the forward), ``delta`` ([B, H,
    Sq] fp32, rowsum(do * o)); q, k, v, do and the gradients may be the tensors the views were taken of (a
    descriptor reads only their first element's address). The plan keeps no tensor of this call."""
    B, H, Sq, D = qv.shape
    Hk, Sk = kv.shape[1], kv.shape[2]
    dq, dk, dv = grads
    qk_scale = scale * 1.4426950408889634
    group = H // Hk

    def template(t, rows):
        block = [1, 1, rows, D]
        return descriptor_template(TensorDescriptor, t, block, shared_layout(tuple(block), qv.dtype))

    dq_cfg, dkdv_cfg = DQ_CONFIGS[D], DKDV_CONFIGS[D]
    bn, bk = dq_cfg.block_n, dkdv_cfg.block_n
    q_t, do_t, dq_t = template(qv, BLOCK_M), template(dov, BLOCK_M), template(dq, BLOCK_M)
    k_n, v_n = template(kv, bn), template(vv, bn)
    k_k, v_k = (k_n, v_n) if bk == bn else (template(kv, bk), template(vv, bk))
    dk_t, dv_t = template(dk, bk), template(dv, bk)
    dq_launch = FixedLaunch(
        _attn_bwd_dq_sm90_kernel, (cdiv(Sq, 2 * BLOCK_M), H, B),
        meta_items(D=D, BM=BLOCK_M, BLOCK_N=bn, STAGES=dq_cfg.stages, CAUSAL=causal,
                   CONSUMER_REGS=dq_cfg.consumer_regs, HEAD_GROUP=flash_sm90.CAUSAL_HEAD_GROUP, num_warps=4,
                   maxnreg=dq_cfg.maxnreg, **launch_options(_attn_bwd_dq_sm90_kernel, fp_fusion=True)), qv.device,
        (Sq, Sk, group, qk_scale, scale))
    dkdv_launch = FixedLaunch(
        _attn_bwd_dkdv_sm90_kernel, (cdiv(Sk, 2 * bk), Hk, B),
        meta_items(D=D, CAUSAL=causal, BM=BLOCK_M, BK=bk, STAGES=dkdv_cfg.stages,
                   CONSUMER_REGS=dkdv_cfg.consumer_regs, HEAD_GROUP=flash_sm90.CAUSAL_HEAD_GROUP, num_warps=4,
                   maxnreg=dkdv_cfg.maxnreg, **launch_options(_attn_bwd_dkdv_sm90_kernel, fp_fusion=True)),
        qv.device, (H, Sq, group, qk_scale, scale))

    def run(q, k, v, do, lse, delta, dq, dk, dv):
        q_desc, do_desc, k_desc, v_desc = rebase(q_t, q), rebase(do_t, do), rebase(k_n, k), rebase(v_n, v)
        dq_launch((q_desc, k_desc, v_desc, do_desc, rebase(dq_t, dq), lse, delta))
        if k_k is not k_n:
            k_desc, v_desc = rebase(k_k, k), rebase(v_k, v)
        dkdv_launch((q_desc, k_desc, v_desc, do_desc, rebase(dk_t, dk), rebase(dv_t, dv), lse, delta))

    return run
