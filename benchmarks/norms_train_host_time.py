"""Host time of eager forward + backward calls (rms_norm, layer_norm) against F.rms_norm / F.layer_norm, and where ours goes.

    python3 benchmarks/norms_train_host_time.py            # a GPU: 256 x 4096 bf16
    BASE=DIR python3 benchmarks/norms_train_host_time.py   # also a base checkout's build ("base ..." rows)
    DEV=cpu python3 benchmarks/norms_train_host_time.py    # the interpreter (a smoke run: times the interpreter)
    SHAPE=4x65536 python3 benchmarks/norms_train_host_time.py  # another M x N (few wide rows: the team path's host time)

Per case: 200 calls back to back, then one synchronize, median of 5 rounds (cases in turn); then a torch.profiler CPU
table of 50 calls of ours and of F.rms_norm. Two floors for any op written as a Python ``torch.autograd.Function``
(ours, Liger): an identity Function (``x.clone()`` forward, the gradient passed through) on the device and on CPU
tensors, and ``x.clone()`` without a Function (the engine's own cost per backward). Session 44, H200 host: 104, 44
and 86 us per fwd+bwd; ours 449, F.rms_norm 149, Liger 694. The harness's fwd+bwd rows were host-bound in session 40 (ours 658-973
us of host time per call against F.rms_norm's 214-372 on that host).
"""
import sys, time, torch
sys.path.insert(0, "benchmarks")
from sweep_common import load_packages
import os; from pathlib import Path
(N,) = load_packages(["triton-norms"], cpu=os.environ.get("DEV") == "cpu")
B = load_packages(["triton-norms"], cpu=os.environ.get("DEV") == "cpu", root=Path(os.environ["BASE"]))[0] \
    if os.environ.get("BASE") else None
print(torch.__version__, flush=True)
M, C = (256, 4096) if os.environ.get("DEV") != "cpu" else (8, 64)
if os.environ.get("SHAPE"):
    M, C = map(int, os.environ["SHAPE"].split("x"))
print(f"{M} x {C} bf16", flush=True)
import os; dev = os.environ.get("DEV", "cuda")
x = torch.randn(M, C, device=dev, dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(C, device=dev, dtype=torch.bfloat16, requires_grad=True)
b = torch.randn(C, device=dev, dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn(M, C, device=dev, dtype=torch.bfloat16)
F = torch.nn.functional


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return g


xc = torch.randn(8, 64, requires_grad=True)
cases = {
    "ours rms fwd+bwd": lambda: torch.autograd.grad(N.rms_norm(x, w), (x, w), dy),
    "F.rms_norm fwd+bwd": lambda: torch.autograd.grad(F.rms_norm(x, (C,), w), (x, w), dy),
    "ours ln fwd+bwd": lambda: torch.autograd.grad(N.layer_norm(x, w, b), (x, w, b), dy),
    "F.layer_norm fwd+bwd": lambda: torch.autograd.grad(F.layer_norm(x, (C,), w, b), (x, w, b), dy),
    "ours rms fwd (grad on)": lambda: N.rms_norm(x, w),
    "F.rms_norm fwd (grad on)": lambda: F.rms_norm(x, (C,), w),
    **({"base rms fwd+bwd": lambda: torch.autograd.grad(B.rms_norm(x, w), (x, w), dy),
        "base ln fwd+bwd": lambda: torch.autograd.grad(B.layer_norm(x, w, b), (x, w, b), dy),
        "base rms fwd (grad on)": lambda: B.rms_norm(x, w)} if B is not None else {}),
    "identity Function fwd+bwd": lambda: torch.autograd.grad(Identity.apply(x), (x,), dy),
    "identity Function, CPU": lambda: torch.autograd.grad(Identity.apply(xc), (xc,), xc),
    "x.clone() fwd+bwd (no Function)": lambda: torch.autograd.grad(x.clone(), (x,), dy),
}
try:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    if dev == "cuda":
        cases["Liger rms fwd+bwd"] = lambda: torch.autograd.grad(
            LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False), (x, w), dy)
except ImportError:
    pass
for k, f in list(cases.items()):
    try:
        for _ in range(30): f()
    except Exception as e:  # a peer that refuses the shape (Liger's RMSNorm above 65536 columns)
        print(f"{k:34s} skipped: {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)
        del cases[k]
res = {k: [] for k in cases}
(torch.cuda.synchronize() if dev == "cuda" else None)
for r in range(5):
    for k, f in cases.items():
        (torch.cuda.synchronize() if dev == "cuda" else None); t = time.perf_counter()
        for _ in range(200): f()
        (torch.cuda.synchronize() if dev == "cuda" else None); res[k].append((time.perf_counter() - t) / 200 * 1e6)
for k, v in res.items():
    print(f"{k:34s} {sorted(v)[2]:7.1f} us per call (back to back, then one sync)", flush=True)
from torch.profiler import profile, ProfilerActivity
for k in ("ours rms fwd+bwd", "F.rms_norm fwd+bwd"):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50): cases[k]()
        (torch.cuda.synchronize() if dev == "cuda" else None)
    print("---", k)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=55))
