"""triton-norms ``norm_modulate``: ``norm(x) * (1 + scale) + shift`` against fp64 torch and the eager chain."""

import pytest
import torch
import torch.nn.functional as F

DEVICE_DTYPES = [torch.float32, torch.bfloat16]


def _ref(x, scale, shift, weight, bias, eps, rms):
    """fp64 reference of the adaLN chain; scale/shift broadcast per sample ([N], [B, N] or [B, 1, N])."""
    xd = x.double()
    mean = 0.0 if rms else xd.mean(-1, keepdim=True)
    xn = (xd - mean) / torch.sqrt(((xd - mean) ** 2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        xn = xn * weight.double()
    if bias is not None:
        xn = xn + bias.double()

    def per_sample(t):
        t = t.double()
        return t[:, None] if t.dim() == 2 else t

    return xn * (1 + per_sample(scale)) + per_sample(shift)


def _rand(*shape, device, dtype, gen, requires_grad=False):
    return torch.randn(*shape, generator=gen, device="cpu").to(device=device, dtype=dtype).requires_grad_(requires_grad)


@pytest.mark.parametrize("dtype", DEVICE_DTYPES)
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("shape_kind", ["BN", "B1N", "N"])
def test_forward_matches_fp64(norms, device, dtype, norm, affine, shape_kind):
    gen = torch.Generator().manual_seed(hash((str(dtype), norm, affine, shape_kind)) % 2**31)
    B, S, N = 3, 5, 37  # prime row width, not a power of two
    x = _rand(B, S, N, device=device, dtype=dtype, gen=gen) * 3 + 1.5
    vec_shape = {"BN": (B, N), "B1N": (B, 1, N), "N": (N,)}[shape_kind]
    scale = _rand(*vec_shape, device=device, dtype=dtype, gen=gen)
    shift = _rand(*vec_shape, device=device, dtype=dtype, gen=gen)
    w = _rand(N, device=device, dtype=dtype, gen=gen) if affine else None
    b = _rand(N, device=device, dtype=dtype, gen=gen) if affine else None
    y = norms.norm_modulate(x, scale, shift, w, b, 1e-5, norm=norm)
    ref = _ref(x, scale, shift, w, b, 1e-5, norm == "rms")
    assert y.shape == (B, S, N) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double().cpu(), ref.cpu(), rtol=tol, atol=tol * 4)


def test_strided_inputs_read_in_place(norms, device):
    """x with a row stride != N (a slice of a wider tensor) and scale/shift as views of one emb (as chunk gives)."""
    gen = torch.Generator().manual_seed(1)
    B, S, N = 2, 11, 48
    big = _rand(B, 2 * S, N + 16, device=device, dtype=torch.float32, gen=gen)
    x = big[:, ::2, :N]
    emb = _rand(B, 6 * N, device=device, dtype=torch.float32, gen=gen)
    shift, scale = emb[:, :N], emb[:, N:2 * N]
    y = norms.norm_modulate(x, scale, shift, eps=1e-6)
    torch.testing.assert_close(y.double().cpu(), _ref(x, scale, shift, None, None, 1e-6, False).cpu(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_strided_weight_bias_and_column_strided_scale(norms, device, norm):
    """weight / bias as strided views (every other element of a wider parameter, as a slice of a fused one gives)
    and scale / shift read along a column stride (a transposed [N, B] buffer): values and gradients equal the
    fp64 chain. The kernels read weight and bias at unit stride, and a strided one gave wrong values (13.4 off)."""
    gen = torch.Generator().manual_seed(7 + (norm == "rms"))
    B, S, N = 2, 3, 19
    mk = lambda *s: _rand(*s, device=device, dtype=torch.float32, gen=gen, requires_grad=True)  # noqa: E731
    x, wide_w, wide_b, st = mk(B, S, N), mk(2 * N), mk(3 * N), mk(N, B)
    w, b, scale = wide_w[::2], wide_b[1::3], st.t()  # strides 2, 3 and (1, B)
    shift = mk(B, N)
    assert w.stride() == (2,) and b.stride() == (3,) and scale.stride() == (1, B)
    y = norms.norm_modulate(x, scale, shift, w, b, 1e-6, norm=norm)
    ref = _ref(x, scale, shift, w, b, 1e-6, norm == "rms")
    torch.testing.assert_close(y.double().cpu(), ref.detach().cpu(), rtol=1e-5, atol=1e-5)
    g = torch.randn(y.shape, generator=gen).to(device)
    leaves = (x, wide_w, wide_b, st, shift)
    got = torch.autograd.grad(y, leaves, g)
    want = torch.autograd.grad(ref, leaves, g.double())
    for name, a, r in zip(["dx", "dweight", "dbias", "dscale", "dshift"], got, want):
        torch.testing.assert_close(a.double().cpu(), r.double().cpu(), rtol=1e-4, atol=1e-4, msg=name)


def test_eager_rounding_matches_the_bf16_module_chain(norms, device):
    """``eager_rounding=True`` is close to ``LayerNorm(x) * (1 + scale[:, None]) + shift[:, None]`` in bf16: most
    elements equal (> 97% here on the interpreter; 74-75% on an H200, where torch's CUDA LayerNorm rounds its
    fp32 steps differently), the rest within 2 ulps."""
    gen = torch.Generator().manual_seed(2)
    B, S, N = 2, 9, 64
    x = _rand(B, S, N, device=device, dtype=torch.bfloat16, gen=gen)
    scale = _rand(B, N, device=device, dtype=torch.bfloat16, gen=gen) * 0.3
    shift = _rand(B, N, device=device, dtype=torch.bfloat16, gen=gen)
    eager = F.layer_norm(x, (N,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
    y = norms.norm_modulate(x, scale, shift, eps=1e-6, eager_rounding=True)
    y_one = norms.norm_modulate(x, scale, shift, eps=1e-6)
    same = (y == eager).float().mean().item()
    # the norm's fp32 arithmetic may move a value by one ulp before rounding (more often against CUDA's kernel)
    assert same > (0.7 if device == "cuda" else 0.97), same
    ulp = torch.finfo(torch.bfloat16).eps * eager.float().abs().clamp_min(1.0)
    assert ((y.float() - eager.float()).abs() <= 2 * ulp).all()
    # and the one-rounding default differs from the chain (it rounds once): the flag changes something
    assert (y_one != eager).any()


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("affine", [False, True])
def test_backward_matches_fp64(norms, device, norm, affine):
    gen = torch.Generator().manual_seed(3 + affine + 2 * (norm == "rms"))
    B, S, N = 2, 13, 29
    mk = lambda *s: _rand(*s, device=device, dtype=torch.float32, gen=gen, requires_grad=True)  # noqa: E731
    x, scale, shift = mk(B, S, N), mk(B, 1, N), mk(B, N)
    w, b = (mk(N), mk(N)) if affine else (None, None)
    y = norms.norm_modulate(x, scale, shift, w, b, 1e-6, norm=norm)
    ins = [t for t in (x, scale, shift, w, b) if t is not None]
    g = torch.randn(y.shape, generator=gen).to(device)
    got = torch.autograd.grad(y, ins, g)
    ins64 = [t.detach().double().requires_grad_() for t in ins]
    args = ins64 + [None, None] if not affine else ins64
    ref = _ref(*args, 1e-6, norm == "rms")
    want = torch.autograd.grad(ref, ins64, g.double())
    for name, a, r in zip(["dx", "dscale", "dshift", "dweight", "dbias"], got, want):
        assert a.shape == r.shape, name
        torch.testing.assert_close(a.double().cpu(), r.cpu(), rtol=1e-4, atol=1e-4, msg=name)


def test_per_column_scale_shared_by_samples(norms, device):
    """scale of shape [N] (one for all samples): its gradient sums over samples and rows."""
    gen = torch.Generator().manual_seed(4)
    x = _rand(3, 4, 20, device=device, dtype=torch.float32, gen=gen, requires_grad=True)
    scale = _rand(20, device=device, dtype=torch.float32, gen=gen, requires_grad=True)
    shift = _rand(1, 20, device=device, dtype=torch.float32, gen=gen, requires_grad=True)
    y = norms.norm_modulate(x, scale, shift)
    dsc, dsh = torch.autograd.grad(y.square().sum(), (scale, shift))
    x64, s64, h64 = (t.detach().double().requires_grad_() for t in (x, scale, shift))
    r = _ref(x64, s64, h64, None, None, 1e-6, False)
    rsc, rsh = torch.autograd.grad(r.square().sum(), (s64, h64))
    assert dsc.shape == (20,) and dsh.shape == (1, 20)
    torch.testing.assert_close(dsc.double().cpu(), rsc.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dsh.double().cpu(), rsh.cpu(), rtol=1e-4, atol=1e-4)


def test_bad_inputs_name_the_argument(norms, device):
    x = torch.randn(2, 3, 8, device=device)
    s = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="x must be 3-D"):
        norms.norm_modulate(x[0], s, s)
    with pytest.raises(ValueError, match="scale must have shape"):
        norms.norm_modulate(x, torch.randn(2, 3, 8, device=device), s)
    with pytest.raises(ValueError, match="shift must have shape"):
        norms.norm_modulate(x, s, torch.randn(3, 8, device=device))
    with pytest.raises(ValueError, match="weight must have shape"):
        norms.norm_modulate(x, s, s, torch.randn(7, device=device))
    with pytest.raises(ValueError, match="norm must be"):
        norms.norm_modulate(x, s, s, norm="group")
    with pytest.raises(TypeError, match="x must have dtype"):
        norms.norm_modulate(x.to(torch.int32), s, s)
    with pytest.raises(ValueError, match="at most 32768"):
        norms.norm_modulate(torch.empty(1, 1, 32769, device=device), torch.empty(32769, device=device),
                            torch.empty(32769, device=device))


def test_empty_sequence(norms, device):
    x = torch.randn(2, 0, 8, device=device)
    s = torch.randn(2, 8, device=device)
    assert norms.norm_modulate(x, s, s).shape == (2, 0, 8)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_large_eps_inside_the_square_root(norms, device, norm):
    """eps is added to the variance (mean square) under the square root, as nn.LayerNorm / nn.RMSNorm: with a large
    eps and rows of small spread it dominates rstd, so forward and gradients show where it went."""
    gen = torch.Generator().manual_seed(8 + (norm == "rms"))
    B, S, N = 2, 5, 23
    mk = lambda *s: _rand(*s, device=device, dtype=torch.float32, gen=gen, requires_grad=True)  # noqa: E731
    x = (_rand(B, S, N, device=device, dtype=torch.float32, gen=gen) * 0.3 + 0.2).requires_grad_(True)
    scale, shift, w, b = mk(B, N), mk(B, 1, N), mk(N), mk(N)
    for eps in (0.5, 3.0):
        y = norms.norm_modulate(x, scale, shift, w, b, eps, norm=norm)
        ins64 = [t.detach().double().requires_grad_() for t in (x, scale, shift, w, b)]
        ref = _ref(*ins64, eps, norm == "rms")
        torch.testing.assert_close(y.double().cpu(), ref.detach().cpu(), rtol=1e-5, atol=1e-5)
        g = torch.randn(y.shape, generator=gen).to(device)
        got = torch.autograd.grad(y, (x, scale, shift, w, b), g)
        want = torch.autograd.grad(ref, ins64, g.double())
        for name, a, r in zip(["dx", "dscale", "dshift", "dweight", "dbias"], got, want):
            torch.testing.assert_close(a.double().cpu(), r.cpu(), rtol=1e-4, atol=1e-4, msg=name)
