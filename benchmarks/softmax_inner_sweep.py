"""Tile settings of triton-softmax's inner-dim kernels (``_inner``: softmax over a dim with dims after it).

    python3 benchmarks/softmax_inner_sweep.py --out DIR [--budget S] [--shapes OxNxI,...] [--bwd] [--cpu]

For each (O, N, I) shape, softmax over dim 1 of a contiguous bf16 (O, N, I) tensor, forward: every
(BLOCK_I, num_warps) setting (one pass where N fits: BLOCK_N = next_power_of_2(N); else two, BLOCK_N = TILE /
BLOCK_I), timed with ``do_bench`` (L2 flushed), against the package's own choice (``_config``) and torch.softmax.
``--bwd``: forward and backward (``torch.autograd.grad``; x read, y written, y and dy read, dx written) from
CUDA-graph replays (from Python the autograd's host time blurred the kernels' differences: session 51).
Records: DIR/inner.jsonl.
"""

import argparse
import importlib
import sys

from sweep_common import Sweep, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget", type=float, default=300)
ap.add_argument("--shapes", help="comma list of OxNxI (default: six shapes, see SHAPES)")
ap.add_argument("--bwd", action="store_true", help="time forward + backward")
ap.add_argument("--cpu", action="store_true")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "inner.jsonl", args.budget, args.cpu, rep=40, widths=(8, 30, 18, 9, 6))

import torch  # noqa: E402

(SM,) = load_packages(["triton-softmax"], args.cpu)
INNER = importlib.import_module(SM.__name__ + "._inner")
SOFT = sys.modules[SM.__name__ + ".softmax"]
CHOSEN = INNER._config
SHAPES = [(2, 19, 8)] if args.cpu else [(16, 19, 262144), (8, 128, 65536), (32, 4, 1 << 20), (64, 32, 32768),
                                         (4, 1024, 1024), (2, 32768, 1024)]
if args.shapes:
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]


def forced(block_i: int, warps: int):
    def config(O, N, I, device):
        full = INNER.next_power_of_2(N)
        loop = full * block_i > INNER.TILE
        return (INNER.TILE // block_i if loop else full), block_i, loop, warps
    return config


if RUN.dev == "cuda":
    RUN.copy_ceiling()
for O, N, I in SHAPES:
    x = torch.randn(O, N, I, device=RUN.dev, dtype=torch.bfloat16, requires_grad=args.bwd)
    dy = torch.randn_like(x) if args.bwd else None
    nbytes, label = (5 if args.bwd else 2) * x.numel() * 2, f"{O}x{N}x{I}"

    def call(fn):
        return (lambda: torch.autograd.grad(fn(x, 1), x, dy)) if args.bwd else (lambda: fn(x, 1))

    graph = args.bwd and not args.cpu
    RUN.timeit("inner", "torch.softmax", call(torch.softmax), nbytes, graph=graph, shape=label)
    settings = [("package", CHOSEN)] + [(f"BLOCK_I {bi} w{w}", forced(bi, w)) for bi in (16, 32, 64, 128, 256)
                                        for w in (1, 2, 4, 8)]
    for name, config in settings:
        INNER._config = config
        SOFT._FWD_PLANS.clear()
        SOFT._BWD_PLANS.clear()
        RUN.timeit("inner", name, call(SM.softmax), nbytes, graph=graph, shape=label)
    INNER._config = CHOSEN
    SOFT._FWD_PLANS.clear()
    SOFT._BWD_PLANS.clear()
    del x, dy
RUN.log("done")
