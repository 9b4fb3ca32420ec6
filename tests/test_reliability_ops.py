"""Every registered op and every Hub layer of the collection, checked the way PyTorch checks its own ops.

Driven by ``reliability_catalog.CATALOG`` (one entry per package; a package added later registers
there). Per package:

* the catalog covers every public name (``__all__``) and every layer class (so nothing below
  silently skips a new op);
* ``torch.library.opcheck`` (schema, fake tensor, autograd registration, AOT dispatch static and
  dynamic) for every op registered in the build's namespace, with the arguments the public
  functions really pass (recorded under a dispatch mode while running every sample forward and
  backward); every op of the namespace must have been reached;
* case 5, GPU half (``@pytest.mark.gpu``, run by ``make gpu-test``): every op sample and layer
  under ``torch.compile(fullgraph=True)`` in inference and training equal to eager; captured in
  one CUDA graph and replayed on new data (forward, and forward + backward) equal to eager;
  run concurrently on several CUDA streams equal to the default-stream results.

The compile test also runs on the CPU (``aot_eager`` under the interpreter) with ``-m gpu``.
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .conftest import ROOT
from .reliability_catalog import CATALOG, COMPOSITE_LAYERS, as_tuple, clone_inputs, layer_names, loss_of, public_names

PACKAGES = sorted(CATALOG)
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-3, 1e-5), torch.bfloat16: (8e-3, 1e-5)}


def _pkg(request, name):
    return request.getfixturevalue(name)


def _runs(pkg, entry, device, *, dtype_index=-1):
    """(name, fn, make, grad, out_arg, dtype, params) for every op sample and layer of a package."""
    runs = []
    for s in entry.ops(pkg):
        runs.append((s.name, s.fn, s.make, tuple(s.grad), s.out_arg, s.dtypes[dtype_index], ()))
    for ls in entry.layers(pkg):
        dtype = ls.dtypes[dtype_index]
        module = ls.module(device, dtype)
        cls = getattr(pkg.layers, ls.name)
        fn = (lambda *xs, cls=cls, module=module: cls.forward(module, *xs))
        runs.append((f"layers.{ls.name}", fn, ls.make, tuple(ls.grad), -1, dtype, tuple(module.parameters())))
    return runs


def _assert_same(name, actual, expected, dtype, slack=1.0):
    """Equal within ``TOL[dtype]`` (its relative part times ``slack``); the absolute tolerance also scales with
    the tensor's largest finite magnitude: a gradient that sums many terms (a bias gradient, dq of attention) may
    be near 0 where the terms cancel, and another summation order (compile's fused reduction, another tile
    schedule) moves such an element by a few ulps of the terms, not of the result."""
    rtol, atol = TOL[dtype]
    rtol *= slack
    for i, (a, e) in enumerate(zip(as_tuple(actual), as_tuple(expected))):
        if not isinstance(e, torch.Tensor):
            continue
        assert a.shape == e.shape and a.dtype == e.dtype, f"{name} output {i}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
        e_ = e.detach()
        finite = e_[torch.isfinite(e_)] if e_.is_floating_point() else e_.new_empty(0)
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        torch.testing.assert_close(a, e, rtol=rtol, atol=max(atol, rtol * scale), equal_nan=True,
                                   msg=lambda m: f"{name} output {i}: {m}")


# ----------------------------------------------------------------------------- coverage


def test_catalog_has_every_package_of_the_manifest():
    """A package added to build.toml must register its samples in reliability_catalog (fixture = name - 'triton-')."""
    from triton_collection.manifest import load_manifest

    names = {p.name.removeprefix("triton-") for p in load_manifest(ROOT).packages}
    assert names <= set(CATALOG), f"packages without a reliability catalog entry: {sorted(names - set(CATALOG))}"


@pytest.mark.parametrize("package", PACKAGES)
def test_catalog_covers_every_public_name_and_layer(request, package):
    pkg = _pkg(request, package)
    entry = CATALOG[package]
    covered = {s.public for s in entry.ops(pkg)}
    missing = sorted(set(public_names(pkg, entry)) - covered)
    assert not missing, f"{package}: public names without a reliability sample: {missing}"
    layers = {ls.name for ls in entry.layers(pkg)}
    missing_layers = sorted(set(layer_names(pkg)) - layers)
    assert not missing_layers, f"{package}: layers without a reliability sample: {missing_layers}"


# ----------------------------------------------------------------------------- opcheck


class _Recorder(TorchDispatchMode):
    """Records calls of the ops in ``namespace`` (copies of the arguments, grad flags as they were)."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == self.namespace:
            grad = torch.is_grad_enabled()

            def copy(a):
                if not isinstance(a, torch.Tensor):
                    return a
                c = a.detach().clone()
                return c.requires_grad_(grad and a.requires_grad and c.is_floating_point())

            self.calls.setdefault(func, []).append(([copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


def _all_ops(namespace):
    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith(namespace + "::"))


@pytest.mark.parametrize("package", PACKAGES)
def test_opcheck_every_registered_op(request, package, device):
    """torch.library.opcheck on every op of the build's namespace, with arguments the public API really passes."""
    pkg = _pkg(request, package)
    namespace = pkg._ops.NAMESPACE
    rec = _Recorder(namespace)
    torch.manual_seed(0)
    # Under the recording dispatch mode every call goes through the registered ops (as under
    # torch.compile); RECOMPUTE = True also takes the paths compile takes instead of eager's (the
    # cross-entropy recompute backward). torch.compiler.is_compiling itself is not patched: dynamo
    # keys its special handling on that function, and a patched copy seen first broke later compiles.
    recompute = [mock.patch.object(m, "RECOMPUTE", True) for n, m in sorted(sys.modules.items())
                 if n.startswith(pkg.__name__ + ".") and m is not None and hasattr(m, "RECOMPUTE")]
    with rec, contextlib.ExitStack() as stack:
        for patch in recompute:
            stack.enter_context(patch)
        for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
            inputs = clone_inputs(make(device, dtype), grad)
            out = fn(*inputs)
            if grad:
                loss_of(out).backward()
            with torch.no_grad():
                fn(*clone_inputs(inputs))
    reached = sorted(op._opname for op in rec.calls)
    assert reached == _all_ops(namespace), f"ops never reached by the samples: {set(_all_ops(namespace)) - set(reached)}"
    for op, calls in rec.calls.items():
        # the first call with a gradient, the first without, and one more: distinct code paths
        picked, seen = [], set()
        for args, kwargs in calls:
            key = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args) + tuple(
                (a.dtype, a.dim()) if isinstance(a, torch.Tensor) else type(a) for a in args)
            if key not in seen:
                seen.add(key)
                picked.append((args, kwargs))
        for args, kwargs in picked[:4]:
            torch.library.opcheck(op, args, kwargs)


# ----------------------------------------------------------------------------- cases 3, 8, 9 for every op and layer


def _misaligned(t):
    """The same values in a view whose base pointer is one element past an allocation (not 16-byte aligned)."""
    if not isinstance(t, torch.Tensor) or t.numel() == 0:
        return t
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


@pytest.mark.parametrize("package", PACKAGES)
def test_case3_upstream_gradient_reused_and_never_written(request, package, device):
    """Backward twice with the same upstream-gradient tensors (retain_graph): same gradients, the upstream
    gradients unchanged (a peer wrote dX into dY); an output used by two consumers accumulates correctly."""
    pkg = _pkg(request, package)
    torch.manual_seed(4)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        if not grad:
            continue
        data = make(device, dtype)
        inputs = clone_inputs(data, grad)
        outs = [o for o in as_tuple(fn(*inputs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        leaves = [inputs[i] for i in grad if inputs[i].requires_grad] + list(params)
        dys = [torch.randn(o.shape, device=device).to(o.dtype) for o in outs]
        kept = [d.clone() for d in dys]
        g1 = torch.autograd.grad(outs, leaves, dys, retain_graph=True, allow_unused=True)
        g2 = torch.autograd.grad(outs, leaves, dys, retain_graph=True, allow_unused=True)
        for d, k in zip(dys, kept):
            assert torch.equal(d, k), f"{name}: backward wrote into the upstream gradient"
        for i, (a, b) in enumerate(zip(g1, g2)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.equal(a, b), f"{name}: a second backward with the same dy gave another gradient {i}"
        # two consumers of the same output: gradients add up to those of one consumer with the summed dy
        half = [d / 2 for d in dys]
        loss = sum((o * h.detach()).sum() + (o * (d - h).detach()).sum() for o, d, h in zip(outs, dys, half))
        g3 = torch.autograd.grad(loss, leaves, allow_unused=True)
        for i, (a, b) in enumerate(zip(g1, g3)):
            if a is not None:
                _assert_same(f"{name} two consumers grad {i}", b, a, a.dtype if a.is_floating_point() else dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_case8_expanded_and_transposed_upstream_gradient_every_op(request, package, device):
    """A stride-0 (``y.sum().backward()``) and a transposed upstream gradient give the gradients of the same
    values passed contiguous (a peer failed with "view size is not compatible")."""
    pkg = _pkg(request, package)
    torch.manual_seed(5)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        if not grad:
            continue
        inputs = clone_inputs(make(device, dtype), grad)
        out = as_tuple(fn(*inputs))[0]
        leaves = [inputs[i] for i in grad if inputs[i].requires_grad] + list(params)
        variants = {"expanded": torch.randn((), device=device).to(out.dtype).expand(out.shape)}
        if out.dim() >= 2:
            variants["transposed"] = torch.randn(out.shape[:-2] + (out.shape[-1], out.shape[-2]),
                                                 device=device).to(out.dtype).transpose(-1, -2)
        for kind, dy in variants.items():
            want = torch.autograd.grad(out, leaves, dy.contiguous(), retain_graph=True, allow_unused=True)
            got = torch.autograd.grad(out, leaves, dy, retain_graph=True, allow_unused=True)
            for i, (a, b) in enumerate(zip(got, want)):
                if b is not None:
                    _assert_same(f"{name} {kind} dy grad {i}", a, b, b.dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_case9_misaligned_base_pointers_every_op(request, package, device):
    """Every input viewed from ``buf[1:]`` (base pointer not 16-byte aligned), forward and backward, equals
    the same call on freshly allocated inputs (a peer rejected such pointers as misaligned)."""
    pkg = _pkg(request, package)
    torch.manual_seed(6)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        data = make(device, dtype)
        a = clone_inputs(data, grad)
        b = [_misaligned(t) for t in clone_inputs(data)]
        for i in grad:
            if b[i].is_floating_point():
                b[i].requires_grad_(True)
        ya, yb = fn(*a), fn(*b)
        _assert_same(f"{name} misaligned", yb, ya, dtype)
        if grad:
            la = [a[i] for i in grad if a[i].requires_grad]
            lb = [b[i] for i in grad if b[i].requires_grad]
            for i, (x, y) in enumerate(zip(torch.autograd.grad(loss_of(yb), lb, allow_unused=True),
                                           torch.autograd.grad(loss_of(ya), la, allow_unused=True))):
                if y is not None:
                    _assert_same(f"{name} misaligned grad {i}", x, y, y.dtype)


def _negative_bit(t):
    """The same values in a view with the negative bit set, as ``z.conj().imag`` of a complex z: its memory holds
    -t, and only a reader that honours the bit sees t."""
    return torch._neg_view(-t.detach()) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


@pytest.mark.parametrize("package", PACKAGES)
def test_case10_negative_bit_inputs_every_op(request, package, device):
    """Each floating input in turn (``out`` included) a view with the negative bit set (``x.conj().imag``)
    equals the same call on the plain tensor: in inference (the fast paths), in training, forward and backward,
    and with an upstream gradient that has the bit. The kernels read raw memory: a negative-bit tensor that
    reached them unresolved gave a silently wrong sign."""
    pkg = _pkg(request, package)
    torch.manual_seed(10)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        data = make(device, dtype)
        with torch.no_grad():
            want = fn(*clone_inputs(data))
        for i, t in enumerate(data):
            if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                continue
            inputs = clone_inputs(data)
            inputs[i] = _negative_bit(t)
            with torch.no_grad():
                got = fn(*inputs)
            _assert_same(f"{name} negative-bit input {i}", got, want, dtype)
            if i == out_arg:
                _assert_same(f"{name} negative-bit out", inputs[i], want, dtype)
            if i not in grad:
                continue
            a = clone_inputs(data, grad)
            leaf = (-t.detach()).requires_grad_(True)
            b = clone_inputs(data, grad)
            b[i] = torch._neg_view(leaf)
            ya, yb = fn(*a), fn(*b)
            _assert_same(f"{name} negative-bit input {i}, training", yb, ya, dtype)
            la = [a[j] for j in grad if a[j].requires_grad] + list(params)
            lb = [b[j] for j in grad if b[j].requires_grad] + list(params)
            outs_a = [o for o in as_tuple(ya) if isinstance(o, torch.Tensor) and o.requires_grad]
            outs_b = [o for o in as_tuple(yb) if isinstance(o, torch.Tensor) and o.requires_grad]
            dys = [torch.randn(o.shape, device=device).to(o.dtype) for o in outs_a]
            ga = torch.autograd.grad(outs_a, la, dys, retain_graph=True, allow_unused=True)
            gb = torch.autograd.grad(outs_b, lb, [_negative_bit(d) for d in dys], allow_unused=True)
            for j, (x, y) in enumerate(zip(gb, ga)):
                if y is not None:
                    _assert_same(f"{name} negative-bit input {i} and dy, grad {j}", x, y, y.dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_jit_trace_records_every_op(request, package, device):
    """``torch.jit.trace`` (also the legacy ``torch.onnx.export`` path) of each op records its custom op and the
    traced function gives eager's values on fresh inputs of the same shapes. The inference fast paths planned a
    launch from the traced sizes (tensors under the tracer): an AttributeError or ValueError from the planning."""
    pkg = _pkg(request, package)
    torch.manual_seed(11)
    traced_ops = 0
    for name, fn, make, _, _, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        if params:  # a module's sample (parameters): the tracer would record them as constants
            continue
        traced_ops += 1
        data = make(device, dtype)
        where = [i for i, t in enumerate(data) if isinstance(t, torch.Tensor)]

        def call(*tensors, data=data, where=where, fn=fn):
            args = list(data)
            for i, t in zip(where, tensors):
                args[i] = t
            out = fn(*args)
            return tuple(o for o in as_tuple(out) if isinstance(o, torch.Tensor))

        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it records as constants
            traced = torch.jit.trace(call, tuple(clone_inputs(data)[i] for i in where), check_trace=False)
            assert "::" in str(traced.graph), f"{name}: no op recorded"
            fresh = [t.clone().normal_() if t.is_floating_point() else t.clone() for t in (data[i] for i in where)]
            got, want = traced(*clone_inputs(fresh)), call(*clone_inputs(fresh))
        for j, (g, w) in enumerate(zip(as_tuple(got), want)):
            _assert_same(f"{name} traced output {j}", g, w, dtype)
    assert traced_ops


# ----------------------------------------------------------------------------- case 5: compile, CUDA graphs, streams


def _grads(out, inputs, params, grad):
    leaves = [inputs[i] for i in grad if inputs[i].requires_grad] + list(params)
    return torch.autograd.grad(loss_of(out), leaves, allow_unused=True)


@pytest.mark.gpu
@pytest.mark.parametrize("package", PACKAGES)
def test_case5_compile_fullgraph_inference_and_training_equal_eager(request, package, device):
    """All samples of a package in one ``torch.compile(fullgraph=True)`` graph (one compile per mode)."""
    pkg = _pkg(request, package)
    torch.manual_seed(1)  # the layers' random weights too: the same case whatever ran before in this process
    runs = _runs(pkg, CATALOG[package], device)
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch._dynamo.reset()  # ``every`` is one code object for all packages: start each from a clean cache
    data = [make(device, dtype) for _, _, make, _, _, dtype, _ in runs]

    def slack(name, dtype):
        # Inductor compiles the composite layers' own submodules (attention, MLP) too, keeping fp32 between fused
        # ops where eager rounds each to bf16/fp16; through a decoder layer's backward those roundings add up to
        # ~1% of the largest gradient (session 59, H100: 0.0625 at a largest |grad| of 6.6), not ulps of our op
        return 4.0 if backend == "inductor" and name in COMPOSITE_LAYERS and dtype != torch.float32 else 1.0

    def every(*flat):
        outs, k = [], 0
        for (name, fn, make, grad, out_arg, dtype, params), inputs in zip(runs, data):
            outs.append(fn(*flat[k:k + len(inputs)]))
            k += len(inputs)
        return outs

    compiled = torch.compile(every, fullgraph=True, backend=backend)
    # inference
    flat = [t for inputs in data for t in clone_inputs(inputs)]
    flat_e = [t for inputs in data for t in clone_inputs(inputs)]
    with torch.no_grad():
        got, want = compiled(*flat), every(*flat_e)
    for (name, *_rest), g, w in zip(runs, got, want):
        _assert_same(f"{name} [inference]", g, w, _rest[4], slack(name, _rest[4]))
    # training: forward compiled with inputs that require grad, backward through the compiled graph
    trainable = [r for r in runs if r[3]]
    flat, flat_e, per = [], [], []
    for r, inputs in zip(runs, data):
        a, b = clone_inputs(inputs, r[3] if r[3] else ()), clone_inputs(inputs, r[3] if r[3] else ())
        flat += a
        flat_e += b
        per.append((a, b))
    got, want = compiled(*flat), every(*flat_e)
    assert trainable
    leaves_c, leaves_e, owners = [], [], []
    for (name, fn, make, grad, out_arg, dtype, params), g, w, (a, b) in zip(runs, got, want, per):
        _assert_same(f"{name} [training forward]", g, w, dtype, slack(name, dtype))
        for i in grad:
            if a[i].requires_grad:
                leaves_c.append(a[i])
                leaves_e.append(b[i])
                owners.append((name, i, dtype))
    # one backward through the one compiled graph (its buffers are donated: no retain_graph)
    total_c = sum(loss_of(g) for r, g in zip(runs, got) if r[3])
    total_e = sum(loss_of(w) for r, w in zip(runs, want) if r[3])
    grads_c = torch.autograd.grad(total_c, leaves_c, allow_unused=True)
    grads_e = torch.autograd.grad(total_e, leaves_e, allow_unused=True)
    for (name, i, dtype), x, y in zip(owners, grads_c, grads_e):
        assert (x is None) == (y is None), f"{name} [training grad of input {i}]: None in one of compiled/eager"
        if x is not None:
            _assert_same(f"{name} [training grad of input {i}]", x, y, dtype, slack(name, dtype))


def _cuda_only(device):
    if device != "cuda":
        pytest.skip("CUDA graphs and streams need TEST_DEVICE=cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("package", PACKAGES)
def test_case5_cuda_graph_capture_then_replay_on_new_data(request, package, device):
    """Forward (inference) and forward + backward of every sample in one CUDA graph, replayed on new inputs."""
    _cuda_only(device)
    pkg = _pkg(request, package)
    runs = _runs(pkg, CATALOG[package], device)
    torch.manual_seed(2)
    static = [clone_inputs(make(device, dtype), grad) for _, _, make, grad, _, dtype, _ in runs]

    def step():
        outs = []
        for (name, fn, make, grad, out_arg, dtype, params), inputs in zip(runs, static):
            out = fn(*inputs)
            g = _grads(out, inputs, params, grad) if grad else ()
            outs.append((out, g))
        return outs

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up: compile every kernel and fill caches outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for trial in range(2):
        fresh = [make(device, dtype) for _, _, make, _, _, dtype, _ in runs]
        with torch.no_grad():
            for inputs, new, r in zip(static, fresh, runs):
                for k, (s, n) in enumerate(zip(inputs, new)):
                    if isinstance(s, torch.Tensor):
                        s.copy_(torch.full_like(n, float("nan")) if k == r[4] else n)
        graph.replay()
        torch.cuda.synchronize()
        for (name, fn, make, grad, out_arg, dtype, params), new, (out, g) in zip(runs, fresh, captured):
            eager_in = clone_inputs(new, grad)
            want = fn(*eager_in)
            _assert_same(f"{name} [graph replay {trial}]", out, want, dtype)
            if grad:
                for i, (x, y) in enumerate(zip(g, _grads(want, eager_in, params, grad))):
                    _assert_same(f"{name} [graph replay {trial} grad {i}]", x, y, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("package", PACKAGES)
def test_multiple_cuda_streams_give_default_stream_results(request, package, device):
    """Each sample run on 4 streams at once, each stream with its own inputs, equals the default stream."""
    _cuda_only(device)
    pkg = _pkg(request, package)
    runs = _runs(pkg, CATALOG[package], device)
    torch.manual_seed(3)
    streams = [torch.cuda.Stream() for _ in range(4)]
    for name, fn, make, grad, out_arg, dtype, params in runs:
        inputs = [make(device, dtype) for _ in streams]
        want = [fn(*clone_inputs(x)) for x in inputs]
        got = []
        torch.cuda.synchronize()
        for s, x in zip(streams, inputs):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                xs = clone_inputs(x)  # allocated on s
                got.append(fn(*xs))
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        for k, (g, w) in enumerate(zip(got, want)):
            _assert_same(f"{name} [stream {k}]", g, w, dtype)


def test_vmap_over_the_inference_fast_paths(norms, softmax, matmul, attention, activations, device):
    """``torch.func.vmap`` over the functions with plain-inference fast paths equals a loop over the batch, bit for
    bit: under a functorch transform the fast paths stand aside (their tensors are batched wrappers without data
    pointers) and the registered ops run (session 38's fast paths first broke this for softmax, layer_norm,
    matmul and flash_attention)."""
    torch.manual_seed(38)
    x, w = torch.randn(2, 3, 8, device=device), torch.randn(8, device=device)
    cos, sin = torch.randn(3, 8, device=device), torch.randn(3, 8, device=device)
    mat = torch.randn(8, 5, device=device)
    calls = {
        "rms_norm": lambda t: norms.rms_norm(t, w),
        "layer_norm": lambda t: norms.layer_norm(t, w, w),
        "softmax": lambda t: softmax.softmax(t, -1),
        "log_softmax": lambda t: softmax.log_softmax(t, -1, scale=0.5),
        "matmul": lambda t: matmul.matmul(t, mat),
        "flash_attention": lambda t: attention.flash_attention(t[None, None], t[None, None], t[None, None]),
        "rotary_embedding": lambda t: attention.rotary_embedding(t, cos, sin),
        "apply_rotary_pos_emb": lambda t: attention.apply_rotary_pos_emb(t[None, None], t[None, None], cos[None],
                                                                         sin[None])[1],
        "silu_and_mul": lambda t: activations.silu_and_mul(t),
    }
    with torch.no_grad():
        for name, fn in calls.items():
            assert torch.equal(torch.func.vmap(fn)(x), torch.stack([fn(t) for t in x])), name


@pytest.mark.parametrize("package", PACKAGES)
def test_functorch_grad_and_per_sample_grads_equal_autograd(request, package, device):
    """``torch.func.grad`` over every op and layer with a backward equals ``torch.autograd.grad`` bit for bit, and
    ``vmap(grad)`` (per-sample gradients) equals a loop of them. PyTorch's own wrapper of a custom op's autograd
    formula refuses functorch transforms (pytorch/pytorch#168393); the ops give them a Function of their own."""
    pkg = _pkg(request, package)
    torch.manual_seed(39)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        if not grad:
            continue
        base, other = clone_inputs(make(device, dtype)), clone_inputs(make(device, dtype))
        argnums = tuple(i for i in grad if base[i].is_floating_point())
        samples = [base, [other[i] if i in argnums else t for i, t in enumerate(base)]]  # the same mask, target...

        def loss(*diff, base):
            inputs = list(base)
            for i, t in zip(argnums, diff):
                inputs[i] = t
            return loss_of(fn(*inputs))

        want = []
        for inputs in samples:
            leaves = [inputs[i].requires_grad_(True) for i in argnums]
            want.append(torch.autograd.grad(loss_of(fn(*inputs)), leaves, allow_unused=True))
            for t in leaves:
                t.requires_grad_(False)
        got = torch.func.grad(lambda *d: loss(*d, base=base), argnums=tuple(range(len(argnums))))(
            *[base[i] for i in argnums])
        for k, (g, w) in enumerate(zip(got, want[0])):
            if w is not None and name in COMPOSITE_LAYERS:
                _assert_same(f"{name} torch.func.grad gradient {k}", g, w, w.dtype)
            elif w is not None:
                assert torch.equal(g, w), f"{name}: torch.func.grad differs from autograd in gradient {k}"
        stacked = [torch.stack([s[i] for s in samples]) for i in argnums]
        per_sample = torch.func.vmap(torch.func.grad(lambda *d: loss(*d, base=base),
                                                     argnums=tuple(range(len(argnums)))))(*stacked)
        for k, g in enumerate(per_sample):
            for b, w in enumerate(want):
                if w[k] is not None:
                    _assert_same(f"{name} vmap(grad) sample {b} gradient {k}", g[b], w[k], w[k].dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_batched_upstream_gradients_equal_a_loop(request, package, device):
    """``torch.autograd.grad(..., is_grads_batched=True)`` (what ``autograd.functional.jacobian`` / ``hessian`` with
    ``vectorize=True`` use) through every op and layer with a backward equals one backward per upstream gradient:
    PyTorch's legacy vmap hands the backward batched tensors without storage, which go through the ops
    (``_dispatch.legacy_batched``), not to the kernels ("Cannot access storage of BatchedTensorImpl" before)."""
    pkg = _pkg(request, package)
    torch.manual_seed(40)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        if not grad:
            continue
        inputs = clone_inputs(make(device, dtype))
        leaves = [inputs[i].requires_grad_(True) for i in grad if inputs[i].is_floating_point()]
        loss = loss_of(fn(*inputs))
        upstream = torch.tensor([1.0, -0.5], device=device, dtype=loss.dtype)
        got = torch.autograd.grad(loss, leaves, upstream, is_grads_batched=True, retain_graph=True, allow_unused=True)
        for b in range(2):
            want = torch.autograd.grad(loss, leaves, upstream[b], retain_graph=True, allow_unused=True)
            for k, (g, w) in enumerate(zip(got, want)):
                if w is not None:
                    _assert_same(f"{name} batched upstream {b} gradient {k}", g[b], w, w.dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_forward_mode_ad_raises_instead_of_dropping_tangents(request, package, device):
    """Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad`` dual tensors) has no formula in the ops:
    every op and layer raises for a tangent rather than returning its output with the tangent silently dropped
    (zero), which is what a custom op does and what the inference fast paths did. Inputs without a tangent work."""
    import torch.autograd.forward_ad as fwAD

    pkg = _pkg(request, package)
    torch.manual_seed(40)
    for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], device, dtype_index=0):
        inputs = clone_inputs(make(device, dtype))
        if not grad:  # the forms that write into a given output: a tangent on their input raises too
            i = next(k for k, t in enumerate(inputs) if k != out_arg and isinstance(t, torch.Tensor))
            with fwAD.dual_level():
                dual = fwAD.make_dual(inputs[i], torch.ones_like(inputs[i]))
                with pytest.raises(NotImplementedError, match="jvp"):
                    fn(*inputs[:i], dual, *inputs[i + 1:])
            with pytest.raises(RuntimeError, match="functorch"):
                torch.func.jvp(lambda t: fn(*inputs[:i], t, *inputs[i + 1:]), (inputs[i],),
                               (torch.ones_like(inputs[i]),))
            continue
        i = grad[0]
        with torch.no_grad():
            plain = fn(*clone_inputs(inputs))
        with pytest.raises(NotImplementedError, match="jvp"):
            torch.func.jvp(lambda t: loss_of(fn(*inputs[:i], t, *inputs[i + 1:])), (inputs[i],),
                           (torch.ones_like(inputs[i]),))
        with fwAD.dual_level():
            dual = fwAD.make_dual(inputs[i], torch.ones_like(inputs[i]))
            with pytest.raises(NotImplementedError, match="jvp"):
                fn(*inputs[:i], dual, *inputs[i + 1:])
            with torch.no_grad():
                _assert_same(f"{name} under a dual level, no tangent", fn(*clone_inputs(inputs)), plain, dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_layers_under_autocast_match_their_modules(request, package, device):
    """Under ``torch.autocast`` (bf16) every layer gives the output dtype and values of the module it replaces, for
    fp32 and bf16 inputs, and for fp32 inputs (mixed-precision training) its input gradients: autocast casts the
    inputs of some ops the modules call (``F.linear`` to bf16; on CUDA ``F.layer_norm``, softmax, ``pow`` to fp32;
    cross-entropy to fp32), and the layers compute in the dtype PyTorch's op would (``_autocast.autocast_to``).
    Values within bf16 tolerance (the modules may compute in bf16 here); bf16 gradients are left to the layer tests
    (under the interpreter bf16 rounds by truncation, which cancellation in a softmax gradient magnifies)."""
    pkg = _pkg(request, package)
    torch.manual_seed(41)
    kind = torch.device(device).type
    for ls in CATALOG[package].layers(pkg):
        cls = getattr(pkg.layers, ls.name)
        # (parameters, inputs): mixed precision keeps fp32 weights and feeds them bf16 activations too
        for module_dtype, dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.bfloat16)):
            module = ls.module(device, module_dtype)
            if type(module).forward is nn.Module.forward:  # a stand-in that only carries attributes
                continue
            data = ls.make(device, dtype)
            name = f"layers.{ls.name} {module_dtype} module, {dtype} inputs under autocast"
            results = []
            for run in (lambda *xs: module(*xs), lambda *xs: cls.forward(module, *xs)):
                inputs = clone_inputs(data, ls.grad if dtype == torch.float32 else ())
                with torch.autocast(kind, dtype=torch.bfloat16):
                    out = run(*inputs)
                leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
                grads = torch.autograd.grad(loss_of(out), leaves, allow_unused=True) if leaves else ()
                results.append((out, grads))
            (want, want_grads), (got, got_grads) = results
            for k, (g, w) in enumerate(zip(as_tuple(got), as_tuple(want))):
                assert g.dtype == w.dtype, f"{name} output {k}: {g.dtype}, the module gives {w.dtype}"
            _assert_same(name, tuple(t.float() for t in as_tuple(got)), tuple(t.float() for t in as_tuple(want)),
                         torch.bfloat16)
            for k, (g, w) in enumerate(zip(got_grads, want_grads)):
                if w is not None:
                    _assert_same(f"{name} grad {k}", g.float(), w.float(), torch.bfloat16)
        # autocast never casts fp64: the layer refuses fp64 inputs as it does without autocast
        module, data = ls.module(device, torch.float32), ls.make(device, torch.float64)
        if type(module).forward is not nn.Module.forward:
            errors = []
            for enabled in (False, True):
                with torch.autocast(kind, dtype=torch.bfloat16, enabled=enabled):
                    try:
                        errors.append(type(cls.forward(module, *clone_inputs(data))))
                    except (TypeError, ValueError, RuntimeError) as e:
                        errors.append(type(e))
            assert errors[0] == errors[1], f"layers.{ls.name}: fp64 input under autocast gave {errors[1].__name__}"


@pytest.mark.parametrize("package", PACKAGES)
def test_meta_tensors_raise_a_clear_error_and_fake_tensors_trace(request, package, device):
    """Every op sample on meta tensors raises a RuntimeError saying so (no kernel launch on data that does not
    exist: on a GPU it would get null pointers), and under ``FakeTensorMode`` gives the real call's shapes and dtypes
    (the registered ops' fake implementations)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    pkg = _pkg(request, package)
    torch.manual_seed(42)
    for sample in CATALOG[package].ops(pkg):
        data = sample.make(device, sample.dtypes[0])
        meta = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in data]
        with pytest.raises(RuntimeError, match="meta tensor"):
            sample.fn(*meta)
        real = as_tuple(sample.fn(*clone_inputs(data)))
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = as_tuple(sample.fn(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in data]))
        for k, (f, r) in enumerate(zip(fake, real)):
            if isinstance(r, torch.Tensor):
                assert (f.shape, f.dtype) == (r.shape, r.dtype), f"{sample.name} output {k} under FakeTensorMode"


@pytest.mark.parametrize("package", PACKAGES)
def test_meta_tensors_are_refused_before_any_launch(request, package, device):
    """The refusal of meta tensors is the packages' own launch guard (``_device.check_launch_device``), with its
    advice, not whatever a launch on them happens to raise: under the interpreter that is torch's "Cannot copy out
    of meta tensor", a NotImplementedError; on a GPU a kernel would get null pointers."""
    pkg = _pkg(request, package)
    torch.manual_seed(43)
    for sample in CATALOG[package].ops(pkg):
        data = sample.make(device, sample.dtypes[0])
        meta = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in data]
        with pytest.raises(RuntimeError, match="got a meta tensor, which has no data to run a kernel on") as err:
            sample.fn(*meta)
        assert type(err.value) is RuntimeError and "FakeTensorMode" in str(err.value), sample.name
        # named by the package's Python name, not by its build's module (_triton_norms_cpu_<hash>)
        assert str(err.value).startswith(f"triton_{package} got"), (sample.name, str(err.value)[:60])


def test_address_launches_pass_the_tensor_launches_pointers(norms, attention, activations, device, monkeypatch,
                                                            request):
    """The pinned inference launches that pass integer addresses (``FixedLaunch.at``: rms_norm, add_rms_norm,
    layer_norm, the rotary pair, activations) give the launcher the same arguments, in the same order, as their
    tensor form. The interpreter never takes that path, so a recording launcher stands in for Triton's (the direct
    path faked)."""
    packages = (norms, attention, activations)
    modules = [sys.modules[p.__name__ + "._fastlaunch"] for p in packages]
    records = []
    for fl in modules:
        monkeypatch.setattr(fl, "_current_getter", lambda kernel, dev: (lambda: dev.index))
        monkeypatch.setattr(fl, "_compile", lambda kernel, grid, args, meta, fixed=(): (
            lambda *launched: records.append(launched), ("head",), lambda index: "stream", (*fixed, "tail"), None))
        monkeypatch.setattr(fl, "_hooks_off", lambda: True)
        monkeypatch.setattr(fl, "_ADDRESSES_OK", [True])
    _isolate_launch_plans(packages, monkeypatch, request)  # plans of earlier tests would skip the compile
    torch.manual_seed(3)
    bf = torch.bfloat16
    x, r, w, b = (torch.randn(*s, dtype=bf, device=device) for s in ((4, 64), (4, 64), (64,), (64,)))
    q, k = torch.randn(1, 4, 3, 16, dtype=bf, device=device), torch.randn(1, 2, 3, 16, dtype=bf, device=device)
    cos, sin = torch.randn(1, 3, 16, dtype=bf, device=device), torch.randn(1, 3, 16, dtype=bf, device=device)
    g = torch.randn(2, 3, 64, dtype=bf, device=device)
    calls = {
        "rms_norm": lambda: norms.rms_norm(x, w, b, eps=1e-6),
        "rms_norm mean": lambda: norms.rms_norm(x, w, eps=1e-6, torch_order="mean", cast_dtype=bf),
        "rms_norm fused": lambda: norms.rms_norm(x, w, eps=1e-6, torch_order="fused"),
        "add_rms_norm": lambda: norms.add_rms_norm(x, r, w, eps=1e-6),
        "add_rms_norm mean": lambda: norms.add_rms_norm(x, r, w, eps=1e-6, cast_dtype=bf, torch_order="mean"),
        "layer_norm": lambda: norms.layer_norm(x, w, b, eps=1e-5),
        "layer_norm fused": lambda: norms.layer_norm(x, w, b, eps=1e-5, torch_order="fused"),
        "apply_rotary_pos_emb": lambda: attention.apply_rotary_pos_emb(q, k, cos, sin),
        "silu_and_mul": lambda: activations.silu_and_mul(g),
        "silu": lambda: activations.silu(g),
    }

    def launched(fn, addresses: bool):
        for fl in modules:
            fl._ADDRESSES_OK[0] = addresses
        records.clear()
        out = fn()
        outs = {t.data_ptr(): f"out{i}" for i, t in enumerate(out if isinstance(out, tuple) else (out,))}
        assert len(records) == 1
        args = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in records[0]]
        return [outs.get(a, a) for a in args], records[0]

    with torch.no_grad():
        for name, fn in calls.items():
            fn()  # the first call compiles (the recording entry)
            by_address, raw = launched(fn, True)
            assert not any(isinstance(a, torch.Tensor) for a in raw), name  # addresses, not tensors
            assert by_address == launched(fn, False)[0], name


def _isolate_launch_plans(packages, monkeypatch, request):
    """The launch plans ``packages`` make during the test are dropped when it ends: every module's PlanCache is
    swapped for an empty one (monkeypatch puts the old back), each functools cache (the lru_cached Launch builders,
    such as ``_exact.rms_exact_plan``) is cleared now and at the end, and ``_fastlaunch``'s own cache is swapped.
    A faked launcher kept in a plan that outlived the test ran in the later tests of its process, whose outputs were
    then never written (an H100 run: a bf16 LlamaRMSNorm gave -1.4e38 and NaN after this test)."""
    cleared = []
    for package in packages:
        prefix = package.__name__ + "."
        plan_cache = sys.modules[prefix + "_fastlaunch"].PlanCache  # each package has its own copy
        monkeypatch.setattr(sys.modules[prefix + "_fastlaunch"], "_CACHE", {})
        for name, module in list(sys.modules.items()):
            if not name.startswith(prefix):
                continue
            for attr, value in list(vars(module).items()):
                if isinstance(value, plan_cache):
                    monkeypatch.setattr(module, attr, plan_cache())
                elif callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "").startswith(prefix):
                    value.cache_clear()
                    cleared.append(value)
    request.addfinalizer(lambda: [fn.cache_clear() for fn in cleared])


def test_compile_dynamic_fullgraph_with_default_scalars(norms, softmax, activations, attention, device):
    """``torch.compile(dynamic=True, fullgraph=True)`` with the Python-float arguments left at their defaults: dynamo
    may trace them as symbolic floats, on which ``math.isinf`` / ``isfinite`` / ``isnan`` in the argument checks broke
    the graph (a fresh-eyes trial, session 45); two row counts through one graph, values equal to eager."""
    torch._dynamo.reset()
    w, b = torch.randn(16, device=device), torch.randn(16, device=device)
    calls = [lambda x, r, t: norms.rms_norm(x, w),
             lambda x, r, t: norms.rms_norm(x, w, eps=1e-6),
             lambda x, r, t: norms.add_rms_norm(x, r, w)[0],
             lambda x, r, t: norms.layer_norm(x, w),
             lambda x, r, t: norms.add_layer_norm(x, r, w, b)[0],
             lambda x, r, t: softmax.cross_entropy(x, t),
             lambda x, r, t: softmax.cross_entropy(x, t, label_smoothing=0.1),
             lambda x, r, t: activations.fatrelu_and_mul(x),
             lambda x, r, t: attention.flash_attention(*(x.reshape(1, 1, -1, 16),) * 3)]
    for i, fn in enumerate(calls):
        compiled = torch.compile(fn, dynamic=True, fullgraph=True, backend="aot_eager")
        for rows in (3, 5):
            x, r = torch.randn(rows, 16, device=device), torch.randn(rows, 16, device=device)
            t = torch.randint(0, 16, (rows,), device=device)
            got, want = compiled(x, r, t), fn(x, r, t)
            assert torch.equal(got, want), (i, rows)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_layer_runs_a_float64_module_as_the_module(request, device, package):
    """A model moved to float64 after kernelize (``torch.autograd.gradcheck``, debugging), a dtype the kernels do not
    take: every layer gives the module's own output and input gradients, bit for bit (the norm, activation and
    softmax layers raised their op's dtype TypeError; they now run the module's class forward, which kernelize left
    in place). A stand-in module without a forward of its own gets the op's TypeError, or the layer's own PyTorch
    formula where it has one."""
    pkg = _pkg(request, package)
    for ls in CATALOG[package].layers(pkg):
        torch.manual_seed(43)
        cls = getattr(pkg.layers, ls.name)
        module, data = ls.module(device, torch.float64), ls.make(device, torch.float64)
        if type(module).forward is nn.Module.forward:  # a stand-in that only carries attributes: no forward to run
            try:
                out = cls.forward(module, *clone_inputs(data))
            except TypeError as err:  # the op's refusal, naming the dtype
                assert "float64" in str(err), f"layers.{ls.name}: {err}"
            else:  # a layer with a PyTorch formula of its own (the rotary layer: transformers' function)
                assert all(t.dtype == torch.float64 for t in as_tuple(out)), f"layers.{ls.name}"
            continue
        results = []
        for run in (lambda *xs: module(*xs), lambda *xs: cls.forward(module, *xs)):
            inputs = clone_inputs(data, ls.grad)
            out = run(*inputs)
            leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
            grads = torch.autograd.grad(loss_of(out), leaves, allow_unused=True) if leaves else ()
            results.append((as_tuple(out), grads))
        (want, want_grads), (got, got_grads) = results
        for k, (g, w) in enumerate(zip(got, want)):
            if isinstance(w, torch.Tensor):
                assert g.dtype == w.dtype == torch.float64 and torch.equal(g, w), f"layers.{ls.name} output {k}"
        for k, (g, w) in enumerate(zip(got_grads, want_grads)):
            assert (g is None) == (w is None) and (w is None or torch.equal(g, w)), f"layers.{ls.name} grad {k}"
