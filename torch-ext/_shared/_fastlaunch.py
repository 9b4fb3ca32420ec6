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

__all__ = ["launch", "meta_items", "spec"]

_DIRECT_OK = [True]  # cleared once if this Triton's launcher cannot be called directly
_CACHE: dict = {}
_Tensor = torch.Tensor
_I32_MIN, _I32_END, _U64_START = -(2**31), 2**31, 2**63


def spec(args) -> tuple:
    """What Triton specialises a compiled kernel on, per argument (one flat pass: this runs on every call)."""
    return tuple([
        (a.dtype, not a.data_ptr() & 15) if isinstance(a, _Tensor)
        else (a == 1, not a & 15, 0 if _I32_MIN <= a < _I32_END else (1 if a < _U64_START else 2)) if type(a) is int
        else float if type(a) is float
        else (type(a), a) if a is None or type(a) is bool
        else a
        for a in args])


def _triton_launch(kernel, grid, args, meta):
    return kernel[grid](*args, **dict(meta))


def meta_items(**meta) -> tuple:
    """The ``meta`` argument of :func:`launch`: constexprs and launch options as a hashable tuple
    (build it once per configuration, e.g. in a ``functools.lru_cache``d function)."""
    return tuple(meta.items())


def _hooks_off() -> bool:
    """No launch hook set (a profiler's hooks need Triton's own launch path): None (older Triton) or an
    empty ``HookChain`` (``.calls``, Triton >= 3.5)."""
    runtime = _knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (enter is None or getattr(enter, "calls", None) == []) and (leave is None or getattr(leave, "calls", None) == [])


def _current_index(device_type: str):
    """Index of the current device of ``device_type`` (the one Triton launches on)."""
    if device_type == "cuda":
        return torch.cuda.current_device()
    module = getattr(torch, device_type, None)
    return module.current_device() if module is not None and hasattr(module, "current_device") else None


def launch(kernel, grid: tuple, args: tuple, meta: tuple, device: torch.device, fixed: tuple = (),
           fixed_spec: tuple = ()):
    """``kernel[grid](*args, **dict(meta))`` on ``device``, skipping Triton's binding after the first call.

    Args:
        kernel: a ``@triton.jit`` function whose parameters are ``args`` (positional,
            in order) followed by the constexprs named in ``meta``.
        grid: 1 to 3 ints.
        args: the runtime arguments (tensors, ints, floats, None).
        meta: constexprs and launch options (``num_warps``, ``enable_fp_fusion``, ...) as
            ``(name, value)`` pairs (:func:`meta_items`).
        device: the device of the tensors (its index selects the compiled kernel).
        fixed: more arguments after ``args`` that a caller keeps with a cached launch plan, and
            ``fixed_spec`` = ``spec(fixed)``, computed once with the plan (host time).
    """
    index = device.index
    if (_knobs is None or not _DIRECT_OK[0] or device.type == "cpu" or not hasattr(kernel, "device_caches")
            or not _hooks_off() or index != _current_index(device.type)):
        _triton_launch(kernel, grid, (*args, *fixed), meta)  # Triton's path: interpreter, hooks, another device
        return
    key = (id(kernel), index, meta, spec(args), fixed_spec)
    entry = _CACHE.get(key)
    if entry is None:
        compiled = _triton_launch(kernel, grid, (*args, *fixed), meta)
        names = kernel.arg_names[len(args) + len(fixed):]
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
        compiled.run(grid[0], g1, g2, get_stream(index), compiled.function, compiled.packed_metadata,
                     None, None, None, *args, *fixed, *tail)
    except TypeError:  # a launcher with another calling convention: Triton's path from now on
        _DIRECT_OK[0] = False
        _CACHE.clear()
        _triton_launch(kernel, grid, (*args, *fixed), meta)
