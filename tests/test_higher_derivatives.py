"""Derivatives above the second through the ops whose backward op has an fp32 autograd formula
(``_dispatch.fp32_vjp``): the third derivative of a loss nonlinear in the output, in eager autograd
(``create_graph=True`` twice) and under ``torch.func`` (grad of grad of a vjp), against fp64 autograd through plain
PyTorch references. (PyTorch's own ``F.layer_norm`` has a wrong third derivative: the reference is written out.)
"""

import pytest
import torch
import torch.nn.functional as F


def _ln_ref(x, w=None, eps=1e-5):
    c = x - x.mean(-1, keepdim=True)
    y = c * torch.rsqrt(c.square().mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def _rms_ref(x, w, eps=1e-6):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


# id: (package fixture, f(pkg, x, w) on fp32 tensors, reference on fp64 tensors; x is (3, 8), w is (8,))
_CASES = {
    "rms_norm": ("norms", lambda m, x, w: m.rms_norm(x, w), _rms_ref),
    "layer_norm": ("norms", lambda m, x, w: m.layer_norm(x, w), _ln_ref),
    "add_layer_norm": ("norms", lambda m, x, w: m.add_layer_norm(x, x.flip(0), w)[0],
                       lambda x, w: _ln_ref(x + x.flip(0), w)),
    "norm_modulate": ("norms", lambda m, x, w: m.norm_modulate(x[None], w, w.flip(0))[0],
                      lambda x, w: _ln_ref(x, eps=1e-6) * (1 + w) + w.flip(0)),
    "gelu_and_mul": ("activations", lambda m, x, w: m.gelu_and_mul(x),
                     lambda x, w: F.gelu(x[..., :4]) * x[..., 4:]),
    "silu": ("activations", lambda m, x, w: m.silu(x), lambda x, w: F.silu(x)),
    "act_and_mul": ("activations", lambda m, x, w: m.act_and_mul(x, x.flip(0) * w, activation="gelu_tanh"),
                    lambda x, w: F.gelu(x, approximate="tanh") * (x.flip(0) * w)),
    "softmax": ("softmax", lambda m, x, w: m.softmax(x, scale=0.7), lambda x, w: torch.softmax(0.7 * x, -1)),
    "log_softmax": ("softmax", lambda m, x, w: m.log_softmax(x), lambda x, w: torch.log_softmax(x, -1)),
    "matmul_gelu": ("matmul", lambda m, x, w: m.matmul(x, torch.outer(w, w.flip(0)) * 0.3, None, "gelu"),
                    lambda x, w: F.gelu(x @ (torch.outer(w, w.flip(0)) * 0.3))),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_third_derivatives(request, device, case):
    """Before the fix, fp32_vjp differentiated detached copies: its result kept a graph to the upstream gradient
    only, so a third derivative ran without an error and dropped every term through x (off by 2-40%)."""
    fixture, ours, ref = _CASES[case]
    pkg = request.getfixturevalue(fixture)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 8, generator=gen) + 0.3).to(device)
    w = torch.randn(8, generator=gen).to(device)
    v1, v2 = (torch.randn(3, 8, generator=gen).to(device) for _ in range(2))

    def loss(f, x, w):
        return (f(x, w) ** 3).sum()

    def third_order(f, x, w, v1, v2):
        x = x.detach().clone().requires_grad_()
        (g1,) = torch.autograd.grad(loss(f, x, w), x, create_graph=True)
        (g2,) = torch.autograd.grad((g1 * v1).sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad((g2 * v2).sum(), x)
        return g3

    def third_order_functorch(f, x, w, v1, v2):
        def second(x):
            return (torch.func.grad(lambda x: (torch.func.grad(lambda x: loss(f, x, w))(x) * v1).sum())(x) * v2).sum()
        return torch.func.grad(second)(x)

    f = lambda x, w: ours(pkg, x, w)  # noqa: E731
    want = third_order(ref, x.double(), w.double(), v1.double(), v2.double())
    for got in (third_order(f, x, w, v1, v2), third_order_functorch(f, x, w, v1, v2)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5 * want.abs().max().item())
