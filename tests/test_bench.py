"""The pure parts of ``triton-collection bench`` (registry, work counts, checks, reports) and the e2e helpers.

Timings here are fake (a constant timer): the GPU run measures, these tests check that every
provider computes the right values, that the numbers are derived correctly from the timings, and
that the results files are written as documented.
"""

import ast
import dataclasses
import json
import math
import sys
import time
import tomllib

import pytest
import torch

from triton_collection import bench, e2e
from triton_collection.bench_ops import REGISTRY, OpSpec, Workload, bytes_moved, resolve_packages, specs_for

from .conftest import ROOT

SMALL = {"triton-norms": (7, 37), "triton-activations": (5, 19), "triton-softmax": (6, 41),
         "triton-matmul": (5, 17, 11), "triton-attention": (1, 2, 13, 16)}


def _public_names(python_name: str) -> set[str]:
    tree = ast.parse((ROOT / "torch-ext" / python_name / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{python_name} has no __all__")


def test_registry_names_real_packages_and_functions():
    manifest = tomllib.loads((ROOT / "build.toml").read_text())["package"]
    for pkg, specs in REGISTRY.items():
        assert specs, pkg
        python_name = pkg.replace("-", "_")
        if pkg not in manifest:  # a package still landing: its entry waits for build.toml
            assert not (ROOT / "torch-ext" / python_name).exists() or pkg == "triton-attention", pkg
            continue
        assert manifest[pkg]["python-name"] == python_name
        names = _public_names(python_name)
        for spec in specs:
            assert spec.package == pkg
            assert spec.op.split()[0].split("+")[0] in names, (pkg, spec.op)
            assert spec.mode in ("fwd", "fwd (chunk view)", "fwd+bwd", "bwd", "latency")
            assert spec.metric in ("GB/s", "TFLOP/s", "us/call")


@pytest.mark.parametrize("spec", [s for specs in REGISTRY.values() for s in specs], ids=lambda s: f"{s.package}:{s.name}")
def test_quick_shapes_are_part_of_the_full_sweep(spec):
    assert set(spec.shapes["quick"]) <= set(spec.shapes["full"])
    assert spec.shapes["full"]
    if spec.mode != "latency" and spec.metric == "GB/s":
        # the sweep's tensors are several times the H200's 60 MB L2 (bf16)
        assert all(spec.work(shape, 2) > 4 * 60e6 for shape in spec.shapes["full"]), spec.name


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
def test_chunk_view_rows_pass_the_view_itself(op, device):
    """The "fwd (chunk view)" rows hand our op the first half of a (M, 4d) tensor, row stride 4d, not a copy."""
    import types

    spec = next(s for s in REGISTRY["triton-activations"] if s.op == op and s.mode == "fwd (chunk view)")
    seen = []
    kernel = types.SimpleNamespace(**{op: lambda t: seen.append(t) or t[:, : t.shape[1] // 2]})
    work = spec.build(kernel, (3, 5), torch.float32, device, peers=())
    work.providers["ours"]()
    (x,) = seen
    assert x.shape == (3, 10) and x.stride() == (20, 1) and not x.is_contiguous()


def test_resolve_packages():
    assert resolve_packages([]) == list(REGISTRY)
    assert resolve_packages(["norms", "triton_softmax", "triton-norms"]) == ["triton-norms", "triton-softmax"]
    with pytest.raises(ValueError, match="unknown package 'nrms'.*triton-norms"):
        resolve_packages(["nrms"])
    with pytest.raises(ValueError, match="shapes must be"):
        specs_for(["triton-norms"], "medium")
    quick = specs_for(["triton-norms", "triton-softmax"], "quick")
    assert {s.package for s, _ in quick} == {"triton-norms", "triton-softmax"}
    assert len(specs_for(["triton-norms"], "full")) > len([c for c in quick if c[0].package == "triton-norms"])


def _spec(package, op, mode="fwd"):
    return next(s for s in REGISTRY[package] if s.op == op and s.mode == mode)


def test_work_counts():
    M, N = 32768, 4096
    assert bytes_moved(3, 5, 2, 2, 1) == 2 * 3 * 5 * 2 + 5 * 2
    assert _spec("triton-norms", "rms_norm").work((M, N), 2) == 2 * M * N * 2 + N * 2
    assert _spec("triton-norms", "layer_norm").work((M, N), 2) == 2 * M * N * 2 + 2 * N * 2
    assert _spec("triton-norms", "add_rms_norm").work((M, N), 2) == 4 * M * N * 2 + N * 2
    # the backward count: x, w, dy read; dx, dw written once
    assert _spec("triton-norms", "rms_norm", "bwd").work((M, N), 2) == 3 * M * N * 2 + 2 * N * 2
    assert _spec("triton-norms", "rms_norm", "fwd+bwd").work((M, N), 4) == 5 * M * N * 4 + 3 * N * 4
    assert _spec("triton-norms", "rms_norm", "latency").work((1, N), 2) is None
    assert _spec("triton-activations", "silu_and_mul").work((16384, 14336), 2) == 3 * 16384 * 14336 * 2
    assert _spec("triton-activations", "silu_and_mul", "fwd+bwd").work((7, 3), 2) == 8 * 7 * 3 * 2
    assert _spec("triton-softmax", "cross_entropy", "fwd+bwd").work((8192, 128256), 2) == 2 * 8192 * 128256 * 2
    assert _spec("triton-matmul", "matmul").work((8192, 8192, 8192), 2) == 2 * 8192**3
    assert _spec("triton-attention", "flash_attention").work((4, 32, 4096, 128), 2) == 4 * 4 * 32 * 4096**2 * 128
    assert _spec("triton-attention", "flash_attention causal").work((4, 32, 4096, 128), 2) == 2 * 4 * 32 * 4096**2 * 128
    assert bench.gbps(4244 * 10**6, 1.0) == pytest.approx(4244.0)


def _fake_timer(ms):
    return lambda fn, warmup, rep: (fn(), ms)[1]


@pytest.fixture(scope="module")
def packages(norms, activations, softmax, matmul, installed):
    import kernels

    out = {"triton-norms": norms, "triton-activations": activations, "triton-softmax": softmax, "triton-matmul": matmul}
    for name in set(REGISTRY) - set(out):  # packages that joined build.toml later, loaded by Hub name as well
        if name in installed:
            out[name] = kernels.get_kernel(f"triton-collection/{name}", version=installed[name].version)
    return out


@pytest.mark.parametrize("spec", [s for specs in REGISTRY.values() for s in specs], ids=lambda s: f"{s.package}:{s.name}")
def test_every_provider_matches_the_reference(spec, packages, device):
    """Each provider (ours, eager, ATen; compile and Liger need a GPU) computes the op on fresh random
    inputs of odd sizes and agrees with the fp64 reference; value = work / fake time."""
    if spec.package not in packages:
        pytest.skip(f"{spec.package} is not in build.toml yet")
    torch.manual_seed(0)
    shape = SMALL[spec.package]
    rows = bench.run_case(spec, shape, packages[spec.package], torch.float32, device, peers=("eager", "aten"),
                          ceilings={"copy_gbps": 1000.0, "matmul_tflops": 500.0}, timer=_fake_timer(0.5),
                          latency_timer=lambda fns: [7.5] * len(fns), host_timer=lambda fn: 420.0)
    measured = [r for r in rows if "value" in r]
    assert {r["provider"] for r in measured} >= {"ours"}
    assert len(measured) >= 2, rows  # ours and at least one peer
    for r in measured:
        assert r["ok"] is True, r
        # fp32 matmul runs TF32 products on NVIDIA GPUs (matmul's docstring): about 1e-3 here (K = 11, values ~3)
        assert r["max_err"] < (1e-2 if device == "cuda" and spec.package == "triton-matmul" else 1e-4), r
        if spec.mode != "latency":  # 420 us of host time in a 500 us measurement: at least HOST_BOUND of it
            assert r["host_us"] == 420.0 and r["host_bound"] is True
        if spec.mode == "latency":
            assert r["value"] == 7.5 and "host_us" not in r
        elif spec.metric == "GB/s":
            assert r["value"] == pytest.approx(spec.work(shape, 4) / 0.5e-3 / 1e9)
            assert r["frac"] == pytest.approx(r["value"] / 1000.0)
        else:
            assert r["value"] == pytest.approx(spec.work(shape, 4) / 0.5e-3 / 1e12)
            assert r["frac"] == pytest.approx(r["value"] / 500.0)


def test_a_wrong_result_is_flagged_and_an_exception_is_a_row(device):
    x = torch.randn(9, 31, device=device)
    wl = Workload({"ours": lambda: x * 1.0, "off": lambda: x * 1.1, "broken": lambda: 1 / 0}, lambda: x.double())
    spec = OpSpec("triton-norms", "fake", "fwd", {"quick": (), "full": ((9, 31),)}, "x", lambda s, e: 100, lambda *a: wl)
    rows = {r["provider"]: r for r in bench.run_case(spec, (9, 31), None, torch.float32, device, timer=_fake_timer(1.0),
                                                     host_timer=lambda fn: 20.0)}
    assert rows["ours"]["host_bound"] is False  # 20 us of 1 ms
    assert rows["ours"]["ok"] is True and rows["ours"]["max_err"] == 0.0
    assert rows["off"]["ok"] is False and rows["off"]["max_err"] == pytest.approx(float((x * 0.1).abs().max()), rel=1e-5)
    assert "ZeroDivisionError" in rows["broken"]["error"] and "value" not in rows["broken"]
    failing = dataclasses.replace(spec, build_fn=lambda *a: 1 / 0)
    (row,) = bench.run_case(failing, (9, 31), None, torch.float32, device)
    assert row["error"].startswith("build: ZeroDivisionError")


def test_latency_providers_are_timed_in_turn():
    """wall_us_interleaved: one value per function, in order, each a per-call time; every round times each
    function in turn (the call log shows the turns) so that the host's drift falls on each alike. In run_case a
    provider that fails only while timed errs alone; the others keep their values."""
    log = []

    def quick():
        log.append("quick")

    def slow():
        log.append("slow")
        end = time.perf_counter() + 200e-6
        while time.perf_counter() < end:
            pass

    fast_us, slow_us = bench.wall_us_interleaved([quick, slow], calls=3, rounds=4)
    assert slow_us >= 200 > fast_us
    assert log == ["quick", "slow"] + (["quick"] * 3 + ["slow"] * 3) * 4

    x = torch.randn(3, 5)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("broke while timed")
        return x * 1.0

    wl = Workload({"ours": lambda: x * 1.0, "flaky": flaky}, lambda: x.double())
    spec = OpSpec("triton-norms", "fake", "latency", {"quick": (), "full": ((3, 5),)}, "x", None, lambda *a: wl,
                  metric="us/call")
    rows = {r["provider"]: r for r in bench.run_case(
        spec, (3, 5), None, torch.float32, "cpu", latency_timer=lambda fns: bench.wall_us_interleaved(fns, calls=2, rounds=2))}
    assert rows["ours"]["value"] > 0 and "error" not in rows["ours"]
    assert "broke while timed" in rows["flaky"]["error"] and "value" not in rows["flaky"]


def _fake_result():
    rows = []
    for shape, vals in (((32768, 4096), {"ours": 4100.0, "liger": 4011.0, "torch.compile": 3706.0}),
                        ((4096, 65536), {"ours": 2700.0, "liger": 1281.0, "torch.compile": 2720.0})):
        for prov, v in vals.items():
            rows.append({"package": "triton-norms", "op": "rms_norm", "mode": "fwd", "shape": list(shape), "dtype": "bfloat16",
                         "metric": "GB/s", "count": "x read + y written", "provider": prov, "value": v, "frac": v / 4244,
                         "ms": 1.0, "ok": True, "max_err": 0.0078})
    rows.append({"package": "triton-norms", "op": "rms_norm", "mode": "latency", "shape": [1, 4096], "dtype": "bfloat16",
                 "metric": "us/call", "count": "wall", "provider": "ours", "value": 12.0, "ok": True, "max_err": 0.0})
    rows.append({"package": "triton-norms", "op": "rms_norm", "mode": "latency", "shape": [1, 4096], "dtype": "bfloat16",
                 "metric": "us/call", "count": "wall", "provider": "F.rms_norm", "value": 10.8, "ok": True, "max_err": 0.0})
    rows.append({"package": "triton-norms", "op": "rms_norm", "mode": "fwd", "shape": [4096, 65536], "dtype": "bfloat16",
                 "metric": "GB/s", "count": "x", "provider": "eager (HF)", "value": 9999.0, "ok": False, "max_err": 3.0})
    rows.append({"package": "triton-norms", "op": "rms_norm", "mode": "fwd", "shape": [4096, 65536], "dtype": "bfloat16",
                 "metric": "GB/s", "count": "x", "provider": "broken peer", "error": "RuntimeError: boom"})
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "dtype": "bf16", "shapes": "quick",
           "date": "2026-11-30T16:00:00+00:00", "timing": "do_bench median"}
    return {"env": env, "ceilings": {"copy_gbps": 4244.0, "matmul_tflops": 790.0}, "rows": rows, "summary": bench.best_peers(rows)}


def test_best_peers():
    summary = {(tuple(s["shape"]), s["mode"]): s for s in bench.best_peers(_fake_result()["rows"])}
    big = summary[((32768, 4096), "fwd")]
    assert big["best_peer"] == "liger" and big["ratio"] == pytest.approx(4100 / 4011) and big["at_or_above"]
    wide = summary[((4096, 65536), "fwd")]  # the wrong (ok=False) peer never counts as the best
    assert wide["best_peer"] == "torch.compile" and wide["ratio"] == pytest.approx(2700 / 2720) and not wide["at_or_above"]
    lat = summary[((1, 4096), "latency")]  # lower is better
    assert lat["best_peer"] == "F.rms_norm" and lat["ratio"] == pytest.approx(10.8 / 12.0) and not lat["at_or_above"]


def test_report_files(tmp_path):
    result = _fake_result()
    paths = bench.write_report(result, tmp_path, name="bench_test")
    assert [p.name for p in paths] == ["bench_test.json", "bench_test.md", "bench_test.png"]
    assert json.loads(paths[0].read_text()) == result
    md = paths[1].read_text()
    assert "device copy 4244 GB/s" in md and "torch.matmul 8192³ 790 TFLOP/s" in md
    assert "| rms_norm | fwd | 32768x4096 | GB/s | 4100 | liger | 4011 | 1.02 |" in md
    assert "| rms_norm | fwd | 4096x65536 | GB/s | 2700 | torch.compile | 2720 | 0.99 **below** |" in md
    assert "1 of 3 shapes at or above the best peer." in md
    assert "| eager (HF) | 9999 | GB/s |  |  |  | NO | 3 | x |" in md  # no graph columns: none measured
    assert "graph ms" not in md and "kernels alone" not in md
    assert "RuntimeError: boom" in md
    png = paths[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_host_bound_rows_are_marked(tmp_path):
    """A row whose host time reaches HOST_BOUND of its measured time is marked in the summary and in the rows."""
    result = _fake_result()
    for r in result["rows"]:
        if r["provider"] == "liger" and r["shape"] == [32768, 4096]:
            r.update(host_us=900.0, host_bound=True)
        elif "ms" in r:
            r.update(host_us=35.0, host_bound=False)
    result["summary"] = bench.best_peers(result["rows"])
    md = bench.write_report(result, tmp_path, name="hb", png=False)[1].read_text()
    assert "| rms_norm | fwd | 32768x4096 | GB/s | 4100 | liger | 4011 | 1.02 (host-bound) |" in md
    assert "| rms_norm | fwd | 4096x65536 | GB/s | 2700 | torch.compile | 2720 | 0.99 **below** |" in md
    assert "| 900 (bound) |" in md and "| 35 |" in md and "times the host rather than the kernels" in md


def test_host_us_per_call_times_one_call():
    calls = []
    fake = lambda: (calls.append(1), time.sleep(0.002))  # noqa: E731
    us = bench.host_us_per_call(fake, samples=5)
    assert len(calls) == 6 and 1900 < us < 20000


def test_cli_plot_redraws_from_json(tmp_path, capsys):
    from triton_collection.cli import main

    src = tmp_path / "bench_x.json"
    src.write_text(json.dumps(_fake_result()))
    assert main(["bench", "--plot", str(src), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "bench_x.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "bench_x.md").read_text().startswith("# triton-collection bench")
    notes = tmp_path / "why.txt"
    notes.write_text("- rms_norm 4096x65536: torch.compile splits the row over 2 programs\n\n")
    assert main(["bench", "--plot", str(src), "--notes", str(notes), "--out", str(tmp_path / "n")]) == 0
    assert json.loads((tmp_path / "n" / "bench_x.json").read_text())["notes"] == ["rms_norm 4096x65536: torch.compile splits the row over 2 programs"]
    assert "- rms_norm 4096x65536: torch.compile splits the row over 2 programs" in (tmp_path / "n" / "bench_x.md").read_text()
    (tmp_path / "e.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a results file of the op sweep"):
        main(["bench", "--plot", str(tmp_path / "e.json")])
    (tmp_path / "e2e.json").write_text(json.dumps({"rows": [{"model": "smollm2-135m", "batch": 1}]}))  # --e2e's rows
    with pytest.raises(SystemExit, match="end-to-end results"):
        main(["bench", "--plot", str(tmp_path / "e2e.json")])
    with pytest.raises(SystemExit, match="no such file"):
        main(["bench", "--plot", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match=r"bench --notes: no such file: .*missing.txt"):
        main(["bench", "--plot", str(src), "--notes", str(tmp_path / "missing.txt")])
    with pytest.raises(SystemExit, match="bench --notes goes with --plot"):  # a measurement would drop them
        main(["bench", "norms", "--notes", str(notes)])
    with pytest.raises(SystemExit, match="--plot only redraws"):
        main(["bench", "--plot", str(src), "--e2e", "smollm2-135m"])
    # found by a tester: package names and measurement options were ignored without a word (exit code 0)
    with pytest.raises(SystemExit, match=r"^bench --plot only redraws an earlier results file; it takes --out, --name and "
                                         r"--notes, not package 'nonsense_pkg', --shapes, --rep, --no-graph: measure "
                                         r"without --plot$"):
        main(["bench", "nonsense_pkg", "--plot", str(src), "--shapes", "full", "--rep", "5", "--no-graph"])
    with pytest.raises(SystemExit, match=r"not --batch, --repeats: measure without --plot$"):
        main(["bench", "--plot", str(src), "--batch", "2", "--repeats", "1", "--out", str(tmp_path / "ignored")])
    assert not (tmp_path / "ignored").exists()
    # found by a fresh-eyes trial: tracebacks (not JSON, rows without 'env'), files written outside --out
    (tmp_path / "notes.md").write_text("# not json")
    with pytest.raises(SystemExit, match=r"bench --plot: .*notes.md is not JSON"):
        main(["bench", "--plot", str(tmp_path / "notes.md")])
    (tmp_path / "r1.json").write_text(json.dumps({"rows": [{"package": "x"}]}))
    with pytest.raises(SystemExit, match="not a results file of the op sweep"):
        main(["bench", "--plot", str(tmp_path / "r1.json")])
    broken = _fake_result()  # the right keys, a value of the wrong type (a hand-edited file): a traceback before
    broken["rows"][0]["shape"] = 7
    (tmp_path / "r2.json").write_text(json.dumps(broken))
    with pytest.raises(SystemExit, match="r2.json is not a results file of the op sweep: TypeError"):
        main(["bench", "--plot", str(tmp_path / "r2.json"), "--out", str(tmp_path / "r2")])
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit, match=r"bench --out .*a_file.*: cannot create it"):
        main(["bench", "--plot", str(src), "--out", str(tmp_path / "a_file" / "out")])
    for bad in (["--name", "../../escaped"], ["--rep", "0"], ["--batch", "1", "-3"], ["--repeats", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", "--plot", str(src), *bad])
        assert exit_info.value.code == 2, bad
        assert f"argument {bad[0]}" in capsys.readouterr().err
    assert not (tmp_path.parent / "escaped.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU error path")
def test_cli_without_gpu_says_so():
    from triton_collection.cli import main

    with pytest.raises(SystemExit, match="bench: needs a GPU"):
        main(["bench", "norms"])
    with pytest.raises(SystemExit, match="needs a GPU"):
        main(["bench", "--e2e", "llama3-8b"])
    # misspelt arguments are named before the GPU check (the machine is not what is wrong)
    with pytest.raises(SystemExit, match="unknown package 'nope'"):
        main(["bench", "nope"])
    with pytest.raises(SystemExit, match="unknown peer kind.*lgr"):
        main(["bench", "norms", "--peers", "eager,lgr"])


def test_run_bench_on_cpu_with_fake_timings(packages, device, tmp_path):
    """The sweep loop: progress, checkpoints after each case, summary; one tiny case per package."""
    cases = [(_spec("triton-norms", "rms_norm"), (3, 40)), (_spec("triton-softmax", "softmax"), (4, 33))]
    seen = []
    result = bench.run_bench(["norms", "softmax"], kernels_by_name=packages, device=device, peers=("aten",),
                             ceilings={"copy_gbps": 100.0}, timer=_fake_timer(2.0), host_timer=lambda fn: 1.0,
                             progress=False, dtype="fp32",
                             cases=cases, on_case=lambda r: seen.append(len(r["rows"])))
    assert seen == [3, 5] and [c[0] for c in result["case_seconds"]] == ["norms rms_norm fwd 3x40", "softmax softmax fwd 4x33"]
    assert {(s["op"], s["best_peer"]) for s in result["summary"]} == {("rms_norm", "F.rms_norm"), ("softmax", "torch.softmax")}
    assert all(r["ok"] for r in result["rows"]) and result["env"]["dtype"] == "fp32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        bench.run_bench(["norms"], kernels_by_name=packages, dtype="int8", ceilings={}, cases=[])


# ---------------------------------------------------------------- e2e
def test_model_configs_have_the_real_parameter_counts():
    from transformers import AutoModelForCausalLM

    def count(name, layers=None):
        with torch.device("meta"):
            return sum(p.numel() for p in AutoModelForCausalLM.from_config(e2e.model_config(name, layers)).parameters())

    assert count("llama3-8b") == 8_030_261_248  # Meta-Llama-3-8B
    assert count("smollm2-135m") == 134_515_008  # SmolLM2-135M (tied embeddings)
    assert count("llama3-8b", 2) < 1.5e9
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        e2e.model_config("gpt5")
    with pytest.raises(ValueError, match="layers must be >= 1"):
        e2e.model_config("llama3-8b", 0)


def test_decode_rate():
    r = e2e.decode_rate(batch=64, new_tokens=33, t_new=2.0, t_one=0.4)
    assert r["decode_tok_s"] == pytest.approx(64 * 32 / 1.6)
    assert r["per_seq_tok_s"] == pytest.approx(20.0) and r["ms_per_step"] == pytest.approx(50.0)
    assert math.isnan(e2e.decode_rate(1, 1, 1.0, 0.5)["decode_tok_s"])


def test_e2e_per_run_column_skips_nan_repeats():
    """A repeat whose decode time was not positive gives a NaN speedup: the 'per run' range is over the others,
    wherever the NaN sits, and says how many."""
    nan = float("nan")
    for runs, want in (([1.1, nan, 0.9], "| 0.90 … 1.10 (2 of 3) |"), ([nan, 1.1, 0.9], "| 0.90 … 1.10 (2 of 3) |"),
                       ([0.9, 1.1], "| 0.90 … 1.10 |"), ([nan], "| 1.00 |  |  |  |  |")):
        row = {"model": "m", "layers": 1, "real_layers": 1, "batch": 1, "variant": "kernelize", "speedup": 1.0,
               "speedup_runs": runs}
        line = [ln for ln in e2e._md({"env": {}, "rows": [row]}).splitlines() if ln.startswith("| m |")][0]
        assert want in line, line


def test_e2e_tiny_model_on_cpu(device, tmp_path, installed):
    """The whole e2e flow on a tiny Llama: eager and kernelized (norms, MLPs, SiLU, decoder layers, rotary) give the
    same greedy tokens."""
    if device != "cpu":
        pytest.skip("CPU flow check; the GPU runs the real shapes")
    from transformers.models.llama import modeling_llama

    rotary = modeling_llama.apply_rotary_pos_emb  # module-level: the eager model and the deep copy both call it
    ran = []
    hook = rotary.register_forward_hook(lambda module, args, out: ran.append(module.forward.__func__.__qualname__))
    try:
        result = e2e.run_e2e("tiny-llama", batches=(1, 3), new_tokens=3, prompt_len=5, device="cpu", dtype="float32",
                             repeats=2)
    finally:
        hook.remove()
    # eager ran transformers' rotary (the e2e makes no process-wide swap: the kernelized model's LlamaAttention layers
    # call the rotary kernel themselves), and the function is left as it was
    assert set(ran) == {"_create_func_module.<locals>.Func.forward"}, set(ran)
    assert "forward" not in vars(rotary) or vars(rotary)["forward"].__func__.__qualname__ != "RotaryPosEmb.forward"
    rows = {(r["variant"], r.get("batch")): r for r in result["rows"]}
    assert set(rows) == {("eager", 1), ("eager", 3), ("kernelize", 1), ("kernelize", 3)}, result["rows"]
    for b in (1, 3):
        k = rows[("kernelize", b)]
        assert "error" not in k and k["tokens_equal"] is True and k["repeatable"] is True, k
        assert rows[("eager", b)]["repeatable"] is True
        # timings on a shared CPU are noise (t(3 tokens) - t(1 token) may even be <= 0, reported as nan)
        assert k["prefill_ms"] > 0 and {"decode_tok_s", "per_seq_tok_s", "ms_per_step", "speedup"} <= set(k)
        # per repeat: kernelize against the eager run of the same repeat
        e = rows[("eager", b)]
        assert len(k["decode_tok_s_runs"]) == len(e["decode_tok_s_runs"]) == len(k["speedup_runs"]) == 2
        for s, kr, er in zip(k["speedup_runs"], k["decode_tok_s_runs"], e["decode_tok_s_runs"]):
            assert (math.isnan(s) and (math.isnan(kr) or math.isnan(er))) or s == pytest.approx(kr / er)
        assert "speedup_runs" not in e
    assert rows[("kernelize", 1)]["swapped"] == {"LlamaDecoderLayer": 2, "LlamaRMSNorm": 5, "LlamaMLP": 2,
                                                 "SiLUActivation": 2, "LlamaAttention": 2}
    paths = e2e.write_e2e_report(result, tmp_path, "e2e_tiny")
    md = paths[1].read_text()
    assert "| tiny-llama | 2 | 3 | kernelize |" in md and "| yes | yes |" in md and "| vs eager | per run |" in md
    assert ("kernelize swapped 2 × LlamaAttention, 2 × LlamaDecoderLayer, 2 × LlamaMLP, 5 × LlamaRMSNorm, "
            "2 × SiLUActivation") in md



# ---------------------------------------------------------------- kernels benchmark (the Hub's runner)
BENCH_SCRIPTS = sorted((ROOT / "benchmarks").glob("benchmark_*.py"))


def test_every_package_ships_kernels_benchmark_workloads(built):
    """Each package's Hub tree carries benchmarks/benchmark_<short>*.py (matmul/attention: their own authors)."""
    for name, b in built.items():
        scripts = sorted((b.path / "benchmarks").glob("benchmark*.py"))
        if name in ("triton-matmul", "triton-attention") and not scripts:
            continue
        assert scripts, f"{name} has no benchmarks/benchmark*.py for `kernels benchmark`"


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda p: p.name)
def test_kernels_benchmark_conventions(script):
    """Found by kernels' own discovery; every benchmark_<w> has a verify_<w> (the runner checks self.out
    against it) and a setup; classes define a seed."""
    from kernels.benchmark import Benchmark
    from kernels.cli.benchmark import discover_benchmark_classes

    classes = discover_benchmark_classes(script, script.parent)
    assert classes, f"{script.name}: no kernels.benchmark.Benchmark subclass"
    for cls in classes:
        assert issubclass(cls, Benchmark) and cls.seed is not None
        workloads = [n.removeprefix("benchmark_") for n in dir(cls) if n.startswith("benchmark_") and callable(getattr(cls, n))]
        assert workloads, cls.__name__
        for w in workloads:
            assert callable(getattr(cls, f"verify_{w}", None)), f"{cls.__name__}.benchmark_{w} has no verify_{w}"
            assert callable(getattr(cls, f"setup_{w}", None)) or cls.setup is not Benchmark.setup, f"{cls.__name__}: no setup for {w}"


@pytest.mark.slow
@pytest.mark.parametrize("package", ["triton-norms", "triton-activations", "triton-softmax"])
def test_kernels_benchmark_runs_and_verifies(package, built):
    """`kernels benchmark <built tree>`'s own runner: every workload runs and passes its verify (CPU shapes)."""
    pytest.importorskip("tabulate")  # kernels[benchmark]
    from kernels.cli.benchmark import run_benchmark_script

    path = built[package].path
    scripts = sorted((path / "benchmarks").glob("benchmark*.py"))
    assert scripts
    for script in scripts:
        results, sha = run_benchmark_script(script, iterations=1, warmup=0, cwd=path, repo_id=str(path), is_local=True, revision="local")
        assert results and sha
        assert all(t.verified is True for t in results.values()), {k: t.verified for k, t in results.items()}


@pytest.mark.slow
def test_compiled_peer_in_backward_only_mode(packages, device):
    """The backward-alone timing keeps the graph (retain_graph): a compiled peer must not donate its buffers."""
    if device != "cpu":
        pytest.skip("the GPU run covers it")
    for mode in ("fwd+bwd", "bwd"):  # as in the sweep: dynamo reuses the fwd+bwd case's graph for the same code
        rows = bench.run_case(_spec("triton-norms", "rms_norm", mode), (4, 24), packages["triton-norms"], torch.float32, device,
                              peers=("compile",), timer=_fake_timer(1.0), host_timer=lambda fn: 1.0)
        row = next(r for r in rows if r["provider"] == "torch.compile")
        assert row.get("ok") is True and "error" not in row, row


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))



def test_graph_replays_give_kernel_rates_and_a_failed_capture_is_noted(packages, device, tmp_path):
    """``graph_timer`` adds graph_ms / graph_value per timed row; a provider that cannot be replayed keeps its
    do_bench value and gets graph_error; the summary compares ours with the best replayed peer."""
    spec = _spec("triton-norms", "rms_norm")
    seen = []

    def graph_timer(fn, rep):
        seen.append(rep)
        if len(seen) == 2:  # the second provider "cannot be captured"
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.25 if len(seen) == 1 else 0.2

    shape = SMALL["triton-norms"]
    rows = bench.run_case(spec, shape, packages["triton-norms"], torch.float32, device, peers=("eager", "aten"),
                          ceilings={"copy_gbps": 1000.0}, timer=_fake_timer(1.0), host_timer=lambda fn: 900.0,
                          graph_timer=graph_timer, rep=100)
    timed = [r for r in rows if "ms" in r]
    assert timed[0]["provider"] == "ours" and len(timed) >= 3 and seen == [25] * len(timed)
    ours, failed, peer = timed[:3]
    assert ours["graph_ms"] == 0.25 and ours["graph_value"] == pytest.approx(spec.work(shape, 4) / 0.25e-3 / 1e9)
    assert "graph_ms" not in failed and "capturing" in failed["graph_error"] and failed["value"] > 0
    (s,) = bench.best_peers(rows)
    assert s["host_bound"] and s["ratio"] == pytest.approx(1.0)  # the same fake do_bench time for all
    assert s["graph_peer"] == peer["provider"] and s["graph_ratio"] == pytest.approx(0.2 / 0.25)
    md = bench._markdown({"env": {}, "rows": rows, "summary": [s]}, "t")
    assert "0.80 **below**" in md and "1 of 1 shapes at or above the best peer." in md
    assert "left out): 0 of 1 shapes at or above the best peer." in md
    assert "| n/a |" in md  # the failed capture in the all-rows table
    assert "Ceilings measured in this run: none." in md
    md = bench._markdown({"env": {}, "rows": rows, "summary": [s], "ceilings": {"copy_gbps": 3041.4}}, "t")
    assert "Ceilings measured in this run: device copy 3041 GB/s." in md  # no empty matmul ceiling when not run
    md = bench._markdown({"env": {}, "rows": rows, "ceilings": {"copy_gbps": 3041.4, "matmul_tflops": 702.2}}, "t")
    assert "device copy 3041 GB/s; torch.matmul 8192³ 702 TFLOP/s." in md
    seen.clear()
    bwd = bench.run_case(_spec("triton-norms", "rms_norm", "bwd"), shape, packages["triton-norms"], torch.float32, device,
                         peers=("aten",), timer=_fake_timer(1.0), host_timer=lambda fn: 1.0, graph_timer=graph_timer)
    assert not seen and all("graph_ms" not in r and "graph_error" not in r for r in bwd)  # backward alone: not replayed


# ----------------------------------------------------------------------------- gaps a mutation run found


def test_decode_work_counts_the_query_and_the_output():
    spec = next(s for s in REGISTRY["triton-attention"] if s.op == "flash_attention decode")
    B, H, Sk, D = 2, 32, 16, 8
    assert spec.work((B, H, Sk, D), 2) == (2 * B * (H // 4) * Sk * D + 2 * B * H * D) * 2  # k, v + q, o


class _FakeLM:
    """generate() appends ``max_new_tokens`` tokens, each run different unless ``fixed``."""

    def __init__(self, fixed: bool):
        self.fixed, self.runs, self.lengths = fixed, 0, []

    def __call__(self, ids, **kwargs):
        return None

    def generate(self, ids, max_new_tokens, **kwargs):
        self.runs += 1
        self.lengths.append(max_new_tokens)
        new = torch.arange(max_new_tokens) + (0 if self.fixed else self.runs)
        return torch.cat([ids, new.expand(ids.shape[0], -1)], dim=1)


def test_e2e_measure_returns_the_new_tokens_and_notes_unrepeatable_runs():
    ids = torch.full((2, 5), 7, dtype=torch.long)
    measured = e2e._measure({"eager": _FakeLM(True), "other": _FakeLM(False)}, ids, new_tokens=3, device="cpu",
                            repeats=2)
    row, tokens = measured["eager"]
    assert torch.equal(tokens, torch.arange(3).expand(2, -1)) and row["repeatable"] is True
    assert measured["other"][0]["repeatable"] is False


def test_e2e_measure_warms_up_every_model_over_the_timed_length():
    models = {"eager": _FakeLM(True), "kernelize": _FakeLM(True)}
    e2e._measure(models, torch.full((1, 5), 7, dtype=torch.long), new_tokens=6, device="cpu", repeats=1)
    for model in models.values():  # the warm-up, then the repeat's one-token and full generate
        assert model.lengths == [6, 1, 6]
