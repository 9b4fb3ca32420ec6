"""triton-activations forward tiles (issue 3): tile bytes of one operand x threads per program, timed in
interleaved rounds on the GPU, each setting checked bitwise against the shipped one.

python3 benchmarks/activations_tile_sweep.py --out DIR [--rounds 3] [--cpu]

Settings are ``(gated tile bytes, plain tile bytes, threads of the plain forwards)``; ``shipped`` is the
package's (``_launch.GATED_TILE_BYTES``, ``TILE_BYTES``, ``PLAIN_THREADS``; gated rows wider than
``GATED_NARROW_ROW_BYTES`` keep ``TILE_BYTES``), ``previous`` the setting before 2026-12-01 (2 KiB
over 4 warps for every forward). Bytes: x read + y written. Records: DIR/tiles.jsonl; the table: stdout.
Results: ``results/activations_tiles_2026-12-01.md``.
"""

import argparse
import statistics
import sys

from sweep_common import ActivationInternals, Sweep, prepare

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--budget", type=float, default=300)
ap.add_argument("--cpu", action="store_true")
args = ap.parse_args()
OUT = prepare(args.out, args.cpu)
RUN = Sweep(OUT / "tiles.jsonl", args.budget, args.cpu, rep=25)

import torch  # noqa: E402

INTERNALS = ActivationInternals(args.cpu)
act, L = INTERNALS.pkg, INTERNALS.launch
DEV = RUN.dev
SHIPPED = (L.GATED_TILE_BYTES, L.TILE_BYTES, L.PLAIN_THREADS)
SETTINGS = {"shipped": SHIPPED, "previous": (2048, 2048, 128), "4 KiB x 4 warps": (4096, 4096, 128),
            "4 KiB x 8 warps": (4096, 4096, 256)}


def use(setting):
    """Sets the tiles and clears every cached launch plan and config."""
    L.GATED_TILE_BYTES, L.TILE_BYTES, L.PLAIN_THREADS = setting
    INTERNALS.reset_plans()


CASES = [("silu_and_mul", 65536, 1536), ("silu_and_mul", 16384, 1536), ("silu_and_mul", 8192, 11008),
         ("silu_and_mul", 4096, 14336), ("silu_and_mul", 16384, 14336), ("gelu_tanh_and_mul", 16384, 14336),
         ("gelu_tanh_and_mul", 65536, 1536), ("silu", 16384, 14336), ("gelu", 16384, 14336),
         ("gelu_tanh", 16384, 14336), ("gelu", 65536, 1536)] if DEV == "cuda" else [("silu_and_mul", 4, 1536),
                                                                                     ("gelu", 4, 1536)]
if DEV == "cuda":
    RUN.copy_ceiling()
for name, M, d in CASES:
    if RUN.left() < 10:
        break
    gated = name.endswith("_and_mul")
    x = torch.randn(M, 2 * d if gated else d, device=DEV, dtype=torch.bfloat16)
    f = getattr(act, name)
    use(SHIPPED)
    ref = f(x)
    times = {}
    for r in range(args.rounds):
        for label, setting in SETTINGS.items():
            use(setting)
            if r == 0 and not torch.equal(f(x), ref):  # tile sizes change no arithmetic
                RUN.log("MISMATCH", name, M, d, label)
                RUN.record(kind="check", op=name, shape=f"{M}x{d}", setting=label, ok=False)
            times.setdefault(label, []).append(RUN.bench(lambda: f(x)))
    use(SHIPPED)
    nb = (3 if gated else 2) * M * d * 2
    for label, ms in times.items():
        med = statistics.median(ms)
        RUN.record(kind="time", op=name, shape=f"{M}x{d}", setting=label, us=med * 1e3, gbps=nb / med / 1e6,
                   rounds=[t * 1e3 for t in ms])
        RUN.log(f"{name:18s} {M}x{d:<6d} {label:16s} {med * 1e3:8.1f} us {nb / med / 1e6:6.0f} GB/s "
                f"{[round(t * 1e3, 1) for t in ms]}")
RUN.log("done")
