"""Python host time per call of the small-call paths, on a machine without a GPU, A/B against a base checkout.

    python3 benchmarks/host_time_cpu.py --out DIR [--base DIR] [--rounds N] [--calls N]

The packages are built with their ``cpu`` variant and loaded side by side (``--base``: a checkout of the base
revision, ``git archive REV | tar -x -C DIR``). Under ``TRITON_INTERPRET=1`` nothing would launch directly, so
each package's ``_fastlaunch`` is made to take its direct path with a no-op C callable standing in for Triton's
compiled launcher: a call then runs everything a GPU call runs on the host (checks, plan lookups, allocations,
the launch path's Python) except the launcher itself (~4 us per launch on the H200 host) and the GPU allocator.
Outputs are not computed: this times host code only, it checks nothing.

Per case and side: the median over ``--rounds`` rounds of the mean of ``--calls`` calls, sides in turn within each
round (the host drifts). Writes ``DIR/host_time_cpu.json`` and ``DIR/host_time_cpu.md``.
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

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the cpu variant's kernels

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


def cases(norms, attention, activations, softmax, matmul) -> dict:
    """name -> a no-argument call (bf16, plain inference; shapes of a SmolLM2 decode step and of issue 7's small
    calls)."""
    import torch

    bf = torch.bfloat16
    x1, w1 = torch.randn(1, 1, 576, dtype=bf), torch.randn(576, dtype=bf)
    x16, w16, b16 = torch.randn(16, 4096, dtype=bf), torch.randn(4096, dtype=bf), torch.randn(4096, dtype=bf)
    llama = norms.layers.LlamaRMSNorm()
    llama.weight, llama.variance_epsilon = torch.nn.Parameter(w1), 1e-5
    ln = norms.layers.LayerNorm()
    ln.weight, ln.bias, ln.eps, ln.normalized_shape = torch.nn.Parameter(w16), torch.nn.Parameter(b16), 1e-5, (4096,)
    q, k = torch.randn(1, 9, 1, 64, dtype=bf), torch.randn(1, 3, 1, 64, dtype=bf)
    cos, sin = torch.randn(1, 1, 64, dtype=bf), torch.randn(1, 1, 64, dtype=bf)
    cache = torch.randn(1, 3, 100, 64, dtype=bf)
    gate_up, gate = torch.randn(1, 1, 3072, dtype=bf), torch.randn(1, 1, 1536, dtype=bf)
    silu = activations.layers.Silu()
    linear = matmul.layers.Linear()
    linear.weight, linear.bias = torch.nn.Parameter(torch.randn(1536, 576, dtype=bf)), None
    return {
        "rms_norm 16x4096": lambda: norms.rms_norm(x16, w16, eps=1e-6),
        "LlamaRMSNorm layer 1x576": lambda: llama(x1),
        "layer_norm 16x4096 (w, b)": lambda: norms.layer_norm(x16, w16, b16, eps=1e-5),
        "LayerNorm layer 16x4096": lambda: ln(x16),
        "softmax 16x4096": lambda: softmax.softmax(x16),
        "silu_and_mul 1x3072": lambda: activations.silu_and_mul(gate_up),
        "Silu layer 1x1536": lambda: silu(gate),
        "apply_rotary_pos_emb decode 9/3 heads": lambda: attention.apply_rotary_pos_emb(q, k, cos, sin),
        "flash_attention decode 9/3 heads x 100 keys": lambda: attention.flash_attention(q, cache, cache,
                                                                                         out_layout="bshd"),
        "matmul 1x576 @ 576x1536": lambda: matmul.matmul(x1[0], linear.weight.t()),
        "Linear layer 1x1x576 -> 1536": lambda: linear(x1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    import torch
    import triton

    roots = {"new": Path(__file__).resolve().parents[1]}
    if args.base:
        roots["base"] = Path(args.base)
    sides = {}
    for side, root in roots.items():
        packages = load_packages(PACKAGES, cpu=True, root=root)
        for package in packages:
            simulate_direct_launches(package)
        sides[side] = cases(*packages)
    results = {name: {side: [] for side in sides} for name in sides["new"]}
    with torch.no_grad():
        for fns in sides.values():
            for fn in fns.values():
                fn(), fn()  # plans built, first launches "compiled"
        for _ in range(args.rounds):
            for name in results:
                for side, fns in sides.items():
                    fn = fns[name]
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    results[name][side].append((time.perf_counter() - start) / args.calls * 1e6)
    table = {name: {side: statistics.median(v) for side, v in by_side.items()} for name, by_side in results.items()}
    header = (f"Host time per call (us), launcher simulated, {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs; torch {torch.__version__}, triton {triton.__version__}; "
              f"median of {args.rounds} rounds x {args.calls} calls, sides in turn")
    lines = [header, "", "| call | " + " | ".join(sides) + (" | new / base |" if "base" in sides else " |"),
             "|---|" + "---|" * (len(sides) + ("base" in sides))]
    for name, row in table.items():
        ratio = f" {row['new'] / row['base']:.2f} |" if "base" in row else ""
        lines.append(f"| {name} | " + " | ".join(f"{row[s]:.2f}" for s in sides) + " |" + ratio)
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_time_cpu.md").write_text(text + "\n")
    (out / "host_time_cpu.json").write_text(json.dumps({"header": header, "us_per_call": table}, indent=1))


if __name__ == "__main__":
    main()
