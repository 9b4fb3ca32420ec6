"""``kernels benchmark`` workloads for triton-softmax (copied into the Hub tree by the build tool).

Each workload times one call (``benchmark_<w>``) and checks it against eager PyTorch
(``verify_<w>``; the runner compares ``self.out`` with ``torch.allclose(atol=1e-2)``).

Bytes moved (the one formula behind any GB/s figure for these ops):
``bytes_moved(M, N, elem, n_in, n_out)`` = (n_in + n_out) * M * N * elem: every input row read
once and every output row written once, whatever the kernel actually re-reads (on a GPU a wide row
goes to a team of programs and is read once; where it is read twice, that is the kernel's cost,
not extra useful traffic). softmax forward: n_in=1, n_out=1;
forward+backward: x read, y written, then y and dy read, dx written (n_in=3, n_out=2);
cross-entropy forward+backward: logits read, gradient written (n_in=1, n_out=1) -- the
"effective" figure of the issue's target.

Shapes: GPU softmax (4096, 32768) bf16 and a (64, 262144) wide-row case; cross-entropy
(8192, 128256) bf16 (Llama-3 vocabulary); CPU (interpreter) runs much smaller shapes.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def bytes_moved(M: int, N: int, elem: int, n_in: int = 1, n_out: int = 1) -> int:
    return (n_in + n_out) * M * N * elem


def _shape(device: str, kind: str = "rows"):
    if device == "cpu":  # Triton interpreter: keep it quick
        return {"rows": (16, 1024), "wide": (2, 131072), "vocab": (8, 4096)}[kind]
    return {"rows": (4096, 32768), "wide": (64, 262144), "vocab": (8192, 128256)}[kind]


class SoftmaxBenchmark(Benchmark):
    seed = 0

    def _make(self, kind="rows", dtype=torch.bfloat16):
        M, N = _shape(self.device, kind)
        self.x = torch.randn(M, N, device=self.device, dtype=dtype)

    def setup_bf16(self):
        self._make()

    def benchmark_bf16(self):
        self.out = self.kernel.softmax(self.x)

    def verify_bf16(self):
        return torch.softmax(self.x, -1)

    def setup_wide_bf16(self):
        self._make("wide")

    def benchmark_wide_bf16(self):
        self.out = self.kernel.softmax(self.x)

    def verify_wide_bf16(self):
        return torch.softmax(self.x, -1)

    def setup_log_softmax_fp32(self):
        self._make(dtype=torch.float32)

    def benchmark_log_softmax_fp32(self):
        self.out = self.kernel.log_softmax(self.x)

    def verify_log_softmax_fp32(self):
        return torch.log_softmax(self.x, -1)

    def setup_scaled_causal_fp32(self):
        B, S = (2, 64) if self.device == "cpu" else (128, 1024)  # attention scores (B*H, S, S)
        self.x = torch.randn(B, S, S, device=self.device)

    def benchmark_scaled_causal_fp32(self):
        self.out = self.kernel.softmax(self.x, scale=0.125, causal=True)

    def verify_scaled_causal_fp32(self):
        L, S = self.x.shape[-2:]
        keep = torch.ones(L, S, dtype=torch.bool, device=self.device).tril()
        return torch.softmax((self.x * 0.125).masked_fill(~keep, float("-inf")), -1)

    def setup_backward_bf16(self):
        self._make()
        self.x.requires_grad_(True)
        self.dy = torch.randn_like(self.x)

    def benchmark_backward_bf16(self):
        self.x.grad = None
        self.kernel.softmax(self.x).backward(self.dy)
        self.out = self.x.grad

    def verify_backward_bf16(self):
        x = self.x.detach().clone().requires_grad_(True)
        torch.softmax(x, -1).backward(self.dy)
        return x.grad


class CrossEntropyBenchmark(Benchmark):
    seed = 0

    def setup_forward_backward_bf16(self):
        M, V = _shape(self.device, "vocab")
        self.x = torch.randn(M, V, device=self.device, dtype=torch.bfloat16).requires_grad_(True)
        self.t = torch.randint(0, V, (M,), device=self.device)
        self.t[::7] = -100

    def benchmark_forward_backward_bf16(self):
        self.x.grad = None
        self.kernel.cross_entropy(self.x, self.t).backward()
        self.out = self.x.grad

    def verify_forward_backward_bf16(self):
        x = self.x.detach().clone().requires_grad_(True)
        F.cross_entropy(x, self.t).backward()
        return x.grad

    def setup_loss_z_loss_fp32(self):
        M, V = _shape(self.device, "vocab")
        self.x = torch.randn(M, V, device=self.device)
        self.t = torch.randint(0, V, (M,), device=self.device)

    def benchmark_loss_z_loss_fp32(self):
        self.out = self.kernel.cross_entropy(self.x, self.t, label_smoothing=0.1, z_loss=1e-4)

    def verify_loss_z_loss_fp32(self):
        loss = F.cross_entropy(self.x, self.t, label_smoothing=0.1)
        return loss + 1e-4 * torch.logsumexp(self.x, -1).square().mean()
