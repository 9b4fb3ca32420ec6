"""The Gluon forward of triton-attention (flash_sm90.py, issue 6) under other settings, next to SDPA and the package's
``tl`` forward, in one process (GPU, compute capability 9.0).

    python3 benchmarks/attention_sm90_sweep.py OUT [--shapes B,H,S,D[,c];...] [--variants N,S,P,R;...]

A variant is ``block_n,stages,pingpong(0|1),consumer_regs``; ``package`` is the shipped ``CONFIGS`` entry and
``tl`` the package with the Gluon forward off (``flash.SM90_FWD = False``: the tensor-descriptor ``tl`` kernel).
Every variant's output is checked against the ``tl`` forward (max |difference| / max |value| < 2e-2) before it is
timed. TFLOP/s = 4 B H S^2 D / ``do_bench``'s median (halved for causal). Results: ``OUT/attention_sm90.txt``.
Session 25: ``results/attention_sm90_session25_2026-12-03.txt``.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from sweep_common import load_packages, prepare, tee  # noqa: E402

SHAPES = "4,32,4096,128;1,32,16384,128;4,32,4096,128,c;1,32,16384,128,c;1,24,4608,128;2,38,4429,64;4,32,4096,64,c"
VARIANTS = "128,2,1,232;128,2,0,232;128,2,0,224;128,2,1,224;128,3,0,224"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--variants", default=VARIANTS)
    args = ap.parse_args()
    out = prepare(args.out, cpu=False)
    say = tee(out / "attention_sm90.txt")
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    (pkg,) = load_packages(["triton-attention"], cpu=False)
    flash = sys.modules[pkg.__name__ + ".flash"]
    sm90 = sys.modules[pkg.__name__ + ".flash_sm90"]
    shipped = dict(sm90.CONFIGS)
    say(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, shipped {shipped}")
    variants = [tuple(int(x) for x in v.split(",")) for v in args.variants.split(";")]
    for item in args.shapes.split(";"):
        f = item.split(",")
        B, H, S, D = (int(x) for x in f[:4])
        causal = len(f) > 4 and f[4] == "c"
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * S * S * D / (2 if causal else 1)

        def run():
            return pkg.flash_attention(q, k, v, causal=causal)

        flash.SM90_FWD = False
        want = run()
        row = {"sdpa": do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=200),
               "tl": do_bench(run, warmup=25, rep=200)}
        flash.SM90_FWD = True
        for name, cfg in [("package", shipped[D])] + [(f"{n},{s},{p},{r}", sm90.Sm90Config(n, s, bool(p), r))
                                                      for n, s, p, r in variants]:
            sm90.CONFIGS[D] = cfg
            flash._FWD_PLANS.clear()  # plans keep the config they were built with
            try:
                got = run()
                err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
                if not err < 2e-2:
                    say(f"  {name}: WRONG (max relative difference {err:.3g})")
                    continue
                row[name] = do_bench(run, warmup=25, rep=200)
            except Exception as e:  # noqa: BLE001
                say(f"  {name}: failed {type(e).__name__}: {str(e)[:200]}")
        sm90.CONFIGS[D] = shipped[D]
        flash._FWD_PLANS.clear()
        say(f"{B}x{H}x{S}x{D}{' causal' if causal else ''}: "
            + ", ".join(f"{n} {flops / ms / 1e9:.0f}" for n, ms in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
