"""Session 12 sweep: softmax forward layouts for 32-512 KiB rows (issue 4; results/softmax_wide_sweep_2026-12-01.txt).

    python benchmarks/softmax_wide_sweep.py OUT_DIR [--rounds R]     (GPU)
    python benchmarks/softmax_wide_sweep.py --sass OUT_DIR             (CPU: registers / spills per variant, sm_90)

Standalone bf16 softmax forward kernels over the last dim of a contiguous (M, N), timed from CUDA-graph replays in
interleaved rounds next to the package's softmax, each checked against fp64 torch (ulps of bf16) and torch.softmax
(fraction of elements bit-equal):
- ``reg W [rcp] [maxnreg R]``: one program per row, the row in registers (W warps); ``rcp``: ``e * (1 / s)`` instead
  of ``e / s``; ``maxnreg``: a register cap so that two programs fit an SM. (Keeping x in bf16 across the reductions
  and evaluating exp twice was compiled on the CPU machine, without the runtime's alignment hints: ptxas used more
  registers, not fewer; dropped before any GPU run.)
- ``pers P B W``: a persistent grid of P programs per SM, each walking rows two-pass (online max / sum over chunks of
  B bytes with the next chunk's load in flight, then the output pass last chunk first). P bounds the bytes of rows in
  flight so that the re-read hits L2 (50 MB): rows x P x SMs, e.g. 256 KiB x 2 x 132 = 66 MB.
The 8192 x 128256 shape stands in for the cross-entropy forward with its gradient (same traffic: read the row for
the logsumexp, re-read it and write one gradient row).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def reg_kernel(x_ptr, y_ptr, N, sx, sy, BLOCK: tl.constexpr, RCP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    z = tl.load(x_ptr + row * sx + offs, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(z, axis=0)
    e = tl.exp(z - m)
    s = tl.sum(e, axis=0)
    if RCP:
        y = e * (1.0 / s)
    else:
        y = e / s
    tl.store(y_ptr + row * sy + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def pers_kernel(x_ptr, y_ptr, M, N, sx, sy, BLOCK: tl.constexpr, RCP: tl.constexpr):
    n_chunks = tl.cdiv(N, BLOCK)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        xr = x_ptr + row * sx  # sx, sy: int64 arguments
        yr = y_ptr + row * sy
        mx = tl.full([], float("-inf"), tl.float32)
        s = tl.full([], 0.0, tl.float32)
        offs = tl.arange(0, BLOCK)
        nxt = tl.load(xr + offs, mask=offs < N, other=float("-inf"), eviction_policy="evict_last")
        for i in range(0, n_chunks):
            z = nxt.to(tl.float32)
            offs = (i + 1) * BLOCK + tl.arange(0, BLOCK)
            nxt = tl.load(xr + offs, mask=offs < N, other=float("-inf"), eviction_policy="evict_last")
            new = tl.maximum(mx, tl.max(z, axis=0))
            s = s * tl.exp(mx - new) + tl.sum(tl.exp(z - new), axis=0)
            mx = new
        r = 1.0 / s
        for i in range(0, n_chunks):
            offs = (n_chunks - 1 - i) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < N
            z = tl.load(xr + offs, mask=mask, other=float("-inf"), eviction_policy="evict_first").to(tl.float32)
            e = tl.exp(z - mx)
            if RCP:
                y = e * r
            else:
                y = e / s
            tl.store(yr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def variants(N: int):
    """(name, launcher) pairs for rows of N bf16 elements."""
    out = []
    row_bytes = 2 * N
    if row_bytes <= 65536:
        for w in (8, 16, 32):
            for rcp in (False, True):
                for nreg in {(16384, 16): (None, 64)}.get((N, w), (None,)):
                    out.append((f"reg {w}{' rcp' if rcp else ''}{f' maxnreg {nreg}' if nreg else ''}",
                                ("reg", w, rcp, nreg)))
    if row_bytes >= 32768:
        for p, b, w in ((1, 16384, 8), (2, 16384, 8), (2, 8192, 4), (3, 8192, 4), (4, 8192, 4), (1, 32768, 16),
                        (4, 4096, 4), (6, 4096, 4)):
            out.append((f"pers {p} {b // 1024}K {w}", ("pers", p, b, w)))
    return out


def launcher(spec, x, y, sms):
    M, N = x.shape
    if spec[0] == "reg":
        _, w, rcp, nreg = spec
        block = triton.next_power_of_2(N)
        opts = {"maxnreg": nreg} if nreg else {}
        return lambda: reg_kernel[(M,)](x, y, N, x.stride(0), y.stride(0), BLOCK=block, RCP=rcp,
                                        num_warps=w, **opts)
    _, p, b, w = spec
    grid = (min(M, p * sms),)
    return lambda: pers_kernel[grid](x, y, M, N, x.stride(0), y.stride(0), BLOCK=b // x.element_size(), RCP=True,
                                     num_warps=w)


def sass(out: Path):
    """Registers and spills of every variant for sm_90 (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    lines = []
    for N in (16384, 32768, 65536, 131072):
        for name, spec in variants(N):
            if spec[0] == "reg":
                kern, consts = reg_kernel, {"BLOCK": triton.next_power_of_2(N), "RCP": spec[2]}
                sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "N": "i32", "sx": "i64", "sy": "i64"}
            else:
                kern, consts = pers_kernel, {"BLOCK": spec[2] // 2, "RCP": True}
                sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "M": "i32", "N": "i32", "sx": "i64", "sy": "i64"}
            w = spec[1] if spec[0] == "reg" else spec[3]
            sig.update({k: "constexpr" for k in consts})
            # the runtime's specialisation: pointers 16-byte aligned, sizes and strides multiples of 16
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kern.arg_names) if n not in consts}
            src = ASTSource(kern, sig, constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()},
                            attrs=attrs)
            opts = {"num_warps": w}
            if spec[0] == "reg" and spec[3]:
                opts["maxnreg"] = spec[3]
            ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
            cubin = out / "k.cubin"
            cubin.write_bytes(ck.asm["cubin"])
            res = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
            regs = res.split("REG:")[1].split()[0] if "REG:" in res else "?"
            spill = "STACK:" + res.split("STACK:")[1].split()[0] if "STACK:" in res else ""
            lines.append(f"N={N:7d} {name:22s} regs {regs:>4s} {spill}")
            print(lines[-1], flush=True)
    (out / "sass.txt").write_text("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sass:
        return sass(out)
    sys.path.insert(0, str(Path(__file__).parent))
    from sweep_common import copy_gbps, load_packages, tee
    from triton_collection.bench import graph_median

    (pkg,) = load_packages(["triton-softmax"], False)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    say = tee(out / "softmax_wide_sweep.txt")
    copy = copy_gbps(lambda fn: graph_median(fn, rep=200))
    say(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
        f"{time.strftime('%Y-%m-%d %H:%M')} copy {copy:.0f} GB/s (CUDA-graph)")
    records = []
    for M, N in ((16384, 16384), (8192, 32768), (4096, 65536), (8192, 128256), (2048, 131072), (1024, 262144)):
        torch.manual_seed(N)
        x = (torch.randn(M, N, device="cuda") * 3).to(torch.bfloat16)
        y = torch.empty_like(x)
        ref64 = torch.softmax(x[:256].double(), -1)
        ref_t = torch.softmax(x, -1)
        nbytes = 2 * M * N * 2
        cands = [("package", lambda: pkg.softmax(x))] + [(n, launcher(s, x, y, sms)) for n, s in variants(N)]
        ok = []
        for name, fn in cands:
            try:
                y.fill_(float("nan"))
                res = fn()
                got = res if isinstance(res, torch.Tensor) else y
                torch.cuda.synchronize()
                ulp = ((got[:256].double() - ref64).abs() / (ref64.abs() * 2.0**-8).clamp_min(2.0**-133)).max().item()
                eq = (got == ref_t).float().mean().item()
                ok.append((name, fn, ulp, eq))
            except Exception as e:  # noqa: BLE001
                say(f"N={N} {name}: ERR {type(e).__name__} {str(e)[:200]}")
        times = {n: [] for n, *_ in ok}
        for _ in range(args.rounds):
            for name, fn, *_ in ok:
                times[name].append(graph_median(fn, rep=60))
        base = statistics.median(times["package"]) if "package" in times else None
        for name, fn, ulp, eq in ok:
            ms = statistics.median(times[name])
            gbps = nbytes / ms / 1e6
            rel = f"{base / ms:5.3f}x pkg" if base else ""
            say(f"{M:6d}x{N:<7d} {name:22s} {ms * 1e3:9.1f} us {gbps:6.0f} GB/s {gbps / copy:5.1%} {rel} "
                f"ulp {ulp:.2f} eq_torch {eq:.5f} rounds {' '.join(f'{t * 1e3:.1f}' for t in times[name])}")
            records.append(dict(M=M, N=N, name=name, us=ms * 1e3, gbps=gbps, copy=copy, ulp=ulp, eq_torch=eq))
        del x, y, ref_t
        torch.cuda.empty_cache()
    (out / "softmax_wide_sweep.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
