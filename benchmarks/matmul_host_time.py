"""Host time of triton-matmul's ``matmul`` per call against ``F.linear`` (cuBLAS), optionally A/B against a base
checkout, on a GPU.

    python3 benchmarks/matmul_host_time.py --out DIR [--base DIR] [--profile]

``--base``: a checkout of the base revision (``git archive HEAD | tar -x -C DIR``); both builds load side by side.
Per case (bf16, ``x @ W.T`` with an ``nn.Linear`` weight W (N, K), configs from the package's JSON as users get
them) and side:

- ``check``: the largest error against fp64 over three calls on fresh inputs, relative to the largest magnitude
  (the second and third calls reuse what the first set up);
- ``host``: the median wall time of one call started on an idle GPU (a sync before each): the host's Python,
  allocations and launch;
- ``per call``: 300 calls (100 with a backward) back to back then one sync, median of 3: what an eager program sees
  (the larger of the host time and the GPU time);
- ``gpu``: a CUDA-graph replay's median (``do_bench_cudagraph``): the kernels alone (forward and backward for the
  ``fwd+bwd`` rows).

Sides alternate within each round. ``--profile`` adds a cProfile of 300 calls of the new side for two cases.
Writes ``DIR/matmul_host_time.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import ab_sides, time_sides_in_turn  # noqa: E402

# (M, N, K, activation, bias, grad): decode and small-batch shapes of Llama-3-8B and Flux, one large GEMM
CASES = [
    (1, 4096, 4096, None, False, False), (1, 14336, 4096, None, False, False), (16, 4096, 4096, None, False, False),
    (64, 6144, 4096, None, False, False), (256, 4096, 4096, None, False, False),
    (256, 4096, 4096, "gelu", True, False), (256, 3072, 12288, None, True, False),
    (1024, 3072, 3072, None, True, False), (4096, 4096, 4096, None, False, False),
    (256, 4096, 4096, "gelu", True, True), (64, 6144, 4096, None, False, True),
    (4096, 12288, 3072, "gelu_tanh", True, True), (4096, 2 * 8192, 3072, "geglu", True, True),
]


def _geglu(h):
    p, g = h.chunk(2, dim=-1)
    return p * F.gelu(g)


TORCH_ACT = {None: lambda h: h, "gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
             "geglu": _geglu}


def case_name(case) -> str:
    M, N, K, act, bias, grad = case
    return f"{M}x{N}x{K}" + (f" {act}" if act else "") + (" +bias" if bias else "") + (" fwd+bwd" if grad else "")


def make_fn(side, case, x, w, b):
    """One call of ``side`` ("F.linear" or a package) on (x, w, b); with grad: forward and backward."""
    M, N, K, act, has_bias, grad = case
    bias = b if has_bias else None
    if side == "F.linear":
        fwd = lambda: TORCH_ACT[act](F.linear(x, w, bias))  # noqa: E731
    else:
        fwd = lambda: side.matmul(x, w.t(), bias, act)  # noqa: E731
    if not grad:
        return fwd

    def fwd_bwd():
        x.grad = w.grad = None
        fwd().sum().backward()

    return fwd_bwd


def max_rel_err(side, case, device) -> float:
    M, N, K, act, has_bias, grad = case
    worst = 0.0
    for seed in range(3):
        g = torch.Generator(device="cpu").manual_seed(100 + seed)
        x = torch.randn(M, K, generator=g).to(device, torch.bfloat16)
        w = (torch.randn(N, K, generator=g) * K ** -0.5).to(device, torch.bfloat16)
        b = torch.randn(N, generator=g).to(device, torch.bfloat16)
        with torch.no_grad():
            y = make_fn(side, (M, N, K, act, has_bias, False), x, w, b)()
        ref = TORCH_ACT[act](x.double() @ w.double().t() + (b.double() if has_bias else 0))
        worst = max(worst, float((y.double() - ref).abs().max() / ref.abs().max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", default="", help="checkout of the base revision (A/B in one process)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    sides = ab_sides("triton-matmul", "F.linear", args.base)
    rows = []
    for case in CASES:
        M, N, K, act, has_bias, grad = case
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16).requires_grad_(grad)
        w = (torch.randn(N, K, device=device, dtype=torch.bfloat16) * K ** -0.5).requires_grad_(grad)
        b = torch.randn(N, device=device, dtype=torch.bfloat16)
        row = {"case": case_name(case)}
        for name, side in sides.items():
            row[f"{name} check"] = max_rel_err(side, case, device)
        time_sides_in_turn(row, sides, lambda side: make_fn(side, case, x, w, b), args.rounds, grad,
                           host_samples=30, calls=100 if grad else 300)
        rows.append(row)
        print(" | ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    (out / "matmul_host_time.json").write_text(json.dumps(rows, indent=1))
    if args.profile:
        for case in (CASES[4], CASES[0]):
            M, N, K, act, has_bias, grad = case
            x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
            w = torch.randn(N, K, device=device, dtype=torch.bfloat16)
            fn = make_fn(sides["new"], case, x, w, x.new_zeros(N))
            with torch.no_grad():
                fn()
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(300):
                    fn()
                profile.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
            print(f"=== cProfile, 300 calls of {case_name(case)} (new)\n{text.getvalue()[-5000:]}", flush=True)


if __name__ == "__main__":
    main()
