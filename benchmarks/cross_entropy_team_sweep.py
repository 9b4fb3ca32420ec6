"""Sessions 12 and 15: the cross-entropy forward+backward on persistent teams (``_launch.TEAM_TUNED["cross_entropy"]``)
against the looped kernels, at the issue's 8192 x 128256 bf16 and at 4096 x 262144 by default (GPU; issue 4).
Results: results/cross_entropy_team_2026-12-01.txt (session 12), results/cross_entropy_team_2026-12-02.txt (15).

    python benchmarks/cross_entropy_team_sweep.py OUT_DIR [--rounds 3] [--shapes MxV,...] [--settings NAME,...]

Each setting is first checked against fp64 torch (the bf16 loss within 2^-8 relative, gradient within 2^-7 of the largest
reference value), then all settings of a shape are timed once per round (``triton.testing.do_bench``, the gradient
reset between calls; at ~1.5 ms of GPU work per call the host's launches run ahead), rounds interleaved, median over
rounds. Effective GB/s as the issue counts them: 2 M V e (logits read, gradient written once). The package's softmax
forward at the same shape (its team path: the same traffic as the fused cross-entropy) is timed alongside.
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from sweep_common import copy_gbps, load_packages, tee  # noqa: E402

SETTINGS = {
    "looped (default)": None,
    "shipped": "shipped",  # _launch.TEAM_TUNED as shipped (session 15: tiers by vocabulary)
    "team 16K w4 pps4 r128": dict(chunk_bytes=16384, num_warps=4, programs_per_sm=4, maxnreg=128),
    "team 8K w4 pps4 r128": dict(chunk_bytes=8192, num_warps=4, programs_per_sm=4, maxnreg=128),
    "team 16K w4 pps3 r168": dict(chunk_bytes=16384, num_warps=4, programs_per_sm=3, maxnreg=168),
    "team 16K w8 pps2 r128": dict(chunk_bytes=16384, num_warps=8, programs_per_sm=2, maxnreg=128),
    "team 32K w8 pps2 r128": dict(chunk_bytes=32768, num_warps=8, programs_per_sm=2, maxnreg=128),
    "team 8K w2 pps8 r128": dict(chunk_bytes=8192, num_warps=2, programs_per_sm=8, maxnreg=128),
    # fma: a * b + c contracted (the gradient needs no eager rounding), session 15
    "team 8K w4 pps4 r128 fma": dict(chunk_bytes=8192, num_warps=4, programs_per_sm=4, maxnreg=128, fp_fusion=True),
    "team 8K w2 pps8 r128 fma": dict(chunk_bytes=8192, num_warps=2, programs_per_sm=8, maxnreg=128, fp_fusion=True),
    "team 16K w4 pps4 r128 fma": dict(chunk_bytes=16384, num_warps=4, programs_per_sm=4, maxnreg=128, fp_fusion=True),
    "team 4K w1 pps16 r128 fma": dict(chunk_bytes=4096, num_warps=1, programs_per_sm=16, maxnreg=128, fp_fusion=True),
    "team 8K w2 pps6 r168 fma": dict(chunk_bytes=8192, num_warps=2, programs_per_sm=6, maxnreg=168, fp_fusion=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="8192x128256,4096x262144", help="comma-separated MxV (default: the issue's)")
    ap.add_argument("--settings", default="", help="comma-separated setting names (default: all)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from triton.testing import do_bench

    (pkg,) = load_packages(["triton-softmax"], False)
    L = sys.modules[pkg.__name__ + "._launch"]
    shipped = L.TEAM_TUNED["cross_entropy"]

    def use(s):
        """Select setting ``s`` (None: the looped kernels)."""
        L.TEAM_TUNED["cross_entropy"] = shipped if s == "shipped" else dict(min_row_bytes=32768, **s) if s else None
        L.retuned()  # the launch plans follow the setting
    say = tee(out / "ce_team.txt")
    copy = copy_gbps(lambda fn: do_bench(fn, rep=200, return_mode="median"))
    say(f"# {torch.cuda.get_device_name()} torch {torch.__version__} copy {copy:.0f} GB/s (do_bench)")
    settings = ({"looped (default)": None, **{k: SETTINGS[k] for k in args.settings.split(",")}} if args.settings
                else SETTINGS)
    for M, V in (tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")):
        torch.manual_seed(V)
        x = (torch.randn(M, V, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, V, (M,), device="cuda")
        t[::7] = -100
        xd = x.detach()[:64].double().requires_grad_()
        ref_loss = F.cross_entropy(xd, t[:64])
        ref_loss.backward()
        nbytes = 2 * M * V * 2
        fns = {}
        for name, s in settings.items():
            use(s)
            x64 = x.detach()[:64].clone().requires_grad_()
            loss = pkg.cross_entropy(x64, t[:64])
            loss.backward()
            err_l = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
            err_g = ((x64.grad.double() - xd.grad).abs().max() / xd.grad.abs().max()).item()
            plan = L.team_for(V, x, M, "cross_entropy")
            if err_l > 2**-8 or err_g > 2**-7:  # the loss comes back in bf16 (as torch's): within one bf16 ulp
                say(f"{M}x{V} {name}: WRONG loss rel {err_l:.2e} grad {err_g:.2e}")
                continue
            fns[name] = (s, err_l, err_g, plan)
        times = {n: [] for n in fns}
        sm_times = []
        for _ in range(args.rounds):
            for name, (s, *_r) in fns.items():
                use(s)

                def step():
                    pkg.cross_entropy(x, t).backward()
                times[name].append(do_bench(step, rep=300, grad_to_none=[x], return_mode="median"))
            xs = x.detach()
            sm_times.append(do_bench(lambda: pkg.softmax(xs), rep=200, return_mode="median"))
        use(None)
        base = statistics.median(times["looped (default)"])
        for name, (s, err_l, err_g, plan) in fns.items():
            ms = statistics.median(times[name])
            say(f"{M:5d}x{V:<7d} {name:24s} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s {nbytes / ms / 1e6 / copy:5.1%} "
                f"{base / ms:5.3f}x looped  loss rel {err_l:.1e} grad {err_g:.1e}  plan {plan}  rounds "
                f"{' '.join(f'{v * 1e3:.0f}' for v in times[name])}")
        ms = statistics.median(sm_times)
        say(f"{M:5d}x{V:<7d} {'softmax fwd (package)':24s} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s (x read, y written)")
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
