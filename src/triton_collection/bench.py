"""``triton-collection bench``: every op of the named packages over a shape sweep, next to its peers (GPU).

    triton-collection bench                          # all packages, quick sweep, bf16
    triton-collection bench norms softmax --shapes full --out benchmarks/results
    triton-collection bench --plot benchmarks/results/bench_2026-11-30.json   # redraw the PNG (no GPU)
    triton-collection bench --e2e smollm2-135m --batch 1 64                  # end-to-end decode, see e2e.py

For each (op, shape) of :data:`.bench_ops.REGISTRY`, every provider (ours and the peers that exist:
eager PyTorch, ATen fused ops, ``torch.compile``, Liger when importable) is first checked against
an fp64 reference, then timed with ``triton.testing.do_bench`` (median; it flushes the L2 cache
before every call; the sweep's tensors are several times the H200's 60 MB L2). Memory-bound ops
report GB/s (bytes a perfect kernel moves, see ``bench_ops``) and the fraction of the device copy
bandwidth measured in the same run (``b.copy_(a)`` on 2 GiB); matmuls report TFLOP/s and the
fraction of ``torch.matmul`` at 8192³ in the same dtype; ``latency`` rows are wall time per call
from Python (a loop, one sync; the providers timed in turn, 15 rounds, median). Results:
``bench_<date>.json``, ``.md`` and ``.png`` in ``--out``.

Every timed row also gets ``host_us``: the wall time of one call on an idle GPU, i.e. what the host
spends in Python, allocations and launches before the call returns. do_bench's events bracket that
host time too, so where ``host_us`` reaches ``HOST_BOUND`` of the measured time the row measures the
host, not the kernels (``host_bound``; marked in the report), and moves with the host's load. So each
timed row but the backward-only ones is also replayed from a CUDA graph (``graph_ms``, ``graph_value``: the
same calls captured once, the GPU's time alone; ``--no-graph`` skips it), and the summary compares ours with
the best peer on both. A provider that cannot be captured (a host sync, a CPU-side branch on device data)
gets ``graph_error``. Backward-only rows replay a backward whose forward ran before the capture, and autograd
launches it on that forward's stream, outside the capture, so they are not replayed.

The packages are built from this checkout, installed into a private Hugging Face cache and loaded
by Hub name, as users load them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from . import DEFAULT_ORG
from .argtypes import file_stem, positive_int
from .bench_ops import REGISTRY, OpSpec, resolve_packages, specs_for
from .scratch import scratch_dir

__all__ = ["DTYPES", "PEERS", "add_parser", "best_peers", "gbps", "graph_median", "load_packages", "main",
           "measure_ceilings", "plot_results", "run", "run_bench", "write_report"]

log = logging.getLogger(__name__)

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PEERS = ("eager", "aten", "compile", "liger")
HOST_BOUND = 0.8  # host_us / measured time at or above which a row is marked host-bound
COPY_BYTES = 2 * 1024**3  # per buffer: far above any L2


def gbps(nbytes: int, ms: float) -> float:
    """GB/s (1e9 bytes per second) for ``nbytes`` moved in ``ms`` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def _root() -> Path:
    for folder in (Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents):
        if (folder / "build.toml").is_file() and (folder / "torch-ext").is_dir():
            return folder
    raise SystemExit("bench: run it inside the collection checkout (no build.toml with torch-ext/ found)")


def load_packages(names: list[str], *, org: str = DEFAULT_ORG, root: Path | None = None) -> dict[str, Any]:
    """Build ``names`` from the checkout, install them into the HF cache, load each by Hub name (offline).

    ``HF_HOME`` defaults to a fresh temporary folder (set it before ``huggingface_hub`` is imported
    to use another cache). Returns ``{hub name: kernel module}``.
    """
    if "HF_HOME" not in os.environ:
        os.environ["HF_HOME"] = str(scratch_dir("triton-collection-bench-hf-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    import kernels

    from .build import build_collection
    from .install import install_local
    from .manifest import load_manifest

    collection = load_manifest(root or _root())
    known = {p.name for p in collection.packages}
    wanted = [n for n in names if n in known]
    missing = sorted(set(names) - known)
    if missing:
        log.warning("bench: %s not in build.toml: skipped", ", ".join(missing))
    out = scratch_dir("triton-collection-bench-") / "hub"
    cpu = not _has_gpu()
    loaded = {}
    for name in wanted:  # one broken package must not stop the others' measurements
        try:
            for built in build_collection(collection, out, org=org, packages=[name], cpu_variant=cpu):
                install_local(built, org=org)
            loaded[name] = kernels.get_kernel(f"{org}/{name}", version=collection.package(name).version)
        except Exception as exc:  # noqa: BLE001
            log.error("bench: cannot build or load %s: %s: %s", name, type(exc).__name__, exc)
    return loaded


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def do_bench_median(fn: Callable[[], Any], *, warmup: int, rep: int) -> float:
    """Median ms of ``fn`` by ``triton.testing.do_bench`` (L2 flushed before each call)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def wall_us_per_call(fn: Callable[[], Any], *, calls: int = 200, repeats: int = 5) -> float:
    """Median over ``repeats`` of the wall time per call of ``calls`` back-to-back calls, one sync at the end."""
    fn()
    _sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def wall_us_interleaved(fns: list, *, calls: int = 200, rounds: int = 15) -> list[float]:
    """For each of ``fns``, the median over ``rounds`` of its wall time per call (µs) of ``calls`` back-to-back
    calls with one sync at the end, the functions taken in turn round after round: the host's drift during the
    measurement (on the H200's host the same call read 10-31 µs across one run) falls on every provider alike, so
    that the latency rows compare the providers rather than the moments each was timed."""
    for fn in fns:
        fn()
    _sync()
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync()
            times.append((time.perf_counter() - start) / calls * 1e6)
    return [statistics.median(times) for times in samples]


def host_us_per_call(fn: Callable[[], Any], *, samples: int = 15) -> float:
    """Median wall time (µs) of one call of ``fn`` started on an idle GPU (a sync before each): the host's
    part of the call (Python, allocations, launches), which do_bench's events bracket as well."""
    fn()
    times = []
    for _ in range(samples):
        _sync()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    _sync()
    return statistics.median(times)


def graph_median(fn: Callable[[], Any], *, rep: int) -> float:
    """Median ms per call of ``fn`` replayed from a CUDA graph (``triton.testing.do_bench_cudagraph``): the
    kernels' time without the host's Python and launches."""
    import torch
    from triton.testing import do_bench_cudagraph

    try:
        return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    except Exception:
        # A failed capture leaves the CUDA generator marked as capturing: every later random op raises
        # ("Offset increment outside graph capture"). A fresh copy of its state clears the mark.
        gen = torch.cuda.default_generators[torch.cuda.current_device()]
        gen.graphsafe_set_state(gen.clone_state())
        raise


def measure_ceilings(dtype_name: str = "bfloat16", *, matmul: bool = True, timer=do_bench_median) -> dict:
    """Device copy GB/s (bytes read + written) and ``torch.matmul`` 8192³ TFLOP/s in ``dtype_name``."""
    import torch

    a = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ms = timer(lambda: b.copy_(a), warmup=50, rep=300)
    out = {"copy_gbps": gbps(2 * COPY_BYTES, ms)}
    del a, b
    if matmul:
        dt = getattr(torch, dtype_name)
        n = 8192
        x = torch.randn(n, n, device="cuda", dtype=dt)
        y = torch.randn(n, n, device="cuda", dtype=dt)
        ms = timer(lambda: torch.matmul(x, y), warmup=50, rep=300)
        out["matmul_tflops"] = 2 * n**3 / (ms * 1e-3) / 1e12
        del x, y
    torch.cuda.empty_cache()
    return out


def _compare(got, ref, rtol: float, atol: float) -> tuple[bool, float]:
    import torch

    if got is None or not isinstance(got, torch.Tensor) or got.shape != ref.shape:
        return False, math.nan
    g, r = got.double(), ref.double()
    err = (g - r).abs()
    ok = bool((err <= atol + rtol * r.abs()).all()) and bool(torch.isfinite(g).all())
    return ok, float(err.max()) if err.numel() else 0.0


def _rate(spec: OpSpec, work, ms: float, ceilings: dict) -> tuple[float, float | None]:
    """(GB/s or TFLOP/s of ``work`` done in ``ms``, its fraction of the run's ceiling or None)."""
    if spec.metric == "TFLOP/s":
        value = work / (ms * 1e-3) / 1e12
        return value, value / ceilings["matmul_tflops"] if ceilings.get("matmul_tflops") else None
    value = gbps(work, ms)
    return value, value / ceilings["copy_gbps"] if ceilings.get("copy_gbps") else None


def run_case(spec: OpSpec, shape, kernel, dtype, device: str, *, peers=PEERS, ceilings: dict | None = None,
             timer=do_bench_median, latency_timer=wall_us_interleaved, host_timer=host_us_per_call, graph_timer=None,
             warmup: int = 25, rep: int = 100) -> list[dict]:
    """Check and time every provider of one (spec, shape); one row per provider (errors are rows too).

    ``graph_timer(fn, rep=...)`` (e.g. :func:`graph_median`; None: not measured) adds ``graph_ms`` and
    ``graph_value`` to each timed row, or ``graph_error`` where the provider cannot be replayed.
    ``latency_timer(fns)`` gives the latency rows' µs per call of all the checked providers at once, a list
    in the order of ``fns`` (:func:`wall_us_interleaved`); where it raises, each provider is timed alone and
    only the one that fails gets an ``error``."""
    import torch

    elem = torch.empty((), dtype=dtype).element_size()
    base = {"package": spec.package, "op": spec.op, "mode": spec.mode, "shape": list(shape),
            "dtype": str(dtype).removeprefix("torch."), "metric": spec.metric, "count": spec.count}
    try:
        wl = spec.build(kernel, tuple(shape), dtype, device, tuple(peers))
    except Exception as exc:  # noqa: BLE001 - a broken case is a row, not the end of the run
        return [dict(base, provider="ours", error=f"build: {type(exc).__name__}: {str(exc)[:300]}")]
    rows = [dict(base, provider=name, error=f"skipped: {why}") for name, why in wl.skipped.items()]
    ref = None
    try:
        ref = wl.pick(wl.reference())
    except Exception as exc:  # noqa: BLE001
        log.warning("bench: reference for %s %s failed: %s", spec.name, shape, exc)
    work = spec.work(tuple(shape), elem)
    ceilings = ceilings or {}
    latency: list = []
    for name, fn in wl.providers.items():
        row = dict(base, provider=name)
        try:
            out = fn()  # first call: compiles (Triton JIT, torch.compile), then checked
            if ref is not None:
                row["ok"], row["max_err"] = _compare(wl.pick(out), ref, wl.rtol, wl.atol)
            del out
            if spec.mode == "latency":
                latency.append((row, fn))  # timed below, all providers in turn
            else:
                ms = timer(fn, warmup=warmup, rep=rep)
                row["ms"] = ms
                row["host_us"] = host_timer(fn)
                row["host_bound"] = row["host_us"] >= HOST_BOUND * ms * 1e3
                row["value"], frac = _rate(spec, work, ms, ceilings)
                if frac is not None:
                    row["frac"] = frac
        except Exception as exc:  # noqa: BLE001 - a failing peer is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        # backward-only rows are not replayed: autograd runs a backward on the stream of its forward, recorded
        # before the capture, and the failed capture left the CUDA generator unusable for the rest of the run
        if graph_timer is not None and "ms" in row and spec.mode != "bwd":
            try:
                row["graph_ms"] = graph_timer(fn, rep=max(10, rep // 4))  # 10 replays of rep/4 ms of calls
                row["graph_value"] = _rate(spec, work, row["graph_ms"], ceilings)[0]
            except Exception as exc:  # noqa: BLE001 - e.g. a peer that syncs with the host cannot be captured
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    if latency:
        try:
            values = latency_timer([fn for _, fn in latency])
        except Exception:  # noqa: BLE001 - a provider failing only when timed: each alone, so only it errs
            values = None
        for i, (row, fn) in enumerate(latency):
            try:
                row["value"] = values[i] if values is not None else latency_timer([fn])[0]
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return rows


def run_bench(packages: list[str], *, shapes: str = "quick", dtype: str = "bf16", peers=PEERS, kernels_by_name=None,
              device: str = "cuda", ceilings: dict | None = None, progress: bool = True, warmup: int = 25, rep: int = 100,
              timer=do_bench_median, latency_timer=wall_us_interleaved, host_timer=host_us_per_call, graph_timer=None,
              on_case: Callable[[dict], Any] | None = None,
              cases: list[tuple[OpSpec, tuple]] | None = None) -> dict:
    """Run the sweep; returns ``{"env", "ceilings", "rows", "summary", "case_seconds"}`` (see :func:`write_report`).

    ``on_case(result so far)`` is called after every case (the CLI writes the JSON then, so a run cut
    short by a time limit still leaves its rows)."""
    import torch
    import triton
    from tqdm.auto import tqdm

    if dtype not in DTYPES:
        raise ValueError(f"bench: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    tdtype = getattr(torch, DTYPES[dtype])
    packages = resolve_packages(packages)
    kernels_by_name = kernels_by_name if kernels_by_name is not None else load_packages(packages)
    cases = [(s, sh) for s, sh in (specs_for(packages, shapes) if cases is None else cases) if s.package in kernels_by_name]
    if ceilings is None:
        ceilings = measure_ceilings(DTYPES[dtype], matmul=any(s.metric == "TFLOP/s" for s, _ in cases), timer=timer)
    env = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
           "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "shapes": shapes, "dtype": dtype, "peers": list(peers), "timing": f"do_bench median, warmup {warmup} ms, rep {rep} ms, L2 flushed"
           + ("; CUDA-graph replays (kernels alone)" if graph_timer is not None else "")}
    result: dict = {"env": env, "ceilings": ceilings, "rows": [], "summary": [], "case_seconds": []}
    bar = tqdm(cases, desc="bench", unit="case", disable=not progress)
    for spec, shape in bar:
        label = f"{spec.package.removeprefix('triton-')} {spec.name} {'x'.join(map(str, shape))}"
        bar.set_postfix_str(label)
        start = time.perf_counter()
        result["rows"] += run_case(spec, shape, kernels_by_name[spec.package], tdtype, device, peers=peers, ceilings=ceilings,
                                   timer=timer, latency_timer=latency_timer, host_timer=host_timer,
                                   graph_timer=graph_timer, warmup=warmup, rep=rep)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        result["case_seconds"].append([label, round(time.perf_counter() - start, 2)])
        result["summary"] = best_peers(result["rows"])
        if on_case is not None:
            on_case(result)
    return result


def best_peers(rows: list[dict]) -> list[dict]:
    """Per (package, op, mode, shape): ours (the functional API's default path), the best peer, and the ratio.

    ``ratio`` > 1 means ours is faster (GB/s, TFLOP/s: ours / peer; µs/call: peer / ours);
    ``at_or_above`` is False where a peer is faster: the results file must say why. Where the rows were
    also replayed from CUDA graphs, ``graph_ratio`` compares ours with the best peer that could be
    (``graph_peer``) on the kernels' time alone.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if "value" in r and r.get("ok", True) is not False:
            groups.setdefault((r["package"], r["op"], r["mode"], tuple(r["shape"])), []).append(r)
    out = []
    for (pkg, op, mode, shape), rs in groups.items():
        ours = next((r for r in rs if r["provider"] == "ours"), None)
        peers = [r for r in rs if not r["provider"].startswith("ours")]
        if ours is None or not peers:
            continue
        lower_better = rs[0]["metric"] == "us/call"
        best = (min if lower_better else max)(peers, key=lambda r: r["value"])
        ratio = best["value"] / ours["value"] if lower_better else ours["value"] / best["value"]
        entry = {"package": pkg, "op": op, "mode": mode, "shape": list(shape), "metric": rs[0]["metric"],
                 "ours": ours["value"], "best_peer": best["provider"], "best_peer_value": best["value"],
                 "ratio": ratio, "at_or_above": ratio >= 1.0,
                 "host_bound": bool(ours.get("host_bound") or best.get("host_bound"))}
        graphed = [r for r in peers if r.get("graph_value")]
        if ours.get("graph_value") and graphed:
            gbest = max(graphed, key=lambda r: r["graph_value"])
            entry.update(ours_graph=ours["graph_value"], graph_peer=gbest["provider"],
                         graph_peer_value=gbest["graph_value"], graph_ratio=ours["graph_value"] / gbest["graph_value"])
        out.append(entry)
    return out


def _fmt(v, digits: int = 0) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _markdown(result: dict, title: str) -> str:
    env, ceil = result["env"], result.get("ceilings", {})
    measured = [f"{name} {_fmt(ceil.get(key))} {unit}" for key, name, unit in
                (("copy_gbps", "device copy", "GB/s"), ("matmul_tflops", "torch.matmul 8192³", "TFLOP/s"))
                if _fmt(ceil.get(key))]  # the matmul ceiling is measured only where a matmul op is benched
    lines = [f"# {title}", "", f"GPU: {env.get('gpu')}; torch {env.get('torch')}, triton {env.get('triton')}; "
             f"{env.get('dtype')}; sweep {env.get('shapes')}; {env.get('timing')}.",
             f"Ceilings measured in this run: {'; '.join(measured) or 'none'}.", "",
             "`ok`: the result matches an fp64 reference (rtol/atol 2e-2 unless noted). GB/s counts each tensor a "
             "perfect kernel must read or write once (column `count`).", ""]
    summary = result.get("summary", [])
    if summary:
        graphed = [s for s in summary if "graph_ratio" in s]
        lines += ["## Ours vs the best peer", "", "| op | mode | shape | metric | ours | best peer | peer | ours/peer |"
                  + (" kernels alone (CUDA graph): ours / best peer |" if graphed else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if graphed else "")]
        for s in summary:
            mark = ("" if s["at_or_above"] else " **below**") + (" (host-bound)" if s.get("host_bound") else "")
            digits = 1 if s["metric"] == "us/call" else 0
            graph = (f"{_fmt(s['ours_graph'])} / {_fmt(s['graph_peer_value'])} {s['graph_peer']}: {s['graph_ratio']:.2f}"
                     + ("" if s["graph_ratio"] >= 1.0 else " **below**")) if "graph_ratio" in s else ""
            lines.append(f"| {s['op']} | {s['mode']} | {'x'.join(map(str, s['shape']))} | {s['metric']} | {_fmt(s['ours'], digits)} | "
                         f"{s['best_peer']} | {_fmt(s['best_peer_value'], digits)} | {s['ratio']:.2f}{mark} |"
                         + (f" {graph} |" if graphed else ""))
        below = [s for s in summary if not s["at_or_above"]]
        lines += ["", f"{len(summary) - len(below)} of {len(summary)} shapes at or above the best peer." if summary else ""]
        if graphed:
            lines += ["", f"Kernels alone (CUDA-graph replays, no host time; peers that cannot be captured left out): "
                      f"{sum(s['graph_ratio'] >= 1.0 for s in graphed)} of {len(graphed)} shapes at or above the best peer."]
        if any(s.get("host_bound") for s in summary):
            lines += ["", f"(host-bound): ours or the peer spent at least {HOST_BOUND:.0%} of its measured time on the host "
                      "(column `host µs`: one call's Python, allocations and launches on an idle GPU), so that row "
                      "times the host rather than the kernels and moves with the host's load."]
        if result.get("notes"):
            lines += ["", "Where a peer is faster, why (from the run's analysis):", ""] + [f"- {n}" for n in result["notes"]]
        lines.append("")
    has_graph = any("graph_ms" in r or "graph_error" in r for r in result["rows"])
    lines += ["## All rows", "", "| package | op | mode | shape | provider | value | metric | % of ceiling | ms | host µs | "
              + ("graph ms | " if has_graph else "") + "ok | max err | count / error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if has_graph else "")]
    for r in result["rows"]:
        digits = 1 if r.get("metric") == "us/call" else 0
        frac = _fmt(100 * r["frac"]) + "%" if "frac" in r else ""
        err = f"{r['max_err']:.2g}" if "max_err" in r else ""
        ok = "" if "ok" not in r else ("yes" if r["ok"] else "NO")
        graph = f"{_fmt(r.get('graph_ms'), 4) or ('n/a' if 'graph_error' in r else '')} | " if has_graph else ""
        lines.append(f"| {r['package']} | {r['op']} | {r['mode']} | {'x'.join(map(str, r['shape']))} | {r['provider']} | "
                     f"{_fmt(r.get('value'), digits)} | {r.get('metric')} | {frac} | {_fmt(r.get('ms'), 4)} | "
                     f"{_fmt(r.get('host_us'))}{' (bound)' if r.get('host_bound') else ''} | {graph}{ok} | {err} | "
                     f"{r.get('error') or r.get('count', '')} |")
    return "\n".join(lines) + "\n"


def plot_results(result: dict, path: Path) -> Path:
    """One panel per (op, mode): grouped bars per shape, one bar per provider; y = % of the ceiling
    (µs per call for latency rows, raw value where no ceiling was measured). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        if "value" in r:
            panels.setdefault((r["package"], r["op"], r["mode"]), []).append(r)
    # one colour per provider across all panels: ours blue, its exact-order variant light blue, then the peers
    fixed = {"ours": "tab:blue", "eager": "tab:gray", "eager (HF)": "tab:gray", "torch.compile": "tab:purple", "liger": "tab:brown"}
    others = iter(["tab:green", "tab:olive", "tab:cyan", "tab:pink", "tab:red", "tab:orange"])
    colours: dict[str, str] = {}
    for r in result["rows"]:
        p = r["provider"]
        if p not in colours:
            colours[p] = fixed.get(p) or ("lightsteelblue" if p.startswith("ours") else next(others, "black"))
    n = max(1, len(panels))
    cols = min(3, n)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, ((pkg, op, mode), rs) in zip(axes.flat, panels.items()):
        shapes = list(dict.fromkeys("x".join(map(str, r["shape"])) for r in rs))
        providers = list(dict.fromkeys(r["provider"] for r in rs))
        width = 0.8 / len(providers)
        use_frac = all("frac" in r for r in rs)
        for i, prov in enumerate(providers):
            ys = []
            for sh in shapes:
                hit = next((r for r in rs if r["provider"] == prov and "x".join(map(str, r["shape"])) == sh), None)
                ys.append(math.nan if hit is None else (100 * hit["frac"] if use_frac else hit["value"]))
            ax.bar([k + (i - (len(providers) - 1) / 2) * width for k in range(len(shapes))], ys, width, label=prov, color=colours[prov])
        metric = rs[0]["metric"]
        if metric == "us/call":
            ax.set_yscale("log")
            low, high = ax.get_ylim()
            ax.set_ylim(low, high * 6)  # room for the legend
        ax.set_ylabel(f"% of {'matmul' if metric == 'TFLOP/s' else 'copy'} ceiling" if use_frac else metric)
        if use_frac:
            ax.axhline(100, color="black", linewidth=0.8, linestyle="--")
            ax.set_ylim(0, 140)  # room for the legend above the 100% line
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, fontsize=8)
        ax.set_title(f"{pkg.removeprefix('triton-')}: {op} {mode}", fontsize=10)
        ax.legend(fontsize=7, loc="upper center", ncol=3, framealpha=0.8)
    env = result["env"]
    fig.suptitle(f"{env.get('gpu')} · {env.get('dtype')} · copy {_fmt(result.get('ceilings', {}).get('copy_gbps'))} GB/s · "
                 f"{env.get('date', '')[:10]}", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(result: dict, out: Path, *, name: str | None = None, title: str = "triton-collection bench", png: bool = True) -> list[Path]:
    """Write ``<name>.json``, ``<name>.md`` and (with matplotlib) ``<name>.png`` into ``out``; returns the paths.

    ``name`` defaults to ``bench_<date of the run>``. A missing matplotlib is logged and skipped
    (redraw later with ``triton-collection bench --plot <json>``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = name or f"bench_{result['env'].get('date', datetime.date.today().isoformat())[:10]}"
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(_markdown(result, title))
    if not png:
        return paths
    try:
        paths.append(plot_results(result, out / f"{name}.png"))
    except ImportError as exc:
        log.warning("bench: no PNG (%s); redraw with `triton-collection bench --plot %s`", exc, paths[0])
    return paths


def _writable_folder(out: Path) -> Path:
    """``out`` created if missing; one line naming it where it cannot be (before a measurement, not after)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise SystemExit(f"bench --out {out}: cannot create it ({err.strerror})") from None
    if not out.is_dir() or not os.access(out, os.W_OK):
        raise SystemExit(f"bench --out {out}: not a writable folder")
    return out


_ROW_KEYS = ("package", "op", "mode", "shape", "provider")

# what a measurement reads and ``--plot`` (a redraw) does not: given with it, they would be ignored silently
_MEASUREMENT_OPTIONS = ("shapes", "dtype", "peers", "rep", "warmup", "no_progress", "no_graph", "batch", "new_tokens",
                        "prompt_len", "layers", "compile", "repeats")


def _ignored_by_plot(args: argparse.Namespace) -> list[str]:
    """The package names and measurement options given along with ``--plot`` (those unlike the parser's defaults)."""
    defaults = add_parser(argparse.ArgumentParser().add_subparsers()).parse_args([])
    given = [f"package {name!r}" for name in args.packages]
    return given + ["--" + dest.replace("_", "-") for dest in _MEASUREMENT_OPTIONS
                    if getattr(args, dest) != getattr(defaults, dest)]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser("bench", help="time every op of the packages (and peers) on the GPU; JSON + Markdown + PNG",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("packages", nargs="*", metavar="PACKAGE", help=f"packages (default: all of {', '.join(REGISTRY)}); 'norms' = 'triton-norms'")
    p.add_argument("--shapes", default="quick", choices=["quick", "full"], help="shape sweep (default: quick)")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="input dtype (default: bf16)")
    p.add_argument("--out", help="results folder (default: <checkout>/benchmarks/results)")
    p.add_argument("--name", type=file_stem, help="results file stem (default: bench_<date>, e2e_<model>_<date>)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peer kinds to run (default: {','.join(PEERS)}; '' = none)")
    p.add_argument("--rep", type=positive_int, default=100, help="do_bench rep in ms (default: 100)")
    p.add_argument("--warmup", type=positive_int, default=25, help="do_bench warmup in ms (default: 25)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replays (kernel time alone) of each row")
    p.add_argument("--plot", metavar="JSON", help="only redraw the PNG (and Markdown) of an earlier results JSON; no GPU needed")
    p.add_argument("--notes", metavar="FILE", help="with --plot: store these notes (one per line: why a peer is faster) in the JSON and Markdown")
    p.add_argument("--e2e", nargs="+", metavar="MODEL", help="end-to-end greedy decode instead of the op sweep (see triton_collection.e2e)")
    p.add_argument("--batch", nargs="+", type=positive_int, default=[1, 64], help="--e2e batch sizes (default: 1 64)")
    p.add_argument("--new-tokens", type=positive_int, default=32, help="--e2e tokens generated per sequence (default: 32)")
    p.add_argument("--prompt-len", type=positive_int, default=128, help="--e2e prompt length (default: 128)")
    p.add_argument("--layers", type=positive_int, help="--e2e: override the number of decoder layers (the report says so)")
    p.add_argument("--compile", action="store_true", help="--e2e: also time a torch.compile'd decode (slow to compile)")
    p.add_argument("--repeats", type=positive_int, default=3, help="--e2e: runs per timing, the median is kept (default: 3)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``bench`` subcommand."""
    if args.notes and not args.plot:  # a measurement would have dropped them silently
        raise SystemExit("bench --notes goes with --plot: measure first, then `bench --plot RESULTS.json --notes FILE`")
    if args.plot:
        src = Path(args.plot)
        if not src.is_file():
            raise SystemExit(f"bench --plot: no such file: {src}")
        if args.e2e:
            raise SystemExit("bench --plot only redraws an op-sweep results file; --e2e runs a new measurement: "
                             "pass one of them")
        ignored = _ignored_by_plot(args)
        if ignored:
            raise SystemExit(f"bench --plot only redraws an earlier results file; it takes --out, --name and --notes, "
                             f"not {', '.join(ignored)}: measure without --plot")
        if args.notes and not Path(args.notes).is_file():
            raise SystemExit(f"bench --notes: no such file: {args.notes}")
        try:
            result = json.loads(src.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SystemExit(f"bench --plot: {src} is not JSON ({err})") from None
        if not isinstance(result, dict) or not isinstance(result.get("env"), dict) or not result.get("rows") \
                or not isinstance(result["rows"], list) \
                or any(not isinstance(r, dict) or any(k not in r for k in _ROW_KEYS) for r in result["rows"]):
            raise SystemExit(f"bench --plot: {src} is not a results file of the op sweep (an 'env' table and rows "
                             f"with {', '.join(map(repr, _ROW_KEYS))}); end-to-end results (--e2e) have their own Markdown")
        if args.notes:
            result["notes"] = [line.strip().removeprefix("- ") for line in Path(args.notes).read_text().splitlines() if line.strip()]
        out = _writable_folder(Path(args.out) if args.out else src.parent)
        try:
            paths = write_report(result, out, name=args.name or src.stem)
        except (TypeError, ValueError, KeyError, AttributeError) as err:  # rows of the right keys, wrong values
            raise SystemExit(f"bench --plot: {src} is not a results file of the op sweep: "
                             f"{type(err).__name__}: {err}") from None
        print("\n".join(map(str, paths)))
        return 0
    import torch

    if not args.e2e:  # the arguments first: a misspelt package or peer is named on any machine
        peers = tuple(p for p in args.peers.split(",") if p)
        unknown = sorted(set(peers) - set(PEERS))
        if unknown:
            raise SystemExit(f"bench: unknown peer kind(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
        try:
            packages = resolve_packages(args.packages)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    if not torch.cuda.is_available():
        raise SystemExit("bench: needs a GPU (torch.cuda.is_available() is False; this torch is "
                         f"{torch.__version__}). Timings under the CPU interpreter would mean nothing. "
                         "Use --plot JSON to redraw earlier results.")
    out = _writable_folder(Path(args.out) if args.out else _root() / "benchmarks" / "results")
    if args.e2e:
        from .e2e import run_e2e_cli

        return run_e2e_cli(args, out)
    result = run_bench(packages, shapes=args.shapes, dtype=args.dtype, peers=peers, progress=not args.no_progress, rep=args.rep, warmup=args.warmup,
                       graph_timer=None if args.no_graph else graph_median,
                       on_case=lambda partial: write_report(partial, out, name=args.name, png=False))
    for path in write_report(result, out, name=args.name):
        print(path)
    below = [s for s in result["summary"] if not s["at_or_above"]]
    bad = [r for r in result["rows"] if r.get("ok") is False]
    print(f"{len(result['rows'])} rows; {len(result['summary']) - len(below)}/{len(result['summary'])} shapes at or above the best peer; "
          f"{len(bad)} results off the reference" + "".join(f"\n  OFF: {r['provider']} {r['op']} {r['mode']} {r['shape']} max err {r.get('max_err')}" for r in bad))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m triton_collection.bench [options]``."""
    parser = argparse.ArgumentParser(prog="triton-collection-bench")
    add_parser(parser.add_subparsers(dest="command")).prog = "triton-collection bench"
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
