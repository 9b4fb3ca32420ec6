"""Gradients of rows whose every key carries a huge additive mask (finfo.min, -1e9, -1e4): ours and SDPA against fp64
softmax autograd, on a GPU (``python3 benchmarks/attention_huge_mask_probe.py``)."""
import os, sys
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "src")
from pathlib import Path
from sweep_common import load_packages
import torch
import torch.nn.functional as F
(attn,) = load_packages(["triton-attention"], cpu=False, root=Path("."))
torch.manual_seed(6)
dev = "cuda"
q, k, v = (torch.randn(1, 2, 5, 16, device=dev), torch.randn(1, 2, 37, 16, device=dev), torch.randn(1, 2, 37, 16, device=dev))
big = torch.finfo(torch.float32).min
for name, fill in [("finfo.min", big), ("-1e9", -1e9), ("-1e4", -1e4)]:
    mask = torch.zeros(5, 37, device=dev); mask[0] = fill; mask[2, ::2] = fill
    do = torch.randn(1, 2, 5, 16, device=dev)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    r = torch.softmax((q64 @ k64.transpose(-1, -2)) * 0.25 + mask.double(), -1) @ v64
    rg = torch.autograd.grad(r, (q64, k64, v64), do.double())
    for who in ("ours", "sdpa"):
        qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
        o = attn.flash_attention(qa, ka, va, attn_mask=mask) if who == "ours" else \
            F.scaled_dot_product_attention(qa, ka, va, attn_mask=mask)
        g = torch.autograd.grad(o, (qa, ka, va), do)
        errs = [f"{(a.double() - b).abs().max().item():.3g}" for a, b in zip(g, rg)]
        dq0 = (g[0][:, :, 0].double() - rg[0][:, :, 0]).abs().max().item()
        print(f"mask {name} {who}: o err {(o.double() - r).abs().max().item():.3g}; dq/dk/dv err {errs}; dq row0 err {dq0:.3g}")
