"""What the GPU sweep scripts share (softmax, cross-entropy, norms, activations: ``benchmarks/*_sweep.py``).

They are run as ``python3 benchmarks/<script>.py`` from the checkout (this folder is then on
``sys.path``). ``prepare`` must run before torch or triton is imported (it sets the interpreter
and an offline, private HF cache); nothing here imports torch or triton at module level.

A ``Sweep`` is one run's clock, log and records: ``left()`` seconds of the budget, ``log`` lines
stamped with the time since the start, ``record`` one JSON object per line appended to the records
file (so a timeout keeps what was measured), ``safe`` runs a step unless the budget is spent and
turns an exception into an ``error`` record, ``timeit`` times a function (``triton.testing.do_bench``
median on the GPU, one call under the interpreter) and records its GB/s against the copy ceiling
that ``copy_ceiling`` measured (a 1 GiB fp32 device-to-device copy: read + write).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def prepare(out: str, cpu: bool) -> Path:
    """Creates the output folder and sets the environment (before torch/triton are imported):
    ``TRITON_INTERPRET=1`` for a CPU dry run, ``src`` importable, a private offline HF cache."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    if cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, "src")
    from triton_collection.scratch import scratch_dir

    if "HF_HOME" not in os.environ:
        os.environ["HF_HOME"] = str(scratch_dir("sweep-hf-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    return path


class Sweep:
    """One run: budget, log, records, timing (see the module docstring).

    ``rep``: do_bench's measuring time in ms; ``min_left``: seconds of budget ``safe`` needs by default;
    ``err_chars``: how much of an exception's message is logged and recorded; ``trace``: also print the
    traceback (3 frames); ``widths``: log columns (section, name, shape, microseconds, GB/s);
    ``json_default``: ``json.dumps``'s ``default`` for the records.
    """

    def __init__(self, rec: Path, budget: float, cpu: bool, rep: int, min_left: float = 5, err_chars: int = 300,
                 trace: bool = False, widths=(14, 34, 18, 9, 7), json_default=None):
        self.t0 = time.time()
        self.rec, self.budget, self.cpu, self.rep = rec, budget, cpu, rep
        self.min_left, self.err_chars, self.trace, self.widths = min_left, err_chars, trace, widths
        self.json_default = json_default
        self.dev = "cpu" if cpu else "cuda"
        self.copy = float("nan")

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    def log(self, *a):
        print(f"[{time.time() - self.t0:6.1f}s]", *a, flush=True)

    def record(self, **kw):
        kw["t"] = round(time.time() - self.t0, 1)
        with open(self.rec, "a") as f:
            f.write(json.dumps(kw, default=self.json_default) + "\n")

    def bench(self, fn, graph: bool = False) -> float:
        """Milliseconds per call: do_bench's median on the GPU, or with ``graph`` the median of CUDA-graph replays
        (the kernels' time without the host's Python: ``triton_collection.bench.graph_median``); one timed call
        under the interpreter."""
        if self.cpu:
            t = time.time()
            fn()
            return (time.time() - t) * 1e3
        if graph:
            from triton_collection.bench import graph_median

            return graph_median(fn, rep=self.rep)
        from triton.testing import do_bench

        return do_bench(fn, warmup=3, rep=self.rep, return_mode="median")

    def safe(self, name, fn, need=None):
        """``fn()``, or None when fewer than ``need`` seconds are left or it raised (logged and recorded)."""
        if self.left() < (self.min_left if need is None else need):
            self.log("SKIP (time)", name)
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            self.log("ERR", name, type(e).__name__, str(e)[:self.err_chars])
            if self.trace:
                traceback.print_exc(limit=3)
            self.record(kind="error", name=name, error=f"{type(e).__name__}: {str(e)[:self.err_chars]}")
            return None

    def copy_ceiling(self) -> float:
        """The device's copy bandwidth in GB/s (NaN under the interpreter), logged and recorded (kind "copy")."""
        if self.dev == "cuda":
            import torch

            x0 = torch.empty(2**28 // 2, dtype=torch.float32, device=self.dev)
            y0 = torch.empty_like(x0)
            ms = self.bench(lambda: y0.copy_(x0))
            self.copy = 2 * x0.numel() * 4 / ms / 1e6
            del x0, y0
        self.log(f"copy ceiling {self.copy:.0f} GB/s")
        self.record(kind="copy", gbps=self.copy)
        return self.copy

    def timeit(self, section, name, fn, nbytes, need=None, graph: bool = False, **extra):
        """Times ``fn`` (one warm-up call first; ``graph``: CUDA-graph replays, see ``bench``) through ``safe``; logs
        and records us, GB/s and the fraction of the copy ceiling; returns the GB/s (None when skipped or failed)."""
        ws, wn, wshape, wus, wgb = self.widths

        def run():
            fn()  # compile / warm up
            ms = self.bench(fn, graph)
            gbps = nbytes / ms / 1e6
            self.log(f"{section:{ws}s} {name:{wn}s} {extra.get('shape', '')!s:{wshape}s} {ms * 1e3:{wus}.1f} us "
                     f"{gbps:{wgb}.0f} GB/s ({gbps / self.copy:.0%})")
            self.record(kind="time", section=section, name=name, us=ms * 1e3, gbps=gbps, frac=gbps / self.copy,
                        **extra)
            return gbps
        return self.safe(f"{section} {name}", run, need)


def tee(path: Path):
    """A ``print`` that also appends each line to ``path``."""
    log = open(path, "a")

    def say(*a):
        print(*a, flush=True)
        print(*a, file=log, flush=True)
    return say


def copy_gbps(timer) -> float:
    """The device's copy GB/s (bytes read + written) of a 512 MiB bf16 buffer, timed by ``timer(fn) -> ms``."""
    import torch

    a = torch.empty(2**28 // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() * 2 / timer(lambda: b.copy_(a)) / 1e6


_CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout this file belongs to


def load_packages(names, cpu: bool, root: Path = _CHECKOUT) -> list:
    """The packages ``names`` (Hub names) built from the checkout at ``root`` (default: this file's, whatever the
    working directory) into a temporary folder and loaded
    with ``kernels.get_local_kernel`` (the ``cpu`` variant for a dry run, else ``cuda``), in the order given.
    Builds of different sources load as different modules, so two checkouts can be timed in one process."""
    import kernels
    from triton_collection.build import build_collection
    from triton_collection.manifest import load_manifest
    from triton_collection.scratch import scratch_dir

    builds = build_collection(load_manifest(root), scratch_dir("sweep-build-") / "hub", packages=list(names),
                              cpu_variant=cpu)
    by_name = {b.package.name: b for b in builds}
    return [kernels.get_local_kernel(by_name[n].variant("cpu" if cpu else "cuda")) for n in names]


def ab_sides(package: str, peer: str, base: str) -> dict:
    """The sides of a host-time A/B (``benchmarks/*_host_time.py``): ``{peer: peer, "new": this checkout's build of
    ``package``, "base": the build of the checkout at ``base`` (when given)}``; prints the GPU and versions."""
    import torch
    import triton

    (new,) = load_packages([package], cpu=False)
    sides = {peer: peer, "new": new}
    if base:
        (sides["base"],) = load_packages([package], cpu=False, root=Path(base))
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    return sides


def time_sides_in_turn(row: dict, sides: dict, make_fn, rounds: int, grad: bool, *, host_samples: int,
                       calls: int, graph: bool = True) -> dict:
    """Adds to ``row`` each side's ``host`` (one call on an idle GPU, median of ``host_samples``), ``per call``
    (``calls`` back to back, one sync, median of 3) and ``gpu`` (a CUDA-graph replay; NaN without ``graph``) in
    us, the sides taken in turn within each of ``rounds`` rounds, the smallest over the rounds (the host drifts).
    ``make_fn(side)`` gives the call to time (forward and backward when ``grad``)."""
    import torch

    from triton_collection.bench import graph_median, host_us_per_call, wall_us_per_call

    samples: dict = {}
    for _ in range(rounds):
        for name, side in sides.items():
            fn = make_fn(side)
            with torch.enable_grad() if grad else torch.no_grad():
                measures = {"host": host_us_per_call(fn, samples=host_samples),
                            "per call": wall_us_per_call(fn, calls=calls, repeats=3),
                            "gpu": graph_median(fn, rep=50) * 1e3 if graph else float("nan")}
            for key, value in measures.items():
                samples.setdefault(f"{name} {key}", []).append(value)
    row.update({key: min(values) for key, values in samples.items()})
    return row


class ActivationInternals:
    """A triton-activations build (``load_packages``) with the modules the launch-rule sweeps patch: ``pkg`` (the
    public API), ``activation``, ``functional``, ``launch`` (``_launch``) and ``fast_math`` (``_fast_math``)."""

    def __init__(self, cpu: bool, root: Path = Path(".")):
        (self.pkg,) = load_packages(["triton-activations"], cpu, root)
        name = self.pkg.__name__
        self.activation = sys.modules[f"{name}.activation"]
        self.functional = sys.modules[f"{name}.functional"]
        self.launch = sys.modules[f"{name}._launch"]
        self.fast_math = sys.modules[f"{name}._fast_math"]

    def reset_plans(self):
        """Forgets every cached launch config and plan, so that patched launch rules take effect."""
        self.launch.pick_config.cache_clear()
        self.activation._PLANS.clear()
        self.functional._INFER_PLANS.clear()


def load_liger(log):
    """(Liger's softmax function, Liger's CrossEntropyLoss module), None for each that does not import."""
    liger_sm = liger_ce = None
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        liger_sm = LigerSoftmaxFunction.apply
    except Exception as e:  # noqa: BLE001
        log("no liger softmax", e)
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
        liger_ce = LigerCrossEntropyLoss()
    except Exception as e:  # noqa: BLE001
        log("no liger CE", e)
    return liger_sm, liger_ce


def capture_cuda_graph(step, reset):
    """A CUDA graph of one ``step()`` (PyTorch's recipe: two warm-up steps on a side stream, then the capture),
    with ``reset()`` (e.g. clearing ``.grad``) before each warm-up step and before the capture. Returns
    ``(graph, what step() returned during the capture)``."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            reset()
            step()
    torch.cuda.current_stream().wait_stream(side)
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def ulp_diff(a, ref, dtype) -> float:
    """max |a - ref| in units of ref's ulp in ``dtype`` (ref fp64; subnormal ulps below the smallest normal)."""
    import torch

    mant = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}[dtype]
    emin = {torch.float32: -126, torch.float16: -14, torch.bfloat16: -126}[dtype]
    _, e = torch.frexp(ref.double().nan_to_num(0.0, 0.0, 0.0))
    ulp = torch.pow(2.0, ((e - 1).clamp(min=emin) - mant).double())
    return float(((a.double() - ref.double()).abs() / ulp).nan_to_num(0.0).max())


def ce_ref(x, t, **kw):
    """fp64 reference of ``cross_entropy``: F.cross_entropy's loss + z_loss * logsumexp^2 on non-ignored rows,
    then the reduction ("mean" over the non-ignored rows)."""
    import torch
    import torch.nn.functional as F

    z = kw.pop("z_loss", 0.0)
    red = kw.pop("reduction", "mean")
    loss = F.cross_entropy(x.double(), t, reduction="none", **kw)
    ig = kw.get("ignore_index", -100)
    loss = loss + z * torch.logsumexp(x.double(), 1).square() * (t != ig)
    if red == "none":
        return loss
    return loss.sum() / ((t != ig).sum() if red == "mean" else 1)


def norm_grad_inputs(kind: str, M: int, N: int, dev: str):
    """Fresh bf16 inputs of a norm's backward: ``(x, w, b, dy, ins)`` with x, w, b requiring grad (w in
    [0.5, 1.5), b zeros) and ``ins`` the tensors a gradient is taken for ((x, w), or (x, w, b) for layer_norm)."""
    import torch

    x = torch.randn(M, N, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.rand(N, device=dev) + 0.5).to(torch.bfloat16).requires_grad_()
    b = torch.zeros(N, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    return x, w, b, dy, ((x, w) if kind == "rms_norm" else (x, w, b))
