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
* host tensor descriptors (Triton's and Gluon's ``TensorDescriptor``): the type string Triton itself gives them
  (``mangle_type``: dtype, block shape, shared layout), not their shape or strides, which reach the kernel
  as run-time values;
* the meta-parameters (constexprs, ``num_warps``, ...) by value, the device by index.

Anything else (the Triton interpreter, launch hooks set by a profiler, a launcher whose
calling convention this Triton version does not share) takes Triton's own path. Triton launches on
the current device: tensors on another GPU (a model spread over GPUs with ``device_map="auto"``) are
launched with their GPU made current for the launch (:func:`_device_guard`), on every path.

Where the compiled kernel's launcher is Triton 3.5/3.6's Python wrapper around its C ``launch``
function (recognised by the names its ``__call__`` uses, see :func:`_bind`) and the kernel needs no
scratch memory, the wrapper is skipped too: the C function is called with the arguments the wrapper
would pass (a small rms_norm call on the H200 machine: 12.5 -> 11.2 us, A/B in one process).

:class:`Launch` is the same for a caller that keeps its launch plans (device, grid, meta-parameters
and scalar arguments fixed per shape): each plan keeps its own compiled launchers, keyed by the
pointer arguments' dtypes and alignment only, so a call neither hashes the meta-parameters nor
specialises the scalars again. :class:`FixedLaunch` is a plan whose caller's key fixes all of that
(pointer dtypes and alignment included): one compiled launcher and no per-call key, host tensor
descriptors included (:func:`rebase` makes a plan's descriptor per call), its scalars kept with the
launcher (``fixed``), and integer addresses in place of tensors once a call with tensors has compiled it
(:meth:`FixedLaunch.at`); :meth:`Launch.pinned` turns a Launch into one. A new FixedLaunch's first
launch takes the compiled launcher of an equal specialisation from :func:`launch`'s cache where there
is one, so a new plan costs no pass through Triton's launch path.
"""

from __future__ import annotations

import threading

import torch

try:  # where launch hooks live (Triton >= 3.4); older versions always take Triton's own path
    from triton import knobs as _knobs
except ImportError:
    _knobs = None


def _descriptor_types() -> tuple:
    """The host tensor-descriptor classes of this Triton (none where it has no ``mangle_type``: a descriptor is then
    keyed as itself, which is unhashable, and :func:`launch` takes Triton's own path)."""
    try:
        from triton.runtime.jit import mangle_type  # noqa: F401
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return ()
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    except ImportError:
        return (TensorDescriptor,)
    return TensorDescriptor, GluonDescriptor


_DESCRIPTORS = _descriptor_types()
if _DESCRIPTORS:
    from triton.runtime.jit import mangle_type as _mangle_type

__all__ = ["FixedLaunch", "Launch", "PlanCache", "descriptor_template", "launch", "meta_items", "rebase", "signature",
           "spec"]

_DIRECT_OK = [True]  # cleared once if this Triton's launcher cannot be called directly
_ADDRESSES_OK = [True]  # cleared once if this Triton's launcher takes no integer addresses for pointers
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
        else _mangle_type(a, True) if isinstance(a, _DESCRIPTORS)
        else a
        for a in args])


def _triton_launch(kernel, grid, args, meta, device=None):
    """``kernel[grid](*args, **meta)`` on ``device`` (None: the current device): Triton launches on the current
    device, so a tensor's device that is not current (a model spread over GPUs, ``device_map="auto"``) is made
    current for the launch."""
    if device is not None and _elsewhere(device):
        with _device_guard(device):
            return kernel[grid](*args, **dict(meta))
    try:
        return kernel[grid](*args, **dict(meta))
    except Exception as err:
        # the interpreter's kernels were decorated with TRITON_INTERPRET=1 set, but triton itself was imported
        # before it: its language functions then refuse the interpreter's calls with a message naming neither
        if type(kernel).__name__ == "InterpretedFunction" and "outside of the scope of a kernel" in str(err):
            raise RuntimeError("TRITON_INTERPRET=1 was set after triton had been imported: set it before the first "
                               "import of triton (and of torch-ext packages), e.g. in the shell") from err
        raise


def _elsewhere(device: torch.device) -> bool:
    """Whether ``device`` is a GPU other than the current one of its type."""
    return device.type != "cpu" and device.index is not None and device.index != _current_index(device.type)


def _off_direct(plan, args: tuple) -> None:
    """A :class:`Launch` or :class:`FixedLaunch` call that its direct path does not take: on a GPU other than the
    current one, the call again with that GPU made current; Triton's own path otherwise (the interpreter, launch
    hooks, a launcher of another calling convention, a device without an index)."""
    if plan._current is not None and _DIRECT_OK[0] and _hooks_off() and plan._index is not None:
        with _device_guard(plan.device):
            plan(args)
        return
    _triton_launch(plan.kernel, plan.grid, (*args, *plan.fixed), plan.meta, plan.device)


def _device_guard(device: torch.device):
    """A context manager making ``device`` the current device of its type (``torch.cuda.device`` and the like)."""
    return getattr(torch, device.type).device(device.index)


def meta_items(**meta) -> tuple:
    """The ``meta`` argument of :func:`launch`: constexprs and launch options as a hashable tuple
    (build it once per configuration, e.g. in a ``functools.lru_cache``d function)."""
    return tuple(meta.items())


def _hooks_off() -> bool:
    """No launch hook set (a profiler's hooks need Triton's own launch path): None (older Triton) or an
    empty ``HookChain`` (``.calls``, Triton >= 3.5)."""
    runtime = _knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True))


def _current_index(device_type: str):
    """Index of the current device of ``device_type`` (the one Triton launches on)."""
    if device_type == "cuda":
        return _cuda_current_device()
    module = getattr(torch, device_type, None)
    return module.current_device() if module is not None and hasattr(module, "current_device") else None


# torch.cuda.current_device() without its Python wrapper (the binding initialises CUDA itself)
_cuda_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _direct(kernel, device: torch.device) -> bool:
    """Whether a launch of ``kernel`` on ``device`` may call a compiled launcher directly: a compiled
    (not interpreted) kernel, a Triton with launch hooks but none set, and ``device`` is the current
    device (where Triton launches)."""
    return (_DIRECT_OK[0] and device.type != "cpu" and hasattr(kernel, "device_caches") and _knobs is not None
            and _hooks_off() and device.index == _current_index(device.type))


# The global names (attributes, modules) that Triton 3.5/3.6's ``CudaLauncher.__call__(self, gridX, gridY, gridZ,
# stream, function, *args)`` uses: it allocates the two scratch buffers (None when their size is 0), then calls
# ``self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,
# global_scratch, profile_scratch, *args)``. Any other body uses other names and keeps the wrapper.
_WRAPPER_NAMES = frozenset({"global_scratch_size", "global_scratch_align", "_allocation", "_allocator",
                            "profile_scratch_size", "profile_scratch_align", "_profile_allocator", "launch",
                            "launch_cooperative_grid", "launch_pdl"})
_WRAPPER_ARGS = ("self", "gridX", "gridY", "gridZ", "stream", "function")


def _bind(compiled) -> tuple:
    """``(launch, head)``: ``launch(gx, gy, gz, stream, *head, *kernel_args)`` launches ``compiled`` with no
    launch hooks. ``launch`` is Triton's C function where the launcher wraps it in the known form and the kernel
    needs no scratch memory (then the wrapper's two scratch buffers are None), else the launcher itself."""
    run = compiled.run
    head = (compiled.function, compiled.packed_metadata, None, None, None)  # metadata, launch metadata, 2 hooks
    code = getattr(getattr(type(run), "__call__", None), "__code__", None)
    if (code is not None and code.co_argcount == len(_WRAPPER_ARGS) and code.co_varnames[:len(_WRAPPER_ARGS)] == _WRAPPER_ARGS
            and code.co_flags & 0x04 and frozenset(code.co_names) == _WRAPPER_NAMES  # 0x04: CO_VARARGS
            and callable(getattr(run, "launch", None)) and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None, *head[1:])
    return run, head


def _first_launch(kernel, grid, args: tuple, meta: tuple):
    """Launches through Triton; returns ``(compiled kernel, the constexpr values after args)``, or None."""
    compiled = _triton_launch(kernel, grid, args, meta)
    if compiled is None:
        return None
    given = dict(meta)
    defaults = {p.name: p.default for p in kernel.params}
    return compiled, tuple(given[n] if n in given else defaults[n] for n in kernel.arg_names[len(args):])


def _compile(kernel, grid, args: tuple, meta: tuple, fixed: tuple = ()):
    """Launches through Triton; returns a plan's entry ``(launch, head (_bind), stream getter, fixed + the
    constexpr values, compiled kernel)``, or None. The compiled kernel is kept: the loaded function lives as long
    as it does."""
    first = _first_launch(kernel, grid, args, meta)
    if first is None:
        return None
    from triton.runtime import driver

    compiled, tail = first
    return (*_bind(compiled), driver.active.get_current_stream, (*fixed, *tail), compiled)


def _direct_run(entry, grid3: tuple, index, args: tuple) -> bool:
    """Launches ``args`` with a plan's entry (``_compile``) on the current stream of device ``index``; False,
    launching nothing, where the launcher rejects the call (another calling convention: the caller falls back)."""
    run, head, get_stream, tail, _ = entry
    try:
        run(*grid3, get_stream(index), *head, *args, *tail)
    except TypeError:
        return False
    return True


def _current_getter(kernel, device: torch.device):
    """The function a plan on ``device`` asks for the current device's index, or None where it never launches
    directly (the interpreter, CPU tensors, a Triton without launch hooks)."""
    kind = device.type
    if kind == "cpu" or not hasattr(kernel, "device_caches") or _knobs is None:
        return None
    return _cuda_current_device if kind == "cuda" else lambda: _current_index(kind)


def _fall_back(kernel, grid, args: tuple, meta: tuple) -> None:
    """A launcher with another calling convention: Triton's path for every launch from now on."""
    _DIRECT_OK[0] = False
    _CACHE.clear()
    _triton_launch(kernel, grid, args, meta)


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
    if not _direct(kernel, device):
        if _elsewhere(device):  # a GPU that is not the current one: launch with it made current
            with _device_guard(device):
                launch(kernel, grid, args, meta, device, fixed, fixed_spec)
            return
        _triton_launch(kernel, grid, (*args, *fixed), meta)  # Triton's path: interpreter, hooks
        return
    index = device.index
    key = (id(kernel), index, meta, spec(args), fixed_spec)
    try:
        cached = _CACHE.get(key)
    except TypeError:  # an argument spec() cannot key (unhashable): Triton's path
        _triton_launch(kernel, grid, (*args, *fixed), meta)
        return
    if cached is None:
        entry = _compile(kernel, grid, (*args, *fixed), meta)
        if entry is not None and len(_CACHE) < 65536:
            _CACHE[key] = entry, kernel  # the kernel too: the key holds its id
        return
    if not _direct_run(cached[0], (*grid, 1, 1)[:3], index, (*args, *fixed)):
        _fall_back(kernel, grid, (*args, *fixed), meta)  # another calling convention: Triton's path from now on


class Launch:
    """One launch plan: ``kernel[grid](*ptrs, *fixed, **dict(meta))`` on ``device``, pointers given per call.

    A caller builds one per configuration (shape, strides, dtypes, device: everything but the data
    pointers) and keeps it. Calling it launches like :func:`launch`, from a cache of its own keyed only
    by the pointer arguments' dtypes and 16-byte alignment: the plan's device, meta-parameters and
    scalars are the same on every call, so they are neither read nor keyed again.

    :meth:`at` launches with integer device addresses instead of tensors (no views to build, no dtypes
    to read), reusing what a call with tensors of the same alignment compiled.

    Args:
        kernel: a ``@triton.jit`` function whose parameters are the pointer arguments, then
            ``fixed``, then the constexprs named in ``meta``.
        grid: 1 to 3 ints.
        meta: constexprs and launch options as ``(name, value)`` pairs (:func:`meta_items`).
        fixed: the scalar arguments (ints, floats, None) after the pointers.
        device: the device of the tensors.
    """

    __slots__ = ("kernel", "grid", "meta", "fixed", "device", "_index", "_current", "_grid3", "_compiled",
                 "_by_address", "_dtypes")

    def __init__(self, kernel, grid: tuple, meta: tuple, fixed: tuple, device: torch.device):
        self.kernel, self.grid, self.meta, self.fixed, self.device = kernel, tuple(grid), meta, tuple(fixed), device
        self._index = device.index
        self._current = _current_getter(kernel, device)
        self._grid3 = (*self.grid, 1, 1)[:3]
        self._compiled: dict = {}  # pointer specs -> (launch, head (_bind), stream getter, scalars + tail, compiled)
        self._by_address: dict = {}  # the same entries keyed by 16-byte alignment alone, for at()
        self._dtypes = None  # the pointers' dtypes while every call had the same, else False (at() then unused)

    def __call__(self, ptrs: tuple) -> None:
        """Launches with the pointer arguments ``ptrs`` (tensors or None), in the kernel's order."""
        current = self._current
        if current is None or not _DIRECT_OK[0] or not _hooks_off() or self._index != current():
            _off_direct(self, ptrs)
            return
        key = tuple([None if a is None else (a.dtype, not a.data_ptr() & 15) for a in ptrs])
        entry = self._compiled.get(key)
        if entry is None:
            entry = _compile(self.kernel, self.grid, (*ptrs, *self.fixed), self.meta, self.fixed)
            if entry is not None and len(self._compiled) < 256:
                self._compiled[key] = entry
                dtypes = tuple([None if a is None else a.dtype for a in ptrs])
                self._dtypes = dtypes if self._dtypes in (None, dtypes) else False
                self._by_address[tuple([None if k is None else k[1] for k in key])] = entry
            return
        if not _direct_run(entry, self._grid3, self._index, ptrs):
            _fall_back(self.kernel, self.grid, (*ptrs, *self.fixed), self.meta)

    def pinned(self) -> "FixedLaunch":
        """This plan as a :class:`FixedLaunch` (the same kernel, grid, meta-parameters and scalars) for a caller whose
        own key fixes the pointers' dtypes and 16-byte alignment: a call then builds no key and looks nothing up."""
        return FixedLaunch(self.kernel, self.grid, self.meta, self.device, self.fixed)

    def at(self, addrs: tuple) -> bool:
        """Launches with the device addresses ``addrs`` (ints, or None for an absent pointer) in place of the
        pointer tensors, where a call with tensors of the same 16-byte alignment has compiled the kernel and every
        call so far had the same dtypes (the caller's plan fixes them). Returns False, launching nothing,
        otherwise: the caller then calls the plan with tensors."""
        current = self._current
        if (current is None or not self._dtypes or not _DIRECT_OK[0] or not _ADDRESSES_OK[0] or not _hooks_off()
                or self._index != current()):
            return False
        entry = self._by_address.get(tuple([None if a is None else not a & 15 for a in addrs]))
        if entry is None:
            return False
        if not _direct_run(entry, self._grid3, self._index, addrs):  # a launcher that takes only tensors
            _ADDRESSES_OK[0] = False
            return False
        return True


class FixedLaunch:
    """One launch plan whose every argument's specialisation the caller's plan key fixes:
    ``kernel[grid](*args, **dict(meta))`` on ``device``, all arguments given per call.

    The caller keys its plans on everything Triton specialises ``args`` on (pointer dtypes and 16-byte
    alignment, the scalars' values, tensor descriptors' dtype, block shape and layout), so the kernel the
    first call compiles serves every call: no key is built or looked up per call, and arguments that
    :func:`spec` does not read, such as host tensor descriptors, are passed through to the launcher.

    Args:
        kernel: a ``@triton.jit`` (or Gluon) function whose parameters are ``args``, then ``fixed``, then the
            constexprs named in ``meta``.
        grid: 1 to 3 ints.
        meta: constexprs and launch options as ``(name, value)`` pairs (:func:`meta_items`).
        device: the device of the tensors.
        fixed: runtime arguments after ``args`` that are the same on every call (scalars), kept with the
            compiled launcher: a call passes only ``args``.
    """

    __slots__ = ("kernel", "grid", "meta", "fixed", "device", "_index", "_current", "_grid3", "_entry")

    def __init__(self, kernel, grid: tuple, meta: tuple, device: torch.device, fixed: tuple = ()):
        self.kernel, self.grid, self.meta, self.fixed = kernel, tuple(grid), meta, tuple(fixed)
        self.device, self._index = device, device.index
        self._current = _current_getter(kernel, device)
        self._grid3 = (*self.grid, 1, 1)[:3]
        self._entry = None  # _compile's entry (fixed prepended to its tail) after the first direct-capable call

    def __call__(self, args: tuple) -> None:
        """Launches with ``args``, the kernel's runtime arguments in order (before ``fixed``)."""
        current = self._current
        if current is None or not _DIRECT_OK[0] or not _hooks_off() or self._index != current():
            _off_direct(self, args)
            return
        entry = self._entry
        if entry is None:
            entry = _shared_entry(self.kernel, self.grid, self._grid3, self._index, (*args, *self.fixed), self.meta)
            if entry is not None:
                run, head, get_stream, tail, compiled = entry
                self._entry = run, head, get_stream, (*self.fixed, *tail), compiled
            return
        if not _direct_run(entry, self._grid3, self._index, args):
            _fall_back(self.kernel, self.grid, (*args, *self.fixed), self.meta)

    def at(self, addrs: tuple) -> bool:
        """Launches with integer device addresses (None for an absent pointer) in place of the pointer tensors of
        ``args``, where a call with tensors has compiled the kernel (the caller's key fixes their dtypes and
        alignment): Triton's launcher then reads no tensor attribute. Returns False, launching nothing,
        otherwise: the caller then calls the plan with tensors."""
        current, entry = self._current, self._entry
        if (entry is None or current is None or not _DIRECT_OK[0] or not _ADDRESSES_OK[0] or not _hooks_off()
                or self._index != current()):
            return False
        if not _direct_run(entry, self._grid3, self._index, addrs):  # a launcher that takes only tensors
            _ADDRESSES_OK[0] = False
            return False
        return True


def _shared_entry(kernel, grid, grid3: tuple, index, args: tuple, meta: tuple):
    """Launches ``args`` and returns the compiled entry (``_compile``) for a new plan: the one :func:`launch` or an
    earlier plan keeps for the same kernel, device, meta-parameters and specialisation (``spec``), without Triton's
    own launch path (a workload whose call signatures keep changing, such as decode steps over a growing KV cache,
    makes a plan per call), else a new one compiled through Triton; None where this Triton's launcher cannot be
    called directly (then every launch takes Triton's path)."""
    key = (id(kernel), index, meta, spec(args), ())
    try:
        cached = _CACHE.get(key)
    except TypeError:  # an argument spec() cannot key: not shared
        return _compile(kernel, grid, args, meta)
    if cached is not None:
        if _direct_run(cached[0], grid3, index, args):
            return cached[0]
        _fall_back(kernel, grid, args, meta)
        return None
    entry = _compile(kernel, grid, args, meta)
    if entry is not None and len(_CACHE) < 65536:
        _CACHE[key] = entry, kernel  # the kernel too: the key holds its id
    return entry


def rebase(desc, base):
    """A copy of the host tensor descriptor ``desc`` (Triton's or Gluon's ``TensorDescriptor``) on ``base``, a
    tensor of desc's dtype, 16-byte aligned, that the same shape, strides and block shape fit: the constructor's
    checks, which ran on ``desc``, are not repeated (several microseconds of host time per descriptor)."""
    out = object.__new__(type(desc))
    out.__dict__.update(desc.__dict__)
    out.base = base
    return out


def descriptor_template(cls, t: torch.Tensor, block_shape: list, *layout):
    """A host tensor descriptor (Triton's or Gluon's ``TensorDescriptor``, ``layout`` the latter's shared layout) of
    all of ``t`` (its shape and strides) that keeps no tensor: built once per plan (the constructor's checks run
    here), rebased on each call's tensor with :func:`rebase`."""
    return rebase(cls(t, list(t.shape), list(t.stride()), list(block_shape), *layout), None)


def signature(t):
    """What a launch plan depends on of a tensor argument: shape, strides, dtype, device and whether its data starts
    on 16 bytes (TMA, and Triton's pointer specialisation); None for an absent one. Part of a plan's key."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, not t.data_ptr() & 15)


class PlanCache(dict):
    """Launch plans kept per call signature (a key of shapes, strides, dtypes, device and flags).

    A dict whose :meth:`add` keeps at most ``MAX_PLANS`` entries, dropping the oldest plan for a new one: a
    program that passes through endless shapes (decode steps over a growing KV cache) neither grows memory
    without bound nor leaves the signatures it repeats later without a plan.
    """

    MAX_PLANS = 4096
    _ADD_LOCK = threading.Lock()  # adds only (new signatures): lookups stay plain dict reads

    def add(self, key, plan):
        """Keeps ``plan`` under ``key``, dropping the oldest plan when full; returns ``plan``. Safe from several
        threads at once (two threads evicting together could otherwise drop one key twice: KeyError)."""
        with self._ADD_LOCK:
            if len(self) >= self.MAX_PLANS:
                del self[next(iter(self))]
            self[key] = plan
        return plan

