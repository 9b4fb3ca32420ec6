"""The bit-exact forwards sum in PyTorch's CUDA order: kernels vs the numpy model, bit for bit.

``cuda_order_ref`` models ATen's CUDA reductions thread by thread; on an H200
(torch 2.11) it equals ``x.float().pow(2).mean(-1)`` bit for bit, and so do the
kernels (benchmarks/gpu_check.py, ``check_torch_orders``). Here, under the
interpreter, the kernels must equal the model exactly: any change of summation
order fails. (rsqrt is ``1 / sqrt`` in the interpreter, in the model too.)
"""

import numpy as np
import pytest
import torch

from . import cuda_order_ref as ref

f32 = np.float32


def _rstd(var, eps, device):
    """rsqrt(var + eps) as the kernel computes it: 1 / sqrt in the interpreter, the GPU's rsqrt on CUDA."""
    var = np.asarray(var, f32)
    if device != "cpu":
        return torch.rsqrt(torch.from_numpy(var).to(device) + eps).cpu().numpy()
    return (f32(1) / np.sqrt((var + f32(eps)).astype(f32))).astype(f32)


@pytest.mark.parametrize("M, N", [(1, 64), (3, 100), (2, 128), (7, 576), (5, 5121), (2, 2050), (3, 8192), (2, 65537)])
def test_mean_order_matches_model(norms, device, M, N):
    torch.manual_seed(M * N)
    x = torch.randn(M, N, device=device) * 3
    _, _, rstd = norms._ops.ops.rms_norm_fwd(x, None, None, None, 1e-6, 0.0, None, torch.float32, 1)
    cfg = norms._torch_order.mean_config(M, N, *norms._torch_order.device_limits(x.device))
    want = _rstd(ref.mean_sq(x.cpu().numpy(), cfg), 1e-6, device)
    assert np.array_equal(rstd.cpu().numpy(), want)


@pytest.mark.parametrize("M, N", [(3, 576), (2, 5121), (2, 4100), (3, 1024), (5, 100), (3, 256), (3, 101),
                                  (3, 257)])
def test_fused_orders_match_model(norms, device, M, N):
    torch.manual_seed(N)
    x = torch.randn(M, N, device=device) * 2 + 0.5
    w = torch.randn(N, device=device)
    b = torch.randn(N, device=device)
    xn = x.cpu().numpy()
    vec = norms._torch_order.fused_vectorized(x, N, w, b)
    assert vec == (N % 4 == 0)
    _, _, rstd = norms._ops.ops.rms_norm_fwd(x, None, w, None, 1e-5, 0.0, None, torch.float32, 2)
    if vec:
        var = (ref.fused_rms_sumsq(xn) / f32(N)).astype(f32)
    else:
        m, v = ref.rowwise_welford(xn)
        var = ref.fma(m, m, v)
    assert np.array_equal(rstd.cpu().numpy(), _rstd(var, 1e-5, device))
    _, _, mean, rstd = norms._ops.ops.layer_norm_fwd(x, None, w, b, 1e-5, 2)
    m, v = ref.fused_ln_stats(xn, norms._exact.LN_MEAN_FMA) if vec else ref.rowwise_welford(xn)
    assert np.array_equal(mean.cpu().numpy(), m)
    assert np.array_equal(rstd.cpu().numpy(), _rstd(v, 1e-5, device))


@pytest.mark.parametrize("M, N", [(3, 576), (2, 1028)])
def test_fused_order_with_a_misaligned_weight(norms, device, M, N):
    """A weight not aligned to 4 elements (a slice one element in) makes ATen's F.rms_norm / F.layer_norm take the
    row-wise Welford kernel, N a multiple of 4 or not: the eager call (its inference plan) and the op sum in that
    order too (the numpy model's), not the vectorised one x alone would give."""
    torch.manual_seed(N)
    x = torch.randn(M, N, device=device) * 2 + 0.5
    w = torch.randn(N + 1, device=device)[1:]
    assert w.is_contiguous() and norms._torch_order.fused_vectorized(x, N) and not \
        norms._torch_order.fused_vectorized(x, N, w)
    m, v = ref.rowwise_welford(x.cpu().numpy())
    want_rstd = _rstd(ref.fma(m, m, v), 1e-5, device)
    y_op, _, rstd = norms._ops.ops.rms_norm_fwd(x, None, w, None, 1e-5, 0.0, None, torch.float32, 2)
    assert np.array_equal(rstd.cpu().numpy(), want_rstd)
    with torch.no_grad():
        assert torch.equal(norms.rms_norm(x, w, eps=1e-5, torch_order="fused"), y_op)
    y_ln, _, _, rstd = norms._ops.ops.layer_norm_fwd(x, None, w, None, 1e-5, 2)
    assert np.array_equal(rstd.cpu().numpy(), _rstd(v, 1e-5, device))
    with torch.no_grad():
        assert torch.equal(norms.layer_norm(x, w, None, eps=1e-5, torch_order="fused"), y_ln)


@pytest.mark.parametrize("M, N", [(1, 576), (3, 100), (5, 5121), (2, 2050), (1, 4096), (2, 65537)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_mean_order_matches_model(norms, device, M, N, dtype):
    """``add_rms_norm(..., torch_order="mean")``: h is ``residual + x`` rounded once to the model dtype (torch's own
    add, bit for bit), the statistics are the mean order's of that h (the numpy model), and y is what the exact
    rms_norm gives for h, on strided x and residual rows and for rows that global-reduce (65537)."""
    torch.manual_seed(M * N)
    xb = (torch.randn(M, N + 3, device=device) * 3).to(dtype)
    rb = (torch.randn(M, 2 * N, device=device) * 2).to(dtype)
    x, r = xb[:, 1:N + 1], rb[:, N:]  # rows N + 3 and 2N apart, x starting off 16 bytes
    w = torch.randn(N, device=device).to(dtype)
    want_h = r + x
    y, h = norms.add_rms_norm(x, r, w, eps=1e-6, cast_dtype=dtype, torch_order="mean")
    assert torch.equal(h, want_h)
    assert torch.equal(y, norms.rms_norm(want_h, w, eps=1e-6, cast_dtype=dtype, torch_order="mean"))
    _, h2, rstd = norms._ops.ops.rms_norm_fwd(x, r, w, None, 1e-6, 0.0, dtype, dtype, 1)
    assert torch.equal(h2, want_h)
    cfg = norms._torch_order.mean_config(M, N, *norms._torch_order.device_limits(x.device))
    want = _rstd(ref.mean_sq(want_h.float().cpu().numpy(), cfg), 1e-6, device)
    assert np.array_equal(rstd.cpu().numpy(), want)
    fp64 = want_h.double() * torch.rsqrt(want_h.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.double(), (fp64.to(dtype) * w).double(), rtol=2e-3 if dtype != torch.float32 else
                               1e-5, atol=1e-5)


@pytest.mark.parametrize("x_dtype, r_dtype", [(torch.float32, torch.float16), (torch.float16, torch.float32)])
def test_add_rms_norm_mean_order_rounds_h_to_the_residual_dtype(norms, device, x_dtype, r_dtype):
    """x and the residual of two dtypes: h is ``x + residual`` summed in fp32 and rounded once to the residual's
    dtype (not x's; fp32 x + fp16 residual rounds, fp16 x + fp32 residual does not), and y (of the residual's dtype
    by default) is normalised from that h: h bit for bit against torch, y bit for bit against the exact rms_norm of
    h and near fp64, rstd the numpy model's of h. The eager plan (``add_rms_norm``) and the op. (3, 389): N prime,
    the mean order's head and tail."""
    M, N = 3, 389
    torch.manual_seed(N)
    x = (torch.randn(M, N, device=device) * 3).to(x_dtype)
    r = (torch.randn(M, N, device=device) * 2).to(r_dtype)
    w = torch.randn(N, device=device).to(r_dtype)
    want_h = (x.float() + r.float()).to(r_dtype)
    y, h = norms.add_rms_norm(x, r, w, eps=1e-6, torch_order="mean")
    assert h.dtype == r_dtype and y.dtype == r_dtype
    assert torch.equal(h, want_h)
    assert torch.equal(y, norms.rms_norm(want_h, w, eps=1e-6, torch_order="mean"))
    fp64 = want_h.double() * torch.rsqrt(want_h.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(y.double(), fp64, rtol=2e-3 if r_dtype == torch.float16 else 1e-5, atol=1e-5)
    y2, h2, rstd = norms._ops.ops.rms_norm_fwd(x, r, w, None, 1e-6, 0.0, None, r_dtype, 1)
    assert torch.equal(h2, want_h) and torch.equal(y2, y)
    cfg = norms._torch_order.mean_config(M, N, *norms._torch_order.device_limits(x.device))
    assert np.array_equal(rstd.cpu().numpy(), _rstd(ref.mean_sq(want_h.float().cpu().numpy(), cfg), 1e-6, device))


@pytest.mark.parametrize("M, N", [(4, 389), (3, 5121)])
def test_add_rms_norm_mean_order_with_a_broadcast_residual(norms, device, M, N):
    """A residual expanded over the rows (row stride 0, one row read by every program): h is ``residual + x``
    rounded once, y the exact rms_norm of h, rstd the numpy model's of h (a zero residual row stride must still
    pass the residual to the kernel)."""
    torch.manual_seed(N)
    x = (torch.randn(M, N, device=device) * 3).to(torch.float16)
    r = (torch.randn(1, N, device=device) * 2).to(torch.float16).expand(M, N)
    w = torch.randn(N, device=device).to(torch.float16)
    want_h = r + x
    y, h = norms.add_rms_norm(x, r, w, eps=1e-6, torch_order="mean")
    assert torch.equal(h, want_h)
    assert torch.equal(y, norms.rms_norm(want_h, w, eps=1e-6, torch_order="mean"))
    _, h2, rstd = norms._ops.ops.rms_norm_fwd(x, r, w, None, 1e-6, 0.0, None, torch.float16, 1)
    assert torch.equal(h2, want_h)
    cfg = norms._torch_order.mean_config(M, N, *norms._torch_order.device_limits(x.device))
    assert np.array_equal(rstd.cpu().numpy(), _rstd(ref.mean_sq(want_h.float().cpu().numpy(), cfg), 1e-6, device))


def test_add_rms_norm_torch_order_argument(norms, device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="torch_order"):
        norms.add_rms_norm(x, x, torch_order="fused")
    with pytest.raises(TypeError, match="torch_order"):
        norms.add_rms_norm(x, x, torch_order=1)


@pytest.mark.parametrize("M, N, want", [
    (333, 4096, (True, 32, 1, 1)),  # a warp per row, 32 vectors per lane
    (7, 576, (True, 128, 1, 1)),  # shared-memory stage, then the warp
    (4096, 8192, (True, 32, 16, 1)),  # 16 warps share a row (block_y_reduce)
    (2, 65537, (True, 256, 2, 1)),
    (1, 262144, (True, 512, 1, 32)),  # global reduce over 32 blocks
    (333, 64, (False, 32, 1, 1)),  # N < 128: 4 accumulators by step
    (333, 127, (False, 32, 1, 1)),
    (333, 128, (True, 32, 1, 1)),  # torch 2.13's Reduce.cuh vectorises from dim0 >= 128 (a head_dim of 128: q/k norms)
])
def test_mean_config(norms, M, N, want):
    c = norms._torch_order.mean_config(M, N, 132, 2048)
    assert (c.vec, c.bw, c.bhr, c.ctas) == want


def test_torch_order_argument(norms, device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="torch_order"):
        norms.rms_norm(x, torch_order="sum")
    with pytest.raises(ValueError, match="torch_order"):
        norms.layer_norm(x, torch_order="mean")
    for order in ("mean", "fused"):
        y = norms.rms_norm(x, torch_order=order)
        ref64 = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        torch.testing.assert_close(y.double(), ref64, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("N", [8, 64, 100, 256])
@pytest.mark.parametrize("order", ["mean", "fused"])
def test_narrow_rows_share_a_program_without_changing_bits(norms, device, N, order):
    """Narrow rows run several per program on a GPU (``_exact._tiles``); the result is the same bits as one row
    per program, for RMSNorm in both torch orders and for LayerNorm."""
    ex = norms._exact
    order_id = ex.ORDER_MEAN if order == "mean" else ex.ORDER_FUSED
    rows, _, loop, _, _, _ = ex._tiles(N, 4, 1, None, None, 4 * 32 if order == "mean" else 512)
    assert not loop and rows > 1  # the GPU rule groups these rows
    torch.manual_seed(N)
    M = 37
    x = torch.randn(M, N, device=device) * 2 + 0.25
    w = torch.randn(N, device=device)
    outs = []
    for r in (1, 8, 64):
        y = torch.full_like(x, float("nan"))
        ex.rms_exact_forward(x, M, N, w, None, y, None, 1e-6, 0.0, None, order_id, x, rows=r)
        yl = torch.full_like(x, float("nan"))
        ex.ln_exact_forward(x, w, w, yl, None, None, 1e-5, x, rows=r)
        outs.append((y, yl))
    for y, yl in outs[1:]:
        assert torch.equal(y, outs[0][0]) and torch.equal(yl, outs[0][1])
    assert torch.isfinite(outs[0][0]).all() and torch.isfinite(outs[0][1]).all()


@pytest.mark.parametrize("mean_fma", [0, 1, 2])
@pytest.mark.parametrize("N", [20992, 4352])
def test_layer_norm_combine_operands(norms, device, N, mean_fma):
    """cuWelfordCombine's operands (this thread against the other, and which product its fma fuses) matter only
    where n * (1 / 2n) is not 0.5, as at 20992 elements (41 vectors per thread: n * RN(1 / 2n) = 0.49999997), and
    only for data whose per-thread means differ (a period-512 offset): there a swapped or differently fused combine
    changes bits; rows 3 and 4 give threads 16 lanes apart means of other magnitudes, so that the warp levels show
    it too. 20992 takes LayerNorm's mask-free path, 4352 its masked one; 5 rows: 1 to 8 per program."""
    torch.manual_seed(N + mean_fma)
    cols = torch.arange(N, device=device) % 512
    x = torch.randn(5, N, device=device) * 2 + cols * 0.37 - 40
    x[3:] = torch.randn(2, N, device=device) * 0.1 + 1.7 ** ((cols // 4) % 29).float()  # thread means 1 ... 2.8e6
    m_want, v_want = ref.fused_ln_stats(x.cpu().numpy(), mean_fma)
    for rows in (1, 8):
        y = torch.full_like(x, float("nan"))
        mean = torch.full((5,), float("nan"), device=device)
        rstd = torch.full((5,), float("nan"), device=device)
        norms._exact.ln_exact_forward(x, None, None, y, mean, rstd, 1e-5, x, rows=rows, mean_fma=mean_fma)
        assert np.array_equal(mean.cpu().numpy(), m_want), rows
        assert np.array_equal(rstd.cpu().numpy(), _rstd(v_want, 1e-5, device)), rows


@pytest.mark.parametrize("M, N, dtype", [(5, 2052, torch.float32), (3, 4100, torch.float32), (2, 8192, torch.float32),
                                         (5, 4101, torch.float32), (3, 4102, torch.float16), (1, 131075, torch.float32)])
def test_schedule_never_changes_bits(norms, device, M, N, dtype):
    """The exact forwards' schedule (rows per program, warps, the statistics loop's unrolled groups, the
    normalisation chunk) is free: every choice gives the numpy model's statistics and the same outputs
    (RMS in both orders, LayerNorm). Covers rows whose fp32 copy starts off 16 bytes (N % 4 != 0: the mean
    order's head and tail, the row-wise Welford order), fp16, a mean order reduced over 17 programs, and LayerNorm
    rows of a multiple of 512 (its mask-free path) with 1 and 2 rows per program and a run-time loop."""
    ex, to = norms._exact, norms._torch_order
    torch.manual_seed(M * N)
    x = (torch.randn(M, N, device=device) * 3 - 0.5).to(dtype)
    w = torch.randn(N, device=device).to(dtype)
    b = torch.randn(N, device=device).to(dtype)
    xn = x.float().cpu().numpy()
    cfg = to.mean_config(M, N, *to.device_limits(x.device))
    if N == 131075:
        assert cfg.ctas > 1
    if N % 4 == 0:
        fused_var = (ref.fused_rms_sumsq(xn) / f32(N)).astype(f32)
        ln_mean, ln_var = ref.fused_ln_stats(xn, ex.LN_MEAN_FMA)
    else:
        ln_mean, ln_var = ref.rowwise_welford(xn)
        fused_var = ref.fma(ln_mean, ln_mean, ln_var)
    want = {"mean": _rstd(ref.mean_sq(xn, cfg), 1e-6, device), "fused": _rstd(fused_var, 1e-6, device)}
    elem = x.element_size()
    schedules = [dict(split=False), dict(split=True), dict(unroll=1), dict(unroll=3, apply_bytes=512 * elem),
                 dict(rows=2, num_warps=1, unroll=2, split=True), dict(num_warps=8, apply_bytes=2048 * elem),
                 dict(rows=1, num_warps=4)]
    if N > 65536:
        schedules = schedules[:3]
    first = None
    for sched in schedules:
        outs = []
        for name, order in (("mean", ex.ORDER_MEAN), ("fused", ex.ORDER_FUSED)):
            y = torch.full_like(x, float("nan"))
            rstd = torch.full((M,), float("nan"), device=device)
            ex.rms_exact_forward(x, M, N, w, None, y, rstd, 1e-6, 0.0, None, order, x, **sched)
            assert np.array_equal(rstd.cpu().numpy(), want[name]), (name, sched)
            outs.append(y)
        y = torch.full_like(x, float("nan"))
        mean = torch.full((M,), float("nan"), device=device)
        rstd = torch.full((M,), float("nan"), device=device)
        if sched != dict(split=True):  # LayerNorm has no split trees: that schedule is the default one again
            ex.ln_exact_forward(x, w, b, y, mean, rstd, 1e-5, x, **{k: v for k, v in sched.items() if k != "split"})
            assert np.array_equal(mean.cpu().numpy(), ln_mean), sched
            assert np.array_equal(rstd.cpu().numpy(), _rstd(ln_var, 1e-5, device)), sched
            outs.append(y)
        else:
            outs.append(first[2])
        assert all(torch.isfinite(o).all() for o in outs)
        if first is None:
            first = outs
        assert all(torch.equal(o, f) for o, f in zip(outs, first)), sched


@pytest.mark.slow
def test_exact_forwards_compile_with_few_registers(built, tmp_path):
    """The exact forwards, as the layers launch them, lower for an H100/H200 and an MI300, and on sm_90 stay within
    LayerNorm 64 / RMS orders 128 registers with nothing on the stack (``benchmarks/norms_exact_registers.py``). The
    split sum trees the schedule picks for rows of 2049-8191 (mean order) and 2049-4096 (fused order) elements hold
    a row's partial sums per thread (86 / 48 registers); elsewhere the trees keep few. The trees session 18 replaced
    took, under Triton 3.6 on sm_90, 126-255 registers for LayerNorm, 255 and spills for the mean order at 16384
    elements, and under Triton 3.9 140-255 for LayerNorm; ``results/norms_exact_registers_2026-12-02.md``. The
    4352-wide rows take LayerNorm's masked Welford path."""
    import os
    import subprocess
    import sys

    variant = built["triton-norms"].variant("cpu")
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "norms_exact_registers.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, script, str(variant), "--arch", "90,gfx942", "--max-regs", "128,ln=64",
                          "--shapes", "32768x4096,8192x16384,2048x65536,4096x4352", "--scratch", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr[-3000:]
    assert res.returncode == 0 and res.stdout.count("COMPILED") == 24 and res.stdout.count("REGS") == 12, out
