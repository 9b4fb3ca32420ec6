"""Host time per call of triton-softmax's softmax and cross-entropy (forward + backward) against torch's, on a GPU.

    python3 benchmarks/softmax_host_time.py      (from the checkout; PYTHONPATH with kernels installed)

Prints, per case, the median wall time of one call started on an idle GPU (a sync before each: the host's
Python, allocations and launches) and, for the small shapes, the time per call of 300 back-to-back calls;
then a cProfile and a torch.profiler table of the small cases. Session 16: results/host_time_session16_2026-12-02.txt.
"""
import cProfile, pstats, io, statistics, sys, time, torch, torch.nn.functional as F
sys.path.insert(0, "benchmarks")
from sweep_common import load_packages
(sm,) = load_packages(["triton-softmax"], cpu=False)
dev = "cuda"

def host_us(fn, samples=30):
    fn(); fn()
    ts = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)

def fwd_bwd(f, x, dy=None):
    def go():
        x.grad = None
        out = f(x)
        out.backward(dy) if dy is not None else out.backward()
    return go

M, V = 4096, 32000
x = torch.randn(M, V, device=dev, dtype=torch.bfloat16).requires_grad_(True)
t = torch.randint(0, V, (M,), device=dev); t[::7] = -100
xs = torch.randn(4096, 32768, device=dev, dtype=torch.bfloat16).requires_grad_(True)
dys = torch.randn_like(xs)
xsm = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16).requires_grad_(True)
dysm = torch.randn_like(xsm)
cases = {
    "ce ours": fwd_bwd(lambda z: sm.cross_entropy(z, t), x),
    "ce F": fwd_bwd(lambda z: F.cross_entropy(z, t), x),
    "ce ours fwd only (grad)": lambda: sm.cross_entropy(x, t),
    "ce ours no_grad": lambda: sm.cross_entropy(x.detach(), t),
    "softmax ours": fwd_bwd(lambda z: sm.softmax(z), xs, dys),
    "softmax F": fwd_bwd(lambda z: torch.softmax(z, -1), xs, dys),
    "softmax ours fwd (grad)": lambda: sm.softmax(xs),
    "softmax small ours": fwd_bwd(lambda z: sm.softmax(z), xsm, dysm),
    "softmax small F": fwd_bwd(lambda z: torch.softmax(z, -1), xsm, dysm),
    "empty": lambda: torch.empty(16, device=dev),
    "x*x small": lambda: xsm * xsm,
}
def pipe_us(fn, n=300):
    fn(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best

xc = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16).requires_grad_(True)
tc = torch.randint(0, 4096, (64,), device=dev)
cases["ce small ours"] = fwd_bwd(lambda z: sm.cross_entropy(z, tc), xc)
cases["ce small F"] = fwd_bwd(lambda z: F.cross_entropy(z, tc), xc)
for name, fn in cases.items():
    print(f"{name:28s} host {host_us(fn):8.1f} us", flush=True)
for name in ("softmax small ours", "softmax small F", "ce small ours", "ce small F"):
    print(f"{name:28s} pipelined {pipe_us(cases[name]):8.1f} us per call", flush=True)

for name in ("ce small ours", "softmax small ours"):
    fn = cases[name]
    pr = cProfile.Profile()
    for _ in range(40):
        torch.cuda.synchronize()
        pr.enable(); fn(); pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print("=== cProfile", name); print(s.getvalue()[-6000:])
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.cuda.synchronize(); fn()
        torch.cuda.synchronize()
    print("=== torch.profiler", name)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
