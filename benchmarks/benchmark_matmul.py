"""``kernels benchmark`` workloads for triton-matmul (copied into the Hub tree by the build tool).

Each workload times one call (``benchmark_<w>``) and checks it against eager PyTorch
(``verify_<w>``: ``F.linear`` / ``torch.matmul``, i.e. cuBLAS on NVIDIA, then the separate
activation); the runner compares ``self.out`` with ``torch.allclose(atol=1e-2)``, so the weights
are scaled to keep outputs below ~0.5 (one bf16 ulp there is <= 2**-9; the kernel and the
reference each round once from fp32).

FLOPs (the one formula behind any TFLOP/s figure for these ops): ``flops(M, N, K) = 2 * M * N * K``
with N = all columns of the weight (both halves for the gated forms); forward+backward counts
three such products (forward, dgrad, wgrad).

Shapes (GPU): 4096^3 and 8192^3 square GEMMs in the ``nn.Linear`` layout (``x @ W.T``, W read
transposed in place); a Flux feed-forward up-projection with bias + tanh-GELU (4096 tokens, 3072 ->
12288); a diffusers GEGLU projection (4096 tokens, 1280 -> 2 x 5120); a Llama-3-8B gate/up SwiGLU
(2048 tokens, 4096 -> 2 x 14336); one decode token through a 4096 x 4096 projection. The CPU
(interpreter) runs much smaller shapes.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


_GPU = {"sq4096": (4096, 4096, 4096), "sq8192": (8192, 8192, 8192), "flux_ff": (4096, 12288, 3072),
        "geglu": (4096, 2 * 5120, 1280), "swiglu": (2048, 2 * 14336, 4096), "decode": (1, 4096, 4096),
        "train": (4096, 4096, 4096)}
_CPU = {"sq4096": (32, 48, 64), "sq8192": (48, 64, 80), "flux_ff": (24, 96, 48), "geglu": (24, 64, 40),
        "swiglu": (16, 64, 48), "decode": (1, 64, 64), "train": (24, 32, 40)}


class MatmulBenchmark(Benchmark):
    """Plain GEMMs and fused epilogues against cuBLAS followed by the separate activation."""

    seed = 0

    def _make(self, kind: str, bias: bool = False, dtype=torch.bfloat16):
        M, N, K = (_CPU if self.device == "cpu" else _GPU)[kind]
        self.x = torch.randn(M, K, device=self.device, dtype=dtype)
        self.w = torch.randn(N, K, device=self.device, dtype=dtype) * (0.1 / K ** 0.5)
        self.bias = torch.randn(N, device=self.device, dtype=dtype) * 0.1 if bias else None

    # -- plain GEMMs (nn.Linear layout)
    def setup_linear_4096_bf16(self):
        self._make("sq4096")

    def benchmark_linear_4096_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t())

    def verify_linear_4096_bf16(self):
        return F.linear(self.x, self.w)

    def setup_linear_8192_bf16(self):
        self._make("sq8192")

    def benchmark_linear_8192_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t())

    def verify_linear_8192_bf16(self):
        return F.linear(self.x, self.w)

    def setup_decode_bf16(self):
        self._make("decode", bias=True)

    def benchmark_decode_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t(), self.bias)

    def verify_decode_bf16(self):
        return F.linear(self.x, self.w, self.bias)

    # -- fused epilogues
    def setup_bias_gelu_tanh_bf16(self):
        self._make("flux_ff", bias=True)

    def benchmark_bias_gelu_tanh_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t(), self.bias, "gelu_tanh")

    def verify_bias_gelu_tanh_bf16(self):
        return F.gelu(F.linear(self.x, self.w, self.bias), approximate="tanh")

    def setup_geglu_bf16(self):
        self._make("geglu", bias=True)

    def benchmark_geglu_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t(), self.bias, "geglu")

    def verify_geglu_bf16(self):
        proj, gate = F.linear(self.x, self.w, self.bias).chunk(2, dim=-1)
        return proj * F.gelu(gate)

    def setup_swiglu_bf16(self):
        self._make("swiglu")

    def benchmark_swiglu_bf16(self):
        self.out = self.kernel.matmul(self.x, self.w.t(), None, "swiglu")

    def verify_swiglu_bf16(self):
        proj, gate = F.linear(self.x, self.w).chunk(2, dim=-1)
        return proj * F.silu(gate)

    # -- forward + backward (dgrad and wgrad run as torch.matmul)
    def setup_linear_gelu_fwd_bwd_bf16(self):
        self._make("train", bias=True)
        self.x.requires_grad_(True)
        self.dy = torch.randn(self.x.shape[0], self.w.shape[0], device=self.device, dtype=self.x.dtype)

    def benchmark_linear_gelu_fwd_bwd_bf16(self):
        self.x.grad = None
        self.kernel.matmul(self.x, self.w.t(), self.bias, "gelu").backward(self.dy)
        self.out = self.x.grad

    def verify_linear_gelu_fwd_bwd_bf16(self):
        x = self.x.detach().requires_grad_(True)
        F.gelu(F.linear(x, self.w, self.bias)).backward(self.dy)
        return x.grad
