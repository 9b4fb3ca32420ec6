"""Softmax forward in PyTorch's CUDA order: the bits of ``torch.softmax(x, -1)`` (the ``Softmax`` layer).

fp32 addition is not associative and ``tl.exp`` is an approximation, so a softmax equals
torch's bit for bit only if it takes ``exp`` from the same math library and adds the
row's exponentials in the same order. This module reproduces the orders of ATen's
last-dim softmax kernels (``aten/src/ATen/native/cuda/SoftMax.cu`` and
``PersistentSoftmax.cuh``, torch 2.x; read from the public source, confirmed bitwise
against torch 2.11 on an H200, see ``benchmarks/results/softmax_vs_torch_*.md``):

``WARP`` (rows of at most ``WARP_MAX_N`` elements and ``WARP_MAX_BYTES`` bytes)
    ``softmax_warp_forward``: one warp of ``W = min(next_pow2(N), 32)`` lanes per row;
    lane ``l`` adds ``exp(x[l + i * W] - max)`` for ``i = 0, 1, ...`` in order, then the
    lanes combine in a butterfly (``shfl_xor`` with offsets W/2, ..., 1).
``REG`` (wider rows, ``ceil(N / 1024) < 10``)
    ``cunn_SoftMaxForwardReg``: 1024 threads; thread ``t`` adds elements ``t + r * 1024`` in
    order; then ``BlockReduce``: a halving tree (``shfl_down`` 16, ..., 1) inside each warp,
    then the same tree over the 32 warp sums.
``SMEM`` (wider rows that fit in 48 KiB of shared memory, 16-byte aligned, N a multiple of
    ``ILP = 16 / element size``)
    ``cunn_SoftMaxForwardSmem``: thread ``t`` adds the ILP elements of the vectors
    ``t, t + 1024, ...`` in order; the same block tree.
``ILP`` (the rest)
    ``cunn_SoftMaxForward`` (``ilpReduce``): a row starting ``shift`` elements past a
    16-byte boundary first gives thread ``t >= shift`` the element ``t - shift``; the
    rest of the row goes in ILP-element vectors, thread ``t`` taking vectors
    ``t, t + 1024, ...``, and the leftover (less than ``ILP * 1024`` elements) one
    element per thread, 1024 apart; the same block tree.

Every path ends with ``exp(x - max) / sum`` per element (IEEE division) rounded once to
x's dtype. :func:`row_stats_torch_order` stops before that pass and returns each row's max and
sum instead (torch's log-softmax uses the same sum; the exact cross-entropy builds on it). ``exp`` is the vendor library's (``libdevice``: CUDA's ``expf``, ROCm's ocml)
on GPUs; the interpreter uses numpy's ``exp`` (same order, other last bits). Each tree
level is a sum over an axis of size 2 (one addition: the same in any order), and launches
disable fp contraction.

Only the forward over the last dim (or a dim after which every size is 1) without scale
or mask follows torch; other calls take the package's fast kernels.
"""

from __future__ import annotations

import functools
import torch
import triton
import triton.language as tl

from ._device import cdiv, is_interpreter, launch_options, next_power_of_2
from ._fastlaunch import launch, meta_items
from ._libm import exp_f32, use_libdevice

# ATen constants of the CUDA build
THREADS = 1024  # block size of the block kernels (SoftMaxForward_getBlockSize for dim > 1024)
WARP = 32
ALIGN_BYTES = 16
REG_MAX_COUNT = 10  # cunn_SoftMaxForwardReg when ceil(N / 1024) < 10
DEFAULT_SMEM_PER_BLOCK = 49152  # cudaDeviceProp::sharedMemPerBlock (48 KiB on every NVIDIA GPU since Kepler)
# softmax_warp_forward's limits: (elements, bytes) of a row. torch 2.11 on an H200 matches (2048, 8192) in every
# tested case and not (1024, 4096), the limits of older releases (benchmarks/results/softmax_vs_torch_2026-12-01.md).
WARP_MAX_N, WARP_MAX_BYTES = 2048, 8192

PATH_WARP, PATH_REG, PATH_SMEM, PATH_ILP = 0, 1, 2, 3
_PATH_NAMES = {PATH_WARP: "warp", PATH_REG: "reg", PATH_SMEM: "smem", PATH_ILP: "ilp"}


@triton.jit
def _halve(t):
    """(R, W) -> (R, W / 2): element l + element l + W / 2 (one level of a halving tree). A sum over an axis of
    size 2 is that one addition in any order; it also compiles to shuffles, where a permute + split went
    through shared memory at every level (7 GB/s instead of 2141 GB/s on an H200 at 65536 x 2048)."""
    R: tl.constexpr = t.shape[0]
    W: tl.constexpr = t.shape[1]
    return tl.sum(tl.reshape(t, (R, 2, W // 2)), axis=1)


@triton.jit
def _tree(t, LEVELS: tl.constexpr):
    """Halving tree along axis 1 of (R, 2**LEVELS) -> (R, 1): torch's shfl_down / shfl_xor stages, and the
    shared-memory trees of block reductions (``s[t] += s[t + stride]``, stride halving). The loop is unrolled
    at compile time (each level has its own shape)."""
    for _ in tl.static_range(LEVELS):
        t = _halve(t)
    return t


@triton.jit
def _softmax_warp_order_kernel(x_ptr, y_ptr, stats_ptr, M, N, stride_x, stride_y, ROWS: tl.constexpr,
                               W: tl.constexpr, LOG_W: tl.constexpr, ITERS: tl.constexpr, LIBDEVICE: tl.constexpr):
    # ROWS rows per program, each as W lanes x ITERS steps (element l + i * W): softmax_warp_forward's order.
    # stats_ptr given: store each row's (max, sum of exp) there instead of writing y.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: M may pass 2^31
    rm = (rows < M)[:, None]
    rows64 = rows[:, None]
    lane = tl.arange(0, W)[None, :]
    xb = x_ptr + rows64 * stride_x
    m = tl.full((ROWS, W), float("-inf"), tl.float32)
    for i in range(ITERS):
        c = i * W + lane
        m = tl.maximum(m, tl.load(xb + c, mask=rm & (c < N), other=float("-inf")).to(tl.float32))
    mx = tl.max(m, axis=1)[:, None]  # a max is the same in any order
    s = tl.zeros((ROWS, W), tl.float32)
    for i in range(ITERS):  # per lane, in order; a lane past the row adds exp(-inf) = 0
        c = i * W + lane
        v = tl.load(xb + c, mask=rm & (c < N), other=float("-inf")).to(tl.float32)
        s = s + exp_f32(v - mx, LIBDEVICE)
    total = _tree(s, LOG_W)  # (ROWS, 1)
    if stats_ptr is not None:
        tl.store(stats_ptr + 2 * rows64, mx, mask=rm)
        tl.store(stats_ptr + 2 * rows64 + 1, total, mask=rm)
    else:
        yb = y_ptr + rows64 * stride_y
        for i in range(ITERS):
            c = i * W + lane
            ok = rm & (c < N)
            v = tl.load(xb + c, mask=ok, other=0.0).to(tl.float32)
            y = tl.math.div_rn(exp_f32(v - mx, LIBDEVICE), total)
            tl.store(yb + c, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _addexp_f32(p, xb, c, ok, mx, LIBDEVICE: tl.constexpr):
    """p + exp(x[c] - max) where ok, p unchanged elsewhere (exp(-inf) = 0 added)."""
    v = tl.load(xb + c, mask=ok, other=float("-inf")).to(tl.float32)
    return p + exp_f32(v - mx, LIBDEVICE)


@triton.jit
def _softmax_block_order_kernel(x_ptr, y_ptr, stats_ptr, N, stride_x, stride_y, misalign, PATH: tl.constexpr,
                                ILP: tl.constexpr, T: tl.constexpr, LOG_WARPS: tl.constexpr, BLOCK: tl.constexpr,
                                LIBDEVICE: tl.constexpr):
    # one row per program; t = the T threads of ATen's block, p[t] = thread t's partial sum;
    # stats_ptr given: store the row's (max, sum of exp) there instead of writing y
    row = tl.program_id(0).to(tl.int64)
    xb = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in range(0, N, BLOCK):
        c = start + offs
        m = tl.maximum(m, tl.load(xb + c, mask=c < N, other=float("-inf")).to(tl.float32))
    mx = tl.max(m, axis=0)
    t = tl.arange(0, T)
    p = tl.zeros((T,), tl.float32)
    if PATH == 1:  # cunn_SoftMaxForwardReg: elements t, t + T, ...
        for start in range(0, N, T):
            c = start + t
            p = _addexp_f32(p, xb, c, c < N, mx, LIBDEVICE)
    elif PATH == 2:  # cunn_SoftMaxForwardSmem: ILP-element vectors t, t + T, ...
        for start in range(0, N, T * ILP):
            for i in tl.static_range(ILP):
                c = start + t * ILP + i
                p = _addexp_f32(p, xb, c, c < N, mx, LIBDEVICE)
    else:  # cunn_SoftMaxForward's ilpReduce, the row starting `shift` elements past a 16-byte boundary
        shift = ((misalign + row * N) % ILP).to(tl.int32)
        c0 = t - shift  # shift > 0: thread t >= shift first takes element t - shift, the rest starts at T - shift
        p = _addexp_f32(p, xb, c0, (c0 >= 0) & (c0 < t) & (c0 < N), mx, LIBDEVICE)  # c0 < t: shift > 0
        base = tl.where(shift > 0, T - shift, 0)
        size = N - base
        vec_end = size - size % (ILP * T)
        for start in range(0, vec_end, T * ILP):
            for i in tl.static_range(ILP):
                cv = start + t * ILP + i
                p = _addexp_f32(p, xb, base + cv, cv < vec_end, mx, LIBDEVICE)
        for start in range(vec_end, size, T):
            ct = start + t
            p = _addexp_f32(p, xb, base + ct, ct < size, mx, LIBDEVICE)
    WARPS: tl.constexpr = T // 32
    per_warp = _tree(tl.reshape(p, (WARPS, 32)), 5)  # (WARPS, 1)
    total = tl.max(tl.max(_tree(tl.reshape(per_warp, (1, WARPS)), LOG_WARPS), axis=1), axis=0)  # the (1, 1) sum
    if stats_ptr is not None:
        tl.store(stats_ptr + 2 * row, mx)
        tl.store(stats_ptr + 2 * row + 1, total)
    else:
        yb = y_ptr + row * stride_y
        for start in range(0, N, BLOCK):
            c = start + offs
            ok = c < N
            v = tl.load(xb + c, mask=ok, other=0.0).to(tl.float32)
            y = tl.math.div_rn(exp_f32(v - mx, LIBDEVICE), total)
            tl.store(yb + c, y.to(y_ptr.dtype.element_ty), mask=ok)


@functools.lru_cache(maxsize=64)
def _smem_per_block(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block", 0)
                   or DEFAULT_SMEM_PER_BLOCK)
    return DEFAULT_SMEM_PER_BLOCK


def torch_order_path(N: int, element_size: int, misalign: int, smem_per_block: int = DEFAULT_SMEM_PER_BLOCK) -> int:
    """Which of ATen's kernels ``torch.softmax`` runs for a contiguous row of N elements (PATH_*).

    ``misalign``: the input's data pointer modulo 16, in elements (the output is a fresh,
    aligned allocation, as torch's). ``smem_per_block``: the device's ``sharedMemPerBlock``.
    """
    if N <= WARP_MAX_N and N * element_size <= WARP_MAX_BYTES:
        return PATH_WARP
    if cdiv(N, THREADS) < REG_MAX_COUNT:
        return PATH_REG
    ilp = ALIGN_BYTES // element_size
    max_elements = (smem_per_block - THREADS // WARP * 4) // element_size
    if N < max_elements and misalign == 0 and N % ilp == 0:
        return PATH_SMEM
    return PATH_ILP


def path_name(path: int) -> str:
    return _PATH_NAMES[path]


@functools.lru_cache(maxsize=4096)
def _plan(M: int, N: int, elem: int, misalign: int, device: torch.device) -> tuple:
    """(path, kernel, grid, meta) of one launch: a pure function of its arguments, cached because the
    ``Softmax`` layer calls it on every forward (host time matters for small inputs)."""
    path = torch_order_path(N, elem, misalign, _smem_per_block(device))
    libdev = use_libdevice(device, _softmax_warp_order_kernel)
    if path == PATH_WARP:
        n2 = next_power_of_2(N)
        w = min(n2, WARP)
        # H200, bf16: tiles of ~4096 elements on 2 warps ran fastest (N = 128: 32 rows, 1024: 4, 2048: 2)
        interp = is_interpreter(_softmax_warp_order_kernel)
        rows = min(next_power_of_2(M), 64 if interp else max(1, min(32, 4096 // n2)))
        meta = meta_items(ROWS=rows, W=w, LOG_W=w.bit_length() - 1, ITERS=n2 // w, LIBDEVICE=libdev,
                          num_warps=2 if rows * n2 >= 2048 else 1, **launch_options(_softmax_warp_order_kernel))
        return path, _softmax_warp_order_kernel, (cdiv(M, rows),), meta
    meta = meta_items(PATH=path, ILP=ALIGN_BYTES // elem, T=THREADS, LOG_WARPS=(THREADS // WARP).bit_length() - 1,
                      BLOCK=2048, LIBDEVICE=libdev, num_warps=4, **launch_options(_softmax_block_order_kernel))
    return path, _softmax_block_order_kernel, (M,), meta


def softmax_torch_order(x2: torch.Tensor, y2: torch.Tensor) -> int:
    """y2 = softmax(x2, -1) in torch's order; x2, y2: (M, N) with unit column stride. Returns the path.

    torch runs on ``x2.contiguous()``: x2 itself when contiguous (its misalignment past a 16-byte
    boundary then selects and shifts ATen's vector loads), else an aligned copy; so does this.
    """
    return _launch(x2, y2, None)


def row_stats_torch_order(x2: torch.Tensor, stats: torch.Tensor) -> int:
    """stats[r] = (max, sum of exp(x - max)) of each row of x2 (M, N), the sum in the order of the kernel
    ``torch.softmax`` / ``torch.log_softmax`` run (ATen's log-softmax takes ``log`` of this same sum).
    ``stats``: (M, 2) fp32, contiguous; x2 as in :func:`softmax_torch_order`. Returns the path."""
    return _launch(x2, None, stats)


def _launch(x2, y2, stats) -> int:
    M, N = x2.shape
    # where torch's contiguous input starts past a 16-byte boundary, in elements (a copy is aligned)
    misalign = (x2.data_ptr() % ALIGN_BYTES) // x2.element_size() if x2.is_contiguous() else 0
    path, kernel, grid, meta = _plan(M, N, x2.element_size(), misalign, x2.device)
    stride_y = y2.stride(0) if y2 is not None else 0
    args = (x2, y2, stats, M, N, x2.stride(0), stride_y) if path == PATH_WARP else (
        x2, y2, stats, N, x2.stride(0), stride_y, misalign)
    launch(kernel, grid, args, meta, x2.device)
    return path


__all__ = ["PATH_ILP", "PATH_REG", "PATH_SMEM", "PATH_WARP", "path_name", "row_stats_torch_order",
           "softmax_torch_order", "torch_order_path"]
