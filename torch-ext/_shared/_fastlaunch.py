"""Launching an already compiled Triton kernel without Triton's per-call argument binding.

``kernel[grid](*args, **meta)`` binds and specialises every argument on every call and
looks the compiled kernel up by that specialisation: about 12 us of host time per call
on the H200 machine for a 3-argument kernel, far more than a small kernel runs.
:func:`launch` does the first launch of each specialisation through Triton, keeps the
compiled kernel, and later calls its launcher directly (about 5 us there).

The cache key reproduces what Triton specialises a compiled kernel on, so a kernel is
only reused where Triton itself would reuse it:

* tensors: dtype and whether ``data_ptr()`` is a multiple of 16 bytes;
* integers: equal to 1, a multiple of 16, and the integer type (i32, i64, u64);
* floats are always fp32, ``None`` and booleans by value;
* the meta-parameters (constexprs, ``num_warps``, ...) by value, the device by index.

Anything else (the Triton interpreter, launch hooks set by a profiler, a launcher whose
calling convention this Triton version does not share) takes Triton's own path.
"""

from __future__ import annotations

import torch

try:  # where launch hooks live (Triton >= 3.4); older versions always take Triton's own path
    from triton import knobs as _knobs
except ImportError:
    _knobs = None

__all__ = ["launch", "meta_items"]

_I32 = (-(2**31), 2**31)
_DIRECT_OK = [True]  # cleared once if this Triton's launcher cannot be called directly
_CACHE: dict = {}


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if a is None or isinstance(a, bool):
        return (type(a), a)
    if isinstance(a, float):
        return float
    if isinstance(a, int):
        kind = 0 if _I32[0] <= a < _I32[1] else (1 if a < 2**63 else 2)
        return (a == 1, a % 16 == 0, kind)
    return a


def _triton_launch(kernel, grid, args, meta):
    return kernel[grid](*args, **dict(meta))


def meta_items(**meta) -> tuple:
    """The ``meta`` argument of :func:`launch`: constexprs and launch options as a hashable tuple
    (build it once per configuration, e.g. in a ``functools.lru_cache``d function)."""
    return tuple(meta.items())


def _direct_possible(kernel) -> bool:
    if _knobs is None or not _DIRECT_OK[0] or not hasattr(kernel, "device_caches"):  # interpreter: no compiled kernel
        return False
    return _no_hook(_knobs.runtime.launch_enter_hook) and _no_hook(_knobs.runtime.launch_exit_hook)


def _no_hook(hook) -> bool:
    """No launch hook: None (older Triton) or an empty ``HookChain`` (``.calls``, Triton >= 3.5)."""
    return hook is None or getattr(hook, "calls", None) == []


def _current_index(device: torch.device):
    """Index of the current device of ``device``'s type (the one Triton launches on)."""
    module = getattr(torch, device.type, None)
    return module.current_device() if module is not None and hasattr(module, "current_device") else None


def launch(kernel, grid: tuple, args: tuple, meta: tuple, device: torch.device):
    """``kernel[grid](*args, **dict(meta))`` on ``device``, skipping Triton's binding after the first call.

    Args:
        kernel: a ``@triton.jit`` function whose parameters are ``args`` (positional,
            in order) followed by the constexprs named in ``meta``.
        grid: 1 to 3 ints.
        args: the runtime arguments (tensors, ints, floats, None).
        meta: constexprs and launch options (``num_warps``, ``enable_fp_fusion``, ...) as
            ``(name, value)`` pairs (:func:`meta_items`).
        device: the device of the tensors (its index selects the compiled kernel).
    """
    if device.type == "cpu" or not _direct_possible(kernel) or device.index != _current_index(device):
        _triton_launch(kernel, grid, args, meta)  # Triton compiles and launches for the current device
        return
    key = (id(kernel), device.index, meta, tuple(map(_arg_key, args)))
    entry = _CACHE.get(key)
    if entry is None:
        compiled = _triton_launch(kernel, grid, args, meta)
        names = kernel.arg_names[len(args):]
        given = dict(meta)
        defaults = {p.name: p.default for p in kernel.params}
        tail = tuple(given[n] if n in given else defaults[n] for n in names)
        if compiled is not None and len(_CACHE) < 65536:
            from triton.runtime import driver

            _CACHE[key] = (compiled, tail, driver.active.get_current_stream, kernel)
        return
    compiled, tail, get_stream, _ = entry
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    try:
        compiled.run(grid[0], g1, g2, get_stream(device.index), compiled.function, compiled.packed_metadata,
                     None, None, None, *args, *tail)
    except TypeError:  # a launcher with another calling convention: Triton's path from now on
        _DIRECT_OK[0] = False
        _CACHE.clear()
        _triton_launch(kernel, grid, args, meta)
