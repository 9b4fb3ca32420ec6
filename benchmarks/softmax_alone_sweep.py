"""Softmax forward rows of 8-128 KiB on persistent programs of one row each (the team kernel's ``ALONE`` path)
or on teams of a few large chunks, against the shipped path (one block per program, the looped kernel, or the
shipped team tiers), per row width and setting.

python3 benchmarks/softmax_alone_sweep.py --out DIR [--rounds 3] [--budget S] [--dtype bfloat16|float32] [--cpu]

For each shape the shipped plan (``_launch.TEAM_TUNED`` as imported) is the base; each setting puts one tier
``{"min_row_bytes": row bytes, "chunk_bytes", "max_team": ceil(row bytes / chunk_bytes), num_warps,
programs_per_sm, maxnreg}`` first (a chunk of at least the row: one program per row). Outputs are compared with the base bit for bit and with ``torch.softmax`` (the fraction of equal
elements); times are CUDA-graph medians over interleaved rounds (the kernels alone). Bytes: x read + y written.
Records: DIR/alone.jsonl; the table: stdout.
"""

import argparse
import statistics
import sys

from sweep_common import Sweep, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--dtype", default="", help="only the shapes of this dtype (bfloat16, float32)")
ap.add_argument("--cpu", action="store_true", help="dry run under the interpreter with tiny shapes")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "alone.jsonl", args.budget, args.cpu, rep=25)

import torch  # noqa: E402

DEV = RUN.dev
(sm,) = load_packages(["triton-softmax"], args.cpu)
L = sys.modules[sm.__name__ + "._launch"]
BASE = list(L.TEAM_TUNED["softmax"])
if args.cpu:
    L.TEAM_ON_CPU = True

# row bytes rounded up to a power of 2 -> settings (chunk_bytes, num_warps, programs_per_sm, maxnreg) to try
SETTINGS = {
    8192: [(8192, 4, 8, 64), (8192, 8, 4, 64), (8192, 4, 4, 128), (8192, 8, 2, 128)],
    16384: [(16384, 8, 4, 64), (16384, 16, 2, 64), (16384, 8, 2, 128), (16384, 4, 4, 128)],
    32768: [(32768, 16, 2, 64), (32768, 8, 2, 128), (32768, 32, 1, 64), (32768, 16, 1, 128)],
    65536: [(65536, 16, 1, 128), (65536, 32, 1, 64), (65536, 8, 1, 255), (65536, 16, 2, 64), (65536, 8, 2, 128)],
    131072: [(65536, 16, 1, 128), (65536, 32, 1, 64), (32768, 16, 2, 64), (32768, 8, 2, 128), (16384, 8, 4, 64),
             (16384, 4, 4, 128)],
}
SHAPES = [(torch.bfloat16, 32768, 4096), (torch.bfloat16, 32768, 8192), (torch.bfloat16, 16384, 16384),
          (torch.bfloat16, 8192, 24576), (torch.bfloat16, 4096, 32768), (torch.float32, 4096, 16384),
          (torch.bfloat16, 4096, 65536), (torch.float32, 32768, 4096), (torch.float32, 16384, 8192),
          (torch.float32, 8192, 12007), (torch.float32, 2048, 32768)]
if args.cpu:
    SHAPES = [(torch.bfloat16, 5, 1000), (torch.float32, 3, 700), (torch.bfloat16, 3, 3001)]
    SETTINGS = {2048: [(2048, 4, 1, 64)], 4096: [(4096, 4, 1, 64)], 8192: [(2048, 4, 1, 64)]}
if args.dtype:
    SHAPES = [s for s in SHAPES if s[0] == getattr(torch, args.dtype)]


def tier(row_bytes, chunk, warps, per_sm, nreg):
    return {"min_row_bytes": row_bytes, "chunk_bytes": chunk, "num_warps": warps, "programs_per_sm": per_sm,
            "maxnreg": nreg, "max_team": -(-row_bytes // chunk)}


def use(tiers):
    L.TEAM_TUNED["softmax"] = tiers
    L.retuned()


if DEV == "cuda":
    RUN.copy_ceiling()
for dtype, M, N in SHAPES:
    torch.manual_seed(0)
    x = torch.randn(M, N, device=DEV, dtype=dtype) * 3
    row = N * x.element_size()
    chunk = 1 << (row - 1).bit_length()
    variants = {"shipped": BASE}
    for c, w, p, r in SETTINGS.get(chunk, []):
        label = "alone" if c >= row else f"team {-(-row // c)}x{c // 1024}K"
        variants[f"{label} w{w} x{p} r{r}"] = [tier(row, c, w, p, r), *BASE]
    use(BASE)
    y_base = sm.softmax(x)
    ref = torch.softmax(x, -1)
    nbytes = 2 * M * N * x.element_size()
    times = {k: [] for k in variants}
    outs = {}
    for name, tiers in variants.items():
        use(tiers)
        y = sm.softmax(x)
        outs[name] = (bool(torch.equal(y, y_base)), float((y == ref).float().mean()),
                      float((y.double() - torch.softmax(x.double(), -1)).abs().max()))
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            if RUN.left() < 10:
                break
            use(variants[name])
            times[name].append(RUN.bench(lambda: sm.softmax(x), graph=True))
    base_ms = statistics.median(times["shipped"]) if times["shipped"] else float("nan")
    for name in variants:
        if not times[name]:
            continue
        ms = statistics.median(times[name])
        eq, eq_torch, err = outs[name]
        gbps = nbytes / ms / 1e6
        RUN.record(kind="alone", dtype=str(dtype), shape=f"{M}x{N}", name=name, us=ms * 1e3, gbps=gbps,
                   speed=base_ms / ms, bitwise_base=eq, equal_torch=eq_torch, max_err=err,
                   samples=[t * 1e3 for t in times[name]])
        RUN.log(f"{str(dtype)[6:]:9s} {M}x{N:<7d} {name:22s} {ms * 1e3:8.1f} us {gbps:6.0f} GB/s "
                f"x{base_ms / ms:.3f} base-equal {eq} torch-equal {eq_torch:.4f} err {err:.2e}")
use(BASE)
RUN.log("done")
