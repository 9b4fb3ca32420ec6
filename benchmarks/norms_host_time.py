"""Host time of the norm backwards (triton-norms) against torch's, on a GPU: where a forward+backward call spends
its host time (issue 7's fwd+bwd >= 3500 GB/s: at 32768 x 4096 the kernels alone move 3651 GB/s, a call 2784).

    python3 benchmarks/norms_host_time.py [ROOT ...]   (from the checkout; PYTHONPATH with kernels installed)

``ROOT``: checkouts to build triton-norms from (default: this one); with several, the package cases run for each
(an A/B in one process, e.g. ``git worktree add /tmp/old <commit>``), the profiles for the first.

Per case: the host time (the median wall time of one call started on an idle GPU, as the harness's
``host_us_per_call``, over 200 calls), the time per call of 100 back-to-back calls with one sync at the end (median of
5), and do_bench's median (L2 flushed; median of 5). With several ROOTs the builds of one case are measured in
turn, call after call, so that the host's drift (up to 1.5x between runs on the H200's host) falls on each alike.
Then a cProfile of our backward's implementation called on the main thread, and a torch.profiler table of
``torch.autograd.grad`` (the autograd engine runs the backward on its device thread, which cProfile cannot see).
"""
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, "benchmarks")
from sweep_common import load_packages  # noqa: E402
from triton_collection.bench import wall_us_per_call  # noqa: E402

ROOTS = sys.argv[1:] or ["."]
PKGS = [load_packages(["triton-norms"], cpu=False, root=Path(r))[0] for r in ROOTS]
dev = "cuda"


M, N = 32768, 4096
x = torch.randn(M, N, device=dev, dtype=torch.bfloat16).requires_grad_(True)
w = (torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.5 + 1).requires_grad_(True)
b = torch.randn(N, device=dev, dtype=torch.bfloat16).requires_grad_(True)
dy = torch.randn_like(x)
F_rms = lambda t: F.rms_norm(t, (N,), w, 1e-6)  # noqa: E731
F_ln = lambda t: F.layer_norm(t, (N,), w, b, 1e-5)  # noqa: E731


def bwd(f, inputs):
    y = f(x)
    return lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True)


def fwd_bwd(f):
    def go():
        x.grad = w.grad = b.grad = None
        f(x).backward(dy)
    return go


rstd = torch.rand(M, device=dev) + 0.5
xd, wd = x.detach(), w.detach()


def package_cases(nm):
    rn = sys.modules[nm.__name__ + ".rms_norm"]
    ours_rms = lambda t: nm.rms_norm(t, w, eps=1e-6, cast_dtype=t.dtype)  # noqa: E731
    ours_ln = lambda t: nm.layer_norm(t, w, b, eps=1e-5)  # noqa: E731
    return {
        "rms bwd ours": bwd(ours_rms, (x, w)),
        "rms bwd ours impl (main thread)": lambda: rn._rms_norm_bwd_impl(
            dy, None, xd, wd, rstd, 0.0, torch.bfloat16, torch.bfloat16, None, True, None),  # no db (old: need_db)
        "rms bwd ours, no dw": bwd(ours_rms, (x,)),
        "rms fwd ours (grad)": lambda: ours_rms(x),
        "rms fwd+bwd ours": fwd_bwd(ours_rms),
        "ln bwd ours": bwd(ours_ln, (x, w, b)),
        "ln fwd+bwd ours": fwd_bwd(ours_ln),
    }


def interleaved_host_us(fns, rounds=200):
    """Median host µs per call (a sync before each) of each of ``fns``, called in turn round after round, so that
    the host's drift (this machine's host times move by up to 1.5x between runs) falls on all of them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, t in zip(fns, times):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            t.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return [statistics.median(t) for t in times]


def interleaved(fns, measure, rounds):
    """Median over ``rounds`` of ``measure(fn)`` for each of ``fns``, taken in turn."""
    values = [[] for _ in fns]
    for _ in range(rounds):
        for fn, v in zip(fns, values):
            v.append(measure(fn))
    return [statistics.median(v) for v in values]


by_root = [package_cases(nm) for nm in PKGS]
groups = [[(f"{k} [{root}]" if len(ROOTS) > 1 else k, cases[k]) for root, cases in zip(ROOTS, by_root)]
          for k in by_root[0]]
groups += [[(k, v)] for k, v in {
    "rms bwd F": bwd(F_rms, (x, w)),
    "rms fwd+bwd F": fwd_bwd(F_rms),
    "ln bwd F": bwd(F_ln, (x, w, b)),
    "ln fwd+bwd F": fwd_bwd(F_ln),
    "empty (M, N)": lambda: torch.empty(M, N, device=dev, dtype=torch.bfloat16),
    "grad of x * 2": bwd(lambda t: t * 2, (x,)),
}.items()]
for group in groups:
    names, fns = zip(*group)
    host = interleaved_host_us(fns)
    pipelined = interleaved(fns, lambda fn: wall_us_per_call(fn, calls=100, repeats=1), 5)
    bench = interleaved(fns, lambda fn: do_bench(fn, rep=50) * 1e3, 5)
    for name, h, p, d in zip(names, host, pipelined, bench):
        print(f"{name:44s} host {h:7.1f} us  pipelined {p:7.1f} us/call  do_bench {d:7.1f} us", flush=True)

first = package_cases(PKGS[0])
pr = cProfile.Profile()
for _ in range(40):
    torch.cuda.synchronize()
    pr.enable(); first["rms bwd ours impl (main thread)"](); pr.disable()
torch.cuda.synchronize()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(20)
print("=== cProfile: rms bwd ours impl (main thread), 40 calls"); print(s.getvalue()[-5000:])
from torch.profiler import ProfilerActivity, profile  # noqa: E402

for name, fn in (("rms bwd ours", first["rms bwd ours"]), ("rms bwd F", bwd(F_rms, (x, w)))):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            torch.cuda.synchronize(); fn()
        torch.cuda.synchronize()
    print("=== torch.profiler (CPU, 10 calls):", name)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=22, max_name_column_width=55))
