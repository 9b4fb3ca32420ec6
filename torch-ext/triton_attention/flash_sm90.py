"""Flash attention forward for Hopper (sm_90), warp-specialised, written in Gluon (Triton's explicit-layout dialect).

The same math as ``flash.py``'s forward (online softmax in base 2, scale folded into the exponent, lse kept in base 2
for the backward), laid out as FlashAttention-3 does on Hopper (Shah et al., 2024, arXiv:2407.08608, sections 3.1-3.2):

- one program per 128 query rows and (batch, head): two **consumer** warpgroups of 64 rows each and one **producer**
  warp that moves q, k and v tiles into shared memory with the TMA unit (``STAGES``-deep ring of k/v tiles, mbarriers
  "full" and "empty");
- each consumer multiplies with warpgroup MMA (``wgmma``) from shared memory and issues block j's ``q k^T`` before
  it waits for block j-1's ``p v``, so its softmax of block j runs while its ``p v`` is on the tensor cores
  (intra-warpgroup overlap);
- the consumers are separate partitions, so they drift apart and one's softmax runs while the other's MMAs run; with
  ``pingpong`` (off in the shipped ``CONFIGS``) two mbarriers make them take turns to issue their MMAs.

Why Gluon: Triton's ``tl`` language makes a ``tl.dot`` asynchronous only when its result feeds an accumulator chain
and has no way to interleave two warpgroups, so the ``tl`` kernels of ``flash.py`` stop at ~500 TFLOP/s on the H200
against SDPA's (cuDNN) ~600 (``benchmarks/NOTES.md``, sessions 17, 20 and 25).

Used by ``flash._attn_fwd_launch`` where ``eligible`` holds: an NVIDIA GPU of compute capability 9.0 (wgmma exists
only on sm_90a), fp16/bf16, no mask, head dim 64 or 128 for q, k and v, strides a TMA descriptor
accepts, at least 128 queries (shorter ones, such as decode steps, would leave most of a program idle), and a
Triton whose Gluon has the pieces used here. Everything else keeps the ``tl`` kernels. ``flash_attention_rope``
takes this kernel too, with q rotated by one rotary pass first (this kernel does not rotate on load).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._device import cdiv, launch_options, tma_descriptor_ok
from ._fastlaunch import FixedLaunch, descriptor_template, meta_items, rebase
from ._gluon import AVAILABLE, capability_90 as _capability_90, shared_layout

Tensor = torch.Tensor

if AVAILABLE:
    from ._gluon import TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store
    from ._gluon import warpgroup_mma, warpgroup_mma_wait


class Sm90Config(NamedTuple):
    """Tiles of the sm_90 forward: ``block_n`` keys per step, a ring of ``stages`` k/v tiles, ``pingpong`` (the two
    consumers take turns to issue their MMAs), ``consumer_regs`` registers per thread of the second consumer (the
    first gets what is left of ``maxnreg`` x 12 warps after it and the producer's 24)."""
    block_n: int
    stages: int
    pingpong: bool
    consumer_regs: int = 232
    maxnreg: int = 168


# H200, bf16, session 25 (results/attention_sm90_session25_2026-12-03.txt): 128-key blocks over 2 stages, no turns,
# 224 registers for the second consumer: the setting of the last harness run and CUDA tests. Ratios to SDPA in the
# same run over four runs at d = 128: the turns (232 registers) were ahead without causality (S = 4096 1.00-1.07,
# 16384 1.00-1.03, against 0.99-1.00 / 1.00-1.02) and behind with it (0.96-1.01 / 0.99-1.08 against 1.00-1.04 /
# 1.06-1.11): differences of the size of the run-to-run spread, so one setting for both until measured apart.
CONFIGS = {128: Sm90Config(128, 2, False, 224), 64: Sm90Config(128, 2, False, 224)}
BLOCK_M = 64  # query rows per consumer warpgroup; a program covers 2 * BLOCK_M
# Causal grids (here and in flash_sm90_bwd.py) run in groups of this many (batch, head) pairs, longest blocks first
# within each group (_heavy_first; the grids of other calls ignore it); 1: one head after another. H200, bf16,
# d = 128, session 27 (medians of 3 interleaved rounds, results/attention_causal_order_session27_2026-12-03.txt),
# forward / backward TFLOP/s for 1 -> 4: 4 x 32 x 4096 526 -> 538 / 384 -> 390, GQA 2 x 32 (8 kv) x 4096
# 519 -> 560 / 359 -> 400, 1 x 24 x 4608 514 -> 540 / 358 -> 385, 1 x 32 x 16384 610 -> 605 / 428 -> 425 (8: no
# better). Outputs are bit-equal.
CAUSAL_HEAD_GROUP = 4


if AVAILABLE:

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale, start, m0, Sk, causal, row_s: gl.constexpr, col_s: gl.constexpr,
                      BM: gl.constexpr, BLOCK_N: gl.constexpr):
        """One block of the online softmax: p = exp2(s * qk_scale - m_new), the running max m and sum l, and
        alpha = exp2(m_old - m_new) to rescale the output. Keys >= Sk (and, causal, keys after the query row) are
        masked only in the blocks that hold some; ``causal`` is a run-time integer (warp_specialize's arguments
        cannot carry constexprs in Triton 3.6)."""
        masked = (start + BLOCK_N > Sk) | ((causal != 0) & (start + BLOCK_N > m0 + 1))
        if masked:
            offs_n = start + gl.arange(0, BLOCK_N, layout=col_s)
            offs_m = m0 + gl.arange(0, BM, layout=row_s)
            keep = (offs_n < Sk)[None, :] & ((offs_n[None, :] <= offs_m[:, None]) | (causal == 0))
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, l_i, m_new

    @gluon.jit
    def _consumer(desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale, causal, pingpong,
                  C: gl.constexpr):
        """Consumer warpgroup C (0 or 1): query rows m0 + 64 C ... of (b, h) against the n key blocks."""
        bar_q, full_k, full_v, empty_k, empty_v, turn = bars
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = k_smem.shape[4]
        BM: gl.constexpr = q_smem.shape[3]
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = desc_o.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                           instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        mc = m0 + C * BM
        q_buf = q_smem.index(C)
        q2 = q_buf.reshape([BM, D])
        zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BM], float("-inf"), gl.float32, row_s)
        l_i = gl.zeros([BM], gl.float32, row_s)
        o = gl.zeros([BM, D], gl.float32, o_layout)

        mbarrier.wait(bar_q, 0)
        mbarrier.wait(full_k.index(0), 0)
        s_tok = warpgroup_mma(q2, k_smem.index(0).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        mbarrier.arrive(empty_k.index(0), count=1)
        p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, qk_scale, 0, mc, Sk, causal, row_s, col_s, BM, BLOCK_N)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n):
            st = j % STAGES
            stp = (j - 1) % STAGES
            if pingpong:  # consumer 0 goes first; a fresh mbarrier passes a wait on parity 1 at once
                if C == 0:
                    mbarrier.wait(turn.index(0), j & 1)
                else:
                    mbarrier.wait(turn.index(1), (j - 1) & 1)
            mbarrier.wait(full_k.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q2, k_smem.index(st).reshape([BLOCK_N, D]).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            mbarrier.wait(full_v.index(stp), ((j - 1) // STAGES) & 1)
            o_tok = warpgroup_mma(p16, v_smem.index(stp).reshape([BLOCK_N, D]), o, is_async=True)
            if pingpong:
                mbarrier.arrive(turn.index(1 - C), count=1)
            s = warpgroup_mma_wait(1, deps=[s_tok])  # block j's scores; block j-1's p v may still run
            mbarrier.arrive(empty_k.index(st), count=1)
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, qk_scale, j * BLOCK_N, mc, Sk, causal, row_s, col_s,
                                               BM, BLOCK_N)
            o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
            mbarrier.arrive(empty_v.index(stp), count=1)
            o = o * gl.convert_layout(alpha, row_o)[:, None]
            p16 = gl.convert_layout(p.to(dtype), p_layout)
        stl = (n - 1) % STAGES
        mbarrier.wait(full_v.index(stl), ((n - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p16, v_smem.index(stl).reshape([BLOCK_N, D]), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o_tok])
        mbarrier.arrive(empty_v.index(stl), count=1)
        o = o / gl.convert_layout(l_i, row_o)[:, None]  # every row has a key (column 0), so l > 0
        offs_m = mc + gl.arange(0, BM, layout=row_s)
        lse = m_i + gl.log2(l_i)  # base 2, as flash.py's kernels
        gl.store(LSE + (b.to(gl.int64) * H + h) * Sq + offs_m, lse, mask=offs_m < Sq)
        q2.store(o.to(dtype))  # the output leaves through this consumer's q tile (rows >= Sq are clipped)
        fence_async_shared()
        tma_store(desc_o, [b, h, mc, 0], q_buf)
        tma.store_wait(0)

    @gluon.jit
    def _first_consumer(desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, hk, m0, n, Sq, Sk,
                        H, qk_scale, causal, pingpong):
        _consumer(desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale, causal, pingpong, 0)

    @gluon.jit
    def _second_consumer(desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, hk, m0, n, Sq, Sk,
                         H, qk_scale, causal, pingpong):
        _consumer(desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, m0, n, Sq, Sk, H, qk_scale, causal, pingpong, 1)

    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, hk, m0, n, Sq, Sk, H,
                  qk_scale, causal, pingpong):
        """One warp: both q tiles, then k_j and v_j into ring slot j % STAGES once both consumers released it."""
        bar_q, full_k, full_v, empty_k, empty_v, turn = bars
        STAGES: gl.constexpr = k_smem.shape[0]
        BLOCK_N: gl.constexpr = k_smem.shape[3]
        D: gl.constexpr = k_smem.shape[4]
        BM: gl.constexpr = q_smem.shape[3]
        Q_BYTES: gl.constexpr = BM * D * 2
        KV_BYTES: gl.constexpr = BLOCK_N * D * 2
        mbarrier.expect(bar_q, 2 * Q_BYTES)
        tma_load(desc_q, [b, h, m0, 0], bar_q, q_smem.index(0))  # rows >= Sq arrive as zeros
        tma_load(desc_q, [b, h, m0 + BM, 0], bar_q, q_smem.index(1))
        for j in range(n):
            st = j % STAGES
            phase = ((j // STAGES) & 1) ^ 1  # the first pass over the ring finds every slot free
            mbarrier.wait(empty_k.index(st), phase)
            mbarrier.expect(full_k.index(st), KV_BYTES)
            tma_load(desc_k, [b, hk, j * BLOCK_N, 0], full_k.index(st), k_smem.index(st))  # keys >= Sk: zeros
            mbarrier.wait(empty_v.index(st), phase)
            mbarrier.expect(full_v.index(st), KV_BYTES)
            tma_load(desc_v, [b, hk, j * BLOCK_N, 0], full_v.index(st), v_smem.index(st))

    @gluon.jit
    def _heavy_first(HEAD_GROUP: gl.constexpr):
        """(rank, bh) of this program of a causal grid (blocks, heads, batches): the flattened (batch, head) index bh
        and the rank of its block, 0 for the block with the most work. Programs run in groups of HEAD_GROUP
        (batch, head) pairs, and within a group by rank, then pair, so each group's long blocks start before its
        short ones; HEAD_GROUP = 1 is the launch order of one head after another."""
        nb = gl.num_programs(0)
        BH = gl.num_programs(1) * gl.num_programs(2)
        lin = gl.program_id(0) + nb * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
        g = lin // (nb * HEAD_GROUP)
        size = gl.minimum(BH - g * HEAD_GROUP, HEAD_GROUP)  # the last group may hold fewer pairs
        r = lin - g * nb * HEAD_GROUP
        return r // size, g * HEAD_GROUP + r % size

    @gluon.jit
    def _query_program(GROUP, BM: gl.constexpr, CAUSAL: gl.constexpr, HEAD_GROUP: gl.constexpr):
        """(b, h, hk, H, m0) of a program over the 2 BM query rows from m0 of head h (kv head hk) of batch b; causal
        programs run the longest query blocks first (``_heavy_first``), so the short ones fill the tail."""
        H = gl.num_programs(1)
        if CAUSAL:
            rank, bh = _heavy_first(HEAD_GROUP)
            pid_m = gl.num_programs(0) - 1 - rank
            h = bh % H
            b = bh // H
        else:
            pid_m = gl.program_id(0)
            h = gl.program_id(1)
            b = gl.program_id(2)
        hk = h // GROUP
        m0 = pid_m * (2 * BM)
        return b, h, hk, H, m0

    @gluon.jit
    def _kv_ring(STAGES: gl.constexpr):
        """The mbarriers of a k and a v ring of STAGES slots, initialised: (full_k, full_v, empty_k, empty_v); a
        full one takes the producer's arrival (its expect; the TMA bytes complete it), an empty one both consumers'."""
        full_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        full_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full_k.index(i), count=1)
            mbarrier.init(full_v.index(i), count=1)
            mbarrier.init(empty_k.index(i), count=2)
            mbarrier.init(empty_v.index(i), count=2)
        return full_k, full_v, empty_k, empty_v

    @gluon.jit
    def _attn_fwd_sm90_kernel(desc_q, desc_k, desc_v, desc_o, LSE, Sq, Sk, GROUP, qk_scale,
                              D: gl.constexpr, BM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                              CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              HEAD_GROUP: gl.constexpr):
        b, h, hk, H, m0 = _query_program(GROUP, BM, CAUSAL, HEAD_GROUP)
        dtype: gl.constexpr = desc_q.dtype
        q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BM, D], desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 1, 1, BLOCK_N, D], desc_v.layout)
        bar_q = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar_q, count=1)
        full_k, full_v, empty_k, empty_v = _kv_ring(STAGES)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        fence_async_shared()
        hi = Sk
        if CAUSAL:
            hi = gl.minimum(Sk, m0 + 2 * BM)
        n = gl.cdiv(hi, BLOCK_N)
        causal = CAUSAL  # passed on as run-time values (see _softmax_step)
        pingpong = PINGPONG
        bars = (bar_q, full_k, full_v, empty_k, empty_v, turn)
        args = (desc_q, desc_k, desc_v, desc_o, LSE, q_smem, k_smem, v_smem, bars, b, h, hk, m0, n, Sq, Sk, H,
                qk_scale, causal, pingpong)
        gl.warp_specialize([(_first_consumer, args), (_second_consumer, args), (_producer, args)], [4, 1],
                           [CONSUMER_REGS, 24])


def eligible(qv: Tensor, kv: Tensor, vv: Tensor, o: Tensor, mask, scale: float) -> bool:
    """Whether ``plan`` runs these [B, H, S, D] views (see the module docstring); ``scale`` > 0 (the kernel masks
    before it scales, and takes the row maximum of the unscaled scores)."""
    D = qv.shape[3]
    return (AVAILABLE and mask is None and scale > 0 and qv.dtype in (torch.float16, torch.bfloat16) and D in CONFIGS
            and kv.shape[3] == D and vv.shape[3] == D and kv.shape[2] > 0 and qv.shape[2] >= 2 * BLOCK_M
            and _capability_90(qv.device)
            and all(tma_descriptor_ok(t) for t in (qv, kv, vv, o)))


def plan(qv: Tensor, kv: Tensor, vv: Tensor, o: Tensor, qk_scale: float, causal: bool):
    """The launch of the forward for q, k, v as [B, H, S, D] views (kv heads Hk dividing H) writing ``o`` ([B, H, Sq,
    D]) and the base-2 ``lse`` ([B, H, Sq] fp32), for every call of this signature (shapes, strides, dtype, device;
    ``eligible`` must hold); ``qk_scale`` = softmax scale x log2(e). Returns ``(launch, args)``: ``launch(args(q, k,
    v, o, lse))`` runs one call, where q, k, v and o may be the tensors these views were taken of (a descriptor
    reads only their first element's address). The plan keeps no tensor of this call."""
    B, H, Sq, D = qv.shape
    Hk, Sk = kv.shape[1], kv.shape[2]
    cfg = CONFIGS[D]
    q_block, kv_block = [1, 1, BLOCK_M, D], [1, 1, cfg.block_n, D]
    q_layout, kv_layout = shared_layout(tuple(q_block), qv.dtype), shared_layout(tuple(kv_block), qv.dtype)
    q_desc, k_desc, v_desc, o_desc = (
        descriptor_template(TensorDescriptor, t, block, layout)
        for t, block, layout in ((qv, q_block, q_layout), (kv, kv_block, kv_layout), (vv, kv_block, kv_layout),
                                 (o, q_block, q_layout)))
    group = H // Hk
    meta = meta_items(D=D, BM=BLOCK_M, BLOCK_N=cfg.block_n, STAGES=cfg.stages, CAUSAL=causal, PINGPONG=cfg.pingpong,
                      CONSUMER_REGS=cfg.consumer_regs, HEAD_GROUP=CAUSAL_HEAD_GROUP, num_warps=4,
                      maxnreg=cfg.maxnreg, **launch_options(_attn_fwd_sm90_kernel, fp_fusion=True))

    def args(q, k, v, o, lse):
        return rebase(q_desc, q), rebase(k_desc, k), rebase(v_desc, v), rebase(o_desc, o), lse

    return FixedLaunch(_attn_fwd_sm90_kernel, (cdiv(Sq, 2 * BLOCK_M), H, B), meta, qv.device,
                       (Sq, Sk, group, qk_scale)), args
