"""Gated forwards with u loaded before or after the activation math (GPU; bf16, CUDA-graph medians, three interleaved
rounds, outputs checked bitwise). Results: results/activations_small_and_views_2026-12-01.txt.

    python benchmarks/activations_u_first_sweep.py OUT_DIR
"""
import sys
sys.path.insert(0, "benchmarks")
from sweep_common import ActivationInternals, prepare
OUT = prepare(sys.argv[1], False)
import torch
from triton.testing import do_bench_cudagraph
INTERNALS = ActivationInternals(False)
act, A = INTERNALS.pkg, INTERNALS.activation
base = A._load_u_first
V = {"current": base, "u first": lambda spec, cfg: spec.gated, "u after": lambda spec, cfg: False}
def setv(v):
    A._load_u_first = v
    INTERNALS.reset_plans()
log = open(OUT / "ufirst.log", "w")
for M, d in ((16384, 14336), (4096, 14336), (65536, 1536), (8192, 11008), (67, 5003), (256, 4096)):
    for op in ("silu_and_mul", "gelu_tanh_and_mul", "gelu_and_mul"):
        x = torch.randn(M, 2 * d, device="cuda", dtype=torch.bfloat16)
        f = getattr(act, op)
        res, ref = {}, None
        for r in range(3):
            for name, v in V.items():
                setv(v)
                y = f(x)
                if ref is None:
                    ref = y
                elif not torch.equal(y, ref):
                    print("MISMATCH", op, name, file=log, flush=True)
                res.setdefault(name, []).append(do_bench_cudagraph(lambda: f(x), rep=40, return_mode="median"))
        nb = 3 * M * d * 2
        line = f"{M}x{d} {op:18s} " + "  ".join(f"{n}: {nb / min(t) / 1e6:6.0f} GB/s ({min(t) * 1e3:.2f} us)" for n, t in res.items())
        print(line, flush=True); print(line, file=log, flush=True)
setv(base)
