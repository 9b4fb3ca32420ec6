"""triton-norms Hub layers against the real modules they replace (transformers, torch, diffusers).

Each layer's ``forward`` is run with the original module as ``self`` (exactly what
``kernelize`` does) and compared with the module's own forward: same output dtype,
same values. Half-precision outputs must be bit-identical except where torch's
differently ordered fp32 mean of squares lands on the other side of a rounding
boundary: at most 2 ulps, on under 2% of elements (measured on an H200: rstd differs
by one fp32 ulp on ~20% of rows, output elements differ at a rate of ~1e-5). fp32 outputs
differ only by that fp32 reduction order (a few ulps). One test goes through
``kernels.kernelize`` with the layers loaded by Hub name.
"""

import pytest
import torch
from torch import nn

from .conftest import ORG

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
FP32_ULPS = 16


def _ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    _, e = torch.frexp(t.double())
    min_exp = -14 if dtype == torch.float16 else -126
    return torch.pow(2.0, (torch.clamp(e - 1, min=min_exp) - MANTISSA[dtype]).double())


def assert_matches_module(actual: torch.Tensor, expected: torch.Tensor):
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != module's {expected.dtype}"
    assert actual.shape == expected.shape
    # a flipped rstd moves a half output by <= 2 ulps (xn rounded before the weight multiply)
    ulps = FP32_ULPS if expected.dtype == torch.float32 else 2
    tol = ulps * _ulp(torch.maximum(actual.abs(), expected.abs()), expected.dtype)
    if expected.dtype == torch.float32:  # x * w + b may cancel: fp32 rounding at the terms' scale
        tol = tol + 4 * _ulp(expected.abs().max(), torch.float32)
    diff = (actual.double() - expected.double()).abs()
    assert (diff <= tol).all(), f"worst diff {diff.max().item():.3g}"
    if expected.dtype != torch.float32:
        frac = (actual != expected).float().mean().item()
        assert frac < 0.02, f"{frac:.1%} of elements differ by 1 ulp"


def _randomise(module: nn.Module, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))
    return module


def _run_layer(layer_cls, module, x):
    return layer_cls.forward(module, x)  # the module's attributes, the layer's forward


def _hf(name):
    import transformers.models as m

    modules = {
        "LlamaRMSNorm": m.llama.modeling_llama.LlamaRMSNorm,
        "Qwen3RMSNorm": m.qwen3.modeling_qwen3.Qwen3RMSNorm,
        "Olmo2RMSNorm": m.olmo2.modeling_olmo2.Olmo2RMSNorm,
        "GptOssRMSNorm": m.gpt_oss.modeling_gpt_oss.GptOssRMSNorm,
        "GemmaRMSNorm": m.gemma.modeling_gemma.GemmaRMSNorm,
    }
    return modules[name]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# N: one block (96), odd (4097) and the looped path (16411 fp32 / 32771 all dtypes)
@pytest.mark.parametrize("N", [96, 4097, 32771])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hf_name, layer", [
    ("LlamaRMSNorm", "LlamaRMSNorm"), ("Qwen3RMSNorm", "LlamaRMSNorm"),
    ("Olmo2RMSNorm", "Olmo2RMSNorm"), ("GptOssRMSNorm", "Olmo2RMSNorm"),
    ("GemmaRMSNorm", "GemmaRMSNorm"),
])
def test_case6_transformers_rms_norms_exact(norms, device, hf_name, layer, dtype, N):
    module = _randomise(_hf(hf_name)(N, eps=1e-6)).to(device=device, dtype=dtype)
    x = torch.randn(2, 3, N, device=device).to(dtype) * 3
    with torch.no_grad():
        assert_matches_module(_run_layer(getattr(norms.layers, layer), module, x), module(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("make, layer", [
    (lambda n: _hf("LlamaRMSNorm")(n, eps=1e-6), "LlamaRMSNorm"),
    (lambda n: _hf("Olmo2RMSNorm")(n, eps=1e-6), "Olmo2RMSNorm"),
    (lambda n: nn.RMSNorm(n, eps=1e-6), "TorchRMSNorm"),
])
def test_rms_layers_keep_the_sign_of_zero_weights(norms, device, make, layer, dtype):
    """A weight element of exactly -0.0 gives -0.0 outputs, as the module's ``weight * x`` does (a zero offset
    added as +0.0 would turn it into +0.0): compared bit for bit through ``signbit``, inference and training."""
    N = 96
    module = _randomise(make(N)).to(device=device, dtype=dtype)
    with torch.no_grad():
        module.weight[::3] = -0.0
        module.weight[1::3] = 0.0
    x = torch.randn(4, N, device=device).to(dtype)
    want = module(x)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            got = _run_layer(getattr(norms.layers, layer), module, x.clone().requires_grad_(grad))
        zeros = want == 0
        assert zeros[:, ::3].all() and torch.equal(torch.signbit(got[zeros]), torch.signbit(want[zeros]))
    # the functional form with an explicit zero offset, both signs of it
    for offset in (0.0, -0.0):
        y = norms.rms_norm(x, module.weight, eps=1e-6, weight_offset=offset)
        assert torch.equal(torch.signbit(y[:, ::3]), ~torch.signbit(x[:, ::3]))  # x * (-0.0)


@pytest.mark.parametrize("x_dtype, w_dtype", [
    (torch.bfloat16, torch.float32), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
    (torch.float16, torch.bfloat16),
])
@pytest.mark.parametrize("hf_name, layer", [
    ("LlamaRMSNorm", "LlamaRMSNorm"), ("Olmo2RMSNorm", "Olmo2RMSNorm"), ("GemmaRMSNorm", "GemmaRMSNorm"),
])
def test_transformers_rms_norms_mixed_weight_dtype(norms, device, hf_name, layer, x_dtype, w_dtype):
    """Output dtype follows the module: Llama promote(w, x); Olmo2 and Gemma x.dtype."""
    module = _randomise(_hf(hf_name)(256, eps=1e-5)).to(device=device, dtype=w_dtype)
    x = torch.randn(4, 256, device=device).to(x_dtype)
    with torch.no_grad():
        assert_matches_module(_run_layer(getattr(norms.layers, layer), module, x), module(x))


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("shape", [(96,), (4, 24)])
@pytest.mark.parametrize("x_dtype, w_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32), (torch.float16, None),
])
def test_torch_rms_norm_exact(norms, device, shape, eps, x_dtype, w_dtype):
    module = nn.RMSNorm(shape, eps=eps, elementwise_affine=w_dtype is not None)
    module = _randomise(module).to(device=device, dtype=w_dtype or torch.float32)
    x = torch.randn(2, 5, *shape, device=device).to(x_dtype)
    with torch.no_grad():
        assert_matches_module(_run_layer(norms.layers.TorchRMSNorm, module, x), module(x))


@pytest.mark.parametrize("x_dtype, w_dtype, bias", [
    (torch.bfloat16, torch.bfloat16, False), (torch.bfloat16, torch.bfloat16, True),
    (torch.float16, torch.float16, True), (torch.bfloat16, torch.float32, False),
    (torch.bfloat16, torch.float32, True), (torch.float32, torch.bfloat16, True),
    (torch.float32, torch.float32, False), (torch.bfloat16, None, False), (torch.float16, None, False),
])
def test_diffusers_rms_norm_exact(norms, device, x_dtype, w_dtype, bias):
    RMSNorm = pytest.importorskip("diffusers.models.normalization").RMSNorm
    module = RMSNorm(128, eps=1e-6, elementwise_affine=w_dtype is not None, bias=bias)
    module = _randomise(module).to(device=device, dtype=w_dtype or torch.float32)
    x = torch.randn(2, 7, 128, device=device).to(x_dtype)
    with torch.no_grad():
        assert_matches_module(_run_layer(norms.layers.DiffusersRMSNorm, module, x), module(x))


@pytest.mark.parametrize("x_dtype, w_dtype, b_dtype", [
    (torch.float16, torch.float16, torch.float32), (torch.float32, torch.float16, torch.float32),
    (torch.float16, torch.float32, torch.float16), (torch.bfloat16, torch.bfloat16, torch.float16),
])
def test_diffusers_rms_norm_exact_with_a_bias_of_another_dtype(norms, device, x_dtype, w_dtype, b_dtype):
    # diffusers rounds xn * w to a half weight's dtype, then adds the bias in the promoted dtype (the layer rounded
    # the product to the promoted dtype: ~99% of the elements were off, 9e-4 in fp16 / fp32)
    RMSNorm = pytest.importorskip("diffusers.models.normalization").RMSNorm
    module = _randomise(RMSNorm(96, eps=1e-6, bias=True)).to(device)
    module.weight.data = module.weight.data.to(w_dtype)
    module.bias.data = module.bias.data.to(b_dtype)
    x = torch.randn(2, 7, 96, device=device).to(x_dtype)
    with torch.no_grad():
        assert_matches_module(_run_layer(norms.layers.DiffusersRMSNorm, module, x), module(x))


@pytest.mark.parametrize("shape", [(96,), (4, 24), (4097,)])
@pytest.mark.parametrize("affine, bias", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("x_dtype, p_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.bfloat16, torch.float32),
])
def test_layer_norm_matches_torch(norms, device, shape, affine, bias, x_dtype, p_dtype):
    """LayerNorm: torch computes y = x * rstd + (-mean * rstd) and we (x - mean) * rstd, so
    results are compared within 1 ulp (fp32: 16 ulps) rather than bit for bit."""
    module = _randomise(nn.LayerNorm(shape, elementwise_affine=affine, bias=bias)).to(device=device, dtype=p_dtype)
    x = torch.randn(3, 2, *shape, device=device).to(x_dtype) + 1
    with torch.no_grad():
        try:
            expected = module(x)
        except RuntimeError as e:  # CUDA layer_norm rejects a half input with fp32 parameters
            pytest.skip(f"torch rejects this combination here: {e}")
        actual = _run_layer(norms.layers.LayerNorm, module, x)
    assert actual.dtype == expected.dtype
    scale = expected.abs().max().double()
    ulps = FP32_ULPS if x_dtype == torch.float32 else 1
    tol = ulps * _ulp(expected, expected.dtype) + 1e-6 * scale  # + the fp32 difference at cancellations
    assert ((actual.double() - expected.double()).abs() <= tol).all()


# ----------------------------------------------------------------------------- gradients


def _module_grads(fn, module, x, g):
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    fn(module, x).backward(g)
    return [x.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("make, layer", [
    (lambda: _hf("LlamaRMSNorm")(300, eps=1e-6), "LlamaRMSNorm"),
    (lambda: _hf("Olmo2RMSNorm")(300, eps=1e-6), "Olmo2RMSNorm"),
    (lambda: _hf("GemmaRMSNorm")(300, eps=1e-6), "GemmaRMSNorm"),
    (lambda: nn.RMSNorm((300,)), "TorchRMSNorm"),
    (lambda: nn.LayerNorm((300,)), "LayerNorm"),
    (lambda: nn.LayerNorm((3, 100)), "LayerNorm"),
])
def test_layer_gradients_match_module_autograd(norms, device, make, layer):
    """fp32: dx, dw (and db) equal the module's autograd gradients up to fp32 reduction order."""
    module = _randomise(make()).to(device)
    x = torch.randn(4, 3, *module.weight.shape, device=device)
    g = torch.randn_like(x)
    ours = _module_grads(lambda m, x: _run_layer(getattr(norms.layers, layer), m, x), module, x, g)
    ref = _module_grads(lambda m, x: m(x), module, x, g)
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())


@pytest.mark.parametrize("make, layer", [
    (lambda: _hf("LlamaRMSNorm")(13, eps=1e-6), "LlamaRMSNorm"),
    (lambda: _hf("GemmaRMSNorm")(13, eps=1e-6), "GemmaRMSNorm"),
    (lambda: nn.RMSNorm((13,)), "TorchRMSNorm"),
    (lambda: nn.LayerNorm((3, 5)), "LayerNorm"),
])
def test_layer_second_derivatives(norms, device, make, layer):
    """create_graph=True through a layer (a gradient penalty on the gradients of the input and of the parameters):
    the second-order gradients of the input and the parameters equal those of the module's own autograd (fp32, up
    to reduction order)."""
    module = _randomise(make()).to(device)
    x = torch.randn(4, 3, *module.weight.shape, device=device) * 2 + 0.5
    dy = torch.randn_like(x)
    vs = [torch.randn_like(t) for t in (x, *module.parameters())]

    def second_order(fn):
        ins = [x.clone().requires_grad_(), *module.parameters()]
        grads = torch.autograd.grad(fn(ins[0]), ins, dy, create_graph=True)
        return torch.autograd.grad(sum((g * v).sum() for g, v in zip(grads, vs)), ins, allow_unused=True,
                                   materialize_grads=True)

    ours = second_order(lambda x: _run_layer(getattr(norms.layers, layer), module, x))
    for a, r in zip(ours, second_order(module)):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4 * r.abs().max().item())


def test_diffusers_layer_gradients(norms, device):
    RMSNorm = pytest.importorskip("diffusers.models.normalization").RMSNorm
    module = _randomise(RMSNorm(64, eps=1e-6, bias=True)).to(device)
    x = torch.randn(5, 64, device=device)
    g = torch.randn_like(x)
    ours = _module_grads(lambda m, x: _run_layer(norms.layers.DiffusersRMSNorm, m, x), module, x, g)
    ref = _module_grads(lambda m, x: m(x), module, x, g)
    for a, r in zip(ours, ref):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())


# ----------------------------------------------------------------------------- kernelize


def test_layers_follow_the_hub_layer_rules(norms):
    for name in ["LlamaRMSNorm", "Olmo2RMSNorm", "GemmaRMSNorm", "TorchRMSNorm", "DiffusersRMSNorm", "LayerNorm"]:
        cls = getattr(norms.layers, name)
        assert issubclass(cls, nn.Module) and cls.__init__ is nn.Module.__init__
        assert cls.has_backward is True and cls.can_torch_compile is True
        assert "Shapes:" in cls.__doc__
        extra = {n for n in dir(cls)} - {n for n in dir(nn.Module)}
        assert extra <= {"has_backward", "can_torch_compile"}, extra


def test_kernelize_torch_and_diffusers_modules_train_and_compile(installed, device):
    """kernels.kernelize (TRAINING | TORCH_COMPILE) swaps the layers in, loaded by Hub name;
    the compiled, kernelized model matches the eager original in outputs and gradients."""
    import kernels

    DiffusersRMSNorm = pytest.importorskip("diffusers.models.normalization").RMSNorm
    from kernels import LayerRepository, Mode

    # subclasses, so the global torch / diffusers classes are left untouched
    class RMSNormA(nn.RMSNorm):
        pass

    class LayerNormA(nn.LayerNorm):
        pass

    class DiffusersRMSNormA(DiffusersRMSNorm):
        pass

    for cls, name in [(RMSNormA, "TorchRMSNorm"), (LayerNormA, "LayerNorm"), (DiffusersRMSNormA, "DiffusersRMSNorm")]:
        kernels.replace_kernel_forward_from_hub(cls, name)

    def build():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(64, 64), RMSNormA(64), nn.Linear(64, 64), LayerNormA(64),
                             DiffusersRMSNormA(64, eps=1e-6), nn.Linear(64, 8)).to(device)

    ref, model = build(), build()
    mapping = {name: {device: LayerRepository(repo_id=f"{ORG}/triton-norms", layer_name=name, version=1)}
               for name in ["TorchRMSNorm", "LayerNorm", "DiffusersRMSNorm"]}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=device, use_fallback=False)
    for i, name in [(1, "TorchRMSNorm"), (3, "LayerNorm"), (4, "DiffusersRMSNorm")]:  # swapped on the instances
        assert model[i].forward.__func__.__qualname__ == f"{name}.forward"
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 64, device=device)
    out, out_ref = compiled(x), ref(x)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    out_ref.square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
