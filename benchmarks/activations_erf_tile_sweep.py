"""Tile sizes and threads for the exact-math erf GELU forwards (plain gelu against eager F.gelu, gelu_and_mul;
gelu_tanh for comparison), bf16 16384 x 14336, CUDA-graph medians, three interleaved rounds (GPU).
Results: results/activations_erf_tiles_2026-12-01.txt. Variants are (TILE_BYTES, PLAIN_THREADS, THREADS) of
triton_activations._launch.

    python benchmarks/activations_erf_tile_sweep.py OUT_DIR
"""
import sys
sys.path.insert(0, "benchmarks")
from sweep_common import ActivationInternals, prepare
OUT = prepare(sys.argv[1], False)
import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph
INTERNALS = ActivationInternals(False)
act, L = INTERNALS.pkg, INTERNALS.launch
base = (L.TILE_BYTES, L.PLAIN_THREADS, L.THREADS)
def setv(v):
    L.TILE_BYTES, L.PLAIN_THREADS, L.THREADS = v
    INTERNALS.reset_plans()
log = open(OUT / "erf.log", "w")
def P(s):
    print(s, flush=True); print(s, file=log, flush=True)
M, d = 16384, 14336
cases = {
    "gelu": ([(2048, 64, 128), (2048, 128, 128), (2048, 256, 128), (1024, 64, 128), (1024, 128, 128), (4096, 256, 128), (512, 64, 128)],
             torch.randn(M, d, device="cuda", dtype=torch.bfloat16), lambda x: F.gelu(x), 2),
    "gelu_and_mul": ([(2048, 64, 128), (2048, 64, 256), (2048, 64, 64), (1024, 64, 128), (4096, 64, 256), (4096, 64, 512)],
                     torch.randn(M, 2 * d, device="cuda", dtype=torch.bfloat16), None, 3),
    "gelu_tanh": ([(2048, 64, 128), (2048, 128, 128), (1024, 64, 128)], torch.randn(M, d, device="cuda", dtype=torch.bfloat16), None, 2),
}
for op, (variants, x, eager, k) in cases.items():
    f = getattr(act, op)
    res, ref = {}, None
    for r in range(3):
        for v in variants:
            setv(v)
            y = f(x)
            if ref is None:
                ref = y
            elif not torch.equal(y, ref):
                P(f"MISMATCH {op} {v}")
            res.setdefault(v, []).append(do_bench_cudagraph(lambda: f(x), rep=40, return_mode="median"))
        if eager is not None:
            res.setdefault("eager", []).append(do_bench_cudagraph(lambda: eager(x), rep=40, return_mode="median"))
    nb = k * M * d * 2
    for v, t in res.items():
        P(f"{op:14s} tile/plain_threads/threads={v}: {nb / min(t) / 1e6:6.0f} GB/s  {[round(nb / u / 1e6) for u in t]}")
setv(base)
