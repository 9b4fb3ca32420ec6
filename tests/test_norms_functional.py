"""triton-norms functional API: values and gradients against fp64 PyTorch, ops, edge cases.

The package is loaded by Hub name through the ``norms`` fixture (conftest), as users
load it. On CPU the kernels run under the Triton interpreter (conftest sets
TRITON_INTERPRET=1 before triton is imported).

Tolerances (one table, ``ULPS``): the kernel computes in fp32 and rounds once to
the output dtype, so a half-precision result may differ from the fp64 reference
rounded to the same dtype by one rounding step (1 ulp). fp32 results differ from
fp64 by fp32 accumulation (sum of N squares, rsqrt): a few ulps of the value,
bounded by 16. Gradients may cancel (dx = rstd * (g - xn * dot)), so they also
get an absolute slack of ``GRAD_REL`` times the largest reference value.
"""

import contextlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
MIN_EXP = {torch.float32: -126, torch.float16: -14, torch.bfloat16: -126}
ULPS = {torch.float32: 16, torch.float16: 1, torch.bfloat16: 1}
GRAD_REL = 1e-5
# N regimes: 1 and 3 (tiny), 127 (odd, < one warp of vectors), 4095/4097/5121 (around
# 4K, single block), 32771 (prime above one block for every dtype: the looped path).
SIZES = [1, 3, 127, 4095, 4097, 5121, 32771]


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of each value of ``t`` in ``dtype`` (fp64 result)."""
    _, e = torch.frexp(t.double())
    e = torch.clamp(e - 1, min=MIN_EXP[dtype])
    return torch.pow(2.0, (e - MANTISSA[dtype]).double())


def assert_close_ref(actual, ref64, *, rel_atol=1e-6, ulps=None, scale=0.0):
    """``actual`` (any float dtype) within ulps + rel_atol * max(max|ref|, scale) of the fp64 reference."""
    dtype = actual.dtype
    ulps = ULPS[dtype] if ulps is None else ulps
    expected = ref64.to(dtype).double()
    tol = ulps * ulp(expected, dtype) + rel_atol * ref64.abs().max().clamp(min=max(float(scale), 1e-30))
    diff = (actual.double() - expected).abs()
    bad = ~(diff <= tol)
    assert not bad.any(), (
        f"{int(bad.sum())} of {actual.numel()} off; worst diff {diff.max().item():.3g} "
        f"(actual {actual.double().flatten()[diff.argmax()].item()}, expected {expected.flatten()[diff.argmax()].item()})"
    )


def rms_ref(x, w=None, b=None, eps=1e-6, offset=0.0):
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * (w.double() + offset)
    if b is not None:
        y = y + b.double()
    return y


def ln_ref(x, w=None, b=None, eps=1e-5):
    x = x.double()
    return F.layer_norm(x, (x.shape[-1],), None if w is None else w.double(), None if b is None else b.double(), eps)


def rand(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- forward values


@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_case9_rms_norm_odd_sizes(norms, device, N, dtype):
    x = rand((2, N), dtype, device)
    w = rand(N, dtype, device)
    assert_close_ref(norms.rms_norm(x, w, eps=1e-6), rms_ref(x, w))
    assert_close_ref(norms.rms_norm(x), rms_ref(x))


@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_case9_layer_norm_odd_sizes(norms, device, N, dtype):
    x = rand((2, N), dtype, device, scale=2.0) + 0.5  # a nonzero mean
    w, b = rand(N, dtype, device), rand(N, dtype, device)
    assert_close_ref(norms.layer_norm(x, w, b), ln_ref(x, w, b), rel_atol=2e-6)
    assert_close_ref(norms.layer_norm(x), ln_ref(x), rel_atol=2e-6)


@pytest.mark.parametrize("N", [127, 5121, 32771])
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_norms_round_the_sum_then_normalise(norms, device, N, dtype):
    x, r = rand((3, N), dtype, device), rand((3, N), dtype, device)
    w, b = rand(N, dtype, device), rand(N, dtype, device)
    h_exp = (x.float() + r.float()).to(dtype)  # HF: residual + hidden_states in the model dtype
    out, h = norms.add_rms_norm(x, r, w, eps=1e-6)
    assert torch.equal(h, h_exp)
    assert_close_ref(out, rms_ref(h_exp, w))
    out, h = norms.add_layer_norm(x, r, w, b)
    assert torch.equal(h, h_exp)
    assert_close_ref(out, ln_ref(h_exp, w, b), rel_atol=2e-6)


def test_add_norm_mixed_dtypes(norms, device):
    # x in fp32, residual stream in bf16: h, out in the residual's dtype
    x, r = rand((4, 64), torch.float32, device), rand((4, 64), torch.bfloat16, device)
    out, h = norms.add_rms_norm(x, r)
    assert h.dtype == out.dtype == torch.bfloat16
    assert torch.equal(h, (x + r.float()).to(torch.bfloat16))
    assert_close_ref(out, rms_ref(h))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_rounding_options_match_eager(norms, device, dtype):
    """cast_dtype / weight_offset / out_dtype / bias reproduce eager compositions exactly."""
    x, w, b = rand((5, 96), dtype, device), rand(96, dtype, device), rand(96, dtype, device)
    xf = x.float()
    xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    cases = [
        (dict(cast_dtype=dtype), w * xn.to(dtype)),  # Llama
        (dict(), (w.float() * xn).to(dtype)),  # Olmo2
        (dict(weight_offset=1.0), (xn * (1.0 + w.float())).to(dtype)),  # Gemma
        (dict(out_dtype=torch.float32), w.float() * xn),
    ]
    for kwargs, expected in cases:
        y = norms.rms_norm(x, w, eps=1e-6, **kwargs)
        assert y.dtype == expected.dtype
        _assert_mostly_exact(y, expected)
    y = norms.rms_norm(x, w, b, eps=1e-6, cast_dtype=dtype)  # diffusers: round the product, then add bias
    _assert_mostly_exact(y, xn.to(dtype) * w + b)


def _assert_mostly_exact(actual, expected):
    """Bit-exact but for torch's differently ordered fp32 sum of squares.

    That order flips rstd by an fp32 ulp on some rows (about 20% of rows on an H200,
    few on CPU); a flip moves a half-precision output by at most 2 ulps (1 ulp in xn
    rounded before a weight multiply, then the product's rounding), on a small fraction
    of elements. fp32 outputs keep the flip: a few ulps on those rows.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.float32:
        assert_close_ref(actual, expected.double(), rel_atol=0.0)
        return
    diff = actual != expected
    assert diff.float().mean().item() < 0.02, f"{int(diff.sum())} of {diff.numel()} elements differ"
    big = torch.maximum(actual.double().abs(), expected.double().abs())
    assert ((actual.double() - expected.double()).abs() <= 2 * ulp(big, actual.dtype)).all()


# ----------------------------------------------------------------------------- gradients


def _grads(fn, tensors, g):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    gs = g if isinstance(g, tuple) else (g,)
    torch.autograd.backward([o for o in outs], [gg.to(o.dtype) for o, gg in zip(outs, gs)])
    return outs, [t.grad if t is not None else None for t in leaves]


def _check_grads(ours, ref, dx_scale=0.0):
    """Gradients may cancel to far below their terms (N=1: dx = rstd*g*(1 - xn**2) ~ eps, and
    LayerNorm's xhat = 0): ``dx_scale``, the size of those terms (max|dy * w| * max(rstd)),
    is a floor for the absolute slack."""
    for i, (a, r) in enumerate(zip(ours, ref)):
        if r is None:
            assert a is None
            continue
        assert a.dtype != torch.float64
        assert_close_ref(a, r, rel_atol=GRAD_REL, scale=dx_scale)


def _dx_scale(x, w, g, centre):
    x = x.double()
    if centre:
        x = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6).max()
    return (g.double().abs().max() * w.double().abs().max() * rstd).item()


@pytest.mark.parametrize("N", [1, 127, 4097, 32771])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_backward(norms, device, N, dtype):
    x, w, b = rand((3, 2, N), dtype, device), rand(N, dtype, device), rand(N, dtype, device)
    g = rand((3, 2, N), dtype, device)  # the upstream gradient arrives in the output dtype
    _, ours = _grads(lambda x, w, b: norms.rms_norm(x, w, b, eps=1e-6), (x, w, b), g)
    _, ref = _grads(lambda x, w, b: rms_ref(x, w, b), (x.double(), w.double(), b.double()), g.double())
    _check_grads(ours, ref, _dx_scale(x, w, g, centre=False))


@pytest.mark.parametrize("N", [1, 127, 4097, 32771])
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward(norms, device, N, dtype):
    x, w, b = rand((3, 2, N), dtype, device) + 1, rand(N, dtype, device), rand(N, dtype, device)
    g = rand((3, 2, N), dtype, device)  # the upstream gradient arrives in the output dtype
    _, ours = _grads(lambda x, w, b: norms.layer_norm(x, w, b), (x, w, b), g)
    _, ref = _grads(lambda x, w, b: ln_ref(x, w, b), (x.double(), w.double(), b.double()), g.double())
    _check_grads(ours, ref, _dx_scale(x, w, g, centre=True))


@pytest.mark.parametrize("which", ["rms", "ln"])
def test_add_norm_with_a_padded_x_and_a_contiguous_residual(norms, device, which):
    """x's rows 64 elements apart in a wider buffer, the residual contiguous: each read at its own row stride."""
    N = 1000
    x = rand((4, N + 64), torch.float32, device)[:, :N]
    r, w = rand((4, N), torch.float32, device), rand(N, torch.float32, device)
    y, h = (norms.add_rms_norm if which == "rms" else norms.add_layer_norm)(x, r, w)
    h_ref = x.double() + r.double()
    y_ref = rms_ref(h_ref, w.double()) if which == "rms" else ln_ref(h_ref, w.double())
    assert_close_ref(h, h_ref)
    assert_close_ref(y, y_ref, rel_atol=1e-5)


@pytest.mark.parametrize("which", ["rms", "ln"])
@pytest.mark.parametrize("N", [4097, 32771])  # one block; looped
def test_backward_with_a_column_strided_upstream_gradient(norms, device, which, N):
    """dy transposed in memory (column stride M): the backward kernels read it at its strides, also looped."""
    x, w, b = rand((3, N), torch.float32, device) + 1, rand(N, torch.float32, device), rand(N, torch.float32, device)
    g = rand((N, 3), torch.float32, device).t()
    assert g.stride() == (1, 3)
    ours_fn = (lambda x, w, b: norms.rms_norm(x, w, b, eps=1e-6)) if which == "rms" else norms.layer_norm
    ref_fn = (lambda x, w, b: rms_ref(x, w, b)) if which == "rms" else ln_ref
    _, ours = _grads(ours_fn, (x, w, b), g)
    _, ref = _grads(ref_fn, (x.double(), w.double(), b.double()), g.double())
    _check_grads(ours, ref, _dx_scale(x, w, g, centre=which == "ln"))


@pytest.mark.parametrize("which", ["rms", "ln"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_norm_backward_reaches_x_and_residual(norms, device, which, dtype):
    N = 4097
    x, r, w = rand((2, N), dtype, device), rand((2, N), dtype, device), rand(N, dtype, device)
    g_out, g_h = rand((2, N), dtype, device), rand((2, N), dtype, device)
    ours_fn = (lambda x, r, w: norms.add_rms_norm(x, r, w)) if which == "rms" else (lambda x, r, w: norms.add_layer_norm(x, r, w))
    norm = (lambda h, w: rms_ref(h, w)) if which == "rms" else (lambda h, w: ln_ref(h, w))

    def ref_fn(x, r, w):
        h = x + r
        h = h + (h.to(dtype).double() - h).detach()  # rounded to the residual dtype, gradient straight through
        return norm(h, w), h

    _, ours = _grads(ours_fn, (x, r, w), (g_out, g_h))
    _, ref = _grads(ref_fn, (x.double(), r.double(), w.double()), (g_out.double(), g_h.double()))
    _check_grads(ours, ref)
    assert ours[0].data_ptr() != ours[1].data_ptr()  # two buffers: accumulating into one must not touch the other


@pytest.mark.parametrize("which", ["rms", "ln"])
def test_weight_gradients_are_deterministic(norms, device, which):
    x = rand((37, 300), torch.float32, device)
    w = rand(300, torch.float32, device)
    fn = (lambda x, w: norms.rms_norm(x, w)) if which == "rms" else (lambda x, w: norms.layer_norm(x, w))
    g = rand((37, 300), torch.float32, device)
    first = _grads(fn, (x, w), g)[1]
    second = _grads(fn, (x, w), g)[1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("parts", ["dw and db", "dw", "db"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_gradient_partials_sum_in_one_launch(norms, device, parts, dtype):
    """The backwards' dw / db: column sums of (P, N) fp32 partials rounded once to the parameter's dtype. P = 131
    (several 64-row steps and a masked one), N = 67 (a masked column block), against fp64 sums."""
    column_sums = sys.modules[norms.__name__ + "._partials"].column_sums
    dw_part = rand((131, 67), torch.float32, device, scale=3.0) if "dw" in parts else None
    db_part = rand((131, 67), torch.float32, device) if "db" in parts else None
    dw, db = column_sums(dw_part, db_part, dtype if dw_part is not None else None,
                         torch.float32 if db_part is not None else None)
    for out, part, want in ((dw, dw_part, dtype), (db, db_part, torch.float32)):
        if part is None:
            assert out is None
            continue
        assert out.shape == (67,) and out.dtype == want
        ref = part.double().sum(0)
        # fp32 accumulation of 131 terms: within 1 ulp of the rounded sum plus the sum's relative error
        assert_close_ref(out, ref, ulps=1, rel_atol=1e-6 * 131)


def test_weight_gradient_column_block(norms, device):
    """The column sums' programs cover 32 columns each on a GPU and 1024 under the interpreter (P = 200, N = 1500:
    masked row steps and column blocks). Every tile sums within fp32 accuracy; under the interpreter every tile
    gives the bits of 32 (one summation order per column), on a GPU the default stays 32 (the tile sets the tree
    reduction's order there: other bits at 128 on an H100)."""
    partials = sys.modules[norms.__name__ + "._partials"]
    dw_part = rand((200, 1500), torch.float32, device, scale=3.0)
    db_part = rand((200, 1500), torch.float32, device)
    sums = {}
    for block_n in (32, 128, 1024):
        dw = torch.full((1500,), float("nan"), dtype=torch.bfloat16, device=device)
        db = torch.full((1500,), float("nan"), dtype=torch.float32, device=device)
        partials.column_sums_plan(200, 1500, 2, dw_part.device, block_n)((dw_part, db_part, dw, db))
        sums[block_n] = (dw, db)
    for block_n, (dw, db) in sums.items():
        assert_close_ref(dw, dw_part.double().sum(0), ulps=1, rel_atol=3e-6 * 200)
        assert_close_ref(db, db_part.double().sum(0), ulps=1, rel_atol=1e-6 * 200)
        if device == "cpu":
            assert torch.equal(dw, sums[32][0]) and torch.equal(db, sums[32][1]), block_n
    default = partials.column_sums(dw_part, db_part, torch.bfloat16, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(default, sums[32]))
    assert partials.column_sums_plan(200, 1500, 2, dw_part.device).grid[0] == (2 if device == "cpu" else 47)


def test_case12_layer_norm_backward_3d(norms, device):
    """(2, 8, 64) normalised over the last dim only (not 2 rows of 512)."""
    x, w, b = rand((2, 8, 64), torch.float32, device), rand(64, torch.float32, device), rand(64, torch.float32, device)
    g = rand((2, 8, 64), torch.float32, device)
    _, ours = _grads(lambda x, w, b: norms.layer_norm(x, w, b), (x, w, b), g)
    _, ref = _grads(lambda x, w, b: F.layer_norm(x, (64,), w, b), (x.double(), w.double(), b.double()), g.double())
    _check_grads(ours, ref)


@pytest.mark.parametrize("N", [65537, 262144])  # ~12 s in all under the interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_case1_wide_rows_forward_backward(norms, device, N, dtype):
    x, w, b = rand((2, N), dtype, device), rand(N, dtype, device), rand(N, dtype, device)
    g = rand((2, N), dtype, device)
    outs, ours = _grads(lambda x, w: norms.rms_norm(x, w), (x, w), g)
    assert_close_ref(outs[0], rms_ref(x, w))
    _, ref = _grads(lambda x, w: rms_ref(x, w), (x.double(), w.double()), g.double())
    _check_grads(ours, ref)
    outs, ours = _grads(lambda x, w, b: norms.layer_norm(x, w, b), (x, w, b), g)
    assert_close_ref(outs[0], ln_ref(x, w, b), rel_atol=2e-6)
    _, ref = _grads(lambda x, w, b: ln_ref(x, w, b), (x.double(), w.double(), b.double()), g.double())
    _check_grads(ours, ref)


def _modulate_ref(x, scale, shift, w=None, b=None, *, norm):
    mean = 0.0 if norm == "rms" else x.mean(-1, keepdim=True)
    xn = (x - mean) * torch.rsqrt((x - mean).square().mean(-1, keepdim=True) + 1e-6)
    xn = xn if w is None else xn * w
    xn = xn if b is None else xn + b
    return xn * (1 + scale.reshape(-1, 1, x.shape[-1])) + shift.reshape(-1, 1, x.shape[-1])


# id: (public function, fp64 reference, shapes of the inputs (x first; every one takes a gradient), keyword arguments)
_SECOND_ORDER = {
    "rms_norm": ("rms_norm", rms_ref, [(3, 7)], {}),
    "rms_norm_affine_offset": ("rms_norm", lambda x, w, b: rms_ref(x, w, b, offset=0.5), [(2, 3, 11), (11,), (11,)],
                               {"weight_offset": 0.5}),
    "rms_norm_mean_order": ("rms_norm", rms_ref, [(5, 13), (13,)], {"torch_order": "mean"}),
    "rms_norm_fused_order": ("rms_norm", rms_ref, [(5, 13), (13,), (13,)], {"torch_order": "fused"}),
    "layer_norm": ("layer_norm", ln_ref, [(3, 7)], {}),
    "layer_norm_affine": ("layer_norm", ln_ref, [(2, 3, 11), (11,), (11,)], {}),
    "layer_norm_fused_order": ("layer_norm", ln_ref, [(5, 13), (13,), (13,)], {"torch_order": "fused"}),
    "add_rms_norm": ("add_rms_norm", lambda x, r, w: (rms_ref(x + r, w), x + r), [(3, 11), (3, 11), (11,)], {}),
    "add_layer_norm": ("add_layer_norm", lambda x, r, w, b: (ln_ref(x + r, w, b), x + r),
                       [(3, 11), (3, 11), (11,), (11,)], {}),
    "norm_modulate_layer": ("norm_modulate", lambda *t: _modulate_ref(*t, norm="layer"),
                            [(2, 3, 11), (2, 1, 11), (2, 11), (11,), (11,)], {"norm": "layer"}),
    "norm_modulate_rms": ("norm_modulate", lambda *t: _modulate_ref(*t, norm="rms"), [(2, 3, 11), (11,), (1, 11)],
                          {"norm": "rms"}),
    "gated_residual": ("gated_residual", lambda x, y, gate: x + y * gate[:, None, :], [(2, 3, 11), (2, 3, 11), (2, 11)],
                       {}),
}


@pytest.mark.parametrize("case", list(_SECOND_ORDER))
def test_second_derivatives(norms, device, case):
    """create_graph=True (a gradient penalty): the second-order gradients of every input (x, residual, weight, bias,
    scale, ...) of sum(g * v) over the first-order gradients g of all inputs, through each backward op's own
    formula, against fp64 autograd through the reference; also through torch.func (grad of a vjp: the ops'
    functorch Functions). The contiguous rms_norm / layer_norm calls take the planned training path
    (``_train_plans``), the torch orders their own forward kernels, the add forms and norm_modulate ``call_op``'s."""
    name, ref, shapes, kw = _SECOND_ORDER[case]
    ins = [rand(shape, torch.float32, device) for shape in shapes]
    if name != "gated_residual":
        ins[0] = ins[0] * 2 + 0.5  # rows not centred: the mean's terms count
    ours = lambda *t: getattr(norms, name)(*t, **kw)  # noqa: E731
    out = ref(*[t.double() for t in ins])
    dy = tuple(rand(o.shape, torch.float32, device) for o in out) if isinstance(out, tuple) else \
        rand(out.shape, torch.float32, device)
    vs = [rand(t.shape, torch.float32, device) for t in ins]

    def penalty(grads, vs):
        return sum((g * v).sum() for g, v in zip(grads, vs))

    def second_order(f, ins, dy, vs):
        ins = [t.detach().clone().requires_grad_() for t in ins]
        grads = torch.autograd.grad(f(*ins), ins, dy, create_graph=True)
        return torch.autograd.grad(penalty(grads, vs), ins, allow_unused=True, materialize_grads=True)

    def second_order_functorch(f, ins, dy, vs):
        def of_inputs(*ins):
            _, vjp = torch.func.vjp(f, *ins)
            return penalty(vjp(dy), vs)
        return torch.func.grad(of_inputs, argnums=tuple(range(len(ins))))(*ins)

    as64 = lambda t: tuple(a.double() for a in t) if isinstance(t, tuple) else t.double()  # noqa: E731
    want = second_order(ref, [t.double() for t in ins], as64(dy), [v.double() for v in vs])
    for got in (second_order(ours, ins, dy, vs), second_order_functorch(ours, ins, dy, vs)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == torch.float32 and g.shape == w.shape
            assert_close_ref(g, w, ulps=64, rel_atol=1e-5)


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_planned_training_under_non_reentrant_checkpoint(norms, device, name):
    """The planned eager training path falls back to the op's backward for create_graph=True (a gradient penalty)
    and for an upstream gradient it would copy (a transposed one); that fallback unpacked ctx.saved_tensors a second
    time, which non-reentrant activation checkpointing refuses ("Unpack is being triggered for a tensor that was
    already unpacked once"). Values against fp64 autograd through the reference."""
    from torch.utils.checkpoint import checkpoint

    ref = rms_ref if name == "rms_norm" else lambda x, w: ln_ref(x, w, None)
    x, w = rand((4, 3, 16), torch.float32, device) * 2 + 0.5, rand(16, torch.float32, device)
    dy_t = rand((16, 3, 4), torch.float32, device).permute(2, 1, 0)  # rows that do not collapse to one stride

    def run(f, x, w):
        x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        (g,) = torch.autograd.grad((checkpoint(f, x, w, use_reentrant=False) ** 3).sum(), x, create_graph=True)
        second = torch.autograd.grad(g.square().sum(), (x, w))
        checkpoint(f, x, w, use_reentrant=False).backward(dy_t.to(x.dtype))
        return (*second, x.grad, w.grad)

    for g, r in zip(run(getattr(norms, name), x, w), run(ref, x.double(), w.double())):
        assert_close_ref(g, r, ulps=64, rel_atol=1e-5)


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("which", ["rms", "ln"])
def test_case3_gradient_buffers_used_twice(norms, device, which):
    """h = r + norm1(a); out = norm2(h); the loss uses out and h; backward twice with one dy."""
    norm = norms.rms_norm if which == "rms" else norms.layer_norm
    ref_norm = F.rms_norm if which == "rms" else F.layer_norm
    a, r = rand((4, 96), torch.float32, device), rand((4, 96), torch.float32, device)
    w1, w2 = rand(96, torch.float32, device), rand(96, torch.float32, device)
    dy = rand((4, 96), torch.float32, device)
    dy_copy = dy.clone()

    def run(fn, tensors):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        a, r, w1, w2 = leaves
        h = r + fn(a, w1)
        out = fn(h, w2)
        for _ in range(2):  # same upstream-gradient tensor twice: grads accumulate
            torch.autograd.backward([out, h], [dy.to(out.dtype), dy.to(h.dtype)], retain_graph=True)
        return [t.grad for t in leaves]

    ours = run(lambda x, w: norm(x, w), (a, r, w1, w2))
    ref = run(lambda x, w: ref_norm(x, (96,), w, eps=1e-6 if which == "rms" else 1e-5),
              (a.double(), r.double(), w1.double(), w2.double()))
    assert torch.equal(dy, dy_copy)  # the upstream gradient was not overwritten
    _check_grads(ours, ref)


@pytest.mark.parametrize("which", ["rms", "ln", "add_rms"])
def test_case8_expanded_and_transposed_upstream_gradient(norms, device, which):
    x, w = rand((24, 40), torch.float32, device), rand(40, torch.float32, device)
    r = rand((24, 40), torch.float32, device)
    fns = {
        "rms": (lambda x, r, w: norms.rms_norm(x, w), lambda x, r, w: rms_ref(x, w)),
        "ln": (lambda x, r, w: norms.layer_norm(x, w), lambda x, r, w: ln_ref(x, w)),
        "add_rms": (lambda x, r, w: norms.add_rms_norm(x, r, w)[0], lambda x, r, w: rms_ref(x + r, w)),
    }
    ours_fn, ref_fn = fns[which]
    leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    ours_fn(*leaves).sum().backward()  # stride-0 gradient
    ref_leaves = [t.double().requires_grad_() for t in (x, r, w)]
    ref_fn(*ref_leaves).sum().backward()
    _check_grads([t.grad for t in leaves], [t.grad for t in ref_leaves])

    gt = rand((40, 24), torch.float32, device).t()  # transposed gradient (column stride 24)
    leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    ours_fn(*leaves).backward(gt)
    ref_leaves = [t.double().requires_grad_() for t in (x, r, w)]
    ref_fn(*ref_leaves).backward(gt.double())
    _check_grads([t.grad for t in leaves], [t.grad for t in ref_leaves])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_case9_misaligned_inputs_and_sliced_weights(norms, device, dtype):
    N = 127
    buf = rand(3 * N + 1, dtype, device)
    x = buf[1:].view(3, N)  # base pointer not 16-byte aligned
    wbuf = rand(4 * N, dtype, device)
    w, b = wbuf[5:5 + N], wbuf[2 * N + 3:3 * N + 3]  # weights sliced out of a larger buffer
    assert_close_ref(norms.rms_norm(x, w, b), rms_ref(x, w, b))
    assert_close_ref(norms.layer_norm(x, w, b), ln_ref(x, w, b), rel_atol=2e-6)
    r = buf[:-1].view(3, N)  # residual overlapping x, base pointer aligned
    out, h = norms.add_rms_norm(x, r, w)
    assert_close_ref(h, x.double() + r.double())  # the residual sum is an output too
    assert_close_ref(out, rms_ref((x.float() + r.float()).to(dtype), w))


def test_row_strides_and_non_contiguous_inputs(norms, device):
    big = rand((6, 300), torch.float32, device)
    x = big[::2, 10:138]  # row stride 600, unit column stride: read in place
    assert_close_ref(norms.rms_norm(x), rms_ref(x))
    xt = rand((64, 5), torch.float32, device).t()  # column stride 5: copied once
    assert_close_ref(norms.layer_norm(xt), ln_ref(xt), rel_atol=2e-6)
    w = rand(128, torch.float32, device)[::2]  # strided weight: copied once
    assert_close_ref(norms.rms_norm(xt, w), rms_ref(xt, w))
    x3 = rand((4, 5, 32), torch.float32, device)[:, 1:4]  # leading dims that do not collapse
    assert_close_ref(norms.rms_norm(x3), rms_ref(x3))


def test_poisoned_memory_and_no_nan(norms, device):
    poison = torch.full((1 << 16,), float("nan"), device=device)
    del poison  # its memory is likely handed to the outputs below
    x = rand((8, 1000), torch.bfloat16, device)
    for y in (norms.rms_norm(x), norms.layer_norm(x), *norms.add_rms_norm(x, x)):
        assert not torch.isnan(y).any()
    zeros = torch.zeros((2, 64), device=device)  # eps keeps an all-zero row finite
    assert torch.equal(norms.rms_norm(zeros), zeros)
    assert torch.equal(norms.layer_norm(zeros), zeros)


def test_empty_inputs_return_empty_outputs(norms, device):
    for shape in [(0, 16), (3, 0, 16)]:
        x = torch.empty(shape, device=device, requires_grad=True)
        w = torch.ones(16, device=device, requires_grad=True)
        y = norms.rms_norm(x, w)
        assert y.shape == x.shape
        y.sum().backward()
        assert torch.equal(w.grad, torch.zeros(16, device=device))
        assert norms.layer_norm(x, w, w).shape == x.shape


# ----------------------------------------------------------------------------- ops and compile


def _op(norms, name):
    return getattr(norms._ops.ops, name).default


def test_opcheck_every_op(norms, device):
    N = 33
    x = rand((3, N), torch.float32, device).requires_grad_()
    r = rand((3, N), torch.bfloat16, device).requires_grad_()
    w = rand(N, torch.float32, device).requires_grad_()
    b = rand(N, torch.bfloat16, device).requires_grad_()
    fwd = _op(norms, "rms_norm_fwd")
    torch.library.opcheck(fwd, (x, None, w, None, 1e-6, 0.0, None, torch.float32, 0))
    torch.library.opcheck(fwd, (x, r, w, b, 1e-6, 1.0, torch.bfloat16, torch.bfloat16, 0))
    torch.library.opcheck(fwd, (x.detach(), None, None, None, 1e-6, 0.0, torch.float16, torch.float16, 0))
    torch.library.opcheck(fwd, (x, None, w, None, 1e-6, 0.0, None, torch.float32, 1))  # torch's orders
    torch.library.opcheck(fwd, (x, None, w, b, 1e-6, 0.0, torch.bfloat16, torch.bfloat16, 2))
    ln = _op(norms, "layer_norm_fwd")
    torch.library.opcheck(ln, (x, None, w, b, 1e-5, 0))
    torch.library.opcheck(ln, (x, r, None, None, 1e-5, 0))
    torch.library.opcheck(ln, (x, None, w, b, 1e-5, 2))
    dy = rand((3, N), torch.float32, device)
    rstd = torch.rand(3, device=device) + 0.5
    # the backwards' last argument: the bias gradient's dtype (None: not wanted)
    torch.library.opcheck(_op(norms, "rms_norm_bwd"),
                          (dy, dy, x.detach(), w.detach(), rstd, 0.0, None, torch.float32, torch.bfloat16, True, None))
    torch.library.opcheck(_op(norms, "rms_norm_bwd"),
                          (dy, None, x.detach(), None, rstd, 0.0, None, torch.float32, None, False, torch.bfloat16))
    torch.library.opcheck(_op(norms, "layer_norm_bwd"),
                          (dy, None, x.detach(), w.detach(), rstd - 0.5, rstd, torch.float32, None, True, torch.bfloat16))
    # inputs that take a gradient: the backward ops' own autograd formulas (second derivatives)
    xg, wg, dyg = (t.detach().clone().requires_grad_() for t in (x, w, dy))
    torch.library.opcheck(_op(norms, "rms_norm_bwd"),
                          (dyg, dyg, xg, wg, rstd, 0.5, None, torch.float32, torch.bfloat16, True, torch.float32))
    torch.library.opcheck(_op(norms, "layer_norm_bwd"),
                          (dyg, None, xg, None, rstd - 0.5, rstd, torch.float32, None, False, torch.float32))
    x3, dy3 = xg.detach().view(3, 1, N).requires_grad_(), dyg.detach().view(3, 1, N).requires_grad_()
    torch.library.opcheck(_op(norms, "norm_modulate_bwd"),
                          (dy3, x3, wg.detach()[None].requires_grad_(), wg, None, rstd[:, None] - 0.5, rstd[:, None],
                           False, True, False))
    for flag in (True, False):  # the bool this argument replaced reaches the op as an integer dtype: refused
        with pytest.raises(TypeError, match="db_dtype"):
            _op(norms, "layer_norm_bwd")(dy, None, x.detach(), w.detach(), rstd - 0.5, rstd, torch.float32, None, True,
                                         flag)
        with pytest.raises(TypeError, match="db_dtype"):
            _op(norms, "rms_norm_bwd")(dy, None, x.detach(), None, rstd, 0.0, None, torch.float32, None, False, flag)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_case5_compile_fullgraph(norms, device, backend):
    def f(x, r, w, b):
        out, h = norms.add_rms_norm(x, r, w, eps=1e-6, cast_dtype=torch.bfloat16)
        return norms.layer_norm(out, w, b) + norms.rms_norm(h, w, weight_offset=1.0) * 2

    x, r = rand((4, 64), torch.bfloat16, device), rand((4, 64), torch.bfloat16, device)
    w, b = rand(64, torch.float32, device), rand(64, torch.float32, device)
    leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    y = compiled(*leaves)
    y.float().sum().backward()
    eager_leaves = [t.clone().requires_grad_() for t in (x, r, w, b)]
    y_eager = f(*eager_leaves)
    y_eager.float().sum().backward()
    assert torch.equal(y, y_eager)
    for a, e in zip(leaves, eager_leaves):
        assert torch.equal(a.grad, e.grad)


# ----------------------------------------------------------------------------- launch config


@pytest.mark.parametrize("warp_size", [32, 64])
def test_case10_config_picker_respects_warp_size(norms, warp_size):
    for N in [1, 3, 127, 4095, 4097, 32771, 65537, 262144, 1 << 20]:
        for element_size in (2, 4):
            cfg = norms.pick_config(N, element_size, warp_size)
            assert cfg.num_warps * warp_size <= 1024
            assert cfg.num_warps >= 1 and cfg.num_warps & (cfg.num_warps - 1) == 0
            assert cfg.block_n & (cfg.block_n - 1) == 0
            assert cfg.loop == (cfg.block_n < N)
            if not cfg.loop:
                assert cfg.block_n >= N
    assert not norms.pick_config(16384, 4, warp_size).loop
    assert norms.pick_config(16385, 4, warp_size).loop  # fp32 rows over 64 KiB loop
    assert norms.pick_config(32768, 2, warp_size).num_warps * warp_size == 1024
    with pytest.raises(ValueError, match="warp_size"):
        norms.pick_config(128, 2, 48)
    with pytest.raises(ValueError, match="N must be"):
        norms.pick_config(0, 2, warp_size)


def test_one_block_kernels_aim_at_32_bytes_of_a_row_per_thread(norms, monkeypatch):
    """The one-program forwards and backwards aim at 32 bytes of a row per thread (H200: layer_norm forward over
    8192 x 16384 bf16 2357 GB/s with 64 bytes, 3779 with 32; the backward with its next-row prefetch +19% / +25%
    at 32768 x 4096 / 16384 x 8192), within 1024 threads; the backward keeps rows of at most 16 KiB in one block."""
    import sys

    launch = sys.modules[norms.__name__ + "._launch"]
    rms = sys.modules[norms.__name__ + ".rms_norm"]
    assert launch.BYTES_PER_THREAD == 32 and launch.BWD_MAX_FUSED_BYTES == 16384
    assert norms.pick_config(4096, 2, 32).num_warps == 8
    assert norms.pick_config(4096, 2, 32, 64).num_warps == 4
    assert norms.pick_config(16384, 2, 32).num_warps == 32
    assert norms.pick_config(32768, 2, 32).num_warps == 32  # capped at 1024 threads
    assert dict(rms._fwd_meta(4096, 2, torch.device("cuda", 0), None, False))["num_warps"] == 8
    # the default is read at the call (benchmarks/norms_narrow_sweep.py sets it, then clears the cache)
    monkeypatch.setattr(launch, "BYTES_PER_THREAD", 64)
    launch.pick_config.cache_clear()
    try:
        assert norms.pick_config(4096, 2, 32).num_warps == 4
    finally:
        monkeypatch.undo()
        launch.pick_config.cache_clear()
    assert norms.pick_config(4096, 2, 32).num_warps == 8


def test_backward_register_cap_rule_and_same_bits(norms, device, monkeypatch):
    """The one-chunk rms backward of 256 threads (bf16 rows of 4096) runs with at most 128 registers per thread on
    NVIDIA, not with a bias gradient or dh, nor at other thread counts, nor under the interpreter; the cap changes
    no bit of dx or dw (checked on an NVIDIA GPU; elsewhere both runs are uncapped)."""
    import sys

    rms = sys.modules[norms.__name__ + ".rms_norm"]
    cuda = torch.device("cuda", 0)
    cfg4k, cfg2k, cfg8k = (norms.pick_config(n, 2, 32) for n in (4096, 2048, 8192))
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert rms._bwd_register_cap(cfg4k, 32, cuda, False) == {}
    monkeypatch.setattr(rms, "is_interpreter", lambda kernel: False)
    nvidia = torch.version.hip is None
    assert rms._bwd_register_cap(cfg4k, 32, cuda, False) == ({"maxnreg": 128} if nvidia else {})
    assert rms._bwd_register_cap(cfg4k, 32, cuda, True) == {}
    assert rms._bwd_register_cap(cfg2k, 32, cuda, False) == {}  # 128 threads: the cap cost 2% there
    assert rms._bwd_register_cap(cfg8k, 32, cuda, False) == {}  # 512 threads
    assert rms._bwd_register_cap(cfg4k, 32, torch.device("cpu"), False) == {}
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm: no such launch option
    assert rms._bwd_register_cap(cfg4k, 32, cuda, False) == {}
    monkeypatch.undo()

    x0, w0 = rand((64, 4096), torch.bfloat16, device), rand((4096,), torch.bfloat16, device)
    dy = rand((64, 4096), torch.bfloat16, device)

    def grads():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        norms.rms_norm(x, w, eps=1e-6).backward(dy)
        return x.grad, w.grad

    rms._bwd_plan.cache_clear()  # the launch plans keep the cap they were built with
    try:
        capped = grads()
        monkeypatch.setattr(rms, "_bwd_register_cap", lambda *a: {})
        rms._bwd_plan.cache_clear()
        uncapped = grads()
    finally:
        rms._bwd_plan.cache_clear()  # no uncapped plan outlives the patch
    assert all(torch.equal(a, b) for a, b in zip(capped, uncapped))


def test_weight_first_rule_and_same_bits(norms, device, monkeypatch):
    """The one-chunk forward loads w/b before the row's reduction for rows of at most 8 KiB without a residual
    (H200: +1.4% at 8 KiB, -1% at 16 KiB); the load's place changes no bit (weight, bias, cast, training). The bits
    half means something on a GPU only (the interpreter runs the same arithmetic either way)."""
    import sys

    rms = sys.modules[norms.__name__ + ".rms_norm"]
    assert rms._w_first(8192, False, False) and rms._w_first(200, False, False)
    assert not rms._w_first(16384, False, False) and not rms._w_first(4096, True, False)
    assert not rms._w_first(4096, False, True)
    x = rand((37, 1000), torch.float16, device)
    w, b = rand((1000,), torch.float16, device), rand((1000,), torch.float32, device)

    def outputs():
        rms._fwd_meta.cache_clear()
        rms._INFER_PLANS.clear()
        with torch.no_grad():
            inference = [norms.rms_norm(x, w, eps=1e-5), norms.rms_norm(x, w, b, cast_dtype=torch.float16)]
        xg = x.clone().requires_grad_()
        training = norms.rms_norm(xg, w, eps=1e-5, weight_offset=1.0)
        return [*inference, training.detach()]

    try:
        monkeypatch.setattr(rms, "_w_first", lambda row_bytes, loop, residual: False)
        after = outputs()
        monkeypatch.setattr(rms, "_w_first", lambda row_bytes, loop, residual: True)
        first = outputs()
    finally:
        rms._fwd_meta.cache_clear()
        rms._INFER_PLANS.clear()
    assert all(torch.equal(a, f) for a, f in zip(after, first))


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_inference_plans_per_alignment(norms, device, op):
    """Plain inference keeps one validated plan per call signature, the 16-byte alignment of x, weight and bias
    included (its launch is pinned to it): new data, tensors that start 2 or 8 bytes off and F.layer_norm's order
    (which depends on alignment) all stay right; bad arguments after good ones still raise, naming them."""
    import sys

    module = sys.modules[f"{norms.__name__}.{op}"]
    fn, ref = (norms.rms_norm, rms_ref) if op == "rms_norm" else (norms.layer_norm, ln_ref)
    orders = [None, "mean", "fused"] if op == "rms_norm" else [None, "fused"]
    module._INFER_PLANS.clear()
    store = rand((4 * 67 + 8,), torch.float16, device, scale=2.0)
    wstore, bstore = rand((67 + 8,), torch.float32, device), rand((67 + 8,), torch.float16, device)
    try:
        with torch.no_grad():
            for order in orders:
                for x_off, w_off in ((0, 0), (0, 0), (1, 0), (4, 2), (0, 1), (8, 0)):
                    x = store[x_off:x_off + 4 * 67].view(4, 67)
                    x.copy_(rand((4, 67), torch.float16, device, scale=2.0))  # new data in place
                    w, b = wstore[w_off:w_off + 67], bstore[w_off:w_off + 67]
                    y = rand((4, 67), torch.float16, device)  # poison whatever a stale plan might write to
                    out = fn(x, w, b, eps=1e-5, torch_order=order)
                    assert out.data_ptr() != y.data_ptr() and out.dtype == torch.float16
                    assert_close_ref(out, ref(x, w, b, eps=1e-5), rel_atol=2e-3)
            # 4 alignments per order: (0, 0) twice and x 16 bytes on (8 elements) share a plan
            assert len(module._INFER_PLANS) == len(orders) * 4
            x = rand((4, 67), torch.float16, device)
            with pytest.raises(ValueError, match=r"weight must have shape \(N,\) = \(67,\)"):
                fn(x, wstore[:66], eps=1e-5)
            with pytest.raises(TypeError, match="torch_order"):
                fn(x, wstore[:67], eps=1e-5, torch_order=["mean"])
            with pytest.raises(ValueError, match="eps must be"):
                fn(x, wstore[:67], eps=-1.0)
            with pytest.raises(TypeError, match="x must have dtype"):
                fn(x.double(), wstore[:67], eps=1e-5)
    finally:
        module._INFER_PLANS.clear()


# ----------------------------------------------------------------------------- errors


def test_bad_inputs_raise_clear_errors(norms, device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(TypeError, match=r"x must have dtype .*float64"):
        norms.rms_norm(x.double())
    with pytest.raises(TypeError, match=r"x must have dtype .*int32"):
        norms.layer_norm(torch.ones(2, 8, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="weight must have dtype"):
        norms.rms_norm(x, torch.ones(8, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match=r"weight must have shape \(N,\) = \(8,\)"):
        norms.rms_norm(x, torch.ones(7, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape"):
        norms.layer_norm(x, None, torch.ones(2, 8, device=device))
    with pytest.raises(ValueError, match="weight is on meta"):
        norms.rms_norm(x, torch.ones(8, device="meta"))
    with pytest.raises(ValueError, match="residual is on meta"):
        norms.add_layer_norm(x, torch.ones(2, 8, device="meta"))
    with pytest.raises(ValueError, match="residual must have the shape"):
        norms.add_rms_norm(x, torch.ones(2, 9, device=device))
    with pytest.raises(ValueError, match="eps must be"):
        norms.rms_norm(x, eps=-1e-6)
    with pytest.raises(ValueError, match="eps must be"):
        norms.layer_norm(x, eps=float("nan"))
    with pytest.raises(TypeError, match="cast_dtype must be"):
        norms.rms_norm(x, cast_dtype=torch.float64)
    for fn in (norms.rms_norm, norms.layer_norm, lambda t, eps: norms.add_rms_norm(t, t, eps=eps),
               lambda t, eps: norms.norm_modulate(t[None], t[:1], t[:1], eps=eps)):
        with pytest.raises(TypeError, match="eps must be a Python float or int, got bool"):  # not eps=1.0
            fn(x, eps=True)
    # layer_norm names the orders it takes (it has no "mean" order); a wrong type is a TypeError
    with pytest.raises(ValueError, match=r"torch_order must be one of None, 'fused'; got 'mean'"):
        norms.layer_norm(x, torch_order="mean")
    with pytest.raises(TypeError, match=r"torch_order must be one of None, 'fused'; got bool True"):
        norms.layer_norm(x, torch_order=True)
    with pytest.raises(ValueError, match=r"torch_order must be one of None, 'mean', 'fused'; got 'cuda'"):
        norms.rms_norm(x, torch_order="cuda")
    with pytest.raises(ValueError, match="at least one dimension"):
        norms.rms_norm(torch.tensor(1.0, device=device))


@pytest.mark.parametrize("prelude, expected", [
    ("", "set the environment variable TRITON_INTERPRET=1 before importing triton"),
    # switched on after ``import triton``: the kernels are the interpreter's, triton's language functions not; the
    # first launch says what to do, not Triton's "outside of the scope of a kernel"
    ("import os, triton\nos.environ['TRITON_INTERPRET'] = '1'\n", "TRITON_INTERPRET=1 was set after triton had been imported"),
], ids=["unset", "set-after-import"])
def test_cpu_tensor_without_interpreter_raises(built, prelude, expected):
    """Without TRITON_INTERPRET=1 (or with it set too late) the kernels cannot run a CPU tensor: a clear error."""
    variant = built["triton-norms"].variant("cpu")
    code = (
        prelude + "import kernels, torch\n"
        f"m = kernels.get_local_kernel(__import__('pathlib').Path({str(variant)!r}))\n"
        "try:\n"
        "    m.rms_norm(torch.randn(2, 8))\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "ERR" in res.stdout and expected in res.stdout, res.stdout + res.stderr


@pytest.mark.gpu
def test_case2_more_than_2_31_elements(norms, device):
    """(1, 1048576, 4096) bf16 forward + backward: row offsets must be 64-bit (rows >= 524288)."""
    if device != "cuda":
        pytest.skip("4.3 GB tensors: GPU only")
    M, N = 1 << 20, 4096
    x = torch.randn(1, M, N, device=device, dtype=torch.bfloat16).requires_grad_()
    w = (torch.rand(N, device=device) + 0.5).to(torch.bfloat16).requires_grad_()
    y = norms.rms_norm(x, w, cast_dtype=torch.bfloat16)
    dy = torch.ones((), device=device, dtype=torch.bfloat16).expand(y.shape)  # also stride-0 (case 8)
    y.backward(dy)
    rows = torch.tensor([0, 524287, 524288, M - 1], device=device)
    xs = x.detach()[0, rows].double().requires_grad_()
    ref = rms_ref(xs, w.detach())
    assert_close_ref(y.detach()[0, rows], ref, ulps=2)
    ref.sum().backward()
    assert_close_ref(x.grad[0, rows], xs.grad, rel_atol=GRAD_REL, scale=_dx_scale(xs, w, dy[0, :4], centre=False))
    assert torch.isfinite(w.grad.float()).all()


def test_eager_fast_path_equals_the_registered_op(norms, device):
    """Plain eager inference skips the dispatcher; under a dispatch mode (or with autograd) the op runs.
    Both give the same bits, and a dispatch mode sees every call (the demo counts launches that way)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func.namespace)
            return func(*args, **(kwargs or {}))

    x = rand((5, 77), torch.float16, device)
    w = rand(77, torch.float16, device)
    r = rand((5, 77), torch.float16, device)
    with torch.no_grad():
        fast = [norms.rms_norm(x, w, cast_dtype=torch.float16), norms.layer_norm(x, w, w), *norms.add_rms_norm(x, r, w)]
        with Count():
            via_op = [norms.rms_norm(x, w, cast_dtype=torch.float16), norms.layer_norm(x, w, w), *norms.add_rms_norm(x, r, w)]
    ns = norms._ops.NAMESPACE
    assert calls.count(ns) == 3, calls
    for a, b in zip(fast, via_op):
        assert torch.equal(a, b)


def test_eager_fast_path_takes_module_parameters(norms):
    """A module's weight is an nn.Parameter: in no_grad inference it still takes the dispatcher-free path."""
    d = norms._dispatch
    w = torch.nn.Parameter(torch.randn(8))
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert d._route((x, w, None, 1e-6)) == d.IMPL
    assert d._route((x, w)) == d.AUTOGRAD  # grad mode on and w requires grad: autograd must run

    class Sub(torch.Tensor):
        pass

    with torch.no_grad():
        assert d._route((x.as_subclass(Sub),)) == d.OP


def test_negative_bit_tensors_go_through_the_op(norms):
    """A view with the negative bit set (``z.conj().imag``) holds -x in memory: the implementation would read that,
    so the call goes to the op, whose dispatcher resolves the bit (values: test_case10 of test_reliability_ops)."""
    d = norms._dispatch
    x, w = torch.randn(2, 8), torch.randn(8)
    neg = torch.randn(2, 8, dtype=torch.complex64).conj().imag
    assert neg.is_neg()
    with torch.no_grad():
        assert d.inference((x, w, None)) and d._route((x, w)) == d.IMPL
        assert not d.inference((x, torch._neg_view(w), None))
        assert d._route((neg, w, None, 1e-6)) == d.OP
    assert d._route((neg, w.requires_grad_())) == d.OP  # not the eager Function, which would call the implementation


def test_negative_bit_tensors_under_forward_mode_ad(norms, device):
    """Under a dual level the call still reaches the Function, which refuses a tangent it would drop (the op would
    drop it silently), with negative bits resolved first: a dual negative-bit x or a dual x with a negative-bit weight
    raise; a negative-bit weight without tangents gives the right values and gradients."""
    import torch.autograd.forward_ad as fwAD

    x, w = torch.randn(4, 64, device=device), torch.randn(64, device=device)
    nw, nx = torch._neg_view(-w), torch._neg_view(-x)
    want = norms.rms_norm(x, w)
    with fwAD.dual_level():
        for primal, weight in ((x, nw), (nx, w)):
            with pytest.raises(NotImplementedError):
                norms.rms_norm(fwAD.make_dual(primal, torch.ones_like(primal)), weight)
        xg = x.clone().requires_grad_(True)
        y = norms.rms_norm(xg, nw)
        assert torch.equal(y.detach(), want)
    y.sum().backward()
    xr = x.clone().requires_grad_(True)
    norms.rms_norm(xr, w).sum().backward()
    assert torch.equal(xg.grad, xr.grad)


def test_fast_launch_key_follows_triton_specialisation(norms):
    """The direct-launch cache may reuse a compiled kernel only where Triton would: the key
    separates 16-byte aligned from unaligned pointers, ints equal to 1, multiples of 16 and
    the integer width, and dtypes."""
    def key(a):
        return norms._fastlaunch.spec((a,))

    base = torch.zeros(64, dtype=torch.float16)
    assert key(base) != key(base[1:])  # 2-byte offset: no longer 16-byte aligned
    assert key(base) == key(base[8:])  # 16-byte offset: same specialisation
    assert key(base) != key(base.float())
    assert key(torch.nn.Parameter(base)) == key(base)
    assert len({key(1), key(2), key(16), key(32), key(2**31), key(2**63)}) == 5  # 16 and 32 share a key
    assert key(16) == key(32) and key(3) == key(5) and key(1) != key(3) and key(-16) != key(-2**40)
    assert key(None) != key(False) and key(True) != key(1) and key(0.5) == key(1e-6)
    assert norms._fastlaunch.spec((base, 3, None)) == key(base) + key(3) + key(None)


def test_fast_launch_key_of_tensor_descriptors(norms):
    """A host tensor descriptor is keyed as Triton specialises it: its dtype and block shape (Gluon's: and its shared
    layout), not its base, shape or strides, which reach the kernel as run-time values."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    fl = norms._fastlaunch
    x = torch.zeros(64, 32, dtype=torch.bfloat16)

    def key(t, shape, block):
        return fl.spec((TensorDescriptor(t, shape, [32, 1], block),))

    assert key(x, [64, 32], [16, 32]) == key(x[8:], [56, 32], [16, 32]) == key(x.clone(), [17, 32], [16, 32])
    assert key(x, [64, 32], [16, 32]) != key(x, [64, 32], [32, 32])
    assert key(x, [64, 32], [16, 32]) != key(x.half(), [64, 32], [16, 32])
    hash(key(x, [64, 32], [16, 32]))

    # a Triton without mangle_type: the descriptor is keyed as itself (unhashable) and the launch takes Triton's path
    from types import SimpleNamespace

    calls = []
    orig = (fl._DESCRIPTORS, fl._triton_launch, fl._direct)
    try:
        fl._DESCRIPTORS = ()
        fl._triton_launch = lambda kernel, grid, args, meta: calls.append(args)
        fl._direct = lambda kernel, device: True
        desc = TensorDescriptor(x, [64, 32], [32, 1], [16, 32])
        fl.launch(SimpleNamespace(), (1,), (desc, 3), (), torch.device("cuda", 0))
    finally:
        fl._DESCRIPTORS, fl._triton_launch, fl._direct = orig
    assert calls == [(desc, 3)]


def test_fast_launch_only_without_launch_hooks(norms, monkeypatch):
    """Profilers hook kernel launches; the direct launch bypasses hooks, so it is used only when none is set."""
    from triton import knobs

    fl = norms._fastlaunch
    assert fl._hooks_off()  # nothing registered in the test process
    for hook in (print, type("Chain", (), {"calls": [print]})()):
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        assert not fl._hooks_off()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", type("Chain", (), {"calls": []})())
    assert fl._hooks_off()


class _Allocation:  # the module-level name a launcher wrapper reads its allocators from
    _allocator = _profile_allocator = None


_allocation = _Allocation()


class _WrapperForm:
    """A launcher with the Python wrapper form ``_fastlaunch._bind`` recognises: it reads the scratch sizes,
    alignments and allocators, then hands everything to ``launch`` (recorded here)."""

    global_scratch_size = profile_scratch_size = 0
    global_scratch_align = profile_scratch_align = 1
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.calls = []
        self.launch = lambda *a: self.calls.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        # (no assert here: pytest's rewriting of asserts would add names to this body)
        scratch = (self.global_scratch_size, self.global_scratch_align, _allocation._allocator,
                   self.profile_scratch_size, self.profile_scratch_align, _allocation._profile_allocator)
        del scratch
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl, None, None,
                    *args)


class _OtherForm(_WrapperForm):
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        self.launch(gridX, gridY, gridZ, stream, function, self.gsan_enabled, *args)


def test_fast_launch_binds_the_c_launch_only_to_the_known_wrapper(norms):
    """Where the compiled launcher is the known Python wrapper and the kernel needs no scratch memory, the
    direct launch calls its C function with exactly the arguments the wrapper would pass; any other wrapper
    body, or a kernel with scratch memory, keeps the wrapper."""
    from types import SimpleNamespace

    bind = norms._fastlaunch._bind
    args = (7, 2, 1, 99, "function", "metadata", None, None, None, "x", 3, None)

    wrapper = _WrapperForm()
    launch, head = bind(SimpleNamespace(run=wrapper, function="function", packed_metadata="metadata"))
    assert launch == wrapper.launch
    wrapper(*args)
    launch(7, 2, 1, 99, *head, "x", 3, None)
    assert len(wrapper.calls) == 2 and wrapper.calls[0] == wrapper.calls[1]

    for run in (_OtherForm(), _WrapperForm()):
        run.profile_scratch_size = 0 if isinstance(run, _OtherForm) else 128
        launch, head = bind(SimpleNamespace(run=run, function="function", packed_metadata="metadata"))
        assert launch is run and head == ("function", "metadata", None, None, None)


def test_launch_plan_direct_and_address_paths(norms, monkeypatch):
    """A plan's direct launches without a GPU (a stand-in compiled kernel records its calls): the first call of a
    pointer spec goes through Triton, later ones call the launcher with the stream, the bound head, the pointers
    and the fixed scalars; ``at`` passes integer addresses for a compiled alignment and declines otherwise, and
    for good once a call with other dtypes has compiled another kernel; off the current GPU the plan's is made
    current for the launch."""
    from types import SimpleNamespace

    from triton.runtime import driver

    fl = norms._fastlaunch
    calls, firsts = [], []

    def run(*args):
        calls.append(args)

    compiled = SimpleNamespace(run=run, function="fn", packed_metadata="md")
    monkeypatch.setattr(fl, "_first_launch", lambda k, grid, args, meta: firsts.append(args) or (compiled, ("tail",)))
    monkeypatch.setattr(fl, "_hooks_off", lambda: True)
    monkeypatch.setattr(fl, "_knobs", object())
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=lambda index: 77))
    kernel = SimpleNamespace(device_caches={})
    plan = fl.Launch(kernel, (3, 2), (("BLOCK", 8),), (5, 0.5), torch.device("cuda", 0))
    current, guards = [0], []
    plan._current = lambda: current[0]  # this (absent) GPU is the current device
    monkeypatch.setattr(fl, "_device_guard", _fake_device_guard(current, guards))

    store = torch.zeros(64, dtype=torch.float16)
    x, y = store[8:24], store[32:48]  # 16-byte aligned (a zeros tensor's storage is)
    assert not x.data_ptr() & 15 and not y.data_ptr() & 15
    assert not plan.at((x.data_ptr(), None, y.data_ptr()))  # nothing compiled yet
    plan((x, None, y))
    assert len(firsts) == 1 and not calls
    plan((x, None, y))
    assert calls[-1] == (3, 2, 1, 77, "fn", "md", None, None, None, x, None, y, 5, 0.5, "tail")
    current[0] = 1  # another GPU current: the plan's made current for the launch; addresses decline
    assert not plan.at((x.data_ptr(), None, y.data_ptr()))
    plan((x, None, y))
    assert guards == [0] and current == [1] and calls[-1] == calls[-2] and len(firsts) == 1
    current[0] = 0
    assert plan.at((x.data_ptr(), None, y.data_ptr()))
    assert calls[-1] == (3, 2, 1, 77, "fn", "md", None, None, None, x.data_ptr(), None, y.data_ptr(), 5, 0.5, "tail")
    assert not plan.at((x.data_ptr() + 2, None, y.data_ptr()))  # another alignment: not compiled
    plan((x.float(), None, y))  # other dtypes compile another kernel: addresses are ambiguous from now on
    assert len(firsts) == 2 and not plan.at((x.data_ptr(), None, y.data_ptr()))


def _fake_device_guard(current: list, guards: list):
    """A stand-in for ``torch.cuda.device(index)`` over absent GPUs: makes ``device`` current (``current[0]``) inside
    the block and records its index in ``guards``."""
    @contextlib.contextmanager
    def guard(device):
        guards.append(device.index)
        before, current[0] = current[0], device.index
        try:
            yield
        finally:
            current[0] = before

    return guard


def test_launch_function_direct_path(norms, monkeypatch):
    """``launch`` without a GPU (a stand-in compiled kernel records its calls): a signature's first call compiles
    through Triton, later ones call the launcher with the grid padded to 3, the stream, the bound head, the arguments,
    the fixed ones and the constexpr tail; a tensor on a GPU that is not the current one launches with that GPU made
    current; a launcher that rejects the call sends it, and every later one, to Triton."""
    from types import SimpleNamespace

    from triton.runtime import driver

    fl = norms._fastlaunch
    calls, firsts, triton_path = [], [], []

    def run(*args):
        if "reject" in args:
            raise TypeError("another calling convention")
        calls.append(args)

    compiled = SimpleNamespace(run=run, function="fn", packed_metadata="md")
    monkeypatch.setattr(fl, "_first_launch", lambda k, grid, args, meta: firsts.append(args) or (compiled, ("tail",)))
    monkeypatch.setattr(fl, "_triton_launch", lambda k, grid, args, meta, device=None: triton_path.append(args))
    current, guards = [0], []  # the current (absent) GPU
    monkeypatch.setattr(fl, "_direct", lambda kernel, device: fl._DIRECT_OK[0] and device.index == current[0])
    monkeypatch.setattr(fl, "_current_index", lambda kind: current[0])
    monkeypatch.setattr(fl, "_device_guard", _fake_device_guard(current, guards))
    monkeypatch.setattr(fl, "_CACHE", {})
    monkeypatch.setattr(fl, "_DIRECT_OK", [True])
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=lambda index: 77))
    kernel, device = SimpleNamespace(), torch.device("cuda", 0)
    x = torch.zeros(8, dtype=torch.float16)
    fl.launch(kernel, (4, 2), (x, 3), (("B", 8),), device, fixed=(0.5,), fixed_spec=fl.spec((0.5,)))
    assert len(firsts) == 1 and not calls
    fl.launch(kernel, (4, 2), (x, 3), (("B", 8),), device, fixed=(0.5,), fixed_spec=fl.spec((0.5,)))
    assert calls == [(4, 2, 1, 77, "fn", "md", None, None, None, x, 3, 0.5, "tail")] and len(firsts) == 1
    current[0] = 1  # device_map="auto": the tensors' GPU is not the current one
    fl.launch(kernel, (4, 2), (x, 3), (("B", 8),), device, fixed=(0.5,), fixed_spec=fl.spec((0.5,)))
    assert guards == [0] and current == [1] and len(calls) == 2 and not triton_path
    current[0] = 0
    calls.pop()
    fl.launch(kernel, (4, 2), (x, 3), (("B", 8),), device, fixed=("reject",), fixed_spec=fl.spec((0.5,)))
    assert triton_path == [(x, 3, "reject")] and not fl._DIRECT_OK[0]
    fl.launch(kernel, (4, 2), (x, 3), (("B", 8),), device, fixed=(0.5,), fixed_spec=fl.spec((0.5,)))
    assert len(triton_path) == 2 and len(calls) == 1

def test_fixed_launch_direct_path_and_rebase(norms, monkeypatch):
    """A FixedLaunch (its caller's key fixes the specialisation) compiles through Triton on its first direct call,
    then calls the launcher with the stream, the bound head, the arguments as given (a tensor descriptor passes
    through untouched) and the constexpr tail; when its device is not the current one (a model spread over GPUs) it
    makes it current for the launch; a new one of an equal specialisation reuses the compiled launcher. ``rebase`` copies a descriptor onto another tensor without
    touching the original."""
    from types import SimpleNamespace

    from triton.runtime import driver
    from triton.tools.tensor_descriptor import TensorDescriptor

    fl = norms._fastlaunch
    calls, firsts, triton_path = [], [], []
    compiled = SimpleNamespace(run=lambda *args: calls.append(args), function="fn", packed_metadata="md")
    monkeypatch.setattr(fl, "_first_launch", lambda k, grid, args, meta: firsts.append(args) or (compiled, ("tail",)))
    monkeypatch.setattr(fl, "_triton_launch", lambda k, grid, args, meta, device=None: triton_path.append(args))
    monkeypatch.setattr(fl, "_hooks_off", lambda: True)
    monkeypatch.setattr(fl, "_knobs", object())
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=lambda index: 77))
    monkeypatch.setattr(fl, "_CACHE", {})
    plan = fl.FixedLaunch(SimpleNamespace(device_caches={}), (5,), (("BLOCK", 8),), torch.device("cuda", 0))
    current, guards = [0], []
    plan._current = lambda: current[0]
    monkeypatch.setattr(fl, "_device_guard", _fake_device_guard(current, guards))

    x, y = torch.zeros(32, 16, dtype=torch.bfloat16), torch.zeros(32, 16, dtype=torch.bfloat16)
    template = TensorDescriptor(x, [32, 16], [16, 1], [16, 16])
    template.base = None
    desc = fl.rebase(template, y)
    assert desc.base is y and template.base is None and type(desc) is TensorDescriptor
    assert (desc.shape, desc.strides, desc.block_shape) == (template.shape, template.strides, template.block_shape)
    plan((desc, 3))
    assert len(firsts) == 1 and not calls
    plan((desc, 3))
    assert calls[-1] == (5, 1, 1, 77, "fn", "md", None, None, None, desc, 3, "tail") and calls[-1][9] is desc
    current[0] = 1  # another current device: the plan's made current for its launch, then restored
    plan((desc, 4))
    assert guards == [0] and current[0] == 1 and not triton_path
    assert calls[-1] == (5, 1, 1, 77, "fn", "md", None, None, None, desc, 4, "tail")
    current[0] = 0
    calls.pop()
    # a new plan of the same kernel, meta-parameters and specialisation (3 and 5: neither 1 nor a multiple of 16)
    # launches directly from its first call, with the launcher the first plan compiled
    again = fl.FixedLaunch(plan.kernel, (7,), plan.meta, torch.device("cuda", 0))
    again._current = plan._current
    again((desc, 5))
    assert len(firsts) == 1 and calls[-1] == (7, 1, 1, 77, "fn", "md", None, None, None, desc, 5, "tail")
    other = fl.FixedLaunch(plan.kernel, (7,), plan.meta, torch.device("cuda", 0))
    other._current = plan._current
    other((desc, 32))  # a multiple of 16: another specialisation, compiled through Triton
    assert len(firsts) == 2 and len(calls) == 2
    # fixed scalars follow the call's arguments on every path; the compiled launcher is shared with plans that
    # passed them per call
    pinned = fl.FixedLaunch(plan.kernel, (7,), plan.meta, torch.device("cuda", 0), (32,))
    pinned._current = plan._current
    pinned((desc,))
    assert len(firsts) == 2 and calls[-1] == (7, 1, 1, 77, "fn", "md", None, None, None, desc, 32, "tail")
    pinned((desc,))
    assert calls[-1] == (7, 1, 1, 77, "fn", "md", None, None, None, desc, 32, "tail") and len(calls) == 4
    current[0] = 1
    pinned((desc,))
    assert guards == [0, 0] and calls[-1] == (7, 1, 1, 77, "fn", "md", None, None, None, desc, 32, "tail")
    current[0] = 0
    calls.pop()
    launch = fl.Launch(plan.kernel, (6,), plan.meta, (3,), torch.device("cuda", 0)).pinned()
    assert (type(launch), launch.grid, launch.meta, launch.fixed) == (fl.FixedLaunch, (6,), plan.meta, (3,))
    # integer addresses: only once a call with tensors compiled; a launcher that refuses them turns them off
    launch._current = plan._current
    assert not launch.at((1024,)) and len(calls) == 4
    launch((desc,))
    assert launch.at((1024,)) and calls[-1] == (6, 1, 1, 77, "fn", "md", None, None, None, 1024, 3, "tail")
    monkeypatch.setattr(fl, "_ADDRESSES_OK", [True])
    launch._entry = (lambda *args: (_ for _ in ()).throw(TypeError("no ints")), *launch._entry[1:])
    assert not launch.at((1024,)) and fl._ADDRESSES_OK == [False]
    assert not launch.at((1024,))


def test_fast_launch_keys_separate_8_byte_from_16_byte_alignment(norms):
    """Triton specialises pointers on 16-byte divisibility: an 8-byte aligned tensor gets its own compiled kernel,
    so neither the launch cache key (``spec``) nor a plan's key (``signature``) may treat it as aligned."""
    fl = norms._fastlaunch
    store = torch.zeros(256, dtype=torch.float16)  # a zeros tensor's storage is 16-byte aligned
    aligned, off8, off16 = store[0:128], store[4:132], store[8:136]  # byte offsets 0, 8, 16
    assert not aligned.data_ptr() & 15 and off8.data_ptr() & 15 == 8
    assert fl.spec((aligned,)) != fl.spec((off8,))
    assert fl.spec((aligned,)) == fl.spec((off16,))
    # same shape, strides, dtype and device: the alignment alone separates the plans
    assert fl.signature(aligned) != fl.signature(off8)
    assert fl.signature(aligned) == fl.signature(off16)
    assert fl.signature(None) is None


def test_launch_plan_one_dimensional_grid_and_8_byte_addresses(norms, monkeypatch):
    """A plan over a 1-D grid hands the launcher (gx, 1, 1); ``at`` reuses a compiled kernel only for addresses of the
    same 16-byte alignment: an 8-byte aligned address declines (the caller then passes tensors)."""
    from types import SimpleNamespace

    from triton.runtime import driver

    fl = norms._fastlaunch
    calls, firsts = [], []
    compiled = SimpleNamespace(run=lambda *args: calls.append(args), function="fn", packed_metadata="md")
    monkeypatch.setattr(fl, "_first_launch", lambda k, grid, args, meta: firsts.append(args) or (compiled, ("tail",)))
    monkeypatch.setattr(fl, "_hooks_off", lambda: True)
    monkeypatch.setattr(fl, "_knobs", object())
    monkeypatch.setattr(fl, "_ADDRESSES_OK", [True])
    monkeypatch.setattr(driver, "_active", SimpleNamespace(get_current_stream=lambda index: 77))
    plan = fl.Launch(SimpleNamespace(device_caches={}), (6,), (("BLOCK", 8),), (5,), torch.device("cuda", 0))
    plan._current = lambda: 0
    store = torch.zeros(64, dtype=torch.float16)
    x = store[8:24]  # 16-byte aligned
    plan((x,))
    assert len(firsts) == 1 and not calls
    plan((x,))
    assert calls[-1] == (6, 1, 1, 77, "fn", "md", None, None, None, x, 5, "tail")
    assert plan.at((x.data_ptr(),)) and calls[-1] == (6, 1, 1, 77, "fn", "md", None, None, None, x.data_ptr(), 5,
                                                      "tail")
    n = len(calls)
    assert not plan.at((x.data_ptr() + 8,)) and len(calls) == n  # 8-byte aligned: not what was compiled


def test_direct_launch_only_on_the_current_device(norms, monkeypatch):
    """``launch`` calls a compiled launcher directly only for a compiled kernel on the current GPU (where Triton
    launches); another GPU, a CPU tensor or an interpreted kernel (no ``device_caches``) take another path."""
    from types import SimpleNamespace

    fl = norms._fastlaunch
    monkeypatch.setattr(fl, "_current_index", lambda kind: 1)
    monkeypatch.setattr(fl, "_hooks_off", lambda: True)
    monkeypatch.setattr(fl, "_knobs", object())
    monkeypatch.setattr(fl, "_DIRECT_OK", [True])
    compiled, interpreted = SimpleNamespace(device_caches={}), SimpleNamespace()
    assert fl._direct(compiled, torch.device("cuda", 1))
    assert not fl._direct(compiled, torch.device("cuda", 0))
    assert not fl._direct(compiled, torch.device("cpu"))
    assert not fl._direct(interpreted, torch.device("cuda", 1))
    monkeypatch.setattr(fl, "_hooks_off", lambda: False)
    assert not fl._direct(compiled, torch.device("cuda", 1))


def test_fast_launch_off_with_only_an_exit_hook(norms, monkeypatch):
    """A profiler may set only the exit hook: the direct launch would skip it, so it is off then too."""
    from triton import knobs

    fl = norms._fastlaunch
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    for hook in (print, type("Chain", (), {"calls": [print]})()):
        monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hook)
        assert not fl._hooks_off()
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", type("Chain", (), {"calls": []})())
    assert fl._hooks_off()


def test_eager_mode_is_inference_under_no_grad(norms):
    """Under ``torch.no_grad`` a module's parameters (requires_grad) need no gradient: ``eager_mode`` is IMPL, the
    plan-keeping fast paths run (``inference``); with grad mode on the same call is AUTOGRAD."""
    d = norms._dispatch
    x, w = torch.randn(3, 16), torch.nn.Parameter(torch.randn(16))
    with torch.no_grad():
        assert d.eager_mode((x, w, None)) == d.IMPL and d.inference((x, w, None))
        assert d.eager_mode((x.requires_grad_(), w)) == d.IMPL
    assert d.eager_mode((x, w, None)) == d.AUTOGRAD and not d.inference((x, w, None))
    assert d.eager_mode((x.detach(), w.detach(), None)) == d.IMPL


def test_plan_cache_drops_the_oldest(norms, monkeypatch):
    """A full PlanCache makes room for a new plan by dropping the oldest, so signatures seen later still get plans."""
    cache = norms._fastlaunch.PlanCache()
    monkeypatch.setattr(cache, "MAX_PLANS", 3)
    for key in "abcd":
        assert cache.add(key, key.upper()) == key.upper()
    assert list(cache.items()) == [("b", "B"), ("c", "C"), ("d", "D")]


def test_plan_cache_adds_from_threads(norms, monkeypatch):
    """Threads adding plans to one full PlanCache at once (a server's request threads over growing shapes): no
    KeyError from two evictions of one oldest key, and the cache stays at its bound with the newest plans."""
    import threading

    cache = norms._fastlaunch.PlanCache()
    monkeypatch.setattr(cache, "MAX_PLANS", 8)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    errors = []

    def add_many(t):
        try:
            for i in range(20000):
                cache.add((t, i), i)
        except Exception as err:  # noqa: BLE001 (recorded, asserted below)
            errors.append(err)

    try:
        threads = [threading.Thread(target=add_many, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(cache) == 8 and all(i >= 20000 - 8 for _, i in cache)


@pytest.mark.gpu
def test_fast_launch_equals_triton_launch_across_alignments(norms, device):
    """Alternate aligned / unaligned inputs and widths so cached launches meet every key; each result
    equals the fp64 reference (a kernel specialised for aligned pointers run on an unaligned one
    would read wrong vectors)."""
    if device != "cuda":
        pytest.skip("the direct launch exists on GPUs only (the interpreter takes Triton's path)")
    store = torch.randn(40 * 801 + 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(800, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        for offset, N in ((0, 800), (1, 800), (3, 799), (8, 800), (0, 16), (1, 1)):
            x = store[offset: offset + 40 * N].view(40, N)
            y = norms.rms_norm(x, w[:N], eps=1e-6)
            assert_close_ref(y, rms_ref(x.double(), w[:N].double()), ulps=2)
            layer = norms.rms_norm(x, w[:N], eps=1e-6, cast_dtype=x.dtype, torch_order="mean")
            assert torch.equal(layer, w[:N] * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype))


@pytest.mark.parametrize("fn", ["rms_norm", "layer_norm", "add_rms_norm"])
def test_eager_autograd_equals_the_registered_op(norms, device, fn):
    """Eager training runs a torch.autograd.Function built from the op's own formula; under a
    dispatch mode the registered op runs. Outputs and every gradient are the same bits."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x0 = rand((7, 97), torch.float32, device)
    r0 = rand((7, 97), torch.float32, device)
    w0 = rand((97,), torch.float32, device)
    dy = rand((7, 97), torch.float32, device)

    graph = []

    def run():
        x, r, w = (t.clone().requires_grad_() for t in (x0, r0, w0))
        if fn == "add_rms_norm":
            y, h = norms.add_rms_norm(x, r, w)
            graph.append(type(y.grad_fn).__name__)
            (y * dy).sum().backward(retain_graph=True)
            (h * dy).sum().backward()
        else:
            y = getattr(norms, fn)(x, w)
            graph.append(type(y.grad_fn).__name__)
            y.backward(dy)
        return y.detach(), x.grad, w.grad, r.grad

    eager = run()
    with Through():
        op = run()
    assert "EagerAutograd" in graph[0] and "EagerAutograd" not in graph[1], graph
    assert all(a is not None for a in eager[:3])
    for a, b in zip(eager, op):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("fn, options", [
    ("rms_norm", {}), ("rms_norm", {"torch_order": "mean", "cast_dtype": torch.float32}),
    ("rms_norm", {"torch_order": "fused"}), ("rms_norm", {"out_dtype": torch.float16, "bias": True}),
    ("rms_norm", {"weight_offset": 1.0, "no_weight_grad": True}), ("rms_norm", {"no_weight": True}),
    ("layer_norm", {"bias": True}), ("layer_norm", {"torch_order": "fused", "bias": True}),
    ("layer_norm", {"no_weight_grad": True}), ("layer_norm", {"no_weight": True})])
def test_planned_eager_training_equals_the_op(norms, device, fn, options):
    """Plain eager training of rms_norm / layer_norm runs a planned launch per call signature (host time); its
    output and every gradient equal the registered op's bits (under a dispatch mode), in each summation order and
    with bias, an output dtype, a weight offset, a weight without gradient and no weight; the second call reuses
    the plan."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    options = dict(options)
    out_dtype = options.pop("out_dtype", None)
    no_weight, frozen = options.pop("no_weight", False), options.pop("no_weight_grad", False)
    bias = rand((131,), torch.float32, device) if options.pop("bias", False) else None
    x0, w0 = rand((13, 131), torch.float32, device), rand((131,), torch.float32, device)
    dy = rand((13, 131), out_dtype or torch.float32, device)

    def run():
        x = x0.clone().requires_grad_()
        w = None if no_weight else w0.clone().requires_grad_(not frozen)
        b = None if bias is None else bias.clone().requires_grad_()
        if out_dtype is not None:
            options["out_dtype"] = out_dtype
        y = getattr(norms, fn)(x, w, b, 1e-5, **options)
        y.backward(dy)
        return type(y.grad_fn).__name__, y.detach(), x.grad, None if w is None else w.grad, None if b is None else b.grad

    plans = sys.modules[getattr(norms, fn).__module__]._TRAIN_PLANS
    before = len(plans)
    planned = [run()]
    after_first = len(plans)
    planned.append(run())
    assert len(plans) == after_first <= before + 1  # one plan per signature (a repeated parametrisation may have it)
    with Through():
        op = run()
    assert all("EagerAutograd" in p[0] for p in planned) and "EagerAutograd" not in op[0], (planned, op[0])
    assert planned[0][2] is not None and (frozen or no_weight or planned[0][3] is not None)
    for p in planned:
        for a, b in zip(p[1:], op[1:]):
            assert (a is None and b is None) or torch.equal(a, b)
    assert planned[0][1].dtype == (out_dtype or torch.float32)


@pytest.mark.parametrize("fn", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("grad", ["contiguous", "expanded", "transposed", "permuted", "half"])
def test_planned_eager_backward_takes_any_upstream_gradient(norms, device, fn, grad):
    """The planned training backward (one plan per upstream gradient's signature) gives the op's bits for an
    expanded (stride-0) gradient, a transposed one, one whose rows do not collapse (the general path copies it),
    and one of another dtype; twice, so the second call runs the kept plan."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x0 = rand((6, 5, 67), torch.float32, device) if grad == "permuted" else rand((23, 67), torch.float32, device)
    w0, b0 = rand((67,), torch.float32, device), rand((67,), torch.float32, device)
    dy = {"contiguous": lambda: rand(x0.shape, torch.float32, device),
          "expanded": lambda: rand((67,), torch.float32, device).expand(x0.shape),
          "transposed": lambda: rand((67, 23), torch.float32, device).t(),
          "permuted": lambda: rand((5, 6, 67), torch.float32, device).transpose(0, 1),
          "half": lambda: rand(x0.shape, torch.float16, device)}[grad]()
    out_dtype = {"out_dtype": torch.float16} if grad == "half" and fn == "rms_norm" else {}

    def run():
        x, w, b = (t.clone().requires_grad_() for t in (x0, w0, b0))
        y = getattr(norms, fn)(x, w, b, 1e-5, **out_dtype)
        if grad == "half" and fn == "layer_norm":
            y = y.half()
        y.backward(dy)
        return type(y.grad_fn).__name__, x.grad, w.grad, b.grad

    planned = [run(), run()]
    with Through():
        op = run()
    assert "EagerAutograd" not in op[0]
    for p in planned:
        for a, b in zip(p[1:], op[1:]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fn", ["rms_norm", "layer_norm"])
def test_planned_eager_backward_without_a_gradient_for_y_and_under_saved_tensor_hooks(norms, device, fn):
    """A backward in which y gets no gradient (a Function that returns None for it) gives zeros for the weight, as
    the op does; a saved-tensor hook that unpacks x at another address alignment gets a backward plan of its own
    (the plan's launch is specialised on alignment) and the op's bits."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Through(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Drop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            return None

    x0, w0 = rand((9, 37), torch.float32, device), rand((37,), torch.float32, device)
    dy = rand((9, 37), torch.float32, device)

    def unaligned(t):  # the same values at a 4-byte offset from a 16-byte boundary
        if t.dim() != 2:
            return t
        store = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        view = store[1:].view(t.shape)
        view.copy_(t)
        return view

    def run(hook):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        if hook == "drop":
            (Drop.apply(getattr(norms, fn)(x, w)) + x).sum().backward()
        else:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unaligned if hook else (lambda t: t)):
                y = getattr(norms, fn)(x, w)
            y.backward(dy)
        return x.grad, w.grad

    plans = sys.modules[getattr(norms, fn).__module__]._TRAIN_PLANS
    for hook in ("drop", False, True):
        got = [run(hook), run(hook)]
        with Through():
            want = run(hook)
        for g in got:
            assert all(torch.equal(a, b) for a, b in zip(g, want)), hook
    assert torch.equal(run("drop")[1], torch.zeros_like(w0))
    backward_keys = [k for plan in plans.values() if isinstance(plan, tuple)
                     for k in (plan[-1][2] if fn == "rms_norm" else plan[-1])]
    aligned = {k[3][3] for k in backward_keys if len(k) > 3 and k[3][1] == (9, 37)}  # x's address modulo 16 in the keys
    assert {0, 4} <= aligned


def test_planned_eager_training_keeps_every_check(norms, device):
    """The training plan validates like the general path: a call that differs from a planned one in an argument
    is validated again."""
    x = rand((3, 16), torch.float32, device).requires_grad_()
    w = rand((16,), torch.float32, device)
    for _ in range(2):
        norms.rms_norm(x, w, eps=1e-6)
    with pytest.raises(ValueError, match="eps"):
        norms.rms_norm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="weight must have shape"):
        norms.rms_norm(x, w[:8], eps=1e-6)
    with pytest.raises(ValueError, match="torch_order"):
        norms.rms_norm(x, w, eps=1e-6, torch_order="sideways")


def test_inference_plan_keeps_every_check(norms, device):
    """Plain inference keeps one validated plan per call signature: a call that differs from a planned one in
    any argument is validated again (the same errors as the general path), and an unhashable argument is
    named, not reported as unhashable."""
    x = rand((3, 16), torch.float32, device)
    w = rand((16,), torch.float32, device)
    with torch.no_grad():
        for _ in range(2):
            y = norms.rms_norm(x, w, eps=1e-6, torch_order="mean")
        assert torch.equal(y, norms.rms_norm(x, w.clone().requires_grad_(), eps=1e-6, torch_order="mean"))
        with pytest.raises(ValueError, match="eps"):
            norms.rms_norm(x, w, eps=-1.0, torch_order="mean")
        with pytest.raises(TypeError, match="torch_order"):
            norms.rms_norm(x, w, eps=1e-6, torch_order=["mean"])
        with pytest.raises(ValueError, match="weight must have shape"):
            norms.rms_norm(x, w[:8], eps=1e-6, torch_order="mean")
        with pytest.raises(TypeError, match="weight must have dtype"):
            norms.rms_norm(x, w.to(torch.float64), eps=1e-6, torch_order="mean")
        with pytest.raises(TypeError, match="eps"):
            norms.rms_norm(x, w, eps=torch.tensor(1e-6), torch_order="mean")
        with pytest.raises(TypeError, match="weight_offset"):
            norms.rms_norm(x, w, eps=1e-6, weight_offset=False, torch_order="mean")
