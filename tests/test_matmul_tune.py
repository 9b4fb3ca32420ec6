"""``triton-collection tune`` (the parts that run without a GPU) and the ``kernels benchmark`` workloads of
triton-matmul under the interpreter.

The tuner's measuring loop needs a GPU; here: its config file is read back by the package's own
loader (same buckets, same configs, nearest-bucket lookup), candidate files parse, shapes are
validated, the CLI has the subcommand and fails clearly without a GPU, and every benchmark
workload's output passes the runner's own check (``torch.allclose(atol=1e-2)``) against eager
PyTorch -- with a poisoned output failing it.
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from triton_collection import tune
from triton_collection.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def _launch_module(matmul):
    return sys.modules[matmul.__name__ + "._launch"]


def _result(shape, best, tflops, cublas):
    r = tune.BucketResult(shape, {"ms": 1.0, "tflops": cublas})
    if best is not None:
        r.best, r.best_measure = best, {"ms": 1.0, "tflops": tflops, "max_rel_err": 1e-3}
    return r


def test_config_file_round_trip(matmul, tmp_path, monkeypatch):
    cands = tune.default_candidates(16) + tune.default_candidates(4096)
    results = [_result((16, 4096, 4096), cands[2], 10.5, 12.0), _result((64, 4096, 4096), None, 0, 5.0),
               _result((4096, 4096, 4096), cands[-2], 700.0, 720.0)]
    launch = _launch_module(matmul)
    monkeypatch.setattr(launch, "CONFIG_DIR", tmp_path)
    launch.load_buckets.cache_clear()
    launch.pick_config.cache_clear()
    try:
        data = tune.write_config_file(tmp_path / "Test_GPU_X.json", "Test GPU X", results, {"triton": "3.6.0"})
        assert data["tuned"] is True and data["triton"] == "3.6.0"
        assert [(e["M"], e["N"], e["K"]) for e in data["configs"]] == [(16, 4096, 4096), (4096, 4096, 4096)]
        assert data["configs"][1]["tflops"] == 700.0 and data["configs"][1]["cublas_tflops"] == 720.0
        buckets = launch.load_buckets("Test GPU X")
        assert [b[0] for b in buckets] == [(16, 4096, 4096), (4096, 4096, 4096)]
        assert buckets[0][1] == matmul.MatmulConfig.from_json(cands[2]) and buckets[0][1].split_k == 4
        assert buckets[1][1].to_json() == {k: v for k, v in cands[-2].items()}
        # nearest bucket in log2 distance: 8 rows -> the 16-row bucket, 2000 rows -> the 4096-row one
        small = matmul.pick_config(8, 4096, 4096, "Test GPU X")
        big = matmul.pick_config(2000, 4096, 4096, "Test GPU X")
        assert small.split_k == 4 and small.block_m == 16
        assert (big.block_m, big.block_n, big.persistent, big.num_stages) == (128, 256, 1, 4)
    finally:
        launch.load_buckets.cache_clear()
        launch.pick_config.cache_clear()
    with pytest.raises(RuntimeError, match="nothing to write"):
        tune.write_config_file(tmp_path / "none.json", "x", [results[1]])


def test_tune_records_the_stages_that_ran(matmul, monkeypatch, tmp_path):
    """A candidate whose pipeline did not fit shared memory ran with fewer stages (the launcher's fallback):
    measure() reports them and the config file records them, not the stages asked for."""
    mod = sys.modules[matmul.__name__ + ".matmul"]
    cfg = tune.default_candidates(256)[0]
    ran_cfg = matmul.MatmulConfig.from_json(cfg)
    asked = ran_cfg.num_stages
    assert asked > 1

    def fake_matmul(a, b, bias, act, config):  # what _launch_fitting leaves after falling back
        mod._FITTING_STAGES[("fake", config, False, None, True, a.dtype, a.device)] = asked - 1
        return a @ b

    monkeypatch.setattr(matmul, "matmul", fake_matmul)
    monkeypatch.setattr(mod, "_FITTING_STAGES", {})
    monkeypatch.setattr(tune, "_bench", lambda fn, rep: (fn(), 1.0)[1])
    a, b = torch.randn(5, 16), torch.randn(16, 7)
    ref = (a @ b).double()
    m = tune.measure(matmul, a, b, cfg, rep_ms=1, reference=ref)
    assert m["stages_run"] == asked - 1 and m["max_rel_err"] < 1e-6
    again = tune.measure(matmul, a, b, cfg, rep_ms=1, reference=ref)  # key met before: found by its config
    assert again["stages_run"] == asked - 1
    mod._FITTING_STAGES.clear()
    monkeypatch.setattr(matmul, "matmul", lambda a, b, bias, act, config: a @ b)
    assert "stages_run" not in tune.measure(matmul, a, b, cfg, rep_ms=1, reference=ref)
    r = tune.BucketResult((256, 7, 16), {"ms": 1.0, "tflops": 1.0}, best=cfg, best_measure=m)
    entry = tune.write_config_file(tmp_path / "x.json", "x", [r])["configs"][0]
    assert entry["num_stages"] == asked - 1 and entry["BLOCK_M"] == cfg["BLOCK_M"]


def test_shipped_files_load(matmul):
    # every shipped file parses, every config passes MatmulConfig.check (a typo fails here, not on a GPU)
    launch = _launch_module(matmul)
    for path in sorted(launch.CONFIG_DIR.glob("*.json")):
        gpu = None if path.stem == "default" else json.loads(path.read_text())["gpu"]
        assert launch.config_file_name(gpu) == path.name if gpu else True
        assert len(launch.load_buckets(gpu)) >= 1


def test_candidates_and_shapes(tmp_path):
    for M in (1, 16, 64, 256, 1024, 4096, 16384):
        for c in tune.default_candidates(M):
            cfg_keys = {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "TMA", "PERSISTENT",
                        "WARP_SPECIALIZE", "EPILOGUE_SUBTILE", "SPLIT_K", "GEMV", "STREAM_K", "SUB_N", "GLUON"}
            assert set(c) == cfg_keys and c["num_warps"] * 32 <= 1024
            # GEMV configs: BLOCK_N is the number of output columns per program (any power of two)
            lows = {"BLOCK_M": 16, "BLOCK_N": 1 if c["GEMV"] else 16, "BLOCK_K": 16}
            assert all(c[k] >= low and c[k] & (c[k] - 1) == 0 for k, low in lows.items())
    one = [{"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}]
    (tmp_path / "list.json").write_text(json.dumps(one))
    assert tune._load_candidates(str(tmp_path / "list.json"))(7) == one
    per_m = {"16": one, "4096": one * 2}
    (tmp_path / "per_m.json").write_text(json.dumps(per_m))
    pick = tune._load_candidates(str(tmp_path / "per_m.json"))
    assert pick(1) == one and pick(2048) == one * 2 and pick(100) == one
    # a bad file is one line naming it (it was a traceback after the build, or log2(0) for a key "0")
    (tmp_path / "zero.json").write_text(json.dumps({"0": one}))
    (tmp_path / "text.json").write_text("configs: none")
    for name, message in (("missing.json", "cannot read it"), ("text.json", "not JSON"),
                          ("zero.json", "expected a list of configs")):
        with pytest.raises(SystemExit, match=f"tune --candidates .*{name}: {message}"):
            tune._load_candidates(str(tmp_path / name))
    assert tune._parse_shape("1,4096,14336") == (1, 4096, 14336)
    for bad in ("1,2", "a,b,c", "0,4,4"):
        with pytest.raises(Exception, match="M,N,K|>= 1"):
            tune._parse_shape(bad)
    assert all(len(s) == 3 and min(s) >= 1 for s in tune.DEFAULT_BUCKETS)
    assert {s[0] for s in tune.DEFAULT_BUCKETS} == {1, 16, 64, 256, 1024, 4096, 16384}
    assert len(set(tune.DEFAULT_BUCKETS)) == 49 and tune.DEFAULT_BUCKETS[:7] == [(m, 4096, 4096) for m in tune.BUCKET_M]


def test_cli(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["tune", "--help"])
    assert exit_info.value.code == 0
    assert "--candidates" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert cli_main(["tune", "--root", str(ROOT)]) == 1
        assert "needs a GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--min-gain goes with --update"):  # it would be ignored
        cli_main(["tune", "--root", str(ROOT), "--min-gain", "0.1"])


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("benchmark_matmul", ROOT / "benchmarks" / "benchmark_matmul.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_workloads(matmul, device):
    mod = _benchmark_module()
    names = [n[len("benchmark_"):] for n in dir(mod.MatmulBenchmark) if n.startswith("benchmark_")]
    assert len(names) == 7
    for name in names:
        bench = mod.MatmulBenchmark()
        bench.kernel, bench.device = matmul, device
        torch.manual_seed(bench.seed)
        getattr(bench, f"setup_{name}")()
        getattr(bench, f"benchmark_{name}")()
        expected = getattr(bench, f"verify_{name}")()
        assert bench.out.shape == expected.shape and bench.out.dtype == expected.dtype
        assert torch.allclose(bench.out, expected, atol=1e-2), name  # the runner's check
        assert expected.abs().max() < 1.0  # scaled so that atol=1e-2 means ~2 bf16 ulps
        poisoned = bench.out.clone()
        poisoned.view(-1)[poisoned.numel() // 2] += 0.1
        assert not torch.allclose(poisoned, expected, atol=1e-2)
    assert mod.flops(2, 3, 5) == 60 and math.isclose(mod.flops(4096, 4096, 4096) / 1e12, 0.137438953472)


@pytest.mark.parametrize("backend,arch", [pytest.param("cuda", "90", marks=pytest.mark.slow), ("rocm", "gfx942")])
def test_kernels_compile_for_gpu_targets(built, backend, arch):
    """The compiled path lowers for an H100/H200 (TMA kernel, 192-wide SUB_N tiles included, stream-K kernel and the
    Gluon kernel: HGMMA in the SASS, the Gluon one without spills; GEMV) and an MI300
    (pointer and GEMV kernels)."""
    import os
    import subprocess

    script = os.path.join(os.path.dirname(__file__), "compile_matmul_targets.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, script, str(built["triton-matmul"].variant(backend)), arch],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    if arch == "90":
        gluon = [ln for ln in res.stdout.splitlines() if ln.startswith("gluon ") and "SKIPPED" not in ln]
        assert f"COMPILED {12 + len(gluon)}" in res.stdout, res.stdout
        # the sm_90 Gluon kernel: warpgroup MMA, no spills, <= 227 KiB; Tritons 3.6 to 3.9 have the Gluon it uses (a
        # later one may rename pieces: then the path is off and this says so)
        import triton

        version = tuple(int(v) for v in triton.__version__.split(".")[:2])
        assert len(gluon) == (5 if (3, 6) <= version <= (3, 9) else len(gluon)), res.stdout
        for ln in gluon:
            fields = dict(f.split("=") for f in ln.split()[4:])
            assert int(fields["hgmma"]) > 0 and int(fields["local"]) in (0, -1), ln
            assert 0 < int(fields["shared"]) <= 232448, ln
        tma = [ln for ln in res.stdout.splitlines() if ln.startswith(("tma ", "streamk "))]
        # SASS HGMMA count (PTX wgmma count where this Triton ships no cuobjdump)
        hgmma = {ln.split(" hgmma=")[0]: int(ln.split("hgmma=")[1].split()[0]) for ln in tma}
        if any(n < 0 for n in hgmma.values()):
            hgmma = {ln.split(" hgmma=")[0]: int(ln.split("wgmma_ptx=")[1].split()[0]) for ln in tma}
        # warpgroup MMA in every config with >= 64 rows per warpgroup (the 16-row split-K one uses mma.sync)
        assert all(n > 0 for name, n in hgmma.items() if not name.startswith("tma 16x")), res.stdout
    else:
        assert "COMPILED 4" in res.stdout, res.stdout  # pointer and GEMV kernels


def test_launch_fitting(matmul):
    """A pipeline that does not fit shared memory runs with fewer stages (remembered); one stage too many -> ValueError."""
    mod = sys.modules[matmul.__name__ + ".matmul"]

    class OutOfResources(Exception):  # what Triton raises at launch, matched by name
        pass

    cfg = matmul.MatmulConfig(128, 256, 64, 8, 8, 4)
    tried = []

    def launch(stages):
        tried.append(stages)
        if stages > 2:
            raise OutOfResources(f"shared memory for {stages} stages")

    key = ("test", cfg)
    mod._FITTING_STAGES.pop(key, None)
    mod._launch_fitting(launch, key, cfg)
    assert tried == [4, 3, 2] and mod._FITTING_STAGES[key] == 2
    mod._launch_fitting(launch, key, cfg)
    assert tried == [4, 3, 2, 2]  # remembered
    with pytest.raises(ValueError, match="does not fit"):
        mod._launch_fitting(lambda stages: launch(99), ("test2", cfg), cfg)
    with pytest.raises(KeyError):  # other errors pass through untouched
        mod._launch_fitting(lambda stages: {}["x"], ("test3", cfg), cfg)
    mod._FITTING_STAGES.pop(key, None)


@pytest.mark.slow
def test_results_script_smoke(tmp_path):
    """benchmarks/matmul_sweep.py --smoke (tiny shapes under the interpreter) writes JSON, Markdown and the plot."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "matmul_sweep.py"), "--smoke", "--out", str(tmp_path),
                          "--tag", "t", "--skip", "sweep"], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["checks"] and all(c["ok"] for c in data["checks"]), data["checks"]
    assert data["big"] and data["fused"]
    md = (tmp_path / "t.md").read_text()
    assert "checks pass" in md and "Fused epilogues" in md


@pytest.mark.gpu
def test_hopper_path_on_gpu(matmul, device):
    """On sm_90+: shipped configs asking for TMA launch the TMA kernel on aligned operands (GEMV and stream-K configs
    their own kernels); values match fp64."""
    if device != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an NVIDIA sm_90+ GPU")
    mod = sys.modules[matmul.__name__ + ".matmul"]
    sm90 = sys.modules[matmul.__name__ + ".matmul_sm90"]
    real, launched = mod._matmul_tma_kernel, []

    class _Count:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append(real[grid](*args, **kw))

    torch.manual_seed(8)
    plans = mod._PLANS
    mod._matmul_tma_kernel, mod._PLANS = _Count(), type(plans)()  # no plan of an earlier call: every call counted
    try:
        for M, N, K, act in [(1, 4096, 4096, None), (257, 4096, 1000, "gelu"), (300, 2 * 1024, 4096, "swiglu"),
                             (2048, 4096, 4096, None), (5, 3072, 12288, "geglu")]:
            a = torch.randn(M, K, device=device, dtype=torch.bfloat16)
            w = torch.randn(N, K, device=device, dtype=torch.bfloat16) / math.sqrt(K)
            bias = torch.randn(N, device=device, dtype=torch.bfloat16)
            gated = act in ("geglu", "swiglu")
            cfg = _launch_module(matmul).config_for(M, N // 2 if gated else N, K, a.device, gated, activation=act)
            before = len(launched)
            y = matmul.matmul(a, w.t(), bias, act)
            # aligned operands: the TMA kernel when asked, unless the GEMV kernel (few rows), stream-K or, on sm_90,
            # the Gluon kernel (a config with GLUON, a plain epilogue) takes the call
            gluon = bool(cfg.gluon) and not gated and sm90.eligible(a, w.t(), y, act, cfg)
            tma_kernel = (bool(cfg.tma) and not cfg.stream_k and not (cfg.gemv and M <= mod.GEMV_MAX_M)
                          and not gluon)
            assert len(launched) == before + tma_kernel, (M, N, K, act, cfg)
            h = a.double() @ w.double().t() + bias.double()
            if act == "swiglu":
                p, g = h.chunk(2, -1)
                r = p * torch.nn.functional.silu(g)
            elif act == "geglu":
                p, g = h.chunk(2, -1)
                r = p * torch.nn.functional.gelu(g)
            else:
                r = torch.nn.functional.gelu(h) if act == "gelu" else h
            assert float((y.double() - r).abs().max() / r.abs().max()) < 2 ** -6, (M, N, K, act)
    finally:
        mod._matmul_tma_kernel, mod._PLANS = real, plans


def test_tune_command_end_to_end_on_cpu(device, tmp_path, monkeypatch, capsys):
    """The tune subcommand's whole path (build, load, measure, check, write) with the GPU parts stubbed: the
    interpreter runs the candidates (each checked against torch.matmul), timings are fake."""
    if device != "cpu":
        pytest.skip("runs the candidates under the interpreter; on a GPU `tune` itself is the run")
    import triton_collection.tune as T

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 1")
    monkeypatch.setattr(T, "DEVICE", "cpu")
    timings = iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0])  # per bucket: the 2nd candidate is the fastest
    monkeypatch.setattr(T, "_bench", lambda fn, rep: (fn(), next(timings))[1])
    cands = [{"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 1, "num_stages": 1},
             {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 2, "num_stages": 2, "TMA": 1},
             {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2, "num_stages": 2, "SPLIT_K": 2,
              "TMA": 1}]
    (tmp_path / "c.json").write_text(json.dumps(cands))
    out = tmp_path / "Fake_GPU_1.json"
    rc = cli_main(["tune", "--root", str(ROOT), "--shape", "1,48,32", "--shape", "20,32,64", "--candidates",
                   str(tmp_path / "c.json"), "--out", str(out), "--rep-ms", "1", "--no-cublas"])
    assert rc == 0, capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["gpu"] == "Fake GPU 1" and data["tuned"] is True
    assert [(e["M"], e["N"], e["K"]) for e in data["configs"]] == [(1, 48, 32), (20, 32, 64)]
    assert data["configs"][0]["BLOCK_N"] == 32 and data["configs"][0]["tflops"] == round(2 * 48 * 32 / 1e9, 2)
    assert data["configs"][1]["BLOCK_M"] == 16 and data["configs"][1]["cublas_tflops"] is None


def test_tune_rejects_wrong_results(matmul, monkeypatch):
    """The fastest candidate loses when its values are wrong; a candidate that raises is reported, not fatal."""
    import types

    import triton_collection.tune as T

    monkeypatch.setattr(T, "DEVICE", "cpu")
    monkeypatch.setattr(T, "_bench", lambda fn, rep: (fn(), 1.0 if fn().abs().sum() == 0 else 2.0)[1])

    def fake_matmul(a, b, bias=None, activation=None, config=None):
        if config.block_n == 64:
            raise RuntimeError("does not compile")
        return torch.zeros(a.shape[0], b.shape[1]) if config.block_n == 32 else (a.float() @ b.float()).to(a.dtype)

    mm = types.SimpleNamespace(MatmulConfig=matmul.MatmulConfig, matmul=fake_matmul)
    base = {"BLOCK_M": 16, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 1, "num_stages": 1}
    cands = [{**base, "BLOCK_N": 32}, {**base, "BLOCK_N": 64}, {**base, "BLOCK_N": 16}]
    (res,) = T.tune(mm, [(8, 24, 16)], lambda M: cands, cublas=False, log=lambda *a: None)
    assert res.best["BLOCK_N"] == 16 and res.best_measure["ms"] == 2.0
    errors = [m for _, m in res.candidates if "error" in m]
    assert len(errors) == 1 and "does not compile" in errors[0]["error"]
    assert res.candidates[0][1]["max_rel_err"] == 1.0  # zeros: the whole reference is missing


def test_epilogue_names_agree(matmul):
    # tune --epilogue offers exactly the activations the package's config files may name
    assert set(tune.EPILOGUES) == set(_launch_module(matmul).EPILOGUES)
    assert {k: v for k, v in _launch_module(matmul).EPILOGUES.items() if v} == {k: True for k in tune.GATED}


def test_tune_epilogue_update_on_cpu(matmul, device, tmp_path, monkeypatch, capsys):
    """tune --epilogue --update: the config the existing file gives each bucket is timed first; a faster candidate is
    added as an "epilogue" entry only when a re-timing confirms --min-gain; every other entry stays as it was; the
    package's lookup then serves the activation from the new entry. Gated epilogues run with b of 2N columns."""
    if device != "cpu":
        pytest.skip("runs the candidates under the interpreter; on a GPU `tune` itself is the run")
    import triton_collection.tune as T

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 2")
    monkeypatch.setattr(T, "DEVICE", "cpu")
    # per bucket: incumbent, candidate B, candidate C, then the re-timing (incumbent, best) twice
    timings = iter([3.0, 1.0, 2.0, 3.0, 1.1, 2.9, 1.0,  # (20, 32, 64): B wins, re-timed gain 190%
                    1.0, 0.99, 2.0, 1.0, 0.99, 1.0, 0.99])  # (1, 48, 32): B 1% faster, below --min-gain
    monkeypatch.setattr(T, "_bench", lambda fn, rep: (fn(), next(timings))[1])
    base_entry = {"M": 20, "N": 32, "K": 64, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 1,
                  "num_warps": 1, "num_stages": 1, "tflops": 1.0, "cublas_tflops": 2.0}
    out = tmp_path / "Fake_GPU_2.json"
    out.write_text(json.dumps({"gpu": "Fake GPU 2", "tuned": True, "torch": "old", "note": "entries of a probe",
                               "configs": [base_entry]}))
    cands = [{"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 2, "num_stages": 2, "TMA": 1},
             {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 2, "num_stages": 2}]
    (tmp_path / "c.json").write_text(json.dumps(cands))
    rc = cli_main(["tune", "--root", str(ROOT), "--shape", "20,32,64", "--shape", "1,48,32", "--candidates",
                   str(tmp_path / "c.json"), "--out", str(out), "--rep-ms", "1", "--no-cublas", "--epilogue",
                   "gelu_tanh", "--update", "--min-gain", "0.03"])
    captured = capsys.readouterr()
    assert rc == 0, captured
    assert "1 of 2 measured buckets changed" in captured.out
    assert next(timings, None) is None  # every timing used: incumbents measured, both re-timed
    data = json.loads(out.read_text())
    assert data["torch"] != "old" and data["configs"][0] == base_entry
    assert data["note"] == "entries of a probe"  # the merged file keeps its note
    assert len(data["configs"]) == 2
    new = data["configs"][1]
    assert (new["M"], new["N"], new["K"], new["epilogue"]) == (20, 32, 64, "gelu_tanh")
    assert {k: new[k] for k in cands[0]} == cands[0] and len(new) == 3 + 1 + len(cands[0]) + 2

    mm = matmul
    launch = _launch_module(mm)
    buckets = launch.parse_buckets(data)
    assert launch.lookup(buckets, 20, 32, 64, activation="gelu_tanh") == mm.MatmulConfig.from_json(cands[0])
    assert launch.lookup(buckets, 20, 32, 64) == mm.MatmulConfig.from_json(base_entry)

    # gated: b has 2N columns and the candidates are checked against F.linear, chunk, p * gelu(g)
    monkeypatch.setattr(T, "_bench", lambda fn, rep: (fn(), 1.0)[1])
    shapes = []
    real_measure = T.measure

    def spy(mm_, a, b, config, *args, **kw):
        shapes.append(tuple(b.shape))
        return real_measure(mm_, a, b, config, *args, **kw)

    monkeypatch.setattr(T, "measure", spy)
    (res,) = T.tune(mm, [(20, 24, 32)], lambda M: cands, cublas=True, epilogue="geglu", log=lambda *a: None,
                    incumbent=lambda shape: cands[1], min_gain=0.03)
    assert set(shapes) == {(32, 48)} and len(shapes) == 3  # PyTorch, the incumbent, the other candidate
    assert res.incumbent is cands[1] and res.best is cands[1] and not res.improves  # a tie keeps the incumbent
    assert all(m["max_rel_err"] < 1e-2 for _, m in res.candidates) and res.cublas["ms"] == 1.0
    merged = T.write_config_file(tmp_path / "g.json", "G", [res], base={"configs": [base_entry]})
    assert merged["configs"] == [base_entry]


@pytest.mark.parametrize("update", [False, True])
@pytest.mark.parametrize("content, message", [
    ({"gpu": "NVIDIA H200", "configs": []}, "holds the configs of 'NVIDIA H200', and this GPU is 'Fake GPU 3'"),
    ({"gpu": "default", "configs": []}, "holds the configs of 'default', and this GPU is 'Fake GPU 3'"),
    ({"configs": []}, "holds configs of no named GPU (no \"gpu\"), and this GPU is 'Fake GPU 3'"),
    ("{not json", "not JSON"),
    ([1, 2], "not a config file"),
])
def test_tune_refuses_another_gpus_file_before_measuring(content, message, update, tmp_path, monkeypatch, capsys):
    """Session 63 named the H200's file as --out on a machine that turned out to be an H100: --update merged the
    H100's timings into the H200's file and renamed its "gpu". Another GPU's file (or one that is not a config
    file) is refused now, before the build, and left as it was."""
    import triton_collection.tune as T

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 3")
    monkeypatch.setattr(T, "load_matmul", lambda root: pytest.fail("built before --out was checked"))
    out = tmp_path / "NVIDIA_H200.json"
    text = content if isinstance(content, str) else json.dumps(content)
    out.write_text(text)
    with pytest.raises(SystemExit) as err:
        cli_main(["tune", "--root", str(ROOT), "--shape", "1,48,32", "--out", str(out), "--no-cublas",
                  *(["--update"] if update else [])])
    assert message in str(err.value) and str(out) in str(err.value)
    if "holds" in message:
        assert "Fake_GPU_3.json (the default --out)" in str(err.value)
    assert out.read_text() == text


@pytest.mark.parametrize("value, message", [("nan", "must be a finite number >= 0, got nan"),
                                            ("-0.1", "must be a finite number >= 0, got -0.1"),
                                            ("inf", "must be a finite number >= 0, got inf"),
                                            ("x", "expected a number, got 'x'")])
def test_min_gain_refuses_nan_and_negative_values_at_parse_time(value, message, capsys):
    """``--min-gain`` was ``type=float``: nan made ``gain < min_gain`` always False, so every challenger replaced the
    file's config, and a negative gain let slower ones in. argparse refuses them now, like the other numbers."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["tune", "--root", str(ROOT), "--update", "--min-gain", value])
    assert exit_info.value.code == 2
    assert f"argument --min-gain: {message}" in capsys.readouterr().err
    from triton_collection.argtypes import non_negative_float

    assert non_negative_float("0") == 0.0 and non_negative_float("0.03") == 0.03
