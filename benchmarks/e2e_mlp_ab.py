"""The e2e decode with and without the gated-MLP swap, in turn, in one process (session 42's A/B).

    python3 benchmarks/e2e_mlp_ab.py --out DIR [--models smollm2-135m llama3-8b] [--rounds 2] [--device cuda]

Each round runs :func:`triton_collection.e2e.run_e2e` (batch 1: eager and kernelized, timed in alternation) once
with ``ALL_FAMILIES`` and once with the MLP families taken out, so the kernelized rows differ only by the MLP
layers; each run has its own eager rows (the host drifts between runs). Writes ``DIR/e2e_mlp_ab.json`` and prints one
line per run: eager and kernelized ms per step, the speedup, and whether the tokens matched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "llama3-8b"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from triton_collection import e2e
    from triton_collection.integrations import families

    everything = families.ALL_FAMILIES
    without_mlp = tuple(f for f in everything if f not in (families.GATED_MLP, families.GATE_UP_MLP))
    runs = []
    for r in range(args.rounds):
        for model in args.models:
            for label, fams in (("with MLP", everything), ("without MLP", without_mlp)) if r % 2 == 0 else \
                    (("without MLP", without_mlp), ("with MLP", everything)):
                families.ALL_FAMILIES = fams  # run_e2e imports the name when it runs
                try:
                    rows = e2e.run_e2e(model, batches=(1,), device=args.device, dtype=args.dtype)["rows"]
                finally:
                    families.ALL_FAMILIES = everything
                by = {row["variant"]: row for row in rows}
                eager, ours = by["eager"], by["kernelize"]
                runs.append(dict(round=r, model=model, swap=label, eager_ms=eager.get("ms_per_step"),
                                 ours_ms=ours.get("ms_per_step"), speedup=ours.get("speedup"),
                                 tokens_equal=ours.get("tokens_equal"), swapped=ours.get("swapped")))
                print(f"round {r} {model:13s} {label:12s} eager {eager.get('ms_per_step', float('nan')):6.2f} "
                      f"ours {ours.get('ms_per_step', float('nan')):6.2f} ms/step  x{ours.get('speedup', float('nan')):.3f} "
                      f"same tokens {ours.get('tokens_equal')}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e_mlp_ab.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
