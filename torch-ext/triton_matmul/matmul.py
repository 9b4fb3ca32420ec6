"""``matmul``: a tiled ``tl.dot`` GEMM with bias and activation fused into the store; ops and autograd.

Math (M rows, K reduced, all accumulation in fp32):

    h = a @ b + bias                       a (M, K), b (K, N), bias (N,) or none
    plain:   y = act(h)                    act in {identity, gelu, gelu_tanh, silu, relu}
    gated:   p, g = h[:, :N/2], h[:, N/2:]  ("proj" half first, "gate" half second)
             y = p * act(g)                geglu: act = gelu (erf), swiglu: act = silu

The gated split is diffusers' ``GEGLU``/``SwiGLU``: ``hidden_states, gate = proj(x).chunk(2, -1);
hidden_states * gelu(gate)``: the **second** half is activated (kernels-community's
``gelu_and_mul`` activates the first). y is rounded once, from fp32, to a's dtype.

Kernel: one program per (BLOCK_M, BLOCK_N) tile of y, grouped along M (``GROUP_M``) so
programs running together share columns of b in L2. The main loop walks K in steps of
``BLOCK_K``; every load is masked, so any M, N, K (primes included) and any strides
(transposed operands are read in place through their strides, no copy) work with any
config. Gated epilogues keep two accumulators (the proj and gate columns of the same
tile): b is read once per output, h never goes to memory unless autograd needs it.
Bytes: a is read N/BLOCK_N times, b M/BLOCK_M times, y written once (+ h when saved).
FLOPs: 2*M*N*K (N = all columns of b).

Hopper path (``_matmul_tma_kernel``): on NVIDIA sm_90+ with fp16/bf16 operands whose last
dimension (a's K; b's N, or b's K when b is a transposed (N, K) weight such as ``W.t()``) has
unit stride, other strides and base pointers 16-byte aligned, and N * itemsize % 16 == 0, a
config with ``tma=1`` runs a kernel that loads tiles with TMA descriptors (host
``TensorDescriptor``s; out-of-bounds rows, columns and k read as zero, so any M, N, K still
work), multiplies with warpgroup MMA and stores y through a descriptor (clipped at M, N).
Options: a persistent grid (one program per SM walking the tiles), warp specialization,
the epilogue in two column halves (less shared memory), tiles of ``sub_n`` (2 or 3) accumulators of
BLOCK_N columns each (plain epilogues: a 128 x 192 tile as three 128 x 64 ``tl.dot``s on one a block
per k step, so N = 3072 makes 16 tile columns where 256-wide tiles make 12 and leave SMs idle; every
sub-tile has its own TMA loads of b and its own epilogue; sub-tiles past N read zeros, store nothing), and split-K (``split_k`` programs per
tile each sum a contiguous range of k tiles in fp32; the last to arrive, counted with an
atomic, adds the partials in split order -- deterministic -- and runs the epilogue), or stream-K
(``_matmul_streamk_kernel``: the tiles' k iterations laid end to end are cut into one equal range
per program of a persistent grid, so a tile count that fills the SMs unevenly still keeps every SM
busy; a tile cut between programs is summed from fp32 partials in program order by its last piece).
Any other case, the Triton interpreter included unless a config asks for TMA, runs the pointer
kernel above: the result never depends on which kernel or config ran beyond fp32 summation order.

On exactly sm_90 a config with ``gluon`` 1 or 2 runs ``matmul_sm90`` instead (plain epilogues with nn.Linear's
K-major weight, when no pre-activation is saved): a persistent kernel in Gluon with a TMA producer warp and two
consumer warpgroups, cooperative or ping-pong; see that module.

Few rows (``_gemv_kernel``, configs with ``gemv=1``, M <= ``GEMV_MAX_M``): one program per
BLOCK_N output columns streams its (BLOCK_N, K) slab of b once with wide loads (contiguous along k
for ``W.t()``), multiplies it by all M rows of a on CUDA cores in fp32 and reduces over k once
after the loop; same epilogues. Decode-sized calls are bound by reading W, not by FLOPs, so
the many small programs that keep every SM's loads in flight matter more than tensor cores.

Backward: the forward writes h (rounded to a's dtype, as eager ``F.gelu(F.linear(x))``
saves it) when a gradient is needed. ``dh`` = dy * act'(h) (gated: ``dp = dy * act(g)``,
``dg = dy * p * act'(g)``) is computed in fp32 by one elementwise kernel (``epilogue_grad``) and
rounded to a's dtype; then ``da = dh @ b.T``, ``db = a.T @ dh`` run as ``torch.matmul`` (cuBLAS on
GPU) and ``dbias = dh.sum(0)`` in fp32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

from . import matmul_sm90
from ._dispatch import call_op, eager_autograd, inference
from ._fastlaunch import FixedLaunch, PlanCache, meta_items, rebase, signature
from ._launch import MatmulConfig, config_for, tma_capable
from ._device import cdiv, check_dense, check_launch_device, is_interpreter, launch_options, next_power_of_2
from ._epilogue_math import ACTIVATIONS, apply_activation, store_rounded
from .epilogue_grad import epilogue_grad
from ._libm import nvidia_approx
from ._ops import add_op_namespace_prefix
from ._rounding import round_to

Tensor = torch.Tensor

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _epilogue(acc, acc_g, bias_ptr, h_ptr, offs_m, offs_n, M, N, stride_hm,
              GATED: tl.constexpr, ACT: tl.constexpr, FAST_MATH: tl.constexpr):
    """The fp32 epilogue of a tile shared by every kernel: bias added, h saved (``h_ptr`` given; rounded to its
    dtype), then y = act(h) or, gated, p * act(g), returned in fp32 for the caller's store."""
    mask_n = offs_n < N
    if bias_ptr is not None:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_g += tl.load(bias_ptr + N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if h_ptr is not None:
        rows = offs_m[:, None].to(tl.int64)
        mask = (offs_m < M)[:, None] & mask_n[None, :]
        store_rounded(h_ptr + rows * stride_hm + offs_n[None, :], acc, mask)
        if GATED:
            store_rounded(h_ptr + rows * stride_hm + N + offs_n[None, :], acc_g, mask)
    if GATED:
        y = acc * apply_activation(acc_g, ACT, FAST_MATH)
    else:
        y = apply_activation(acc, ACT, FAST_MATH)
    return y


@triton.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a linear tile index, grouped along M (GROUP_M tile rows share b's columns in L2)."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows_in_group, (tile % per_group) // rows_in_group


@triton.jit
def _tile_start(a_ptr, pid_m, pid_n, M, N, stride_am, stride_ak,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile (pid_m, pid_n) of the pointer kernels: ``(offs_m, offs_n, offs_k, mask_m, mask_n, a_ptrs)``, its rows,
    columns and first k block, the row and column masks, and int64 pointers to a's first (BLOCK_M, BLOCK_K) block."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :].to(tl.int64) * stride_ak
    return offs_m, offs_n, offs_k, offs_m < M, offs_n < N, a_ptrs


@triton.jit
def _matmul_fwd_kernel(
    a_ptr,  # (M, K), any strides
    b_ptr,  # (K, N_total), any strides; N_total = N (plain) or 2 * N (gated)
    bias_ptr,  # (N_total,) contiguous, or None
    y_ptr,  # (M, N) output, row stride stride_ym, unit column stride
    h_ptr,  # (M, N_total) pre-activation saved for backward (unit column stride), or None
    M, N, K,  # N: output columns
    stride_am, stride_ak,  # elements a_ptr moves per row / per k
    stride_bk, stride_bn,  # elements b_ptr moves per k / per column
    stride_ym, stride_hm,  # row strides of y and h
    GATED: tl.constexpr,  # y = h[:, :N] * act(h[:, N:]) instead of act(h)
    ACT: tl.constexpr,  # see _activation
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # tile rows per group (programs of a group share b's columns in L2)
    UPCAST: tl.constexpr,  # interpreter only: its bf16 tl.dot is wrong; fp32 products of bf16 values are exact
    FAST_MATH: tl.constexpr = False,  # NVIDIA: single-instruction exp2 / reciprocal in the activation
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m, offs_n, offs_k, mask_m, mask_n, a_ptrs = _tile_start(a_ptr, pid_m, pid_n, M, N, stride_am, stride_ak,
                                                                 BLOCK_M, BLOCK_N, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
    gate_shift = tl.cast(N, tl.int64) * stride_bn  # (tl.cast: N may be a specialized constant 1) gated: the gate columns start N columns to the right

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        mask_k = offs_k < K - k
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)  # fp16/bf16: tensor cores, fp32 accumulation; fp32: tf32
        if GATED:
            bg = tl.load(b_ptrs + gate_shift, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if UPCAST:
                bg = bg.to(tl.float32)
            acc_g = tl.dot(a, bg, acc_g)
        a_ptrs += BLOCK_K * tl.cast(stride_ak, tl.int64)
        b_ptrs += BLOCK_K * tl.cast(stride_bk, tl.int64)

    # epilogue, all fp32: bias, (save h), activation, one rounding on the store
    y = _epilogue(acc, acc_g, bias_ptr, h_ptr, offs_m, offs_n, M, N, stride_hm, GATED, ACT, FAST_MATH)
    store_rounded(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y, mask_m[:, None] & mask_n[None, :])


@triton.jit
def _gemv_kernel(
    a_ptr,  # (M, K), any strides; M <= GEMV_MAX_M
    b_ptr,  # (K, N_total), any strides
    bias_ptr,  # (N_total,) contiguous, or None
    y_ptr,  # (M, N) output, row stride stride_ym, unit column stride
    h_ptr,  # (M, N_total) pre-activation saved for backward, or None
    M, N, K,  # N: output columns
    stride_am, stride_ak, stride_bk, stride_bn, stride_ym, stride_hm,
    GATED: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,  # >= M: every row of a in one program, so b is read once
    BLOCK_N: tl.constexpr,  # output columns per program (any power of two >= 1)
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no k mask in the loop
    FAST_MATH: tl.constexpr = False,
):
    """Few-row GEMM on CUDA cores: program (pid_n, pid_m) streams the (BLOCK_N, K) slab of b (W's rows when b is
    ``W.t()``: contiguous along k, so wide vector loads) once, multiplies it with BLOCK_M rows of a in fp32 and
    keeps per-lane partial sums (BLOCK_M, BLOCK_N, BLOCK_K) that are reduced over k once, after the loop."""
    offs_m, offs_n, offs_k, mask_m, mask_n, a_ptrs = _tile_start(a_ptr, tl.program_id(1), tl.program_id(0), M, N,
                                                                 stride_am, stride_ak, BLOCK_M, BLOCK_N, BLOCK_K)
    b_ptrs = b_ptr + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :].to(tl.int64) * stride_bk
    gate_shift = tl.cast(N, tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            mask_a = mask_m[:, None]
            mask_b = mask_n[:, None]
        else:
            mask_k = offs_k < K - k
            mask_a = mask_m[:, None] & mask_k[None, :]
            mask_b = mask_n[:, None] & mask_k[None, :]
        a = tl.load(a_ptrs, mask=mask_a, other=0.0).to(tl.float32)
        w = tl.load(b_ptrs, mask=mask_b, other=0.0).to(tl.float32)
        acc += a[:, None, :] * w[None, :, :]
        if GATED:
            wg = tl.load(b_ptrs + gate_shift, mask=mask_b, other=0.0).to(tl.float32)
            acc_g += a[:, None, :] * wg[None, :, :]
        a_ptrs += BLOCK_K * tl.cast(stride_ak, tl.int64)
        b_ptrs += BLOCK_K * tl.cast(stride_bk, tl.int64)
    y = _epilogue(tl.sum(acc, axis=2), tl.sum(acc_g, axis=2), bias_ptr, h_ptr, offs_m, offs_n, M, N, stride_hm,
                  GATED, ACT, FAST_MATH)
    store_rounded(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y, mask_m[:, None] & mask_n[None, :])


@triton.jit
def _tma_epilogue(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                  GATED: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  ROUND_BF16: tl.constexpr, FAST_MATH: tl.constexpr):
    """bias, (save h through pointers), activation, one rounding, TMA store of a (BLOCK_M, BLOCK_N) tile of y."""
    y = _epilogue(acc, acc_g, bias_ptr, h_ptr, off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N), M, N,
                  stride_hm, GATED, ACT, FAST_MATH)
    if ROUND_BF16:  # interpreter: its fp32 -> bf16 conversion truncates; GPUs round to nearest even
        y = round_to(y, tl.bfloat16)
    y_desc.store([off_m, off_n], y.to(y_desc.dtype))  # TMA clips the rows/columns past M, N


@triton.jit
def _tma_b_block(b_desc, off_n, off_k, B_NK: tl.constexpr, UPCAST: tl.constexpr):
    """The (BLOCK_K, BLOCK_N) block of b at (off_k, off_n), read through b's descriptor (transposed view for B_NK)."""
    if B_NK:
        b = b_desc.load([off_n, off_k]).T
    else:
        b = b_desc.load([off_k, off_n])
    if UPCAST:
        b = b.to(tl.float32)
    return b


@triton.jit
def _tma_k_step(a_desc, b_desc, acc, acc_g, acc1, acc2, off_m, off_n, off_k, N,
                GATED: tl.constexpr, B_NK: tl.constexpr, BLOCK_N: tl.constexpr, SUB_N: tl.constexpr,
                UPCAST: tl.constexpr):
    """One BLOCK_K step of a tile through TMA descriptors: acc += a @ b (and, gated, acc_g += a @ b's gate columns,
    N to the right; reads past N in the proj tile only feed masked columns); SUB_N > 1: acc1 (and, SUB_N 3, acc2)
    += the same a block @ the next BLOCK_N columns of b (past N: zeros). Returns (acc, acc_g, acc1, acc2)."""
    a = a_desc.load([off_m, off_k])
    if UPCAST:
        a = a.to(tl.float32)
    acc = tl.dot(a, _tma_b_block(b_desc, off_n, off_k, B_NK, UPCAST), acc)
    if GATED:
        acc_g = tl.dot(a, _tma_b_block(b_desc, N + off_n, off_k, B_NK, UPCAST), acc_g)
    if SUB_N > 1:
        acc1 = tl.dot(a, _tma_b_block(b_desc, off_n + BLOCK_N, off_k, B_NK, UPCAST), acc1)
    if SUB_N > 2:
        acc2 = tl.dot(a, _tma_b_block(b_desc, off_n + 2 * BLOCK_N, off_k, B_NK, UPCAST), acc2)
    return acc, acc_g, acc1, acc2


@triton.jit
def _tma_finish(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                GATED: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EPILOGUE_SUBTILE: tl.constexpr, ROUND_BF16: tl.constexpr, FAST_MATH: tl.constexpr):
    """The epilogue of one tile: whole, or as two (BLOCK_M, BLOCK_N / 2) halves (less shared memory for the store)."""
    if EPILOGUE_SUBTILE:
        acc0, acc1 = acc.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
        if GATED:
            g0, g1 = acc_g.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1).split()
        else:
            g0 = acc0
            g1 = acc1
        _tma_epilogue(acc0, g0, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                      GATED, ACT, BLOCK_M, BLOCK_N // 2, ROUND_BF16, FAST_MATH)
        _tma_epilogue(acc1, g1, bias_ptr, y_desc, h_ptr, off_m, off_n + BLOCK_N // 2, M, N, stride_hm,
                      GATED, ACT, BLOCK_M, BLOCK_N // 2, ROUND_BF16, FAST_MATH)
    else:
        _tma_epilogue(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                      GATED, ACT, BLOCK_M, BLOCK_N, ROUND_BF16, FAST_MATH)


@triton.jit
def _tma_finish_tile(acc, acc_g, acc1, acc2, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                     GATED: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     SUB_N: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, ROUND_BF16: tl.constexpr,
                     FAST_MATH: tl.constexpr):
    """The epilogue of a (BLOCK_M, SUB_N * BLOCK_N) tile: one ``_tma_finish`` per BLOCK_N columns (sub-tiles past N
    store nothing: TMA clips them; SUB_N > 1 is plain only)."""
    _tma_finish(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                GATED, ACT, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE, ROUND_BF16, FAST_MATH)
    if SUB_N > 1:
        _tma_finish(acc1, acc1, bias_ptr, y_desc, h_ptr, off_m, off_n + BLOCK_N, M, N, stride_hm,
                    False, ACT, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE, ROUND_BF16, FAST_MATH)
    if SUB_N > 2:
        _tma_finish(acc2, acc2, bias_ptr, y_desc, h_ptr, off_m, off_n + 2 * BLOCK_N, M, N, stride_hm,
                    False, ACT, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE, ROUND_BF16, FAST_MATH)


@triton.jit
def _split_k_block(ws_ptr, off_m, off_n, M, N, n_ws, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(pointers, mask) of the (BLOCK_M, BLOCK_N) block at (off_m, off_n) of a split-K workspace slice with rows of
    n_ws fp32 values; rows >= M and columns >= N masked."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    return ws_ptr + offs_m[:, None].to(tl.int64) * n_ws + offs_n[None, :], mask


@triton.jit
def _split_k_store(ws_ptr, acc, off_m, off_n, M, N, n_ws, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's fp32 partial of the block at (off_m, off_n) into its workspace slice ``ws_ptr``."""
    ptrs, mask = _split_k_block(ws_ptr, off_m, off_n, M, N, n_ws, BLOCK_M, BLOCK_N)
    tl.store(ptrs, acc, mask=mask)


@triton.jit
def _split_k_sum(ws_ptr, off_m, off_n, M, N, n_ws, split_size, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The SPLIT_K fp32 partials of the block at (off_m, off_n), slices ``ws_ptr + s * split_size``, summed in split
    order 0, 1, ... (deterministic)."""
    ptrs, mask = _split_k_block(ws_ptr, off_m, off_n, M, N, n_ws, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ptrs + s * split_size, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _matmul_tma_kernel(
    a_desc,  # (M, K) descriptor, block (BLOCK_M, BLOCK_K)
    b_desc,  # B_NK: (N_total, K) descriptor of b.T, block (BLOCK_N, BLOCK_K); else (K, N_total), block (BLOCK_K, BLOCK_N)
    bias_ptr,  # (N_total,) contiguous, or None
    y_desc,  # (M, N) descriptor of y, block (BLOCK_M, BLOCK_N) or (BLOCK_M, BLOCK_N // 2) with EPILOGUE_SUBTILE
    h_ptr,  # (M, N_total) pre-activation saved for backward (unit column stride), or None
    ws_ptr,  # SPLIT_K > 1: (SPLIT_K, M, N_total) fp32 partial sums; else None
    cnt_ptr,  # SPLIT_K > 1: (tiles,) int32 zeros, arrivals per tile; else None
    M, N, K,  # N: output columns
    stride_hm,
    NUM_PROGS,  # programs launched (persistent: <= number of SMs; else one per tile)
    GATED: tl.constexpr, ACT: tl.constexpr, B_NK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
    SPLIT_K: tl.constexpr,  # programs per tile, each summing a contiguous 1/SPLIT_K of the K tiles
    UPCAST: tl.constexpr,  # interpreter only (bf16): see _matmul_fwd_kernel; also rounds the store to nearest even
    FAST_MATH: tl.constexpr = False,
    SUB_N: tl.constexpr = 1,  # 1, 2, 3 (plain only): tiles of SUB_N * BLOCK_N columns, one accumulator per BLOCK_N
):
    """Hopper+ path: TMA loads into shared memory (out-of-bounds rows/columns/k read as zero, so any M, N, K),
    warpgroup MMA, optionally persistent (each program walks tiles pid, pid + NUM_PROGS, ...). A tile is
    (BLOCK_M, SUB_N * BLOCK_N): SUB_N accumulators of BLOCK_N columns share each k step's a block."""
    tl.static_assert(SUB_N == 1 or not GATED, "SUB_N > 1 is for plain epilogues")
    TILE_N: tl.constexpr = SUB_N * BLOCK_N
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, TILE_N)
    num_tiles = num_m * num_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in tl.range(tl.program_id(0), num_tiles * SPLIT_K, NUM_PROGS, flatten=FLATTEN,
                      warp_specialize=WARP_SPECIALIZE):
        tile = t // SPLIT_K
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * TILE_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_per_split = tl.cdiv(k_tiles, SPLIT_K)
        k_first = (t % SPLIT_K) * k_per_split
        for kt in range(k_first, tl.minimum(k_first + k_per_split, k_tiles)):
            acc, acc_g, acc1, acc2 = _tma_k_step(a_desc, b_desc, acc, acc_g, acc1, acc2, off_m, off_n, kt * BLOCK_K,
                                                 N, GATED, B_NK, BLOCK_N, SUB_N, UPCAST)
        if SPLIT_K > 1:
            # split-K: each program writes its fp32 partial; the last of the tile's SPLIT_K programs to arrive
            # (atomic counter, acq_rel) sums the partials in split order 0, 1, ... (deterministic) and finishes
            n_ws = N * 2 if GATED else N
            split_size = tl.cast(M, tl.int64) * n_ws  # tl.cast: M == 1 is specialized to a constant
            ws_split = ws_ptr + (t % SPLIT_K) * split_size
            _split_k_store(ws_split, acc, off_m, off_n, M, N, n_ws, BLOCK_M, BLOCK_N)
            if GATED:  # the gate columns: N to the right
                _split_k_store(ws_split + N, acc_g, off_m, off_n, M, N, n_ws, BLOCK_M, BLOCK_N)
            if SUB_N > 1:
                _split_k_store(ws_split, acc1, off_m, off_n + BLOCK_N, M, N, n_ws, BLOCK_M, BLOCK_N)
            if SUB_N > 2:
                _split_k_store(ws_split, acc2, off_m, off_n + 2 * BLOCK_N, M, N, n_ws, BLOCK_M, BLOCK_N)
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if arrived == SPLIT_K - 1:
                acc = _split_k_sum(ws_ptr, off_m, off_n, M, N, n_ws, split_size, SPLIT_K, BLOCK_M, BLOCK_N)
                if GATED:
                    acc_g = _split_k_sum(ws_ptr + N, off_m, off_n, M, N, n_ws, split_size, SPLIT_K, BLOCK_M, BLOCK_N)
                if SUB_N > 1:
                    acc1 = _split_k_sum(ws_ptr, off_m, off_n + BLOCK_N, M, N, n_ws, split_size, SPLIT_K, BLOCK_M,
                                        BLOCK_N)
                if SUB_N > 2:
                    acc2 = _split_k_sum(ws_ptr, off_m, off_n + 2 * BLOCK_N, M, N, n_ws, split_size, SPLIT_K, BLOCK_M,
                                        BLOCK_N)
                _tma_finish_tile(acc, acc_g, acc1, acc2, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                                 GATED, ACT, BLOCK_M, BLOCK_N, SUB_N, EPILOGUE_SUBTILE, UPCAST, FAST_MATH)
        else:
            _tma_finish_tile(acc, acc_g, acc1, acc2, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                             GATED, ACT, BLOCK_M, BLOCK_N, SUB_N, EPILOGUE_SUBTILE, UPCAST, FAST_MATH)


@triton.jit
def _matmul_streamk_kernel(
    a_desc, b_desc, bias_ptr, y_desc, h_ptr,  # as _matmul_tma_kernel
    ws_ptr,  # (NUM_PROGS, 2, BLOCK_M, BLOCK_N_TOTAL) fp32 partial sums: slot 0 = the segment holding the program's
             # first k iteration, slot 1 = its last one (BLOCK_N_TOTAL = 2 * BLOCK_N gated, else BLOCK_N)
    cnt_ptr,  # (tiles,) int32 zeros: segments arrived per tile
    M, N, K, stride_hm,
    NUM_PROGS,
    GATED: tl.constexpr, ACT: tl.constexpr, B_NK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, UPCAST: tl.constexpr, FAST_MATH: tl.constexpr = False,
):
    """Stream-K: the tiles' k iterations, laid end to end (tile-major), are cut into NUM_PROGS equal contiguous
    ranges, one per program, so every program does the same work whatever the tile count. A tile whose k range
    lies in one program is finished there; a tile cut between programs has each piece's fp32 partial written to
    the workspace and the last piece to arrive (atomic counter) sums them in program order -- deterministic --
    and runs the epilogue."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    total = tl.cast(num_m * num_n, tl.int64) * k_tiles
    per = tl.cdiv(total, NUM_PROGS)
    start = pid * per
    end = tl.minimum(start + per, total)
    it = start
    offs_bm = tl.arange(0, BLOCK_M)
    offs_bn = tl.arange(0, BLOCK_N)
    NT: tl.constexpr = 2 * BLOCK_N if GATED else BLOCK_N
    part = offs_bm[:, None] * NT + offs_bn[None, :]  # offsets inside one workspace slot
    while it < end:
        tile = (it // k_tiles).to(tl.int32)
        tile_start = tl.cast(tile, tl.int64) * k_tiles
        k0 = (it - tile_start).to(tl.int32)
        k1 = tl.minimum(k_tiles, (end - tile_start)).to(tl.int32)
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k0, k1):
            acc, acc_g, _, _ = _tma_k_step(a_desc, b_desc, acc, acc_g, acc, acc, off_m, off_n, kt * BLOCK_K, N, GATED,
                                           B_NK, BLOCK_N, 1, UPCAST)
        if k0 == 0 and k1 == k_tiles:
            _tma_finish(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                        GATED, ACT, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE, UPCAST, FAST_MATH)
        else:
            slot = tl.where(it == start, 0, 1)
            base = (tl.cast(pid, tl.int64) * 2 + slot) * (BLOCK_M * NT)
            tl.store(ws_ptr + base + part, acc)
            if GATED:
                tl.store(ws_ptr + base + BLOCK_N + part, acc_g)
            first = (tile_start // per).to(tl.int32)  # programs holding pieces of this tile: first ... last
            last = ((tile_start + k_tiles - 1) // per).to(tl.int32)
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if arrived == last - first:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for p in range(first, last + 1):
                    # program p's piece is its slot 0 when p's range starts inside this tile, else its slot 1
                    p_slot = tl.where(tl.cast(p, tl.int64) * per >= tile_start, 0, 1)
                    p_base = (tl.cast(p, tl.int64) * 2 + p_slot) * (BLOCK_M * NT)
                    acc += tl.load(ws_ptr + p_base + part, cache_modifier=".cg")
                    if GATED:
                        acc_g += tl.load(ws_ptr + p_base + BLOCK_N + part, cache_modifier=".cg")
                _tma_finish(acc, acc_g, bias_ptr, y_desc, h_ptr, off_m, off_n, M, N, stride_hm,
                            GATED, ACT, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE, UPCAST, FAST_MATH)
        it = tile_start + k1


def _tma_layout(a: Tensor, b: Tensor, N: int) -> Optional[bool]:
    """None when the TMA kernel cannot read these operands, else B_NK (b read as the (N, K) matrix b.T).

    TMA needs a unit stride in the last dimension of each descriptor and 16-byte aligned base
    pointers and other strides; y (allocated contiguous here) needs N * itemsize % 16 == 0. A broadcast
    operand (stride 0 along a dimension of more than one element, e.g. ``x.expand``) goes to the pointer
    kernel, which reads it through its strides (whether a TMA descriptor may repeat rows is not checked).
    """
    e = a.element_size()
    if a.dtype not in (torch.float16, torch.bfloat16) or (N * e) % 16:
        return None
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        return None
    if not (a.stride(1) == 1 or a.shape[1] == 1) or (a.stride(0) * e) % 16 or (a.stride(0) == 0 and a.shape[0] > 1):
        return None
    if b.stride(1) == 1 and (b.stride(0) * e) % 16 == 0 and (b.stride(0) > 0 or b.shape[0] == 1):
        return False
    if b.stride(0) == 1 and (b.stride(1) * e) % 16 == 0 and (b.stride(1) > 0 or b.shape[1] == 1):
        return True
    return None


def _tma_plan(a, b, bias, y, h, M, N, K, gated, act, b_nk, cfg, num_sms, interp):
    """``(make, args, fitting key)`` of the TMA kernels (see ``_new_plan``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    subtile = bool(cfg.epilogue_subtile) and bn >= 32
    # templates without a tensor: each call's descriptors are these rebased on its own tensors
    a_desc = rebase(TensorDescriptor(a, [M, K], [a.stride(0), 1], [bm, bk]), None)
    if b_nk:
        b_desc = rebase(TensorDescriptor(b, [b.shape[1], K], [b.stride(1), 1], [bn, bk]), None)
    else:
        b_desc = rebase(TensorDescriptor(b, [K, b.shape[1]], [b.stride(0), 1], [bk, bn]), None)
    y_desc = rebase(TensorDescriptor(y, [M, N], [y.stride(0), 1], [bm, bn // 2 if subtile else bn]), None)
    sub_n = 1 if gated or cfg.stream_k else cfg.sub_n  # the TMA kernel's tiles: sub_n * bn columns
    tiles = cdiv(M, bm) * cdiv(N, sub_n * bn)
    device, n_total = a.device, b.shape[1]
    meta = dict(GATED=gated, ACT=act, B_NK=b_nk, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
                EPILOGUE_SUBTILE=subtile, UPCAST=interp and a.dtype == torch.bfloat16,
                FAST_MATH=nvidia_approx(device, _matmul_tma_kernel), num_warps=cfg.num_warps)
    if cfg.stream_k:
        kernel, name = _matmul_streamk_kernel, "streamk"
        progs = min(max(1, cfg.persistent) * num_sms, tiles * cdiv(K, bk))
        nt = 2 * bn if gated else bn

        def scratch():  # per-program fp32 partials, per-tile arrival counts
            return (torch.empty((progs, 2, bm, nt), dtype=torch.float32, device=device),
                    torch.zeros((tiles,), dtype=torch.int32, device=device))
    else:
        kernel, name = _matmul_tma_kernel, "tma"
        split = 1 if cfg.persistent else max(1, min(cfg.split_k, cdiv(K, bk)))
        progs = min(cfg.persistent * num_sms, tiles) if cfg.persistent else tiles * split
        ws = bool(cfg.warp_specialize) and not interp
        meta.update(WARP_SPECIALIZE=ws, FLATTEN=bool(cfg.persistent) and not ws and not interp, SPLIT_K=split,
                    SUB_N=sub_n)

        def scratch():  # split-K: fp32 partials, per-tile arrival counts
            if split == 1:
                return None, None
            return (torch.empty((split, M, n_total), dtype=torch.float32, device=device),
                    torch.zeros((tiles,), dtype=torch.int32, device=device))
    scalars = (M, N, K, h.stride(0) if h is not None else 0, progs)

    def args(a, b, bias, y, h):
        return (rebase(a_desc, a), rebase(b_desc, b), bias.contiguous() if bias is not None else None,
                rebase(y_desc, y), h, *scratch(), *scalars)

    def make(stages):
        return FixedLaunch(kernel, (progs,), meta_items(**meta, num_stages=stages,
                                                        **launch_options(kernel, fp_fusion=True)), device)

    return make, args, (name, cfg, gated, act, b_nk, a.dtype, device)


# The GEMV kernel holds every row of a in one program (BLOCK_M >= M): few rows only.
GEMV_MAX_M = 8


def _gemv_plan(a, b, bias, y, h, M, N, K, gated, act, cfg):
    """``(make, args, None)`` of the GEMV kernel (see ``_new_plan``): one program per BLOCK_N output columns; the
    config's block_n / block_k apply when b's k stride is the unit one (``W.t()``); for a row-major (K, N) b,
    columns are the contiguous direction, so the program takes 64 columns and 32-deep k chunks instead (wide loads
    either way)."""
    bn, bk = cfg.block_n, cfg.block_k
    if b.stride(1) == 1 and b.stride(0) != 1 and N > 1:  # (K, N) row-major: contiguous along n
        bn, bk = 64, 32
    bn = max(1, min(bn, next_power_of_2(N)))
    bk = max(16, min(bk, next_power_of_2(K)))
    bm = next_power_of_2(M)
    grid = (cdiv(N, bn), cdiv(M, bm))
    meta = meta_items(GATED=gated, ACT=act, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=K % bk == 0,
                      FAST_MATH=nvidia_approx(a.device, _gemv_kernel), num_warps=cfg.num_warps,
                      num_stages=cfg.num_stages, **launch_options(_gemv_kernel, fp_fusion=True))
    scalars = (M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), y.stride(0),
               h.stride(0) if h is not None else 0)
    launch = FixedLaunch(_gemv_kernel, grid, meta, a.device)

    def args(a, b, bias, y, h):
        return (a, b, bias.contiguous() if bias is not None else None, y, h, *scalars)

    return (lambda stages: launch), args, None


def _pointer_plan(a, b, bias, y, h, M, N, K, gated, act, cfg):
    """``(make, args, fitting key)`` of the pointer kernel (see ``_new_plan``)."""
    grid = (cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n),)
    meta = dict(GATED=gated, ACT=act, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m, UPCAST=is_interpreter(_matmul_fwd_kernel) and a.dtype == torch.bfloat16,
                FAST_MATH=nvidia_approx(a.device, _matmul_fwd_kernel), num_warps=cfg.num_warps)
    scalars = (M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), y.stride(0),
               h.stride(0) if h is not None else 0)
    device = a.device

    def args(a, b, bias, y, h):
        return (a, b, bias.contiguous() if bias is not None else None, y, h, *scalars)

    def make(stages):
        return FixedLaunch(_matmul_fwd_kernel, grid, meta_items(**meta, num_stages=stages,
                                                                **launch_options(_matmul_fwd_kernel, fp_fusion=True)),
                           device)

    return make, args, ("ptr", cfg, gated, act, a.dtype, device)


# (kernel, config, epilogue, dtype, device) -> num_stages that fit in shared memory
_FITTING_STAGES: dict = {}


def _launch_fitting(launch, key, cfg: MatmulConfig) -> None:
    """``launch(num_stages)`` with the config's stages, fewer when Triton reports that the tile's pipeline does
    not fit the device's shared memory (remembered per key); results do not depend on the stage count.

    Raises:
        ValueError: the config does not fit even with one stage (names the config).
    """
    stages = _FITTING_STAGES.get(key, cfg.num_stages)
    while True:
        try:
            launch(stages)
        except Exception as exc:  # triton.runtime.errors.OutOfResources (its module moved between releases)
            if type(exc).__name__ != "OutOfResources":
                raise
            if stages <= 1:
                raise ValueError(f"config {cfg} does not fit this device's shared memory even with one stage "
                                 f"({exc}); use smaller BLOCK_M/BLOCK_N/BLOCK_K") from exc
            stages -= 1
            continue
        _FITTING_STAGES[key] = stages
        return


def _new_plan(a, b, bias, activation, save_h, config, y, h):
    """Picks the kernel and config of this call signature, launches the call and returns the signature's plan: a
    function of ``(a, b, bias, y, h or None)`` that launches a call the same way. A path's builder gives
    ``(make, args, fitting key)``: ``make(num_stages)`` is the launch (a ``FixedLaunch``), ``args(a, b, bias, y, h)``
    a call's kernel arguments (its own tensor descriptors and scratch buffers); with a fitting key, the first launch
    lowers the stages until the pipeline fits shared memory (``_launch_fitting``)."""
    act, gated = ACTIVATIONS[activation]
    M, K = a.shape
    N = y.shape[1]
    check_launch_device(a, _matmul_fwd_kernel)
    cfg = (MatmulConfig.from_list(config) if config
           else config_for(M, N, K, a.device, gated, a.element_size(), activation))
    h = h if save_h else None
    built = None
    if cfg.gemv:
        if M <= GEMV_MAX_M and K > 0:
            built = _gemv_plan(a, b, bias, y, h, M, N, K, gated, act, cfg)
        else:  # too many rows for the GEMV kernel: the tensor-core kernels with tiles no smaller than tl.dot allows
            cfg = dataclasses.replace(cfg, gemv=0, block_m=max(16, cfg.block_m), block_n=max(16, cfg.block_n))
    if built is None and cfg.gluon and not gated and h is None and matmul_sm90.eligible(a, b, y, activation, cfg):
        launch, args = matmul_sm90.plan(a, b, bias, activation, y, cfg)
        built = (lambda stages: launch), args, None
    if built is None and cfg.tma and K > 0:
        interp = is_interpreter(_matmul_tma_kernel)
        capable, num_sms = (True, 4) if interp else tma_capable(a.device)
        b_nk = _tma_layout(a, b, N) if capable else None
        if b_nk is not None:
            built = _tma_plan(a, b, bias, y, h, M, N, K, gated, act, b_nk, cfg, num_sms, interp)
    if built is None:
        built = _pointer_plan(a, b, bias, y, h, M, N, K, gated, act, cfg)
    make, args, fit_key = built
    fitted = []

    def first(stages):
        launch = make(stages)
        launch(args(a, b, bias, y, h))
        fitted.append(launch)

    if fit_key is None:
        first(cfg.num_stages)
    else:
        _launch_fitting(first, fit_key, cfg)
    launch = fitted[-1]
    return lambda a, b, bias, y, h: launch(args(a, b, bias, y, h))


# a call signature (every property of the arguments but their data: see ``_plan_key``) -> its plan (``_new_plan``)
_PLANS = PlanCache()
# a checked call signature of matmul's plain inference (a's, b's and bias' signatures, activation) -> True
_CHECKED = PlanCache()


def _plan_key(a: Tensor, b: Tensor, bias: Optional[Tensor], activation, save_h: bool, config) -> tuple:
    """What the kernel, config and launch of a call depend on: shapes, strides, dtypes, device, whether a, b and
    bias start on 16 bytes (TMA, and Triton's pointer specialisation), activation, save_h, config. y and h are
    new allocations, which start on 16 bytes on every device's allocator."""
    return (signature(a), signature(b), signature(bias), activation, save_h,
            None if config is None else tuple(config))


def _keyed(a: Tensor, b: Tensor, bias: Optional[Tensor], activation, save_h: bool, config) -> tuple:
    """(a, its call's plan key): a single row is read the same at any row stride, so it is keyed (and passed) as a
    contiguous row: one plan for every slice such as hidden[:, -1] of a growing sequence."""
    K = a.shape[1]
    if a.shape[0] == 1 and a.stride(0) != K:
        a = a.as_strided((1, K), (K, a.stride(1)))
    return a, _plan_key(a, b, bias, activation, save_h, config)


def _matmul_forward(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str], save_h: bool,
                    config: Optional[List[int]], placeholder: bool, key: Optional[tuple] = None
                    ) -> Tuple[Tensor, Optional[Tensor]]:
    """(y, h): y (M, N_out) contiguous in a's dtype; h (M, N_total) when ``save_h``, else an empty (0,) tensor
    (``placeholder``: the op's output) or None. Each call signature picks its kernel and config once
    (``_new_plan``); its later calls launch from the plan. ``key``: the call's plan key where the caller has it
    (``_keyed``; a as it returned it)."""
    gated = ACTIVATIONS[activation][1]
    M = a.shape[0]
    n_total = b.shape[1]
    N = n_total // 2 if gated else n_total
    y = a.new_empty((M, N))  # less host time than torch.empty(..., dtype=, device=)
    h = torch.empty((M, n_total) if save_h else (0,), dtype=a.dtype, device=a.device) if save_h or placeholder else None
    if M == 0 or N == 0:
        return y, h
    if key is None:
        a, key = _keyed(a, b, bias, activation, save_h, config)
    plan = _PLANS.get(key)
    if plan is None:
        _PLANS.add(key, _new_plan(a, b, bias, activation, save_h, config, y, h))
    else:
        plan(a, b, bias, y, h if save_h else None)
    return y, h


def _matmul_fwd_impl(a: Tensor, b: Tensor, bias: Optional[Tensor], activation: Optional[str], save_h: bool,
                     config: Optional[List[int]]) -> Tuple[Tensor, Tensor]:
    """The op: (y, h), h an empty (0,) tensor unless ``save_h`` (see ``_matmul_forward``)."""
    return _matmul_forward(a, b, bias, activation, save_h, config, True)


def _matmul_infer(a, b, bias, activation, save_h, config) -> Tuple[Tensor, Optional[Tensor]]:
    """Plain eager inference (``call_op``'s ``infer``): no placeholder h is allocated."""
    return _matmul_forward(a, b, bias, activation, save_h, config, False)


_matmul_fwd = torch.library.custom_op(add_op_namespace_prefix("matmul_fwd"), _matmul_fwd_impl, mutates_args=())


@_matmul_fwd.register_fake
def _(a, b, bias, activation, save_h, config):
    gated = ACTIVATIONS[activation][1]
    M, n_total = a.shape[0], b.shape[1]
    y = a.new_empty((M, n_total // 2 if gated else n_total))
    h = a.new_empty((M, n_total) if save_h else (0,))
    return y, h


def _setup_context(ctx, inputs, output):
    a, b, bias, activation, save_h, config = inputs
    _, h = output
    ctx.activation = activation
    ctx.has_bias = bias is not None
    ctx.save_for_backward(a, b, h if activation is not None else None)
    ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not as a tensor of zeros


def _product_like(operand: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """``left @ right``, the gradient of ``operand``, laid out as ``operand`` is: column-major for a transposed
    operand such as b = W.t(), so that W's gradient comes out contiguous (autograd's AccumulateGrad would otherwise
    copy it into the parameter's layout: a transposing copy of the whole weight, slower than the GEMM itself)."""
    if operand.stride(0) == 1 and operand.stride(1) != 1:
        return (right.t() @ left.t()).t()
    return left @ right


def _backward(ctx, dy, dh_out):
    """Gradients of a, b and bias from those of y (``dy``) and of the saved pre-activation output h (``dh_out``:
    None in a plain backward, which never uses h; a double backward differentiates through h): both reach the
    pre-activation, dh = dy * act'(h) + dh_out."""
    a, b, h = ctx.saved_tensors
    if ctx.activation is not None and h.dim() != 2:
        raise RuntimeError("matmul: the pre-activation was not saved (the forward ran without grad mode)")
    dh = None
    if dy is not None:
        dh = dy.to(a.dtype) if ctx.activation is None else epilogue_grad(dy.to(a.dtype), h, ctx.activation)
    if dh_out is not None and ctx.activation is not None:
        dh = dh_out.to(a.dtype) if dh is None else dh + dh_out
    if dh is None:
        return None, None, None, None, None, None
    da = _product_like(a, dh, b.t()) if ctx.needs_input_grad[0] else None
    db = _product_like(b, a.t(), dh) if ctx.needs_input_grad[1] else None
    dbias = dh.sum(0, dtype=torch.float32).to(a.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return da, db, dbias, None, None, None


_MATMUL_AUTOGRAD = eager_autograd(_matmul_fwd, _matmul_fwd_impl, _setup_context, _backward)


def _check(a, b, bias, activation) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(name, t)
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must have dtype torch.float16, torch.bfloat16 or torch.float32, got {t.dtype}")
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:  # a list is unhashable
        names = ", ".join(repr(k) for k in ACTIVATIONS)
        raise ValueError(f"activation must be one of {names}, got {activation!r}")
    if a.dim() < 1 or b.dim() != 2:
        raise ValueError(f"a must have >= 1 dims and b exactly 2, got a of shape {tuple(a.shape)} and b of shape "
                         f"{tuple(b.shape)}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)} cannot be multiplied: "
                         f"a.shape[-1] = {a.shape[-1]} != b.shape[0] = {b.shape[0]}")
    if b.dtype != a.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if b.device != a.device:
        raise ValueError(f"b is on {b.device} but a is on {a.device}: all tensors must be on one device")
    if ACTIVATIONS[activation][1] and b.shape[1] % 2:
        raise ValueError(f"activation={activation!r} splits b's {b.shape[1]} columns into two halves: "
                         f"b of shape {tuple(b.shape)} needs an even number of columns")
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        check_dense("bias", bias)
        if bias.shape != (b.shape[1],):
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not match b of shape {tuple(b.shape)}: "
                             f"expected ({b.shape[1]},)")
        if bias.dtype != a.dtype:
            raise TypeError(f"bias must have a's dtype {a.dtype}, got {bias.dtype}")
        if bias.device != a.device:
            raise ValueError(f"bias is on {bias.device} but a is on {a.device}: all tensors must be on one device")


def matmul(a: Tensor, b: Tensor, bias: Optional[Tensor] = None, activation: Optional[str] = None, *,
           config: Optional[MatmulConfig] = None) -> Tensor:
    """``act(a @ b + bias)`` (or the gated ``p * act(g)``) in one kernel, epilogue fused into the store.

    Math: see the module docstring. ``matmul(x, W.t(), bias)`` equals ``F.linear(x, W, bias)``.

    Args:
        a: (..., K), fp16/bf16/fp32, any strides; leading dims are flattened as ``nn.Linear`` does
            (a view where the strides allow, else one copy).
        b: (K, N), a's dtype and device, any strides (``W.t()`` of a (N, K) weight is read in place).
        bias: (N,) in a's dtype, or None.
        activation: None, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"silu"``, ``"relu"``, or a gated form
            ``"geglu"`` / ``"swiglu"``: b's N columns are split into ``[proj | gate]`` halves and
            ``proj * gelu(gate)`` / ``proj * silu(gate)`` is returned (the second half is activated,
            as diffusers' ``GEGLU``/``SwiGLU``); N must be even.
        config: tile settings (:class:`MatmulConfig`); default: the nearest bucket of the device's
            JSON file for this activation (see ``_launch``). Results do not depend on it beyond fp32
            summation order.

    Returns:
        (..., N) or, gated, (..., N // 2): a's dtype, contiguous. With autograd, the pre-activation
        (M, N) is saved in a's dtype (as eager PyTorch saves ``linear``'s output).

    Raises:
        TypeError: unsupported or mismatched dtypes, non-tensor inputs, a sparse or nested tensor, a config
            that is not a :class:`MatmulConfig`.
        ValueError: a 0-d a or a b that is not 2-D, shapes that do not multiply (both shapes named), bad bias
            shape, unknown activation, odd N for a gated activation, tensors on different devices, a config
            that ``MatmulConfig.check`` refuses or that does not fit the device's shared memory.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.

    Precision: fp32 accumulation; fp16/bf16 products are exact on tensor cores; **fp32 inputs use tf32**
    on NVIDIA GPUs (10-bit mantissa products, ~1e-3 relative error, like ``torch.backends.cuda.matmul.
    allow_tf32 = True``). Bias, activation and the gated product are fp32; y is rounded once. eager
    ``F.gelu(F.linear(...))`` rounds h first, so values differ from it by ~1 ulp of the output dtype.

    Performance: one launch (plus a small zeroing one for split-K and stream-K configs); on NVIDIA sm_90+
    with aligned fp16/bf16 operands the TMA kernel (see the module docstring), elsewhere the pointer kernel
    with grid = ceil(M / BLOCK_M) * ceil(N_out / BLOCK_N); few-row calls with a GEMV config the GEMV kernel
    with ceil(N_out / BLOCK_N) programs. Backward: one elementwise kernel for dh (with an activation) plus two
    ``torch.matmul`` calls (dgrad, wgrad).
    """
    if config is None and inference((a, b, bias), 2) and a.dim() >= 1 and b.dim() == 2:
        # plain eager inference: the checks run once per call signature (host time of small calls), keyed like
        # the launch plan (a as the 2-d rows the kernel reads: its checks depend on nothing else of a)
        flat = a.dim() == 2
        try:
            a2, key = _keyed(a if flat else a.reshape(math.prod(a.shape[:-1]), a.shape[-1]), b, bias, activation,
                             False, None)
        except RuntimeError:  # a sparse or nested tensor (no strides or storage): the checks name it
            _check(a, b, bias, activation)
            raise
        try:
            checked = _CHECKED.get(key)
        except TypeError:  # an unhashable activation: the checks name it
            checked = None
        if checked is None:
            _check(a, b, bias, activation)
            _CHECKED.add(key, True)
        y = _matmul_forward(a2, b, bias, activation, False, None, False, key)[0]
        return y if flat else y.view(*a.shape[:-1], y.shape[-1])
    _check(a, b, bias, activation)
    if config is not None:
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"config must be a MatmulConfig or None, got {type(config).__name__}")
        config.check()
    flat = a.dim() == 2
    a2 = a if flat else a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, bias))
    save_h = activation is not None and grad
    y, _ = call_op(_matmul_fwd, _matmul_fwd_impl, a2, b, bias, activation, save_h,
                   config.as_list() if config is not None else None, autograd=_MATMUL_AUTOGRAD, infer=_matmul_infer)
    return y if flat else y.reshape(*a.shape[:-1], y.shape[-1])
