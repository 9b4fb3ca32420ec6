"""Session 28 GPU, round 2: the TMA-reduce fused backward's staging (.gpu/s28/fused_tma.py, DQ_MODE): 0 one
staging tile per consumer, 1 two (double-buffered), 2 the staging store without the add (timing only), 3 a TMA
store instead of the add (timing only); against the shipped Gluon pair and SDPA."""
import importlib.util, math, sys
sys.path.insert(0, "benchmarks")
import torch
import torch.nn.functional as F
from triton.testing import do_bench
from sweep_common import load_packages

(pkg,) = load_packages(["triton-attention"], False)
flash = sys.modules[pkg.__name__ + ".flash"]
bwd = sys.modules[pkg.__name__ + ".flash_sm90_bwd"]
src = open(".gpu/s28/fused_tma.py").read()
mods = {}
for mode, regs in ((5, 232),):
    name = f"{pkg.__name__}.fused_tma{mode}_{regs}"
    path = f"/tmp/fused_tma{mode}_{regs}.py"
    open(path, "w").write(src.replace("DQ_MODE = gl.constexpr(0)", f"DQ_MODE = gl.constexpr({mode})"))
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m)
    m.FUSED_DQ = True
    m.FUSED_CONFIGS[128] = m.Sm90BwdConfig(64, 2, regs)
    mods[f"{mode}r{regs}"] = m
for (B, H, Hk, Sq, Sk, causal) in [(2, 4, 2, 389, 389, True), (2, 4, 2, 257, 383, False), (1, 2, 1, 130, 700, True),
                                   (4, 32, 32, 4096, 4096, False), (1, 32, 32, 16384, 16384, False),
                                   (2, 32, 8, 4096, 4096, True)]:
    D, dt = 128, torch.bfloat16
    torch.manual_seed(0)
    q, do = (torch.randn(B, H, Sq, D, device="cuda", dtype=dt) for _ in range(2))
    k, v = (torch.randn(B, Hk, Sk, D, device="cuda", dtype=dt) for _ in range(2))
    scale = 1 / math.sqrt(D)
    o, lse = flash._attn_fwd_launch(q, k, v, None, scale, causal, False, False)
    delta = (do.float() * o.float()).sum(-1)
    out = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
    pair = lambda: bwd.backward(q, k, v, do, lse, delta, *out, scale, causal)  # noqa: E731
    pair(); want = [t.float().clone() for t in out]
    fl = 2.5 * 4 * B * H * Sq * Sk * D * (0.5 if causal else 1.0)
    line = f"{B}x{H}/{Hk}x{Sq}x{Sk} c={int(causal)}:"
    for mode, m in mods.items():
        f = lambda m=m: m.backward(q, k, v, do, lse, delta, *out, scale, causal)  # noqa: E731
        try:
            f(); torch.cuda.synchronize()
            err = max(((g.float() - w).abs().max() / w.abs().max()).item() for g, w in zip(out, want))
            line += f" | mode{mode} err {err:.1e}"
            if Sq >= 4096:
                line += f" {fl / do_bench(f, warmup=25, rep=100) / 1e9:.0f}"
        except Exception as ex:  # noqa: BLE001
            line += f" | mode{mode} FAILED {repr(ex)[:300]}"
    if Sq >= 4096:
        line += f" | pair {fl / do_bench(pair, warmup=25, rep=100) / 1e9:.0f}"
        qs, ks, vs = (t.detach().requires_grad_(True) for t in (q, k, v))
        os_ = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=H != Hk)
        line += f" | SDPA {fl / do_bench(lambda: torch.autograd.grad(os_, (qs, ks, vs), do, retain_graph=True), warmup=25, rep=100) / 1e9:.0f}"
    print(line, flush=True)
