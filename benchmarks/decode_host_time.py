"""Host time of a greedy decode step, eager against kernelize(ALL_FAMILIES), on the CPU with launches simulated.

    python3 benchmarks/decode_host_time.py [--layers N] [--steps N] [--rounds N] [--profile]

A tiny Llama (hidden 64, 4 / 2 heads, fp32) on the CPU: the kernelized copy's packages take their direct launch path
with a no-op launcher (``host_time_small.simulate_direct_launches``), so a step runs all the host code a GPU step
runs (transformers' Python, our checks and plans) except the launches themselves; outputs are not computed. The
eager copy runs its ATen ops on tiny CPU tensors. Per side: ``bench.wall_us_interleaved``, the median over
``--rounds`` rounds (sides in turn) of the mean time per step of ``--steps`` cached decode steps. ``--profile``: cProfile of the kernelized steps.
This host's step times move ~10% between runs: compare sides within one run, and single calls with
``host_time_small.py``. (Session 57: this found the e2e's rotary swap not running.)
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # the packages' cpu builds, before triton is imported
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    from triton_collection.bench import load_packages

    # first: it sets up an offline HF cache before huggingface_hub (kernels, transformers) is imported
    load_packages(["triton-norms", "triton-activations", "triton-attention"])
    import torch
    from kernels import Mode
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    import host_time_small
    from triton_collection.bench import wall_us_interleaved
    from triton_collection.integrations.families import ALL_FAMILIES
    from triton_collection.integrations.transformers import kernelize

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=args.layers, vocab_size=128, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ours = copy.deepcopy(eager)
    report = kernelize(ours, mode=Mode.INFERENCE, device="cpu", families=ALL_FAMILIES)
    swapped = sorted(set(report.swapped.values()))
    for name in [n for n in sys.modules if n.endswith("._fastlaunch")]:
        host_time_small.simulate_direct_launches(sys.modules[name.rsplit(".", 1)[0]])
    ids = torch.randint(3, 128, (1, 16), generator=torch.Generator().manual_seed(1))

    def stepper(model):
        cache = DynamicCache(config=config)
        with torch.no_grad():
            model(ids, past_key_values=cache, use_cache=True)
        token, position = ids[:, -1:], [ids.shape[1]]

        def step():
            with torch.no_grad():
                model(token, past_key_values=cache, use_cache=True, cache_position=torch.tensor(position))
            position[0] += 1
        return step

    sides = {"eager": eager, "kernelize": ours}
    # one call = one cached decode step; the cache grows by rounds x steps (+1) tokens
    per_step = wall_us_interleaved([stepper(model) for model in sides.values()], calls=args.steps, rounds=args.rounds)
    print(f"tiny Llama, {args.layers} layers, fp32, CPU, launches simulated; kernelize swapped {', '.join(swapped)}")
    medians = dict(zip(sides, per_step))
    for side, us in medians.items():
        print(f"{side}: {us:.1f} us per step ({us / args.layers:.1f} per layer)")
    print(f"eager / kernelize: {medians['eager'] / medians['kernelize']:.2f}")
    if args.profile:
        step = stepper(ours)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            step()
        profile.disable()
        pstats.Stats(profile).sort_stats("cumtime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
