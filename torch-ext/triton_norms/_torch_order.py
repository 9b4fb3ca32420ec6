"""Host side of the bit-exact kernels: which thread of a PyTorch CUDA kernel adds which element.

fp32 addition is not associative, so a norm is bit-exact to PyTorch only if its
row statistics are summed in the same order as PyTorch's CUDA kernels (torch
2.x; written from the order of operations of ATen's ``Reduce.cuh``,
``ReduceMomentKernel.cu``, ``layer_norm_kernel.cu``, ``block_reduce.cuh`` and
``SharedReduceOps.h``). Three orders are reproduced:

``ORDER_MEAN`` (1)
    ``x.float().pow(2).mean(-1)`` (transformers' RMSNorms): the generic reduce
    kernel over a contiguous fp32 (M, N) tensor. :func:`mean_config` ports its
    launch configuration (``setReduceConfig``): ``bw`` threads along the row
    (``block.x``), ``bhr`` warps sharing one row (``block.y`` when the row is
    split across warps, else 1), ``ctas`` blocks per row (global reduce). Each
    thread keeps 4 accumulators (one per lane of a 4-float vector load, or per
    unrolled step when N < 128), adds its elements in order, combines the 4
    in order; then ``block_x_reduce`` (a halving tree in shared memory down to
    a warp, then ``shfl_down`` with offsets 16, 8, ..., 1), then
    ``block_y_reduce`` (a halving tree over ``block.y``); a global reduce ends
    with the y tree, then the x tree; finally ``sum * factor`` with
    ``factor = float(M) / float(M * N)``. Read from torch 2.13's ``Reduce.cuh``
    (decreasing shuffle offsets; torch <= 2.9 paired adjacent lanes).
``ORDER_FUSED`` (2)
    ``F.rms_norm`` / ``F.layer_norm`` (``torch.nn.RMSNorm``, ``torch.nn.LayerNorm``):
    ``vectorized_layer_norm_kernel`` when :func:`fused_vectorized` is true
    (128 threads, thread ``t`` reads 4-element vectors ``t, t + 128, ...``;
    RMS: ``fma(x, x, s)``; LayerNorm: a Welford update per element; then
    halving trees over the 32 lanes and over the 4 warps), else
    ``RowwiseMomentsCUDAKernel`` (512 threads, thread ``j`` reads ``j, j + 512, ...``,
    ATen's generic Welford, ``BlockReduce``).
``ORDER_FAST`` (0)
    this package's own order (``tl.sum``): fastest, within an ulp or two.

The configuration only depends on the shape and on the device's multiprocessor
count and threads per multiprocessor (H200 values on the CPU, so the
interpreter runs the same arithmetic as the GPU).
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import torch

ORDER_FAST = 0
ORDER_MEAN = 1
ORDER_FUSED = 2

# ATen constants (CUDA build)
REDUCE_MAX_THREADS = 512  # mnt_wrapper<float>::MAX_NUM_THREADS
REDUCE_VEC = 4  # input_vec_size of a float reduction (vt0 = 4)
LN_VEC_THREADS = 128  # num_threads() = 4 warps for vectorized_layer_norm_kernel
LN_VEC = 4  # vec_size of layer_norm_kernel.cu
ROWWISE_THREADS = 512  # cuda_utils::kCUDABlockReduceNumThreads
WARP = 32
# H200 (SXM): used on the CPU and when torch does not report the values
DEFAULT_SMS = 132
DEFAULT_THREADS_PER_SM = 2048


_ORDERS = {None: ORDER_FAST, "mean": ORDER_MEAN, "fused": ORDER_FUSED}


def parse_order(name, allowed: tuple = ("mean", "fused")) -> int:
    """``torch_order`` argument -> ORDER_*: None or one of ``allowed`` (of "mean" and "fused").

    Raises:
        TypeError: neither None nor a string. ValueError: a string not in ``allowed``; both name the values allowed.
    """
    if name is not None and name not in allowed:
        names = "None, " + ", ".join(repr(a) for a in allowed)
        if not isinstance(name, str):
            raise TypeError(f"torch_order must be one of {names}; got {type(name).__name__} {name!r}")
        raise ValueError(f"torch_order must be one of {names}; got {name!r}")
    return _ORDERS[name]


def _last_pow2(n: int) -> int:
    return max(1, 1 << (int(n).bit_length() - 1)) if n > 0 else 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _log2(n: int) -> int:
    return int(n).bit_length() - 1


@dataclass(frozen=True)
class MeanConfig:
    """How ATen's generic reduce kernel sums one row of a contiguous fp32 (M, N) tensor."""

    vec: bool  # 4-float vector loads along the row (N >= 128: Reduce.cuh's dim0 >= 128)
    bw: int  # threads along the row in a block (block.x)
    bhr: int  # warps (block.y rows) sharing one row; 1 if each warp owns a row
    ctas: int  # blocks per row (> 1: partial sums staged in global memory)
    bh: int  # block.y of the launch (threads of the final global-reduce block: bh * bw)
    iters: int  # loop trips per thread (vectors when vec, groups of 4 elements otherwise)
    factor: float  # float32(M) / float32(M * N), the mean's multiplier


@functools.lru_cache(maxsize=64)
def device_limits(device: torch.device) -> tuple:
    """(multiprocessors, max threads per multiprocessor) of a CUDA device; H200 values otherwise."""
    if device.type == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(device)
        return (int(p.multi_processor_count),
                int(getattr(p, "max_threads_per_multi_processor", DEFAULT_THREADS_PER_SM) or DEFAULT_THREADS_PER_SM))
    return DEFAULT_SMS, DEFAULT_THREADS_PER_SM


@functools.lru_cache(maxsize=4096)
def mean_config(M: int, N: int, num_sms: int = DEFAULT_SMS,
                threads_per_sm: int = DEFAULT_THREADS_PER_SM) -> MeanConfig:
    """``setReduceConfig`` for ``mean(-1)`` of a contiguous fp32 (M, N) tensor (M, N >= 1)."""
    vec = N >= 128  # reduction on the fastest dim, stride == sizeof(float), one reduced dim
    dim0 = N // REDUCE_VEC if vec else N
    dim1 = M
    mx = REDUCE_MAX_THREADS
    d0 = _last_pow2(dim0) if dim0 < mx else mx
    d1 = _last_pow2(dim1) if dim1 < mx else mx
    bw = min(d0, WARP)
    bh = min(d1, mx // bw)
    bw = min(d0, mx // bh)
    step_in, step_out = bw, 1
    split = _cdiv(N, step_in) >= min(bh * 16, 256)
    if split:
        step_in *= bh
    else:
        step_out *= bh
    ctas = 1
    target = num_sms * (threads_per_sm // (bw * bh))
    vpt = _cdiv(N, step_in)
    grid = _cdiv(M, step_out)
    if split and vpt >= 256 and grid <= target:
        ctas = max(min(_cdiv(target, grid), _cdiv(vpt, 16)), _cdiv(vpt, 256))
    bhr = bh if split else 1
    T = bw * bhr * ctas
    iters = _cdiv(N // REDUCE_VEC, T) if vec else _cdiv(_cdiv(N, T), 4)
    factor = (torch.tensor(M, dtype=torch.float32) / torch.tensor(M * N, dtype=torch.float32)).item()
    return MeanConfig(vec=vec, bw=bw, bhr=bhr, ctas=ctas, bh=bh, iters=max(iters, 1), factor=factor)


def mean_constexprs(cfg: MeanConfig) -> dict:
    """The kernel meta-parameters of a :class:`MeanConfig` (see ``_exact_stats.mean_sq_torch_order``)."""
    nt = cfg.bw * cfg.bhr
    cp = triton_next_pow2(cfg.ctas)
    return dict(
        VEC=cfg.vec, BW=cfg.bw, BHR=cfg.bhr, CTAS=cfg.ctas, CP=cp,
        LOG_BHR=_log2(cfg.bhr), LOG_BW=_log2(cfg.bw),
        LOG_PAD=_log2(max(nt // cp, 1)) if cfg.ctas > 1 else 0, LOG_WRAP=_log2(max(cp // nt, 1)),
    )


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def fused_vectorized(x: torch.Tensor, N: int, *params) -> bool:
    """True when ATen's ``F.layer_norm`` / ``F.rms_norm`` takes ``vectorized_layer_norm_kernel``.

    ``x`` as passed to torch (it makes it contiguous first: a copy is aligned);
    ``params`` the weight/bias tensors or None. Every buffer must be aligned to
    4 elements, N a multiple of 4 and at most 2**24.
    """
    if N % LN_VEC or N > (1 << 24) or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    align = LN_VEC * x.element_size()
    if x.is_contiguous() and x.data_ptr() % align:
        return False
    return all(p is None or (p.contiguous().data_ptr() % align == 0) for p in params)
