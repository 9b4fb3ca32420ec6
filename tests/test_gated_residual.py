"""triton-norms ``gated_residual``: ``x + y * gate`` against the eager expression (bitwise) and fp64 gradients."""

import pytest
import torch


def _rand(*shape, device, dtype, gen):
    return torch.randn(*shape, generator=gen, device="cpu").to(device=device, dtype=dtype)


def _gate3(g):
    return g if g.dim() == 3 else (g[:, None, :] if g.dim() == 2 else g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate_shape", ["N", "BN", "B1N", "1N"])
def test_forward_equals_the_eager_expression(norms, device, dtype, gate_shape):
    gen = torch.Generator().manual_seed(hash((str(dtype), gate_shape)) % 2**31)
    B, S, N = 3, 7, 37
    x = _rand(B, S, N, device=device, dtype=dtype, gen=gen)
    y = _rand(B, S, N, device=device, dtype=dtype, gen=gen)
    shape = {"N": (N,), "BN": (B, N), "B1N": (B, 1, N), "1N": (1, N)}[gate_shape]
    gate = _rand(*shape, device=device, dtype=torch.float32, gen=gen)
    out = norms.gated_residual(x, y, gate)
    want = (x.float() + y.float() * _gate3(gate).float()).to(dtype)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    assert torch.equal(out, want)
    # Wan's own expression (fp32 gate: the product promotes to fp32) is the same bits
    assert torch.equal(out, (x.float() + y * _gate3(gate)).type_as(x))
    f32 = norms.gated_residual(x, y, gate, out_dtype=torch.float32)
    assert f32.dtype == torch.float32 and torch.equal(f32, x.float() + y.float() * _gate3(gate).float())


def test_strided_inputs(norms, device):
    """Row-strided views are read in place; a column-strided y is copied once; values unchanged."""
    gen = torch.Generator().manual_seed(3)
    base = _rand(2, 5, 80, device=device, dtype=torch.float32, gen=gen)
    x = base[:, :, 3:40]  # rows 80 apart
    yt = _rand(2, 37, 5, device=device, dtype=torch.float32, gen=gen).transpose(1, 2)  # column stride 5
    gate = _rand(2, 3 * 37, device=device, dtype=torch.float32, gen=gen)[:, 37:74]  # a chunk of an embedding
    out = norms.gated_residual(x, yt, gate)
    assert torch.equal(out, x + yt * gate[:, None, :])


@pytest.mark.parametrize("gate_shape", ["N", "B1N", "BN", "1N"])  # a 2-D gate is per sample: gate[:, None, :]
def test_backward_matches_fp64(norms, device, gate_shape):
    gen = torch.Generator().manual_seed(5)
    B, S, N = 2, 6, 37
    x = _rand(B, S, N, device=device, dtype=torch.float32, gen=gen).requires_grad_(True)
    y = _rand(B, S, N, device=device, dtype=torch.float32, gen=gen).requires_grad_(True)
    shape = {"N": (N,), "B1N": (B, 1, N), "BN": (B, N), "1N": (1, N)}[gate_shape]
    gate = _rand(*shape, device=device, dtype=torch.float32, gen=gen).requires_grad_(True)
    out = norms.gated_residual(x, y, gate)
    dout = _rand(B, S, N, device=device, dtype=torch.float32, gen=gen)
    grads = torch.autograd.grad(out, (x, y, gate), dout)
    x64, y64, g64 = (t.detach().double().requires_grad_(True) for t in (x, y, gate))
    g3 = g64[:, None, :] if g64.dim() == 2 else g64
    want = torch.autograd.grad(x64 + y64 * g3, (x64, y64, g64), dout.double())
    for name, got, ref in zip(("dx", "dy", "dgate"), grads, want):
        assert got.shape == ref.shape, name
        assert (got.double() - ref).abs().max().item() <= 1e-5 * max(ref.abs().max().item(), 1.0), name


def test_empty_rows(norms, device):
    x = torch.empty(2, 0, 37, device=device)
    out = norms.gated_residual(x, x.clone(), torch.ones(37, device=device))
    assert out.shape == (2, 0, 37)
