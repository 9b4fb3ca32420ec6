"""Flash-attention tiles (issue 6: forward and backward >= SDPA's): variants of the kernels' tiles, warps and
stages, pointer and tensor-descriptor (TMA) kernels, timed next to SDPA's cuDNN and default backends.

    python3 benchmarks/attention_tile_sweep.py OUT [--pass bwd|fwd] [--d 128] [--shapes B,H,S[,causal];...]
                                               [--warm I/N] [--budget S] [--only NAME,...] [--force-tma]   (GPU)

``--warm I/N`` compiles (and checks on a small shape) the I-th of N shares of the variants and exits: run N of
them in parallel first so that the timing process finds Triton's disk cache full. Without it: bf16, [B, H, S, D],
by default S = 4096 (B = 4, H = 32) and 16384 (B = 1, H = 32), causal and not; TFLOP/s = 4 B H S^2 D (halved for
causal; the backward 2.5x that) / do_bench's median; every variant's outputs (forward: o; backward: dq, dk, dv)
checked against ``package`` (the package's own choice of kernels and tiles; max |difference| / max |value| < 2e-2:
only the fp32 summation order differs). ``--force-tma``: the TMA variants run where the package would not take
them (e.g. d = 64; the inputs here are contiguous and aligned, as the descriptors need).
Backward variants: the pointer kernels' ``dkdv M N wW sS`` (the dQ kernel as the session-19 default: 64 x 64,
4 warps, 2 stages) or ``dq M N wW sS`` (dK/dV as that default); ``tma M1 N1 M2 N2 W S [W2 S2]`` is the
tensor-descriptor pair (``BwdConfig``'s fields). Forward variants: ``pointer BM BN W S`` and ``tma BM BN W S``
(``FwdConfig``'s fields). Session 20: ``results/attention_bwd_sweep_2026-12-02.txt``.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
from sweep_common import Sweep, load_packages, prepare  # noqa: E402


def bwd_variants(B):
    """name -> (BwdConfig, tma); ``package`` first (None, None: the package's own choice, the reference)."""
    out = {"package": (None, None), "pointer 64 64 64 64 4 2": (B(64, 64, 64, 64, 4, 2), False)}
    for m, n, w, s in [(64, 64, 4, 3), (64, 64, 8, 2), (32, 64, 4, 3), (32, 128, 4, 2), (32, 128, 4, 3),
                       (64, 128, 8, 2), (64, 128, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3)]:
        out[f"dkdv {m} {n} w{w} s{s}"] = (B(m, n, 64, 64, w, s, 4, 2), False)
    for m, n, w, s in [(64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3),
                       (64, 128, 8, 2), (128, 128, 8, 2)]:
        out[f"dq {m} {n} w{w} s{s}"] = (B(64, 64, m, n, 4, 2, w, s), False)
    for cfg in [(64, 64, 64, 64, 4, 2, 4, 2), (64, 128, 128, 64, 8, 2, 8, 2), (64, 128, 128, 64, 8, 3, 8, 3),
                (64, 64, 64, 64, 4, 3, 4, 3), (64, 128, 64, 64, 8, 2, 4, 2)]:
        out["tma " + " ".join(map(str, cfg))] = (B(*cfg), True)
    # round 2 (session 20): the dK/dV and dQ kernels' TMA tiles apart
    for cfg in [(64, 64, 128, 64, 4, 2, 8, 3), (64, 64, 128, 128, 4, 2, 8, 2), (64, 128, 64, 64, 8, 3, 4, 2),
                (32, 64, 64, 64, 4, 2, 4, 2), (64, 64, 64, 32, 4, 2, 4, 2), (32, 64, 64, 64, 4, 3, 4, 2),
                (64, 64, 128, 64, 4, 2, 8, 2), (64, 128, 128, 64, 8, 3, 8, 2)]:
        out["tma " + " ".join(map(str, cfg))] = (B(*cfg), True)
    return out


def fwd_variants(F_):
    """name -> (FwdConfig, tma); ``package`` first."""
    out = {"package": (None, None)}
    for cfg in [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2), (128, 64, 4, 3), (64, 128, 4, 3)]:
        out["pointer " + " ".join(map(str, cfg))] = (F_(*cfg), False)
    for cfg in [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 4, 3), (128, 128, 8, 2)]:
        out["tma " + " ".join(map(str, cfg))] = (F_(*cfg), True)
    return out


def parse_shapes(text):
    """``B,H,S[,c];...`` -> [(B, H, S, causal)]; ``c`` marks a causal shape."""
    out = []
    for item in text.split(";"):
        parts = item.split(",")
        out.append((int(parts[0]), int(parts[1]), int(parts[2]), len(parts) > 3 and parts[3] == "c"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pass", dest="which", choices=("bwd", "fwd"), default="bwd")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--shapes", default="4,32,4096;4,32,4096,c;1,32,16384;1,32,16384,c")
    ap.add_argument("--warm", default=None)
    ap.add_argument("--budget", type=float, default=400)
    ap.add_argument("--only", default=None, help="comma-separated variant names (plus package)")
    ap.add_argument("--force-tma", action="store_true")
    args = ap.parse_args()
    out = prepare(args.out, cpu=False)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    (pkg,) = load_packages(["triton-attention"], cpu=False)
    flash = sys.modules[pkg.__name__ + ".flash"]
    bwd = args.which == "bwd"
    vs = bwd_variants(pkg.BwdConfig) if bwd else fwd_variants(pkg.FwdConfig)
    if args.only:
        keep = {"package", *args.only.split(",")}
        vs = {k: v for k, v in vs.items() if k in keep}
    names = list(vs)
    D = args.d

    def inputs(B, H, S, causal):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        scale = D ** -0.5
        o, lse = flash._attn_fwd_launch(q, k, v, None, scale, causal, False, False)
        do = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
        return q, k, v, o, lse, do, scale, causal

    def forced(fn, tma):
        def run():
            flash.FORCE_TMA = bool(tma and args.force_tma)
            try:
                return fn()
            finally:
                flash.FORCE_TMA = False
        return run

    def backward(name, a):
        cfg, tma = vs[name]
        q, k, v, o, lse, do, scale, causal = a
        return forced(lambda: flash._attn_bwd_launch(do, q, k, v, None, o, lse, scale, causal, False, False, False,
                                                     cfg=cfg, tma_bwd=tma)[:3], tma)

    def forward(name, a):
        cfg, tma = vs[name]
        q, k, v, o, lse, do, scale, causal = a
        if not tma:
            return lambda: flash._attn_fwd_launch(q, k, v, None, scale, causal, False, False, cfg=cfg)[:1]
        o2, lse2 = torch.empty_like(o), torch.empty_like(lse)
        zeros = (0, 0, 0, 0)
        launch, fwd_args = flash._fwd_tma_plan(q, k, v, o2, scale, causal, cfg, False, zeros, zeros, 0)
        return lambda: (launch(fwd_args(q, k, v, o2, lse2, None, None)), o2)[1:]

    run_of = backward if bwd else forward

    def err(got, ref):
        return max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in zip(got, ref))

    if args.warm:
        i, n = map(int, args.warm.split("/"))
        for causal in sorted({c for *_, c in parse_shapes(args.shapes)}):
            a = inputs(1, 2, 512, causal)
            ref = run_of("package", a)()
            for name in names[i::n]:
                try:
                    e = err(run_of(name, a)(), ref)
                    print(f"warm {name} causal={causal} err {e:.2e}", flush=True)
                except Exception as ex:  # noqa: BLE001
                    print(f"warm {name} causal={causal} ERR {type(ex).__name__}: {str(ex)[:200]}", flush=True)
        return

    sw = Sweep(out / "records.jsonl", args.budget, False, rep=100, widths=(26, 34, 18, 9, 7))
    sw.log(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__, args.which, f"d={D}")
    for B, H, S, causal in parse_shapes(args.shapes):
        a = inputs(B, H, S, causal)
        flops = (2.5 if bwd else 1.0) * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        shape = f"B{B} H{H} S{S}{' causal' if causal else ''}"
        ref = run_of("package", a)()
        for name in names:
            def run(name=name):
                fn = run_of(name, a)
                e = err(fn(), ref)
                ms = sw.bench(fn)
                tf = flops / ms / 1e9
                sw.log(f"{shape:26s} {name:34s} {ms * 1e3:9.1f} us {tf:6.1f} TFLOP/s err {e:.1e}")
                sw.record(kind=f"attn_{args.which}", d=D, shape=shape, name=name, us=ms * 1e3, tflops=tf, err=e,
                          ok=e < 2e-2)
            sw.safe(f"{shape} {name}", run)
        q, k, v, o, lse, do, scale, _ = a
        for backend, label in ((SDPBackend.CUDNN_ATTENTION, "sdpa cudnn"), (None, "sdpa default")):
            def peer(backend=backend, label=label):
                qq, kk, vv = (t.detach().requires_grad_(bwd) for t in (q, k, v))

                def attend():
                    if backend is None:
                        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                if bwd:
                    y = attend()
                    fn = lambda: torch.autograd.grad(y, (qq, kk, vv), do, retain_graph=True)  # noqa: E731
                else:
                    fn = lambda: (attend(),)  # noqa: E731
                e = err(fn(), ref)
                ms = sw.bench(fn)
                tf = flops / ms / 1e9
                sw.log(f"{shape:26s} {label:34s} {ms * 1e3:9.1f} us {tf:6.1f} TFLOP/s err {e:.1e}")
                sw.record(kind=f"attn_{args.which}", d=D, shape=shape, name=label, us=ms * 1e3, tflops=tf, err=e,
                          peer=True)
            sw.safe(f"{shape} {label}", peer)
        del a, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
