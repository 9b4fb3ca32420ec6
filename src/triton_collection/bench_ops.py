"""What ``triton-collection bench`` measures: one :class:`OpSpec` per (package, op, mode).

The registry :data:`REGISTRY` maps a Hub package name to its op specs; adding a package to the
harness is one entry there. Each spec knows

- its shape sweeps (``"quick"``: a few shapes to shake out bugs; ``"full"``: the issue's sweep),
- the work of one call (:func:`OpSpec.work`): bytes moved, counting every tensor the op must
  read or write exactly once (what a perfect kernel moves; re-reads are the kernel's cost), or
  FLOPs for a matmul (``2·M·N·K``),
- how to build the calls for one shape (:func:`OpSpec.build`): the package's own function and
  the peers that exist for it (eager PyTorch, ATen fused ops, ``torch.compile``, Liger when
  importable), each a zero-argument callable, plus an fp32 reference to check every result.

Nothing here needs a GPU: the specs and byte counts are plain Python, and ``build`` runs on any
device the kernels run on (on CPU, under the Triton interpreter, for tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["OpSpec", "REGISTRY", "Workload", "bytes_moved", "package_names", "resolve_packages", "specs_for"]

Shape = tuple[int, ...]


def bytes_moved(rows: int, width: int, elem: int, tensors: float, vectors: int = 0) -> int:
    """Bytes a perfect kernel moves: ``tensors`` row-major (rows, width) tensors read or written
    once each, plus ``vectors`` (width,) tensors (weights, biases, their gradients)."""
    return int(tensors * rows * width * elem) + vectors * width * elem


@dataclass
class Workload:
    """The calls for one shape: ``providers`` name -> zero-argument callable returning the result;
    ``reference`` -> the fp32 result; ``pick`` takes the tensor to check out of a result."""

    providers: dict[str, Callable[[], Any]]
    reference: Callable[[], Any]
    pick: Callable[[Any], Any] = lambda out: out[0] if isinstance(out, (tuple, list)) else out
    rtol: float = 2e-2
    atol: float = 2e-2
    skipped: dict[str, str] = field(default_factory=dict)  # peer -> why it is absent


@dataclass(frozen=True)
class OpSpec:
    """One measured op of one package.

    Attributes:
        package: Hub package name (``"triton-norms"``).
        op: function name in the package (``"rms_norm"``).
        mode: ``"fwd"``, ``"fwd (chunk view)"`` (the input a strided view), ``"fwd+bwd"``, ``"bwd"`` (backward
            alone, graph kept) or ``"latency"`` (wall time per call from Python, small shapes; no byte count).
        shapes: ``{"quick": (...), "full": (...)}``, each a tuple of shapes.
        count: how the work is counted, in words (goes into the results).
        work_fn: (shape, element size) -> bytes (metric GB/s) or FLOPs (metric TFLOP/s).
        build_fn: (kernel module, shape, dtype, device, peers) -> :class:`Workload`.
    """

    package: str
    op: str
    mode: str
    shapes: dict[str, tuple[Shape, ...]]
    count: str
    work_fn: Callable[[Shape, int], int] | None
    build_fn: Callable[..., Workload]
    metric: str = "GB/s"

    @property
    def name(self) -> str:
        return f"{self.op} {self.mode}"

    def work(self, shape: Shape, elem: int) -> int | None:
        return None if self.work_fn is None else self.work_fn(shape, elem)

    def build(self, kernel, shape: Shape, dtype, device: str, peers: tuple[str, ...] = ("eager", "aten", "compile", "liger")) -> Workload:
        return self.build_fn(kernel, shape, dtype, device, peers)


# ------------------------------------------------------------------ helpers
def _liger(module: str, name: str):
    try:
        mod = __import__(f"liger_kernel.ops.{module}", fromlist=[name])
        return getattr(mod, name)
    except Exception:  # noqa: BLE001 - an absent or broken Liger is just an absent peer
        return None


def _compile(fn):
    """``torch.compile(fn)`` as a peer. Compiled backwards keep their saved buffers (``donated_buffer``
    off, for the whole process): the backward-alone timing reruns one graph (``retain_graph``), and
    dynamo reuses a graph compiled for the same code by an earlier fwd+bwd case."""
    import torch

    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    return torch.compile(fn, dynamic=False)


def _with_peers(ours: dict, peers: tuple[str, ...], **candidates) -> tuple[dict, dict]:
    """Keep the peers asked for; a candidate given as None is reported as not importable."""
    providers, skipped = dict(ours), {}
    for name, fn in candidates.items():
        kind = {"eager": "eager", "hf_eager": "eager"}.get(name, "aten" if name.startswith("F_") or name.startswith("torch_") else name)
        label = {"F_rms_norm": "F.rms_norm", "F_layer_norm": "F.layer_norm", "torch_softmax": "torch.softmax",
                 "torch_log_softmax": "torch.log_softmax", "F_cross_entropy": "F.cross_entropy", "torch_matmul": "torch.matmul",
                 "torch_sdpa": "F.scaled_dot_product_attention",
                 "compile": "torch.compile", "hf_eager": "eager (HF)"}.get(name, name)
        if kind not in peers:
            continue
        if fn is None:
            skipped[label] = "not importable"
        else:
            providers[label] = fn
    return providers, skipped


def _fwd_bwd(f, x, dy, w=None):
    """Forward + backward of ``f(x)``; returns dx (x.grad, w.grad reset each call)."""

    def run():
        x.grad = None
        if w is not None:
            w.grad = None
        f(x).backward(dy)
        return x.grad

    return run


def _bwd_only(f, x, dy, w=None):
    """Backward alone: the forward graph is built once and kept (``retain_graph``)."""
    import torch

    inputs = (x,) if w is None else (x, w)
    graph = []  # the forward runs on the first call (so a failing peer fails its own row only)

    def run():
        if not graph:
            graph.append(f(x))
        return torch.autograd.grad(graph[0], inputs, dy, retain_graph=True)[0]

    return run


def _grad_ref(f, x, dy, w=None):
    def run():
        xf = x.detach().double().requires_grad_(True)
        wf = None if w is None else w.detach().double()
        f(xf, wf).backward(dy.double())
        return xf.grad

    return run


# ------------------------------------------------------------------ triton-norms
def _llama_rms(x, w, eps=1e-6):
    import torch

    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_ref(x, w, eps=1e-6):
    import torch

    xf = x.double()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * w.double()


def _norm_inputs(shape, dtype, device, grad=False):
    import torch

    M, N = shape
    x = torch.randn(M, N, device=device, dtype=dtype)
    w = (torch.rand(N, device=device) + 0.5).to(dtype)
    b = (torch.randn(N, device=device) * 0.1).to(dtype)
    if grad:
        x.requires_grad_(True)
        w.requires_grad_(True)
    return x, w, b


def _build_rms(kernel, shape, dtype, device, peers):
    import torch.nn.functional as F

    x, w, _ = _norm_inputs(shape, dtype, device)
    N = shape[-1]
    ours = {
        "ours": lambda: kernel.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype),
        "ours (exact order: LlamaRMSNorm layer)": lambda: kernel.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype, torch_order="mean"),
    }
    liger = _liger("rms_norm", "LigerRMSNormFunction")
    compiled = _compile(_llama_rms) if "compile" in peers else None
    providers, skipped = _with_peers(
        ours, peers,
        hf_eager=lambda: _llama_rms(x, w),
        F_rms_norm=lambda: F.rms_norm(x, (N,), w, 1e-6),
        compile=compiled and (lambda: compiled(x, w)),
        liger=liger and (lambda: liger.apply(x, w, 1e-6, 0.0, "llama", False)),
    )
    return Workload(providers, lambda: _rms_ref(x, w), skipped=skipped)


def _build_add_rms(kernel, shape, dtype, device, peers):
    import torch.nn.functional as F

    import torch

    x, w, _ = _norm_inputs(shape, dtype, device)
    r = torch.randn_like(x)
    N = shape[-1]

    def eager():  # the two separate PyTorch ops a model runs
        h = x + r
        return F.rms_norm(h, (N,), w, 1e-6), h

    liger = _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    compiled = _compile(lambda x, r: (lambda h: (F.rms_norm(h, (N,), w, 1e-6), h))(x + r)) if "compile" in peers else None
    providers, skipped = _with_peers(
        {"ours": lambda: kernel.add_rms_norm(x, r, w, eps=1e-6)}, peers,
        eager=eager,
        compile=compiled and (lambda: compiled(x, r)),
        liger=liger and (lambda: liger.apply(x, r, w, 1e-6, 0.0, "llama", False)),
    )
    return Workload(providers, lambda: _rms_ref(x.double() + r.double(), w), skipped=skipped)


def _build_ln(kernel, shape, dtype, device, peers):
    import torch.nn.functional as F

    x, w, b = _norm_inputs(shape, dtype, device)
    N = shape[-1]
    liger = _liger("layer_norm", "LigerLayerNormFunction")
    compiled = _compile(lambda x: F.layer_norm(x, (N,), w, b, 1e-5)) if "compile" in peers else None
    providers, skipped = _with_peers(
        {"ours": lambda: kernel.layer_norm(x, w, b, eps=1e-5),
         "ours (exact order: LayerNorm layer)": lambda: kernel.layer_norm(x, w, b, eps=1e-5, torch_order="fused")}, peers,
        F_layer_norm=lambda: F.layer_norm(x, (N,), w, b, 1e-5),
        compile=compiled and (lambda: compiled(x)),
        liger=liger and (lambda: liger.apply(x, w, b, 1e-5)),
    )
    return Workload(providers, lambda: F.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5), skipped=skipped)


def _norm_grad_builder(which: str, backward_only: bool):
    def build(kernel, shape, dtype, device, peers):
        import torch
        import torch.nn.functional as F

        x, w, b = _norm_inputs(shape, dtype, device, grad=True)
        dy = torch.randn(shape, device=device, dtype=dtype)
        N = shape[-1]
        wrap = _bwd_only if backward_only else _fwd_bwd
        if which == "rms":
            liger = _liger("rms_norm", "LigerRMSNormFunction")
            eager = lambda t: _llama_rms(t, w)  # noqa: E731
            cands = dict(
                hf_eager=eager,
                F_rms_norm=lambda t: F.rms_norm(t, (N,), w, 1e-6),
                compile=_compile(eager) if "compile" in peers else None,
                liger=liger and (lambda t: liger.apply(t, w, 1e-6, 0.0, "llama", False)),
            )
            ours = lambda t: kernel.rms_norm(t, w, eps=1e-6, cast_dtype=t.dtype)  # noqa: E731
            ref = _grad_ref(lambda t, wf: _rms_ref(t, wf), x, dy, w)
        else:
            liger = _liger("layer_norm", "LigerLayerNormFunction")
            eager = lambda t: F.layer_norm(t, (N,), w, b, 1e-5)  # noqa: E731
            cands = dict(
                F_layer_norm=eager,
                compile=_compile(eager) if "compile" in peers else None,
                liger=liger and (lambda t: liger.apply(t, w, b, 1e-5)),
            )
            ours = lambda t: kernel.layer_norm(t, w, b, eps=1e-5)  # noqa: E731
            ref = _grad_ref(lambda t, wf: F.layer_norm(t, (N,), wf, b.detach().double(), 1e-5), x, dy, w)
        providers, skipped = _with_peers({"ours": wrap(ours, x, dy, w)}, peers,
                                         **{k: (v and wrap(v, x, dy, w)) for k, v in cands.items()})
        return Workload(providers, ref, skipped=skipped, rtol=5e-2, atol=5e-2)

    return build


def _build_rms_latency(kernel, shape, dtype, device, peers):
    wl = _build_rms(kernel, shape, dtype, device, peers)
    return wl


_NORM_BIG = ((32768, 4096), (16384, 8192), (4096, 65536), (1024, 262144))
_NORM_SMALL = ((1, 4096), (16, 4096), (140, 4096), (256, 4096))

NORMS = (
    OpSpec("triton-norms", "rms_norm", "fwd", {"quick": ((32768, 4096), (4096, 65536)), "full": _NORM_BIG},
           "x read + y written (+ w)", lambda s, e: bytes_moved(s[0], s[1], e, 2, 1), _build_rms),
    OpSpec("triton-norms", "layer_norm", "fwd", {"quick": ((32768, 4096),), "full": _NORM_BIG[:3]},
           "x read + y written (+ w, b)", lambda s, e: bytes_moved(s[0], s[1], e, 2, 2), _build_ln),
    OpSpec("triton-norms", "add_rms_norm", "fwd", {"quick": ((32768, 4096),), "full": _NORM_BIG[:3]},
           "x, residual read + y, h written (+ w)", lambda s, e: bytes_moved(s[0], s[1], e, 4, 1), _build_add_rms),
    OpSpec("triton-norms", "rms_norm", "fwd+bwd", {"quick": ((32768, 4096),), "full": _NORM_BIG[:3]},
           "fwd: x read, y written; bwd: x, dy read, dx written (+ w read twice, dw written)",
           lambda s, e: bytes_moved(s[0], s[1], e, 5, 3), _norm_grad_builder("rms", False)),
    OpSpec("triton-norms", "rms_norm", "bwd", {"quick": ((32768, 4096),), "full": _NORM_BIG[:3]},
           "x, w, dy read + dx, dw written (the issue's count)", lambda s, e: bytes_moved(s[0], s[1], e, 3, 2),
           _norm_grad_builder("rms", True)),
    OpSpec("triton-norms", "layer_norm", "fwd+bwd", {"quick": ((32768, 4096),), "full": _NORM_BIG[:3]},
           "fwd: x read, y written; bwd: x, dy read, dx written (+ w, b; dw, db)",
           lambda s, e: bytes_moved(s[0], s[1], e, 5, 5), _norm_grad_builder("ln", False)),
    OpSpec("triton-norms", "layer_norm", "bwd", {"quick": (), "full": _NORM_BIG[:3]},
           "x, w, dy read + dx, dw, db written", lambda s, e: bytes_moved(s[0], s[1], e, 3, 3),
           _norm_grad_builder("ln", True)),
    OpSpec("triton-norms", "rms_norm", "latency", {"quick": ((1, 4096), (256, 4096)), "full": _NORM_SMALL},
           "wall time per call from Python (a loop of calls, one sync at the end)", None, _build_rms_latency, metric="us/call"),
)


# ------------------------------------------------------------------ triton-activations
def _gated_builder(name: str, act: str, grad: bool = False, view: bool = False):
    """``view``: x is the first half of a (M, 4d) tensor (``chunk(2, -1)[0]``, row stride 4d), as where a wider
    projection is split before the activation; ours, eager and torch.compile read that view as it is, Liger (two
    tensors) contiguous copies of its halves made outside the timing."""
    def build(kernel, shape, dtype, device, peers):
        import torch
        import torch.nn.functional as F

        M, d = shape
        x = torch.randn(M, 4 * d, device=device, dtype=dtype).chunk(2, -1)[0] if view else \
            torch.randn(M, 2 * d, device=device, dtype=dtype)
        fn = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
        liger = _liger("swiglu", "LigerSiLUMulFunction") if act == "silu" else _liger("geglu", "LigerGELUMulFunction")
        a, b = x[:, :d].contiguous(), x[:, d:].contiguous()  # Liger takes the halves as two tensors
        eager = lambda t: fn(t[:, :d]) * t[:, d:]  # noqa: E731

        def ref():
            xd = x.detach().double()
            return fn(xd[:, :d]) * xd[:, d:]

        if not grad:
            compiled = _compile(eager) if "compile" in peers else None
            providers, skipped = _with_peers(
                {"ours": lambda: getattr(kernel, name)(x)}, peers,
                eager=lambda: eager(x), compile=compiled and (lambda: compiled(x)),
                liger=liger and (lambda: liger.apply(a, b)),
            )
            return Workload(providers, ref, skipped=skipped)
        x.requires_grad_(True)
        dy = torch.randn(M, d, device=device, dtype=dtype)
        cands = dict(eager=eager, compile=_compile(eager) if "compile" in peers else None,
                     liger=liger and (lambda t: liger.apply(t[:, :d], t[:, d:])))
        providers, skipped = _with_peers({"ours": _fwd_bwd(lambda t: getattr(kernel, name)(t), x, dy)}, peers,
                                         **{k: (v and _fwd_bwd(v, x, dy)) for k, v in cands.items()})
        gref = _grad_ref(lambda t, _w: fn(t[:, :d]) * t[:, d:], x, dy)
        return Workload(providers, gref, skipped=skipped)

    return build


def _act_and_mul_builder(act: str):
    """``act_and_mul(gate, up)``: two (M, d) tensors, as a gated MLP's two projections give them."""
    def build(kernel, shape, dtype, device, peers):
        import torch
        import torch.nn.functional as F

        M, d = shape
        g, u = (torch.randn(M, d, device=device, dtype=dtype) for _ in range(2))
        fn = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
        liger = _liger("swiglu", "LigerSiLUMulFunction") if act == "silu" else _liger("geglu", "LigerGELUMulFunction")
        eager = lambda a, b: fn(a) * b  # noqa: E731
        compiled = _compile(eager) if "compile" in peers else None
        providers, skipped = _with_peers(
            {"ours": lambda: kernel.act_and_mul(g, u, activation=act)}, peers,
            eager=lambda: eager(g, u), compile=compiled and (lambda: compiled(g, u)),
            liger=liger and (lambda: liger.apply(g, u)),
        )
        return Workload(providers, lambda: fn(g.double()) * u.double(), skipped=skipped)

    return build


def _plain_builder(name: str, act):
    def build(kernel, shape, dtype, device, peers):
        import torch

        x = torch.randn(shape, device=device, dtype=dtype)
        f = act()
        compiled = _compile(f) if "compile" in peers else None
        providers, skipped = _with_peers({"ours": lambda: getattr(kernel, name)(x)}, peers,
                                         eager=lambda: f(x), compile=compiled and (lambda: compiled(x)))
        return Workload(providers, lambda: f(x.double()), skipped=skipped)

    return build


def _silu():
    import torch.nn.functional as F

    return F.silu


def _gelu():
    import torch.nn.functional as F

    return F.gelu


_ACT = ((16384, 14336), (4096, 14336), (65536, 1536))
ACTIVATIONS = (
    OpSpec("triton-activations", "silu_and_mul", "fwd", {"quick": ((16384, 14336),), "full": _ACT},
           "x (M, 2d) read + y (M, d) written; shape is (M, d)", lambda s, e: bytes_moved(s[0], s[1], e, 3), _gated_builder("silu_and_mul", "silu")),
    OpSpec("triton-activations", "gelu_tanh_and_mul", "fwd", {"quick": (), "full": _ACT[:1]},
           "x (M, 2d) read + y (M, d) written", lambda s, e: bytes_moved(s[0], s[1], e, 3), _gated_builder("gelu_tanh_and_mul", "gelu_tanh")),
    OpSpec("triton-activations", "silu_and_mul", "fwd (chunk view)", {"quick": (), "full": _ACT[:1]},
           "x (M, 2d), a chunk view of (M, 4d), read + y (M, d) written", lambda s, e: bytes_moved(s[0], s[1], e, 3),
           _gated_builder("silu_and_mul", "silu", view=True)),
    OpSpec("triton-activations", "gelu_tanh_and_mul", "fwd (chunk view)", {"quick": (), "full": _ACT[:1]},
           "x (M, 2d), a chunk view of (M, 4d), read + y (M, d) written", lambda s, e: bytes_moved(s[0], s[1], e, 3),
           _gated_builder("gelu_tanh_and_mul", "gelu_tanh", view=True)),
    OpSpec("triton-activations", "silu_and_mul", "fwd+bwd", {"quick": ((16384, 14336),), "full": _ACT[:1]},
           "fwd: x (2d) read, y (d) written; bwd: dy (d), x (2d) read, dx (2d) written", lambda s, e: bytes_moved(s[0], s[1], e, 8),
           _gated_builder("silu_and_mul", "silu", grad=True)),
    OpSpec("triton-activations", "gelu_tanh_and_mul", "fwd+bwd", {"quick": (), "full": _ACT[:1]},
           "fwd: x (2d) read, y (d) written; bwd: dy (d), x (2d) read, dx (2d) written", lambda s, e: bytes_moved(s[0], s[1], e, 8),
           _gated_builder("gelu_tanh_and_mul", "gelu_tanh", grad=True)),
    OpSpec("triton-activations", "act_and_mul", "fwd", {"quick": (), "full": _ACT[:1]},
           "act_and_mul(gate, up) silu: gate (d) and up (d) read + y (d) written", lambda s, e: bytes_moved(s[0], s[1], e, 3),
           _act_and_mul_builder("silu")),
    OpSpec("triton-activations", "silu", "fwd", {"quick": (), "full": _ACT[:1]},
           "x read + y written", lambda s, e: bytes_moved(s[0], s[1], e, 2), _plain_builder("silu", _silu)),
    OpSpec("triton-activations", "gelu", "fwd", {"quick": (), "full": _ACT[:1]},
           "x read + y written", lambda s, e: bytes_moved(s[0], s[1], e, 2), _plain_builder("gelu", _gelu)),
)


# ------------------------------------------------------------------ triton-softmax
def _softmax_builder(log: bool, grad: bool = False):
    def build(kernel, shape, dtype, device, peers):
        import torch

        x = torch.randn(shape, device=device, dtype=dtype)
        tf = torch.log_softmax if log else torch.softmax
        ours_fn = kernel.log_softmax if log else kernel.softmax
        liger = None if log else _liger("softmax", "LigerSoftmaxFunction")
        eager = lambda t: tf(t, -1)  # noqa: E731
        key = "torch_log_softmax" if log else "torch_softmax"
        if not grad:
            compiled = _compile(eager) if "compile" in peers else None
            providers, skipped = _with_peers({"ours": lambda: ours_fn(x)}, peers,
                                             **{key: lambda: eager(x)}, compile=compiled and (lambda: compiled(x)),
                                             liger=liger and (lambda: liger.apply(x)))
            return Workload(providers, lambda: tf(x.double(), -1), skipped=skipped)
        x.requires_grad_(True)
        dy = torch.randn_like(x)
        cands = {key: eager, "compile": _compile(eager) if "compile" in peers else None,
                 "liger": liger and (lambda t: liger.apply(t))}
        providers, skipped = _with_peers({"ours": _fwd_bwd(ours_fn, x, dy)}, peers,
                                         **{k: (v and _fwd_bwd(v, x, dy)) for k, v in cands.items()})
        return Workload(providers, _grad_ref(lambda t, _w: tf(t, -1), x, dy), skipped=skipped)

    return build


def _build_ce(kernel, shape, dtype, device, peers):
    import torch
    import torch.nn.functional as F

    M, V = shape
    x = torch.randn(M, V, device=device, dtype=dtype).requires_grad_(True)
    t = torch.randint(0, V, (M,), device=device)
    t[::7] = -100
    liger = _liger("cross_entropy", "LigerCrossEntropyFunction")
    xl = x.detach().clone().requires_grad_(True)  # Liger writes the gradient into its input

    def run(f, inp):
        def go():
            inp.grad = None
            f(inp).backward()
            return inp.grad

        return go

    eager = lambda z: F.cross_entropy(z, t)  # noqa: E731
    compiled = _compile(eager) if "compile" in peers else None
    providers, skipped = _with_peers(
        {"ours": run(lambda z: kernel.cross_entropy(z, t), x)}, peers,
        F_cross_entropy=run(eager, x),
        compile=compiled and run(compiled, x),
        liger=liger and run(lambda z: liger.apply(z, t, None, -100, 0.0, 0.0, "mean", None, False, False, False)[0], xl),
    )

    def ref():
        xd = x.detach().double().requires_grad_(True)
        F.cross_entropy(xd, t).backward()
        return xd.grad

    # gradient entries are ~1/count (the -1 of the target column): an absolute tolerance must scale with it
    return Workload(providers, ref, skipped=skipped, rtol=5e-2, atol=2e-2 / M)


SOFTMAX = (
    # full: issue 4's range of widths, N = 1024 ... 262144 (256 MiB inputs but the last, 128 MiB)
    OpSpec("triton-softmax", "softmax", "fwd", {"quick": ((4096, 32768),), "full": (
        (131072, 1024), (32768, 4096), (4096, 32768), (2048, 131072), (256, 262144))},
           "x read + y written", lambda s, e: bytes_moved(s[0], s[1], e, 2), _softmax_builder(False)),
    OpSpec("triton-softmax", "log_softmax", "fwd", {"quick": (), "full": ((4096, 32768),)},
           "x read + y written", lambda s, e: bytes_moved(s[0], s[1], e, 2), _softmax_builder(True)),
    OpSpec("triton-softmax", "softmax", "fwd+bwd", {"quick": (), "full": ((4096, 32768),)},
           "fwd: x read, y written; bwd: y, dy read, dx written", lambda s, e: bytes_moved(s[0], s[1], e, 5), _softmax_builder(False, True)),
    OpSpec("triton-softmax", "cross_entropy", "fwd+bwd", {"quick": ((8192, 128256),), "full": ((8192, 128256), (4096, 32000))},
           "logits read + gradient written (targets negligible)", lambda s, e: bytes_moved(s[0], s[1], e, 2), _build_ce),
)


# ------------------------------------------------------------------ triton-matmul
def _matmul_builder(activation: str | None):
    def build(kernel, shape, dtype, device, peers):
        import torch
        import torch.nn.functional as F

        M, N, K = shape
        a = torch.randn(M, K, device=device, dtype=dtype) / math.sqrt(K) ** 0.5
        b = torch.randn(K, N, device=device, dtype=dtype) / math.sqrt(K) ** 0.5
        bias = torch.randn(N, device=device, dtype=dtype) * 0.1 if activation else None
        if activation is None:
            eager = lambda: torch.matmul(a, b)  # noqa: E731
            ref = lambda: a.double() @ b.double()  # noqa: E731
            cands = {"torch_matmul": eager}
        else:
            act = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
            f = lambda a, b: act(torch.addmm(bias, a, b))  # noqa: E731
            compiled = _compile(f) if "compile" in peers else None
            ref = lambda: act(a.double() @ b.double() + bias.double())  # noqa: E731
            cands = {"eager": lambda: f(a, b), "compile": compiled and (lambda: compiled(a, b))}
        providers, skipped = _with_peers({"ours": lambda: kernel.matmul(a, b, bias, activation)}, peers, **cands)
        return Workload(providers, ref, skipped=skipped, rtol=3e-2, atol=3e-2)

    return build


MATMUL = (
    OpSpec("triton-matmul", "matmul", "fwd", {"quick": ((4096, 4096, 4096),), "full": ((4096, 4096, 4096), (8192, 8192, 8192), (16, 14336, 4096), (8192, 14336, 4096))},
           "2*M*N*K FLOPs; shape is (M, N, K)", lambda s, e: 2 * s[0] * s[1] * s[2], _matmul_builder(None), metric="TFLOP/s"),
    OpSpec("triton-matmul", "matmul+bias+gelu_tanh", "fwd", {"quick": (), "full": ((8192, 8192, 8192),)},
           "2*M*N*K FLOPs (epilogue not counted)", lambda s, e: 2 * s[0] * s[1] * s[2], _matmul_builder("gelu_tanh"), metric="TFLOP/s"),
)

# ------------------------------------------------------------------ triton-attention
def _attention_builder(causal: bool, grad: bool = False):
    def build(kernel, shape, dtype, device, peers):
        import torch
        import torch.nn.functional as F

        B, H, S, D = shape
        q, k, v = (torch.randn(B, H, S, D, device=device, dtype=dtype) for _ in range(3))
        sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        ours = lambda q, k, v: kernel.flash_attention(q, k, v, causal=causal)  # noqa: E731
        if not grad:
            providers, skipped = _with_peers({"ours": lambda: ours(q, k, v)}, peers,
                                             torch_sdpa=lambda: sdpa(q, k, v))
            # fp64 reference one head at a time: all heads of 1 x 32 x 16384 causal at once ran out of the H200's
            # memory (scores and mask in fp64, 2026-12-03)
            return Workload(providers, lambda: torch.cat([sdpa(*(t[:, h:h + 1].double() for t in (q, k, v)))
                                                          for h in range(H)], 1), skipped=skipped)
        for t in (q, k, v):
            t.requires_grad_(True)
        do = torch.randn_like(q)

        def fb(f):
            def run():
                q.grad = k.grad = v.grad = None
                f(q, k, v).backward(do)
                return q.grad

            return run

        def ref():
            qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
            sdpa(qd, kd, vd).backward(do.double())
            return qd.grad

        providers, skipped = _with_peers({"ours": fb(ours)}, peers, torch_sdpa=fb(sdpa))
        return Workload(providers, ref, skipped=skipped, rtol=5e-2, atol=5e-2)

    return build


def _decode_heads(H: int) -> int:
    """The kv heads of the decode rows: a group of 4 query heads per kv head (Llama-3-8B's 32 / 8), at least one."""
    return max(1, H // 4)


def _build_decode(kernel, shape, dtype, device, peers):
    """A GQA decode step: one query per sequence over ``Sk`` cached keys, [B, H, 1, D] against [B, H // 4, Sk, D]."""
    import torch
    import torch.nn.functional as F

    B, H, Sk, D = shape
    Hk = _decode_heads(H)
    q = torch.randn(B, H, 1, D, device=device, dtype=dtype)
    k, v = (torch.randn(B, Hk, Sk, D, device=device, dtype=dtype) for _ in range(2))
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hk != H)  # noqa: E731
    providers, skipped = _with_peers({"ours": lambda: kernel.flash_attention(q, k, v)}, peers,
                                     torch_sdpa=lambda: sdpa(q, k, v))
    return Workload(providers, lambda: sdpa(q.double(), k.double(), v.double()), skipped=skipped)


def _decode_bytes(shape, elem: int) -> int:
    B, H, Sk, D = shape
    return (2 * B * _decode_heads(H) * Sk * D + 2 * B * H * D) * elem


def _attn_flops(shape, causal: bool, passes: float) -> int:
    B, H, S, D = shape
    return int(passes * 4 * B * H * S * S * D * (0.5 if causal else 1.0))


ATTENTION = (
    # full: also Flux's joint attention (24 heads, 4608 tokens) and SD3.5-large's (38 heads of 64, 4429 tokens)
    OpSpec("triton-attention", "flash_attention", "fwd", {"quick": ((4, 32, 4096, 128),), "full": (
               (4, 32, 4096, 128), (1, 32, 16384, 128), (1, 24, 4608, 128), (2, 38, 4429, 64))},
           "4*B*H*S*S*D FLOPs (two matmuls); shape is (B, H, S, D)", lambda s, e: _attn_flops(s, False, 1.0),
           _attention_builder(False), metric="TFLOP/s"),
    OpSpec("triton-attention", "flash_attention causal", "fwd", {"quick": (), "full": ((4, 32, 4096, 128), (1, 32, 16384, 128))},
           "half of 4*B*H*S*S*D FLOPs", lambda s, e: _attn_flops(s, True, 1.0), _attention_builder(True), metric="TFLOP/s"),
    OpSpec("triton-attention", "flash_attention causal", "fwd+bwd", {"quick": (), "full": ((4, 32, 4096, 128),)},
           "fwd + bwd = 3.5x the forward's FLOPs (bwd: 5 matmuls, counted as FlashAttention-2 does: 2.5x)",
           lambda s, e: _attn_flops(s, True, 3.5), _attention_builder(True, grad=True), metric="TFLOP/s"),
    # a decode step's cache read (GQA, 4 query heads per kv head), at sizes past the L2 the timing flushes
    OpSpec("triton-attention", "flash_attention decode", "fwd", {"quick": ((1, 32, 131072, 128),), "full": (
               (1, 32, 131072, 128), (8, 32, 16384, 128), (32, 32, 4096, 128))},
           "k, v read + q read, o written; shape is (B, H, Sk, D), H // 4 kv heads, one query", _decode_bytes,
           _build_decode),
)

REGISTRY: dict[str, tuple[OpSpec, ...]] = {
    "triton-norms": NORMS,
    "triton-activations": ACTIVATIONS,
    "triton-softmax": SOFTMAX,
    "triton-matmul": MATMUL,
    "triton-attention": ATTENTION,
}
"""Hub package name -> the op specs ``bench`` runs for it. A new package is one entry."""


def package_names() -> list[str]:
    return list(REGISTRY)


def resolve_packages(names: list[str] | None) -> list[str]:
    """Hub names for user-given names (``norms``, ``triton-norms`` or ``triton_norms``); all when empty.

    Raises:
        ValueError: a name that is not in :data:`REGISTRY`, listing the known ones.
    """
    if not names:
        return package_names()
    out = []
    for name in names:
        key = name.replace("_", "-")
        key = key if key.startswith("triton-") else f"triton-{key}"
        if key not in REGISTRY:
            raise ValueError(f"bench: unknown package {name!r}; known: {', '.join(REGISTRY)}")
        if key not in out:
            out.append(key)
    return out


def specs_for(packages: list[str], shapes: str) -> list[tuple[OpSpec, Shape]]:
    """Every (spec, shape) of the named packages in the ``quick`` or ``full`` sweep, in registry order."""
    if shapes not in ("quick", "full"):
        raise ValueError(f"bench: shapes must be 'quick' or 'full', got {shapes!r}")
    return [(spec, shape) for pkg in packages for spec in REGISTRY[pkg] for shape in spec.shapes[shapes]]
