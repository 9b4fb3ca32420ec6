"""Host time per call of the small-call paths (issue 7's small calls, a decode step's ops), A/B against a base checkout.

    python3 benchmarks/host_time_small.py --out DIR [--base DIR] [--device cpu|cuda] [--real] [--rounds N] [--calls N]

``--base``: a checkout of the base revision (``git archive REV | tar -x -C DIR``); both builds load side by side.

- ``--device cuda`` (a GPU): real launches, plus a ``torch`` side with the PyTorch / transformers call each op
  replaces. Per call: ``--calls`` calls back to back, then one synchronize: what an eager program sees per call
  (the larger of the host time and the GPU time; these kernels take a few microseconds).
- ``--device cpu`` (no GPU, the default there): the packages' cpu builds with each package's ``_fastlaunch`` made
  to take its direct path with a no-op C callable standing in for Triton's compiled launcher, so a call runs
  everything a GPU call runs on the host (checks, plan lookups, allocations, the launch path's Python) except the
  launcher itself (~4 us per launch on the H200 host) and the GPU allocator. Outputs are not computed: this
  times host code only. ``--real`` runs the interpreter instead (a smoke run of the GPU mode's code: slow).

Per case and side: the median over ``--rounds`` rounds of the mean of ``--calls`` calls, sides in turn within each
round (the host drifts). Writes ``DIR/host_time_small.json`` and ``DIR/host_time_small.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path


def _device_arg() -> str:
    """--device as given, else cuda where torch sees a GPU: read before torch is imported (the interpreter is
    switched on for the cpu mode first)."""
    if "--device" in sys.argv[:-1]:
        return sys.argv[sys.argv.index("--device") + 1]
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE = _device_arg()
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # the cpu variant's kernels (before triton is imported)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import load_packages  # noqa: E402

PACKAGES = ["triton-norms", "triton-attention", "triton-activations", "triton-softmax", "triton-matmul"]
_NOOP = "".format  # a C callable that takes any positional arguments: the stand-in launcher


def simulate_direct_launches(package) -> None:
    """Makes ``package``'s launches take the direct path with the no-op launcher (see the module docstring)."""
    fl = sys.modules[package.__name__ + "._fastlaunch"]
    fl._current_getter = lambda kernel, device: (lambda: device.index)
    fl._compile = lambda kernel, grid, args, meta, fixed=(): (_NOOP, (1, 2, 3, None, None, 4, None, None),
                                                             lambda index: 7, (*fixed, 1, 2), None)
    fl._hooks_off = lambda: True
    fl._direct = lambda kernel, device: True


def tensors(device: str) -> dict:
    """The inputs of every case (bf16; shapes of a SmolLM2 decode step and of issue 7's small calls)."""
    import torch

    torch.manual_seed(0)
    bf = torch.bfloat16

    def r(*shape):
        return torch.randn(*shape, dtype=bf, device=device)

    return dict(x1=r(1, 1, 576), w1=r(576), x16=r(16, 4096), w16=r(4096), b16=r(4096), q=r(1, 9, 1, 64),
                k=r(1, 3, 1, 64), cos=r(1, 1, 64), sin=r(1, 1, 64), cache=r(1, 3, 100, 64), gate_up=r(1, 1, 3072),
                gate=r(1, 1, 1536), up=r(1, 1, 1536), w_lin=r(1536, 576))


def cases(t: dict, norms, attention, activations, softmax, matmul) -> dict:
    """name -> a no-argument call of the packages on the inputs ``t`` (plain inference)."""
    import torch

    llama = norms.layers.LlamaRMSNorm()
    llama.weight, llama.variance_epsilon = torch.nn.Parameter(t["w1"]), 1e-5
    ln = norms.layers.LayerNorm()
    ln.weight, ln.bias, ln.eps, ln.normalized_shape = torch.nn.Parameter(t["w16"]), torch.nn.Parameter(t["b16"]), \
        1e-5, (4096,)
    silu = activations.layers.Silu()
    linear = matmul.layers.Linear()
    linear.weight, linear.bias = torch.nn.Parameter(t["w_lin"]), None
    q, k, cos, sin, cache, x16 = t["q"], t["k"], t["cos"], t["sin"], t["cache"], t["x16"]
    calls = {
        "rms_norm 16x4096": lambda: norms.rms_norm(x16, t["w16"], eps=1e-6),
        "LlamaRMSNorm layer 1x576": lambda: llama(t["x1"]),
        "layer_norm 16x4096 (w, b)": lambda: norms.layer_norm(x16, t["w16"], t["b16"], eps=1e-5),
        "LayerNorm layer 16x4096": lambda: ln(x16),
        "softmax 16x4096": lambda: softmax.softmax(x16),
        "silu_and_mul 1x3072": lambda: activations.silu_and_mul(t["gate_up"]),
        "Silu layer 1x1536": lambda: silu(t["gate"]),
        "apply_rotary_pos_emb decode 9/3 heads": lambda: attention.apply_rotary_pos_emb(q, k, cos, sin),
        "flash_attention decode 9/3 heads x 100 keys": lambda: attention.flash_attention(q, cache, cache,
                                                                                         out_layout="bshd"),
        "matmul 1x576 @ 576x1536": lambda: matmul.matmul(t["x1"][0], t["w_lin"].t()),
        "Linear layer 1x1x576 -> 1536": lambda: linear(t["x1"]),
    }
    # cases a base checkout may lack (its side then has no row for them)
    if hasattr(activations, "act_and_mul"):
        calls["act_and_mul 1x1536 (gate, up)"] = lambda: activations.act_and_mul(t["gate"], t["up"])
    if hasattr(activations.layers, "LlamaMLP") and t["x1"].is_cuda:  # on the CPU the matmuls would be timed
        mlp = _smollm2_mlp(t["x1"].device)
        calls["LlamaMLP layer 1x1x576 (576 -> 1536)"] = lambda: activations.layers.LlamaMLP.forward(mlp, t["x1"])
    return calls


def _smollm2_mlp(device):
    """transformers' LlamaMLP of SmolLM2-135M's sizes, bf16."""
    from types import SimpleNamespace

    import torch
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(0)
    config = SimpleNamespace(hidden_size=576, intermediate_size=1536, hidden_act="silu", mlp_bias=False)
    return LlamaMLP(config).to(device=device, dtype=torch.bfloat16)


def torch_cases(t: dict) -> dict:
    """The same names -> the PyTorch / transformers call each replaces (the peer on a GPU)."""
    import torch
    import torch.nn.functional as F
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    llama = LlamaRMSNorm(576, eps=1e-5).to(t["x1"].device, torch.bfloat16)
    ln = torch.nn.LayerNorm(4096, eps=1e-5).to(t["x16"].device, torch.bfloat16)
    q, k, cos, sin, cache, x16 = t["q"], t["k"], t["cos"], t["sin"], t["cache"], t["x16"]
    return {
        "rms_norm 16x4096": lambda: F.rms_norm(x16, (4096,), t["w16"], 1e-6),
        "LlamaRMSNorm layer 1x576": lambda: llama(t["x1"]),
        "layer_norm 16x4096 (w, b)": lambda: F.layer_norm(x16, (4096,), t["w16"], t["b16"], 1e-5),
        "LayerNorm layer 16x4096": lambda: ln(x16),
        "softmax 16x4096": lambda: torch.softmax(x16, -1),
        "silu_and_mul 1x3072": lambda: F.silu(t["gate_up"][..., :1536]) * t["gate_up"][..., 1536:],
        "Silu layer 1x1536": lambda: F.silu(t["gate"]),
        "apply_rotary_pos_emb decode 9/3 heads": lambda: apply_rotary_pos_emb(q, k, cos, sin),
        "flash_attention decode 9/3 heads x 100 keys": lambda: F.scaled_dot_product_attention(
            q, cache, cache, enable_gqa=True).transpose(1, 2).contiguous(),
        "matmul 1x576 @ 576x1536": lambda: t["x1"][0] @ t["w_lin"].t(),
        "Linear layer 1x1x576 -> 1536": lambda: F.linear(t["x1"], t["w_lin"]),
        "act_and_mul 1x1536 (gate, up)": lambda: F.silu(t["gate"]) * t["up"],
        "LlamaMLP layer 1x1x576 (576 -> 1536)": (lambda mlp=_smollm2_mlp(t["x1"].device): mlp(t["x1"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="")
    parser.add_argument("--device", default=DEVICE, choices=["cpu", "cuda"])
    parser.add_argument("--real", action="store_true", help="cpu: run the interpreter instead of the stand-in")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import torch
    import triton

    cuda, simulate = args.device == "cuda", args.device == "cpu" and not args.real
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    roots = {"new": Path(__file__).resolve().parents[1]}
    if args.base:
        roots["base"] = Path(args.base)
    inputs = tensors(args.device)
    sides = {}
    for side, root in roots.items():
        packages = load_packages(PACKAGES, cpu=not cuda, root=root)
        if simulate:
            for package in packages:
                simulate_direct_launches(package)
        sides[side] = cases(inputs, *packages)
    if cuda:
        sides["torch"] = torch_cases(inputs)
    results = {name: {side: [] for side in sides if name in sides[side]} for name in sides["new"]}
    with torch.no_grad():
        for fns in sides.values():
            for fn in fns.values():
                fn(), fn()  # plans built, kernels compiled
        sync()
        for _ in range(args.rounds):
            for name in results:
                for side in results[name]:
                    fn = sides[side][name]
                    sync()
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    sync()
                    results[name][side].append((time.perf_counter() - start) / args.calls * 1e6)
    table = {name: {side: statistics.median(v) for side, v in by_side.items()} for name, by_side in results.items()}
    where = (torch.cuda.get_device_name() if cuda else
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             + ("launcher simulated" if simulate else "Triton interpreter"))
    header = (f"Host time per call (us), {where}; torch {torch.__version__}, triton {triton.__version__}; "
              f"median of {args.rounds} rounds x {args.calls} calls{', then one synchronize' if cuda else ''}, "
              f"sides in turn")
    names = list(sides)
    ratios = [("new / base", "base")] * ("base" in sides) + [("new / torch", "torch")] * ("torch" in sides)
    lines = [header, "", "| call | " + " | ".join(names + [r for r, _ in ratios]) + " |",
             "|---|" + "---|" * (len(names) + len(ratios))]
    for name, row in table.items():
        cells = [f"{row[s]:.2f}" if s in row else "-" for s in names] + [
            f"{row['new'] / row[other]:.2f}" if other in row else "-" for _, other in ratios]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_time_small.md").write_text(text + "\n")
    (out / "host_time_small.json").write_text(json.dumps({"header": header, "us_per_call": table}, indent=1))


if __name__ == "__main__":
    main()
