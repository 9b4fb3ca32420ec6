"""A/B of a kernel change in one process: the packages built from a base checkout against this checkout.

python3 benchmarks/ab_sweep.py --base DIR --out DIR [--rounds 3] [--cases NAME,...] [--shapes MxN,...] [--cpu]

``--base`` is a checkout of the base revision (e.g. ``git worktree add /tmp/base HEAD`` or
``git archive HEAD | tar -x -C /tmp/base``). Both builds load side by side (different module names). For each
case: the outputs of both are compared bitwise (a speed change must not change a bit), then each side is timed
once per round from a CUDA-graph replay (the kernels' time, no host Python), rounds interleaved; the medians
and the new/base ratio are reported. Bytes as the harness counts them (``bench_ops``: each tensor a perfect
kernel must move, once). Records: DIR/ab.jsonl; the table: stdout.
"""

import argparse
import inspect
import statistics
import sys
from pathlib import Path

from sweep_common import Sweep, load_packages, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--base", required=True, help="checkout of the base revision")
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--budget", type=float, default=400)
ap.add_argument("--cases", default="", help="comma list of case names (default: all)")
ap.add_argument("--shapes", default="", help="comma list of MxN shapes to keep (default: each case's own)")
ap.add_argument("--cpu", action="store_true", help="dry run under the interpreter with tiny shapes")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "ab.jsonl", args.budget, args.cpu, rep=25, widths=(22, 12, 16, 9, 6))

import torch  # noqa: E402

DEV = RUN.dev
BF16 = torch.bfloat16


def rms(**kw):
    def make(pk, M, N):  # kw: e.g. the bit-exact layers' torch_order (LlamaRMSNorm: "mean" with the bf16 cast)
        x, w = torch.randn(M, N, device=DEV, dtype=BF16), torch.rand(N, device=DEV, dtype=BF16) + 0.5
        return (lambda: pk.rms_norm(x, w, eps=1e-6, **kw)), 2 * M * N * 2 + N * 2
    return make


def ln(**kw):
    def make(pk, M, N):
        x, w = torch.randn(M, N, device=DEV, dtype=BF16), torch.rand(N, device=DEV, dtype=BF16) + 0.5
        b = torch.randn(N, device=DEV, dtype=BF16)
        return (lambda: pk.layer_norm(x, w, b, **kw)), 2 * M * N * 2 + 2 * N * 2
    return make


def norm_bwd(kind):
    def make(pk, M, N):  # the backward op alone: dy, x read, dx written (+ dw / db partials, not counted)
        mod, order = sys.modules[f"{pk.__name__}.{kind}"], sys.modules[pk.__name__ + "._torch_order"].ORDER_FAST
        x, w = torch.randn(M, N, device=DEV, dtype=BF16), torch.rand(N, device=DEV, dtype=BF16) + 0.5
        dy = torch.randn(M, N, device=DEV, dtype=BF16)
        if kind == "rms_norm":
            rstd = mod._rms_norm_fwd_impl(x, None, w, None, 1e-6, 0.0, None, BF16, order)[2]
            return (lambda: mod._rms_norm_bwd_impl(dy, None, x, w, rstd, 0.0, None, BF16, None, True, None)), \
                3 * M * N * 2
        b = torch.zeros(N, device=DEV, dtype=BF16)
        _, _, mean, rstd = mod._layer_norm_fwd_impl(x, None, w, b, 1e-5, order)
        # db in b's dtype (since session 34; before, a flag for an fp32 db)
        db = BF16 if "db_dtype" in inspect.signature(mod._layer_norm_bwd_impl).parameters else True
        return (lambda: mod._layer_norm_bwd_impl(dy, None, x, w, mean, rstd, BF16, None, True, db)), 3 * M * N * 2
    return make


def add_rms(pk, M, N):
    x, r = torch.randn(M, N, device=DEV, dtype=BF16), torch.randn(M, N, device=DEV, dtype=BF16)
    w = torch.rand(N, device=DEV, dtype=BF16) + 0.5
    return (lambda: pk.add_rms_norm(x, r, w, eps=1e-6)), 4 * M * N * 2 + N * 2


def softmax(dtype):
    def make(pk, M, N):
        x = torch.randn(M, N, device=DEV, dtype=dtype) * 3
        return (lambda: pk.softmax(x)), 2 * M * N * x.element_size()
    return make


def softmax_bwd(pk, M, N):
    impl = sys.modules[pk.__name__ + ".softmax"]._softmax_bwd_impl
    y, dy = pk.softmax(torch.randn(M, N, device=DEV, dtype=BF16) * 3), torch.randn(M, N, device=DEV, dtype=BF16)
    return (lambda: impl(dy, y, 1, 1.0, False, False, BF16)), 3 * M * N * 2  # y, dy read, dx written


def cross_entropy(**kw):
    def make(pk, M, V):  # kw: e.g. label_smoothing
        x = torch.randn(M, V, device=DEV, dtype=BF16).requires_grad_(True)
        t = torch.randint(0, V, (M,), device=DEV)
        return (lambda: pk.cross_entropy(x, t, **kw)), 2 * M * V * 2  # the forward writes the gradient (x read, g written)
    return make


def gated(name):
    def make(pk, M, d):
        x = torch.randn(M, 2 * d, device=DEV, dtype=BF16)
        return (lambda: getattr(pk, name)(x)), 3 * M * d * 2
    return make


def act(name):
    def make(pk, M, d):
        x = torch.randn(M, d, device=DEV, dtype=BF16)
        return (lambda: getattr(pk, name)(x)), 2 * M * d * 2
    return make



def attention(grad=False, **kw):
    def make(pk, S, D):  # 4 x 16 heads, bf16, [B, H, S, D]; bytes: q, k, v read and o written (grad: and dq, dk, dv)
        q, k, v = (torch.randn(4, 16, S, D, device=DEV, dtype=BF16, requires_grad=grad) for _ in range(3))
        mask = torch.randn(S, S, device=DEV, dtype=BF16) if kw.get("mask") else None
        causal = kw.get("causal", False)
        if not grad:
            return (lambda: pk.flash_attention(q, k, v, attn_mask=mask, causal=causal)), 4 * q.numel() * 2
        do = torch.randn_like(q)
        return (lambda: torch.autograd.grad(pk.flash_attention(q, k, v, attn_mask=mask, causal=causal), (q, k, v),
                                            do)), 8 * q.numel() * 2
    return make


def rotary(pk, S, D):  # transformers' apply_rotary_pos_emb on Llama-8B-shaped q and k ([1, H, S, D], cos [1, S, D])
    q, k = torch.randn(1, 32, S, D, device=DEV, dtype=BF16), torch.randn(1, 8, S, D, device=DEV, dtype=BF16)
    cos, sin = torch.randn(1, S, D, device=DEV, dtype=BF16), torch.randn(1, S, D, device=DEV, dtype=BF16)
    return (lambda: pk.apply_rotary_pos_emb(q, k, cos, sin)), 2 * (q.numel() + k.numel()) * 2 + 2 * cos.numel() * 2


def matmul(transposed_a):
    def make(pk, M, N):  # K = 4096 bf16; a read transposed (the pointer kernel) or a small-M row block (GEMV)
        a = torch.randn(4096, M, device=DEV, dtype=BF16).t() if transposed_a else \
            torch.randn(M, 4096, device=DEV, dtype=BF16)
        b = torch.randn(N, 4096, device=DEV, dtype=BF16).t()
        return (lambda: pk.matmul(a, b)), (M * 4096 + 4096 * N + M * N) * 2
    return make


BIG = DEV == "cuda"
CASES = {  # name: (package, builder, shapes)
    "rms_norm": ("triton-norms", rms(), [(65536, 2048), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 65536),
                                       (1024, 262144)]),
    "layer_norm": ("triton-norms", ln(), [(65536, 2048), (32768, 4096), (16384, 8192), (8192, 16384), (4096, 65536),
                                       (2048, 131072), (1024, 262144)]),
    "rms_norm_exact_mean": ("triton-norms", rms(cast_dtype=BF16, torch_order="mean"),
                            [(32768, 4096), (16384, 8192), (8192, 16384)]),
    "rms_norm_exact_fused": ("triton-norms", rms(torch_order="fused"), [(32768, 4096), (16384, 8192), (8192, 16384)]),
    "layer_norm_exact": ("triton-norms", ln(torch_order="fused"), [(32768, 4096), (16384, 8192), (8192, 16384)]),
    "rms_norm_bwd": ("triton-norms", norm_bwd("rms_norm"), [(32768, 4096), (16384, 8192), (8192, 12288),
                                                             (8192, 16384), (4096, 65536)]),
    "layer_norm_bwd": ("triton-norms", norm_bwd("layer_norm"), [(32768, 4096), (16384, 8192), (8192, 12288),
                                                                 (8192, 16384), (4096, 65536), (2048, 131072),
                                                                 (1024, 262144)]),
    "add_rms_norm": ("triton-norms", add_rms, [(32768, 4096), (16384, 8192), (4096, 65536)]),
    "softmax": ("triton-softmax", softmax(BF16), [(32768, 4096), (16384, 16384), (4096, 32768), (4096, 65536),
                                            (2048, 131072), (1024, 262144), (256, 262144)]),
    "softmax_fp32": ("triton-softmax", softmax(torch.float32), [(16384, 8192), (8192, 12007), (4096, 16384),
                                                                (8192, 20011), (4096, 24000), (2048, 32768)]),
    "softmax_bwd": ("triton-softmax", softmax_bwd, [(4096, 65536), (2048, 131072), (1024, 262144)]),
    "cross_entropy": ("triton-softmax", cross_entropy(), [(8192, 128256), (2048, 262144)]),
    "cross_entropy_smooth": ("triton-softmax", cross_entropy(label_smoothing=0.1), [(8192, 128256), (8192, 32000)]),
    "silu_and_mul": ("triton-activations", gated("silu_and_mul"), [(16384, 14336), (65536, 1536), (8192, 11008)]),
    "gelu_tanh_and_mul": ("triton-activations", gated("gelu_tanh_and_mul"), [(16384, 14336), (65536, 1536)]),
    "gelu_and_mul": ("triton-activations", gated("gelu_and_mul"), [(16384, 14336), (5, 96)]),
    "silu": ("triton-activations", act("silu"), [(16384, 14336)]),
    "gelu": ("triton-activations", act("gelu"), [(16384, 14336), (256, 4096), (5, 96)]),
    "attention_fwd": ("triton-attention", attention(), [(2048, 48), (2048, 64)]),
    "attention_fwd_mask": ("triton-attention", attention(mask=True), [(2048, 128)]),
    "attention_fwd_bwd_causal": ("triton-attention", attention(grad=True, causal=True), [(2048, 64), (2048, 96)]),
    "rotary": ("triton-attention", rotary, [(4096, 128)]),
    "matmul_transposed_a": ("triton-matmul", matmul(True), [(4096, 4096)]),
    "matmul_gemv": ("triton-matmul", matmul(False), [(4, 14336)]),
}
if not BIG:
    SMALL = {"triton-activations": (5, 640), "triton-attention": (17, 16), "triton-matmul": (5, 64)}
    CASES = {k: (p, b, [SMALL.get(p, (5, 4096))]) for k, (p, b, _) in CASES.items()}
if args.cases:
    CASES = {k: CASES[k] for k in args.cases.split(",")}
if args.shapes:
    KEEP = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")}
    unknown = KEEP - {s for _, _, shapes in CASES.values() for s in shapes}
    if BIG and unknown:
        sys.exit(f"--shapes: no case has {sorted(unknown)}")
    CASES = {k: (p, b, [s for s in shapes if s in KEEP or not BIG]) for k, (p, b, shapes) in CASES.items()}
    CASES = {k: v for k, v in CASES.items() if v[2]}
PKGS = sorted({pkg for pkg, _, _ in CASES.values()})
NEW = dict(zip(PKGS, load_packages(PKGS, args.cpu)))
BASE = dict(zip(PKGS, load_packages(PKGS, args.cpu, Path(args.base))))
for p in PKGS:  # identical sources build to the same module: both sides would time one build
    if NEW[p].__name__ == BASE[p].__name__:
        RUN.log(f"note: {p} is the same in both checkouts")


if DEV == "cuda":
    RUN.copy_ceiling()
for name, (pkg, build, shapes) in CASES.items():
    for shape in shapes:
        if RUN.left() < 10:
            break
        torch.manual_seed(0)
        f_new, nbytes = build(NEW[pkg], *shape)
        torch.manual_seed(0)
        f_base, _ = build(BASE[pkg], *shape)
        differ = [i for i, (a, b) in enumerate(zip(*(o if isinstance(o, tuple) else (o,) for o in (f_new(), f_base()))))
                  if not torch.equal(a, b)]
        same = not differ
        times = {"base": [], "new": []}
        for r in range(args.rounds):
            for side, fn in (("base", f_base), ("new", f_new)) if r % 2 == 0 else (("new", f_new), ("base", f_base)):
                times[side].append(RUN.bench(fn, graph=True))
        med = {k: statistics.median(v) for k, v in times.items()}
        gb = {k: nbytes / v / 1e6 for k, v in med.items()}
        label = "x".join(map(str, shape))
        RUN.record(kind="ab", case=name, shape=label, bitwise_equal=same, us_base=med["base"] * 1e3,
                   us_new=med["new"] * 1e3, gbps_base=gb["base"], gbps_new=gb["new"], ratio=med["base"] / med["new"],
                   samples={k: [t * 1e3 for t in v] for k, v in times.items()})
        RUN.log(f"{name:20s} {label:14s} base {med['base'] * 1e3:8.1f} us {gb['base']:6.0f} GB/s  new "
                f"{med['new'] * 1e3:8.1f} us {gb['new']:6.0f} GB/s  new/base speed {med['base'] / med['new']:.3f}"
                f"{'' if same else f'  OUTPUTS DIFFER (outputs {differ})'}")
RUN.log("done")
