"""Norm backwards on rows that fit one program (issue 7): the one-program-per-row kernel against
persistent teams (``_wide``: a team of one or two per row, loads a row ahead), timed in interleaved rounds.

python3 benchmarks/norms_narrow_sweep.py --out DIR [--rounds 4] [--budget S] [--cpu]

Single do_bench medians on the H200 moved by 10-50% between runs of the same kernel (the GPU idles
between launches: these timings are bound by the host's Python), so every variant of a shape is timed
once per round, rounds interleaved, and the median over rounds is reported (the min as well); every
sample is recorded with its round. ``--burst`` also times 10 calls per measurement. Bytes: backward
x, dy read, dx written (3 M N e); fwd+bwd adds x read and y written (5 M N e); weights aside. Records: DIR/narrow.jsonl; the table: stdout.
"""

import argparse
import statistics
import sys

from sweep_common import Sweep, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--burst", action="store_true", help="also time 10 calls back to back (host time overlapped)")
ap.add_argument("--shapes", default="", help="comma list of MxN (default: 32768x4096,16384x8192,65536x2048)")
ap.add_argument("--variants", default="", help="comma list of indices into VARIANTS (default: all)")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "narrow.jsonl", args.budget, args.cpu, rep=25, min_left=4, widths=(22, 26, 12, 8, 6))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = RUN.dev
(nm,) = load_packages(["triton-norms"], args.cpu)
W = sys.modules[nm.__name__ + "._wide"]
if args.cpu:
    W.WIDE_ON_CPU = True


def pcfg(chunk, warps, per_sm, maxnreg):
    return {"min_row_bytes": 1, "chunk_bytes": chunk, "num_warps": warps, "programs_per_sm": per_sm,
            "maxnreg": maxnreg}


def name(c):
    return "one program/row" if c is None else \
        f"team {c['chunk_bytes'] // 1024}K w{c['num_warps']} x{c['programs_per_sm']} r{c['maxnreg']}"


VARIANTS = [None, pcfg(8192, 4, 3, 168), pcfg(8192, 8, 2, 128), pcfg(16384, 16, 1, 128), pcfg(32768, 16, 1, 128)]
SHAPES = [(32768, 4096), (16384, 8192), (65536, 2048)] if DEV == "cuda" else [(64, 256)]
if args.shapes and DEV == "cuda":
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
if args.variants:
    VARIANTS = [VARIANTS[int(i)] for i in args.variants.split(",")]

liger = {}
try:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    liger = {"rms_norm": lambda a, c, d: LigerRMSNormFunction.apply(a, c, 1e-6, 0.0, "llama", False),
             "layer_norm": lambda a, c, d: LigerLayerNormFunction.apply(a, c, d, 1e-5)}
except Exception as e:  # noqa: BLE001
    RUN.log("no liger", e)

if DEV == "cuda":
    RUN.copy_ceiling()
table = []
for kind in ("rms_norm", "layer_norm"):
    for M, N in SHAPES:
        if RUN.left() < 20:
            break
        x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        w = (torch.rand(N, device=DEV) + 0.5).to(torch.bfloat16).requires_grad_()
        b = torch.zeros(N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        ins = (x, w) if kind == "rms_norm" else (x, w, b)
        ours = (lambda a, c, d: nm.rms_norm(a, c, eps=1e-6, cast_dtype=a.dtype)) if kind == "rms_norm" \
            else (lambda a, c, d: nm.layer_norm(a, c, d))
        g_ref = torch.autograd.grad(ours(x, w, b), ins, dy)
        cands = {}
        for c in VARIANTS:
            with_cfg = dict(W.WIDE_TUNED)
            W.WIDE_TUNED[kind + "_bwd"] = c
            y = ours(x, w, b)
            g = torch.autograd.grad(y, ins, dy, retain_graph=True)
            W.WIDE_TUNED.update(with_cfg)
            ok = all(float((a.float() - r.float()).abs().max()) <= 2 ** -5 * float(r.float().abs().max()) + 1e-3
                     for a, r in zip(g, g_ref))
            RUN.record(kind="check", op=kind, shape=[M, N], variant=name(c), ok=ok)
            if not ok:
                RUN.log("MISMATCH", kind, M, N, name(c))
            cands[name(c)] = (c, y)
        peers = {"torch.compile": torch.compile((lambda a, c, d: F.rms_norm(a, (N,), c, 1e-6)) if kind == "rms_norm"
                                                else (lambda a, c, d: F.layer_norm(a, (N,), c, d)))}
        if kind in liger:
            peers["liger"] = liger[kind]
        for pn, pf in peers.items():
            cands[pn] = (pf, pf(x, w, b))
        modes = ("bwd", "fwdbwd") + (("bwd x10", "fwdbwd x10") if args.burst else ())
        times = {k: {m: [] for m in modes} for k in cands}

        def timed(k, mode, fn):
            try:
                ms = RUN.bench(lambda: [fn() for _ in range(10)]) / 10 if mode.endswith("x10") else RUN.bench(fn)
                times[k][mode].append(ms)
                RUN.record(kind="sample", op=kind, shape=f"{M}x{N}", variant=k, mode=mode, round=r, us=ms * 1e3)
            except Exception as e:  # noqa: BLE001  (compile's backward refuses retain_graph reruns, ...)
                if r == 0:
                    RUN.log("skip", kind, k, mode, type(e).__name__, str(e)[:120])

        for r in range(args.rounds):
            for k, (c, y) in cands.items():
                if RUN.left() < 10:
                    break
                peer = k in peers
                saved = dict(W.WIDE_TUNED)
                if not peer:
                    W.WIDE_TUNED[kind + "_bwd"] = c
                f = c if peer else ours

                def fb():
                    for t in ins:
                        t.grad = None
                    f(x, w, b).backward(dy)
                try:
                    for mode in modes:
                        timed(k, mode, (lambda: torch.autograd.grad(y, ins, dy, retain_graph=True))
                              if mode.startswith("bwd") else fb)
                finally:
                    W.WIDE_TUNED.update(saved)
        for k, t in times.items():
            for mode, ms in t.items():
                if not ms:
                    continue
                nb = (3 if mode.startswith("bwd") else 5) * M * N * 2
                med, best = statistics.median(ms), min(ms)
                row = dict(kind="time", op=kind, mode=mode, shape=f"{M}x{N}", variant=k, us_median=med * 1e3,
                           us_min=best * 1e3, gbps_median=nb / med / 1e6, gbps_best=nb / best / 1e6,
                           rounds=len(ms), frac_copy=nb / med / 1e6 / RUN.copy)
                RUN.record(**row)
                table.append(row)
                RUN.log(f"{kind:10s} {mode:12s} {M}x{N:<6d} {k:30s} median {row['gbps_median']:6.0f} GB/s "
                        f"best {row['gbps_best']:6.0f} ({len(ms)} rounds)")
        del x, dy
RUN.log("done")
