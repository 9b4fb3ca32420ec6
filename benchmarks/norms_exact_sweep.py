"""The schedule of the bit-exact norm forwards (issue 7, session 17): rows per program, warps, the statistics
loop's unrolled groups and the normalisation chunk, per torch order and row width.

    python benchmarks/norms_exact_sweep.py OUT_DIR --pkg PKG_DIR [--kinds mean,fused,ln] [--shapes MxN,...]
                                           [--warm I/N] [--budget-s S] [--rep MS] [--only-shipped]

``PKG_DIR`` is a built triton-norms variant (``triton-collection build``, then ``build/torch-cuda``), loaded with
``kernels.get_local_kernel``; ``--warm I/N`` only runs (compiles) the I-th of N shares of the candidates, so several
processes can fill Triton's disk cache before one process times them all.

The layers are the ones ``kernelize`` swaps in: ``LlamaRMSNorm`` (``mean``: ``x.float().pow(2).mean(-1)``'s order),
``TorchRMSNorm`` (``fused``: ``torch.nn.RMSNorm``) and ``LayerNorm`` (``ln``: ``torch.nn.LayerNorm``), each called on
the torch module it replaces (bf16 weights). Every candidate must give the module's output bit for bit; the ones that
do are timed with ``triton.testing.do_bench`` (median; GB/s count x read and y written once), next to the module
itself and a device copy. None of the candidates changes the order of additions: each is a schedule of the same sums.
Results of session 17 (the table in ``_exact.default_schedule``): ``results/norms_exact_2026-12-02.md``.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch


def modules(kind: str, N: int, dev: str):
    """The torch module our layer replaces, for one kind at width N (bf16, random weights about 1)."""
    torch.manual_seed(N)
    if kind == "mean":
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        mod = LlamaRMSNorm(N, eps=1e-6)
    elif kind == "fused":
        mod = torch.nn.RMSNorm(N, eps=1e-6)
    else:
        mod = torch.nn.LayerNorm(N, eps=1e-5)
    mod = mod.to(dev, torch.bfloat16)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + 1)
    return mod


def candidates(kind: str, norms, M: int, N: int, dev) -> list:
    """Schedules to try: elements per thread per statistics load 1 to 8 (bf16: 2- to 16-byte vectors), 1, 2 or 4
    rows per program, at most 1024 threads, unrolled groups of the whole loop (up to 32 trips, else 8 and 32) or 2
    trips, normalisation chunks of 8 or 32 elements per thread; for the RMS orders up to 8192 elements, both layouts
    of the sum trees (``split``, ``_exact_stats._fold_mid``)."""
    to, ex = norms._torch_order, norms._exact
    if kind == "mean":
        cfg = to.mean_config(M, N, *to.device_limits(dev))
        width, iters = 4 * cfg.bw * cfg.bhr, cfg.iters
    else:
        width, iters = 512, -(-N // 512)
    out = []
    for rows in (1, 2, 4):
        for warps in (1, 2, 4, 8, 16, 32):
            e = rows * width // (32 * warps)
            if e not in (1, 2, 4, 8):
                continue
            unrolls = sorted({u for u in (iters if iters <= 32 else 8, 32 if iters > 32 else 2, 2)
                              if 1 <= u <= iters}, reverse=True)
            for unroll in unrolls:
                seen = set()
                for a in (8, 32):
                    apply_bytes = min(a * 32 * warps // rows, 1 << (N - 1).bit_length()) * 2
                    if apply_bytes in seen:
                        continue
                    seen.add(apply_bytes)
                    for split in (False, True) if kind != "ln" and N <= 8192 else (None,):
                        cand = dict(rows=rows, num_warps=warps, unroll=unroll, apply_bytes=apply_bytes)
                        out.append(cand if split is None else dict(cand, split=split))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pkg", required=True)
    ap.add_argument("--kinds", default="mean,fused,ln")
    ap.add_argument("--shapes", default="32768x4096,16384x8192,4096x65536")
    ap.add_argument("--warm", default=None)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--rep", type=int, default=30)
    ap.add_argument("--only-shipped", action="store_true")
    args = ap.parse_args()
    import kernels
    from triton.testing import do_bench

    t0 = time.time()
    norms = kernels.get_local_kernel(Path(args.pkg))
    ex = sys.modules[norms.__name__ + "._exact"]
    # the inference plans keep their launches: cleared with the schedule (layer_norm has them since session 38)
    infer_plans = [getattr(sys.modules[norms.__name__ + "." + name], "_INFER_PLANS", {})
                   for name in ("rms_norm", "layer_norm")]
    layers = norms.layers
    forward = {"mean": layers.LlamaRMSNorm.forward, "fused": layers.TorchRMSNorm.forward, "ln": layers.LayerNorm.forward}
    shipped = getattr(ex, "default_schedule", None)  # None: a build from before the schedule table (shipped only)
    dev = torch.device("cuda")
    share = tuple(int(v) for v in args.warm.split("/")) if args.warm else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = out / ("warm.jsonl" if share else "records.jsonl")
    a = torch.empty(2**27, dtype=torch.bfloat16, device=dev)
    b = torch.empty_like(a)
    copy = 4 * a.numel() / do_bench(lambda: b.copy_(a), rep=args.rep) / 1e6
    if not share:
        print(f"copy {copy:.0f} GB/s", flush=True)
    k = 0
    seen_kernels = set()
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        x = torch.randn(M, N, device=dev).to(torch.bfloat16)
        nbytes = 4 * M * N
        for kind in args.kinds.split(","):
            mod = modules(kind, N, dev)
            with torch.no_grad():
                want = mod(x)
                t_mod = do_bench(lambda: mod(x), rep=args.rep) if not share else float("nan")
            cands = [None] + ([] if args.only_shipped else candidates(kind, norms, M, N, dev))
            best = None
            for cand in cands:
                k += 1
                if share and k % share[1] != share[0]:
                    continue
                if time.time() - t0 > args.budget_s:
                    print("budget spent", flush=True)
                    return 0
                if shipped is not None:
                    ex.default_schedule = shipped if cand is None else (lambda *a_, c=cand: c)
                ex.rms_exact_plan.cache_clear()
                if hasattr(ex, "ln_exact_plan"):  # builds from before session 18 plan LayerNorm per call
                    ex.ln_exact_plan.cache_clear()
                for plans in infer_plans:
                    plans.clear()
                try:
                    with torch.no_grad():
                        y = forward[kind](mod, x)
                        same = bool(torch.equal(y, want))
                        ms = do_bench(lambda: forward[kind](mod, x), rep=args.rep) if not share and same else float("nan")
                except Exception as e:  # noqa: BLE001 - a candidate that does not compile is recorded
                    same, ms = False, float("nan")
                    print(kind, shape, cand, "ERROR", repr(e)[:200], flush=True)
                    ms = float("nan")
                if share:
                    continue
                gbs = nbytes / ms / 1e6
                kern = ex._ln_exact_fwd_kernel if kind == "ln" else ex._rms_exact_fwd_kernel
                compiled = [c for cache in kern.device_caches.values() for c in cache[0].values()]
                new = [c for c in compiled if id(c) not in seen_kernels]
                seen_kernels.update(id(c) for c in new)
                regs = [(getattr(c, "n_regs", None), getattr(c, "n_spills", None)) for c in new]
                r = dict(kind=kind, shape=shape, cand=cand or "shipped", same=same, ms=ms, gbs=gbs, copy=copy,
                         module_gbs=nbytes / t_mod / 1e6, regs_spills=regs)
                with open(rec, "a") as f:
                    f.write(json.dumps(r) + "\n")
                if same and (best is None or gbs > best[0]):
                    best = (gbs, cand)
                if cand is None or not same:
                    print(f"{kind:5} {shape:12} {str(cand or 'shipped'):70} same={same} {gbs:7.0f} GB/s"
                          f" (module {nbytes / t_mod / 1e6:.0f})", flush=True)
            if not share and best:
                print(f"BEST {kind:5} {shape:12} {best[1]} {best[0]:.0f} GB/s ({best[0] / copy:.2f} of copy)",
                      flush=True)
            if shipped is not None:
                ex.default_schedule = shipped
    return 0


if __name__ == "__main__":
    sys.exit(main())
