"""Matmul for Hopper (sm_90), warp-specialised and persistent, written in Gluon (Triton's explicit-layout dialect).

y = act(a @ w.T + bias) for a (M, K) and an ``nn.Linear`` weight w (N, K) (``b`` of ``matmul`` given as ``w.T``),
fp16/bf16 with fp32 accumulation; the epilogue math is ``_epilogue_math.apply_activation`` (its NVIDIA fast-math
form), as in the ``tl`` kernels.

Layout (the warp-specialised Hopper GEMM of CUTLASS 3 and FlashAttention-3, Shah et al., 2024, arXiv:2407.08608):

- one persistent program per SM walks the output tiles ``pid, pid + P, ...`` (``GROUP_M`` row tiles per group, so
  programs running at the same time share w's column tiles in L2);
- one **producer** warp moves a and w tiles into a ``STAGES``-deep shared-memory ring with the TMA unit
  (mbarriers "full" and "empty"); it runs ahead over tile boundaries, so the next tile's first loads overlap the
  current tile's epilogue;
- two **consumer** warpgroups multiply with warpgroup MMA (``wgmma``), keeping one MMA in flight. ``cooperative``:
  both take every tile, 64 or 128 rows each; ``pingpong`` (``rows == block_m``): they take alternate tiles, so one's
  epilogue (bias, activation, the store through shared memory and TMA) runs while the other's MMAs do.

Why Gluon: Triton's ``tl`` kernels (``matmul._matmul_tma_kernel``) cannot overlap one tile's epilogue with another
tile's MMAs in a warpgroup of their own, and cannot give the producer its own warp with few registers.

Used by ``matmul._matmul_forward`` (a ``plan`` per call signature) for configs with ``gluon`` 1 (cooperative) or 2
(ping-pong) where ``eligible`` holds (capability 9.0 exactly, fp16/bf16, b read as a K-major (N, K) matrix,
TMA-aligned strides, a non-gated activation) and no pre-activation is saved for a backward; every other call keeps
the ``tl`` kernels.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._device import launch_options, tma_descriptor_ok
from ._epilogue_math import ACTIVATIONS, apply_activation
from ._fastlaunch import FixedLaunch, meta_items, rebase
from ._gluon import AVAILABLE, capability_90, shared_layout
from ._launch import tma_capable

Tensor = torch.Tensor

if AVAILABLE:
    from ._gluon import TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, tma, tma_load, tma_store
    from ._gluon import warpgroup_mma, warpgroup_mma_wait


# registers per thread: the second consumer warpgroup gets CONSUMER_REGS, the producer warp 24, the first consumer
# what is left of MAXNREG x 12 warps (248); no spills in the sm_90 compile of any tile below 128 x 256 per consumer
CONSUMER_REGS = 232
MAXNREG = 168
# shared memory of one program on sm_90 (227 KiB) less room for the mbarriers and the flags
SHARED_BYTES = 232448 - 1024



if AVAILABLE:

    @gluon.constexpr_function
    def _tag_activation(tag):
        """The activation id that ``_matmul_sm90_kernel`` wrote into the tag buffer's shape."""
        s = tag.shape
        return (s[0] - 1) + 2 * (s[1] - 1) + 4 * (s[2] - 1)

    @gluon.jit
    def _tile(t, num_m, num_n, group_m):
        """(pid_m, pid_n) of tile t: groups of group_m row tiles, rows fastest within a group."""
        width = group_m * num_n
        first_m = (t // width) * group_m
        size_m = gl.minimum(num_m - first_m, group_m)
        r = t % width
        return first_m + r % size_m, r // size_m

    @gluon.jit
    def _consumer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                  group_m, C: gl.constexpr):
        """Consumer warpgroup C (0 or 1). Cooperative (c_smem rows < block_m): rows C * rows ... of every tile of
        this program; ping-pong: all rows of the program's tiles C, C + 2, ..."""
        ACT: gl.constexpr = _tag_activation(tag)
        HAS_BIAS: gl.constexpr = tag.shape[3] == 2
        STAGES: gl.constexpr = a_smem.shape[0]
        BM: gl.constexpr = a_smem.shape[1]
        BK: gl.constexpr = a_smem.shape[2]
        BN: gl.constexpr = b_smem.shape[1]
        ROWS: gl.constexpr = c_smem.shape[1]
        PING: gl.constexpr = ROWS == BM
        STEP: gl.constexpr = 2 if PING else 1
        FIRST: gl.constexpr = C if PING else 0
        ROW0: gl.constexpr = 0 if PING else C * ROWS
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = c_desc.dtype
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                             instr_shape=[16, BN, 16])
        col: gl.constexpr = gl.SliceLayout(0, acc_layout)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        mine = gl.cdiv(num_m * num_n - pid, P)  # tiles of this program
        c_buf = c_smem.index(C)
        for i in range(FIRST, mine, STEP):
            pid_m, pid_n = _tile(pid + i * P, num_m, num_n, group_m)
            base = i * k_tiles
            acc = gl.zeros([ROWS, BN], gl.float32, acc_layout)
            if PING:  # take turns: a full-mbarrier wait may be at most one ring pass ahead of the producer
                j = i // 2  # this consumer's j-th tile; consumer 0 goes first (a fresh mbarrier passes parity 1)
                mbarrier.wait(turn.index(C), (j & 1) ^ (1 - C))
            for kk in range(k_tiles):
                it = base + kk
                s = it % STAGES
                mbarrier.wait(full.index(s), (it // STAGES) & 1)
                a_tile = a_smem.index(s)
                if not PING:
                    a_tile = a_tile.slice(ROW0, ROWS, dim=0)
                acc = warpgroup_mma(a_tile, b_smem.index(s).permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=[acc])  # the previous step's MMA is done: its slot is free
                if kk > 0:
                    mbarrier.arrive(empty.index((it - 1) % STAGES), count=1)
            if PING:
                mbarrier.arrive(turn.index(1 - C), count=1)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(empty.index((base + k_tiles - 1) % STAGES), count=1)
            off_n = pid_n * BN
            if HAS_BIAS:
                offs_n = off_n + gl.arange(0, BN, layout=col)
                acc += gl.load(bias + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)[None, :]
            acc = apply_activation(acc, ACT, True)  # the NVIDIA fast-math forms
            tma.store_wait(0)  # the previous tile's store has left c_buf
            c_buf.store(acc.to(dtype))
            fence_async_shared()
            tma_store(c_desc, [pid_m * BM + ROW0, off_n], c_buf)  # rows >= M and columns >= N are clipped
        tma.store_wait(0)

    @gluon.jit
    def _first_consumer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                        group_m):
        _consumer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                  group_m, 0)

    @gluon.jit
    def _second_consumer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                         group_m):
        _consumer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                  group_m, 1)

    @gluon.jit
    def _producer(a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K,
                  group_m):
        """One warp: the a and w tiles of every k step of this program's tiles, in order, into ring slot
        step % STAGES once its consumers released it (k >= K and rows >= M arrive as zeros)."""
        STAGES: gl.constexpr = a_smem.shape[0]
        BM: gl.constexpr = a_smem.shape[1]
        BK: gl.constexpr = a_smem.shape[2]
        BN: gl.constexpr = b_smem.shape[1]
        BYTES: gl.constexpr = (BM + BN) * BK * 2
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        mine = gl.cdiv(num_m * num_n - pid, P)
        it = 0
        for i in range(mine):
            pid_m, pid_n = _tile(pid + i * P, num_m, num_n, group_m)
            for kk in range(k_tiles):
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)  # the first pass finds every slot free
                mbarrier.expect(full.index(s), BYTES)
                tma_load(a_desc, [pid_m * BM, kk * BK], full.index(s), a_smem.index(s))
                tma_load(b_desc, [pid_n * BN, kk * BK], full.index(s), b_smem.index(s))
                it += 1

    @gluon.jit
    def _matmul_sm90_kernel(a_desc, b_desc, c_desc, bias, M, N, K, group_m, ACT: gl.constexpr,
                            HAS_BIAS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[0]
        ROWS: gl.constexpr = c_desc.block_type.shape[0]
        dtype: gl.constexpr = a_desc.dtype
        a_smem = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], a_desc.layout)
        b_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], b_desc.layout)
        c_smem = gl.allocate_shared_memory(dtype, [2, ROWS, BN], c_desc.layout)
        full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1 if ROWS == BM else 2)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        # warp_specialize's arguments cannot carry constexprs in Triton 3.6 (they arrive as tensors), and a run-time
        # activation branch made the consumers spill (143 bytes at 128 x 128 ping-pong tiles): the activation id
        # (3 bits) and HAS_BIAS travel as the shape of a 1-16 byte buffer instead, each dimension 1 or 2
        tag = gl.allocate_shared_memory(gl.int8, [1 + (ACT & 1), 1 + ((ACT >> 1) & 1), 1 + ((ACT >> 2) & 1),
                                                  1 + HAS_BIAS], gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
        fence_async_shared()
        args = (a_desc, b_desc, c_desc, bias, a_smem, b_smem, c_smem, tag, full, empty, turn, M, N, K, group_m)
        gl.warp_specialize([(_first_consumer, args), (_second_consumer, args), (_producer, args)], [4, 1],
                           [CONSUMER_REGS, 24])


def _rows(cfg) -> int:
    """Output rows per consumer warpgroup: half a tile (cooperative, ``gluon`` 1) or all of it (ping-pong, 2)."""
    return cfg.block_m // 2 if cfg.gluon == 1 else cfg.block_m


def fitting_stages(cfg, itemsize: int = 2) -> int:
    """The ring depth that runs: ``cfg.num_stages``, fewer where that many a / w tiles and the two consumers'
    output tiles do not fit in shared memory (0 when not even two stages do)."""
    out = 2 * _rows(cfg) * cfg.block_n * itemsize
    stage = (cfg.block_m + cfg.block_n) * cfg.block_k * itemsize
    stages = min(cfg.num_stages, (SHARED_BYTES - out) // stage)
    return stages if stages >= 2 else 0


def _stages(cfg, itemsize: int) -> int:
    """The ring depth ``plan`` runs ``cfg`` with (``fitting_stages``), 0 for tiles this kernel does not take: 64
    or 128 rows per consumer, block_n and block_k powers of two in 16 ... 256 and >= 16, at most 128 x 128
    accumulators per consumer (a 128 x 256 one spills thousands of registers), at least two stages."""
    rows, bn, bk = _rows(cfg), cfg.block_n, cfg.block_k
    ok = (cfg.gluon in (1, 2) and rows in (64, 128) and 16 <= bn <= 256 and not bn & (bn - 1) and bk >= 16
          and not bk & (bk - 1) and rows * bn <= 128 * 128)
    return fitting_stages(cfg, itemsize) if ok else 0


def eligible(a: Tensor, b: Tensor, y: Tensor, activation: Optional[str], cfg) -> bool:
    """Whether a ``plan`` runs y = act(a @ b + bias) with ``cfg`` (a ``MatmulConfig`` with ``gluon`` 1 or 2):
    Gluon available, capability 9.0 exactly (wgmma), fp16/bf16, b = w.T with w (N, K) K-major, TMA-aligned a, w and
    y, a non-gated activation, and tiles this kernel takes (``_stages``)."""
    return (AVAILABLE and activation in ACTIVATIONS and not ACTIVATIONS[activation][1]  # plain epilogues only
            and a.dtype in (torch.float16, torch.bfloat16) and b.dtype == a.dtype and y.dtype == a.dtype
            and _stages(cfg, a.element_size()) >= 2 and a.shape[1] > 0
            and capability_90(a.device) and tma_descriptor_ok(a) and tma_descriptor_ok(b.t()) and tma_descriptor_ok(y))


def plan(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str], y: Tensor, cfg):
    """The launch of y = act(a @ b + bias) for a (M, K), b (K, N) = w.T and bias (N,) or None with the tiles of
    ``cfg`` (see ``eligible``, which must hold), for every call of this signature (shapes, strides, dtypes, device,
    16-byte alignment, bias or none): ``(launch, args)``, where ``launch(args(a, b, bias, y, None))`` runs one call
    (``args`` takes matmul's h too, always None here: this kernel saves no pre-activation). The plan keeps no tensor
    of this call."""
    M, K = a.shape
    N = b.shape[1]
    w = b.t()
    bm, bn, bk, rows = cfg.block_m, cfg.block_n, cfg.block_k, _rows(cfg)
    # templates without a tensor: each call's descriptors are these rebased on its own tensors
    a_desc = rebase(TensorDescriptor(a, [M, K], [a.stride(0), 1], [bm, bk], shared_layout((bm, bk), a.dtype)), None)
    b_desc = rebase(TensorDescriptor(w, [N, K], [w.stride(0), 1], [bn, bk], shared_layout((bn, bk), a.dtype)), None)
    c_desc = rebase(TensorDescriptor(y, [M, N], [y.stride(0), 1], [rows, bn], shared_layout((rows, bn), a.dtype)), None)
    tiles = -(-M // bm) * -(-N // bn)
    grid = (min(tiles, tma_capable(a.device)[1]),)  # one program per SM at most
    meta = meta_items(ACT=ACTIVATIONS[activation][0], HAS_BIAS=bias is not None,
                      STAGES=_stages(cfg, a.element_size()), CONSUMER_REGS=CONSUMER_REGS, num_warps=4,
                      maxnreg=MAXNREG, **launch_options(_matmul_sm90_kernel, fp_fusion=True))
    group_m = cfg.group_m

    def args(a, b, bias, y, h):
        # no bias: y stands in for the pointer the kernel never reads
        return (rebase(a_desc, a), rebase(b_desc, b.t()), rebase(c_desc, y),
                y if bias is None else bias.contiguous(), M, N, K, group_m)

    return FixedLaunch(_matmul_sm90_kernel, grid, meta, a.device), args
