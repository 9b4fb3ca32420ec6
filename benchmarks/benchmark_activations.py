"""``kernels benchmark`` workloads for triton-activations (copied into the Hub tree by the build tool).

Each workload times one call of the kernel (``benchmark_<w>``) and checks it against
eager PyTorch with the same rounding points (``verify_<w>``); the runner compares
``self.out`` with ``torch.allclose(atol=1e-2)``. The forwards equal eager bit for bit; the
gated backward's fp32 reference rounds once where the kernel may differ by one bf16 ulp in
rare elements, so the gated inputs (and dy) are ``randn * 0.25``: outputs stay below ~2, where
one bf16 ulp is at most 2**-7, inside the runner's tolerance.

Bytes moved (the one formula behind any GB/s figure for these ops):
``bytes_moved(M, d, elem, n_in, n_out)`` = (n_in + n_out) * M * d * elem, counting
tensors of the output's width d: the gated forward reads x = 2 halves and writes y
(n_in=2, n_out=1); a plain activation n_in=1, n_out=1; the gated backward reads dy and
both halves and writes both halves of dx (n_in=3, n_out=2).

Shapes: GPU (16384, 2 x 14336) bf16 -- a 16K-token batch of a Llama-3-8B MLP (the issue's
target shape), the same on a ``chunk`` view of a wider projection; CPU (interpreter) runs
much smaller shapes.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def bytes_moved(M: int, d: int, elem: int, n_in: int = 2, n_out: int = 1) -> int:
    return (n_in + n_out) * M * d * elem


def _shape(device: str):
    if device == "cpu":  # Triton interpreter: keep it quick
        return 64, 1024
    return 16384, 14336


def _gelu_tanh(t):
    return F.gelu(t, approximate="tanh")


class GatedActivationBenchmark(Benchmark):
    """silu_and_mul / gelu_tanh_and_mul forward (contiguous, chunk view, out=) and forward+backward."""

    seed = 0

    def _make(self, dtype=torch.bfloat16, view=False):
        M, d = _shape(self.device)
        if view:  # the (M, 2d) left half of a (M, 4d) projection: row stride 2x the width, no copy
            self.x = (torch.randn(M, 4 * d, device=self.device) * 0.25).to(dtype)[:, : 2 * d]
        else:
            self.x = (torch.randn(M, 2 * d, device=self.device) * 0.25).to(dtype)
        self.d = d

    def _eager(self, act):
        a, b = self.x[..., : self.d], self.x[..., self.d :]
        return act(a) * b  # the rounding points of rounding="eager"

    def setup_silu_and_mul_bf16(self):
        self._make()

    def benchmark_silu_and_mul_bf16(self):
        self.out = self.kernel.silu_and_mul(self.x, rounding="eager")

    def verify_silu_and_mul_bf16(self):
        return self._eager(F.silu)

    def setup_silu_and_mul_view_bf16(self):
        self._make(view=True)

    def benchmark_silu_and_mul_view_bf16(self):
        self.out = self.kernel.silu_and_mul(self.x, rounding="eager")

    def verify_silu_and_mul_view_bf16(self):
        return self._eager(F.silu)

    def setup_silu_and_mul_out_bf16(self):
        self._make()
        self.y = torch.empty(self.x.shape[0], self.d, device=self.device, dtype=self.x.dtype)

    def benchmark_silu_and_mul_out_bf16(self):
        self.out = self.kernel.silu_and_mul(self.y, self.x)  # kernels-community's (out, x) form

    def verify_silu_and_mul_out_bf16(self):
        return self._eager(F.silu)  # the (out, x) form's default rounding is kernels-community's: "eager"

    def setup_gelu_tanh_and_mul_bf16(self):
        self._make()

    def benchmark_gelu_tanh_and_mul_bf16(self):
        self.out = self.kernel.gelu_tanh_and_mul(self.x, rounding="eager")

    def verify_gelu_tanh_and_mul_bf16(self):
        return self._eager(_gelu_tanh)

    def setup_gelu_tanh_and_mul_view_bf16(self):
        self._make(view=True)

    def benchmark_gelu_tanh_and_mul_view_bf16(self):
        self.out = self.kernel.gelu_tanh_and_mul(self.x, rounding="eager")

    def verify_gelu_tanh_and_mul_view_bf16(self):
        return self._eager(_gelu_tanh)

    def setup_silu_and_mul_fwd_bwd_bf16(self):
        self._make()
        self.x.requires_grad_(True)
        self.dy = (torch.randn(self.x.shape[0], self.d, device=self.device) * 0.25).to(self.x.dtype)

    def benchmark_silu_and_mul_fwd_bwd_bf16(self):
        self.x.grad = None
        self.kernel.silu_and_mul(self.x).backward(self.dy)
        self.out = self.x.grad

    def verify_silu_and_mul_fwd_bwd_bf16(self):
        # the gradient of the default (rounding="eager") forward: du = dy * silu(g) rounded to x.dtype as the
        # forward rounds it, dg = dy * u * silu'(g); fp32 math, one rounding
        g, u = self.x.detach()[..., : self.d].float(), self.x.detach()[..., self.d :].float()
        dy, s = self.dy.float(), torch.sigmoid(g)
        du = dy * F.silu(g).to(self.x.dtype).float()
        dg = dy * u * (s * (1 + g * (1 - s)))
        return torch.cat([dg, du], dim=-1).to(self.x.dtype)


class ActivationBenchmark(Benchmark):
    """Plain activations, as transformers' decorated classes use them (bf16)."""

    seed = 0

    def _make(self):
        M, d = _shape(self.device)
        self.x = torch.randn(M, d, device=self.device, dtype=torch.bfloat16)

    def setup_silu_bf16(self):
        self._make()

    def benchmark_silu_bf16(self):
        self.out = self.kernel.silu(self.x)

    def verify_silu_bf16(self):
        return F.silu(self.x)

    def setup_gelu_bf16(self):
        self._make()

    def benchmark_gelu_bf16(self):
        self.out = self.kernel.gelu(self.x)

    def verify_gelu_bf16(self):
        return F.gelu(self.x)

    def setup_gelu_new_eager_bf16(self):
        self._make()

    def benchmark_gelu_new_eager_bf16(self):
        self.out = self.kernel.gelu_new(self.x, rounding="eager")

    def verify_gelu_new_eager_bf16(self):
        x = self.x  # transformers' NewGELUActivation, op by op in bf16
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))
