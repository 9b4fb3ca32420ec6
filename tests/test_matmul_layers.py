"""triton-matmul layers against the modules they replace: diffusers ``GELU``/``GEGLU``, ``torch.nn.Linear``.

The layer forwards run on the real module instances (``forward.__get__(module)``, as
``kernels.kernelize`` binds them). Tolerance: both sides accumulate in fp32; the modules round
the linear output to the dtype before the activation (and GEGLU rounds gelu(gate) and the
product again) where the kernel rounds once, so they differ by a few ulps of the output:
``ULPS`` of the largest output value per dtype. Gradients flow through the layers too. On a GPU
(``TEST_DEVICE=cuda``) fp32 inputs multiply as tf32 (documented in ``matmul``), so fp32 gets fp16's tolerance there.
"""

import pytest
import torch

from diffusers.models.activations import GEGLU, GELU

ULPS = {torch.float32: 1e-5, torch.float16: 4 * 2.0 ** -10, torch.bfloat16: 4 * 2.0 ** -7}


def _tolerance(dtype, device):
    return ULPS[torch.float16 if dtype == torch.float32 and device != "cpu" else dtype]


def _check(module, layer_cls, x, dtype):
    module = module.to(x.device, dtype)
    expected = module(x)
    actual = layer_cls.forward.__get__(module)(x)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    tol = _tolerance(dtype, x.device.type) * expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)
    return actual, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_layer(matmul, device, dtype, approximate):
    torch.manual_seed(0)
    module = GELU(31, 17, approximate=approximate)
    x = torch.randn(2, 5, 31).to(device, dtype)
    _check(module, matmul.layers.GELU, x, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_geglu_layer(matmul, device, dtype):
    torch.manual_seed(1)
    module = GEGLU(31, 17)
    x = torch.randn(3, 7, 31).to(device, dtype)
    _check(module, matmul.layers.GEGLU, x, dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_layer_and_grad(matmul, device, bias):
    torch.manual_seed(2)
    module = torch.nn.Linear(31, 17, bias=bias)
    x = torch.randn(4, 31).to(device).requires_grad_(True)
    actual, expected = _check(module, matmul.layers.Linear, x, torch.float32)
    dy = torch.randn_like(expected)
    g_exp = torch.autograd.grad(expected, [x, module.weight], dy)
    g_act = torch.autograd.grad(actual, [x, module.weight], dy)
    tol = 1e-5 if device == "cpu" else _tolerance(torch.float32, device) * 4  # tf32, larger sums over rows
    for g, e in zip(g_act, g_exp):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol * e.abs().max().item())


def test_layer_rules(matmul):
    for cls in (matmul.layers.GELU, matmul.layers.GEGLU, matmul.layers.Linear):
        assert "__init__" not in vars(cls)
        assert cls.has_backward and cls.can_torch_compile
    import inspect
    assert list(inspect.signature(matmul.layers.GELU.forward).parameters) == list(inspect.signature(GELU.forward).parameters)
    assert list(inspect.signature(matmul.layers.GEGLU.forward).parameters) == list(inspect.signature(GEGLU.forward).parameters)
    assert list(inspect.signature(matmul.layers.Linear.forward).parameters) == list(inspect.signature(torch.nn.Linear.forward).parameters)


def test_linear_layer_float64_module_keeps_its_bias(matmul, device):
    torch.manual_seed(55)
    module = torch.nn.Linear(8, 5).to(device).double()
    x = torch.randn(3, 8, device=device, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(matmul.layers.Linear.forward(module, x), module(x), rtol=0, atol=0)


def test_linear_layer_errors_name_input_and_weight(matmul, device):
    """A bad input to the Linear layer is refused in the layer's own terms: the input's and the weight's shapes and
    dtypes, not only matmul's operands a and b."""
    module = torch.nn.Linear(8, 4).to(device)
    layer = type("Swapped", (matmul.layers.Linear,), {})
    module.__class__ = layer
    with pytest.raises(TypeError, match=r"Swapped layer: input \(2, 8\) torch.bfloat16, weight \(4, 8\) "
                                        r"torch.float32 \(out_features, in_features\): .*same dtype"):
        module(torch.randn(2, 8, device=device, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"layer: input \(2, 7\) torch.float32, weight \(4, 8\)"):
        module(torch.randn(2, 7, device=device))


def test_gelu_geglu_layers_run_adapters_hooks_and_float64_as_the_module(matmul, device):
    """A ``proj`` with a forward hook or replaced by a Linear subclass with its own forward (a LoRA layer) was read
    as weight and bias only (0.95 / 6.49 off with a doubling hook), and a float64 module raised: those calls run
    the module's own ops now; a plain proj still runs the fused launch."""
    diffusers_act = pytest.importorskip("diffusers.models.activations")

    class Halved(torch.nn.Linear):
        def forward(self, x):
            return 0.5 * super().forward(x)

    torch.manual_seed(18)
    x = torch.randn(3, 8, device=device)
    for cls, layer in ((diffusers_act.GELU, matmul.layers.GELU), (diffusers_act.GEGLU, matmul.layers.GEGLU)):
        hooked = cls(8, 6).to(device)
        hooked.proj.register_forward_hook(lambda mod, args, out: 2 * out)
        adapted = cls(8, 6).to(device)
        halved = Halved(8, adapted.proj.out_features).to(device)
        halved.load_state_dict(adapted.proj.state_dict())
        adapted.proj = halved
        wide = cls(8, 6).to(device).double()
        for module, inp in ((hooked, x), (adapted, x), (wide, x.double())):
            with torch.no_grad():
                want, got = module(inp), layer.forward(module, inp)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["Tanh", "erf", None])
def test_gelu_layer_with_an_unknown_approximate_raises_as_the_module(matmul, device, approximate):
    """diffusers ``GELU`` with an ``approximate`` that ``F.gelu`` does not know ("Tanh", a typo) raises; the layer
    computed the erf GELU for it instead, a silent answer the module never gives."""
    torch.manual_seed(56)
    module = GELU(8, 5).to(device)
    module.approximate = approximate
    x = torch.randn(3, 8, device=device)
    with pytest.raises((RuntimeError, TypeError)) as want:
        module(x)
    with pytest.raises(type(want.value), match="approximate"):
        matmul.layers.GELU.forward(module, x)
