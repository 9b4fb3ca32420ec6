"""Probe: wide-row forwards (rms_norm, layer_norm, softmax) as a *stream* of chunk programs that re-read from L2.

    python3 benchmarks/norms_stream_probe.py --out DIR [--cpu] [--budget S] [--kinds rms ln softmax]

The shipped wide paths (``_wide``, ``softmax``'s teams) keep a row's chunks in registers while a team meets.
Here no program holds data across a wait. Program ``v`` (a ticket taken at its start, or its program id):

1. loads chunk ``v`` of the flattened (row, chunk) sequence from DRAM (kept in L2: evict_last) and publishes the
   chunk's statistics into the row's slot ``v % CPR`` (``_team.team_publish`` / ``team_publish_pair``):
   rms_norm the sum of squares; layer_norm the sum and the sum of squared deviations from the chunk's mean
   (Chan's combination); softmax the chunk's max and its sum of exp(x - max);
2. loads chunk ``v - D`` again (an L2 hit: it was read D programs earlier) with its weights, gathers that row's
   CPR statistics (``team_gather*``: published long ago, so the poll almost never spins), combines them in slot
   order (the same bits on every run) and writes the chunk's output.

Every element is read from DRAM once and written once; a program waits only on lower tickets, which have all
started (forward progress without residency limits; under the interpreter programs run in order, so nothing
spins when ``D >= CPR``). The ticketed form was built into the packages in session 41 and removed in session 42:
on an H100 it reached 60-87% of a copy where the teams reach 88-95% (``results/norms_stream_probe_session42_h100_*``).
This script's kernel keeps the two other orders: persistent programs and program-id order. The script checks values
against fp64 and times each variant against the package's op and a copy of the same bytes: do_bench medians with
the L2 flushed (as the harness times) and CUDA-graph replays. Records: ``DIR/norms_stream_probe.jsonl``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import Sweep, load_packages, prepare  # noqa: E402

KINDS = {"rms": 0, "ln": 1, "softmax": 2}
GPU_SHAPES = {
    "rms": ((4096, 65536), (1024, 262144), (2048, 131072)),
    "ln": ((4096, 65536), (1024, 262144)),
    "softmax": ((4096, 32768), (1024, 131072), (256, 262144)),
}
CPU_SHAPES = {"rms": ((40, 20000), (8, 9000)), "ln": ((24, 20000),), "softmax": ((24, 20000),)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--budget", type=float, default=540)
    p.add_argument("--rep", type=int, default=60)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    args = p.parse_args()
    out = prepare(args.out, args.cpu)
    sw = Sweep(out / "norms_stream_probe.jsonl", args.budget, args.cpu, args.rep)

    import torch
    import triton
    import triton.language as tl

    norms, softmax_pkg = load_packages(["triton-norms", "triton-softmax"], args.cpu)
    team = sys.modules[norms.__name__ + "._team"]
    wide = sys.modules[norms.__name__ + "._wide"]
    wide.WIDE_ON_CPU = args.cpu  # the package's wide forms on CPU tensors too (a dry run)
    globals().update({f: getattr(team, f) for f in ("team_publish", "team_gather", "team_publish_pair",
                                                    "team_gather_pair")})  # the kernel's globals

    @triton.jit
    def stream_step(vid, x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, stride_x, eps, D,
                    KIND: tl.constexpr, CHUNK: tl.constexpr, CPR: tl.constexpr, P2: tl.constexpr,
                    EV1: tl.constexpr, EV2: tl.constexpr):
        total = M * CPR
        offs = tl.arange(0, CHUNK)
        ok1 = vid < total
        c1 = tl.minimum(vid, total - 1)
        r1 = (c1 // CPR).to(tl.int64)
        k1 = c1 % CPR
        col1 = k1 * CHUNK + offs
        live1 = col1 < tl.where(ok1, N, 0)
        x1 = tl.load(x_ptr + r1 * stride_x + col1, mask=live1, other=0.0, eviction_policy=EV1)
        c2 = vid - D
        ok2 = c2 >= 0
        c2 = tl.maximum(c2, 0)
        r2 = (c2 // CPR).to(tl.int64)
        k2 = c2 % CPR
        col2 = k2 * CHUNK + offs
        m2 = col2 < tl.where(ok2, N, 0)
        x2 = tl.load(x_ptr + r2 * stride_x + col2, mask=m2, other=0.0, eviction_policy=EV2)
        if KIND != 2:
            w2 = tl.load(w_ptr + col2, mask=m2, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if KIND == 1:
            b2 = tl.load(b_ptr + col2, mask=m2, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if ok1:
            xf = x1.to(tl.float32)
            slot = ws_ptr + r1 * P2 + k1
            if KIND == 0:
                team_publish(slot, tl.sum(xf * xf, 0))
            elif KIND == 1:
                n_k = tl.minimum(N - k1 * CHUNK, CHUNK).to(tl.float32)
                s = tl.sum(xf, 0)
                dev = tl.where(live1, xf - s / n_k, 0.0)
                team_publish_pair(slot, s, tl.sum(dev * dev, 0))
            else:
                xm = tl.where(live1, xf, float("-inf"))
                mx = tl.max(xm, 0)
                team_publish_pair(slot, mx, tl.sum(tl.exp(xm - mx), 0))
        if ok2:
            k = tl.arange(0, P2)
            base = ws_ptr + r2 * P2
            out_ty = y_ptr.dtype.element_ty
            xf2 = x2.to(tl.float32)
            if KIND == 0:
                rstd = 1.0 / tl.sqrt_rn(tl.sum(team_gather(base, k, CPR, 0.0), 0) / N + eps)
                xn = (xf2 * rstd).to(out_ty).to(tl.float32)
                y = xn * w2
            elif KIND == 1:
                s, q = team_gather_pair(base, k, CPR, 0.0, 0.0)
                n_k = tl.maximum(tl.minimum(N - k * CHUNK, CHUNK), 1).to(tl.float32)
                mean = tl.sum(s, 0) / N
                d = s / n_k - mean
                var = tl.sum(tl.where(k < CPR, q + n_k * d * d, 0.0), 0) / N
                rstd = 1.0 / tl.sqrt_rn(var + eps)
                y = (xf2 - mean) * rstd * w2 + b2
            else:
                mk, lk = team_gather_pair(base, k, CPR, float("-inf"), 0.0)
                mx = tl.max(mk, 0)
                total_l = tl.sum(tl.where(k < CPR, lk * tl.exp(mk - mx), 0.0), 0)
                y = tl.exp(xf2 - mx) / total_l
            tl.store(y_ptr + r2 * N + col2, y.to(out_ty), mask=m2, eviction_policy="evict_first")

    globals()["stream_step"] = stream_step  # the kernels below find it among their globals

    @triton.jit
    def stream_fwd(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, stride_x, eps, D,
                   KIND: tl.constexpr, CHUNK: tl.constexpr, CPR: tl.constexpr, P2: tl.constexpr,
                   EV1: tl.constexpr, EV2: tl.constexpr):
        # one program per chunk (grid M * CPR + D) in program-id order (no ticket: the packages' form has one)
        stream_step(tl.program_id(0), x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, stride_x, eps, D, KIND, CHUNK, CPR, P2, EV1, EV2)

    @triton.jit
    def stream_persistent(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, stride_x, eps, D, NPROG,
                          KIND: tl.constexpr, CHUNK: tl.constexpr, CPR: tl.constexpr, P2: tl.constexpr,
                          EV1: tl.constexpr, EV2: tl.constexpr, STAGES: tl.constexpr):
        # NPROG programs, all resident (the launch caps registers), each taking chunks pid, pid + NPROG, ...
        for vid in tl.range(tl.program_id(0), M * CPR + D, NPROG, num_stages=STAGES):
            stream_step(vid, x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, M, N, stride_x, eps, D, KIND, CHUNK, CPR, P2,
                        EV1, EV2)

    props = None if args.cpu else torch.cuda.get_device_properties(0)
    sms = 8 if args.cpu else props.multi_processor_count

    def stream(kind, x, w, b, y, chunk, warps, d_per_sm, ev1="evict_last", ev2="evict_first", per_sm=0, stages=1):
        """per_sm > 0: the persistent form with per_sm programs per SM; else one program per chunk, program-id order."""
        M, N = x.shape
        cpr = triton.cdiv(N, chunk)
        p2 = max(16, triton.next_power_of_2(cpr))
        D = cpr + sms * d_per_sm
        eps = 1e-6 if kind == "rms" else 1e-5
        ws = torch.zeros(M * p2, dtype=torch.int64, device=x.device)
        if per_sm:
            nprog = sms * per_sm
            args_ = (x, w, b, y, ws, M, N, x.stride(0), eps, D, nprog)
            meta = dict(KIND=KINDS[kind], CHUNK=chunk, CPR=cpr, P2=p2, EV1=ev1, EV2=ev2, STAGES=stages,
                        num_warps=warps, maxnreg=65536 // (per_sm * warps * 32) // 8 * 8)
            # every program must be resident (a waiting one spins on others): registers are capped by maxnreg;
            # shared memory (the pipelined loads' buffers with STAGES > 1) is checked here, as compiled
            smem = stream_persistent.warmup(*args_, grid=(nprog,), **meta).metadata.shared
            if (smem + 1024) * per_sm > props.shared_memory_per_multiprocessor:
                raise ValueError(f"not resident: {per_sm} x {smem} B of shared memory per SM")
            stream_persistent[(nprog,)](*args_, **meta)
        else:
            stream_fwd[(M * cpr + D,)](x, w, b, y, ws, M, N, x.stride(0), eps, D, KIND=KINDS[kind], CHUNK=chunk,
                                       CPR=cpr, P2=p2, EV1=ev1, EV2=ev2, num_warps=warps)
        return y

    def package(kind, x, w, b):
        if kind == "rms":
            return norms.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype)
        if kind == "ln":
            return norms.layer_norm(x, w, b, eps=1e-5)
        return softmax_pkg.softmax(x)

    def ref(kind, x, w, b):
        xd = x.double()
        if kind == "rms":
            rstd = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (xd * rstd).to(x.dtype).double() * w.double()
        if kind == "ln":
            return torch.nn.functional.layer_norm(xd, (x.shape[1],), w.double(), b.double(), 1e-5)
        return torch.softmax(xd, -1)

    cache = {}

    def flushed_median(fn, flush, reps=40):
        """Median ms of ``fn`` between CUDA events, the L2 flushed before each call as do_bench does (``zero``: 256 MB
        zeroed, which leaves the L2 full of dirty lines) or by reading 256 MB (``read``: clean lines only)."""
        buf = torch.empty(2**26, dtype=torch.int32, device="cuda")
        fn()
        times = []
        for _ in range(reps):
            buf.zero_() if flush == "zero" else buf.sum()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return sorted(s.elapsed_time(e) for s, e in times)[reps // 2]

    def reference(kind, x, w, b):
        """The fp64 reference and the package's output (teams), once per input."""
        if cache.get("x") is not x:
            cache.update(x=x, ref=ref(kind, x, w, b), pkg=package(kind, x, w, b))
        return cache

    def check(kind, x, w, b, y, name):
        r = reference(kind, x, w, b)["ref"]
        ulp = 2.0 ** (-7 if x.dtype == torch.bfloat16 else -10)
        floor = torch.finfo(x.dtype).tiny if kind == "softmax" else 1e-3  # subnormal outputs: absolute spacing
        err = (y.double() - r).abs() / ((r.abs() + floor) * ulp)
        worst, mean = float(err.max()), float(err.mean())
        same = float((cache["pkg"] == y).double().mean())
        # correct kernels: worst <= 1.5 (rms: two roundings), mean ~0.2; a wrong divisor or count shows in the mean
        ok = worst <= 2.0 and mean <= 0.5
        sw.log(f"check {name} ok={ok} worst {worst:.2f} ulp, mean {mean:.3f}, equal to package {same:.4f}")
        sw.record(kind="check", name=name, ok=ok, worst_ulp=worst, mean_ulp=mean, same_as_package=same)
        return ok

    sw.copy_ceiling()
    dt = torch.float16 if args.cpu else torch.bfloat16  # the interpreter's bf16 is broken
    # (chunk elements, warps): 32-64 elements per thread; the shipped team tiers use 4-8 KiB chunks over 1-2 warps
    tiles = ((2048, 1), (4096, 4)) if args.cpu else ((2048, 1), (2048, 2), (4096, 2), (4096, 4), (8192, 4), (8192, 8))
    # stage 1 (first shape of a kind): the persistent form (GPU only: under the interpreter a persistent program
    # would wait on a later one), D = 8 per SM; stage 2 (the kind's other shapes): its two best at D = 4 / 8 / 16 per
    # SM, timed with do_bench and in graphs. The ticketed form is timed through the packages on every shape.
    # Program-id order (no ticket: it relies on the hardware starting programs in order) runs last, after every
    # kind, so that a hang there loses nothing else.
    safe_variants = []
    if not args.cpu:
        # the persistent form at a few points (the budget's first concern is the package's stream rows): one and
        # two pipeline stages at 8 programs per SM of 1-2 warps, one stage at 4 of 4 warps
        safe_variants += [dict(chunk=c, warps=w, per_sm=p, stages=st)
                          for (c, w, p, st) in ((2048, 1, 8, 1), (2048, 1, 8, 2), (4096, 2, 8, 1), (4096, 2, 8, 2),
                                                (8192, 4, 4, 1))]
    pid_variants = [dict(chunk=c, warps=w) for (c, w) in tiles]

    def label(v, dps):
        form = f"persistent p{v['per_sm']} s{v['stages']}" if v.get("per_sm") else "pid"
        return f"c{v['chunk']} w{v['warps']} {form} d{dps}"

    def run_shape(kind, M, N, runs, first, graphs):
        """Times the package, a copy and each (variant, lag) of ``runs`` at M x N; returns [(GB/s, variant)] of the
        variants whose values passed the check."""
        torch.manual_seed(M + N)
        x = torch.randn(M, N, device=sw.dev, dtype=dt) * (3 if kind == "softmax" else 1)
        if kind == "ln":
            x += 3  # a nonzero mean: a wrong count of the last chunk's columns shows
        w = (1 + 0.1 * torch.randn(N, device=sw.dev)).to(dt)
        b = (0.1 * torch.randn(N, device=sw.dev)).to(dt)
        y = torch.full_like(x, float("nan"))
        nbytes, shape = 2 * x.numel() * x.element_size(), f"{M}x{N}"
        if first is not None:
            sw.timeit(kind, "package", lambda: package(kind, x, w, b), nbytes, shape=shape)
        if first is not None and not args.cpu:
            sw.timeit(kind, "copy", lambda: y.copy_(x), nbytes, shape=shape)
            g = sw.safe("graph package", lambda: sw.bench(lambda: package(kind, x, w, b), graph=True))
            if g:
                sw.log(f"graph {kind} package {shape} {nbytes / g / 1e6:.0f} GB/s")
                sw.record(kind="graph", op=kind, name="package", shape=shape, gbps=nbytes / g / 1e6)
            if first:  # how the flush's dirty lines weigh on the harness's numbers (do_bench zeroes 256 MB)
                for what, fn in (("package", lambda: package(kind, x, w, b)), ("copy", lambda: y.copy_(x))):
                    for flush in ("zero", "read"):
                        ms = sw.safe(f"flush {flush}", lambda: flushed_median(fn, flush))
                        if ms:
                            sw.log(f"flush={flush} {kind} {what} {shape} {nbytes / ms / 1e6:.0f} GB/s")
                            sw.record(kind="flush", op=kind, name=what, flush=flush, shape=shape,
                                      gbps=nbytes / ms / 1e6)
        results = []
        for v, dps in runs:
            if sw.left() < 10:
                break
            name = label(v, dps)
            y.fill_(float("nan"))
            if sw.safe(name, lambda: stream(kind, x, w, b, y, d_per_sm=dps, **v)) is None:
                continue
            if not check(kind, x, w, b, y, f"{kind} {name} {shape}"):
                continue
            gb = sw.timeit(kind, name, lambda: stream(kind, x, w, b, y, d_per_sm=dps, **v), nbytes, shape=shape)
            if gb:
                results.append((gb, v))
            if graphs and not args.cpu:
                g = sw.safe(name, lambda: sw.bench(lambda: stream(kind, x, w, b, y, d_per_sm=dps, **v), graph=True))
                if g:
                    sw.log(f"graph {kind} {name} {shape} {nbytes / g / 1e6:.0f} GB/s")
                    sw.record(kind="graph", op=kind, name=name, shape=shape, gbps=nbytes / g / 1e6)
        if first and results and not args.cpu:
            top = max(results, key=lambda r: r[0])[1]
            for ev1, ev2 in (("", ""), ("evict_last", ""), ("", "evict_first")):
                if sw.left() < 10:
                    break
                name = label(top, 8) + f" ev1={ev1 or '-'} ev2={ev2 or '-'}"
                sw.timeit(kind, name, lambda: stream(kind, x, w, b, y, d_per_sm=8, ev1=ev1, ev2=ev2, **top), nbytes,
                          shape=shape)
        del x, y
        cache.clear()
        if not args.cpu:
            torch.cuda.empty_cache()
        return results

    shapes = CPU_SHAPES if args.cpu else GPU_SHAPES
    for kind in args.kinds:
        if sw.left() < 20:
            break
        results = run_shape(kind, *shapes[kind][0], [(v, 8) for v in safe_variants], first=True, graphs=False)
        best = [v for _, v in sorted(results, key=lambda r: -r[0])[:2]]
        for M, N in shapes[kind][1:]:
            if sw.left() < 20:
                break
            run_shape(kind, M, N, [(v, dps) for v in best for dps in ((4,) if args.cpu else (4, 8, 16))],
                      first=False, graphs=True)
    for kind in args.kinds:  # program-id order, last
        if sw.left() < 20:
            break
        run_shape(kind, *shapes[kind][0], [(v, 8) for v in pid_variants], first=None, graphs=False)


if __name__ == "__main__":
    main()
