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


@pytest.mark.parametrize("M, N", [(3, 576), (2, 5121), (2, 4100)])
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


@pytest.mark.parametrize("M, N, want", [
    (333, 4096, (True, 32, 1, 1)),  # a warp per row, 32 vectors per lane
    (7, 576, (True, 128, 1, 1)),  # shared-memory stage, then the warp
    (4096, 8192, (True, 32, 16, 1)),  # 16 warps share a row (block_y_reduce)
    (2, 65537, (True, 256, 2, 1)),
    (1, 262144, (True, 512, 1, 32)),  # global reduce over 32 blocks
    (333, 64, (False, 32, 1, 1)),  # N < 128: 4 accumulators by step
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
