"""Wide-row team forwards of rms_norm / layer_norm (issue 7): what the per-row weight and bias loads cost, and the
team settings that load them elsewhere (``_wide``'s ``AFFINE``: 0 after the team meets, 1 before it waits, 2 once per
program; ``HOLD``: x waits for the meeting in bf16), with the register caps each needs (the registers and spill bytes
of each new binary follow its first row, in brackets). Session 32: results/session32_2026-12-04.txt. Session 20: results/norms_wide_affine_2026-12-02.txt.

    python3 benchmarks/norms_wide_affine_sweep.py [--rounds 2] [--weights-only]      (GPU)
    python3 benchmarks/norms_wide_affine_sweep.py --rms 4/1/12/168/1,4/1/10/184/0 [--widths 65536] [--no-ln]
    python3 benchmarks/norms_wide_affine_sweep.py --ln 2/1/20/96/0,4/2/8/128/1 [--widths 65536,131072] [--no-rms]
    python3 benchmarks/norms_wide_affine_sweep.py --ln-bwd 4/4/4/128,8/8/2/128 [--widths 16384,65536]
    python3 benchmarks/norms_wide_affine_sweep.py --rms-bwd 8/4/3/168h,4/2/8/128h [--widths 16384,65536]

``--weights-only``: rms_norm / layer_norm at 4096 x 65536 with and without their weight (and bias), shipped settings.
``--rms`` / ``--ln``: rms_norm / layer_norm single-tier settings CHUNK_KiB/WARPS/PER_SM/MAXNREG/AFFINE[/FP_FUSION[/HOLD]]
(FP_FUSION 1: contract a * b + c, ``_team.TeamPlan.fp_fusion``; HOLD 1: x held in bf16 while the team meets; the layer_norm teams of a swept setting meet on one pair word at
every size, the shipped tiers only up to their ``pair_max_team``) instead of the
tables below (session 21's sweep around the shipped 4 KiB tier); ``--widths`` picks the row widths (M = 2^28 / N;
layer_norm runs at 65536 only unless ``--ln`` is given).
Otherwise every setting below against ``shipped`` (the package's) and ``previous`` (session 15's tiers) at
4096 x 65536, 2048 x 131072 and 1024 x 262144 (layer_norm: 4096 x 65536), settings interleaved per round.
Timing: CUDA-graph medians (``triton_collection.bench.graph_median``, rep 100 ms); GB/s count x read and y written
(4 bytes per bf16 element). ``--ln-bwd``: the layer_norm backward op alone (dy, x read, dx written: 6 bytes per
element; dw / db partials not counted) on team settings CHUNK_KiB/WARPS/PER_SM/MAXNREG[/PAIR_MAX_TEAM] (session 24;
the pair-word limit since session 31), M = 2^28 / N; ``--rms-bwd`` the same for rms_norm; a trailing ``h`` holds dy, x
and w in bf16 while a team meets (session 45).
Each output is compared bit for bit with the shipped setting's (``same`` / ``DIFFERENT``:
another chunk size sums in another fp32 order, the free-order kernels' expected difference) and with fp64.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sweep_common import load_packages  # noqa: E402


def setting(chunk, warps, per_sm, regs, affine, max_team=None, fp_fusion=0, hold=0):
    s = {"min_row_bytes": 65537, "chunk_bytes": chunk, "num_warps": warps, "programs_per_sm": per_sm,
         "maxnreg": regs, "affine": affine, "fp_fusion": bool(fp_fusion), "hold": bool(hold)}
    return s if max_team is None else dict(s, max_team=max_team)


PREVIOUS_RMS = [setting(4096, 1, 16, 128, 0, 64), setting(8192, 2, 8, 128, 0)]
RMS = {"previous": PREVIOUS_RMS,
       "4K w1 16 r128 a1": [setting(4096, 1, 16, 128, 1)], "4K w1 16 r128 a2": [setting(4096, 1, 16, 128, 2)],
       "4K w1 12 r168 a1": [setting(4096, 1, 12, 168, 1)], "4K w1 12 r168 a2": [setting(4096, 1, 12, 168, 2)],
       "4K w2 8 r128 a1": [setting(4096, 2, 8, 128, 1)], "4K w2 8 r128 a2": [setting(4096, 2, 8, 128, 2)],
       "8K w4 4 r128 a2": [setting(8192, 4, 4, 128, 2)], "2K w1 16 r128 a2": [setting(2048, 1, 16, 128, 2)],
       "8K w2 8 r128 a1": [setting(8192, 2, 8, 128, 1)], "8K w2 6 r168 a2": [setting(8192, 2, 6, 168, 2)]}
LN = {"8K w4 5 r96 a1": [setting(8192, 4, 5, 96, 1)], "8K w4 5 r96 a2": [setting(8192, 4, 5, 96, 2)],
      "8K w4 4 r128 a1": [setting(8192, 4, 4, 128, 1)], "8K w4 4 r128 a2": [setting(8192, 4, 4, 128, 2)],
      "4K w2 8 r128 a1": [setting(4096, 2, 8, 128, 1)], "4K w2 8 r128 a2": [setting(4096, 2, 8, 128, 2)],
      "4K w1 16 r128 a1": [setting(4096, 1, 16, 128, 1)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--weights-only", action="store_true")
    ap.add_argument("--rms", help="CHUNK_KiB/WARPS/PER_SM/MAXNREG/AFFINE[/FP_FUSION[/HOLD]],... (replaces the RMS table)")
    ap.add_argument("--widths", default="65536,131072,262144")
    ap.add_argument("--ln", help="CHUNK_KiB/WARPS/PER_SM/MAXNREG/AFFINE[/FP_FUSION[/HOLD]],... (replaces the LN table)")
    ap.add_argument("--no-ln", action="store_true", help="skip the layer_norm settings")
    ap.add_argument("--ln-bwd", help="CHUNK_KiB/WARPS/PER_SM/MAXNREG[/PAIR_MAX_TEAM][h],... : time the layer_norm "
                    "backward on these (teams of more than PAIR_MAX_TEAM members meet on two words; default: one; h: "
                    "held in bf16, as --rms-bwd)")
    ap.add_argument("--rms-bwd", help="CHUNK_KiB/WARPS/PER_SM/MAXNREG[h],... : time the rms_norm backward on these "
                    "(h: dy, x and w held in bf16 while the team meets, the kernels' HOLD)")
    ap.add_argument("--no-rms", action="store_true", help="skip the rms_norm settings")
    args = ap.parse_args()

    def table_of(specs):
        table = {}
        for spec in specs.split(","):
            kib, warps, per_sm, regs, affine, *rest = map(int, spec.split("/"))
            fuse, hold = (rest + [0, 0])[:2]
            table[f"{kib}K w{warps} {per_sm} r{regs} a{affine}{' f' if fuse else ''}{' h' if hold else ''}"] = [
                setting(kib * 1024, warps, per_sm, regs, affine, fp_fusion=fuse, hold=hold)]
        return table

    rms_table = {"previous": PREVIOUS_RMS, **table_of(args.rms)} if args.rms else RMS
    ln_table = table_of(args.ln) if args.ln else LN
    from triton_collection.bench import graph_median

    (nm,) = load_packages(["triton-norms"], cpu=False)
    wide = sys.modules[nm.__name__ + "._wide"]
    shipped = {k: v for k, v in wide.WIDE_TUNED.items()}
    print(torch.cuda.get_device_name(), torch.__version__, __import__("triton").__version__, flush=True)

    seen = set()

    def new_compiles(kernel) -> str:
        """Registers and spill bytes of the ``kernel`` binaries compiled since the last call (Triton's cache)."""
        out = []
        try:
            for cache in kernel.device_caches.values():
                for key, c in cache[0].items():
                    if key not in seen:
                        seen.add(key)
                        out.append(f"r{getattr(c, 'n_regs', '?')}/spill{getattr(c, 'n_spills', '?')}")
        except (AttributeError, IndexError, TypeError):  # another Triton's cache layout: no report
            return ""
        return f" [{' '.join(out)}]" if out else ""

    def timed(label, fn, nbytes):
        ms = graph_median(fn, rep=100)
        print(f"{label} {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s", end="", flush=True)

    if args.ln_bwd or args.rms_bwd:
        for kind, specs in (("rms_norm", args.rms_bwd), ("layer_norm", args.ln_bwd)):
            if specs:
                norm_bwd(nm, wide, kind, specs, args, timed)
        return
    if args.weights_only:
        M, N = 4096, 65536
        x, w, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((M, N), (N,), (N,)))
        cases = {"rms w": lambda: nm.rms_norm(x, w), "rms no w": lambda: nm.rms_norm(x, None),
                 "ln w b": lambda: nm.layer_norm(x, w, b), "ln w": lambda: nm.layer_norm(x, w, None),
                 "ln none": lambda: nm.layer_norm(x, None, None)}
        for rnd in range(args.rounds):
            for name, fn in cases.items():
                fn()
                timed(f"round {rnd} {name:10s}", fn, 4 * M * N)
                print()
        return
    for rnd in range(args.rounds):
        for N in map(int, args.widths.split(",")):
            M = 2**28 // N
            x, w, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((M, N), (N,), (N,)))
            kinds = [] if args.no_rms else [
                ("rms_norm", rms_table, lambda: nm.rms_norm(x, w),
                 x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double())]
            if (N == 65536 or args.ln) and not args.no_ln:
                kinds.append(("layer_norm", ln_table, lambda: nm.layer_norm(x, w, b),
                              torch.nn.functional.layer_norm(x.double(), (N,), w.double(), b.double(), 1e-5)))
            for kind, table, fn, ref in kinds:
                want = None
                for name, tiers in {"shipped": None, **table}.items():
                    wide.WIDE_TUNED[kind] = shipped[kind] if tiers is None else tiers
                    try:
                        y = fn()
                        want = y if want is None else want
                        err = ((y.double() - ref).abs() / (ref.abs() + 1e-2)).max().item()
                        timed(f"round {rnd} {kind:10s} {M}x{N:<7d} {name:18s}", fn, 4 * M * N)
                        kernel = wide._rms_team_fwd_kernel if kind == "rms_norm" else wide._ln_team_fwd_kernel
                        compiled = new_compiles(kernel)
                        print(f" {'same' if torch.equal(y, want) else 'DIFFERENT'} err {err:.1e}{compiled}", flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"round {rnd} {kind} {M}x{N} {name} ERR {type(e).__name__}: {str(e)[:200]}", flush=True)
                    finally:
                        wide.WIDE_TUNED[kind] = shipped[kind]
            del x


def norm_bwd(nm, wide, kind, specs, args, timed):
    """The ``kind`` backward op alone (``rms_norm`` / ``layer_norm``) on each setting of ``specs`` against the shipped
    one, rounds interleaved; every dx compared bit for bit with the shipped setting's."""
    mod = sys.modules[f"{nm.__name__}.{kind}"]
    order = sys.modules[nm.__name__ + "._torch_order"].ORDER_FAST
    shipped = wide.WIDE_TUNED[kind + "_bwd"]
    first = shipped[0] if isinstance(shipped, (list, tuple)) else shipped
    table = {"shipped": shipped}
    for spec in specs.split(","):
        hold = spec.endswith("h")
        kib, warps, per_sm, regs, *pair = map(int, spec.rstrip("h").split("/"))
        s = {"min_row_bytes": first["min_row_bytes"], "chunk_bytes": kib * 1024, "num_warps": warps,
             "programs_per_sm": per_sm, "maxnreg": regs, "hold": hold}
        table[f"{kib}K w{warps} {per_sm} r{regs}{f' p{pair[0]}' if pair else ''}{' h' if hold else ''}"] = (
            dict(s, pair_max_team=pair[0]) if pair else s)
    bf16 = torch.bfloat16
    for rnd in range(args.rounds):
        for N in map(int, args.widths.split(",")):
            M = 2**28 // N
            torch.manual_seed(0)
            x, w, dy = (torch.randn(*s, device="cuda", dtype=bf16) for s in ((M, N), (N,), (M, N)))
            if kind == "rms_norm":
                rstd = mod._rms_norm_fwd_impl(x, None, w, None, 1e-6, 0.0, None, bf16, order)[2]
                fn = lambda: mod._rms_norm_bwd_impl(dy, None, x, w, rstd, 0.0, None, bf16, None, True, None)  # noqa: E731
            else:
                b = torch.zeros(N, device="cuda", dtype=bf16)
                _, _, mean, rstd = mod._layer_norm_fwd_impl(x, None, w, b, 1e-5, order)
                fn = lambda: mod._layer_norm_bwd_impl(dy, None, x, w, mean, rstd, bf16, None, True, bf16)  # noqa: E731
            want = None
            for name, s in table.items():
                wide.WIDE_TUNED[kind + "_bwd"] = s
                try:
                    out = fn()
                    dx, dw = out[0], out[2]  # (dx, dres, dw, db)
                    want = (dx, dw) if want is None else want
                    timed(f"round {rnd} {kind[:3]}_bwd {M}x{N:<7d} {name:20s}", fn, 6 * M * N)
                    same = torch.equal(dx, want[0]) and torch.equal(dw, want[1])
                    print(f" {'same' if same else 'DIFFERENT'} dx max diff "
                          f"{(dx.float() - want[0].float()).abs().max().item():.1e}", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"round {rnd} {kind}_bwd {M}x{N} {name} ERR {type(e).__name__}: {str(e)[:200]}", flush=True)
                finally:
                    wide.WIDE_TUNED[kind + "_bwd"] = shipped


if __name__ == "__main__":
    main()
