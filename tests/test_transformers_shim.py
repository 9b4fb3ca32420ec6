"""triton_collection.integrations.transformers.kernelize on tiny random models, kernels loaded by Hub name.

Every kernelized model is compared with the same model before kernelize (the Hugging Face
modules are the reference). Norm weights are randomised first: with the default all-ones
weight the Llama and fp32-weight families give the same bits, and the test would not see
a wrong family.

Tolerances (one table, :data:`LOGIT_TOL`): fp16 must be bitwise equal here (the layers keep the
modules' rounding points; on CUDA they also keep torch's reduction order, ``torch_order``). On CPU
the interpreter's fp32 statistics may differ from torch's in the last bit, which almost always
vanishes in the fp16 rounding but flips it where the fp32 value sits at an fp16 rounding boundary:
a trial measured 6 of 256,000 fp16 elements of one norm 1 ulp off, and whole-model logits of
other seeds 2e-4 relative apart; these seeded tiny models have none. fp32 cannot be bitwise: the kernel sums the squares in another order than
``torch.mean``, so rstd and the outputs differ in the last bit or two (measured: logits
2e-7 apart, norm outputs 1.4e-6 on values of order 1). bf16 stores may be truncated instead of
rounded by the Triton interpreter (KERNELS_HUB_FACTS.md), so on CPU each norm output may be 1
bf16 ulp off; bf16 is checked per module, where 1 ulp cannot grow through later layers.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch
from kernels import Mode
from torch import nn

from triton_collection.integrations.families import probe
from triton_collection.integrations.transformers import kernelize

from .conftest import ORG

transformers = pytest.importorskip("transformers")

_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


LOGIT_TOL = {
    torch.float16: dict(rtol=0, atol=0),  # bitwise
    torch.float32: dict(rtol=1e-5, atol=1e-6),  # reduction order of sum(x^2): ~1 fp32 ulp per norm
}


def _tiny(kind: str, dtype: torch.dtype, device: str, **config) -> nn.Module:
    """A tiny model of ``kind`` (``_TINY`` and ``config``), seeded, norm weights away from 1, in eval mode."""
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TINY, **config))
    elif kind == "olmo2":
        model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**_TINY, **config))
    elif kind == "gemma":
        model = transformers.GemmaForCausalLM(transformers.GemmaConfig(**_TINY, head_dim=16, **config))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for module in model.modules():
            if "RMSNorm" in type(module).__name__:
                module.weight.normal_(1.0, 0.5)
    return model.to(device=device, dtype=dtype).eval()


def _greedy(model: nn.Module, ids: torch.Tensor, n: int = 6) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0)
    return out[:, ids.shape[1]:]


def _eager_reference(model: nn.Module, ids: torch.Tensor) -> tuple:
    """(logits, greedy tokens) of ``model`` before kernelize."""
    with torch.no_grad():
        logits = model(ids).logits
    return logits, _greedy(model, ids)


def _prompt(device: str) -> torch.Tensor:
    return torch.randint(1, _TINY["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1)).to(device)


def _max_ulp_bf16(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bf16 steps (the bit patterns of same-sign values are ordered)."""
    assert a.dtype == b.dtype == torch.bfloat16
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max())


# ----------------------------------------------------------------------------- which layer per class


@pytest.mark.parametrize(
    "kind, layer",
    [("llama", "LlamaRMSNorm"), ("olmo2", "Olmo2RMSNorm"), ("gemma", "GemmaRMSNorm")],
)
def test_probe_picks_the_family_of_each_class(kind, layer):
    model = _tiny(kind, torch.float32, "cpu")
    norms = [m for m in model.modules() if "RMSNorm" in type(m).__name__]
    assert norms and all(probe(m).family.layer == layer for m in norms)


def test_known_class_lists_agree_with_the_probe():
    """Every class named in a family's list that this transformers has probes into that family. The lists describe
    the transformers versions pyproject.toml supports (on 5.17, DeepseekV4RMSNorm multiplied as Llama's does, and
    the shim refuses it there: its list and its probe disagree)."""
    import importlib
    import tomllib
    from pathlib import Path

    import transformers
    from packaging.requirements import Requirement

    from triton_collection.integrations.families import FAMILIES

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (supported,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "transformers"]
    if transformers.__version__ not in supported.specifier:
        pytest.skip(f"transformers {transformers.__version__} is outside the supported {supported.specifier}")

    checked = 0
    for family in FAMILIES:
        for name in sorted(family.known_classes):
            model_type = _MODEL_TYPE.get(name)
            try:
                module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
            except ImportError:
                continue  # older/newer transformers without this model
            cls = getattr(module, name, None)
            if cls is None:
                continue
            result = probe(cls(64))
            assert result.family is family, (name, result.reason)
            checked += 1
    assert checked >= 15


_MODEL_TYPE = {
    "LlamaRMSNorm": "llama", "MistralRMSNorm": "mistral", "Qwen2RMSNorm": "qwen2", "Qwen3RMSNorm": "qwen3",
    "Qwen3MoeRMSNorm": "qwen3_moe", "Phi3RMSNorm": "phi3", "DeepseekV3RMSNorm": "deepseek_v3",
    "Glm4RMSNorm": "glm4", "SmolLM3RMSNorm": "smollm3", "GraniteRMSNorm": "granite", "Olmo2RMSNorm": "olmo2",
    "Olmo3RMSNorm": "olmo3", "GptOssRMSNorm": "gpt_oss", "NemotronHRMSNorm": "nemotron_h",
    "DeepseekV4RMSNorm": "deepseek_v4", "GemmaRMSNorm": "gemma", "Gemma2RMSNorm": "gemma2", "Gemma3RMSNorm": "gemma3",
}


def test_probe_refuses_other_numerics_and_extra_arguments():
    class HalfPrecisionRMSNorm(nn.Module):  # normalises in the input dtype: no family matches
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(64))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    assert "matches no family" in probe(HalfPrecisionRMSNorm()).reason
    assert "exactly one tensor" in probe(Qwen3NextRMSNormGated(64)).reason
    assert probe(nn.Linear(4, 4)).family is None


def test_probe_refuses_a_norm_that_ignores_its_weight():
    """The probe's weights are random (``1 + 0.5 * randn``): with all-ones weights a norm that never multiplies by
    its weight gives the fp32-weight family's bits in every run (dtypes included) and would be swapped for a layer
    that does."""
    class WeightlessRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(40))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            h = x.to(torch.float32)
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)

    result = probe(WeightlessRMSNorm())
    assert result.family is None and "matches no family" in result.reason, result.reason


def test_probe_refuses_parameters_on_the_meta_device():
    """A model built under ``torch.device("meta")`` (no storage yet) is refused with a reason: its probe cannot
    compare outputs (torch.equal has no meta kernel and raised NotImplementedError out of probe)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    with torch.device("meta"):
        norms = (LlamaRMSNorm(24), nn.RMSNorm(24), nn.LayerNorm(24))
    for norm in norms:
        result = probe(norm)
        assert result.family is None and "meta device" in result.reason


def test_probe_tells_formulas_apart_that_agree_only_at_one_dtype():
    """IdeficsRMSNorm casts the normalised value to the weight's dtype (``w * h.to(w.dtype)``): with input and
    weight of one dtype that is Llama's ``w * h.to(x.dtype)`` bit for bit, under autocast (bf16 input, fp32 weight)
    it is not. The probe's mixed-dtype runs refuse it (it was swapped for the LlamaRMSNorm layer: 0.0114 off under
    autocast); Llama's own class, torch's RMSNorm and LayerNorm still match, with no warning from the probe."""
    from transformers.models.idefics.modeling_idefics import IdeficsRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    result = probe(IdeficsRMSNorm(64))
    assert result.family is None and "input with torch.float32 parameters output matches no family" in result.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [probe(m).family.name for m in (LlamaRMSNorm(64), nn.RMSNorm(64), nn.LayerNorm(64))] == [
            "llama", "torch_rms", "layer_norm"]


# ----------------------------------------------------------------------------- whole models


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_llama_same_greedy_tokens_and_logits(installed, device, dtype):
    model = _tiny("llama", dtype, device)
    ids = _prompt(device)
    with torch.no_grad():
        ref_logits = model(ids).logits
    ref_tokens = _greedy(model, ids)

    report = kernelize(model, mode=Mode.INFERENCE, org=ORG)

    assert len(report) == 5 and set(report.swapped.values()) == {"LlamaRMSNorm"}
    assert report.swapped["model.norm"] == "LlamaRMSNorm"
    with torch.no_grad():
        logits = model(ids).logits
    torch.testing.assert_close(logits, ref_logits, **LOGIT_TOL[dtype])
    assert torch.equal(_greedy(model, ids), ref_tokens)


@pytest.mark.parametrize("kind, layer", [("olmo2", "Olmo2RMSNorm"), ("gemma", "GemmaRMSNorm")])
def test_fp32_weight_and_gemma_families_bitwise_in_fp16(installed, device, kind, layer):
    model = _tiny(kind, torch.float16, device)
    ids = _prompt(device)
    with torch.no_grad():
        ref_logits = model(ids).logits

    report = kernelize(model, mode=Mode.INFERENCE, org=ORG)

    assert set(report.swapped.values()) == {layer}
    assert list(report.layers.values()) == [f"{ORG}/triton-norms:{layer}"]
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.equal(logits, ref_logits)


@pytest.mark.parametrize("kind", ["llama", "olmo2", "gemma"])
def test_each_family_within_one_bf16_ulp_per_module(installed, device, kind):
    model = _tiny(kind, torch.bfloat16, device)
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG)
    gen = torch.Generator().manual_seed(2)
    modules = dict(model.named_modules())
    for name in report.swapped:
        norm = modules[name]
        x = torch.randn(3, 5, norm.weight.shape[0], generator=gen).to(device, torch.bfloat16)
        with torch.no_grad():
            ours, ref = norm(x), type(norm).forward(norm, x)  # instance forward = Hub layer; class forward = HF
        assert ours.dtype == ref.dtype
        assert _max_ulp_bf16(ours, ref) <= (1 if device == "cpu" else 0), name


def test_exact_types_only_and_plain_torch_modules(installed, device):
    normalization = pytest.importorskip("diffusers.models.normalization")  # not a dependency of ours
    FP32LayerNorm, RMSNorm = normalization.FP32LayerNorm, normalization.RMSNorm

    model = nn.Sequential(nn.LayerNorm(64), FP32LayerNorm(64), nn.RMSNorm(64), RMSNorm(64, eps=1e-6),
                          nn.Linear(64, 64)).to(device)
    x = torch.randn(4, 64, device=device)
    with torch.no_grad():
        ref = model(x)

    report = kernelize(model, mode=Mode.INFERENCE, org=ORG)

    assert report.swapped == {"0": "LayerNorm", "2": "TorchRMSNorm", "3": "DiffusersRMSNorm"}
    assert "forward" not in vars(model[1])  # FP32LayerNorm (a LayerNorm subclass) keeps its own numerics
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref, **LOGIT_TOL[torch.float32])


def test_norms_over_several_trailing_dims(installed, device):
    """nn.LayerNorm / nn.RMSNorm over two trailing dims (the layers flatten them into one row) are swapped; the
    probe refused them ("normalises over 2 dims") though the layers serve them. Values and gradients as the
    modules'."""
    torch.manual_seed(16)
    model = nn.Sequential(nn.LayerNorm((4, 6)), nn.RMSNorm((4, 6), eps=1e-5)).to(device)
    for p in model.parameters():
        p.data = torch.randn_like(p) * 0.5 + 1.0
    x = torch.randn(3, 5, 4, 6, device=device, requires_grad=True)
    ref = model(x)
    (ref_dx,) = torch.autograd.grad(ref.sum(), x)
    report = kernelize(model, mode=Mode.TRAINING, org=ORG)
    assert report.swapped == {"0": "LayerNorm", "1": "TorchRMSNorm"}, report
    out = model(x)
    (dx,) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(out, ref, **LOGIT_TOL[torch.float32])
    torch.testing.assert_close(dx, ref_dx, rtol=1e-4, atol=1e-4)


def test_deepcopy_keeps_the_swap_and_pickling_gives_the_original_forwards(installed, device, tmp_path):
    """As the README says: copy.deepcopy keeps the kernelized forwards; torch.save(model) loads with the modules'
    own forwards (kernelize again after loading); values unchanged both ways."""
    import copy

    torch.manual_seed(17)
    model = nn.Sequential(nn.LayerNorm(64), nn.RMSNorm(64)).to(device)
    x = torch.randn(4, 64, device=device)
    with torch.no_grad():
        ref = model(x)
    kernelize(model, mode=Mode.INFERENCE, org=ORG)
    twin = copy.deepcopy(model)
    assert all(m.forward.__func__ is not type(m).forward for m in twin)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert all(m.forward.__func__ is type(m).forward for m in loaded)  # (kernels pickles it as the class's own)
    with torch.no_grad():
        for m in (twin, loaded):
            torch.testing.assert_close(m(x), ref, **LOGIT_TOL[torch.float32])


@pytest.mark.parametrize("model_type,cls_name,why", [
    ("cohere", "CohereLayerNorm", "lacks attributes"),
    ("olmo", "OlmoLayerNorm", "lacks attributes"),
    ("nemotron", "NemotronLayerNorm1P", "matches no family bitwise"),
])
def test_model_layer_norms_are_probed_and_reported(model_type, cls_name, why):
    """A model's own LayerNorm classes (not torch's) were neither swapped nor listed in ``refused``: now each is
    probed against the LayerNorm layer's formula and, where it differs, refused with the reason."""
    from triton_collection.integrations.transformers import select_layers

    try:
        cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_attention_heads=4,
                                                num_key_value_heads=4, num_hidden_layers=1, intermediate_size=96,
                                                vocab_size=64)
    except ValueError:
        pytest.skip(f"this transformers has no {model_type}")
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    chosen, refused = select_layers(model)
    key = next((k for k in refused if k.endswith("." + cls_name)), None)
    assert key is not None and why in refused[key], refused
    assert not any(c.__name__ == cls_name for c in chosen)


def test_training_mode_gradients(installed, device):
    import copy

    model = _tiny("llama", torch.float32, device)
    reference = copy.deepcopy(model)
    kernelize(model, mode=Mode.TRAINING, org=ORG)
    ids = _prompt(device)
    for m in (model, reference):
        m.train()
        m(ids, labels=ids).loss.backward()
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():  # fp32 sums in another order (dx row dots, dw partials)
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_class_attributes_restored_and_kernelize_twice(installed, device):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    before = LlamaRMSNorm.__dict__.get("kernel_layer_name")
    model = _tiny("llama", torch.float32, device)
    first = kernelize(model, mode=Mode.INFERENCE, org=ORG)
    assert LlamaRMSNorm.__dict__.get("kernel_layer_name") == before  # transformers' "RMSNorm" (or none)
    assert kernelize(model, mode=Mode.INFERENCE, org=ORG).swapped == first.swapped


def test_local_kernels_override(built, device, monkeypatch):
    monkeypatch.setenv("LOCAL_KERNELS", f"{ORG}/triton-norms={built['triton-norms'].path}")
    model = _tiny("olmo2", torch.float16, device)
    assert set(kernelize(model, mode=Mode.INFERENCE, org=ORG).swapped.values()) == {"Olmo2RMSNorm"}


def test_local_kernels_entries_match_whole_repo_ids(monkeypatch):
    """An entry names one repository: ``org/triton`` is not a prefix that also serves ``org/triton-norms``."""
    from pathlib import Path

    from triton_collection.integrations.transformers import _local_override

    monkeypatch.setenv("LOCAL_KERNELS", f"{ORG}/triton=/decoy:{ORG}/triton-norms-dev=/dev:{ORG}/triton-norms=/norms")
    assert _local_override(f"{ORG}/triton-norms") == Path("/norms")
    assert _local_override(f"{ORG}/triton-activations") is None
    monkeypatch.setenv("LOCAL_KERNELS", f"{ORG}/triton-norms=/norms")
    assert _local_override(f"{ORG}/triton-norms-dev") is None


def test_works_with_transformers_hooks_disabled(installed):
    """USE_HUB_KERNELS=0 turns transformers' decorators into no-ops (read at import: a fresh process)."""
    import os
    import subprocess
    import sys

    script = (
        "import torch, transformers\n"
        "from kernels import Mode\n"
        "from transformers.models.llama.modeling_llama import LlamaRMSNorm\n"
        "from triton_collection.integrations.transformers import kernelize\n"
        "assert 'kernel_layer_name' not in vars(LlamaRMSNorm)\n"
        f"cfg = transformers.LlamaConfig(**{_TINY!r})\n"
        "model = transformers.LlamaForCausalLM(cfg).eval()\n"
        f"print(len(kernelize(model, mode=Mode.INFERENCE, org={ORG!r})))\n"
        "assert 'kernel_layer_name' not in vars(LlamaRMSNorm)\n"
    )
    env = {**os.environ, "USE_HUB_KERNELS": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "5"


# ----------------------------------------------------------------------------- clear errors


def test_model_without_norm_is_an_error(installed):
    with pytest.raises(ValueError, match="no module that triton-norms can replace"):
        kernelize(nn.Sequential(nn.Linear(8, 8), nn.GELU()), mode=Mode.INFERENCE, org=ORG)


@pytest.mark.parametrize("odd_first", [False, True])
def test_instances_configured_otherwise_are_probed_apart(installed, device, odd_first):
    """A class whose forward branches on an instance attribute (transformers' ConvNextLayerNorm: ``data_format``)
    was probed on its first instance only and every instance swapped: a channels_first instance then ran the
    last-dim LayerNorm layer (0.98 relative error, reported as swapped). Each configuration is probed now: the
    channels_last instances are swapped, the channels_first one is refused by name and keeps its own forward,
    whichever comes first."""
    from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm

    torch.manual_seed(0)
    odd = ConvNextLayerNorm(8, data_format="channels_first")
    plain = [ConvNextLayerNorm(8), ConvNextLayerNorm(8)]
    model = nn.ModuleDict(dict(zip(("a", "b", "c"), [odd, *plain] if odd_first else [*plain, odd]))).to(device)
    odd_name = "a" if odd_first else "c"
    with torch.no_grad():
        for m in model.values():
            m.weight.normal_(1.0, 0.5)
            m.bias.normal_()
    eager = copy.deepcopy(model)
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG)
    assert sorted(report.swapped) == sorted(n for n in "abc" if n != odd_name)
    assert "data_format='channels_first'" in report.refused[odd_name]
    x_last, x_first = torch.randn(2, 4, 4, 8, device=device), torch.randn(2, 8, 4, 4, device=device)
    with torch.no_grad():
        for name, m in model.items():
            x = x_first if name == odd_name else x_last
            torch.testing.assert_close(m(x), eager[name](x), rtol=1e-5, atol=1e-5)


def test_per_instance_functions_and_forwards_do_not_multiply_probes(monkeypatch):
    """The configuration key of an instance leaves out an instance ``forward`` (accelerate's offload hooks, an
    earlier kernelize: the probe runs the class's forward) and takes a ``functools.partial`` by its function and
    arguments (transformers' GELUTanh makes one per instance): one probe per class, not one per layer (a 24-layer
    Gemma2 took 24 GELUTanh probes, a hooked tiny Llama 35 instead of 5)."""
    import functools
    from collections import Counter

    from triton_collection.integrations import transformers as shim
    from triton_collection.integrations.families import ALL_FAMILIES

    calls = []
    real = shim.probe
    monkeypatch.setattr(shim, "probe", lambda module, candidates: calls.append(type(module).__name__)
                        or real(module, candidates))
    for kind in ("gemma", "llama"):
        model = _tiny(kind, torch.float32, "cpu")
        for module in model.modules():
            if type(module).__name__.endswith(("MLP", "RMSNorm")):  # an instance forward, as accelerate's hooks
                module.forward = functools.partial(type(module).forward, module)
        calls.clear()
        chosen, _ = shim.select_layers(model, families=ALL_FAMILIES)
        assert chosen and set(Counter(calls).values()) == {1}, (kind, Counter(calls))


def test_decoder_layer_left_alone_where_its_norm_instance_is_refused(installed, device):
    """A decoder layer whose post_attention_layernorm instance is configured unlike the swapped norms (refused by
    name) is not swapped for the fused layer either: the report said it was (the layer's runtime guard then ran
    the norm itself, so only the report was wrong)."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float32, device)
    eager = copy.deepcopy(model)
    odd = model.model.layers[1].post_attention_layernorm
    odd.scaled = True  # an instance attribute: another configuration, probed apart

    def forward(self, hidden_states):
        out = type(self).__mro__[1].forward(self, hidden_states)
        return 2 * out if getattr(self, "scaled", False) else out

    odd_cls = type("ScaledLlamaRMSNorm", (type(odd),), {"forward": forward})
    for layer in model.model.layers:  # one class for every norm of the decoder layers
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(layer, name).__class__ = odd_cls
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert "model.layers.1.post_attention_layernorm" in report.refused
    assert report.swapped.get("model.layers.0") == "LlamaDecoderLayer"
    assert "model.layers.1" not in report.swapped and "model.layers.1" in report.refused
    ids = _prompt(device)
    for layer in eager.model.layers:
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(layer, name).__class__ = odd_cls
    eager.model.layers[1].post_attention_layernorm.scaled = True
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, eager(ids).logits, **LOGIT_TOL[torch.float32])


def test_kernelize_refuses_what_is_not_a_module(installed):
    for bad in (None, "llama", transformers.LlamaConfig()):
        with pytest.raises(TypeError, match=f"kernelize: model must be a torch.nn.Module, got {type(bad).__name__}"):
            kernelize(bad, mode=Mode.INFERENCE, org=ORG)


def test_mode_the_layer_cannot_serve_is_an_error(norms, device, monkeypatch):
    monkeypatch.setattr(norms.layers.LlamaRMSNorm, "can_torch_compile", False)
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(ValueError, match="does not support torch.compile"):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, org=ORG)
    assert all("forward" not in vars(m) for m in model.modules())  # nothing half-swapped


def test_gated_mlp_swapped_without_its_activation_family(installed, device):
    """families with the gated MLP but not the activations: the MLP is swapped and its act_fn (SiLUActivation,
    decorated by transformers) left as it is (kernels.kernelize walks the MLP's children and raised "No layer
    mapping for 'SiLU'"); the logits stay the eager ones and the act_fn's class is left as it was."""
    from transformers.activations import SiLUActivation

    from triton_collection.integrations.families import FAMILIES, GATED_MLP

    torch.manual_seed(0)
    model = _tiny("llama", torch.float32, device)
    ids = torch.randint(0, model.config.vocab_size, (1, 9), device=device)
    with torch.no_grad():
        ref = model(ids).logits
    before = dict(vars(SiLUActivation))
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=FAMILIES + (GATED_MLP,))
    assert set(report.swapped.values()) == {"LlamaRMSNorm", "LlamaMLP"}, report.swapped
    assert dict(vars(SiLUActivation)) == before
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)


def _count_fused(model, monkeypatch) -> list:
    """Counts the decoder layer's add_rms_norm calls (the swapped forward's module globals)."""
    calls = []
    layer_globals = model.model.layers[0].forward.__func__.__globals__
    fused = layer_globals["add_rms_norm"]

    def counting(*args, **kwargs):
        calls.append(kwargs.get("torch_order"))
        return fused(*args, **kwargs)

    monkeypatch.setitem(layer_globals, "add_rms_norm", counting)
    return calls


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_decoder_layer_fuses_the_residual_add_into_its_norm(installed, device, dtype, monkeypatch):
    """ALL_FAMILIES swaps Llama decoder layers: ``residual + attn_out`` and ``post_attention_layernorm`` become one
    add_rms_norm in the mean order. fp16 logits and greedy tokens stay the eager ones bit for bit (bf16 too on
    CUDA; under the interpreter bf16 stores may truncate, so logits are compared within a tolerance there);
    a forward hook on the norm makes the layer take the original steps, and the hook runs."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", dtype, device)
    ids = _prompt(device)
    ref_logits, ref_tokens = _eager_reference(model, ids)
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert [report.swapped[f"model.layers.{i}"] for i in range(2)] == ["LlamaDecoderLayer"] * 2
    calls = _count_fused(model, monkeypatch)
    with torch.no_grad():
        logits = model(ids).logits
    assert calls == ["mean", "mean"]
    if dtype == torch.float16 or device != "cpu":
        assert torch.equal(logits, ref_logits)
        assert torch.equal(_greedy(model, ids), ref_tokens)
    else:
        torch.testing.assert_close(logits, ref_logits, rtol=0.05, atol=0.05)
    seen = []
    model.model.layers[1].post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    calls.clear()
    with torch.no_grad():
        hooked = model(ids).logits
    assert calls == ["mean"] and seen == [(*ids.shape, _TINY["hidden_size"])]
    if dtype == torch.float16 or device != "cpu":
        assert torch.equal(hooked, ref_logits)


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_attention_layer_equals_the_module(installed, device, kind, monkeypatch):
    """ALL_FAMILIES swaps Llama-form attentions (Llama's and Gemma's forward and rotary): fp16 logits, greedy tokens
    (DynamicCache decode), output_attentions' weights and fp32 training gradients equal eager's; the rotary runs in
    the package's kernel (two launches per attention, not transformers' ops); a hook on a projection runs."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny(kind, torch.float16, device)
    ids = _prompt(device)
    ref_logits, ref_tokens = _eager_reference(model, ids)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref_weights = model(ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert [report.swapped[f"model.layers.{i}.self_attn"] for i in range(2)] == ["LlamaAttention"] * 2
    module = importlib.import_module(type(model).__module__)
    rotated = []
    monkeypatch.setattr(module, "rotate_half", lambda x: rotated.append(x) or x)  # transformers' rotary: unused
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.equal(logits, ref_logits) and rotated == []
    assert torch.equal(_greedy(model, ids), ref_tokens)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        weights = model(ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    assert all(torch.equal(w, r) for w, r in zip(weights, ref_weights))
    seen = []
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref_logits)
    assert len(seen) == 1
    # training, fp32: gradients of every parameter against eager's
    eager, ours = _tiny(kind, torch.float32, device), _tiny(kind, torch.float32, device)
    kernelize(ours, mode=Mode.TRAINING, org=ORG, families=ALL_FAMILIES)
    for m in (eager, ours):
        m.train()
        m(ids, labels=ids).loss.backward()
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_attention_layer_runs_a_model_moved_to_float64(installed, device):
    """A model kernelized and then moved to float64, a dtype the rotary kernel does not take: the LlamaAttention
    layer runs transformers' formula there, so the logits equal the unkernelized float64 model's bit for bit (the
    layer raised the kernel's TypeError, naming a q the user never passed, before)."""
    from triton_collection.integrations.families import LLAMA_ATTENTION

    ours, eager = _tiny("llama", torch.float32, device), _tiny("llama", torch.float32, device)
    report = kernelize(ours, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_ATTENTION,))
    assert report.swapped["model.layers.0.self_attn"] == "LlamaAttention"
    ids = _prompt(device)
    with torch.no_grad():
        got, want = ours.double()(ids).logits, eager.double()(ids).logits
    assert got.dtype == torch.float64 and torch.equal(got, want)
    # cos / sin that require grad (the kernel refuses them with a ValueError): transformers' formula, its gradients
    attn, ref = ours.model.layers[0].self_attn.float(), eager.model.layers[0].self_attn.float()
    x = torch.randn(1, 5, _TINY["hidden_size"], device=device)
    cos, sin = (torch.randn(1, 5, attn.head_dim, device=device) for _ in range(2))
    outs, grads = [], []
    for module in (attn, ref):
        c = cos.clone().requires_grad_()
        out = module(x, position_embeddings=(c, sin), attention_mask=None)[0]
        out.sum().backward()
        outs.append(out.detach())
        grads.append(c.grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])


def test_attention_family_probes_the_form_and_the_rotary(installed):
    """Only a Llama-form forward whose module's apply_rotary_pos_emb computes Llama's formula is mapped: GLM's
    attention has Llama's forward but an interleaved rotary, Bamba's a partial one, Mistral's forward passes a
    sliding window, and a forward with one step more is not the form; each is refused naming why."""
    from transformers.models.glm.modeling_glm import GlmAttention, GlmConfig
    from transformers.models.mistral.modeling_mistral import MistralAttention, MistralConfig

    from triton_collection.integrations.families import LLAMA_ATTENTION, probe

    llama = _tiny("llama", torch.float32, "cpu").model.layers[0].self_attn
    assert probe(llama).family is LLAMA_ATTENTION
    glm = GlmAttention(GlmConfig(**_TINY), 0)
    assert "apply_rotary_pos_emb its forward calls is not Llama's" in probe(glm).reason
    mistral = MistralAttention(MistralConfig(**_TINY), 0)
    assert "not the Llama attention's" in probe(mistral).reason
    # Bamba: Llama's forward and formula at full width, but its cos / sin are half the head (a partial rotary,
    # whose untouched half the kernel would not pass through: it raised at the first forward once swapped)
    bamba = pytest.importorskip("transformers.models.bamba.modeling_bamba")
    config = bamba.BambaConfig(**_TINY, attn_layer_indices=[0], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16)
    assert "partial rotary" in probe(bamba.BambaAttention(config, 0)).reason

    class Scaled(type(llama)):  # one step more: must not be taken for the form
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                    **kwargs):
            out, weights = super().forward(hidden_states, position_embeddings, attention_mask, past_key_values,
                                           **kwargs)
            return 2 * out, weights

    scaled = copy.deepcopy(llama)
    scaled.__class__ = Scaled
    assert "not the Llama attention's" in probe(scaled).reason


def test_decoder_layer_probe_and_training(installed, device):
    """The decoder family needs the Llama forward and a llama-family post_attention_layernorm: Gemma's layer (the
    same forward), a forward with one step more and a LayerNorm after attention are refused, naming why; in
    training the fused layer's gradients follow eager's (fp32)."""
    import copy

    from triton_collection.integrations.families import ALL_FAMILIES, LLAMA_DECODER

    result = probe(_tiny("gemma", torch.float32, "cpu").model.layers[0])  # Llama's forward, a 1 + w norm
    assert result.family is None and "post_attention_layernorm is not a LlamaRMSNorm" in result.reason, result
    model = _tiny("llama", torch.float32, "cpu")
    assert probe(model.model.layers[0]).family is LLAMA_DECODER

    class ScaledResidual(type(model.model.layers[0])):  # one step more than the form: must not be fused away
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                              position_ids=position_ids, past_key_values=past_key_values,
                                              use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
            hidden_states = residual + 0.5 * hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + hidden_states
            return hidden_states

    model.model.layers[0].__class__ = ScaledResidual
    result = probe(model.model.layers[0])
    assert result.family is None and "not the Llama decoder layer's" in result.reason, result
    model = _tiny("llama", torch.float32, "cpu")
    model.model.layers[0].post_attention_layernorm = nn.LayerNorm(_TINY["hidden_size"])
    result = probe(model.model.layers[0])
    assert result.family is None and "post_attention_layernorm" in result.reason

    model = _tiny("llama", torch.float32, device)
    reference = copy.deepcopy(model)
    report = kernelize(model, mode=Mode.TRAINING, org=ORG, families=ALL_FAMILIES)
    assert report.swapped["model.layers.1"] == "LlamaDecoderLayer"
    ids = _prompt(device)
    for m in (model, reference):
        m.train()
        m(ids, labels=ids).loss.backward()
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_accelerate_hooks_stay_around_the_swapped_forwards(installed, device):
    """accelerate's hooks (``dispatch_model`` / ``device_map="auto"`` put one on each block it places) wrap a
    module's forward and call ``module._old_forward``: kernelize swaps that, so the hook still runs around the Hub
    layer (before, the swap replaced the hook's wrapper and the hook never ran). A decoder layer and the final norm
    carry hooks here; fp16 logits equal eager's and every hook ran once per forward."""
    accelerate_hooks = pytest.importorskip("accelerate.hooks")
    from triton_collection.integrations.families import ALL_FAMILIES

    class Count(accelerate_hooks.ModelHook):
        def __init__(self):
            self.calls = 0

        def pre_forward(self, module, *args, **kwargs):
            self.calls += 1
            return args, kwargs

    model = _tiny("llama", torch.float16, device)
    ids = _prompt(device)
    hooks = {name: Count() for name in ("model.layers.0", "model.norm")}
    modules = dict(model.named_modules())
    for name, hook in hooks.items():
        accelerate_hooks.add_hook_to_module(modules[name], hook)
    with torch.no_grad():
        ref = model(ids).logits
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert report.swapped["model.layers.0"] == "LlamaDecoderLayer" and report.swapped["model.norm"] == "LlamaRMSNorm"
    assert modules["model.norm"]._old_forward.__func__.__qualname__ == "LlamaRMSNorm.forward"
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.equal(logits, ref)
    assert {name: hook.calls for name, hook in hooks.items()} == {"model.layers.0": 2, "model.norm": 2}


def test_float64_model_is_an_error_at_kernelize(installed, device):
    """A float64 model (the layers serve fp16 / bf16 / fp32) is refused by kernelize, naming the module and the dtype,
    before any swap; the same model in float32 then kernelizes."""
    model = _tiny("llama", torch.float32, device).double()
    with pytest.raises(ValueError, match=r"kernelize: model.layers.0.input_layernorm \(LlamaRMSNorm\) holds "
                                         r"torch.float64 parameters"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG)
    assert all("forward" not in vars(m) for m in model.modules())  # nothing half-swapped
    assert len(kernelize(model.float(), mode=Mode.INFERENCE, org=ORG).swapped) > 0


def test_invalid_mode_and_missing_package(installed, device):
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(ValueError, match="must contain Mode.INFERENCE or Mode.TRAINING"):
        kernelize(model, mode=Mode.FALLBACK, org=ORG)
    with pytest.raises(RuntimeError, match="cannot load layer"):
        kernelize(model, mode=Mode.INFERENCE, org="no-such-org")
    with pytest.raises(RuntimeError, match=r"cannot load layer .*check the org, the package and the version") as err:
        kernelize(model, mode=Mode.INFERENCE, org=ORG, version=2)
    assert "trust_remote_code" not in str(err.value)  # no publisher check failed: that flag would not help


def test_bad_org_version_and_families_name_the_argument(installed, device):
    """``version="1"`` was reported by kernels as "Version 1 not found, available versions: 1", a bad org as a layer
    that cannot be loaded ("check the org, the package and the version"), ``families=("llama",)`` as an
    AttributeError on a str: each is now refused before anything is loaded, naming the argument."""
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(TypeError, match=r"kernelize: version must be an int >= 1 .*got '1'"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG, version="1")
    with pytest.raises(TypeError, match=r"kernelize: version must be an int"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG, version=True)
    with pytest.raises(ValueError, match=r"kernelize: version must be >= 1 .*got 0"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG, version=0)
    with pytest.raises(ValueError, match=r"kernelize: org 'bad org' is not a Hub organisation name"):
        kernelize(model, mode=Mode.INFERENCE, org="bad org")
    for families in (("llama",), "llama", (), None):
        with pytest.raises(TypeError, match=r"kernelize: families must be a non-empty tuple"):
            kernelize(model, mode=Mode.INFERENCE, org=ORG, families=families)
    assert all("forward" not in vars(m) for m in model.modules())


def test_failure_half_way_leaves_no_module_swapped(installed, device, monkeypatch):
    import kernels

    real, calls = kernels.kernelize, []

    def fail_on_third(module, **kwargs):
        calls.append(module)
        if len(calls) == 3:
            raise RuntimeError("simulated failure")
        return real(module, **kwargs)

    monkeypatch.setattr(kernels, "kernelize", fail_on_third)
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(RuntimeError, match="simulated failure"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG)
    assert all("forward" not in vars(m) for m in model.modules())


# ----------------------------------------------------------------------------- refusal paths (a mutation run's gaps)


def test_probe_refuses_a_known_class_whose_numerics_are_another_family():
    """A class named as a known member of one family (Olmo2RMSNorm: fp32_weight) whose forward is Llama's is
    refused with the reason, not swapped for the layer its probe happens to match."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    impostor = type("Olmo2RMSNorm", (LlamaRMSNorm,), {})(64)
    result = probe(impostor)
    assert result.family is None and "known as fp32_weight but its probe matches llama" in result.reason


def test_probe_refuses_two_families_of_one_formula():
    import dataclasses

    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from triton_collection.integrations.families import LLAMA

    twin = dataclasses.replace(LLAMA, name="llama_twin", known_classes=frozenset())
    result = probe(LlamaRMSNorm(64), (LLAMA, twin))
    assert result.family is None and result.reason == "ambiguous: matches llama, llama_twin"


def test_subclass_of_torch_layer_norm_is_not_probed():
    """Exact type only: a LayerNorm subclass with a step the probe's inputs never reach (a clamp at 100) is not a
    candidate, though its probe would match the LayerNorm family bitwise."""
    class ClampedLayerNorm(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x).clamp(-100.0, 100.0)

    assert probe(ClampedLayerNorm(64)).family is None


def test_probe_refuses_a_model_norm_over_several_dims():
    normalization = pytest.importorskip("diffusers.models.normalization")
    result = probe(normalization.RMSNorm((4, 6), eps=1e-6))
    assert result.family is None and "normalises over 2 dims" in result.reason


def test_layer_without_can_torch_compile_cannot_serve_torch_compile(norms, device, monkeypatch):
    monkeypatch.delattr(norms.layers.LlamaRMSNorm, "can_torch_compile")
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(ValueError, match="does not support torch.compile"):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, org=ORG)


def test_a_forward_left_unreplaced_is_an_error(installed, device, monkeypatch):
    import kernels

    monkeypatch.setattr(kernels, "kernelize", lambda module, **kwargs: module)  # a kernels that swaps nothing
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(RuntimeError, match=r"still runs .*, not LlamaRMSNorm"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG)


def _doubled(norm: nn.Module) -> nn.Module:
    """A user's subclass of ``norm``'s class that returns twice the norm, with ``norm``'s weight."""

    class Doubled(type(norm)):
        def forward(self, hidden_states):
            return super().forward(hidden_states) * 2

    new = Doubled(norm.weight.shape[0], eps=norm.variance_epsilon).to(device=norm.weight.device,
                                                                      dtype=norm.weight.dtype)
    new.load_state_dict(norm.state_dict())
    return new


def test_decoder_layer_fuses_only_a_norm_that_runs_the_llama_layer(installed, device, monkeypatch):
    """A post_attention_layernorm replaced after kernelize (here by a user's subclass in layer 0) is not fused: the
    layer fuses only where the norm runs triton-norms' LlamaRMSNorm layer, which kernelize put there after the
    norm's class probed as the llama family. Logits match the eager model with the same replacement."""
    import copy

    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float16, device)
    reference = copy.deepcopy(model)
    kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    for m in (model, reference):
        m.model.layers[0].post_attention_layernorm = _doubled(m.model.layers[0].post_attention_layernorm)
    calls = _count_fused(model, monkeypatch)
    ids = _prompt(device)
    with torch.no_grad():  # a fused doubled layer would be ~0.2 off; the other norms' fp32 sums may move an fp16 ulp
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=2e-3)
    assert calls == ["mean"]  # layer 1 only


def test_decoder_layer_refuses_an_instance_whose_norm_is_another_class(installed, device):
    """The decoder class is probed on its first instance; a later instance whose post_attention_layernorm is a user
    subclass with another forward (here, twice the norm) is not that probe's norm: kernelize leaves that layer (and
    its norm) as it was, naming it in ``refused``, and the logits stay the eager ones."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float16, device)
    model.model.layers[1].post_attention_layernorm = _doubled(model.model.layers[1].post_attention_layernorm)
    ids = _prompt(device)
    with torch.no_grad():
        ref = model(ids).logits
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert report.swapped["model.layers.0"] == "LlamaDecoderLayer" and "model.layers.1" not in report.swapped
    assert "post_attention_layernorm" in report.refused["model.layers.1"], report.refused
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_decoder_layer_runs_backward_and_global_hooks_of_its_norm(installed, device):
    """A full backward hook on post_attention_layernorm and a global module forward hook (``torch.nn.modules.module.
    register_module_forward_hook``) run as in the eager model: the layer takes the original steps while any hook
    that ``nn.Module.__call__`` would run is registered."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float32, device)
    kernelize(model, mode=Mode.TRAINING, org=ORG, families=ALL_FAMILIES)
    norm = model.model.layers[0].post_attention_layernorm
    _assert_norm_hooks_run(
        model, norm, _prompt(device),
        lambda record: norm.register_full_backward_hook(lambda m, gi, go: record(gi[0].shape)),
        lambda record: nn.modules.module.register_module_forward_hook(lambda m, i, o: record(m)))


def _assert_norm_hooks_run(model, norm, ids, add_backward_hook, add_global_hook):
    """A training step of ``model`` with a backward hook on ``norm`` (``add_backward_hook(record)`` registers one
    recording the gradient's shape), then a no-grad forward with a global module hook (``add_global_hook(record)``
    registers one recording each module): each ran once for ``norm``."""
    backward, forward = [], []
    model.train()
    handle = add_backward_hook(backward.append)
    model(ids, labels=ids).loss.backward()
    handle.remove()
    assert backward == [(*ids.shape, _TINY["hidden_size"])]
    handle = add_global_hook(lambda m: forward.append(m) if m is norm else None)
    try:
        with torch.no_grad():
            model(ids)
    finally:
        handle.remove()
    assert forward == [norm]


# ----------------------------------------------------------------------------- mutation run 53: report and check gaps


def test_decoder_layer_whose_norm_is_chosen_for_another_family_is_refused(installed, device):
    """Layer 1's post_attention_layernorm is a torch nn.RMSNorm (chosen itself, for the TorchRMSNorm layer): the
    fused add_rms_norm reproduces LlamaRMSNorm only, so layer 1 is refused by name and left as it was, while its
    nn.RMSNorm is swapped on its own; the exact sets of swapped and refused modules, and the eager logits."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float32, device)
    old = model.model.layers[1].post_attention_layernorm
    torch_norm = nn.RMSNorm(_TINY["hidden_size"], eps=old.variance_epsilon).to(device)
    with torch.no_grad():
        torch_norm.weight.copy_(old.weight)
    model.model.layers[1].post_attention_layernorm = torch_norm
    ids = _prompt(device)
    with torch.no_grad():
        ref = model(ids).logits
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    decoders = {k for k, v in report.swapped.items() if v == "LlamaDecoderLayer"}
    assert decoders == {"model.layers.0"}, report.swapped
    assert report.swapped["model.layers.1.post_attention_layernorm"] == "TorchRMSNorm"
    assert set(report.refused) == {"model.layers.1"} and "post_attention_layernorm (RMSNorm)" in report.refused[
        "model.layers.1"], report.refused
    assert "forward" not in vars(model.model.layers[1])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, **LOGIT_TOL[torch.float32])


def test_decoder_family_alone_with_no_llama_norm_family_is_an_error(installed, device):
    """families=(LLAMA_DECODER,) (the decoder layer without the llama norm family): every decoder layer is refused
    (its post_attention_layernorm is not swapped), so nothing can be replaced: a ValueError naming the refusals, no
    forward swapped; with the gated MLP family added, the report lists no layer for the refused decoder class."""
    from triton_collection.integrations.families import GATED_MLP, LLAMA_DECODER

    model = _tiny("llama", torch.float32, device)
    with pytest.raises(ValueError, match=r"no module that triton-norms can replace \(model.layers.0: its "
                                         r"post_attention_layernorm"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_DECODER,))
    assert all("forward" not in vars(m) for m in model.modules())
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_DECODER, GATED_MLP))
    assert set(report.swapped) == {"model.layers.0.mlp", "model.layers.1.mlp"}, report.swapped
    assert [k.rsplit(".", 1)[-1] for k in report.layers] == ["LlamaMLP"], report.layers
    assert set(report.refused) == {"model.layers.0", "model.layers.1"}, report.refused


def test_float64_weights_inside_a_swapped_module_are_an_error(installed, device):
    """A gated MLP whose projections hold float64 weights (the norms float32): the MLP is a target through its
    children's parameters, so kernelize refuses it by name before any swap, as for a float64 norm."""
    from triton_collection.integrations.families import FAMILIES, GATED_MLP

    model = _tiny("llama", torch.float32, device)
    model.model.layers[1].mlp.double()
    with pytest.raises(ValueError, match=r"model.layers.1.mlp \(LlamaMLP\) holds torch.float64 parameters"):
        kernelize(model, mode=Mode.INFERENCE, org=ORG, families=FAMILIES + (GATED_MLP,))
    assert all("forward" not in vars(m) for m in model.modules())


class _LlamaLikeRMSNorm(nn.Module):
    """The parameters of transformers' LlamaRMSNorm; subclasses give the forward."""

    def __init__(self, n: int = 64):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = 1e-6


class _UpcastOutputRMSNorm(_LlamaLikeRMSNorm):
    """Llama's numerics, with the output returned in float32 (the same values, another dtype)."""

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight * h.to(dtype)).float()


class _HalfPathRMSNorm(_LlamaLikeRMSNorm):
    """Llama's numerics, except that fp16 input with an fp16 weight is normalised in fp16 (a half fast path)."""

    def forward(self, hidden_states):
        if hidden_states.dtype == self.weight.dtype == torch.float16:
            rstd = torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * (hidden_states * rstd)
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


def test_probe_needs_the_output_dtype_and_the_fp16_run():
    """Two norms that equal Llama's values except in one respect the layer would not reproduce: one returns the
    same values in float32 (the layer returns fp16 for fp16 input: torch.equal alone accepts it), one takes
    another path for fp16 input and an fp16 weight (an fp32 module: only the probe's fp16 run reaches it). Both
    are refused; the same classes without the difference probe as llama."""
    upcast, half = probe(_UpcastOutputRMSNorm()), probe(_HalfPathRMSNorm())
    assert upcast.family is None and "torch.float16 output matches no family" in upcast.reason, upcast
    assert half.family is None and "torch.float16 output matches no family" in half.reason, half


def test_probe_refuses_a_weight_of_two_dims():
    """A Llama-named norm holding a [1, N] weight: the reference broadcasts it as the module does, but the layers
    take a 1-D weight, so the probe refuses it (naming the attribute) instead of matching."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64)
    norm.weight = nn.Parameter(torch.ones(1, 64))
    result = probe(norm)
    assert result.family is None and "1-D weight" in result.reason, result


def test_gated_mlp_form_is_matched_up_to_local_names():
    """The gated-MLP form is compared up to names: a forward that names its local ``out`` (the form says
    ``down_proj``) and its input ``hidden`` is the same form and probes as the gated MLP family; one step more
    (a scale) is refused by its form."""
    from triton_collection.integrations.families import ALL_FAMILIES, GATED_MLP

    class RenamedMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(64, 96, bias=False), nn.Linear(64, 96, bias=False)
            self.down_proj, self.act_fn = nn.Linear(96, 64, bias=False), nn.SiLU()

        def forward(self, hidden):
            out = self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))
            return out

    class ScaledMLP(RenamedMLP):
        def forward(self, hidden):
            out = self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))
            return out * 2

    assert probe(RenamedMLP()).family is GATED_MLP
    result = probe(ScaledMLP(), tuple(f for f in ALL_FAMILIES if f is GATED_MLP))
    assert result.family is None and "its forward is not one" in result.reason, result


def test_training_with_a_layer_without_backward_is_an_error(norms, device, monkeypatch):
    monkeypatch.setattr(norms.layers.LlamaRMSNorm, "has_backward", False)
    model = _tiny("llama", torch.float32, device)
    with pytest.raises(ValueError, match="has no backward, so it cannot serve"):
        kernelize(model, mode=Mode.TRAINING, org=ORG)
    assert all("forward" not in vars(m) for m in model.modules())
    assert len(kernelize(model, mode=Mode.INFERENCE, org=ORG).swapped) == 5


def test_decoder_layer_runs_pre_hooks_of_its_norm(installed, device):
    """A forward-pre hook that rescales the norm's input, a backward-pre hook and a global forward-pre hook on
    post_attention_layernorm run as in the eager model (the fused add_rms_norm would skip them): fp32 logits as the
    eager model's with the same hook, and each hook ran."""
    import copy

    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float32, device)
    reference = copy.deepcopy(model)
    kernelize(model, mode=Mode.TRAINING, org=ORG, families=ALL_FAMILIES)
    ids = _prompt(device)
    for m in (model, reference):
        m.model.layers[0].post_attention_layernorm.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, **LOGIT_TOL[torch.float32])
    norm = model.model.layers[1].post_attention_layernorm
    _assert_norm_hooks_run(
        model, norm, ids,
        lambda record: norm.register_full_backward_pre_hook(lambda mod, go: record(go[0].shape)),
        lambda record: nn.modules.module.register_module_forward_pre_hook(lambda mod, args: record(mod)))


def test_decoder_layer_with_an_accelerate_hook_on_its_norm(installed, device):
    """accelerate's hook on post_attention_layernorm (its forward a wrapper calling ``_old_forward``, no module
    hook): the layer takes the original steps, so the hook runs once per forward; fp16 logits equal eager's."""
    accelerate_hooks = pytest.importorskip("accelerate.hooks")
    from triton_collection.integrations.families import ALL_FAMILIES

    class Count(accelerate_hooks.ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            self.calls += 1
            return args, kwargs

    model = _tiny("llama", torch.float16, device)
    ids = _prompt(device)
    hook = Count()
    accelerate_hooks.add_hook_to_module(model.model.layers[0].post_attention_layernorm, hook)
    with torch.no_grad():
        ref = model(ids).logits
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert report.swapped["model.layers.0"] == "LlamaDecoderLayer"
    hook.calls = 0
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)
    assert hook.calls == 1


def _kernelized_llama_with_an_fp32_layer(device, edit):
    """A tiny fp16 Llama after ``edit(model)``, whose layer 1 keeps post_attention_layernorm and mlp (with the final
    norm and lm_head) in fp32: (model kernelized with every family, prompt ids, eager's fp32 logits before)."""
    from triton_collection.integrations.families import ALL_FAMILIES

    model = _tiny("llama", torch.float16, device)
    edit(model)
    layer = model.model.layers[1]
    for m in (layer.post_attention_layernorm, layer.mlp, model.model.norm, model.lm_head):
        m.float()
    ids = _prompt(device)
    with torch.no_grad():
        ref = model(ids).logits
    assert ref.dtype == torch.float32
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert [report.swapped[f"model.layers.{i}"] for i in range(2)] == ["LlamaDecoderLayer"] * 2
    return model, ids, ref


def test_decoder_layer_does_not_fuse_an_attention_output_of_another_dtype(installed, device, monkeypatch):
    """Where the attention output's dtype is not the residual's (here layer 1's attention returns fp32 in an fp16
    model), eager adds them in the promoted dtype (h in fp32, not rounded to fp16): the layer takes the original
    steps there (a fused add_rms_norm would round h to the residual's fp16). Layer 0 still fuses; logits as eager's."""
    class Fp32Output(nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.attn = attn

        def forward(self, **kwargs):
            out, weights = self.attn(**kwargs)
            return out.float(), weights

    def edit(model):
        model.model.layers[1].self_attn = Fp32Output(model.model.layers[1].self_attn)

    model, ids, ref = _kernelized_llama_with_an_fp32_layer(device, edit)
    calls = _count_fused(model, monkeypatch)
    with torch.no_grad():
        logits = model(ids).logits
    assert calls == ["mean"]  # layer 0 only
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)


def test_decoder_layer_fused_norm_reads_the_norm_eps_and_promotes_to_its_weight(installed, device):
    """The fused add_rms_norm uses the norm's own ``variance_epsilon`` (here 0.5, far from the 1e-6 default) and
    its output dtype is eager's ``promote(weight, x)``: layer 1's post_attention_layernorm, mlp, the final norm and
    lm_head kept in fp32 in an fp16 model (keep-in-fp32 style) give fp32 hidden states after the norm. Logits as
    eager's, the norm fused in both layers."""
    def edit(model):
        for m in model.modules():
            if type(m).__name__ == "LlamaRMSNorm":
                m.variance_epsilon = 0.5

    model, ids, ref = _kernelized_llama_with_an_fp32_layer(device, edit)
    with torch.no_grad():
        logits = model(ids).logits
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)


def test_attention_layer_in_eval_applies_no_dropout(installed, device):
    """A config with attention_dropout > 0 in eval mode: the layer passes dropout=0.0, as the module; the
    logits equal the unkernelized model's (sdpa would drop weights at random with dropout_p > 0)."""
    from triton_collection.integrations.families import LLAMA_ATTENTION

    ours, eager = (_tiny("llama", torch.float32, device, attention_dropout=0.5) for _ in range(2))
    for m in (ours, eager):
        m.set_attn_implementation("sdpa")
    kernelize(ours, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_ATTENTION,))
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, eager(ids).logits, rtol=1e-5, atol=1e-6)


def test_attention_layer_decode_step_logits_equal_eager(installed, device):
    """Rotary before the cache update: a decode step's logits (DynamicCache, keys cached rotated) equal the
    unkernelized model's; rotating after the update re-rotates every cached key by the newest position."""
    from triton_collection.integrations.families import LLAMA_ATTENTION

    ours, eager = _tiny("llama", torch.float32, device), _tiny("llama", torch.float32, device)
    kernelize(ours, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_ATTENTION,))
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    nxt = torch.randint(1, 128, (2, 1), generator=torch.Generator().manual_seed(2)).to(device)
    steps = []
    for m in (ours, eager):
        cache = transformers.DynamicCache()
        with torch.no_grad():
            m(ids, past_key_values=cache, use_cache=True)
            steps.append(m(nxt, past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-5, atol=1e-6)


def test_attention_layer_passes_the_extra_kwargs_to_the_attention_function(installed, device):
    """The LlamaAttention layer hands the attention function every extra keyword the model passes (position_ids
    for packed sequences under flash attention, a custom AttentionInterface's own options), as the module does."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from triton_collection.integrations.families import LLAMA_ATTENTION

    seen = []

    def spy(module, q, k, v, mask, **kwargs):
        seen.append(frozenset(kwargs))
        return sdpa_attention_forward(module, q, k, v, mask, **{n: kwargs[n] for n in ("dropout", "scaling")})

    AttentionInterface.register("spy_for_kwargs", spy)
    ours, eager = _tiny("llama", torch.float32, device), _tiny("llama", torch.float32, device)
    kernelize(ours, mode=Mode.INFERENCE, org=ORG, families=(LLAMA_ATTENTION,))
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(1)).to(device)
    got = []
    for m in (ours, eager):
        m.set_attn_implementation("spy_for_kwargs")
        seen.clear()
        with torch.no_grad():
            got.append(m(ids).logits)
        got.append(list(seen))
    assert got[1] == got[3] and "position_ids" in got[3][0], got[1::2]
    torch.testing.assert_close(got[0], got[2], rtol=1e-5, atol=1e-6)
