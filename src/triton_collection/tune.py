"""``triton-collection tune``: measure triton-matmul tile configs on this GPU and write its config file.

    triton-collection tune [--shape M,N,K ...] [--candidates FILE] [--out FILE] [--budget-s S] [--rep-ms MS]
                           [--epilogue NAME] [--update [--min-gain G]]

For every bucket shape (default: :data:`DEFAULT_BUCKETS`, Llama-3-8B and Flux projections from one
token to 16K tokens) each candidate config (default: :func:`default_candidates`, chosen by M; or a JSON file
holding a list of config objects, or ``{"<M>": [...]}`` per bucket M) is run on bf16 operands in the
``nn.Linear`` layout (``x @ W.T``, W read transposed in place), checked against ``torch.matmul`` and
timed; the fastest correct one becomes the bucket's entry. The file is written in the format
``triton_matmul/_launch.py`` reads (``configs/<GPU name>.json``, spaces as ``_``), with
``"tuned": true`` and, per bucket, the measured TFLOP/s of the winner and of ``torch.matmul``
(cuBLAS on NVIDIA) in the same process. A winner whose pipeline did not fit shared memory ran with fewer
stages (the launcher's fallback, ``matmul._launch_fitting``): the entry records the stages that ran.

Timing: ``triton.testing.do_bench_cudagraph`` (median of CUDA-graph replays, so Python launch cost is
excluded for both sides; L2 is not flushed between replays, for both sides alike), else
``do_bench``. FLOPs = 2 * M * N * K. The kernel package is built from this checkout and loaded with
``kernels.get_local_kernel``, as users load it.

``--epilogue NAME`` (an activation of ``matmul``: gelu, gelu_tanh, silu, relu, geglu, swiglu) measures
``matmul(x, W.T, bias, NAME)`` instead (W of (2N, K) for the gated ones, N output columns), against PyTorch's
``F.linear`` followed by the activation, and writes the winners as ``"epilogue": NAME`` entries, which the
lookup prefers for calls with that activation (``_launch``).

``--update`` merges into the existing ``--out`` file instead of replacing it: for each measured bucket the
config that file gives the call now (its entry for the bucket, else what its nearest bucket gives) is timed
first; a faster candidate replaces it, or is added as a new entry, only when a re-timing of the two
(interleaved, the better of two medians each) confirms a gain of at least ``--min-gain`` (default 3%).
Every other entry is kept as it is, and so is the file's note.

``--out`` must be this GPU's file or a new one: a file of another GPU (its ``"gpu"``, ``default`` included) is
refused before anything is measured, since its lookup would serve that GPU with this one's timings.

Needs a GPU; the budget (``--budget-s``) stops measuring new candidates when spent, and buckets
with no measurement are left out of the file (``_launch`` picks the nearest remaining bucket).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from .argtypes import non_negative_float, positive_float
from .scratch import scratch_dir

__all__ = ["DEFAULT_BUCKETS", "EPILOGUES", "BucketResult", "add_parser", "default_candidates", "load_matmul",
           "measure", "torch_forward", "tune", "write_config_file"]

DEVICE = "cuda"  # the device tune() measures on
# --epilogue: the activation names of triton-matmul (its ``_launch.EPILOGUES``); gated ones -> their activation
EPILOGUES = ("gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu")
GATED = {"geglu": "gelu", "swiglu": "silu"}

# (M, N, K): M tokens (1 ... 16384) x the projections of Llama-3-8B (q/o 4096x4096, qkv 6144x4096, gate_up
# 2x14336x4096, down 4096x14336) and Flux (3072x3072, 12288x3072, 3072x12288); the log2-nearest bucket serves
# every other shape. Ordered (N, K) first, so that a budget cut still leaves every M covered at 4096x4096.
BUCKET_NK = [(4096, 4096), (28672, 4096), (4096, 14336), (12288, 3072), (3072, 12288), (6144, 4096), (3072, 3072)]
BUCKET_M = [1, 16, 64, 256, 1024, 4096, 16384]
DEFAULT_BUCKETS = [(m, n, k) for (n, k) in BUCKET_NK for m in BUCKET_M]


def default_candidates(M: int) -> list[dict]:
    """Candidate configs (JSON dicts, ``_launch`` keys) for buckets with M rows, TMA kernel first."""
    def c(bm, bn, bk, g, w, s, tma=1, pers=0, ws=0, sub=0, split=1, gemv=0, sk=0, sub_n=1, gluon=0):
        return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g, "num_warps": w, "num_stages": s,
                "TMA": tma, "PERSISTENT": pers, "WARP_SPECIALIZE": ws, "EPILOGUE_SUBTILE": sub, "SPLIT_K": split,
                "GEMV": gemv, "STREAM_K": sk, "SUB_N": sub_n, "GLUON": gluon}
    # chosen from the H200 sweeps (2026-11-30): earlier winners plus the GEMV kernel for one token, split-K and
    # stream-K for tile counts that fill the 132 SMs unevenly, two programs per SM (PERSISTENT 2), and 192-wide
    # tiles (SUB_N 3 x 64 columns: N = 3072 at M = 1024 makes 128 tiles of 128 x 192 where 128 x 256 makes 96)
    G = lambda bn, bk, w, s: c(16, bn, bk, 1, w, s, gemv=1)  # noqa: E731
    if M <= 1:  # weight streaming: many programs of a few W rows each (GEMV), or narrow tensor-core tiles
        return [G(4, 512, 4, 1), G(8, 512, 4, 1), G(2, 1024, 4, 1), G(4, 1024, 4, 1), G(8, 256, 4, 1),
                c(16, 32, 128, 1, 4, 4, tma=0)]
    if M <= 16:
        return [c(16, 32, 256, 1, 4, 4), c(16, 64, 256, 1, 4, 4), c(16, 128, 128, 1, 4, 4, split=4),
                c(16, 32, 128, 1, 4, 6)]
    # and (session 35) the sm_90 Gluon kernel at M = 64 / 256, ping-pong (GLUON 2) with deep rings: where the GPU is
    # not sm_90 these run as the TMA kernel with the same tiles, and lose
    if M <= 64:
        return [c(64, 32, 128, 8, 4, 6), c(64, 64, 128, 8, 4, 4), c(64, 128, 64, 8, 4, 4, split=2),
                c(64, 128, 64, 8, 4, 4, pers=2, sk=1), c(64, 64, 64, 8, 4, 4, split=2),
                c(64, 64, 128, 8, 4, 6, gluon=2), c(64, 128, 64, 8, 4, 6, gluon=2)]
    if M <= 256:
        return [c(64, 128, 64, 8, 4, 5), c(64, 128, 64, 8, 4, 4), c(64, 64, 64, 8, 4, 4), c(128, 128, 64, 8, 8, 3),
                c(128, 128, 64, 8, 8, 4, pers=1, sk=1), c(64, 128, 64, 8, 4, 4, pers=2, sk=1),
                c(128, 256, 64, 8, 8, 4, pers=1, sub=1), c(64, 128, 64, 8, 4, 8, gluon=2),
                c(128, 64, 64, 8, 4, 8, gluon=2), c(128, 128, 64, 8, 4, 6, gluon=1)]
    if M <= 1024:
        return [c(128, 256, 64, 8, 8, 4, pers=1, sub=1), c(128, 128, 64, 8, 8, 3, pers=2, sub=1),
                c(128, 256, 64, 8, 8, 4, pers=1, sub=1, sk=1), c(64, 128, 64, 8, 4, 4), c(128, 128, 64, 8, 8, 3),
                c(128, 64, 64, 8, 8, 4, pers=1, sub_n=3)]
    return [c(128, 256, 64, 8, 8, 4, pers=1, sub=1), c(128, 256, 64, 16, 8, 3, pers=1, sub=1)]


def load_matmul(root: Path):
    """triton-matmul built from the checkout at ``root`` and loaded by ``kernels`` for this machine's backend."""
    import kernels
    import torch

    from .build import build_collection
    from .manifest import load_manifest

    out = scratch_dir("triton-matmul-tune-") / "hub"
    built = build_collection(load_manifest(root), out, packages=["triton-matmul"], cpu_variant=True)[0]
    if torch.cuda.is_available():
        backend = "rocm" if torch.version.hip else "cuda"
    else:
        backend = "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cpu"
    return kernels.get_local_kernel(built.variant(backend))


def torch_forward(a, b, bias, epilogue: Optional[str]):
    """What ``matmul(a, b, bias, epilogue)`` computes, in eager PyTorch: ``F.linear`` (cuBLAS on NVIDIA) then the
    activation; gated: ``p, g = h.chunk(2, -1); p * act(g)`` (diffusers' GEGLU / SwiGLU)."""
    import torch.nn.functional as F

    acts = {None: lambda x: x, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
            "relu": F.relu}
    h = F.linear(a, b.t(), bias)
    if epilogue in GATED:
        p, g = h.chunk(2, -1)
        return p * acts[GATED[epilogue]](g)
    return acts[epilogue](h)


def _bench(fn: Callable[[], object], rep_ms: float) -> float:
    """Median milliseconds of ``fn`` (CUDA-graph replays where possible)."""
    from triton.testing import do_bench, do_bench_cudagraph

    fn()
    try:
        return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    except Exception:  # noqa: BLE001 - e.g. a backend without graphs: eager timing instead
        return float(do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"))


def _stages_run(fitting: dict, before: dict, cfg) -> Optional[int]:
    """The pipeline depth the launcher ran ``cfg`` with (``matmul._FITTING_STAGES``: the stages that fitted
    shared memory, per launch key) when that is fewer than ``cfg.num_stages``, else None. ``before``: the
    table before the candidate's first call (its new or changed keys are its launches; a config met before
    is found by its key's config)."""
    ran = [v for k, v in fitting.items() if before.get(k) != v] or [v for k, v in fitting.items() if k[1] == cfg]
    return min(ran) if ran and min(ran) < cfg.num_stages else None


def measure(mm, a, b, config: Optional[dict], rep_ms: float = 30.0, reference=None, bias=None,
            epilogue: Optional[str] = None) -> dict:
    """Time ``mm.matmul(a, b, bias, epilogue, config=...)`` (``config`` None: :func:`torch_forward`, i.e.
    cuBLAS then the separate activation) and check it against ``reference``.

    Returns ``{"ms", "tflops", "max_rel_err"}`` (relative to ``reference``'s largest magnitude; TFLOP/s of the
    GEMM, 2 * M * b's columns * K), with ``"stages_run"`` when the config's pipeline did not fit shared memory
    and ran with fewer stages (written to the config file instead of the stages asked for), or
    ``{"error": ...}`` when the config does not compile or run.
    """
    M, K = a.shape
    N = b.shape[1]
    fitting = getattr(sys.modules.get(getattr(mm, "__name__", "") + ".matmul"), "_FITTING_STAGES", {})
    before = dict(fitting)
    cfg = None
    if config is None:
        fn = lambda: torch_forward(a, b, bias, epilogue)  # noqa: E731
    else:
        cfg = mm.MatmulConfig.from_json(config)
        fn = lambda: mm.matmul(a, b, bias, epilogue, config=cfg)  # noqa: E731
    try:
        y = fn()
        stages = None if cfg is None else _stages_run(fitting, before, cfg)
        err = None
        if reference is not None:
            err = float((y.float() - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
        ms = _bench(fn, rep_ms)
    except Exception as exc:  # noqa: BLE001 - a config that does not compile/run is reported, not fatal
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"}
    return {"ms": ms, "tflops": 2.0 * M * N * K / (ms * 1e-3) / 1e12, "max_rel_err": err,
            **({"stages_run": stages} if stages is not None else {})}


@dataclass
class BucketResult:
    shape: tuple
    cublas: dict
    candidates: list = field(default_factory=list)  # (config dict, measure dict)
    best: Optional[dict] = None
    best_measure: Optional[dict] = None
    epilogue: Optional[str] = None  # the activation measured (None: plain GEMM)
    incumbent: Optional[dict] = None  # the config the existing file gives this bucket (tune(incumbent=...))
    gain: Optional[float] = None  # re-timed speedup of the best challenger over the incumbent, minus 1

    @property
    def improves(self) -> bool:
        """A measured winner that is not the incumbent (with an incumbent: confirmed by the re-timing)."""
        return self.best is not None and self.best is not self.incumbent


def _same_config(mm, c1: dict, c2: dict) -> bool:
    return mm.MatmulConfig.from_json(c1) == mm.MatmulConfig.from_json(c2)


def _retime(fns: list, rep_ms: float) -> list:
    """Per function the better of two medians, timed interleaved (a clock or scheduling hiccup hits one median)."""
    first = [_bench(fn, rep_ms) for fn in fns]
    return [min(t, _bench(fn, rep_ms)) for t, fn in zip(first, fns)]


def tune(mm, buckets: Iterable[tuple], candidates: Callable[[int], list], *, rep_ms: float = 30.0,
         budget_s: float = 200.0, tolerance: float = 2e-2, log=print,
         on_bucket: Optional[Callable[[list], None]] = None, cublas: bool = True, epilogue: Optional[str] = None,
         incumbent: Optional[Callable[[tuple], Optional[dict]]] = None,
         min_gain: float = 0.0) -> list[BucketResult]:
    """Measure every candidate of every bucket (bf16, ``x @ W.T``); the fastest correct one wins.

    A candidate is correct when its largest error is below ``tolerance`` times the reference's
    largest magnitude (bf16 output rounding is 2^-8; a wrong tile or edge is off by O(1)).

    ``epilogue``: an activation name (:data:`EPILOGUES`): every call adds a bias and fuses the activation; b has
    2N columns for a gated one (N output columns, the bucket's N). ``incumbent(shape)``: the config now serving
    the bucket (or None), timed first; the best challenger replaces it only when a re-timing of both confirms a
    speedup of at least ``min_gain`` (``BucketResult.gain``) or the incumbent fails (error, wrong values), else
    the incumbent stays the bucket's best.
    """
    import torch

    start = time.monotonic()
    results = []
    for M, N, K in buckets:
        if time.monotonic() - start > budget_s:
            log(f"budget spent: bucket {(M, N, K)} and later ones not measured")
            break
        gen = torch.Generator(device=DEVICE).manual_seed(M * 31 + N * 7 + K)
        n_total = 2 * N if epilogue in GATED else N
        a = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n_total, K, device=DEVICE, dtype=torch.bfloat16, generator=gen) * (1.0 / math.sqrt(K))
        b = w.t()
        bias = None
        if epilogue is not None:
            bias = torch.randn(n_total, device=DEVICE, dtype=torch.bfloat16, generator=gen) * 0.1
        reference = torch_forward(a.float(), b.float(), bias.float() if bias is not None else None, epilogue)
        res = BucketResult((M, N, K), measure(mm, a, b, None, rep_ms, None, bias, epilogue) if cublas else {},
                           epilogue=epilogue, incumbent=incumbent((M, N, K)) if incumbent is not None else None)
        cands = list(candidates(M))
        if res.incumbent is not None:
            cands = [res.incumbent] + [c for c in cands if not _same_config(mm, c, res.incumbent)]
        incumbent_ok = False
        for cfg in cands:
            if time.monotonic() - start > budget_s:
                break
            m = measure(mm, a, b, cfg, rep_ms, reference, bias, epilogue)
            res.candidates.append((cfg, m))
            ok = "error" not in m and m["max_rel_err"] is not None and m["max_rel_err"] < tolerance
            incumbent_ok = incumbent_ok or (ok and cfg is res.incumbent)
            if ok and (res.best_measure is None or m["ms"] < res.best_measure["ms"]):
                res.best, res.best_measure = cfg, m
        if incumbent_ok and res.best is not res.incumbent:
            fns = [lambda c=mm.MatmulConfig.from_json(c): mm.matmul(a, b, bias, epilogue, config=c)
                   for c in (res.incumbent, res.best)]
            t_inc, t_best = _retime(fns, rep_ms)
            res.gain = t_inc / t_best - 1.0
            if res.gain < min_gain:
                res.best, res.best_measure = res.incumbent, res.candidates[0][1]
        cub = res.cublas.get("tflops")
        tag = f"{(M, N, K)}{' ' + epilogue if epilogue else ''}"
        if res.best is not None:
            kept = "" if res.incumbent is None else (
                f" [{'replaces' if res.improves else 'kept'} the incumbent"
                + (f", re-timed gain {res.gain:+.1%}]" if res.gain is not None else "]"))
            log(f"{tag}: {res.best_measure['tflops']:.1f} TFLOP/s (PyTorch {cub or float('nan'):.1f}) "
                f"{time.monotonic() - start:.1f}s {res.best}{kept}")
        else:
            log(f"{tag}: no correct candidate: {[m for _, m in res.candidates]}")
        results.append(res)
        del a, w, b, bias, reference
        if on_bucket is not None:  # e.g. write the file so far: a run killed later still leaves its results
            on_bucket(results)
    return results


def _entry_key(entry: dict) -> tuple:
    return entry["M"], entry["N"], entry["K"], entry.get("epilogue")


def write_config_file(path: Path, gpu: str, results: list[BucketResult], meta: Optional[dict] = None,
                      base: Optional[dict] = None) -> dict:
    """Write the winners as a ``_launch`` config file; returns the written object.

    ``base``: an existing file's parsed JSON to merge into: winners that improve on their incumbent
    (``BucketResult.improves``) replace the entry of the same (M, N, K, epilogue) or are appended; all other
    entries of ``base`` are kept as they are.
    """
    entries = []
    for r in results:
        if r.best is None or (base is not None and not r.improves):
            continue
        M, N, K = r.shape
        cub = r.cublas.get("tflops")
        ran = {"num_stages": r.best_measure["stages_run"]} if "stages_run" in r.best_measure else {}
        entry = {"M": M, "N": N, "K": K, **({"epilogue": r.epilogue} if r.epilogue else {}), **r.best, **ran,
                 "tflops": round(r.best_measure["tflops"], 2), "cublas_tflops": round(cub, 2) if cub else None}
        entries.append(entry)
    if base is not None:
        new = {_entry_key(e): e for e in entries}
        configs = [new.pop(_entry_key(e), e) for e in base["configs"]] + list(new.values())
    else:
        configs = entries
    if not configs:
        raise RuntimeError("no bucket has a measured, correct config: nothing to write")
    extra = {k: v for k, v in (base or {}).items() if k not in ("gpu", "tuned", "note", "configs", *(meta or {}))}
    note = (base or {}).get("note") or (  # a merged file keeps its own note (what its other entries came from)
        "Written by `triton-collection tune`: per bucket the fastest correct candidate (bf16, x @ W.T), "
        "TFLOP/s of it and of torch.matmul measured in the same process (CUDA-graph medians; cublas_tflops null: not timed, --no-cublas). "
        "Entries with an \"epilogue\" were measured with a bias and that activation fused, against "
        "F.linear then the activation (both TFLOP/s count the GEMM only).")
    data = {"gpu": gpu, "tuned": True, "note": note, **extra, **(meta or {}), "configs": configs}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    head = json.dumps({k: v for k, v in data.items() if k != "configs"}, indent=2)[:-2]  # one bucket per line
    body = ",\n".join("    " + json.dumps(e) for e in configs)
    tmp.write_text(head + ',\n  "configs": [\n' + body + "\n  ]\n}\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a run killed mid-write leaves the previous file, never half of one
    return data


def _parse_shape(text: str) -> tuple:
    try:
        m, n, k = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes M,N,K (three integers), got {text!r}") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"--shape sizes must be >= 1, got {text!r}")
    return m, n, k


def _read_json(path: Path, option: str):
    """The parsed JSON file ``path`` given as ``option``.

    Raises:
        SystemExit: the file cannot be read or is not JSON (one line naming the option and the file).
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise SystemExit(f"tune {option} {path}: cannot read it ({err.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"tune {option} {path}: not JSON ({err})") from None


def _read_config_file(path: Path) -> Optional[dict]:
    """The parsed config file at ``path``, or None where there is none.

    Raises:
        SystemExit: the file cannot be read, is not JSON or not a JSON object (one line naming the file).
    """
    if not path.is_file():
        return None
    data = _read_json(path, "--out")
    if not isinstance(data, dict):
        raise SystemExit(f"tune --out {path}: not a config file (a JSON object with \"gpu\" and \"configs\")")
    return data


def _load_candidates(path: Optional[str]) -> Callable[[int], list]:
    """``--candidates``: a list of configs, or ``{"<M>": [configs]}`` with M >= 1.

    Raises:
        SystemExit: a missing file, not JSON, or another structure (one line naming the file).
    """
    if path is None:
        return default_candidates
    data = _read_json(path, "--candidates")
    if isinstance(data, list) and all(isinstance(c, dict) for c in data):
        return lambda M: data
    if not isinstance(data, dict) or not data or not all(
            isinstance(k, str) and k.isdigit() and int(k) >= 1 and isinstance(v, list) for k, v in data.items()):
        raise SystemExit(f"tune --candidates {path}: expected a list of configs or {{\"<M >= 1>\": [configs]}}")
    per_m = sorted((int(k), v) for k, v in data.items())
    return lambda M: min(per_m, key=lambda item: abs(math.log2(item[0]) - math.log2(M)))[1]


def run(args: argparse.Namespace) -> int:
    """The ``tune`` subcommand: exit code 0 when a file was written."""
    import torch
    import triton

    if args.min_gain is not None and not args.update:  # it would be ignored silently
        raise SystemExit("tune --min-gain goes with --update (the speedup a candidate needs over the file's config)")
    min_gain = 0.03 if args.min_gain is None else args.min_gain
    candidates = _load_candidates(args.candidates)  # a bad file is named before the GPU and the build
    if not torch.cuda.is_available():
        print("tune needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    from .cli import _find_root

    root = Path(args.root) if args.root else _find_root(Path.cwd())
    gpu = torch.cuda.get_device_name()
    default_out = root / "torch-ext" / "triton_matmul" / "configs" / ("_".join(gpu.split()) + ".json")
    out = Path(args.out) if args.out else default_out
    existing = _read_config_file(out)  # before the build: a wrong --out is named at once
    if existing is not None and existing.get("gpu") != gpu:
        owner = (f"the configs of {existing['gpu']!r}" if "gpu" in existing
                 else "configs of no named GPU (no \"gpu\")")
        raise SystemExit(f"tune --out {out}: that file holds {owner}, and this GPU is {gpu!r}; its lookup would "
                         f"serve another GPU with this one's timings. Write to {default_out} (the default --out) "
                         "instead")
    mm = load_matmul(root)
    meta = {"torch": torch.__version__, "triton": triton.__version__,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    launch = sys.modules[mm.__name__ + "._launch"]
    _, warp, arch = launch.device_info(torch.device(DEVICE))
    if arch is not None:  # other GPUs of this architecture without a file of their own use this one
        meta = {"arch": arch, **meta}
    base = existing if args.update else None
    incumbent = None
    if base is not None:  # what the existing file gives each bucket's call, through the package's own lookup
        buckets = launch.parse_buckets(base, str(out))

        def incumbent(shape):
            return launch.lookup(buckets, *shape, warp_size=warp, activation=args.epilogue).to_json()

    def write_so_far(results):
        if any(r.best is not None for r in results):
            write_config_file(out, gpu, results, meta, base)

    results = tune(mm, args.shape or DEFAULT_BUCKETS, candidates, rep_ms=args.rep_ms,
                   budget_s=args.budget_s, on_bucket=write_so_far, cublas=not args.no_cublas,
                   epilogue=args.epilogue, incumbent=incumbent, min_gain=min_gain)
    try:
        write_config_file(out, gpu, results, meta, base)
    except RuntimeError as err:
        print(f"tune: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"shape": r.shape, "epilogue": r.epilogue, "cublas": r.cublas, "best": r.best,
                           "best_measure": r.best_measure, "incumbent": r.incumbent, "gain": r.gain,
                           "candidates": r.candidates} for r in results], indent=1))
    if base is not None:
        print(f"updated {out} ({sum(r.improves for r in results)} of {len(results)} measured buckets changed)")
    else:
        print(f"wrote {out} ({sum(r.best is not None for r in results)} buckets)")
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``tune`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser("tune", help="measure triton-matmul configs on this GPU, write configs/<GPU>.json",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--root", help="collection folder (default: the one holding build.toml above the cwd)")
    p.add_argument("--shape", action="append", type=_parse_shape, metavar="M,N,K",
                   help="bucket shape (repeat; default: M 1..16384 x Llama-3-8B and Flux projections)")
    p.add_argument("--candidates", help="JSON file: a list of configs, or {\"<M>\": [configs]} (nearest M in log2)")
    p.add_argument("--out", help="file to write (default: torch-ext/triton_matmul/configs/<GPU name>.json)")
    p.add_argument("--budget-s", type=positive_float, default=200.0, help="stop starting new measurements after this (default 200)")
    p.add_argument("--rep-ms", type=positive_float, default=30.0, help="timing window per measurement in ms (default 30)")
    p.add_argument("--no-cublas", action="store_true", help="do not time torch.matmul per bucket (faster)")
    p.add_argument("--epilogue", choices=EPILOGUES,
                   help="measure with a bias and this activation fused; write \"epilogue\" entries "
                        "(default: the plain GEMM)")
    p.add_argument("--update", action="store_true",
                   help="merge into the existing --out file: an entry changes only when a candidate beats the config "
                        "the file gives now by --min-gain on a re-timing")
    p.add_argument("--min-gain", type=non_negative_float, default=None,
                   help="with --update: required speedup as a fraction, a finite number >= 0 (default 0.03: 3%%)")
    p.add_argument("--json", action="store_true", help="also print every measurement as JSON")
    p.set_defaults(func=run)
    return p
