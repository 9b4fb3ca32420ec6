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

from sweep_common import Sweep, load_packages, norm_grad_inputs, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--cpu", action="store_true")
ap.add_argument("--burst", action="store_true", help="also time 10 calls back to back (host time overlapped)")
ap.add_argument("--shapes", default="", help="comma list of MxN (default: 32768x4096,16384x8192,65536x2048)")
ap.add_argument("--variants", default="", help="comma list of indices into VARIANTS (default: all)")
ap.add_argument("--bwd-bpt", default="", help="comma list of BYTES_PER_THREAD values: time the one-program "
                "backwards with each (backward alone, then forward+backward)")
ap.add_argument("--fwd", default="", help="comma list of BYTES_PER_THREAD values: time the one-program forwards with each "
                "(warps = block bytes / value / 32) instead of the backwards")
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


def set_bytes_per_thread(value):
    """The one-program kernels' warp rule (``_launch.BYTES_PER_THREAD``), with every cached launch setting cleared."""
    launch_mod = sys.modules[nm.__name__ + "._launch"]
    launch_mod.BYTES_PER_THREAD = value
    launch_mod.pick_config.cache_clear()
    for name in ("rms_norm", "layer_norm"):
        mod = sys.modules[nm.__name__ + "." + name]
        mod._fwd_meta.cache_clear()
        mod._bwd_plan.cache_clear()
        getattr(mod, "_INFER_PLANS", {}).clear()


def time_forwards(values):
    """Forward (inference) of rms_norm / layer_norm / add_rms_norm per warp rule, interleaved rounds, Liger and compile."""
    launch_mod = sys.modules[nm.__name__ + "._launch"]
    default = launch_mod.BYTES_PER_THREAD
    for kind in ("rms_norm", "layer_norm"):
        for M, N in SHAPES:
            x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
            w = (torch.rand(N, device=DEV) + 0.5).to(torch.bfloat16)
            b = torch.randn(N, device=DEV, dtype=torch.bfloat16)
            ours = (lambda: nm.rms_norm(x, w, eps=1e-6)) if kind == "rms_norm" else (lambda: nm.layer_norm(x, w, b))
            cands = {f"bytes/thread {v}": v for v in values}
            cands["torch.compile"] = torch.compile((lambda a, c, d: F.rms_norm(a, (N,), c, 1e-6)) if kind == "rms_norm"
                                                   else (lambda a, c, d: F.layer_norm(a, (N,), c, d)))
            if kind in liger:
                cands["liger"] = liger[kind]
            ref = ours()
            times = {k: [] for k in cands}
            for r in range(args.rounds):
                for k, c in cands.items():
                    if RUN.left() < 5:
                        break
                    if isinstance(c, int):
                        set_bytes_per_thread(c)
                        fn = ours
                        out = fn()
                        if not torch.equal(out, ref):  # the warp count never changes a row's arithmetic order here
                            RUN.log("note: output differs from the default setting", kind, k)
                    else:
                        fn = (lambda c=c: c(x, w, b))
                    with torch.no_grad():
                        ms = RUN.bench(fn)
                    times[k].append(ms)
                    RUN.record(kind="sample", op=kind, shape=f"{M}x{N}", variant=k, mode="fwd", round=r, us=ms * 1e3)
            set_bytes_per_thread(default)
            for k, ms in times.items():
                if ms:
                    nb = 2 * M * N * 2
                    med = statistics.median(ms)
                    row = dict(kind="time", op=kind, mode="fwd", shape=f"{M}x{N}", variant=k, us_median=med * 1e3,
                               gbps_median=nb / med / 1e6, gbps_best=nb / min(ms) / 1e6, rounds=len(ms))
                    RUN.record(**row)
                    RUN.log(f"{kind:10s} fwd {M}x{N:<6d} {k:24s} median {row['gbps_median']:6.0f} GB/s "
                            f"best {row['gbps_best']:6.0f} ({len(ms)} rounds)")


def time_backwards(values):
    """Backward alone and forward+backward of rms_norm / layer_norm per warp rule (one-program kernels), rounds."""
    launch_mod = sys.modules[nm.__name__ + "._launch"]
    default = launch_mod.BYTES_PER_THREAD
    for kind in ("rms_norm", "layer_norm"):
        for M, N in SHAPES:
            x, w, b, dy, ins = norm_grad_inputs(kind, M, N, DEV)
            f = (lambda: nm.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype)) if kind == "rms_norm" \
                else (lambda: nm.layer_norm(x, w, b))
            y = f()
            ref = torch.autograd.grad(y, ins, dy, retain_graph=True)
            times = {}
            for r in range(args.rounds):
                for v in values:
                    if RUN.left() < 5:
                        break
                    set_bytes_per_thread(v)
                    if r == 0:
                        g = torch.autograd.grad(y, ins, dy, retain_graph=True)
                        if not all(float((a.float() - c.float()).abs().max()) <= 2 ** -5 * float(c.float().abs().max())
                                   + 1e-3 for a, c in zip(g, ref)):
                            RUN.log("MISMATCH", kind, M, N, v)

                    def fb():
                        for t in ins:
                            t.grad = None
                        f().backward(dy)
                    for mode, fn in (("bwd", lambda: torch.autograd.grad(y, ins, dy, retain_graph=True)), ("fwdbwd", fb)):
                        ms = RUN.bench(fn)
                        times.setdefault((mode, v), []).append(ms)
                        RUN.record(kind="sample", op=kind, shape=f"{M}x{N}", variant=f"bytes/thread {v}", mode=mode,
                                   round=r, us=ms * 1e3)
            set_bytes_per_thread(default)
            for (mode, v), ms in times.items():
                nb = (3 if mode == "bwd" else 5) * M * N * 2
                med = statistics.median(ms)
                RUN.record(kind="time", op=kind, mode=mode, shape=f"{M}x{N}", variant=f"bytes/thread {v}",
                           us_median=med * 1e3, gbps_median=nb / med / 1e6, rounds=len(ms))
                RUN.log(f"{kind:10s} {mode:6s} {M}x{N:<6d} bytes/thread {v:<4d} median {nb / med / 1e6:6.0f} GB/s "
                        f"{[round(t * 1e3) for t in ms]}")


if args.fwd or args.bwd_bpt:
    if args.fwd:
        time_forwards([int(v) for v in args.fwd.split(",")])
    if args.bwd_bpt:
        time_backwards([int(v) for v in args.bwd_bpt.split(",")])
    RUN.log("done")
    sys.exit(0)
for kind in ("rms_norm", "layer_norm"):
    for M, N in SHAPES:
        if RUN.left() < 20:
            break
        x, w, b, dy, ins = norm_grad_inputs(kind, M, N, DEV)
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
