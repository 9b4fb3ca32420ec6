"""Every op's options against its default call, at the harness's shapes: finds an option whose path is slow.

    python3 benchmarks/options_probe.py --out DIR [--budget S] [--only PREFIX,...] [--base DIR] [--cpu]

The harness (``triton-collection bench``) times each op's default call; an option (label smoothing, a mask, a bias,
an output dtype, a torch order, separate gate and up tensors, ...) takes another kernel specialisation or another
path, which it never times. Here each option is timed from CUDA-graph replays (the kernels alone) and reported as
GB/s (the tensors a perfect kernel must read or write, once), fraction of the copy ceiling measured in the same run,
and speed relative to the op's default call at the same shape (the ``inner`` group: relative to ``torch.softmax``,
with ``--base`` also the base checkout's triton-softmax). Records: DIR/options.jsonl; the table: stdout.
"""

import argparse
import sys
from pathlib import Path

from sweep_common import Sweep, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--only", default="", help="comma list of case-name prefixes (default: all)")
ap.add_argument("--base", default="", help="a base checkout: its triton-softmax in the inner group too")
ap.add_argument("--cpu", action="store_true", help="dry run under the interpreter with tiny shapes")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "options.jsonl", args.budget, args.cpu, rep=25, widths=(12, 34, 14, 9, 6))

import torch  # noqa: E402

DEV, BF16, FP32 = RUN.dev, torch.bfloat16, torch.float32
NORMS, SOFTMAX, ACT = load_packages(["triton-norms", "triton-softmax", "triton-activations"], args.cpu)
SMALL = args.cpu
BASE = load_packages(["triton-softmax"], args.cpu, Path(args.base))[0] if args.base else None


def shape(*big):
    return (3, 100) if SMALL else big


def ce_cases(M, V):
    ce_mod = sys.modules[SOFTMAX.__name__ + ".cross_entropy"]
    x = torch.randn(M, V, device=DEV, dtype=BF16)
    xg = x.clone().requires_grad_(True)
    t = torch.randint(0, V, (M,), device=DEV)
    t_ign = torch.where(torch.rand(M, device=DEV) < 0.1, -100, t)
    both = 2 * M * V * 2  # logits read + gradient written (the fused forward)

    def recompute():
        ce_mod.RECOMPUTE = True
        try:
            (g,) = torch.autograd.grad(SOFTMAX.cross_entropy(xg, t), xg)
        finally:
            ce_mod.RECOMPUTE = False
        return g

    ce = SOFTMAX.cross_entropy
    return [("default (grad)", lambda: ce(xg, t), both),
            ("label_smoothing 0.1", lambda: ce(xg, t, label_smoothing=0.1), both),
            ("z_loss 1e-4", lambda: ce(xg, t, z_loss=1e-4), both),
            ("smoothing + z_loss", lambda: ce(xg, t, label_smoothing=0.1, z_loss=1e-4), both),
            ("reduction none", lambda: ce(xg, t, reduction="none"), both),
            ("reduction sum", lambda: ce(xg, t, reduction="sum"), both),
            ("10% ignored", lambda: ce(xg, t_ign), both),
            ("inference (no grad)", lambda: ce(x, t), M * V * 2),
            ("smoothing, inference", lambda: ce(x, t, label_smoothing=0.1), M * V * 2),
            ("recompute fwd+bwd", recompute, 3 * M * V * 2)]


def softmax_cases(M, N):
    x = torch.randn(M, N, device=DEV, dtype=BF16)
    x32 = x.float()
    xg = x.clone().requires_grad_(True)
    dy = torch.randn_like(x)
    rw = 2 * M * N * 2
    return [("default", lambda: SOFTMAX.softmax(x), rw),
            ("log_softmax", lambda: SOFTMAX.log_softmax(x), rw),
            ("scale 0.125", lambda: SOFTMAX.softmax(x, scale=0.125), rw),
            ("fp32 input", lambda: SOFTMAX.softmax(x32), 2 * M * N * 4),
            ("torch_order", lambda: SOFTMAX.softmax(x, torch_order=True), rw),
            ("dim 0 of x.t()", lambda: SOFTMAX.softmax(x.t(), dim=0), rw),
            ("fwd+bwd", lambda: torch.autograd.grad(SOFTMAX.softmax(xg), xg, dy), 5 * M * N * 2),
            ("log fwd+bwd", lambda: torch.autograd.grad(SOFTMAX.log_softmax(xg), xg, dy), 5 * M * N * 2)]


def attention_softmax_cases(B, S):
    x = torch.randn(B, S, S, device=DEV, dtype=BF16)
    mask = torch.randn(S, S, device=DEV, dtype=BF16)
    rw = 2 * x.numel() * 2
    return [("default", lambda: SOFTMAX.softmax(x), rw),
            ("causal", lambda: SOFTMAX.softmax(x, causal=True), rw),
            ("mask [S, S] broadcast", lambda: SOFTMAX.softmax(x, mask=mask), rw + mask.numel() * 2),
            ("scale + causal", lambda: SOFTMAX.softmax(x, scale=0.125, causal=True), rw)]


def inner_cases(*shp):
    """Softmax over dim 1 with dims after it (``_inner``), and over dim 0 of a transposed (N, I) view."""
    transposed = len(shp) == 2
    x = torch.randn(*shp, device=DEV, dtype=BF16)
    x = x.t() if transposed else x
    dim = 0 if transposed else 1
    xg = x.detach().clone().requires_grad_(True)  # clone keeps the transposed strides
    dy = torch.randn(x.shape, device=DEV, dtype=BF16)
    rw, n = 2 * x.numel() * 2, x.numel()
    cases = [("torch.softmax", lambda: torch.softmax(x, dim), rw),
             ("ours", lambda: SOFTMAX.softmax(x, dim), rw),
             ("torch fwd+bwd", lambda: torch.autograd.grad(torch.softmax(xg, dim), xg, dy), 5 * n * 2),
             ("ours fwd+bwd", lambda: torch.autograd.grad(SOFTMAX.softmax(xg, dim), xg, dy), 5 * n * 2)]
    if BASE is not None:
        cases += [("base", lambda: BASE.softmax(x, dim), rw),
                  ("base fwd+bwd", lambda: torch.autograd.grad(BASE.softmax(xg, dim), xg, dy), 5 * n * 2)]
    return cases


def norm_cases(M, N):
    x = torch.randn(M, N, device=DEV, dtype=BF16)
    x16 = x.half()
    r = torch.randn_like(x)
    w, b = torch.rand(N, device=DEV, dtype=BF16) + 0.5, torch.randn(N, device=DEV, dtype=BF16)
    w32 = w.float()
    rw = 2 * M * N * 2
    scale, shift = torch.randn(1, N, device=DEV, dtype=BF16), torch.randn(1, N, device=DEV, dtype=BF16)
    x3 = x.view(1, M, N)
    return [("rms default", lambda: NORMS.rms_norm(x, w), rw),
            ("rms no weight", lambda: NORMS.rms_norm(x), rw),
            ("rms + bias", lambda: NORMS.rms_norm(x, w, b), rw),
            ("rms weight_offset 1 (Gemma)", lambda: NORMS.rms_norm(x, w, weight_offset=1.0), rw),
            ("rms fp32 weight", lambda: NORMS.rms_norm(x, w32), rw),
            ("rms out fp32", lambda: NORMS.rms_norm(x, w, out_dtype=FP32), M * N * 6),
            ("rms fp16", lambda: NORMS.rms_norm(x16, w), rw),
            ("rms LlamaRMSNorm order", lambda: NORMS.rms_norm(x, w, cast_dtype=BF16, torch_order="mean"), rw),
            ("rms F.rms_norm order", lambda: NORMS.rms_norm(x, w, torch_order="fused"), rw),
            ("rms row view x[:, :N-8]", lambda: NORMS.rms_norm(x[:, : N - 8], w[: N - 8]), rw),
            ("add_rms_norm", lambda: NORMS.add_rms_norm(x, r, w), 2 * rw),
            ("ln default", lambda: NORMS.layer_norm(x, w, b), rw),
            ("ln no bias", lambda: NORMS.layer_norm(x, w), rw),
            ("ln no affine", lambda: NORMS.layer_norm(x), rw),
            ("ln F.layer_norm order", lambda: NORMS.layer_norm(x, w, b, torch_order="fused"), rw),
            ("norm_modulate", lambda: NORMS.norm_modulate(x3, scale, shift), rw),
            ("norm_modulate eager rounding", lambda: NORMS.norm_modulate(x3, scale, shift, eager_rounding=True), rw)]


def act_cases(M, d):
    gu = torch.randn(M, 2 * d, device=DEV, dtype=BF16)
    g, u = torch.randn(M, d, device=DEV, dtype=BF16), torch.randn(M, d, device=DEV, dtype=BF16)
    x = torch.randn(M, d, device=DEV, dtype=BF16)
    gated, plain = 3 * M * d * 2, 2 * M * d * 2
    return [("silu_and_mul", lambda: ACT.silu_and_mul(gu), gated),
            ("gelu_and_mul", lambda: ACT.gelu_and_mul(gu), gated),
            ("gelu_tanh_and_mul", lambda: ACT.gelu_tanh_and_mul(gu), gated),
            ("act_and_mul silu", lambda: ACT.act_and_mul(g, u), gated),
            ("act_and_mul gelu", lambda: ACT.act_and_mul(g, u, activation="gelu"), gated),
            ("act_and_mul gate view", lambda: ACT.act_and_mul(gu[:, :d], gu[:, d:]), gated),
            ("silu", lambda: ACT.silu(x), plain),
            ("gelu", lambda: ACT.gelu(x), plain),
            ("gelu_tanh", lambda: ACT.gelu_tanh(x), plain)]


GROUPS = [("ce", ce_cases, [shape(8192, 128256), shape(8192, 32000), shape(2048, 262144)]),
          ("softmax", softmax_cases, [shape(4096, 32768), shape(32768, 4096), shape(1024, 262144)]),
          ("attn-soft", attention_softmax_cases, [(2, 32) if SMALL else (16, 4096)]),
          ("norms", norm_cases, [shape(32768, 4096), shape(4096, 65536)]),
          ("inner", inner_cases, [(4, 5, 3) if SMALL else s for s in ((8, 128, 65536), (16, 19, 262144), (64, 8, 16384),
                                                                      (4, 1024, 1024), (2, 32768, 1024),
                                                                      (8, 131072, 64))]
           + [(300, 7) if SMALL else (32768, 4096)]),
          ("act", act_cases, [shape(16384, 14336)])]
if args.only:
    GROUPS = [g for g in GROUPS if any(g[0].startswith(p) for p in args.only.split(","))]

if DEV == "cuda":
    RUN.copy_ceiling()
for group, make, shapes in GROUPS:
    for shp in shapes:
        torch.manual_seed(0)
        cases = RUN.safe(f"{group} {shp}", lambda: make(*shp))
        label = "x".join(map(str, shp))
        first = None
        for name, fn, nbytes in cases or []:
            def run():
                fn()
                return RUN.bench(fn, graph=not args.cpu)
            ms = RUN.safe(f"{group} {name} {label}", run, need=8)
            if ms is None:
                continue
            first = ms if first is None else first
            gbps = nbytes / ms / 1e6
            RUN.record(kind="option", group=group, name=name, shape=label, us=ms * 1e3, gbps=gbps,
                       frac=gbps / RUN.copy, vs_default=first / ms)
            RUN.log(f"{group:10s} {name:32s} {label:14s} {ms * 1e3:9.1f} us {gbps:6.0f} GB/s ({gbps / RUN.copy:4.0%})"
                    f"  x{first / ms:.2f} of the default's speed")
        del cases
        if DEV == "cuda":
            torch.cuda.empty_cache()
RUN.log("done")
