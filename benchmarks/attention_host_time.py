"""Host time of triton-attention's ``flash_attention`` per call against SDPA, optionally A/B against a base checkout,
on a GPU.

    python3 benchmarks/attention_host_time.py --out DIR [--base DIR] [--rounds N]

``--base``: a checkout of the base revision (``git archive HEAD | tar -x -C DIR``); both builds load side by side.
Per case (bf16, no mask) and side ("sdpa" = ``F.scaled_dot_product_attention``, "new", "base"):

- ``check``: the largest error of the output against fp64 attention over two calls on fresh inputs, relative to
  the largest magnitude (the second call reuses what the first set up);
- ``host``: the median wall time of one call started on an idle GPU (a sync before each): Python, allocations and
  launches;
- ``per call``: 100 calls back to back then one sync, median of 3: what an eager program sees (the larger of the
  host time and the GPU time);
- ``gpu``: a CUDA-graph replay's median (``do_bench_cudagraph``): the kernels alone.

Sides alternate within each round; each value is the smallest over the rounds (the host drifts by up to 2x within a
run). Writes ``DIR/attention_host_time.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import ab_sides, time_sides_in_turn  # noqa: E402

# (B, Hq, Hk, Sq, Sk, D, causal, layout, grad, grow): a short causal prefill (the Gluon forward), a decode step with
# GQA (the pointer kernel), the same step over a KV cache that grows by one key per call (grow: every call has a new
# shape, so a new plan; no CUDA-graph reading), SD3.5-like d = 64, Flux's image tokens in diffusers' layout, and two
# forward+backward
CASES = [
    (1, 32, 32, 256, 256, 128, True, "bhsd", False, False), (1, 32, 8, 1, 1024, 128, False, "bhsd", False, False),
    (1, 32, 8, 1, 1024, 128, False, "bhsd", False, True), (2, 32, 32, 512, 512, 64, False, "bhsd", False, False),
    (1, 24, 24, 4608, 4608, 128, False, "bshd", False, False), (1, 32, 32, 256, 256, 128, True, "bhsd", True, False),
    (2, 32, 32, 512, 512, 64, False, "bhsd", True, False),
]
GROWTH = 8192  # keys a growing cache may gain during one case


def case_name(case) -> str:
    B, Hq, Hk, Sq, Sk, D, causal, layout, grad, grow = case
    heads = f"{Hq}" if Hq == Hk else f"{Hq}({Hk}kv)"
    return (f"{B}x{heads}x{Sq}x{Sk}{'+' if grow else ''} d{D} {layout}" + (" causal" if causal else "")
            + (" fwd+bwd" if grad else ""))


def inputs(case, device, seed, grad=False):
    """q, k, v; for a growing case k and v hold GROWTH more keys, of which a call reads a growing prefix."""
    B, Hq, Hk, Sq, Sk, D, causal, layout, _, grow = case
    g = torch.Generator(device="cpu").manual_seed(seed)

    def make(H, S):
        shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
        return torch.randn(shape, generator=g).to(device, torch.bfloat16).requires_grad_(grad)

    extra = GROWTH if grow else 0
    return make(Hq, Sq), make(Hk, Sk + extra), make(Hk, Sk + extra)


def make_fn(side, case, q, k_all, v_all):
    """One call of ``side`` ("sdpa" or a package); with grad: forward and backward; for a growing case each call
    reads one key more of k_all and v_all than the call before (from Sk keys on, cycling after GROWTH calls)."""
    B, Hq, Hk, Sq, Sk, D, causal, layout, grad, grow = case
    calls = [0]

    def kv():
        if not grow:
            return k_all, v_all
        calls[0] += 1
        n = Sk + calls[0] % GROWTH
        return k_all[:, :, :n], v_all[:, :, :n]

    if side == "sdpa":
        def fwd():
            k, v = kv()
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v)) if layout == "bshd" else (q, k, v)
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=Hq != Hk)
            return o.transpose(1, 2) if layout == "bshd" else o
    else:
        def fwd():
            k, v = kv()
            return side.flash_attention(q, k, v, causal=causal, layout=layout)
    if not grad:
        return fwd

    def fwd_bwd():
        q.grad = k_all.grad = v_all.grad = None
        fwd().sum().backward()

    return fwd_bwd


def max_rel_err(side, case, device) -> float:
    B, Hq, Hk, Sq, Sk, D, causal, layout, _, _ = case
    case = (*case[:8], False, False)
    worst = 0.0
    for seed in range(2):
        q, k, v = inputs(case, device, 100 + seed)
        with torch.no_grad():
            o = make_fn(side, case, q, k, v)()
        qd, kd, vd = ((t.transpose(1, 2) if layout == "bshd" else t).double() for t in (q, k, v))
        kd, vd = (t.repeat_interleave(Hq // Hk, 1) for t in (kd, vd))
        s = qd @ kd.transpose(-1, -2) * D ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(Sq, Sk, dtype=torch.bool, device=device).triu(1), float("-inf"))
        ref = torch.softmax(s, -1) @ vd
        ref = ref.transpose(1, 2) if layout == "bshd" else ref
        worst = max(worst, float((o.double() - ref).abs().max() / ref.abs().max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--base", default="", help="checkout of the base revision (A/B in one process)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="", help="run the cases whose name contains this text")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda"
    sides = ab_sides("triton-attention", "sdpa", args.base)
    rows = []
    for case in [c for c in CASES if args.only in case_name(c)]:
        grad, grow = case[-2:]
        q, k, v = inputs(case, device, 0, grad)
        row = {"case": case_name(case)}
        for name, side in sides.items():
            row[f"{name} check"] = max_rel_err(side, case, device) if case[3] * case[4] <= 2**20 else float("nan")
        time_sides_in_turn(row, sides, lambda side: make_fn(side, case, q, k, v), args.rounds, grad,
                           host_samples=20, calls=100, graph=not grow)
        rows.append(row)
        print(" | ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    (out / "attention_host_time.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
