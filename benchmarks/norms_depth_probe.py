"""Probe: the wide rms_norm team forward with two rows of a member's chunk in flight (``DEPTH`` 2) against one.

    python3 benchmarks/norms_depth_probe.py --out DIR [--cpu] [--budget S] [--rep MS]

The shipped team forward (``_wide._rms_team_fwd_kernel``) issues the loads of a member's next row before it waits for
its team on the current one, so one row's chunk is in flight per program while it meets. On the H100 the teams reach
93-96% of a copy at 4096 x 65536, on the H200 88-89% (session 42): the H200 moves 44% more bytes per second with the
same multiprocessors, so each needs more bytes in flight to cover the same latency (Little's law). ``DEPTH`` 2 keeps
two rows ahead (32 more registers per thread for a 4 KiB / 1-warp chunk of bf16). Each setting below is a
``_wide.WIDE_TUNED`` tier (chunk, warps, programs per SM, register cap, AFFINE, HOLD, ``depth``) put in place of the
shipped rms_norm tiers for the package's own ``rms_norm`` (the path a user calls, the workspace's memset included); every
one is checked bitwise against its own ``DEPTH`` 1 (the same arithmetic in the same order) and against the package's ``rms_norm``, and
timed as the harness times (``do_bench``, L2 flushed) and in CUDA-graph replays, next to a copy of the same bytes.
Records: ``DIR/norms_depth_probe.jsonl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import Sweep, load_packages, prepare  # noqa: E402

_4K = dict(min_row_bytes=65537, chunk_bytes=4096, num_warps=1, maxnreg=168, affine=1)
_8K = dict(min_row_bytes=65537, chunk_bytes=8192, num_warps=2, maxnreg=168, affine=2, hold=True)
SETTINGS = {  # name -> (tier, depth)
    "4K 12/SM d1 (shipped <= 128 KiB)": (dict(_4K, programs_per_sm=12), 1),
    "4K 12/SM d2": (dict(_4K, programs_per_sm=12), 2),
    "4K 8/SM d2 r255": (dict(_4K, programs_per_sm=8, maxnreg=255), 2),
    "4K 16/SM d2 r128": (dict(_4K, programs_per_sm=16, maxnreg=128), 2),
    "8K 6/SM d1 (shipped wider)": (dict(_8K, programs_per_sm=6), 1),
    "8K 6/SM d2": (dict(_8K, programs_per_sm=6), 2),
    "8K 4/SM d2 r255": (dict(_8K, programs_per_sm=4, maxnreg=255), 2),
}
GPU_SHAPES = ((4096, 65536), (2048, 131072), (1024, 262144))
CPU_SHAPES = ((24, 40000),)  # fp16 rows past one block (64 KiB): teams of 5 at 16 KiB chunks, one team on the CPU


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--budget", type=float, default=300)
    p.add_argument("--rep", type=int, default=60)
    p.add_argument("--settings", type=int, nargs="+", help="indices into SETTINGS (default: all)")
    p.add_argument("--shapes", type=int, default=len(GPU_SHAPES), help="the first this many GPU shapes")
    args = p.parse_args()
    chosen = {n: v for i, (n, v) in enumerate(SETTINGS.items()) if args.settings is None or i in args.settings}
    out = prepare(args.out, args.cpu)
    sw = Sweep(out / "norms_depth_probe.jsonl", args.budget, args.cpu, args.rep)

    import torch
    import triton

    (norms,) = load_packages(["triton-norms"], args.cpu)
    wide = sys.modules[norms.__name__ + "._wide"]
    wide.WIDE_ON_CPU = args.cpu
    dev = sw.dev
    if not args.cpu:
        sw.copy_ceiling()

    def graph_ms(fn, reps=10):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / reps)
        return sorted(ts)[2]

    shipped = wide.WIDE_TUNED["rms_norm"]

    def forward(x, w, tier, depth):
        """The package's rms_norm with ``tier`` (``depth`` rows ahead) in place of its shipped rms_norm tiers."""
        wide.WIDE_TUNED["rms_norm"] = dict(tier, depth=depth)
        try:
            return norms.rms_norm(x, w, eps=1e-6)
        finally:
            wide.WIDE_TUNED["rms_norm"] = shipped

    dtype = torch.float16 if args.cpu else torch.bfloat16
    if args.cpu:  # the interpreter's grid holds 8 programs ("multiprocessors"), so a team needs wider chunks
        for tier, _ in chosen.values():
            tier["chunk_bytes"] = 16384
    for M, N in (CPU_SHAPES if args.cpu else GPU_SHAPES[:args.shapes]):
        if sw.left() < 20:
            break
        x = torch.randn(M, N, device=dev, dtype=dtype)
        w = (1 + 0.5 * torch.randn(N, device=dev)).to(dtype)
        ref = norms.rms_norm(x, w, eps=1e-6)
        nb = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
        rows = {"package": lambda: norms.rms_norm(x, w, eps=1e-6)}
        if not args.cpu:
            y0 = torch.empty_like(x)
            rows["copy"] = lambda: y0.copy_(x)
        for name, (tier, depth) in chosen.items():
            try:
                y = forward(x, w, tier, depth)
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile is a record, not the end
                sw.record(shape=[M, N], setting=name, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                sw.log(f"{name} {M}x{N}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            same = bool(torch.equal(y, forward(x, w, tier, 1)))  # DEPTH 2 changes no arithmetic
            err = (y.float() - ref.float()).abs().max().item()
            sw.log(f"check {name} {M}x{N}: bitwise equal to its DEPTH 1 {same}, to the package "
                   f"{bool(torch.equal(y, ref))} (max diff {err:.2e})")
            if not same or err > 0.05:
                sw.record(shape=[M, N], setting=name, equal=False, err=err)
                continue
            rows[name] = lambda tier=tier, depth=depth: forward(x, w, tier, depth)
        if args.cpu:
            continue
        for rnd in range(2):  # two rounds, settings in turn (the GPU's clocks drift)
            for name, fn in rows.items():
                if sw.left() < 10:
                    break
                ms = triton.testing.do_bench(fn, warmup=10, rep=args.rep)
                gms = graph_ms(fn)
                rec = {"shape": [M, N], "setting": name, "round": rnd, "do_bench_gbs": nb / ms / 1e6,
                       "graph_gbs": nb / gms / 1e6, "copy_ceiling": sw.copy}
                sw.record(**rec)
                sw.log(f"{M}x{N} r{rnd} {name:34s} do_bench {rec['do_bench_gbs']:6.0f} GB/s  graph "
                       f"{rec['graph_gbs']:6.0f} GB/s")
        del x, w, ref


if __name__ == "__main__":
    main()
