"""Latency-bound activation launches (5 x 96 and 67 x 5003, the port-check shapes) under variants of the launch
rules, and the throughput forwards on chunk views (GPU). Results: results/activations_small_and_views_2026-12-01.txt
(session 11, bf16), results/activations_small_u_first_2026-12-01.txt (session 12, bf16 / fp16 / fp32).

    python benchmarks/activations_small_launch_sweep.py OUT_DIR [DTYPE ...]      (default: bfloat16 and the views)

Variants (monkeypatched launch rules of triton_activations.activation, plans cleared in between; three
interleaved rounds, CUDA-graph medians, outputs checked bitwise against the first variant): A one-axis grid
whenever the fast math runs; B only with more than one column block, u first for gelu_tanh only (session 11);
C B plus u loaded first for every gated op; D C without the fast math; S the shipped rules (B, plus u first for
every gated op in a latency-bound launch).
"""
import sys
sys.path.insert(0, "benchmarks")
from sweep_common import ActivationInternals, prepare
OUT = prepare(sys.argv[1], False)
import torch
from triton.testing import do_bench_cudagraph
INTERNALS = ActivationInternals(False)
act, A = INTERNALS.pkg, INTERNALS.activation
base = (A._one_axis_grid, A._load_u_first, A.fast_math_eligible)
DTYPES = sys.argv[2:] or ["bfloat16"]
u_gelu_tanh = lambda spec, cfg: spec.gated and spec.act == A.GELU_TANH  # noqa: E731
V = {
    "A one-axis grid with fast math": (lambda fast, cfg: fast, u_gelu_tanh, base[2]),
    "B 1d only if >1 col block": (base[0], u_gelu_tanh, base[2]),
    "C B + u first (gated)": (base[0], lambda spec, cfg: spec.gated, base[2]),
    "D C without fast math": (base[0], lambda spec, cfg: spec.gated, lambda *a: False),
    "S shipped": base,
}
def setv(v):
    A._one_axis_grid, A._load_u_first = v[0], v[1]
    A.fast_math_eligible = v[2]
    INTERNALS.reset_plans()
ops = ["silu_and_mul", "mul_and_silu", "gelu_tanh_and_mul", "gelu_and_mul", "silu", "gelu_tanh", "gelu_new", "gelu_fast", "gelu", "gelu_quick"]
res = {}
log = open(OUT / "small.log", "w")
for dtype, shape in [(getattr(torch, n), s) for n in DTYPES for s in ((5, 96), (67, 5003))]:
    for op in ops:
        gated = "_and_" in op
        M, d = shape
        x = torch.randn(M, 2 * d if gated else d, device="cuda", dtype=dtype)
        out = torch.empty(M, d, device="cuda", dtype=dtype)
        f = getattr(act, op)
        kw = {"rounding": "eager"} if gated else {}
        ref = None
        for r in range(3):
            for name, v in V.items():
                setv(v)
                f(out, x, **kw)
                if ref is None:
                    ref = out.clone()
                elif not torch.equal(out, ref):
                    print("MISMATCH", op, name, file=log, flush=True)
                ms = do_bench_cudagraph(lambda: f(out, x, **kw), rep=40, return_mode="median")
                res.setdefault((dtype, shape, op, name), []).append(ms * 1e3)
        for name in V:
            t = res[(dtype, shape, op, name)]
            line = f"{dtype} {shape} {op:18s} {name:28s} {min(t):6.3f} us  {[round(v, 3) for v in t]}"
            print(line, flush=True); print(line, file=log, flush=True)
setv(base)
if sys.argv[2:]:
    sys.exit(0)
# chunk views at the throughput shape: x a view with row stride 4d (chunk of a wider tensor), out a strided view
M, d = 16384, 14336
big = torch.randn(M, 4 * d, device="cuda", dtype=torch.bfloat16)
xc = big.chunk(2, dim=-1)[0]  # (M, 2d), row stride 4d
obig = torch.empty(M, 2 * d, device="cuda", dtype=torch.bfloat16)
oc = obig.chunk(2, dim=-1)[1]  # (M, d), row stride 2d, storage offset d
xcont = xc.contiguous()
nb = 3 * M * d * 2
for op in ("silu_and_mul", "gelu_tanh_and_mul"):
    f = getattr(act, op)
    f(oc, xc)
    assert torch.equal(oc, f(xcont)), op
    for name, fn in (("contiguous x -> new out", lambda: f(xcont)), ("chunk view x -> new out", lambda: f(xc)),
                     ("chunk view x -> chunk view out", lambda: f(oc, xc))):
        t = [do_bench_cudagraph(fn, rep=50, return_mode="median") for _ in range(3)]
        line = f"{op:18s} {name:32s} {nb / min(t) / 1e6:6.0f} GB/s  {[round(nb / v / 1e6) for v in t]}"
        print(line, flush=True); print(line, file=log, flush=True)
