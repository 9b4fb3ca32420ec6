"""Device facts and launch guards every package of the collection shares.

``triton-collection build`` copies the modules of ``torch-ext/_shared/`` into each
package (a Hub package may import only the standard library, torch, triton and
itself), so this file is written once and shipped in every build.
"""

from __future__ import annotations

import functools
import os
import re

import torch

__all__ = ["MAX_GRID_YZ", "MAX_THREADS_PER_PROGRAM", "cdiv", "check_bool", "check_config_args", "check_dense", "check_flag", "check_int",
           "check_launch_device", "check_warp_size", "config_cache", "device_warp_size", "is_interpreter",
           "launch_options", "next_power_of_2", "tma_descriptor_ok"]

# Threads per program allowed by NVIDIA (32-lane warps) and AMD (64-lane wavefronts) hardware alike.
MAX_THREADS_PER_PROGRAM = 1024
MAX_GRID_YZ = 65535  # programs along a launch grid's second and third axes (CUDA; HIP allows more)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (b > 0): ``triton.cdiv`` without the wrapper Triton >= 3.5 puts around it
    (a ``constexpr_function``: ~5 us per host call, on every launch of a backward or a grid)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1): ``triton.next_power_of_2`` for host code, as :func:`cdiv`."""
    return 1 << max(n - 1, 0).bit_length()


def config_cache(maxsize: int):
    """``functools.lru_cache(maxsize, typed=True)`` for a public config picker that checks its arguments (typed: 2.0
    or True must not hit a checked 2 / 1). An unhashable argument (a list, a tensor) is not a cache miss but
    lru_cache's "unhashable type" TypeError, which names no argument: the picker then runs uncached, so that its
    own checks name the argument, and the TypeError is raised where they pass. ``cache_clear`` and ``cache_info``
    are the cache's."""
    def decorate(picker):
        cached = functools.lru_cache(maxsize=maxsize, typed=True)(picker)

        @functools.wraps(picker)
        def pick(*args, **kwargs):
            try:
                return cached(*args, **kwargs)
            except TypeError as err:
                if "unhashable" not in str(err):
                    raise
            picker(*args, **kwargs)  # its checks raise, naming the argument
            return cached(*args, **kwargs)  # they passed: lru_cache's TypeError again

        pick.cache_clear, pick.cache_info = cached.cache_clear, cached.cache_info
        return pick

    return decorate


@functools.lru_cache(maxsize=64)
def device_warp_size(device: torch.device) -> int:
    """Lanes per warp of ``device``: the device property where torch has it (64 on AMD CDNA), else 32."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(device), "warp_size", 32))
    return 32


def check_dense(name: str, t: torch.Tensor) -> None:
    """TypeError unless tensor ``t`` is dense (the strided layout, not nested): the kernels read memory through
    strides. The plain-inference fast paths do not call this (host time): a sparse or nested tensor fails their
    plan key (no strides or storage), and they leave such a call to the general path, whose checks call it."""
    if t.layout is not torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor")


def check_int(name: str, value, low: int) -> None:
    """ValueError unless ``value`` is an int (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_bool(name: str, value) -> None:
    """ValueError unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def check_flag(name: str, value) -> None:
    """TypeError unless an op's flag argument is a bool (``bool("false")`` would read as True). Config pickers
    use :func:`check_bool` (ValueError)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_warp_size(warp_size: int) -> None:
    """ValueError unless ``warp_size`` is an int, a power of two in [1, 1024]."""
    check_int("warp_size", warp_size, 1)
    if warp_size > MAX_THREADS_PER_PROGRAM or warp_size & (warp_size - 1):
        raise ValueError(f"warp_size must be a power of two in [1, 1024], got {warp_size}")


def check_config_args(N: int, element_size: int, warp_size: int) -> None:
    """The arguments every ``pick_config`` takes: ValueError unless N and element_size are ints >= 1 and
    warp_size passes :func:`check_warp_size`."""
    check_int("N", N, 1)
    check_int("element_size", element_size, 1)
    check_warp_size(warp_size)


def is_interpreter(kernel) -> bool:
    """True when ``kernel`` was decorated while ``TRITON_INTERPRET=1`` was set."""
    return type(kernel).__name__ == "InterpretedFunction"


def _package_name() -> str:
    """This package's Python name for messages (``triton_norms``): a build's module is named
    ``_<python name>_<backend>_<hash>`` (the `_ops` namespace), which says nothing more to a user."""
    return re.sub(r"_(cpu|cuda|rocm|xpu)_[0-9a-f]+$", "", (__package__ or "this package").lstrip("_"))


def check_launch_device(x: torch.Tensor, kernel) -> None:
    """Raises a clear error before launching ``kernel`` on a tensor it cannot run on.

    Raises:
        RuntimeError: ``x`` is on the CPU but the Triton kernels were compiled for a GPU
            (``TRITON_INTERPRET=1`` was not set before ``triton`` was first imported); ``x`` is a meta tensor
            (no data to run a kernel on).
    """
    kind = x.device.type
    if kind == "meta":
        package = _package_name()
        raise RuntimeError(f"{package} got a meta tensor, which has no data to run a kernel on; for shapes alone "
                           f"run the call under torch._subclasses.FakeTensorMode (or torch.compile)")
    if kind == "cpu" and not is_interpreter(kernel):
        value = os.environ.get("TRITON_INTERPRET")
        if value == "1":
            why = "TRITON_INTERPRET=1 was set after triton had been imported; set it before the first import of triton"
        else:
            why = ("set the environment variable TRITON_INTERPRET=1 before importing triton and this kernel "
                   f"(it is {'unset' if value is None else repr(value)})")
        package = _package_name()
        raise RuntimeError(f"{package} got a CPU tensor, but CPU tensors only run under the Triton interpreter: {why}.")


def launch_options(kernel, fp_fusion: bool = False) -> dict:
    """Keyword options for a kernel launch: ``enable_fp_fusion``, always named (the interpreter takes no such option).

    ``fp_fusion=False`` keeps ``a * b + c`` as two rounded operations, as PyTorch's eager elementwise ops compute
    it, instead of one fused multiply-add: needed wherever a kernel must match eager rounding bit for bit.
    ``fp_fusion=True`` lets the compiler contract them (kernels checked against tolerances: attention, matmul,
    modulate). Named rather than left to Triton's default, which is on up to Triton 3.9 and off from 3.10.
    """
    return {} if is_interpreter(kernel) else {"enable_fp_fusion": fp_fusion}


def tma_descriptor_ok(t: torch.Tensor) -> bool:
    """Whether a TMA tensor descriptor can take all of ``t``: unit last stride, a 16-byte aligned base and every other
    stride a positive multiple of 16 bytes (what a descriptor needs and asserts, for dimensions of size 1 too; a
    broadcast dimension, stride 0, is not one)."""
    e = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(st > 0 and (st * e) % 16 == 0 for st in t.stride()[:-1]))
