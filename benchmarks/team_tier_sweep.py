"""Team settings by row width (issues 4 and 7), session 15: the softmax forward and backward, rms_norm, add_rms_norm
and layer_norm forwards on persistent teams (``_team``) with chunks of 4, 8, 16 and 32 KiB, against the looped kernels
and the shipped setting.

    python benchmarks/team_tier_sweep.py OUT_DIR [--rounds 3] [--kinds softmax,rms_norm,...] [--widths N,...]
                                         [--shipped-only]

The cross-entropy sweep of the same session (``cross_entropy_team_sweep.py``) found the fastest team setting to change
with the row width, the fastest being the one whose team has about 32 members (128256: 8 KiB chunks; 262144: 16 KiB;
65536: 4 KiB). This times the same question for the other team kernels, in two families per kind (elements per thread,
register cap, warps per SM fixed; the chunk, and so the team size, varies). Every setting is checked first against
fp32 torch (softmax) or the looped kernel (norms), within one bf16 ulp or 2^-10 of the row's scale, then timed with
``triton.testing.do_bench`` (median), settings interleaved per round, median over rounds, M = 2^28 / N bf16. GB/s
count each tensor once: x read and y written (2 M N e); the backward y, dy, dx (3 M N e); with a residual x, r, h,
y (4 M N e). Results: results/team_tiers_2026-12-02.txt.
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sweep_common import copy_gbps, load_packages, tee  # noqa: E402


def per_chunk(chunk_kib: int, elems_per_thread: int, elem: int, maxnreg: int, warps_per_sm: int) -> dict:
    """A setting with ``elems_per_thread`` elements per thread and ``warps_per_sm`` warps per SM."""
    warps = max(1, chunk_kib * 1024 // elem // elems_per_thread // 32)
    return dict(chunk_bytes=chunk_kib * 1024, num_warps=warps, programs_per_sm=max(1, warps_per_sm // warps),
                maxnreg=maxnreg)


def workload(kind: str, sm_pkg, norms, M: int, N: int, device: str):
    """(call, reference output in fp32, bytes moved, x) for one kind at M x N bf16: the reference is fp32 torch for
    the softmax, the current setting's own output for the norms (call it with the looped kernels selected)."""
    torch.manual_seed(N)
    x = (torch.randn(M, N, device=device) * 2).to(torch.bfloat16)
    w = torch.randn(N, device=device).to(torch.bfloat16)
    if kind == "softmax":
        return (lambda: sm_pkg.softmax(x)), torch.softmax(x.float(), -1), 4 * M * N, x  # x read, y written
    if kind == "softmax_bwd":
        xg = x.detach().requires_grad_()
        yg = sm_pkg.softmax(xg)
        dy = torch.randn_like(x)
        yd = yg.detach().float()
        ref = yd * (dy.float() - (yd * dy.float()).sum(-1, keepdim=True))
        return (lambda: torch.autograd.grad(yg, xg, dy, retain_graph=True)[0]), ref, 6 * M * N, x  # y, dy, dx
    if kind == "add_rms_norm":
        r = torch.randn_like(x)
        call, nbytes = (lambda: norms.add_rms_norm(x, r, w, eps=1e-6)[0]), 8 * M * N  # x, residual, h, y
    elif kind == "rms_norm":
        call, nbytes = (lambda: norms.rms_norm(x, w, eps=1e-6)), 4 * M * N
    else:
        b = torch.randn(N, device=device).to(torch.bfloat16)
        call, nbytes = (lambda: norms.layer_norm(x, w, b, eps=1e-5)), 4 * M * N
    return call, call().float(), nbytes, x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="softmax,rms_norm,layer_norm")
    ap.add_argument("--shipped-only", action="store_true", help="time the looped kernels and the shipped setting only")
    ap.add_argument("--families", help="ELEMS_PER_THREAD/MAXNREG/WARPS_PER_SM,... for every kind (replaces its own)")
    ap.add_argument("--chunks", default="4,8,16,32", help="chunk sizes in KiB")
    ap.add_argument("--widths", default="32768,65536,131072,262144", help="row widths N (M = 2^28 / N)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from triton.testing import do_bench

    sm_pkg, norms = load_packages(["triton-softmax", "triton-norms"], False)
    sm_launch = sys.modules[sm_pkg.__name__ + "._launch"]
    wide = sys.modules[norms.__name__ + "._wide"]
    say = tee(out / "team_tiers.txt")
    copy = copy_gbps(lambda fn: do_bench(fn, rep=200, return_mode="median"))
    say(f"# {torch.cuda.get_device_name()} torch {torch.__version__} copy {copy:.0f} GB/s (do_bench)")
    elem = 2  # bf16
    kinds = {
        # kind: (tuned dict, key, families: (elements per thread, maxnreg, warps per SM))
        "softmax": (sm_launch.TEAM_TUNED, "softmax", ((64, 128, 16), (32, 96, 24))),
        "rms_norm": (wide.WIDE_TUNED, "rms_norm", ((32, 80, 24), (64, 128, 16))),
        "layer_norm": (wide.WIDE_TUNED, "layer_norm", ((32, 96, 20), (64, 128, 16))),
        "add_rms_norm": (wide.WIDE_TUNED, "add_rms_norm", ((32, 80, 24), (64, 128, 16))),
        "softmax_bwd": (sm_launch.TEAM_TUNED, "softmax_bwd", ((32, 128, 16), (64, 128, 16))),
    }
    for kind in args.kinds.split(","):
        table, key, families = kinds[kind]
        shipped = table[key]
        settings = {"looped": None}
        if shipped:
            settings["shipped"] = shipped
        if args.families:
            families = [tuple(map(int, f.split("/"))) for f in args.families.split(",")]
        for e, r, wps in () if args.shipped_only else families:
            for kib in map(int, args.chunks.split(",")):
                s = per_chunk(kib, e, elem, r, wps)
                settings[f"{kib}K w{s['num_warps']} pps{s['programs_per_sm']} r{r}"] = {**s, "min_row_bytes": 32768}
        for N in map(int, args.widths.split(",")):
            M = 2**28 // N
            if not kind.startswith("softmax"):
                table[key] = None  # the norms are checked against their looped kernel
            call, ref, nbytes, x = workload(kind, sm_pkg, norms, M, N, "cuda")
            ok = {}
            for name, s in settings.items():
                table[key] = s
                sm_launch.retuned()  # the softmax's launch plans follow the setting
                y = call().float()
                # within one bf16 ulp of the reference, or 2^-10 of the row's scale (values near zero)
                scale = 1.0 if kind != "softmax_bwd" else ref.abs().amax(-1, keepdim=True)
                err = ((y - ref).abs() - ref.abs() * 2**-7 - scale * 2**-10).max().item()
                if err > 0:
                    say(f"{kind} {M}x{N} {name}: WRONG ({err:.2e})")
                    continue
                ok[name] = s
            times = {n: [] for n in ok}
            for _ in range(args.rounds):
                for name, s in ok.items():
                    table[key] = s
                    sm_launch.retuned()
                    times[name].append(do_bench(call, rep=150, return_mode="median"))
            base = statistics.median(times["looped"]) if "looped" in times else None
            for name in ok:
                ms = statistics.median(times[name])
                plan = None
                if ok[name] is not None:
                    table[key] = ok[name]
                    plan = (sm_launch.team_for(N, x, M, key) if kind.startswith("softmax")
                            else wide.team_for(key, N, elem, M, x.device))
                say(f"{kind:12s} {M:5d}x{N:<7d} {name:22s} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s "
                    f"{nbytes / ms / 1e6 / copy:5.1%} " + (f"{base / ms:5.3f}x looped " if base else "")
                    + f"team {None if plan is None else (plan.team, plan.teams)}")
            del x
            torch.cuda.empty_cache()
        table[key] = shipped


if __name__ == "__main__":
    main()
