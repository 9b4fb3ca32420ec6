"""``triton-collection port-check``: launch descriptions, comparison, report, CLI errors.

The CUDA side needs a GPU and nvcc, so on CPU it is replaced by :class:`TorchClassic`: torch
code that computes what each shipped CUDA fixture computes, at the same rounding points
(written from the kernels' comments, not from the Triton ports). The Triton side is the real
port, loaded by Hub name and run under the interpreter. ``test_gpu_port_check_real`` runs the
real thing (nvcc + load_inline) on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from triton_collection import port_check as pc

ROOT = Path(__file__).resolve().parents[1]
ACT_DIR = ROOT / "ports" / "activations"
RMS_DIR = ROOT / "ports" / "rms_norm"
SMALL_SHAPES_ACT = ({"name": "small", "throughput": False, "M": 3, "d": 40},
                    {"name": "pow2", "throughput": True, "M": 4, "d": 64},
                    {"name": "prime", "throughput": False, "M": 5, "d": 37})
SMALL_SHAPES_RMS = ({"name": "small", "throughput": False, "M": 3, "N": 24},
                    {"name": "pow2", "throughput": True, "M": 4, "N": 128},
                    {"name": "prime", "throughput": False, "M": 5, "N": 67})


# ---------------------------------------------------------------- a torch stand-in for the CUDA side
def _act(name: str, a: torch.Tensor, threshold: float) -> torch.Tensor:
    """The fixtures' device functions, in fp32 (activation_kernels.cu's act:: namespace)."""
    if name == "silu":
        return a / (1.0 + torch.exp(-a))
    if name == "gelu_erf":
        return 0.5 * a * (1.0 + torch.erf(a * 0.70710678118654752440))
    if name == "gelu_tanh":
        return 0.5 * a * (1.0 + torch.tanh(0.79788456080286535588 * (a + 0.044715 * a * a * a)))
    if name == "gelu_fast":
        return 0.5 * a * (1.0 + torch.tanh(a * 0.7978845608 * (1.0 + 0.044715 * a * a)))
    if name == "gelu_quick":
        return a / (1.0 + torch.exp(-1.702 * a))
    if name == "fatrelu":
        return torch.where(a > threshold, a, torch.zeros_like(a))
    raise AssertionError(name)


class TorchClassic:
    """``launch(CudaCall)`` with torch: what each shipped CUDA kernel writes (fp32 math, same roundings)."""

    def __init__(self, break_kernel: str | None = None, how: str = "half"):
        self.calls: list[pc.CudaCall] = []
        self.break_kernel, self.how = break_kernel, how

    def launch(self, call: pc.CudaCall) -> None:
        self.calls.append(call)
        k, t = call.kernel, call.tensors
        expr = k.cuda
        if expr.startswith("rms_norm_kernel"):
            x, w, out = t["x"].float(), t["weight"].float(), t["out"]
            eps = call.args[3][1]
            rstd = torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)
            y = ((x * rstd).to(out.dtype).float() * w).to(out.dtype)
        else:
            act_name = expr.split("act::")[1].split(",")[0].split(">")[0].strip()
            x, out = t["x"], t["out"]
            if expr.startswith("gated_act_kernel"):
                d = x.shape[-1] // 2
                a, b = x[:, :d].float(), x[:, d:].float()
                threshold = call.args[3][1]
                if expr.rstrip("> ").endswith("true"):
                    y = (_act(act_name, a, threshold).to(x.dtype).float() * b).to(x.dtype)
                else:
                    y = (a * _act(act_name, b, threshold).to(x.dtype).float()).to(x.dtype)
            else:
                y = _act(act_name, x.float(), 0.0).to(x.dtype)
        if k.name == self.break_kernel:
            if self.how == "half":  # leave the second half of every row unwritten (poison stays)
                y = y.clone()
                y[..., y.shape[-1] // 2:] = out[..., y.shape[-1] // 2:]
            else:  # off by a little more than the tolerance allows at one element
                y = y.clone()
                atol, rtol = k.tolerance[call.dtype]
                y.view(-1)[7] = (y.view(-1)[7].float() + 4 * (atol + rtol * y.view(-1)[7].float().abs()) + 1e-3).to(y.dtype)
        out.copy_(y)


@pytest.fixture(scope="module")
def ports():
    return pc.load_port(ACT_DIR), pc.load_port(RMS_DIR)


@pytest.fixture(scope="module")
def small_ports(ports):
    act, rms = ports
    return dataclasses.replace(act, shapes=SMALL_SHAPES_ACT), dataclasses.replace(rms, shapes=SMALL_SHAPES_RMS)


@pytest.fixture(scope="module")
def loader(activations, norms, device):
    """The Triton ports by (package, function), for the harness tests that run on CPU tensors under the interpreter
    (``device="cpu"`` with the TorchClassic backend); on the GPU run ``test_gpu_port_check_real`` is the real check."""
    if device != "cpu":
        pytest.skip("the harness tests run the ports on CPU tensors under the interpreter")
    mods = {"triton-activations": activations, "triton-norms": norms}
    return lambda package, function: getattr(mods[package], function)


# ---------------------------------------------------------------- the shipped descriptions
def test_shipped_fixtures_parse(ports):
    act, rms = ports
    names = [k.name for k in act.kernels]
    assert names == ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul",
                     "gelu_fast", "gelu_new", "gelu_quick", "silu", "gelu", "gelu_tanh"]
    assert [k.name for k in rms.kernels] == ["rms_norm"]
    for spec in ports:
        assert len(spec.shapes) >= 3 and any(s["throughput"] for s in spec.shapes)
        for k in spec.kernels:
            assert k.dtypes == ("float32", "float16", "bfloat16")
            assert set(k.tolerance) == set(k.dtypes)
    silu = act.kernels[0]
    assert silu.package == "triton-activations" and silu.function == "silu_and_mul"
    assert silu.args == (("tensor", "out"), ("tensor", "x"), ("int", "d"), ("float", "0.0"))
    large = next(s for s in act.shapes if s["name"] == "large")
    assert pc.launch_geometry(act, silu, large, "bfloat16") == ((16384, 1, 1), (1024, 1, 1), 0)
    assert pc.bytes_moved(act, silu, large, "bfloat16") == 3 * 16384 * 14336 * 2
    assert pc.bytes_moved(act, act.kernels[5], large, "float32") == 2 * 16384 * 14336 * 4
    assert pc.tensor_shapes(act, silu, large, "float16") == {"x": (16384, 28672), "out": (16384, 14336)}
    # rms_norm: whole warps, 1024 threads for few rows, 256 for many
    k = rms.kernels[0]
    geo = {s["name"]: pc.launch_geometry(rms, k, s, "float32")[1][0] for s in rms.shapes}
    assert geo == {"small": 96, "pow2": 256, "prime": 1024, "wide-prime": 1024, "large": 256}


@pytest.mark.parametrize("text,env,expected", [
    ("min(d, 1024)", {"d": 96}, 96),
    ("min(d, 1024)", {"d": 5003}, 1024),
    ("cdiv(N, 32) * 32", {"N": 97}, 128),
    ("next_power_of_2(N)", {"N": 5003}, 8192),
    ("next_power_of_2(N)", {"N": 1}, 1),
    ("1024 if M < 256 else 256", {"M": 255}, 1024),
    ("1024 if M < 256 else 256", {"M": 256}, 256),
    ("3 * M * d * elem", {"M": 7, "d": 11, "elem": 2}, 462),
    ("-(x // 2) + 2 ** 3 % 5", {"x": 9}, -1),
    ("'eager'", {}, "eager"),
])
def test_evaluate(text, env, expected):
    assert pc.evaluate(text, env) == expected


@pytest.mark.parametrize("text,message", [
    ("__import__('os').system('true')", "only min, max, abs, cdiv, next_power_of_2 may be called"),
    ("x.real", "Attribute is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("q + 1", "unknown name 'q'"),
    ("M // 0", "by zero"),
    ("M +", "cannot parse"),
    ("min(M, key=1)", "may be called"),
    ("M ** 1000000000", "exponent 1000000000 is beyond"),  # ran for minutes (a huge int power)
])
def test_evaluate_rejects(text, message):
    with pytest.raises(pc.PortError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pc.evaluate(text, {"M": 3, "x": 2}, "here")


# ---------------------------------------------------------------- bad descriptions: clear errors
def _fixture(tmp_path: Path, edit) -> Path:
    """A copy of ports/rms_norm whose port.toml went through ``edit(text) -> text``."""
    folder = tmp_path / "fx"
    shutil.copytree(RMS_DIR, folder)
    desc = folder / "port.toml"
    desc.write_text(edit(desc.read_text()))
    return folder


def _drop_shapes(text: str, keep: int) -> str:
    head, *shapes = text.split("[[shape]]")
    tail = shapes[-1][shapes[-1].index("[tolerance]"):]
    kept = [s if "[tolerance]" not in s else s[: s.index("[tolerance]")] for s in shapes[:keep]]
    return head + "".join("[[shape]]" + s for s in kept) + tail


BAD = [
    ("no source file", lambda t: t.replace('source = "rms_norm_kernel.cu"', 'source = "missing.cu"'), "source 'missing.cu' not found"),
    ("two shapes", lambda t: _drop_shapes(t, 2), "at least 3 [[shape]] tables are needed"),
    ("no prime", lambda t: t.replace("N = 5003", "N = 5000").replace("N = 20011", "N = 20000").replace("M = 131", "M = 130")
     .replace("M = 7\n", "M = 8\n").replace("M = 3\n", "M = 4\n"), "no shape has a prime size"),
    ("no power of 2", lambda t: t.replace("M = 256", "M = 255").replace("M = 32768", "M = 32767"), "no shape has only power-of-2 sizes"),
    ("unknown top key", lambda t: "colour = 1\n" + t, "unknown key(s) colour"),
    ("unknown kernel key", lambda t: t.replace('name = "rms_norm"\ncuda', 'name = "rms_norm"\ngrd = ["M"]\ncuda'),
     "unknown key(s) grd"),
    ("missing grid", lambda t: t.replace('grid = ["M"]\n', ""), "missing required key 'grid'"),
    ("unknown name", lambda t: t.replace('grid = ["M"]', 'grid = ["rows"]'), "unknown name(s) rows"),
    ("code in expr", lambda t: t.replace('grid = ["M"]', 'grid = ["open(\'x\')"]'), "may be called"),
    ("too many threads", lambda t: t.replace('block = ["min(cdiv(N, 32) * 32, 1024 if M < 256 else 256)"]',
                                             'block = ["cdiv(N, 32) * 32"]'), "outside [1, 1024]"),
    ("3d block too big", lambda t: t.replace('block = ["min(cdiv(N, 32) * 32, 1024 if M < 256 else 256)"]',
                                             'block = ["32", "32", "2"]'), "2048 threads > 1024"),
    ("fractional grid", lambda t: t.replace('grid = ["M"]', 'grid = ["M / 2"]'), "must give a whole number"),
    ("no tolerance", lambda t: t.replace("bfloat16 = { atol = 1e-2, rtol = 1.6e-2 }\n", ""), "no tolerance for bfloat16"),
    ("bad tolerance", lambda t: t.replace("atol = 1e-2, rtol = 1.6e-2", "atol = -1, rtol = 1.6e-2"), "finite number >= 0"),
    ("bad dtype", lambda t: t.replace('dtypes = ["float32", "float16", "bfloat16"]', 'dtypes = ["float64"]'), "expected a non-empty list"),
    ("undeclared tensor", lambda t: t.replace('args = ["out", "x", "weight", "float eps", "int N"]',
                                              'args = ["out", "x", "w", "float eps", "int N"]'), "'w' is not a tensor of this kernel"),
    ("unpassed tensor", lambda t: t.replace('args = ["out", "x", "weight", "float eps", "int N"]',
                                            'args = ["out", "x", "float eps", "int N"]'), "weight are declared but not passed"),
    ("bad scalar type", lambda t: t.replace('"float eps"', '"double eps"'), "neither a tensor name nor"),
    ("bad triton target", lambda t: t.replace('triton = "triton-norms:rms_norm"', 'triton = "rms_norm"'),
     "expected \"<hub-package>:<function>\""),
    ("output unknown to triton", lambda t: t.replace('triton_returns = ["out"]\n', ""), "output 'out' is neither passed"),
    ("returns an input", lambda t: t.replace('triton_returns = ["out"]', 'triton_returns = ["x"]'), "'x' is not an output tensor"),
    ("no output", lambda t: t.replace("out = { shape = [\"M\", \"N\"], output = true }", "out = { shape = [\"M\", \"N\"] }"),
     "no tensor is marked output = true"),
    ("not toml", lambda t: t + "\n[[[", "not valid TOML"),
    ("duplicate kernel", lambda t: t + t[t.index("[[kernel]]"):], "kernel names must be unique"),
    ("tensor named like a size", lambda t: t.replace("weight = {", "N = {").replace('"weight"', '"N"'),
     "is both a tensor and a size/parameter name"),
    ("cuda kernel not in the source", lambda t: t.replace('cuda = "rms_norm_kernel<scalar_t>"', 'cuda = "rms_kernel<scalar_t>"'),
     "cuda: no __global__ function 'rms_kernel' in rms_norm_kernel.cu"),
    ("fewer args than the kernel takes", lambda t: t.replace('args = ["out", "x", "weight", "float eps", "int N"]',
                                                             'args = ["out", "x", "weight", "float eps"]'),
     "args: 4 given, but 'rms_norm_kernel' in rms_norm_kernel.cu takes 5"),
    # values the check would run with silently wrong (found by a fresh-eyes trial)
    ("NaN input scale", lambda t: t.replace('x = { shape = ["M", "N"]', 'x = { scale = nan, shape = ["M", "N"]'),
     "scale: must be a finite number, got nan"),
    ("int scalar of a float", lambda t: t.replace('"int N"', '"int eps"'), 'args "int eps": \'eps\' must give a whole number, got 1e-06'),
    ("int scalar beyond int32", lambda t: t.replace('"int N"', '"int N * 2 ** 40"'), "does not fit the C type int"),
    ("negative bytes", lambda t: t.replace('bytes = "2 * M * N * elem + N * elem"', 'bytes = "-1"'), "gives -1 < 0"),
    ("output returned twice", lambda t: t.replace('triton_returns = ["out"]', 'triton_returns = ["out", "out"]'),
     "each output may be named once"),
    ("unknown triton package", lambda t: t.replace('triton = "triton-norms:rms_norm"', 'triton = "triton-nope:rms_norm"'),
     "triton: no package 'triton-nope'"),
    ("unknown triton function", lambda t: t.replace('triton = "triton-norms:rms_norm"', 'triton = "triton-norms:nope"'),
     "triton: triton-norms exports no 'nope'"),
]


@pytest.mark.parametrize("label,edit,message", BAD, ids=[b[0] for b in BAD])
def test_bad_descriptions_give_clear_errors(tmp_path, label, edit, message):
    folder = _fixture(tmp_path, edit)
    with pytest.raises(pc.PortError) as err:
        pc.load_port(folder)
    assert message in str(err.value)
    assert "port.toml" in str(err.value)  # names the file


def test_cli_refuses_duplicate_fixture_names_and_unusable_outputs(tmp_path, capsys):
    """Two fixtures of one name would share one compiled CUDA launcher (the second kernel run for both); an
    unwritable --out / --log-jsonl lost a whole check at its end; --validate --out x.png wrote text into a .png.
    All are refused before anything runs, exit 2, one line."""
    from triton_collection.cli import main

    copy = _fixture(tmp_path, lambda t: t)  # same name = "rms_norm"
    cases = [([str(RMS_DIR), str(copy), "--validate"], "two fixtures are named 'rms_norm'"),
             ([str(RMS_DIR), "--validate", "--out", str(tmp_path / "plan.png")], "--validate writes its plan as .json"),
             ([str(RMS_DIR), "--validate", "--out", str(tmp_path)], f"--out {tmp_path}: cannot be written (a folder)"),
             ([str(RMS_DIR), "--log-jsonl", str(tmp_path)], "--log-jsonl"),
             ([str(RMS_DIR), "--out", str(tmp_path / "a_file" / "r.json")],
              f"r.json: cannot be written ({tmp_path / 'a_file'} is not a folder)"),  # it said "a folder, or no write permission"
             ([str(RMS_DIR), "--validate", "--out", str(tmp_path / "a_file" / "sub" / "plan.json")],
              f"plan.json: cannot be written ({tmp_path / 'a_file'} is not a folder)")]
    (tmp_path / "a_file").write_text("")
    for args, message in cases:
        assert main(["port-check", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("port-check: ") and message in err and err.count("\n") == 1, err
    assert main(["port-check", str(RMS_DIR), "--validate", "--out", str(tmp_path / "plan.json")]) == 0


def test_missing_description(tmp_path):
    with pytest.raises(pc.PortError, match="no launch description"):
        pc.load_port(tmp_path)


# ---------------------------------------------------------------- comparison
def test_compare_counts_and_errors():
    ref = torch.tensor([1.0, -2.0, 0.0, 4.0, float("inf")])
    same = pc.compare(ref.clone(), ref, atol=1e-3, rtol=1e-3)
    assert same == {"numel": 5, "ok": True, "max_abs": 0.0, "max_rel": 0.0, "tol_used": 0.0, "mismatches": 0}
    near = ref.clone()
    near[3] = 4.003  # within 1e-3 + 1e-3 * 4
    assert pc.compare(near, ref, 1e-3, 1e-3)["ok"]
    off = ref.clone()
    off[1] = -2.01
    r = pc.compare(off, ref, 1e-3, 1e-3)
    assert not r["ok"] and r["mismatches"] == 1
    assert r["max_abs"] == pytest.approx(0.01, rel=1e-4) and r["max_rel"] == pytest.approx(0.005, rel=1e-4)
    assert r["tol_used"] == pytest.approx(0.01 / 0.003, rel=1e-4)
    poisoned = ref.clone()
    poisoned[0] = float("nan")  # an element the port never wrote
    r = pc.compare(poisoned, ref, 1, 1)
    assert not r["ok"] and r["mismatches"] == 1 and math.isinf(r["max_abs"])
    both = torch.tensor([float("nan"), 1.0])
    assert pc.compare(both.clone(), both, 0, 0)["ok"]
    assert not pc.compare(torch.tensor([-float("inf")]), torch.tensor([float("inf")]), 1, 1)["ok"]
    r = pc.compare(torch.zeros(2, 3), torch.zeros(3, 2), 1, 1)
    assert not r["ok"] and "Triton gave (2, 3)" in r["error"]
    assert not pc.compare(torch.zeros(3, dtype=torch.float16), torch.zeros(3), 1, 1)["ok"]


def test_compare_bf16_tolerance():
    ref = torch.randn(1000).to(torch.bfloat16)
    one_ulp = (ref.float() * (1 + 2**-8)).to(torch.bfloat16)  # at most one ulp away
    assert pc.compare(one_ulp, ref, 1e-2, 1.6e-2)["ok"]
    assert not pc.compare((ref.float() * 1.05).to(torch.bfloat16), ref, 1e-2, 1.6e-2)["ok"]


# ---------------------------------------------------------------- generated CUDA source
def test_build_sources_one_extension(ports):
    cpp, cuda, names = pc.build_sources(ports)
    assert names == [f"port_launch_{i}" for i in range(12)]
    for n in names:
        assert f"void {n}(std::vector<int64_t> cfg, std::vector<at::Tensor> t, std::vector<double> s);" in cpp
        assert f"void {n}(" in cuda
    assert "namespace port_src_0 {" in cuda and "namespace port_src_1 {" in cuda
    assert cuda.count("#include <cuda_runtime.h>") == 1  # includes hoisted out of the namespaces, deduplicated
    assert "gated_act_kernel<scalar_t, act::silu, true><<<grid, block, smem, stream>>>(" in cuda
    assert "static_cast<float>(s[1])" in cuda and "static_cast<int>(s[0])" in cuda
    launcher = cuda[cuda.index("void port_launch_11("):]
    assert "rms_norm_kernel<scalar_t><<<grid, block, smem, stream>>>(reinterpret_cast<scalar_t*>(t[0].data_ptr()), " \
           "reinterpret_cast<scalar_t*>(t[1].data_ptr()), reinterpret_cast<scalar_t*>(t[2].data_ptr()), " \
           "static_cast<float>(s[0]), static_cast<int>(s[1]))" in launcher
    for cxx in ("float", "c10::Half", "c10::BFloat16"):
        assert f"using scalar_t = {cxx};" in launcher
    assert "C10_CUDA_KERNEL_LAUNCH_CHECK();" in launcher


# ---------------------------------------------------------------- the machinery, CUDA side in torch
def _timer():
    """Alternates 2.0 ms (the CUDA launch, timed first) and 1.0 ms (the port)."""
    state = {"n": 0}

    def timer(fn):
        fn()
        state["n"] += 1
        return 2.0 if state["n"] % 2 else 1.0

    return timer


def test_run_port_check_all_ports_agree(small_ports, loader):
    backend = TorchClassic()
    report = pc.run_port_check(small_ports, cuda=backend, triton_loader=loader, device="cpu", seed=123,
                               timer=_timer())
    assert len(report.rows) == (11 + 1) * 3 * 3
    bad = [(r.kernel, r.dtype, r.shape, r.error, r.outputs) for r in report.rows if not r.ok]
    assert not bad
    assert report.ok and report.env["seed"] == 123
    for r in report.rows:
        assert set(r.outputs) == {"out"} and r.outputs["out"]["numel"] > 0
        assert r.ratio == 2.0 and r.triton_gbps == pytest.approx(2 * r.cuda_gbps, rel=1e-2)
    row = next(r for r in report.rows if r.kernel == "silu_and_mul" and r.shape == "prime" and r.dtype == "float16")
    assert row.bytes == 3 * 5 * 37 * 2 and row.grid == [5, 1, 1] and row.block == [37, 1, 1]
    assert row.cuda_gbps == pytest.approx(row.bytes / 2e-3 / 1e9, rel=1e-3)
    s = report.summary()
    assert s["checks"] == 108 and s["failed"] == 0 and s["throughput_ratio_min"] == 2.0
    assert set(s["throughput_ratio_min_per_kernel"]) == {f"activations/{k.name}" for k in small_ports[0].kernels} | {"rms_norm/rms_norm"}
    # fp32: the ports match the classic kernels to a few ulps (exp/erf/tanh differ in the last bits)
    for r in report.rows:
        if r.dtype == "float32":
            assert r.max_abs < 1e-4 and r.tol_used <= 1, (r.kernel, r.shape, r.max_abs, r.tol_used)
    # every launch got its own fresh buffers and the described geometry
    assert len(backend.calls) == 108 * 2  # the check + the timed call (the fake timer calls once)
    call = next(c for c in backend.calls if c.kernel.name == "rms_norm")
    assert call.args[3] == ("float", 1e-6) and call.args[4][0] == "int"


def test_timed_calls_share_inputs_and_outputs(small_ports, loader):
    """While timed, the CUDA kernel reads the port's inputs and writes the port's output tensor (a tiny kernel's
    time depends on where its buffers lie); the correctness launch wrote a buffer of its own."""
    backend, seen = TorchClassic(), []

    def recording_loader(package, function):
        fn = loader(package, function)
        return lambda out, x, *a, **k: (seen.append((out.data_ptr(), x.data_ptr())), fn(out, x, *a, **k))[1]

    pc.run_port_check(small_ports[:1], cuda=backend, triton_loader=recording_loader, device="cpu", seed=3,
                      timer=_timer(), kernels=["gelu_fast"], dtypes=["float32"], shapes=["small"])
    checked, timed = backend.calls
    assert len(seen) >= 2 and len(set(seen)) == 1
    assert (timed.tensors["out"].data_ptr(), timed.tensors["x"].data_ptr()) == seen[0]
    assert checked.tensors["out"].data_ptr() != seen[0][0] and checked.tensors["x"].data_ptr() == seen[0][1]


def test_timed_call_of_a_returning_port_keeps_its_own_output(small_ports, loader):
    """A port that returns its output (rms_norm) allocates it per call: the timed CUDA call then writes the output
    of the correctness launch (declared shape), never a tensor the port returned (which may have any shape)."""
    backend, returned = TorchClassic(), []

    def recording_loader(package, function):
        fn = loader(package, function)

        def port(*a, **k):
            out = fn(*a, **k)
            returned.append(out[0] if isinstance(out, tuple) else out)
            return out
        return port

    pc.run_port_check(small_ports[1:], cuda=backend, triton_loader=recording_loader, device="cpu", seed=3,
                      timer=_timer(), dtypes=["float32"], shapes=["small"])
    checked, timed = backend.calls
    assert timed.tensors["out"] is checked.tensors["out"]
    assert all(timed.tensors["out"].data_ptr() != r.data_ptr() for r in returned)


def test_same_seed_same_inputs_new_seed_new_inputs(small_ports, loader):
    def inputs(seed):
        backend = TorchClassic()
        pc.run_port_check(small_ports, cuda=backend, triton_loader=loader, device="cpu", seed=seed, time_results=False,
                          kernels=["silu_and_mul"], dtypes=["float32"], shapes=["small"])
        return backend.calls[0].tensors["x"].clone()

    a, b, c = inputs(5), inputs(5), inputs(6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.std() > 1.0  # scale = 2.0 in port.toml


@pytest.mark.parametrize("how", ["half", "tolerance"])
def test_mismatch_is_reported(small_ports, loader, how):
    report = pc.run_port_check(small_ports, cuda=TorchClassic(break_kernel="gelu_tanh_and_mul", how=how),
                               triton_loader=loader, device="cpu", seed=1, time_results=False,
                               kernels=["gelu_tanh_and_mul", "silu_and_mul"], dtypes=["float16"])
    assert not report.ok
    failed = {(r.kernel, r.shape) for r in report.rows if not r.ok}
    assert failed == {("gelu_tanh_and_mul", s["name"]) for s in SMALL_SHAPES_ACT}
    r = next(r for r in report.rows if r.kernel == "gelu_tanh_and_mul" and r.shape == "prime")
    if how == "half":  # the CUDA side left poison: every element of the right half differs
        assert r.mismatches == 5 * (37 - 37 // 2)
    else:
        assert r.mismatches == 1 and r.max_abs > 0
    assert report.summary()["failed"] == 3
    assert "FAIL" in report.table()


def test_exceptions_become_error_rows(small_ports):
    def loader(package, function):
        if function == "gelu_new":
            raise ImportError("no such build")
        return lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kernel exploded"))

    report = pc.run_port_check(small_ports[:1], cuda=TorchClassic(), triton_loader=loader, device="cpu", seed=1,
                               time_results=False, kernels=["gelu_new", "gelu_fast"], dtypes=["float32"])
    assert len(report.rows) == 6 and not report.ok
    assert all("RuntimeError: kernel exploded" in r.error for r in report.rows if r.kernel == "gelu_fast")
    assert all("loading triton-activations:gelu_new: ImportError: no such build" in r.error
               for r in report.rows if r.kernel == "gelu_new")
    assert "ERROR" in report.table()


def test_make_timer_kinds():
    assert set(pc.TIMERS) == {"do_bench", "cudagraph"}
    with pytest.raises(pc.PortError, match="unknown timer 'wallclock'"):
        pc.make_timer("wallclock")


def test_unknown_filters(small_ports):
    for kw in ({"kernels": ["swish"]}, {"dtypes": ["float64"]}, {"shapes": ["huge"]}):
        with pytest.raises(pc.PortError, match="unknown"):
            pc.run_port_check(small_ports, cuda=TorchClassic(), triton_loader=lambda p, f: None, device="cpu", **kw)


def test_report_formats(small_ports, loader, tmp_path):
    report = pc.run_port_check(small_ports, cuda=TorchClassic(), triton_loader=loader, device="cpu", seed=3,
                               timer=_timer(), kernels=["silu_and_mul", "rms_norm"], dtypes=["bfloat16"])
    data = json.loads(json.dumps(report.as_dict()))
    assert data["summary"]["checks"] == 6 and data["summary"]["ok"]
    assert {r["kernel"] for r in data["rows"]} == {"silu_and_mul", "rms_norm"}
    assert all(r["ratio"] == 2.0 and r["mismatches"] == 0 for r in data["rows"])
    text = report.table()
    assert "Triton/CUDA" in text and "rms_norm" in text and "pow2 4x64 *" in text
    md = report.table(markdown=True)
    assert md.startswith("| port | kernel |") and md.count("\n| ") == 6
    png = tmp_path / "r.png"
    assert report.plot(png) and png.read_bytes()[:4] == b"\x89PNG"


def test_hub_loader_loads_by_name(installed, device):
    loader = pc.HubLoader()
    fn = loader("triton-activations", "silu_and_mul")
    x = torch.randn(2, 8, device=device)
    torch.testing.assert_close(fn(x), F.silu(x[:, :4]) * x[:, 4:])
    with pytest.raises(pc.PortError, match="has no function 'nope'"):
        loader("triton-activations", "nope")
    with pytest.raises(pc.PortError, match="triton-nothing"):
        loader("triton-nothing", "f")


# ---------------------------------------------------------------- the CLI
def test_cli_validate_and_no_cuda_error(capsys, device, tmp_path):
    from triton_collection.cli import main

    assert main(["port-check", str(ACT_DIR), str(RMS_DIR), "--validate"]) == 0
    out = capsys.readouterr().out
    assert "silu_and_mul: gated_act_kernel<scalar_t, act::silu, true> -> triton-activations:silu_and_mul" in out
    assert "large: grid 32768 block 256" in out
    # the plan honours --kernel / --dtype / --shape, --json and --out; an unknown name is refused as a check refuses it
    out_json = tmp_path / "plan.json"
    assert main(["port-check", str(ACT_DIR), str(RMS_DIR), "--validate", "--kernel", "silu", "--kernel", "rms_norm",
                 "--dtype", "bfloat16", "--shape", "small", "--json", "--out", str(out_json)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(r["kernel"], r["dtypes"], list(r["shapes"])) for r in plan] == [("silu", ["bfloat16"], ["small"]),
                                                                            ("rms_norm", ["bfloat16"], ["small"])]
    assert json.loads(out_json.read_text()) == plan
    assert main(["port-check", str(ACT_DIR), "--validate", "--kernel", "nosuch"]) == 2
    assert "unknown kernel(s) nosuch; known: " in capsys.readouterr().err
    if device == "cuda":
        pytest.skip("this machine has a GPU")
    assert main(["port-check", str(RMS_DIR)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("port-check: needs a CUDA GPU") and "--validate" in err


def test_default_build_dir_honours_tmpdir(tmp_path):
    """The extension build cache defaults to $TMPDIR/triton-collection-port-check (it was /tmp whatever TMPDIR said)."""
    import subprocess

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "from triton_collection import port_check; "
                          "print(port_check.DEFAULT_BUILD_ROOT)"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "triton-collection-port-check")


def test_cli_bad_description(tmp_path, capsys):
    from triton_collection.cli import main

    folder = _fixture(tmp_path, lambda t: t.replace('grid = ["M"]', 'grid = ["rows"]'))
    assert main(["port-check", str(folder), "--validate"]) == 2
    assert "unknown name(s) rows" in capsys.readouterr().err


def test_toolchain_errors(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pc.PortError, match="needs a CUDA GPU: torch.cuda.is_available"):
        pc.require_cuda_toolchain()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(pc.shutil, "which", lambda name: None)
    with pytest.raises(pc.PortError, match="needs nvcc"):
        pc.require_cuda_toolchain()


def test_cli_writes_reports(monkeypatch, tmp_path, small_ports, loader, capsys):
    """--out FILE.json / FILE.md and the exit code, with the GPU run replaced by the torch stand-in."""
    real = pc.run_port_check

    def fake(specs, **kw):
        kw = {k: v for k, v in kw.items() if k in ("kernels", "dtypes", "shapes", "seed", "time_results", "progress")}
        return real(small_ports, cuda=TorchClassic(break_kernel=bad[0]), triton_loader=loader, device="cpu", **kw)

    monkeypatch.setattr(pc, "run_port_check", fake)
    from triton_collection.cli import main

    bad = [None]
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["port-check", str(ACT_DIR), "--kernel", "mul_and_silu", "--dtype", "float16", "--no-time", "--seed", "9",
               "--out", str(js), "--out", str(md)])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["env"]["seed"] == 9 and len(data["rows"]) == 3 and data["summary"]["ok"]
    assert "| activations | mul_and_silu | float16 |" in md.read_text()
    capsys.readouterr()
    bad[0] = "mul_and_silu"
    assert main(["port-check", str(ACT_DIR), "--kernel", "mul_and_silu", "--dtype", "float16", "--no-time", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["failed"] == 3


# ---------------------------------------------------------------- GPU: the real thing
@pytest.mark.gpu
def test_gpu_port_check_real(device, tmp_path, ports):
    """nvcc + load_inline + the Triton ports on the GPU: every shipped kernel agrees at the small shapes."""
    if device != "cuda":
        pytest.skip("needs TEST_DEVICE=cuda, a CUDA GPU and nvcc")
    report = pc.run_port_check(ports, device="cuda", shapes=["small", "pow2", "prime"], time_results=False)
    assert len(report.rows) == (11 + 1) * 3 * 3
    assert report.ok, report.table()
    assert report.env["compile_seconds"] >= 0 and report.env["arch"].startswith("sm_")  # 0.0: cached extension


def test_a_selection_that_runs_nothing_is_refused(tmp_path):
    """``--dtype bfloat16`` on kernels that take only float32 planned a kernel with no dtypes (exit 0) while the
    check itself ran no row and failed at its end (exit 1); the selection is refused up front."""
    spec = pc.load_port(_fixture(tmp_path, lambda t: t.replace('dtypes = ["float32", "float16", "bfloat16"]',
                                                               'dtypes = ["float32"]')))
    assert [k.name for s in pc.select([spec], dtypes=["float32"]) for k in s.kernels] == ["rms_norm"]
    with pytest.raises(pc.PortError, match="nothing to run: no selected kernel takes bfloat16"):
        pc.select([spec], dtypes=["bfloat16"])


# ----------------------------------------------------------------------------- gaps a mutation run found


def test_tolerance_is_read_as_atol_then_rtol(ports):
    act, _ = ports
    assert act.kernels[0].tolerance["bfloat16"] == (1e-2, 1.6e-2)  # port.toml: { atol = 1e-2, rtol = 1.6e-2 }


def test_compare_tolerance_is_relative_to_the_reference():
    assert not pc.compare(torch.tensor([2.0]), torch.tensor([1.0]), atol=0.0, rtol=0.6)["ok"]  # 1 > 0.6 * |1|
    assert pc.compare(torch.tensor([1.0]), torch.tensor([2.0]), atol=0.0, rtol=0.6)["ok"]  # 1 <= 0.6 * |2|


def _wrapped_port(loader, step):
    def load(package, function):
        fn = loader(package, function)

        def port(out, x, *a, **k):
            r = fn(out, x, *a, **k)
            step(out, x)
            return r
        return port
    return load


def test_the_cuda_output_is_the_reference(small_ports, loader):
    doubling = _wrapped_port(loader, lambda out, x: out.mul_(2.0))
    report = pc.run_port_check(small_ports[:1], cuda=TorchClassic(), triton_loader=doubling, device="cpu", seed=3,
                               time_results=False, kernels=["gelu_fast"], dtypes=["float32"], shapes=["small"])
    (row,) = report.rows
    assert not row.ok and row.max_rel == pytest.approx(1.0, rel=1e-3)  # |2r - r| / |r|, not / |2r|


def test_a_port_that_writes_its_input_is_an_error_row(small_ports, loader):
    writing = _wrapped_port(loader, lambda out, x: x.add_(1.0))
    report = pc.run_port_check(small_ports[:1], cuda=TorchClassic(), triton_loader=writing, device="cpu", seed=3,
                               time_results=False, kernels=["gelu_fast"], dtypes=["float32"], shapes=["small"])
    (row,) = report.rows
    assert not row.ok and "input 'x' was modified" in row.error


@pytest.mark.parametrize("org", ["../../victim", "a/b", "a--b"])
def test_cli_refuses_a_bad_org_in_one_line(org, capsys):
    """``--org`` names ``dist/local/<org>`` and the repo id the ports load from, as in build / install-local / demo,
    where such a name is refused by argparse; port-check took any text and failed only on the GPU, mid-run."""
    from triton_collection.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["port-check", str(RMS_DIR), "--validate", "--org", org])
    assert exit_info.value.code == 2
    assert f"argument --org: org {org!r} is not a Hub organisation name" in capsys.readouterr().err
