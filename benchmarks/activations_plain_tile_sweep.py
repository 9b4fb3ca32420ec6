"""Session 12: tiles and threads of the plain activation forwards (silu, gelu_tanh, gelu_new, gelu_fast) in fp16 / fp32
/ bf16 at the port-check shapes (GPU). Results: results/activations_plain_tiles_2026-12-01.txt.

    python benchmarks/activations_plain_tile_sweep.py OUT_DIR

Variants patch ``_launch.TILE_BYTES`` / ``_launch.PLAIN_THREADS`` (plans cleared in between); three interleaved
rounds of CUDA-graph medians, outputs checked bitwise against the shipped setting.
"""
import statistics
import sys

sys.path.insert(0, "benchmarks")
from sweep_common import ActivationInternals, prepare  # noqa: E402

OUT = prepare(sys.argv[1], False)
import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

INTERNALS = ActivationInternals(False)
act, L = INTERNALS.pkg, INTERNALS.launch
SHIPPED = (L.TILE_BYTES, L.PLAIN_THREADS)
V = {"shipped 2048 B / 64 thr": SHIPPED, "2048 B / 128 thr": (2048, 128), "1024 B / 64 thr": (1024, 64),
     "1024 B / 128 thr": (1024, 128), "512 B / 64 thr": (512, 64)}
log = open(OUT / "plain_tiles.txt", "w")
for dtype in (torch.float16, torch.float32, torch.bfloat16):
    for M, d in ((5, 96), (256, 4096), (67, 5003), (16384, 14336)):
        for op in ("gelu_tanh", "gelu_new", "gelu_fast", "silu"):
            x = torch.randn(M, d, device="cuda", dtype=dtype)
            out = torch.empty_like(x)
            f = getattr(act, op)
            res, ref = {}, None
            for _ in range(3):
                for name, (tile, threads) in V.items():
                    L.TILE_BYTES, L.PLAIN_THREADS = tile, threads
                    INTERNALS.reset_plans()
                    f(out, x)
                    if ref is None:
                        ref = out.clone()
                    elif not torch.equal(out, ref):
                        print("MISMATCH", dtype, op, name, file=log, flush=True)
                    res.setdefault(name, []).append(do_bench_cudagraph(lambda: f(out, x), rep=30, return_mode="median"))
            base = statistics.median(res[next(iter(V))])
            for name, t in res.items():
                line = (f"{str(dtype):15s} {M:5d}x{d:<6d} {op:10s} {name:24s} {statistics.median(t) * 1e3:8.2f} us "
                        f"{base / statistics.median(t):5.3f}x shipped  {[round(v * 1e3, 2) for v in t]}")
                print(line, flush=True)
                print(line, file=log, flush=True)
L.TILE_BYTES, L.PLAIN_THREADS = SHIPPED
INTERNALS.reset_plans()
