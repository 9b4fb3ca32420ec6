"""Decode-step attention kernels alone (issue 6): the pointer forward's key splits and tiles at GQA decode shapes,
next to SDPA, on a GPU.

    python3 benchmarks/attention_decode_probe.py --out DIR

Per case (bf16, [B, H, S, D], one query, no mask) and variant: the CUDA-graph replay median (``do_bench_cudagraph``,
us: the kernels alone) and the output's largest difference from SDPA's. Variants: ``package`` (the package's own
choice), ``no pack`` (``flash.PACK_GQA`` off: one program row per query head), ``splits N`` (``flash.FORCE_SPLITS``),
``tile BN W S`` (``flash.DECODE_TILE``, splits as the package chooses them). A profiler table of the package's kernels follows. Writes ``DIR/attention_decode_probe.txt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import load_packages  # noqa: E402

CASES = [(1, 32, 8, 1024), (1, 32, 8, 4096), (1, 32, 8, 16384), (8, 32, 8, 1024), (1, 32, 32, 1024),
         (4, 32, 8, 4096), (1, 9, 3, 160)]  # the last: SmolLM2-135M's heads (d 64 there; 128 here)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="+", metavar="B,HQ,HKV,S", help="decode cases (default: CASES)")
    ap.add_argument("--splits", nargs="+", type=int, default=[2, 4, 8, 16, 32], help="FORCE_SPLITS variants")
    ap.add_argument("--no-tiles", action="store_true", help="leave out the DECODE_TILE variants")
    args = ap.parse_args()
    cases = [tuple(int(v) for v in c.split(",")) for c in args.cases] if args.cases else CASES
    from triton.testing import do_bench_cudagraph

    (pkg,) = load_packages(["triton-attention"], cpu=False, root=Path(__file__).resolve().parents[1])
    flash = sys.modules[pkg.__name__ + ".flash"]
    lines = [f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, sms "
             f"{torch.cuda.get_device_properties(0).multi_processor_count}"]
    for B, Hq, Hk, Sk in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(B, h, s, 128, generator=g).to("cuda", torch.bfloat16)
                   for h, s in ((Hq, 1), (Hk, Sk), (Hk, Sk)))
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hk)
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hk)  # noqa: E731
        ours = lambda: flash._attn_fwd_launch(q, k, v, None, 128 ** -0.5, False, False, False)[0]  # noqa: E731
        variants = {"sdpa": {}, "package": {}, "no pack": {"PACK_GQA": False}}
        for n in args.splits:
            variants[f"splits {n}"] = {"FORCE_SPLITS": n}
        tiles = () if args.no_tiles else ((32, 2, 3), (64, 2, 3), (64, 4, 2), (64, 8, 3), (128, 4, 2), (128, 4, 3),
                                          (32, 4, 4))
        for tile in tiles:
            variants["tile %d %d %d" % tile] = {"DECODE_TILE": tile}
        row = [f"case {B}x{Hq}({Hk}kv)x1x{Sk} d128"]
        for name, switches in variants.items():
            saved = {n: getattr(flash, n) for n in switches}
            for n, val in switches.items():
                setattr(flash, n, val)
            fn = sdpa if name == "sdpa" else ours
            try:
                err = float((fn().float() - ref.float()).abs().max())
                us = do_bench_cudagraph(fn, rep=50) * 1e3
                row.append(f"{name} {us:.2f} us (err {err:.1e})")
            except Exception as e:  # noqa: BLE001 - a variant out of resources: reported, the others go on
                row.append(f"{name} failed: {type(e).__name__}: {str(e)[:80]}")
            for n, val in saved.items():
                setattr(flash, n, val)
        lines.append(" | ".join(row))
        print(lines[-1], flush=True)
        if (B, Sk) == (1, 1024) and Hk == 8:
            fn = ours
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            lines.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
            print(lines[-1], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "attention_decode_probe.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
