"""Session 28 GPU: the dK/dV kernel with dq fused in, the dq partials added by TMA reduce-adds from a shared staging
tile (.gpu/s28/fused_tma.py, from 677d54f) against the shipped Gluon pair and SDPA's backward."""
import importlib.util, math, sys
sys.path.insert(0, "benchmarks")
import torch
import torch.nn.functional as F
from triton.testing import do_bench
from sweep_common import load_packages

(pkg,) = load_packages(["triton-attention"], False)
flash = sys.modules[pkg.__name__ + ".flash"]
bwd = sys.modules[pkg.__name__ + ".flash_sm90_bwd"]
name = pkg.__name__ + ".fused_tma"
spec = importlib.util.spec_from_file_location(name, ".gpu/s28/fused_tma.py")
m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m)
m.FUSED_DQ = True
SETTINGS = [(2, 232), (2, 240), (3, 232)]
SHAPES = [(1, 2, 2, 300, 300, False), (2, 4, 2, 389, 389, True), (1, 4, 1, 1000, 1000, False),
          (1, 2, 1, 130, 700, True), (1, 2, 2, 128, 1, False), (2, 4, 2, 257, 383, False),
          (4, 32, 32, 4096, 4096, False), (4, 32, 32, 4096, 4096, True), (1, 32, 32, 16384, 16384, False),
          (1, 32, 32, 16384, 16384, True), (1, 24, 24, 4608, 4608, False), (2, 32, 8, 4096, 4096, True)]
for (B, H, Hk, Sq, Sk, causal) in SHAPES:
    D = 128
    for dt in ((torch.bfloat16, torch.float16) if Sq < 4096 else (torch.bfloat16,)):
        torch.manual_seed(0)
        q, do = (torch.randn(B, H, Sq, D, device="cuda", dtype=dt) for _ in range(2))
        k, v = (torch.randn(B, Hk, Sk, D, device="cuda", dtype=dt) for _ in range(2))
        scale = 1 / math.sqrt(D)
        o, lse = flash._attn_fwd_launch(q, k, v, None, scale, causal, False, False)
        delta = (do.float() * o.float()).sum(-1)
        out = [torch.full_like(q, float("nan")), torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))]
        pair = lambda: bwd.backward(q, k, v, do, lse, delta, *out, scale, causal)  # noqa: E731
        fused = lambda: m.backward(q, k, v, do, lse, delta, *out, scale, causal)  # noqa: E731
        flash.SM90_BWD = False
        want = [t.float() for t in flash._attn_bwd_launch(do, q, k, v, None, o, lse, scale, causal, False, False, False)[:3]]
        flash.SM90_BWD = True
        line = f"{B}x{H}/{Hk}x{Sq}x{Sk} c={int(causal)} {str(dt)[6:]}:"
        pair(); got_pair = [t.float().clone() for t in out]
        for (stages, regs) in SETTINGS:
            m.FUSED_CONFIGS[128] = m.Sm90BwdConfig(64, stages, regs)
            for t in out:
                t.fill_(float("nan"))
            try:
                fused(); torch.cuda.synchronize()
                errs = [((g.float() - w).abs().max() / w.abs().max().clamp(min=1e-30)).item() for g, w in zip(out, want)]
                perr = [((g - w).abs().max() / w.abs().max().clamp(min=1e-30)).item() for g, w in zip(got_pair, want)]
                ok = max(errs) < 2e-2 and all(torch.isfinite(t).all() for t in out)
                line += f" | s{stages}r{regs} err dq {errs[0]:.1e} dk {errs[1]:.1e} dv {errs[2]:.1e} {'OK' if ok else 'WRONG'}"
                if stages == 2 and regs == 232:
                    line += f" (pair {perr[0]:.1e} {perr[1]:.1e} {perr[2]:.1e})"
            except Exception as ex:  # noqa: BLE001
                line += f" | s{stages}r{regs} FAILED {repr(ex)[:300]}"
                continue
            if Sq >= 4096:
                fl = 2.5 * 4 * B * H * Sq * Sk * D * (0.5 if causal else 1.0)
                line += f" {fl / do_bench(fused, warmup=25, rep=200) / 1e9:.0f}"
        if Sq >= 4096:
            fl = 2.5 * 4 * B * H * Sq * Sk * D * (0.5 if causal else 1.0)
            line += f" | pair {fl / do_bench(pair, warmup=25, rep=200) / 1e9:.0f}"
            qs, ks, vs = (t.detach().requires_grad_(True) for t in (q, k, v))
            os_ = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=H != Hk)
            line += f" | SDPA {fl / do_bench(lambda: torch.autograd.grad(os_, (qs, ks, vs), do, retain_graph=True), warmup=25, rep=200) / 1e9:.0f}"
        print(line, flush=True)
