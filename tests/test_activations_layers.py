"""triton-activations Hub layers against the modules they replace, and through ``kernels.kernelize``.

Each layer's ``forward`` runs with the original module as ``self`` (what ``kernelize``
does) and is compared with the module's own forward. transformers' NewGELU/FastGELU/
QuickGELU forwards round after every eager op; the layers reproduce those rounding points
and are bit-exact in fp16/bf16 (measured: 0 of 65536 elements differ on CPU). The
single-op activations (``F.silu``/``F.gelu``) are bit-exact but for the cancellation tail
of ``1 + erf(u)``, u << 0, where torch's own CPU fp16 and fp32 kernels disagree (see
``tail_noise``). fp32 outputs differ from torch's by the fp32 error of exp/tanh/erf.
"""

import functools
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .conftest import ORG
from .test_activations import DTYPES, THRESHOLD, assert_close_ref, assert_mostly_exact, rand, tail_noise

KC_LAYERS = ["SiluAndMul", "MulAndSilu", "GeluAndMul", "GeluTanhAndMul", "FatreluAndMul", "FastGELU", "NewGELU",
             "QuickGELU", "Silu", "Gelu", "GeluTanh"]
HF_LAYERS = ["SiLUActivation", "GELUActivation", "GELUTanh", "NewGELUActivation", "FastGELUActivation",
             "QuickGELUActivation"]


def _hf(name, **kwargs):
    from transformers import activations

    return getattr(activations, name)(**kwargs)


# (layer, transformers module factory, op whose tail noise applies)
HF_CASES = [
    ("SiLUActivation", lambda: _hf("SiLUActivation"), "silu"),
    ("GELUActivation", lambda: _hf("GELUActivation"), "gelu"),
    ("GELUActivation", lambda: _hf("GELUActivation", use_gelu_python=True), "gelu"),
    ("GELUTanh", lambda: _hf("GELUTanh"), "gelu_tanh"),
    ("GELUTanh", lambda: _hf("GELUTanh", use_gelu_tanh_python=True), "gelu_tanh"),
    ("NewGELUActivation", lambda: _hf("NewGELUActivation"), "gelu_new"),
    ("FastGELUActivation", lambda: _hf("FastGELUActivation"), "gelu_fast"),
    ("QuickGELUActivation", lambda: _hf("QuickGELUActivation"), "gelu_quick"),
]


class GatedModule(nn.Module):
    """An eager ``act(x[..., :d]) * x[..., d:]`` module (vLLM/kernels-community style), ``threshold`` for FATReLU."""

    def __init__(self, kind: str, threshold: float = 0.0):
        super().__init__()
        self.kind, self.threshold = kind, threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        a, b = x[..., :d], x[..., d:]
        if self.kind == "mul_and_silu":
            return a * F.silu(b)
        act = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
               "fatrelu": lambda t: torch.where(t > self.threshold, t, torch.zeros_like(t))}[self.kind]
        return act(a) * b


# layer -> (eager module, op for the tail noise)
KC_GATED = {
    "SiluAndMul": (lambda: GatedModule("silu"), "silu_and_mul"),
    "MulAndSilu": (lambda: GatedModule("mul_and_silu"), "mul_and_silu"),
    "GeluAndMul": (lambda: GatedModule("gelu"), "gelu_and_mul"),
    "GeluTanhAndMul": (lambda: GatedModule("gelu_tanh"), "gelu_tanh_and_mul"),
    "FatreluAndMul": (lambda: GatedModule("fatrelu", THRESHOLD), "fatrelu_and_mul"),
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_layers_follow_the_hub_layer_rules(activations):
    for name in KC_LAYERS + HF_LAYERS + ["LlamaMLP", "Phi3MLP"]:
        cls = getattr(activations.layers, name)
        assert issubclass(cls, nn.Module) and cls.__init__ is nn.Module.__init__
        assert cls.has_backward is True and cls.can_torch_compile is True
        assert "Shapes:" in cls.__doc__, name
        extra = {n for n in dir(cls)} - {n for n in dir(nn.Module)}
        assert extra <= {"has_backward", "can_torch_compile"}, extra


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer,make,op", HF_CASES)
def test_transformers_activations_exact(activations, device, layer, make, op, dtype):
    module = make()
    x = rand((8, 1031), dtype, device)
    y = getattr(activations.layers, layer).forward(module, x)
    expected = module(x)
    assert_mostly_exact(y, expected, tail_noise(op, x))
    if op in ("gelu_new", "gelu_fast", "gelu_quick") and dtype != torch.float32:
        assert torch.equal(y, expected)  # every eager rounding point reproduced


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", list(KC_GATED))
def test_kernels_community_gated_layers_equal_eager_act_times_up(activations, device, layer, dtype):
    make, op = KC_GATED[layer]
    module = make()
    h = rand((2, 5, 2 * 2 * 259), dtype, device)
    x = h[..., : 2 * 259]  # a view with row stride 2x its width
    y = getattr(activations.layers, layer).forward(module, x)
    assert_mostly_exact(y, module(x), tail_noise(op, x), ulps=2)


def test_fatrelu_layer_reads_the_module_threshold(activations, device):
    x = rand((4, 64), torch.float32, device)
    for thr in (0.0, 0.7):
        assert torch.equal(activations.layers.FatreluAndMul.forward(GatedModule("fatrelu", thr), x),
                           GatedModule("fatrelu", thr)(x))
    with pytest.raises(AttributeError, match="threshold"):
        activations.layers.FatreluAndMul().forward(x)  # no default: the module must carry it


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_community_plain_layers_fused(activations, device, dtype):
    A = activations
    x = rand((8, 515), dtype, device)
    for layer, fn in [("Silu", A.silu), ("Gelu", A.gelu), ("GeluTanh", A.gelu_tanh), ("NewGELU", A.gelu_new),
                      ("FastGELU", A.gelu_fast), ("QuickGELU", A.gelu_quick)]:
        y = getattr(A.layers, layer)().forward(x)
        assert torch.equal(y, fn(x)) and y.dtype == dtype  # computed in fp32, rounded once


@pytest.mark.parametrize("layer,make,op", HF_CASES)
def test_layer_gradients_match_module_autograd(activations, device, layer, make, op):
    module = make()
    x = rand((4, 300), torch.float32, device, scale=2.0)
    xl, xm = x.clone().requires_grad_(), x.double().requires_grad_()
    dy = torch.randn(4, 300, device=device)
    getattr(activations.layers, layer).forward(module, xl).backward(dy)
    module(xm).backward(dy.double())
    assert_close_ref(xl.grad, xm.grad, rel_atol=2.0**-19)


# ----------------------------------------------------------------------------- the gated MLP layer

# act_fn -> (the op whose tail noise applies, whether the layer fuses it)
MLP_ACTS = {
    "SiLUActivation": (lambda: _hf("SiLUActivation"), "silu_and_mul", True),
    "nn.SiLU": (nn.SiLU, "silu_and_mul", True),
    "GELUTanh": (lambda: _hf("GELUTanh"), "gelu_tanh_and_mul", True),
    "GELUActivation": (lambda: _hf("GELUActivation"), "gelu_and_mul", True),
    "nn.GELU(tanh)": (lambda: nn.GELU(approximate="tanh"), "gelu_tanh_and_mul", True),
    "GELUTanh(python)": (lambda: _hf("GELUTanh", use_gelu_tanh_python=True), None, False),
    "nn.ReLU": (nn.ReLU, None, False),
}


def _mlp(act_fn, dtype, device, hidden=23, intermediate=131, bias=False, kind="LlamaMLP"):
    """transformers' ``LlamaMLP`` (gate_proj, up_proj) or ``Phi3MLP`` (one gate_up_proj) with ``act_fn``."""
    from types import SimpleNamespace

    from transformers.models.llama.modeling_llama import LlamaMLP
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    config = SimpleNamespace(hidden_size=hidden, intermediate_size=intermediate, hidden_act="silu", mlp_bias=bias)
    if kind == "LlamaMLP":
        mlp = LlamaMLP(config)
        mlp.act_fn = act_fn
    else:
        mlp = Phi3MLP(config)
        mlp.activation_fn = act_fn
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    return mlp.to(device=device, dtype=dtype)


def _gate_up(mlp, x):
    """The MLP's (gate, up) projections of x."""
    if hasattr(mlp, "gate_up_proj"):
        return mlp.gate_up_proj(x).chunk(2, dim=-1)
    return mlp.gate_proj(x), mlp.up_proj(x)


@pytest.mark.parametrize("kind", ["LlamaMLP", "Phi3MLP"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", list(MLP_ACTS))
def test_gated_mlp_layer_equals_the_module(activations, device, act, dtype, kind):
    """``LlamaMLP`` / ``Phi3MLP`` against transformers' modules with each act_fn: the fused kernel where the act is
    known (the projections are the module's own, so only ``act(gate) * up`` can differ: bitwise on a GPU but for
    the fp32 tanh GELU, within the CPU exp / erf noise here), the module's own formula otherwise (bitwise
    everywhere)."""
    make, op, fused = MLP_ACTS[act]
    mlp = _mlp(make(), dtype, device, bias=act == "nn.SiLU", kind=kind)
    A = activations.layers
    act_fn = mlp.act_fn if kind == "LlamaMLP" else mlp.activation_fn
    assert (A._fusable_activation(act_fn) is not None) is fused
    x = rand((3, 5, 23), dtype, device, scale=2.0)
    with torch.no_grad():
        y = getattr(A, kind).forward(mlp, x)
        expected = mlp(x)
        gate, up = _gate_up(mlp, x)
        inner = act_fn(gate) * up
        got_inner = activations.act_and_mul(gate, up, activation=A._fusable_activation(act_fn)) if fused else inner
    assert y.dtype == expected.dtype and y.shape == expected.shape
    if not fused or device != "cpu" and not (dtype == torch.float32 and op == "gelu_tanh_and_mul"):
        assert torch.equal(y, expected)
    else:
        assert_mostly_exact(got_inner, inner, tail_noise(op, torch.cat([gate, up], -1)), ulps=2)
        assert torch.equal(y, mlp.down_proj(got_inner))


def test_gated_mlp_layer_runs_an_act_fn_with_hooks_or_its_own_forward(activations, device):
    """An act_fn with a forward hook, or whose forward an instance replaced, runs as the module would."""
    A = activations.layers
    mlp = _mlp(_hf("SiLUActivation"), torch.float32, device)
    x = rand((4, 23), torch.float32, device)
    seen = []
    handle = mlp.act_fn.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    assert A._fusable_activation(mlp.act_fn) is None
    with torch.no_grad():
        assert torch.equal(A.LlamaMLP.forward(mlp, x), mlp(x)) and len(seen) == 2
    handle.remove()
    mlp.act_fn.forward = lambda t: torch.relu(t)  # an instance forward of someone else's
    assert A._fusable_activation(mlp.act_fn) is None
    with torch.no_grad():
        assert torch.equal(A.LlamaMLP.forward(mlp, x), mlp(x))
    mlp.act_fn.forward = types.MethodType(A.SiLUActivation.forward, mlp.act_fn)  # kernelized by our layer
    assert A._fusable_activation(mlp.act_fn) == "silu"
    del mlp.act_fn.forward
    hooks = torch.nn.modules.module
    for register in (mlp.act_fn.register_full_backward_hook, mlp.act_fn.register_forward_pre_hook,
                     mlp.act_fn.register_full_backward_pre_hook, hooks.register_module_forward_hook,
                     hooks.register_module_forward_pre_hook, hooks.register_module_full_backward_hook,
                     hooks.register_module_full_backward_pre_hook):
        handle = register(lambda *args: None)
        assert A._fusable_activation(mlp.act_fn) is None, register
        with torch.no_grad():
            assert torch.equal(A.LlamaMLP.forward(mlp, x), mlp(x))
        handle.remove()
    handle = mlp.act_fn.register_forward_pre_hook(lambda m, args: (2 * args[0],))  # changes what the act sees
    with torch.no_grad():
        assert torch.equal(A.LlamaMLP.forward(mlp, x), mlp(x))
    handle.remove()
    assert A._fusable_activation(mlp.act_fn) == "silu"


def test_gated_mlp_layer_runs_a_patched_act_class(activations, device, monkeypatch):
    """A class whose forward was replaced (``SiLUActivation.forward = ...``) is not taken for the class it was."""
    A = activations.layers
    mlp = _mlp(nn.SiLU(), torch.float32, device)
    monkeypatch.setattr(nn.SiLU, "forward", lambda self, t: torch.relu(t))
    assert A._fusable_activation(mlp.act_fn) is None
    x = rand((4, 23), torch.float32, device)
    with torch.no_grad():
        assert torch.equal(A.LlamaMLP.forward(mlp, x), mlp(x))


@pytest.mark.parametrize("kind", ["LlamaMLP", "Phi3MLP"])
def test_gated_mlp_layer_gradients(activations, device, kind):
    """Gradients of x and of the projections' weights against the module's autograd (fp32)."""
    mlp = _mlp(_hf("SiLUActivation"), torch.float32, device, bias=True, kind=kind)
    x = rand((3, 5, 23), torch.float32, device).requires_grad_()
    y = getattr(activations.layers, kind).forward(mlp, x)
    dy = torch.randn_like(y)
    params = [x, *mlp.parameters()]
    got = torch.autograd.grad(y, params, dy)
    expected = torch.autograd.grad(mlp(x), params, dy)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=2**-18, atol=2**-18 * e.abs().max().item())


def _mapping(layers, device):
    from kernels import LayerRepository

    return {name: {device: LayerRepository(repo_id=f"{ORG}/triton-activations", layer_name=layer, version=1)}
            for name, layer in layers.items()}


def test_kernelize_transformers_activations_train_and_compile(installed, device):
    """kernels.kernelize (TRAINING | TORCH_COMPILE) swaps every decorated transformers activation for
    its exact layer, loaded by Hub name; outputs equal the eager model bitwise in bf16, and the
    compiled fp32 model matches outputs and gradients."""
    import kernels
    from kernels import Mode
    from transformers import activations as ta

    classes = {"SiLU": ta.SiLUActivation, "GeLU": ta.GELUActivation, "GeluTanh": ta.GELUTanh,
               "NewGELU": ta.NewGELUActivation, "FastGELU": ta.FastGELUActivation, "QuickGELU": ta.QuickGELUActivation}
    names = {name: getattr(cls, "kernel_layer_name", None) for name, cls in classes.items()}
    if not any(names.values()) and device != "cpu":  # the GPU host's own transformers, without a kernels it accepts
        pytest.skip("transformers' use_kernel_forward_from_hub decorator is inactive in this environment")
    assert names == {name: name for name in classes}  # the decorator is active (kernels 0.17.2 in `make setup`)
    layer_of = {"SiLU": "SiLUActivation", "GeLU": "GELUActivation", "GeluTanh": "GELUTanh",
                "NewGELU": "NewGELUActivation", "FastGELU": "FastGELUActivation", "QuickGELU": "QuickGELUActivation"}

    def build(dtype):
        torch.manual_seed(3)
        mods = []
        for cls in classes.values():
            mods += [nn.Linear(64, 64), cls()]
        return nn.Sequential(*mods, nn.Linear(64, 8)).to(device=device, dtype=dtype)

    for dtype in (torch.bfloat16, torch.float32):
        ref, model = build(dtype), build(dtype)
        with kernels.use_kernel_mapping(_mapping(layer_of, device), inherit_mapping=False):
            kernels.kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=device, use_fallback=False)
        for i, cls in enumerate(classes.values()):
            assert model[2 * i + 1].forward.__func__.__qualname__ == f"{layer_of[cls.kernel_layer_name]}.forward"
        x = torch.randn(6, 64, device=device).to(dtype)
        if dtype == torch.bfloat16:
            with torch.no_grad():
                out, out_ref = model(x), ref(x)
            assert torch.equal(out, out_ref)  # every activation bit-exact (a GELU-tail flip would show here)
            continue
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        out, out_ref = compiled(x), ref(x)
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        out_ref.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_kernelize_gated_modules_by_kernels_community_names(installed, device):
    """A model's own SwiGLU / FATReLU modules, named like kernels-community's layers, swapped bitwise (bf16)."""
    import kernels
    from kernels import Mode

    class SwiGLU(GatedModule):
        pass

    class FATReLU(GatedModule):
        pass

    kernels.replace_kernel_forward_from_hub(SwiGLU, "SiluAndMul")
    kernels.replace_kernel_forward_from_hub(FATReLU, "FatreluAndMul")
    model = nn.Sequential(nn.Linear(32, 128), SwiGLU("silu"), nn.Linear(64, 64), FATReLU("fatrelu", 0.05))
    model = model.to(device=device, dtype=torch.bfloat16)
    x = torch.randn(5, 32, device=device).to(torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        mapping = _mapping({"SiluAndMul": "SiluAndMul", "FatreluAndMul": "FatreluAndMul"}, device)
        with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
            kernels.kernelize(model, mode=Mode.INFERENCE, device=device, use_fallback=False)
        assert model[1].forward.__func__.__qualname__ == "SiluAndMul.forward"
        assert model[3].forward.__func__.__qualname__ == "FatreluAndMul.forward"
        assert torch.equal(model(x), expected)


# ----------------------------------------------------------------------------- the transformers shim


@pytest.mark.parametrize("layer,make,op", HF_CASES)
def test_shim_probe_maps_each_transformers_activation(layer, make, op):
    from triton_collection.integrations.families import ACTIVATION_FAMILIES, FAMILIES, probe

    module = make()
    result = probe(module)
    if getattr(getattr(module, "act", None), "__name__", "").endswith("_python"):  # use_gelu[_tanh]_python=True
        assert result.family is None and "matches no family" in result.reason  # the class probe is conservative
        return
    assert result.family is not None and result.family.layer == layer, result.reason
    assert result.family in ACTIVATION_FAMILIES and result.family not in FAMILIES


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_shim_kernelizes_tiny_llama_norms_and_silu(installed, device, dtype):
    """families=ALL_FAMILIES: the MLPs (act_fn(gate) * up in one kernel) and their SiLUActivation are swapped too;
    same logits and greedy tokens."""
    from kernels import Mode

    from triton_collection.integrations.families import ALL_FAMILIES
    from triton_collection.integrations.transformers import kernelize

    from .test_transformers_shim import _eager_reference, _greedy, _prompt, _tiny

    model = _tiny("llama", dtype, device)
    ids = _prompt(device)
    ref_logits, ref_tokens = _eager_reference(model, ids)

    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)

    assert report.swapped["model.layers.0.mlp.act_fn"] == "SiLUActivation"
    assert report.swapped["model.layers.1.mlp"] == "LlamaMLP"
    assert sorted(report.swapped.values()) == (["LlamaAttention"] * 2 + ["LlamaDecoderLayer"] * 2 + ["LlamaMLP"] * 2
                                               + ["LlamaRMSNorm"] * 5 + ["SiLUActivation"] * 2)
    assert report.layers["transformers.activations.SiLUActivation"] == f"{ORG}/triton-activations:SiLUActivation"
    assert report.layers["transformers.models.llama.modeling_llama.LlamaMLP"] == f"{ORG}/triton-activations:LlamaMLP"
    with torch.no_grad():
        logits = model(ids).logits
    if dtype == torch.float16:
        assert torch.equal(logits, ref_logits)
    else:  # the interpreter's bf16 norm outputs may be 1 ulp off (see test_transformers_shim)
        torch.testing.assert_close(logits, ref_logits, rtol=2**-6, atol=2**-6)
    assert torch.equal(_greedy(model, ids), ref_tokens)
    # the default stays the norms only
    assert set(kernelize(_tiny("llama", dtype, device), mode=Mode.INFERENCE, org=ORG).swapped.values()) == {
        "LlamaRMSNorm"}


# (transformers module path, class) -> the MLP family the shim's probe must pick (None: not a gated MLP)
MLP_CLASSES = {
    ("llama.modeling_llama", "LlamaMLP"): "gated_mlp",
    ("mistral.modeling_mistral", "MistralMLP"): "gated_mlp",
    ("qwen2.modeling_qwen2", "Qwen2MLP"): "gated_mlp",
    ("gemma.modeling_gemma", "GemmaMLP"): "gated_mlp",
    ("phi3.modeling_phi3", "Phi3MLP"): "gate_up_mlp",
    ("glm.modeling_glm", "GlmMLP"): "gate_up_mlp",
    ("gpt2.modeling_gpt2", "GPT2MLP"): None,
}


@pytest.mark.parametrize("path,name", list(MLP_CLASSES))
def test_shim_probe_maps_gated_mlps(path, name):
    """Gated MLPs of several models go to their family by the bitwise probe of their own forward (gelu-tanh
    Gemma too: the layer picks the kernel from act_fn); an MLP of another form is not a candidate."""
    import importlib
    from types import SimpleNamespace

    from triton_collection.integrations.families import ALL_FAMILIES, FAMILIES, candidate_families, probe

    cls = getattr(importlib.import_module(f"transformers.models.{path}"), name)
    if name == "GPT2MLP":
        from transformers import GPT2Config

        module = cls(4 * 24, GPT2Config(n_embd=24))
    else:
        act = "gelu_pytorch_tanh" if "Gemma" in name else "silu"
        module = cls(SimpleNamespace(hidden_size=24, intermediate_size=40, hidden_act=act, mlp_bias=False))
    expected = MLP_CLASSES[(path, name)]
    if expected is None:
        assert candidate_families(module) == ()
        return
    result = probe(module)
    assert result.family is not None and result.family.name == expected, result.reason
    assert result.family in ALL_FAMILIES and result.family not in FAMILIES
    # a class of the same attributes whose forward differs is refused: by its values, and by its form where the
    # values of the probe's scale would not show it (a clamp at 10)
    twisted = type(f"Twisted{name}", (cls,), {"forward": lambda self, x: 2 * cls.forward(self, x)})
    module.__class__ = twisted
    assert probe(module).family is None
    clamped = type(f"Clamped{name}", (cls,), {"forward": _clamped_forward})
    module.__class__ = clamped
    result = probe(module)
    assert result.family is None and "not one the" in result.reason, result.reason


def test_shim_gate_up_mlp_needs_twice_the_down_projection_width():
    """A ``gate_up_proj`` that is not twice ``down_proj``'s input (its halves could not be act(gate) * up for that
    down projection) is not a gate-up MLP candidate, whatever else it has."""
    from types import SimpleNamespace

    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    from triton_collection.integrations.families import GATE_UP_MLP, candidate_families

    module = Phi3MLP(SimpleNamespace(hidden_size=24, intermediate_size=40, hidden_act="silu", mlp_bias=False))
    assert candidate_families(module) == (GATE_UP_MLP,)
    for width in (82, 78, 81):
        module.gate_up_proj = nn.Linear(24, width, bias=False)
        assert candidate_families(module) == (), width


def _clamped_forward(self, x):
    return self.down_proj(self.act_fn(self.gate_proj(x).clamp(max=10.0)) * self.up_proj(x))


@pytest.mark.parametrize("path,name", [("deepseek_v4.modeling_deepseek_v4", "DeepseekV4MLP"),
                                       ("seed_oss.modeling_seed_oss", "SeedOssMLP"),
                                       ("step3p7.modeling_step3p7", "Step3p7MLP"),
                                       ("gemma3n.modeling_gemma3n", "Gemma3nTextMLP")])
def test_shim_probe_refuses_gated_mlps_with_more_steps(path, name):
    """transformers' MLPs whose forward adds a clamp, dropout, a per-layer limit or a sparsity branch (values the
    probe's unit-scale inputs, eval mode and first instance would not show) are refused by their form."""
    import importlib

    from triton_collection.integrations.families import GATED_MLP, _form_matches

    try:
        cls = getattr(importlib.import_module(f"transformers.models.{path}"), name)
    except (ImportError, AttributeError):
        pytest.skip(f"transformers has no {name}")
    module = nn.Module()
    module.__class__ = type(name, (nn.Module,), {"forward": cls.forward})
    assert not _form_matches(module, GATED_MLP)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_shim_kernelizes_tiny_phi3_gate_up_mlps(installed, device, dtype):
    """families=ALL_FAMILIES on a tiny Phi-3: its MLPs (one gate_up_proj) go to Phi3MLP; same logits and tokens."""
    import transformers
    from kernels import Mode

    from triton_collection.integrations.families import ALL_FAMILIES
    from triton_collection.integrations.transformers import kernelize

    from .test_transformers_shim import _TINY, LOGIT_TOL, _greedy, _prompt

    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**_TINY, pad_token_id=0))
    model = model.to(device=device, dtype=dtype).eval()
    ids = _prompt(device)
    with torch.no_grad():
        ref_logits = model(ids).logits
    ref_tokens = _greedy(model, ids)
    report = kernelize(model, mode=Mode.INFERENCE, org=ORG, families=ALL_FAMILIES)
    assert report.swapped["model.layers.0.mlp"] == "Phi3MLP"
    assert sorted(set(report.swapped.values())) == ["LlamaRMSNorm", "Phi3MLP", "SiLUActivation"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref_logits, **LOGIT_TOL[dtype])
    assert torch.equal(_greedy(model, ids), ref_tokens)


def test_layer_instance_float64_raises_the_op_dtype_error(activations, device):
    """An instance of the layer class itself (its forward is the layer's: nothing to fall back on) given float64
    gets the op's TypeError naming the dtype, not unbounded recursion."""
    x = torch.randn(2, 8, dtype=torch.float64, device=device)
    with pytest.raises(TypeError, match="float64"):
        activations.layers.Silu()(x)
    with pytest.raises(TypeError, match="float64"):
        activations.layers.SiluAndMul()(x)
