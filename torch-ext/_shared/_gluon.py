"""Gluon, Triton's explicit-layout dialect, for the sm_90 kernels (triton-attention's flash forward and backward,
triton-matmul's warp-specialised matmul): its imports, whether this Triton has what they use, and where they may run.

``AVAILABLE``: Gluon imports and has the Triton 3.6 forms the kernels are written in, ``warp_specialize`` taking
(function, args) pairs (3.5 took six arguments) and ``gl.num_warps``. Gluon is experimental: missing or renamed
pieces turn the Gluon paths off (the packages' ``tl`` kernels run instead), never a package. ``tma_load`` /
``tma_store``: the TMA copies under the name this Triton gives them (3.9 renamed them; the 3.6 names raise there;
the positional arguments are the same). The names below exist only where ``AVAILABLE``.
"""

from __future__ import annotations

import functools
import inspect

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
    AVAILABLE = (hasattr(gl, "num_warps") and hasattr(gl, "warp_specialize")
                 and "functions_and_args" in inspect.signature(gl.warp_specialize).parameters)
except ImportError:
    AVAILABLE = False

__all__ = ["AVAILABLE", "TensorDescriptor", "capability_90", "fence_async_shared", "gl", "gluon", "mbarrier",
           "shared_layout", "tma", "tma_load", "tma_store", "warpgroup_mma", "warpgroup_mma_wait"]


@functools.lru_cache(maxsize=16)
def capability_90(device: torch.device) -> bool:
    """Whether ``device`` is an NVIDIA GPU of compute capability 9.0 exactly: warpgroup MMA (``wgmma``) and
    ``setmaxnreg`` exist only on sm_90a."""
    return (device.type == "cuda" and torch.version.hip is None and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device) == (9, 0))


@functools.lru_cache(maxsize=None)
def shared_layout(block_shape: tuple, dtype: torch.dtype):
    """The NVMMA shared-memory layout of a tensor-descriptor block of ``block_shape`` and ``dtype`` (fp16/bf16), where
    ``AVAILABLE``. Cached: building one costs several µs of Python, and every call's descriptors need one."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl.bfloat16 if dtype == torch.bfloat16
                                                else gl.float16)
