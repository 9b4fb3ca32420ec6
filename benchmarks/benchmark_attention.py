"""``kernels benchmark`` workloads for triton-attention (copied into the Hub tree by the build tool).

Each workload times one call (``benchmark_<w>``) and checks it against PyTorch
(``verify_<w>``: ``F.scaled_dot_product_attention`` or transformers' rotary formula; the runner
compares ``self.out`` with ``torch.allclose(atol=1e-2)``).

FLOPs (the one formula behind any TFLOP/s figure here): forward ``4 * B * H * Sq * Sk * D``
(two matmuls of 2 flops per multiply-add), halved for causal; backward 2.5x the forward (five
matmuls, the FlashAttention-2 convention); forward+backward 3.5x. Rotary: bytes moved
(q, k read and written once, cos/sin read once).

Shapes: GPU d=128 with B*S = 16K tokens (S = 4096, 32 heads) and GQA 32/8 in [B, S, H, D];
CPU (interpreter) runs tiny shapes.
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark


def attention_flops(B: int, H: int, Sq: int, Sk: int, D: int, causal: bool = False, factor: float = 1.0) -> float:
    return 4.0 * B * H * Sq * Sk * D * (0.5 if causal else 1.0) * factor


def _shape(device: str):
    return (1, 2, 64, 32) if device == "cpu" else (4, 32, 4096, 128)  # B, H, S, D


def _rand(*shape, device, dtype=torch.bfloat16):
    return torch.randn(*shape, device=device, dtype=dtype)


class FlashAttentionBenchmark(Benchmark):
    seed = 0

    def _make(self, causal=False, layout="bhsd", kv_heads=None, dtype=torch.bfloat16):
        B, H, S, D = _shape(self.device)
        Hk = kv_heads or H
        shp = (lambda h: (B, S, h, D)) if layout == "bshd" else (lambda h: (B, h, S, D))
        self.q, self.k, self.v = (_rand(*shp(h), device=self.device, dtype=dtype) for h in (H, Hk, Hk))
        self.causal, self.layout = causal, layout

    def _sdpa(self, q, k, v):
        """SDPA in fp32 on the same inputs, rounded to their dtype."""
        dtype = q.dtype
        if self.layout == "bshd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k, v = q.float(), k.float(), v.float()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=q.shape[1] != k.shape[1])
        return (o.transpose(1, 2) if self.layout == "bshd" else o).to(dtype)

    def setup_fwd_bf16(self):
        self._make()

    def benchmark_fwd_bf16(self):
        self.out = self.kernel.flash_attention(self.q, self.k, self.v)

    def verify_fwd_bf16(self):
        return self._sdpa(self.q, self.k, self.v)

    def setup_fwd_causal_bf16(self):
        self._make(causal=True)

    def benchmark_fwd_causal_bf16(self):
        self.out = self.kernel.flash_attention(self.q, self.k, self.v, causal=True)

    def verify_fwd_causal_bf16(self):
        return self._sdpa(self.q, self.k, self.v)

    def setup_fwd_gqa_bshd_bf16(self):
        B, H, S, D = _shape(self.device)
        self._make(layout="bshd", kv_heads=max(1, H // 4))

    def benchmark_fwd_gqa_bshd_bf16(self):
        self.out = self.kernel.flash_attention(self.q, self.k, self.v, layout="bshd")

    def verify_fwd_gqa_bshd_bf16(self):
        return self._sdpa(self.q, self.k, self.v)

    # fp16: dQ values reach a few units, where one bf16 ulp alone exceeds the runner's atol of 1e-2
    def setup_fwd_bwd_causal_fp16(self):
        self._make(causal=True, dtype=torch.float16)
        for t in (self.q, self.k, self.v):
            t.requires_grad_(True)
        self.do = torch.randn_like(self.q)

    def benchmark_fwd_bwd_causal_fp16(self):
        o = self.kernel.flash_attention(self.q, self.k, self.v, causal=True)
        self.out = torch.autograd.grad(o, self.q, self.do)[0]

    def verify_fwd_bwd_causal_fp16(self):
        q, k, v = (t.detach().float().requires_grad_(True) for t in (self.q, self.k, self.v))
        return torch.autograd.grad(self._sdpa(q, k, v), q, self.do.float())[0].to(self.q.dtype)


class RotaryBenchmark(Benchmark):
    seed = 0

    def setup_apply_rotary_pos_emb_bf16(self):
        B, H, S, D = _shape(self.device)
        self.q = _rand(B, H, S, D, device=self.device)
        self.k = _rand(B, max(1, H // 4), S, D, device=self.device)
        ang = torch.rand(B, S, D // 2, device=self.device) * 6
        self.cos = torch.cat([ang.cos(), ang.cos()], -1).to(torch.bfloat16)
        self.sin = torch.cat([ang.sin(), ang.sin()], -1).to(torch.bfloat16)

    def benchmark_apply_rotary_pos_emb_bf16(self):
        self.out = torch.cat([t.flatten() for t in self.kernel.apply_rotary_pos_emb(self.q, self.k, self.cos, self.sin)])

    def verify_apply_rotary_pos_emb_bf16(self):
        def rotate_half(x):
            h = x.shape[-1] // 2
            return torch.cat([-x[..., h:], x[..., :h]], -1)

        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)
        q = self.q * cos + rotate_half(self.q) * sin
        k = self.k * cos + rotate_half(self.k) * sin
        return torch.cat([q.flatten(), k.flatten()])
