"""Session 11 sweep behind ``triton_activations._fast_math`` (H200 results: results/activations_fast_math_sweep_2026-12-01.txt).

    python benchmarks/activations_fast_math_sweep.py OUT_DIR      (GPU; TRITON_INTERPRET=1 cannot run inline PTX)

Standalone gated forward kernels (silu_and_mul ACT=0, gelu_tanh_and_mul ACT=1; eager rounding, bf16) with
MATH = 0 exact (libdevice + IEEE division), 1 ex2.approx.ftz + rcp.approx.ftz, 2 as 1 with an inline-PTX branch
to the exact formula near bf16 rounding midpoints, 3 no activation (g * u), 5 the shipped fast forms (non-flushing
reciprocal for SILU; libdevice tanhf's large-argument branch for GELU_TANH), 6 / 7 reciprocal plus a Newton step;
on 2-D (rows x column blocks) and 1-D (row-major) grids and several tiles. First counts, for every 16-bit input,
where each form's bf16 result differs from MATH 0 (bf16 and fp16), then times each variant on 16384 x 2*14336 bf16
(CUDA-graph replays, three rounds).
"""
import os, sys, json, time, statistics
import torch, triton, triton.language as tl
from triton.language.extra import libdevice

# exact silu fallback: libdevice expf (sequence from its PTX, contraction off) + IEEE division
SILU_FALLBACK = tl.constexpr("""
{
.reg .pred p;
.reg .b32 t<12>;
setp.eq.s32 p, $3, 0;
mov.b32 $0, $2;
@p bra DONE;
neg.f32 t0, $1;
fma.rn.ftz.f32 t1, t0, 0f3BBB989D, 0f3F000000;
cvt.ftz.sat.f32.f32 t2, t1;
fma.rm.ftz.f32 t3, t2, 0f437C0000, 0f4B400001;
add.f32 t4, t3, 0fCB40007F;
neg.f32 t5, t4;
fma.rn.ftz.f32 t6, t0, 0f3FB8AA3B, t5;
fma.rn.ftz.f32 t7, t0, 0f32A57060, t6;
shl.b32 t8, t3, 23;
ex2.approx.ftz.f32 t9, t7;
mul.f32 t10, t9, t8;
add.f32 t11, t10, 0f3F800000;
div.rn.f32 $0, $1, t11;
DONE:
}
""")


@triton.jit
def _rcp(d):
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _rcp_nf(d):
    return tl.inline_asm_elementwise("rcp.approx.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _ex2(t):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [t], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _near(y, x, OUT: tl.constexpr, MARGIN: tl.constexpr):
    b = y.to(tl.int32, bitcast=True)
    if OUT == tl.bfloat16:
        lo = b & 0xFFFF
        d = lo - 0x8000
        bad = (d <= MARGIN) & (d >= -MARGIN)
        bad = bad | (tl.abs(y) < 1e-30)
    else:
        lo = b & 0x1FFF
        d = lo - 0x1000
        bad = (d <= MARGIN) & (d >= -MARGIN)
        bad = bad | (tl.abs(y) < 1.2207031e-4) | (tl.abs(y) > 60000.0)
    bad = bad | (tl.abs(x) > 16.0) | (x != x)
    return bad


@triton.jit
def act(g, ACT: tl.constexpr, MATH: tl.constexpr, OUT: tl.constexpr, MARGIN: tl.constexpr):
    if MATH == 3:
        return g
    if ACT == 0:
        if MATH == 0:
            y = tl.math.div_rn(g, 1.0 + libdevice.exp(-g))
        elif MATH == 5:  # approx exp, non-ftz reciprocal
            y = g * _rcp_nf(1.0 + _ex2(g * -1.4426950408889634))
        elif MATH == 6:  # exact expf, reciprocal + one Newton correction of the quotient
            d = 1.0 + libdevice.exp(-g)
            r = _rcp_nf(d)
            q = g * r
            y = q + r * (g - q * d)
        elif MATH == 7:  # approx exp, reciprocal + correction
            d = 1.0 + _ex2(g * -1.4426950408889634)
            r = _rcp_nf(d)
            q = g * r
            y = q + r * (g - q * d)
        else:
            y = g * _rcp(1.0 + _ex2(g * -1.4426950408889634))
            if MATH == 2:
                need = _near(y, g, OUT, MARGIN).to(tl.int32)
                y = tl.inline_asm_elementwise(SILU_FALLBACK, "=r,r,r,r", [g, y, need], dtype=tl.float32,
                                              is_pure=True, pack=1)
    else:
        u = 0.7978845608028654 * (g + 0.044715 * (g * g * g))
        if MATH == 0:
            y = 0.5 * g * (1.0 + libdevice.tanh(u))
        elif MATH == 5:
            # libdevice tanhf's |u| >= 0.6 branch for every u (its polynomial branch and select dropped)
            r = _rcp(_ex2(tl.abs(u) * 2.8853900817779268) + 1.0)
            t = 1.0 - 2.0 * r
            t = tl.where(u < 0, -t, t)
            y = 0.5 * g * (1.0 + t)
        else:
            y = g * _rcp(1.0 + _ex2(u * -2.8853900817779268))
    return y


@triton.jit
def kern(x_ptr, y_ptr, M, N, NB, ACT: tl.constexpr, MATH: tl.constexpr, MARGIN: tl.constexpr, GRID1D: tl.constexpr,
         U_FIRST: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    if GRID1D:
        pid = tl.program_id(0)
        rb = pid // NB
        cb = pid % NB
    else:
        rb = tl.program_id(0)
        cb = tl.program_id(1)
    rows = rb.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    off = rows[:, None] * (2 * N) + cols[None, :]
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    g = tl.load(x_ptr + off, mask=mask, other=0.0).to(tl.float32)
    if U_FIRST:
        u = tl.load(x_ptr + off + N, mask=mask, other=0.0).to(tl.float32)
    a = act(g, ACT, MATH, OUT, MARGIN)
    if not U_FIRST:
        u = tl.load(x_ptr + off + N, mask=mask, other=0.0).to(tl.float32)
    y = a.to(OUT).to(tl.float32) * u
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], y.to(OUT), mask=mask)


def run(x, y, act_id, math, rows, block, warps, grid1d, u_first, margin=64):
    M, N2 = x.shape
    N = N2 // 2
    nb = triton.cdiv(N, block)
    rbs = triton.cdiv(M, rows)
    grid = (rbs * nb,) if grid1d else (rbs, nb)
    kern[grid](x, y, M, N, nb, ACT=act_id, MATH=math, MARGIN=margin, GRID1D=grid1d, U_FIRST=u_first, ROWS=rows,
               BLOCK_N=block, num_warps=warps, enable_fp_fusion=False)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cpu = os.environ.get("TRITON_INTERPRET") == "1"
    dev = "cpu" if cpu else "cuda"
    log = open(os.path.join(out, "fm.log"), "a")

    def P(*a):
        s = " ".join(str(v) for v in a)
        print(s, flush=True)
        log.write(s + "\n")

    # 1. exhaustive rounding check: every 16-bit g (u = 1), approx (1) / approx+fallback (2) vs exact (0)
    for dt in (torch.bfloat16, torch.float16):
        bits = torch.arange(-32768, 32768, dtype=torch.int32, device=dev).to(torch.int16)
        g = bits.view(dt).reshape(256, 256)
        x = torch.cat([g, torch.ones_like(g)], dim=1).contiguous()
        for act_id in (0, 1):
            ys = {}
            for math in ((0, 1, 5, 6, 7) if act_id == 0 else (0, 1, 5)):
                yy = torch.full((256, 256), float("nan"), dtype=dt, device=dev)
                run(x, yy, act_id, math, 1, 256, 4, False, False)
                ys[math] = yy.view(torch.int16)
            ref = ys[0]
            nanref = torch.isnan(ref.view(dt))
            for math, v in ys.items():
                if math == 0:
                    continue
                bad = (v != ref) & ~nanref
                idx = bad.flatten().nonzero().flatten()[:8]
                P(f"exhaustive {dt} act={act_id} math={math}: {int(bad.sum())} mismatches of 65536; e.g. g="
                  f"{g.flatten()[idx].float().tolist()}")
    if cpu:
        return
    # 2. timing (CUDA graph) at 16384 x 2*14336 bf16
    sys.path.insert(0, "src")
    from triton_collection.bench import graph_median
    M, N = 16384, 14336
    x = torch.randn(M, 2 * N, device=dev, dtype=torch.bfloat16)
    y = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    a0 = torch.empty(2 ** 28 // 2, device=dev)
    b0 = torch.empty_like(a0)
    cp = 2 * a0.numel() * 4 / graph_median(lambda: b0.copy_(a0), rep=50) / 1e6
    P(f"copy {cp:.0f} GB/s")
    del a0, b0
    nb = 3 * M * N * 2
    tiles = [(1, 1024, 4), (1, 512, 2), (1, 2048, 8)]
    res = {}
    for rnd in range(3):
        for act_id in (0, 1):
            for math in ((0, 1, 5, 6, 7, 3) if act_id == 0 else (0, 1, 5, 3)):
                for grid1d in (False, True):
                    for (r, b, w) in tiles:
                        for uf in ((False, True) if act_id == 1 and math in (0, 5) else (act_id == 1,)):
                            key = (act_id, math, grid1d, r, b, w, uf)
                            f = lambda: run(x, y, act_id, math, r, b, w, grid1d, uf)
                            f()
                            ms = graph_median(f, rep=30)
                            res.setdefault(key, []).append(nb / ms / 1e6)
        P(f"round {rnd} done")
    for key, v in sorted(res.items(), key=lambda kv: (kv[0][0], -max(kv[1]))):
        P(f"act={key[0]} math={key[1]} grid1d={int(key[2])} tile={key[3]}x{key[4]} w{key[5]} ufirst={int(key[6])}: "
          f"{max(v):6.0f} GB/s ({max(v) / cp:.1%})  {[round(t) for t in v]}")
    json.dump({str(k): v for k, v in res.items()}, open(os.path.join(out, "fm.json"), "w"))


if __name__ == "__main__":
    main()
