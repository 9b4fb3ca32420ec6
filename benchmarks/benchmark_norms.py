"""``kernels benchmark`` workloads for triton-norms (copied into the Hub tree by the build tool).

Each workload times one call of the kernel (``benchmark_<w>``) and checks it
against eager PyTorch with the same numerics (``verify_<w>``); the runner compares
``self.out`` with ``torch.allclose(atol=1e-2)``, so weights are scaled to keep
outputs below 2, where one bf16 ulp is <= 2**-7.

Bytes moved (the one formula behind any GB/s figure for these ops):
``bytes_moved(M, N, elem, n_in, n_out)`` = (n_in + n_out) * M * N * elem: every
input row read once and every output row written once (weight/bias and the
per-row statistics are negligible). RMSNorm/LayerNorm forward: n_in=1, n_out=1;
with a residual: n_in=2, n_out=2; backward: dy and x read, dx written (n_in=2,
n_out=1).

Shapes: GPU (32768, 4096) bf16 -- a 32K-token batch of a 4K model; a 65536-wide
row case for the looped path; CPU (interpreter) runs much smaller shapes.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def bytes_moved(M: int, N: int, elem: int, n_in: int = 1, n_out: int = 1) -> int:
    return (n_in + n_out) * M * N * elem


def _shape(device: str, wide: bool = False):
    if device == "cpu":  # Triton interpreter: keep it quick
        return (8, 8192) if wide else (32, 1024)
    return (4096, 65536) if wide else (32768, 4096)


def _llama_rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNormBenchmark(Benchmark):
    seed = 0

    def _make(self, wide=False, dtype=torch.bfloat16):
        M, N = _shape(self.device, wide)
        self.x = torch.randn(M, N, device=self.device, dtype=dtype)
        self.w = (torch.rand(N, device=self.device) * 0.4).to(dtype)
        self.eps = 1e-6

    def setup_llama_bf16(self):
        self._make()

    def benchmark_llama_bf16(self):
        self.out = self.kernel.rms_norm(self.x, self.w, eps=self.eps, cast_dtype=self.x.dtype)

    def verify_llama_bf16(self):
        return _llama_rms_norm(self.x, self.w, self.eps)

    def setup_wide_bf16(self):
        self._make(wide=True)

    def benchmark_wide_bf16(self):
        self.out = self.kernel.rms_norm(self.x, self.w, eps=self.eps, cast_dtype=self.x.dtype)

    def verify_wide_bf16(self):
        return _llama_rms_norm(self.x, self.w, self.eps)

    def setup_add_residual_bf16(self):
        self._make()
        self.r = torch.randn_like(self.x)

    def benchmark_add_residual_bf16(self):
        self.out, _ = self.kernel.add_rms_norm(self.x, self.r, self.w, eps=self.eps, cast_dtype=self.x.dtype)

    def verify_add_residual_bf16(self):
        return _llama_rms_norm(self.x + self.r, self.w, self.eps)

    def setup_backward_fp32(self):
        self._make(dtype=torch.float32)
        self.x.requires_grad_(True)
        self.dy = torch.randn_like(self.x)

    def benchmark_backward_fp32(self):
        self.x.grad = None
        y = self.kernel.rms_norm(self.x, self.w, eps=self.eps)
        y.backward(self.dy)
        self.out = self.x.grad

    def verify_backward_fp32(self):
        x = self.x.detach().clone().requires_grad_(True)
        F.rms_norm(x, (x.shape[-1],), self.w, self.eps).backward(self.dy)
        return x.grad


class LayerNormBenchmark(Benchmark):
    seed = 0

    def _make(self, wide=False, dtype=torch.bfloat16):
        M, N = _shape(self.device, wide)
        self.x = torch.randn(M, N, device=self.device, dtype=dtype)
        self.w = (torch.rand(N, device=self.device) * 0.4).to(dtype)
        self.b = (torch.rand(N, device=self.device) * 0.1).to(dtype)

    def setup_bf16(self):
        self._make()

    def benchmark_bf16(self):
        self.out = self.kernel.layer_norm(self.x, self.w, self.b, eps=1e-5)

    def verify_bf16(self):
        return F.layer_norm(self.x, (self.x.shape[-1],), self.w, self.b, 1e-5)

    def setup_wide_bf16(self):
        self._make(wide=True)

    def benchmark_wide_bf16(self):
        self.out = self.kernel.layer_norm(self.x, self.w, self.b, eps=1e-5)

    def verify_wide_bf16(self):
        return F.layer_norm(self.x, (self.x.shape[-1],), self.w, self.b, 1e-5)

    def setup_backward_fp32(self):
        self._make(dtype=torch.float32)
        self.x.requires_grad_(True)
        self.dy = torch.randn_like(self.x)

    def benchmark_backward_fp32(self):
        self.x.grad = None
        self.kernel.layer_norm(self.x, self.w, self.b, eps=1e-5).backward(self.dy)
        self.out = self.x.grad

    def verify_backward_fp32(self):
        x = self.x.detach().clone().requires_grad_(True)
        F.layer_norm(x, (x.shape[-1],), self.w, self.b, 1e-5).backward(self.dy)
        return x.grad
