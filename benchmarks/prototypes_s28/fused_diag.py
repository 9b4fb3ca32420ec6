"""Session 28 GPU diagnostic: where session 27's fused backward (677d54f) loses time. Variants of its dK/dV kernel
with dq fused in: mode 1 as shipped then (relaxed atomics), 2 plain stores instead of atomics (wrong dq, timing
only), 0 the adds predicated off (dq MMA kept), 3 no dq MMA and no adds (the consumers still meet on the ds tile),
against the shipped Gluon pair and SDPA's backward (all given the same o, lse)."""
import importlib.util, math, sys
sys.path.insert(0, "benchmarks")
import torch
import torch.nn.functional as F
from triton.testing import do_bench
from sweep_common import load_packages

(pkg,) = load_packages(["triton-attention"], False)
flash = sys.modules[pkg.__name__ + ".flash"]
bwd = sys.modules[pkg.__name__ + ".flash_sm90_bwd"]
src = open(".gpu/s28/fused_677.py").read()
ATOMIC = '''                gl.atomic_add(DQ_ACC + (row_base + rows[:, None]) * D + cols[None, :], dq,
                              mask=(rows < Sq)[:, None], sem="relaxed")'''
MMA_START = "                dq_tok = warpgroup_mma(ds_buf.slice(0, BK, dim=0).permute((1, 0)),"
assert ATOMIC in src and MMA_START in src
mods = {}
for mode in (1, 2, 0, 3):
    s = src
    if mode == 2:
        s = s.replace(ATOMIC, '''                gl.store(DQ_ACC + (row_base + rows[:, None]) * D + cols[None, :], dq, mask=(rows < Sq)[:, None])''')
    elif mode == 0:
        s = s.replace(ATOMIC, '''                gl.store(DQ_ACC + (row_base + rows[:, None]) * D + cols[None, :], dq, mask=(rows < 0)[:, None])''')
    elif mode == 3:
        a = s.index(MMA_START)
        b = s.index(ATOMIC) + len(ATOMIC)
        s = s[:a] + "                mbarrier.arrive(ds_empty.index(db), count=1)" + s[b:]
    name = f"{pkg.__name__}.fused_diag{mode}"
    path = f"/tmp/fused_diag{mode}.py"  # @jit functions need a source file
    open(path, "w").write(s)
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    m.FUSED_DQ = True
    m.FUSED_CONFIGS[128] = m.Sm90BwdConfig(64, 2, 232)
    mods[mode] = m
for (B, H, Hk, S, causal) in [(4, 32, 32, 4096, False), (4, 32, 32, 4096, True), (1, 32, 32, 16384, False),
                             (1, 24, 24, 4608, False)]:
    D = 128
    torch.manual_seed(0)
    q, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, Hk, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = 1 / math.sqrt(D)
    o, lse = flash._attn_fwd_launch(q, k, v, None, scale, causal, False, False)
    delta = (do.float() * o.float()).sum(-1)
    fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
    tf = lambda f: fl / do_bench(f, warmup=25, rep=200) / 1e9  # noqa: E731
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    line = f"{B}x{H}x{S} c={int(causal)}:"
    pair = lambda: bwd.backward(q, k, v, do, lse, delta, dq, dk, dv, scale, causal)  # noqa: E731
    pair(); ref = dq.clone()
    line += f" pair {tf(pair):.0f}"
    for mode, m in mods.items():
        f = lambda m=m: m.backward(q, k, v, do, lse, delta, dq, dk, dv, scale, causal)  # noqa: E731
        try:
            f()
            err = ((dq.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            line += f" | mode{mode} {tf(f):.0f} (dq err {err:.1e})"
        except Exception as ex:  # noqa: BLE001
            line += f" | mode{mode} FAILED {repr(ex)[:200]}"
    qs, ks, vs = (t.detach().requires_grad_(True) for t in (q, k, v))
    os_ = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
    line += f" | SDPA {tf(lambda: torch.autograd.grad(os_, (qs, ks, vs), do, retain_graph=True)):.0f}"
    print(line, flush=True)
