"""triton-attention: flash attention and rotary embeddings against fp64 PyTorch and the HF functions.

The package is loaded by Hub name through the ``attention`` fixture (conftest), as users load it;
on CPU the kernels run under the Triton interpreter with tiles of 16, so the tiny shapes here
(S <= 64, D <= 64) still cross several key/query blocks, ragged tails and the causal diagonal.

Tolerances: the kernels accumulate in fp32 and round P (and dS) to the input dtype before their
matmuls, as FlashAttention-2 does; an output element is a convex combination of v rows, so its
error is a few ulps of the input dtype times max|v| (``TOL``). Under the interpreter bf16 values
are truncated instead of rounded (conftest), hence the wider bf16 bound. fp32 inputs use IEEE fp32
dot products: 1e-5 relative.
"""


import contextlib
import copy
import inspect
import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 4e-2}
GRAD_TOL = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 8e-2}


def rand(*shape, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def ref_attention(q, k, v, mask=None, causal=False, scale=None, layout="bhsd"):
    """fp64 SDPA (math): GQA via enable_gqa, causal folded into the mask when both are given."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = q.double(), k.double(), v.double()
    m = mask
    if m is not None and m.dtype != torch.bool:
        m = m.double()
    if causal and m is not None:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        m = m.masked_fill(~keep, float("-inf")) if m.dtype != torch.bool else (m & keep)
        causal = False
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2) if layout == "bshd" else o


def assert_close(actual, expected64, tol, what=""):
    assert actual.shape == expected64.shape, (what, actual.shape, expected64.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual.double() - expected64).abs().max().item()
    bound = tol * max(expected64.abs().max().item(), 1.0)
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def make_qkv(B, Hq, Hk, Sq, Sk, D, dtype, device, layout="bhsd", Dv=None, grad=False):
    Dv = Dv or D
    shp = (lambda h, s, d: (B, s, h, d)) if layout == "bshd" else (lambda h, s, d: (B, h, s, d))
    q, k, v = rand(*shp(Hq, Sq, D), dtype=dtype, device=device), rand(*shp(Hk, Sk, D), dtype=dtype, device=device), \
        rand(*shp(Hk, Sk, Dv), dtype=dtype, device=device)
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v


@contextlib.contextmanager
def counted_plans(flash, module, name):
    """Counts the calls of ``module.<name>`` (a plan builder) while the forward and backward plans start empty (a plan
    of an earlier call would skip the builder); the earlier plans come back afterwards, and plans built meanwhile
    (with switches or configs a test set) are dropped."""
    calls, original = [], getattr(module, name)
    saved = flash._FWD_PLANS, flash._BWD_PLANS
    setattr(module, name, lambda *a: calls.append(1) or original(*a))
    flash._FWD_PLANS, flash._BWD_PLANS = type(saved[0])(), type(saved[1])()
    try:
        yield calls
    finally:
        setattr(module, name, original)
        flash._FWD_PLANS, flash._BWD_PLANS = saved


# (B, Hq, Hk, Sq, Sk, D, causal, layout): MHA/GQA/MQA, prime and ragged lengths, padded head dims
FWD_CASES = [
    (2, 4, 4, 37, 37, 32, False, "bhsd"),
    (1, 4, 2, 45, 45, 64, True, "bhsd"),
    (2, 3, 1, 17, 29, 16, False, "bshd"),
    (1, 2, 2, 53, 31, 24, True, "bshd"),  # Sq > Sk, D padded 24 -> 32
    (1, 2, 1, 1, 41, 40, False, "bhsd"),  # one query (decode)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", FWD_CASES)
def test_flash_forward(attention, device, case, dtype):
    B, Hq, Hk, Sq, Sk, D, causal, layout = case
    torch.manual_seed(hash((case, str(dtype))) % 2**31)
    q, k, v = make_qkv(B, Hq, Hk, Sq, Sk, D, dtype, device, layout)
    o = attention.flash_attention(q, k, v, causal=causal, layout=layout)
    assert o.dtype == dtype and o.shape == q.shape and o.is_contiguous()
    assert_close(o, ref_attention(q, k, v, causal=causal, layout=layout), TOL[dtype], "o")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", FWD_CASES[:4])
def test_flash_backward(attention, device, case, dtype):
    B, Hq, Hk, Sq, Sk, D, causal, layout = case
    torch.manual_seed(1 + hash((case, str(dtype))) % 2**31)
    q, k, v = make_qkv(B, Hq, Hk, Sq, Sk, D, dtype, device, layout, grad=True)
    o = attention.flash_attention(q, k, v, causal=causal, layout=layout)
    do = rand(*o.shape, dtype=dtype, device=device)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    r = ref_attention(q64, k64, v64, causal=causal, layout=layout)
    refs = torch.autograd.grad(r, (q64, k64, v64), do.double())
    for name, g, rg, t in zip(("dq", "dk", "dv"), grads, refs, (q, k, v)):
        assert g.dtype == dtype and g.shape == t.shape
        assert_close(g, rg, GRAD_TOL[dtype], name)


def test_flash_scale_and_value_dim(attention, device):
    torch.manual_seed(2)
    q, k, v = make_qkv(2, 2, 1, 19, 23, 32, torch.float32, device, Dv=48, grad=True)
    o = attention.flash_attention(q, k, v, scale=0.37)
    assert o.shape == (2, 2, 19, 48)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    r = ref_attention(q64, k64, v64, scale=0.37)
    assert_close(o, r, TOL[torch.float32], "o")
    do = torch.randn_like(o)
    for g, rg in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(r, (q64, k64, v64), do.double())):
        assert_close(g, rg, GRAD_TOL[torch.float32])


@pytest.mark.parametrize("kind", ["bool", "additive", "additive_grad", "bool_causal"])
def test_flash_masks(attention, device, kind):
    """Boolean (True = attend) and additive masks broadcast from [B, 1, Sq, Sk] / [Sq, Sk], with gradients."""
    torch.manual_seed(3)
    B, H, Sq, Sk, D = 2, 2, 21, 34, 32
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, torch.float32, device, grad=True)
    if kind.startswith("bool"):
        mask = torch.rand(Sq, Sk, device=device) > 0.3
    else:
        mask = rand(B, 1, Sq, Sk, device=device).requires_grad_(kind == "additive_grad")
    causal = kind == "bool_causal"
    o = attention.flash_attention(q, k, v, attn_mask=mask, causal=causal)
    m64 = mask if mask.dtype == torch.bool else mask.detach().double().requires_grad_(mask.requires_grad)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    r = ref_attention(q64, k64, v64, m64, causal=causal)
    assert_close(o, r, TOL[torch.float32], "o")
    do = torch.randn_like(o)
    ins = (q, k, v) + ((mask,) if mask.requires_grad else ())
    ins64 = (q64, k64, v64) + ((m64,) if mask.requires_grad else ())
    for g, rg in zip(torch.autograd.grad(o, ins, do), torch.autograd.grad(r, ins64, do.double())):
        assert_close(g, rg, GRAD_TOL[torch.float32])


def test_flash_value_dim_differs_over_many_key_blocks(attention, device):
    """Dv != D over more key blocks than one (k and v pointers step apart) with the default scale 1/sqrt(D)."""
    torch.manual_seed(50)
    q, k, v = make_qkv(2, 2, 1, 19, 67, 32, torch.float32, device, Dv=48, grad=True)
    o = attention.flash_attention(q, k, v)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    r = ref_attention(q64, k64, v64)
    assert_close(o, r, TOL[torch.float32], "o")
    do = torch.randn_like(o)
    for name, g, rg in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), do),
                           torch.autograd.grad(r, (q64, k64, v64), do.double())):
        assert_close(g, rg, GRAD_TOL[torch.float32], name)


def test_key_splits_more_than_one_combine_load(attention, device, monkeypatch):
    """70 key splits: more than the 64 partial results the combine loads at once, the largest score in the last."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    monkeypatch.setattr(flash, "FORCE_SPLITS", 70)
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())
    torch.manual_seed(51)
    q, k, v = make_qkv(1, 2, 1, 1, 1115, 16, torch.float32, device)
    k[0, 0, -8:] = 2 * q[0, 0, 0]
    o, lse = flash._attn_fwd_launch(q, k, v, None, 0.25, False, False, False)
    assert_close(o, ref_attention(q, k, v, scale=0.25), TOL[torch.float32], "o")
    want_lse = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) * 0.25, -1) / math.log(2)
    assert torch.allclose(lse.double(), want_lse, atol=1e-5)


def test_flash_fully_masked_rows_are_zero(attention, device):
    """A query whose every key is masked gives 0 (as SDPA's math backend) and zero gradients, never NaN."""
    torch.manual_seed(4)
    q, k, v = make_qkv(1, 2, 2, 18, 20, 16, torch.float32, device, grad=True)
    mask = torch.ones(18, 20, dtype=torch.bool, device=device)
    mask[3] = False
    mask[17] = False
    o = attention.flash_attention(q, k, v, attn_mask=mask)
    r = ref_attention(q, k, v, mask)
    assert_close(o, r, TOL[torch.float32])
    assert (o[:, :, 3] == 0).all() and (o[:, :, 17] == 0).all()
    dq, dk, dv = torch.autograd.grad(o.sum(), (q, k, v))  # also: a stride-0 upstream gradient
    assert torch.isfinite(dq).all() and (dq[:, :, 3] == 0).all()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    refs = torch.autograd.grad(ref_attention(q64, k64, v64, mask).sum(), (q64, k64, v64))
    for g, rg in zip((dq, dk, dv), refs):
        assert_close(g, rg, GRAD_TOL[torch.float32])


def test_flash_extreme_additive_mask(attention, device):
    """Additive mask entries near -FLT_MAX (transformers fills padding with finfo.min) weigh keys as SDPA does: a
    query whose visible keys all carry one gets their average (not a dropped row), -inf entries still drop keys,
    an entry of +FLT_MAX takes all the weight, a NaN or +inf entry gives NaN; gradients against fp64 softmax
    autograd.

    Known limitation: the backward recomputes probabilities from an fp32 logsumexp, which cannot hold log(n) next to
    -FLT_MAX, so a row whose every key sits at such a mask gets wrong gradients for a nonzero upstream gradient (as
    SDPA's fused CUDA kernels: with a -1e9 mask both are off by the same amount, H200 session 39). Such rows are
    padding queries, whose upstream gradient is zero; it is zero here too, and the other rows are checked."""
    torch.manual_seed(6)
    q, k, v = make_qkv(1, 2, 2, 5, 37, 16, torch.float32, device, grad=True)
    big = torch.finfo(torch.float32).min
    mask = torch.zeros(5, 37, device=device)
    mask[0] = big  # every key at -FLT_MAX: SDPA averages v
    mask[1, :20] = float("-inf")
    mask[1, 20:] = -3e38
    mask[2, ::2] = big  # the rest of row 2 wins outright
    mask[3, 5] = torch.finfo(torch.float32).max  # key 5 takes all the weight (it overflowed to +inf: a NaN row)
    o = attention.flash_attention(q, k, v, attn_mask=mask)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    # the math softmax in fp64 (fp64 SDPA on the CPU takes a fused kernel with the same logsumexp limitation)
    r = torch.softmax((q64 @ k64.transpose(-1, -2)) * q.shape[-1] ** -0.5 + mask.double(), -1) @ v64
    assert_close(o, r.detach(), TOL[torch.float32], "o")
    assert torch.allclose(o[:, :, 0], v.detach().mean(2), atol=1e-5)
    assert torch.equal(o[:, :, 3], v.detach()[:, :, 5])
    do = rand(*o.shape, device=device)
    do[:, :, :2] = 0  # rows 0 and 1: every visible key near -FLT_MAX, padding queries (the limitation above)
    for g, rg in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(r, (q64, k64, v64), do.double())):
        assert_close(g, rg, GRAD_TOL[torch.float32])
    mask[4, 7] = float("nan")
    mask[3, 9] = float("inf")  # as SDPA: softmax of +inf is NaN
    with torch.no_grad():
        o = attention.flash_attention(q, k, v, attn_mask=mask)
    assert torch.isnan(o[:, :, 3:]).all() and torch.isfinite(o[:, :, :3]).all()


def test_flash_strided_views_read_in_place(attention, device):
    """q, k, v sliced out of one fused projection (diffusers' [B, S, H, D] views) and a transposed output layout."""
    torch.manual_seed(5)
    B, S, H, D = 2, 27, 3, 16
    qkv = rand(B, S, 3 * H * D + 5, device=device)[..., 5:]
    q, k, v = (t.unflatten(-1, (H, D)) for t in qkv.split(H * D, dim=-1))
    assert not q.is_contiguous()
    o = attention.flash_attention(q, k, v, layout="bshd")
    assert_close(o, ref_attention(q, k, v, layout="bshd"), TOL[torch.float32])
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D] views of the same memory
    o2 = attention.flash_attention(qt, kt, vt, layout="bhsd", out_layout="bshd")
    assert o2.shape == (B, S, H, D) and o2.is_contiguous()
    assert torch.equal(o2, o)


def test_flash_zero_sizes(attention, device):
    q, k, v = make_qkv(0, 2, 2, 5, 5, 16, torch.float32, device)
    assert attention.flash_attention(q, k, v).shape == (0, 2, 5, 16)
    q, k, v = make_qkv(1, 2, 2, 5, 0, 16, torch.float32, device)
    assert (attention.flash_attention(q, k, v) == 0).all()  # no key at all: 0, as SDPA
    # no heads at all: an empty result and empty gradients, as SDPA (was: "query heads (0) must be a multiple...")
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 0, 0, 4, 5, 8, torch.float32, device))
    o = attention.flash_attention(q, k, v)
    assert o.shape == F.scaled_dot_product_attention(q, k, v).shape == (1, 0, 4, 8)
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    q, k, v = make_qkv(1, 2, 0, 4, 5, 8, torch.float32, device)
    with pytest.raises(ValueError, match=r"the query heads \(2\) must be a multiple of the key/value heads \(0\)"):
        attention.flash_attention(q, k, v)


def test_flash_errors(attention, device):
    q, k, v = make_qkv(1, 4, 2, 8, 8, 16, torch.float32, device)
    fa = attention.flash_attention
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        fa(q, k[:, :1].expand(1, 3, 8, 16), v[:, :1].expand(1, 3, 8, 16))
    with pytest.raises(TypeError, match="share one dtype"):
        fa(q, k.half(), v)
    with pytest.raises(TypeError, match="q must be"):
        fa(q.long(), k, v)
    with pytest.raises(ValueError, match="4-D"):
        fa(q[0], k, v)
    with pytest.raises(ValueError, match="same head dim"):
        fa(q, k[..., :8], v)
    with pytest.raises(ValueError, match="layout"):
        fa(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match="does not broadcast"):
        fa(q, k, v, attn_mask=torch.zeros(3, 8, device=device))
    with pytest.raises(TypeError, match="attn_mask"):
        fa(q, k, v, attn_mask=torch.zeros(8, 8, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="scale"):
        fa(q, k, v, scale=torch.tensor(0.1))
    with pytest.raises(ValueError, match="head dims"):
        big = rand(1, 1, 4, 272, device=device)
        fa(big, big, big)


def test_flash_opcheck(attention, device):
    """torch.library.opcheck of the registered forward/backward ops (schema, fake, autograd registration)."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(6)
    q, k, v = make_qkv(1, 2, 1, 9, 11, 16, torch.float32, device, grad=True)
    mask = rand(1, 1, 9, 11, device=device)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(flash._attn_fwd, (q, k, v, mask, 0.25, False, False, True), test_utils=utils)
    o, lse = flash._attn_fwd_impl(q, k, v, mask, 0.25, False, False, True)
    torch.library.opcheck(flash._attn_bwd, (torch.randn_like(o), q, k, v, mask, o, lse, 0.25, False, False, True, True),
                          test_utils=utils)


@pytest.mark.parametrize("functorch", [False, True], ids=["autograd", "functorch"])
@pytest.mark.parametrize("entry", ["flash", "rope", "transformers"])
def test_flash_second_derivative_raises(attention, device, entry, functorch):
    """A gradient of attention's gradient (create_graph=True, then a backward through dq / dk / dv) raises a
    RuntimeError naming flash_attention and SDPA's math backend, through every entry point and torch.func; the
    first backward with create_graph=True itself works."""
    torch.manual_seed(58)
    q, k, v = make_qkv(1, 2, 1, 9, 9, 16, torch.float32, device)
    cos, sin = rand(9, 16, device=device), rand(9, 16, device=device)
    attn = {"flash": lambda q, k, v: attention.flash_attention(q, k, v, causal=True),
            "rope": lambda q, k, v: attention.flash_attention_rope(q, k, v, cos, sin),
            "transformers": lambda q, k, v: attention.transformers_attention_forward(torch.nn.Module(), q, k, v,
                                                                                      None)[0]}[entry]
    message = r"flash_attention: a gradient of the gradient \(create_graph=True\) is not supported.*math backend"
    if functorch:
        def penalty(q, k, v):
            grads = torch.func.grad(lambda *a: attn(*a).sin().sum(), argnums=(0, 1, 2))(q, k, v)
            return sum((g * g).sum() for g in grads)
        with pytest.raises(RuntimeError, match=message):
            torch.func.grad(penalty)(q, k, v)
        return
    ins = [t.requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(attn(*ins).sin().sum(), ins, create_graph=True)
    assert all(g.requires_grad for g in grads)
    with pytest.raises(RuntimeError, match=message):
        torch.autograd.grad(sum((g * g).sum() for g in grads), ins)


def test_flash_create_graph_without_its_second_derivative(attention, device):
    """create_graph=True through attention where the second backward never differentiates attention's backward: a
    penalty on the gradient of a weight applied after attention (dq, dk, dv get a graph that the penalty does not
    use) gives the second-order gradients of fp64 SDPA (math)."""
    torch.manual_seed(59)
    q, k, v = make_qkv(1, 2, 1, 9, 11, 16, torch.float32, device)
    W = rand(16, 8, device=device)

    def second_order(attn, q, k, v, W):
        ins = [t.detach().clone().requires_grad_() for t in (q, k, v, W)]
        grads = torch.autograd.grad((attn(*ins[:3]) @ ins[3]).sin().sum(), ins, create_graph=True)
        return torch.autograd.grad((grads[3] ** 2).sum(), ins)

    got = second_order(lambda q, k, v: attention.flash_attention(q, k, v, causal=True), q, k, v, W)
    want = second_order(lambda q, k, v: ref_attention(q, k, v, causal=True), q.double(), k.double(), v.double(),
                        W.double())
    for name, g, r in zip(("q", "k", "v", "W"), got, want):
        assert_close(g, r, GRAD_TOL[torch.float32], name)


def test_rope_ops_opcheck(attention, device):
    """opcheck of the rotary ops and the fused RoPE attention op (schema, fake tensors, autograd registration)."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    rotary = sys.modules[attention.__name__ + ".rotary"]
    torch.manual_seed(18)
    x = rand(1, 7, 2, 16, device=device).requires_grad_(True)
    c, s = rand(7, 1, 16, device=device), rand(7, 1, 16, device=device)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(rotary._rope, (x, c, s, True, True), test_utils=utils)
    torch.library.opcheck(rotary._rope_bwd, (x, c, s, False, torch.float32), test_utils=utils)
    q, k, v = make_qkv(1, 2, 2, 7, 7, 16, torch.float32, device, "bshd", grad=True)
    torch.library.opcheck(flash._attn_rope_fwd, (q, k, v, c, s, None, 0.25, True, True, True, True), test_utils=utils)


@pytest.mark.slow
def test_flash_compile_fullgraph(attention, device):
    torch.manual_seed(7)
    q, k, v = make_qkv(1, 2, 1, 20, 20, 16, torch.float32, device, grad=True)

    def f(q, k, v):
        return attention.flash_attention(q, k, v, causal=True).sin().sum()

    out = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.allclose(out, f(q, k, v))
    out.backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    # the fused RoPE variant and the rotary op compile too
    c, s = rand(20, 16, device=device), rand(20, 16, device=device)

    def g(q, k, v):
        return (attention.flash_attention_rope(q, k, v, c, s, interleaved=True).sum()
                + attention.rotary_embedding(q, c, s).sum())

    out = torch.compile(g, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.allclose(out, g(q, k, v), rtol=1e-5, atol=1e-5)
    out.backward()


@pytest.mark.parametrize("warp_size", [32, 64])
def test_launch_configs_respect_thread_limit(attention, warp_size):
    for d, interp, es in itertools.product((16, 32, 64, 128, 256), (False, True), (2, 4)):
        f = attention.pick_fwd_config(d, interp, warp_size, es)
        b = attention.pick_bwd_config(d, interp, warp_size, es)
        assert f.num_warps * warp_size <= 1024 and b.num_warps * warp_size <= 1024
        assert b.dq_launch["num_warps"] * warp_size <= 1024
        assert min(f.block_m, f.block_n, b.block_m1, b.block_n1, b.block_m2, b.block_n2) >= 16


@pytest.mark.parametrize("args, message", [
    ((None, False), "head_dim must be an int >= 16"), (("128", False), "head_dim must be an int"),
    ((128.0, False), "head_dim must be an int"), ((True, False), "head_dim must be an int"),
    ((96, False), "head_dim must be a power of two"), ((512, False), r"power of two in \[16, 256\]"),
    ((128, "no"), "interpret must be a bool"),
    ((128, False, 48), "warp_size must be a power of two"), ((128, False, 32, 2.0), "element_size must be an int"),
])
def test_launch_config_pickers_refuse_bad_arguments(attention, args, message):
    # both took anything (None, strings, floats, a head dim of 96 or, later, 512) and returned a config
    for pick in (attention.pick_fwd_config, attention.pick_bwd_config):
        pick(128, False, 32, 2)  # cached: an equal key (2.0 == 2) must not return it unchecked
        with pytest.raises(ValueError, match=message):
            pick(*args)


def test_bwd_config_dq_launch(attention):
    """The dQ kernel takes the dK/dV kernel's warps and stages unless its own are given."""
    assert attention.BwdConfig(64, 64, 64, 64, 4, 2).dq_launch == {"num_warps": 4, "num_stages": 2}
    assert attention.BwdConfig(64, 128, 128, 64, 8, 2, 4, 3).dq_launch == {"num_warps": 4, "num_stages": 3}


# ----------------------------------------------------------------------------- rotary

ROPE_DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32, torch.float32),
               (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("dtypes", ROPE_DTYPES)
def test_apply_rotary_pos_emb_bit_exact_to_transformers(attention, device, dtypes):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    dt, cdt = dtypes
    torch.manual_seed(8)
    q, k = rand(2, 4, 7, 64, dtype=dt, device=device), rand(2, 2, 7, 64, dtype=dt, device=device)
    cos, sin = rand(2, 7, 64, dtype=cdt, device=device), rand(2, 7, 64, dtype=cdt, device=device)
    got = attention.apply_rotary_pos_emb(q, k, cos, sin)
    want = apply_rotary_pos_emb(q, k, cos, sin)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)
    # [B, S, H, D] with unsqueeze_dim=2
    got = attention.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    want = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("B,S", [(3, 1), (2, 7), (1, 5)])
def test_apply_rotary_pos_emb_keeps_eager_strides(attention, device, B, S):
    """q/k as transformers makes them (projection output viewed [B, S, H, D] and transposed), at decode (S = 1)
    and prefill: the outputs have eager's strides as well as its bits (a KV cache and SDPA after the swap
    then see the eager layout; round B on the H200: contiguous outputs changed SmolLM2's batch-64 decode)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(12)
    q = rand(B, S, 5 * 16, dtype=torch.float32, device=device).view(B, S, 5, 16).transpose(1, 2)
    k = rand(B, S, 3 * 16, dtype=torch.float32, device=device).view(B, S, 3, 16).transpose(1, 2)
    cos, sin = rand(B, S, 16, dtype=torch.float32, device=device), rand(B, S, 16, dtype=torch.float32, device=device)
    for layout in ("hf", "contiguous", "bshd"):
        qq, kk, dim = {"hf": (q, k, 1), "contiguous": (q.contiguous(), k.contiguous(), 1),
                       "bshd": (q.transpose(1, 2), k.transpose(1, 2), 2)}[layout]
        got = attention.apply_rotary_pos_emb(qq, kk, cos, sin, unsqueeze_dim=dim)
        want = apply_rotary_pos_emb(qq, kk, cos, sin, unsqueeze_dim=dim)
        for g, w in zip(got, want):
            assert g.stride() == w.stride() and torch.equal(g, w), (layout, g.stride(), w.stride())
    empty = q[:0]
    got = attention.apply_rotary_pos_emb(empty, k[:0], cos[:0], sin[:0])
    assert got[0].shape == empty.shape and got[0].stride() == apply_rotary_pos_emb(empty, k[:0], cos[:0], sin[:0])[0].stride()


def test_apply_rotary_pos_emb_one_launch_for_q_and_k(attention, device, monkeypatch):
    """Plain inference rotates q and k in one launch (the pair kernel), bit-exact to transformers also where q and
    k differ in dtype, heads and layout; each output keeps eager's strides; a new alignment makes a new plan."""
    import sys

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotary = sys.modules[attention.__name__ + ".rotary"]
    monkeypatch.setattr(rotary, "_PAIR_PLANS", type(rotary._PAIR_PLANS)())
    kernels = []
    original = rotary.FixedLaunch.__call__
    monkeypatch.setattr(rotary.FixedLaunch, "__call__", lambda self, args: kernels.append(self.kernel) or
                        original(self, args))
    torch.manual_seed(21)
    q = rand(2, 3, 5 * 16, dtype=torch.bfloat16, device=device).view(2, 3, 5, 16).transpose(1, 2)
    k = rand(2, 1, 3, 16, dtype=torch.float32, device=device)
    cos, sin = rand(2, 3, 16, dtype=torch.float32, device=device), rand(2, 3, 16, dtype=torch.float32, device=device)
    for qq in (q, q.contiguous(), q.contiguous()[:, 1:]):  # eager strides, contiguous, another head count
        with torch.no_grad():
            got = attention.apply_rotary_pos_emb(qq, k, cos, sin)
        want = apply_rotary_pos_emb(qq, k, cos, sin)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.stride() == w.stride() and torch.equal(g, w)
    assert kernels == [rotary._rope_pair_kernel] * 3 and len(rotary._PAIR_PLANS) == 3
    store = torch.empty(2 * 3 * 16 + 1, dtype=torch.float32, device=device)
    off = store[1:].view(2, 3, 16).copy_(cos)  # 4 bytes off: a plan of its own
    with torch.no_grad():
        got = attention.apply_rotary_pos_emb(q, k, off, sin)
    assert all(torch.equal(g, w) for g, w in zip(got, apply_rotary_pos_emb(q, k, cos, sin)))
    assert len(rotary._PAIR_PLANS) == 4
    # cos / sin broadcast in the last dim let q and k have other head dims: other tiles, so two launches
    kernels.clear()
    q6, k2 = rand(1, 2, 3, 6, device=device), rand(1, 1, 3, 2, device=device)
    c1, s1 = rand(1, 3, 1, device=device), rand(1, 3, 1, device=device)
    with torch.no_grad():
        got = attention.apply_rotary_pos_emb(q6, k2, c1, s1)
    assert all(torch.equal(g, w) for g, w in zip(got, apply_rotary_pos_emb(q6, k2, c1, s1)))
    assert kernels == [rotary._rope_kernel] * 2


def test_case11_rope_with_one_kv_head(attention, device):
    """Case 11: k (1, 1, 2, 128), q (1, 2, 2, 128): rotated k is right and the inputs are neither modified nor aliased."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(11)
    q = rand(1, 2, 2, 128, dtype=torch.bfloat16, device=device)
    k = rand(1, 1, 2, 128, dtype=torch.bfloat16, device=device)
    cos, sin = rand(1, 2, 128, dtype=torch.bfloat16, device=device), rand(1, 2, 128, dtype=torch.bfloat16, device=device)
    q0, k0 = q.clone(), k.clone()
    qe, ke = attention.apply_rotary_pos_emb(q, k, cos, sin)
    wq, wk = apply_rotary_pos_emb(q0, k0, cos, sin)
    assert torch.equal(ke, wk) and torch.equal(qe, wq)
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert ke.data_ptr() != k.data_ptr() and qe.data_ptr() != q.data_ptr()
    assert not torch.equal(ke, k)  # it did rotate


def test_rotary_interleaved_bit_exact_to_diffusers(attention, device):
    """Flux's apply_rotary_emb (pairs, fp32 math, [S, D] fp32 cos/sin) and Wan's pair formula, bit for bit."""
    from diffusers.models.embeddings import apply_rotary_emb

    torch.manual_seed(12)
    S, D = 13, 32
    x = rand(2, S, 3, D, dtype=torch.bfloat16, device=device)
    ang = torch.rand(S, D // 2, device=device) * 6
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    want = apply_rotary_emb(x, (cos, sin), sequence_dim=1)
    got = attention.rotary_embedding(x, cos[:, None], sin[:, None], interleaved=True, fp32_math=True)
    assert got.dtype == x.dtype and torch.equal(got, want)
    # Wan: x1 * cos - x2 * sin / x1 * sin + x2 * cos on pairs, fp32, stored into x's dtype
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[None, :, None, 0::2], sin[None, :, None, 1::2]
    wan = torch.empty_like(x)
    wan[..., 0::2] = x1 * c - x2 * s
    wan[..., 1::2] = x1 * s + x2 * c
    assert torch.equal(attention.rotary_embedding(x, cos[None, :, None], sin[None, :, None], interleaved=True,
                                                  fp32_math=True), wan)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_backward(attention, device, interleaved):
    torch.manual_seed(13)
    x = rand(2, 5, 3, 32, device=device).requires_grad_(True)
    cos, sin = rand(5, 1, 32, device=device), rand(5, 1, 32, device=device)
    y = attention.rotary_embedding(x, cos, sin, interleaved=interleaved, fp32_math=True)
    x64 = x.detach().double().requires_grad_(True)
    if interleaved:
        rot = torch.stack([-x64[..., 1::2], x64[..., 0::2]], -1).flatten(-2)
    else:
        rot = torch.cat([-x64[..., 16:], x64[..., :16]], -1)
    y64 = x64 * cos.double() + rot * sin.double()
    assert_close(y, y64, 1e-6)
    g = torch.randn_like(y)
    (gx,), (gx64,) = torch.autograd.grad(y, x, g), torch.autograd.grad(y64, x64, g.double())
    assert_close(gx, gx64, 1e-6)


@pytest.mark.parametrize("D", [6, 80, 96])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_head_dims_not_powers_of_two(attention, device, D, interleaved):
    """Head dims whose half is not a power of 2 (masked pair tiles): forward and backward against the fp64
    formula, odd row counts and a transposed [B, H, S, D] view of x (strided rows)."""
    torch.manual_seed(D + interleaved)
    x = rand(3, 7, 5, D, device=device).transpose(1, 2).requires_grad_(True)  # [3, 5, 7, D] view
    cos, sin = rand(1, 1, 7, D, device=device), rand(1, 1, 7, D, device=device)
    out = torch.full((3, 5, 7, D), float("nan"), device=device)
    out.copy_(attention.rotary_embedding(x, cos, sin, interleaved=interleaved, fp32_math=True))
    x64 = x.detach().double().requires_grad_(True)
    if interleaved:
        rot = torch.stack([-x64[..., 1::2], x64[..., 0::2]], -1).flatten(-2)
    else:
        rot = torch.cat([-x64[..., D // 2:], x64[..., :D // 2]], -1)
    y64 = x64 * cos.double() + rot * sin.double()
    assert_close(out, y64, 1e-6, "forward")
    y = attention.rotary_embedding(x, cos, sin, interleaved=interleaved, fp32_math=True)
    g = torch.randn_like(y)
    (gx,), (gx64,) = torch.autograd.grad(y, x, g), torch.autograd.grad(y64, x64, g.double())
    assert_close(gx, gx64, 1e-6, "backward")


def _rope_ref(x, cos, sin, interleaved):
    """The rotation in plain PyTorch: diffusers' pairs, or transformers' ``x * cos + rotate_half(x) * sin``."""
    if interleaved:
        rot = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    else:
        rot = torch.cat([-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("case", ["apply_bhsd", "apply_bshd", "interleaved_bshd", "apply_bf16_fp32_cos"])
def test_rotary_second_derivatives(attention, device, case):
    """create_graph=True (a gradient penalty sum(grad_q * v_q) + sum(grad_k * v_k) of a loss nonlinear in the rotated
    q and k): the second-order gradients of q and k, through the rotary backward op's own formula, and the third-order
    ones (the same penalty of those), against fp64 autograd through transformers' apply_rotary_pos_emb (or the
    interleaved formula); the second order also through torch.func."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(57)
    dt = torch.bfloat16 if case == "apply_bf16_fp32_cos" else torch.float32
    shape = (lambda h: (2, h, 5, 16)) if case in ("apply_bhsd", "apply_bf16_fp32_cos") else (lambda h: (2, 5, h, 16))
    q, k = rand(*shape(3), dtype=dt, device=device), rand(*shape(1), dtype=dt, device=device)
    if case == "interleaved_bshd":
        cos, sin = rand(5, 1, 16, device=device), rand(5, 1, 16, device=device)

        def ours(q, k):
            return tuple(attention.rotary_embedding(t, cos, sin, interleaved=True, fp32_math=True) for t in (q, k))

        def ref(q, k):
            return tuple(_rope_ref(t, cos.double(), sin.double(), True) for t in (q, k))
    else:
        dim = 2 if case == "apply_bshd" else 1
        cos, sin = rand(2, 5, 16, device=device), rand(2, 5, 16, device=device)

        def ours(q, k):
            return attention.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)

        def ref(q, k):
            return apply_rotary_pos_emb(q, k, cos.double(), sin.double(), unsqueeze_dim=dim)
    w = [rand(*t.shape, device=device) for t in (q, k)]  # the loss's weights
    v = [rand(*t.shape, dtype=dt, device=device) for t in (q, k)]  # the penalty's (exact in q's dtype)

    def loss(f, q, k):
        return sum((o.sin() * a.to(o.dtype)).sum() for o, a in zip(f(q, k), w))

    def penalty(grads):
        return sum((g * b.to(g.dtype)).sum() for g, b in zip(grads, v))

    def second_and_third_order(f, q, k):
        ins = [t.detach().clone().requires_grad_() for t in (q, k)]
        second = torch.autograd.grad(penalty(torch.autograd.grad(loss(f, *ins), ins, create_graph=True)), ins,
                                     create_graph=True)
        return (*second, *torch.autograd.grad(penalty(second), ins))

    def second_order_functorch(f, q, k):
        return torch.func.grad(lambda *ins: penalty(torch.func.grad(lambda *a: loss(f, *a), argnums=(0, 1))(*ins)),
                               argnums=(0, 1))(q, k)

    want = second_and_third_order(ref, q.double(), k.double())
    tol = 1e-2 if dt == torch.bfloat16 else 1e-5  # one rounding of the bf16 result
    for got in (second_and_third_order(ours, q, k), second_order_functorch(ours, q, k)):
        for name, g, r in zip(("q", "k", "q third order", "k third order"), got, want):
            assert g.dtype == dt
            assert_close(g, r, tol, name)


def test_rotary_errors(attention, device):
    x = rand(1, 2, 3, 8, device=device)
    c = rand(3, 8, device=device)
    with pytest.raises(ValueError, match="even"):
        attention.rotary_embedding(x[..., :7], c[..., :7], c[..., :7])
    with pytest.raises(ValueError, match="does not broadcast"):
        attention.rotary_embedding(x, c[:2], c)
    with pytest.raises(ValueError, match="requires grad"):
        attention.rotary_embedding(x, c.requires_grad_(True), c.detach())
    with pytest.raises(TypeError, match="must be torch.float16"):
        attention.rotary_embedding(x.long(), c.detach(), c.detach())
    # None for a tensor (plain inference read its shape first: AttributeError)
    c = c.detach()
    for args in ((None, c, c), (x, None, c), (x, c, None)):
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            attention.rotary_embedding(*args)
    q = x.transpose(1, 2)
    for args in ((None, q, c, c), (q, None, c, c), (q, q, None, c), (q, q, c, None)):
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            attention.apply_rotary_pos_emb(*args)


def _skip_without_kernelizable_rotary(device):
    """The GPU host's own transformers may attach no kernelizable ``apply_rotary_pos_emb`` (its
    ``use_kernelized_func`` is then a no-op): skip there; on the CPU (``make setup``'s versions) it must be active."""
    from transformers.models.llama import modeling_llama

    if not hasattr(modeling_llama.apply_rotary_pos_emb, "forward") and device != "cpu":
        pytest.skip("transformers' use_kernelized_func decorator is inactive in this environment")


def test_rotary_layer_kernelize_in_llama(attention, device):
    """The RotaryPosEmb layer through kernels.kernelize swaps Llama's apply_rotary_pos_emb: same logits bit for bit."""
    _skip_without_kernelizable_rotary(device)
    import kernels
    from kernels import LocalLayerRepository, Mode
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    torch.manual_seed(14)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(device)
    ids = torch.randint(0, 64, (2, 11)).to(device)
    with torch.no_grad():
        before = model(ids).logits
    func = modeling_llama.apply_rotary_pos_emb
    original = func.forward
    path = __import__("pathlib").Path(__import__("sys").modules[attention.__name__].__file__).parent
    repo = LocalLayerRepository(repo_path=path, layer_name="RotaryPosEmb")
    calls = []
    try:
        with kernels.use_kernel_mapping({"rotary_pos_emb": {torch.device(device).type: repo}}, inherit_mapping=False):
            kernels.kernelize(func, mode=Mode.INFERENCE, device=torch.device(device).type, use_fallback=False)
        assert func.forward is not original
        inner = func.forward
        func.forward = lambda *a, **kw: calls.append(1) or inner(*a, **kw)
        with torch.no_grad():
            after = model(ids).logits
    finally:
        func.forward = original
    assert len(calls) == 2 and torch.equal(after, before)


def test_transformers_attention_interface(attention, device):
    """attn_implementation="triton" (registered function + sdpa masks) matches SDPA: causal, padding, GQA."""
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("triton", attention.transformers_attention_forward)
    AttentionMaskInterface.register("triton", sdpa_mask)
    torch.manual_seed(15)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, max_position_embeddings=64, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval().to(device)
    ids = torch.randint(0, 64, (2, 13)).to(device)
    pad = torch.ones(2, 13, dtype=torch.long, device=device)
    pad[1, :4] = 0  # left padding in the second row
    with torch.no_grad():
        ref_causal = model(ids).logits
        ref_pad = model(ids, attention_mask=pad).logits
        model.set_attn_implementation("triton")
        assert model.config._attn_implementation == "triton"
        got_causal = model(ids).logits
        got_pad = model(ids, attention_mask=pad).logits
    tol = 1e-4 if device == "cpu" else 3e-3  # fp32 tl.dot runs in TF32 on NVIDIA GPUs (documented)
    assert_close(got_causal, ref_causal.double(), tol, "causal")
    assert_close(got_pad[1, 4:], ref_pad[1, 4:].double(), tol, "padded")
    assert_close(got_pad[0], ref_pad[0].double(), tol, "unpadded row")


def test_transformers_attention_under_autocast_computes_in_the_autocast_dtype(attention, device):
    """Under ``torch.autocast`` transformers' SDPA path casts fp32 q, k, v and a float mask to the autocast dtype; the
    registered function does the same: bf16 output, within bf16 tolerance of SDPA's under the same autocast."""
    torch.manual_seed(16)
    kind = torch.device(device).type
    q, k, v = rand(1, 4, 5, 16, device=device), rand(1, 2, 7, 16, device=device), rand(1, 2, 7, 16, device=device)
    mask = torch.zeros(1, 1, 5, 7, device=device).masked_fill(torch.rand(1, 1, 5, 7, device=device) > 0.7, -1e4)
    with torch.autocast(kind, dtype=torch.bfloat16):
        out, _ = attention.transformers_attention_forward(torch.nn.Module(), q, k, v, mask)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert_close(out, ref.transpose(1, 2).double(), TOL[torch.bfloat16])


def test_transformers_attention_single_query_is_not_causal(attention, device):
    """A decode step (one query, no mask) attends to every key, though the module is causal (as SDPA's path)."""
    torch.manual_seed(53)

    class Attn(torch.nn.Module):
        is_causal = True

    q, k, v = rand(2, 4, 1, 16, device=device), rand(2, 2, 9, 16, device=device), rand(2, 2, 9, 16, device=device)
    out, _ = attention.transformers_attention_forward(Attn(), q, k, v, None)
    assert_close(out, ref_attention(q, k, v).transpose(1, 2), TOL[torch.float32])


def test_transformers_attention_autocast_casts_a_float_mask(attention, device):
    """Under autocast the mask is cast with q, k, v (values near 100: bf16's spacing there is 0.5)."""
    torch.manual_seed(54)
    kind = torch.device(device).type
    q, k, v = rand(1, 4, 5, 16, device=device), rand(1, 2, 7, 16, device=device), rand(1, 2, 7, 16, device=device)
    mask = 100 + 2 * torch.randn(1, 1, 5, 7, device=device)
    with torch.autocast(kind, dtype=torch.bfloat16):
        out, _ = attention.transformers_attention_forward(torch.nn.Module(), q, k, v, mask)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_close(out, ref.transpose(1, 2).double(), TOL[torch.bfloat16])


def test_transformers_attention_autocast_keeps_a_bool_mask(attention, device):
    """Under autocast only floating tensors are cast: a boolean mask (True: attend) stays boolean, as in SDPA's path,
    rather than becoming an additive mask of ones and zeros."""
    torch.manual_seed(55)
    kind = torch.device(device).type
    q, k, v = rand(1, 4, 5, 16, device=device), rand(1, 2, 7, 16, device=device), rand(1, 2, 7, 16, device=device)
    mask = torch.rand(1, 1, 5, 7, device=device) > 0.5
    mask[..., 0] = True  # every query attends to at least one key
    with torch.autocast(kind, dtype=torch.bfloat16):
        out, _ = attention.transformers_attention_forward(torch.nn.Module(), q, k, v, mask)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert_close(out, ref.transpose(1, 2).double(), TOL[torch.bfloat16])


def test_transformers_attention_refuses_unsupported(attention, device):
    q = rand(1, 2, 4, 16, device=device)
    mod = torch.nn.Module()
    with pytest.raises(ValueError, match="dropout"):
        attention.transformers_attention_forward(mod, q, q, q, None, dropout=0.1)
    with pytest.raises(ValueError, match="softcap"):
        attention.transformers_attention_forward(mod, q, q, q, None, softcap=30.0)
    for i, name in enumerate(("query", "key", "value")):  # AttributeError / IndexError before
        args = [q, q, q]
        args[i] = None
        with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor"):
            attention.transformers_attention_forward(mod, *args, None)
        args[i] = q[0]
        with pytest.raises(ValueError, match=f"{name} must be 4-D"):
            attention.transformers_attention_forward(mod, *args, None)
    # flash_attention's checks, told in this function's argument names (they said q, attn_mask, scale)
    with pytest.raises(TypeError, match=r"^triton attention: query must be torch.float16.*got torch.float64$"):
        attention.transformers_attention_forward(mod, q.double(), q, q, None)
    with pytest.raises(TypeError, match=r"^triton attention: query, key and value must share one dtype"):
        attention.transformers_attention_forward(mod, q, q.half(), q, None)
    with pytest.raises(TypeError, match=r"^triton attention: attention_mask must be boolean"):
        attention.transformers_attention_forward(mod, q, q, q, torch.zeros(4, 4, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match=r"^triton attention: scaling must be a real number.*got str$"):
        attention.transformers_attention_forward(mod, q, q, q, None, scaling="x")
    with pytest.raises(ValueError, match=r"^triton attention: head dims must be in \[1, 256\], got query/key 16"):
        attention.transformers_attention_forward(mod, q, q, rand(1, 2, 4, 300, device=device), None)
    out, w = attention.transformers_attention_forward(mod, q, q, q, None, scaling=0.5)
    assert w is None and out.shape == (1, 4, 2, 16)
    assert_close(out, ref_attention(q, q, q, causal=True, scale=0.5).transpose(1, 2), TOL[torch.float32])


def test_flash_attention_rope_per_batch_positions(attention, device):
    """cos / sin of shape [B, 1, S, D] (each sample its own positions), forward and backward."""
    torch.manual_seed(52)
    B, H, S, D = 2, 2, 21, 16
    q, k, v = make_qkv(B, H, H, S, S, D, torch.float32, device, grad=True)
    pos = torch.arange(S, device=device)[None, :] + torch.tensor([[0], [5]], device=device)
    ang = pos[..., None] * (0.5 ** torch.arange(D // 2, device=device))
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    o = attention.flash_attention_rope(q, k, v, cos, sin, causal=True)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    want = attention.flash_attention(attention.rotary_embedding(q2, cos, sin, fp32_math=True),
                                     attention.rotary_embedding(k2, cos, sin, fp32_math=True), v2, causal=True)
    assert_close(o, want.double(), 1e-6, "o")
    do = torch.randn_like(o)
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(o, (q, k, v), do),
                          torch.autograd.grad(want, (q2, k2, v2), do)):
        assert_close(g, w.double(), 1e-5, name)


# ----------------------------------------------------------------------------- fused RoPE attention

@pytest.mark.parametrize("interleaved,layout,dtype", [(True, "bshd", torch.float32), (False, "bhsd", torch.float32),
                                                      (True, "bshd", torch.bfloat16)])
def test_flash_attention_rope_matches_rope_then_attention(attention, device, interleaved, layout, dtype):
    """q rotated on load + k rotated once == rotary_embedding on both, then flash_attention; gradients too."""
    torch.manual_seed(16)
    B, H, Hk, S, D = 1, 4, 2, 29, 32
    q, k, v = make_qkv(B, H, Hk, S, S, D, dtype, device, layout, grad=True)
    ang = torch.rand(S, D // 2, device=device) * 6
    rep = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat([t, t], -1))
    cos, sin = rep(ang.cos()), rep(ang.sin())
    if layout == "bshd":
        cos, sin = cos[:, None], sin[:, None]  # [S, 1, D]
    o = attention.flash_attention_rope(q, k, v, cos, sin, interleaved=interleaved, causal=True, layout=layout)
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    rq = attention.rotary_embedding(q2, cos, sin, interleaved=interleaved, fp32_math=True)
    rk = attention.rotary_embedding(k2, cos, sin, interleaved=interleaved, fp32_math=True)
    want = attention.flash_attention(rq, rk, v2, causal=True, layout=layout)
    tol = TOL[dtype] if dtype != torch.float32 else 1e-6
    assert_close(o, want.double(), tol, "o")
    do = rand(*o.shape, dtype=dtype, device=device)
    grads = torch.autograd.grad(o, (q, k, v), do)
    wants = torch.autograd.grad(want, (q2, k2, v2), do)
    for name, g, w in zip(("dq", "dk", "dv"), grads, wants):
        assert_close(g, w.double(), GRAD_TOL[dtype] if dtype != torch.float32 else 1e-5, name)
    # and against fp64 math end to end (fp32 only)
    if dtype == torch.float32:
        def rot(x):
            x = x.double()
            if interleaved:
                r = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
            else:
                r = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
            return x * cos.double() + r * sin.double()
        assert_close(o, ref_attention(rot(q.detach()), rot(k.detach()), v.detach(), causal=True, layout=layout),
                     TOL[torch.float32], "o vs fp64")


def test_flash_attention_rope_docstring_cos_shapes(attention, device):
    """Every cos / sin shape the docstring gives as an example for a layout runs and rotates by position: the output
    equals fp64 RoPE of q and k followed by fp64 attention. (The docstring listed [S, D] for [B, S, H, D], which
    broadcasts over the heads: a ValueError, or a rotation by head index where S == H.)"""
    doc = " ".join(inspect.getdoc(attention.flash_attention_rope).split())
    examples = re.findall(r"((?:\[[BS1, D]+\](?: \(\w+\))?(?: or | / )?)+) for (\[B, [HS], [HS], D\])", doc)
    assert {target for _, target in examples} == {"[B, H, S, D]", "[B, S, H, D]"}, examples
    torch.manual_seed(61)
    B, H, S, D = 2, 3, 5, 8
    sizes = {"B": B, "S": S, "D": D, "1": 1}
    ang = torch.rand(B, S, D // 2, device=device) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # [B, S, D]: per sample and position
    for shapes, target in examples:
        layout = "bshd" if target == "[B, S, H, D]" else "bhsd"
        for shape in re.findall(r"\[([BS1, D]+)\]", shapes):
            dims = [d.strip() for d in shape.split(",")]
            c, s = (cos, sin) if "B" in dims else (cos[:1], sin[:1])
            q, k, v = make_qkv(B, H, H, S, S, D, torch.float32, device, layout)
            view = [sizes[d] for d in dims]
            o = attention.flash_attention_rope(q, k, v, c.reshape(view), s.reshape(view), layout=layout)
            head = 2 if layout == "bshd" else 1  # where the heads go in [B, S, D] -> q's layout
            cf, sf = (t.double().unsqueeze(head) for t in (c, s))

            def rot(x):
                x = x.double()
                return x * cf + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sf

            assert_close(o, ref_attention(rot(q), rot(k), v, layout=layout), TOL[torch.float32],
                         f"[{shape}] for {target}")


def test_flash_attention_rope_errors(attention, device):
    q, k, v = make_qkv(1, 2, 2, 8, 9, 16, torch.float32, device)
    c = torch.ones(8, 16, device=device)
    with pytest.raises(ValueError, match="same sequence length"):
        attention.flash_attention_rope(q, k, v, c, c)
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, device)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention.flash_attention_rope(q, k, v, c[:5], c[:5])


def test_integration_register_and_kernelize_rotary(attention, installed, device):
    """triton_collection.integrations.transformers_attention: register() by Hub name, kernelize_rotary() on Llama."""
    _skip_without_kernelizable_rotary(device)
    from kernels import Mode
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    from triton_collection.integrations import transformers_attention as ta

    assert ta.register("triton") == "triton"
    with pytest.raises(ValueError, match="own attention"):
        ta.register("sdpa")
    torch.manual_seed(17)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(device)
    ids = torch.randint(0, 64, (1, 9)).to(device)
    with torch.no_grad():
        before = model(ids).logits
    func = modeling_llama.apply_rotary_pos_emb
    original = func.forward
    try:
        assert ta.kernelize_rotary(model, mode=Mode.INFERENCE, device=torch.device(device).type) == 1
        assert func.forward is not original
        with torch.no_grad():
            model.set_attn_implementation("triton")
            after = model(ids).logits
    finally:
        func.forward = original
    assert_close(after, before.double(), 1e-4 if device == "cpu" else 3e-3)  # TF32 tl.dot on NVIDIA GPUs
    with pytest.raises(ValueError, match="no kernelizable"):
        ta.kernelize_rotary(torch.nn.Linear(2, 2))


def test_kernelize_rotary_of_a_deep_copy_swaps_the_function_its_attention_calls(attention, installed, device):
    """After ``copy.deepcopy`` the model's attached rotary function is a copy, while transformers' attention forward
    calls the module-level ``apply_rotary_pos_emb``: kernelize_rotary swapped only the copy (it reported 1 and
    nothing changed). Both are swapped now, and the copy's forward runs RotaryPosEmb's forward; also where the
    attention class is a subclass defined elsewhere (its inherited forward calls its base's module-level function)."""
    _skip_without_kernelizable_rotary(device)
    from kernels import Mode
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    from triton_collection.integrations import transformers_attention as ta

    torch.manual_seed(18)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(device)
    twin = copy.deepcopy(model)
    func = modeling_llama.apply_rotary_pos_emb
    attached = vars(twin.model.layers[0].self_attn)["_kernel_funcs"]["rotary_pos_emb"]
    assert attached is not func and type(attached) is type(func)
    ids = torch.randint(0, 64, (1, 7)).to(device)
    with torch.no_grad():
        before = twin(ids).logits
    had = vars(func).get("forward")
    calls = []
    hook = func.register_forward_hook(lambda module, args, out: calls.append(module.forward.__func__.__qualname__))
    try:
        assert ta.kernelize_rotary(twin, mode=Mode.INFERENCE, device=torch.device(device).type) == 2
        for fn in (func, attached):
            assert vars(fn)["forward"].__func__.__qualname__ == "RotaryPosEmb.forward"
        with torch.no_grad():
            after = twin(ids).logits
    finally:
        hook.remove()
        for fn in (func, attached):
            vars(fn).pop("forward", None)
        if had is not None:
            func.forward = had
    assert calls == ["RotaryPosEmb.forward"] * cfg.num_hidden_layers
    assert_close(after, before.double(), 1e-4 if device == "cpu" else 3e-3)

    class MyAttention(modeling_llama.LlamaAttention):  # defined here: its forward is LlamaAttention's
        pass

    for i, layer in enumerate(model.model.layers):
        mine = MyAttention(cfg, i).to(device)
        mine.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = mine
    twin = copy.deepcopy(model)
    calls.clear()
    hook = func.register_forward_hook(lambda module, args, out: calls.append(module.forward.__func__.__qualname__))
    try:  # the inherited forward's module-level function is found through the class's bases
        assert ta.kernelize_rotary(twin, mode=Mode.INFERENCE, device=torch.device(device).type) == 2
        with torch.no_grad():
            twin(ids)
    finally:
        hook.remove()
        vars(func).pop("forward", None)
        if had is not None:
            func.forward = had
    assert calls == ["RotaryPosEmb.forward"] * cfg.num_hidden_layers


def test_kernelize_rotary_gives_calls_the_kernel_cannot_take_transformers_formula(attention, installed, device):
    """kernelize_rotary swaps the module-level function every Llama of the process calls: a float64 model that was
    never kernelized raised the kernel's dtype TypeError, and cos / sin that require grad raised its ValueError.
    Such calls now get transformers' formula in PyTorch ops: the same bits and the same gradients as before the
    swap."""
    _skip_without_kernelizable_rotary(device)
    from kernels import Mode
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    from triton_collection.integrations import transformers_attention as ta

    torch.manual_seed(19)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(device)
    other = LlamaForCausalLM(cfg).double().eval().to(device)  # never kernelized
    ids = torch.randint(0, 64, (1, 7)).to(device)
    q, k = torch.randn(1, 4, 7, 16, device=device), torch.randn(1, 2, 7, 16, device=device)
    cos, sin = torch.randn(1, 7, 16, device=device), torch.randn(1, 7, 16, device=device)
    func = modeling_llama.apply_rotary_pos_emb

    def grads(c, s):  # outputs and the gradients of cos / sin through the swapped or original function
        c, s = c.clone().requires_grad_(), s.clone().requires_grad_()
        out = func(q, k, c, s)
        (out[0].sum() * 1.5 + out[1].sum()).backward()
        return out[0].detach(), out[1].detach(), c.grad, s.grad

    with torch.no_grad():
        want = other(ids).logits
    want_grads = grads(cos, sin)
    had = vars(func).get("forward")
    calls = []
    hook = func.register_forward_hook(lambda module, args, out: calls.append(args[0].dtype))
    try:
        assert ta.kernelize_rotary(model, mode=Mode.INFERENCE, device=torch.device(device).type) >= 1
        assert vars(func)["forward"].__func__.__qualname__ == "RotaryPosEmb.forward"
        with torch.no_grad():
            got = other(ids).logits
        got_grads = grads(cos, sin)
    finally:
        hook.remove()
        vars(func).pop("forward", None)
        if had is not None:
            func.forward = had
    assert calls[:cfg.num_hidden_layers] == [torch.float64] * cfg.num_hidden_layers  # the swapped function ran
    assert torch.equal(got, want)
    for g, w in zip(got_grads, want_grads):
        assert torch.equal(g, w)
    takes = attention.rotary.kernel_takes  # the rest still runs the kernel
    assert takes(q, k, cos, sin) and not takes(q, k.double(), cos, sin)
    with torch.no_grad():
        assert takes(q, k, cos.requires_grad_(), sin)
    assert not takes(q, k, cos, sin)


@pytest.mark.parametrize("model_type,why", [
    ("nanochat", "values differ"),  # rotate_half = cat(x2, -x1): the opposite rotation (7.85 off)
    ("gpt_oss", "fails on Llama-form inputs"),  # half-width cos / sin (every forward raised after the swap)
    ("esm", "values differ"),  # fp32 math rounded once (1 fp16 ulp off)
    ("modernbert", "values differ"),
    ("olmo2", "values differ"),  # casts back to q's dtype (fp32 reached an fp16 Linear: every forward raised)
])
def test_kernelize_rotary_leaves_other_rotary_formulas_alone(attention, installed, model_type, why):
    """transformers attaches a kernelizable ``rotary_pos_emb`` to 97 models, 13 of which compute something else
    than Llama's formula (the one RotaryPosEmb reproduces). They were all swapped; now each function is probed
    bitwise first and only Llama's formula is swapped, the others refused with the reason (and left running)."""
    import importlib

    from triton_collection.integrations import transformers_attention as ta

    try:
        fn = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}").apply_rotary_pos_emb
    except ImportError:
        pytest.skip(f"this transformers has no {model_type}")
    if getattr(type(fn), "kernel_layer_name", None) != "rotary_pos_emb":
        pytest.skip(f"{model_type}'s apply_rotary_pos_emb is not kernelizable in this transformers")
    holder = torch.nn.Module()
    holder._kernel_funcs = {"rotary_pos_emb": fn}
    forward = vars(fn).get("forward")
    with pytest.raises(ValueError, match=f"no rotary function of the model is one RotaryPosEmb replaces exactly.*{why}"):
        ta.kernelize_rotary(holder, device="cpu")
    assert vars(fn).get("forward") is forward
    for llama_like in ("llama", "qwen2", "gemma3"):
        fn = importlib.import_module(f"transformers.models.{llama_like}.modeling_{llama_like}").apply_rotary_pos_emb
        assert ta._rotary_mismatch(fn) is None, llama_like


def test_kernelize_rotary_probes_the_class_forward_and_maps_the_model_device(monkeypatch):
    """The rotary probe runs the function class's own forward, not an instance forward put there before (a kernelized
    one launches on the probe's CPU tensors; a user's may hide the class's formula); without ``device`` the mapping
    is for the device type of the model's first parameter (here ``cpu``, on a GPU host too), not a fixed one."""
    from transformers.models.llama import modeling_llama

    from triton_collection.integrations import transformers_attention as ta
    from triton_collection.integrations.families import _llama_rotary

    modeling_nanochat = pytest.importorskip("transformers.models.nanochat.modeling_nanochat")
    llama, nanochat = modeling_llama.apply_rotary_pos_emb, modeling_nanochat.apply_rotary_pos_emb
    if any(getattr(type(fn), "kernel_layer_name", None) != "rotary_pos_emb" for fn in (llama, nanochat)):
        pytest.skip("transformers' use_kernelized_func decorator is inactive in this environment")
    saved = {id(fn): vars(fn).get("forward") for fn in (llama, nanochat)}

    def broken(*args):
        raise RuntimeError("an instance forward the probe must not run")

    try:
        llama.forward = broken
        nanochat.forward = lambda q, k, cos, sin, unsqueeze_dim=1: _llama_rotary(q, k, cos, sin, unsqueeze_dim)
        assert ta._rotary_mismatch(llama) is None
        assert "values differ" in ta._rotary_mismatch(nanochat)
    finally:
        for fn in (llama, nanochat):
            vars(fn).pop("forward", None)
            if saved[id(fn)] is not None:
                fn.forward = saved[id(fn)]
    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(torch.zeros(3, device="cpu"))
    holder._kernel_funcs = {"rotary_pos_emb": llama}
    devices = []
    monkeypatch.setattr(ta, "_load_layer", lambda *args: None)
    monkeypatch.setattr(ta.kernels, "kernelize", lambda fn, *, device, **kwargs: devices.append(device))
    assert ta.kernelize_rotary(holder) == 1
    assert devices == ["cpu"]


@pytest.mark.parametrize("causal,layout,rope,ws", [(False, "bhsd", False, False), (True, "bshd", False, False),
                                                    (True, "bshd", True, False), (True, "bhsd", False, True)])
def test_flash_tma_forward_path(attention, device, causal, layout, rope, ws):
    """The tensor-descriptor (TMA) forward used on sm90+ GPUs, forced on under the interpreter: values, the
    log-sum-exp the backward reads (gradients), GQA, ragged lengths, the fused-RoPE variant, the
    warp-specialised loop flag and the reversed causal block order."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(19)
    B, H, Hk, S, D = 1, 4, 2, 37, 32
    q, k, v = make_qkv(B, H, Hk, S, S, D, torch.float16, device, layout, grad=True)
    ang = torch.rand(S, D // 2, device=device) * 6
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    if layout == "bshd":
        cos, sin = cos[:, None], sin[:, None]

    def run():
        if rope:
            return attention.flash_attention_rope(q, k, v, cos, sin, interleaved=True, causal=causal, layout=layout)
        return attention.flash_attention(q, k, v, causal=causal, layout=layout)

    want = run()
    want_g = torch.autograd.grad(want, (q, k, v), torch.ones_like(want))
    flash.FORCE_TMA = True
    flash.TMA_WS = ws
    try:
        with counted_plans(flash, flash, "_fwd_tma_plan") as calls:
            got = run()
            got_g = torch.autograd.grad(got, (q, k, v), torch.ones_like(got))
    finally:
        flash.FORCE_TMA = False
        flash.TMA_WS = False
    assert calls, "the TMA path did not run"
    assert_close(got, want.double(), TOL[torch.float16], "o")
    for g, w in zip(got_g, want_g):
        assert_close(g, w.double(), GRAD_TOL[torch.float16])


@pytest.mark.parametrize("Sq,Sk,causal,mask_kind,layout", [
    (1, 53, False, None, "bhsd"), (3, 67, True, None, "bshd"), (2, 37, False, "bool", "bhsd"),
    (5, 61, False, "float", "bshd"), (40, 67, True, None, "bhsd"), (1, 7, False, None, "bhsd")])
def test_key_splits(attention, device, monkeypatch, Sq, Sk, causal, mask_kind, layout):
    """The pointer forward with its keys split over programs (decode steps on a GPU; forced here) and merged by the
    combine kernel: output against fp64, lse against the unsplit kernel's, gradients (which read that lse) against
    fp64; GQA, ragged splits, a boolean mask with a query that sees no key (o = 0, zero gradients), a float mask,
    causal with fewer and more queries than keys, fewer keys than one split."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(37)
    q, k, v = make_qkv(2, 4, 2, Sq, Sk, 16, torch.float32, device, layout, grad=True)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 1, Sq, Sk, device=device) > 0.3
        mask[0, 0, -1] = False  # a query that sees no key
    elif mask_kind == "float":
        mask = torch.randn(1, 4, Sq, Sk, device=device)
    bshd = layout == "bshd"
    _, want_lse = flash._attn_fwd_launch(q.detach(), k.detach(), v.detach(), mask, 0.25, causal, bshd, bshd)
    monkeypatch.setattr(flash, "FORCE_SPLITS", 4)
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())
    splits, original = [], flash._key_splits
    blocks = []  # the key block of the plan (16 under the interpreter, larger tiles on a GPU)
    monkeypatch.setattr(flash, "_key_splits",
                        lambda *a: blocks.append(a[2]) or splits.append(original(*a)) or splits[-1])
    o, lse = flash._attn_fwd_launch(q.detach(), k.detach(), v.detach(), mask, 0.25, causal, bshd, bshd)
    out = attention.flash_attention(q, k, v, attn_mask=mask, causal=causal, scale=0.25, layout=layout)
    keys = min(Sq, Sk) if causal else Sk
    assert splits == [min(4, -(-keys // blocks[0]))]  # one plan for both calls
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(q64, k64, v64, mask=mask, causal=causal, scale=0.25, layout=layout)
    assert_close(o, want.detach(), TOL[torch.float32], "o")
    assert_close(out, want.detach(), TOL[torch.float32], "o (public call)")
    rows = torch.isfinite(want_lse)
    assert torch.equal(rows, torch.isfinite(lse)) and torch.allclose(lse[rows], want_lse[rows], atol=1e-5)
    do = rand(*out.shape, device=device)
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do),
                          torch.autograd.grad(want, (q64, k64, v64), do.double())):
        assert_close(g, w, GRAD_TOL[torch.float32], name)


@pytest.mark.parametrize("Sq,Sk,mask_kind,layout,splits", [
    (1, 53, None, "bhsd", 0), (1, 53, None, "bshd", 4), (5, 37, "bool", "bhsd", 0), (3, 61, "float", "bshd", 3),
    (16, 40, None, "bhsd", 0), (17, 29, None, "bhsd", 0)])
def test_gqa_pack(attention, device, monkeypatch, Sq, Sk, mask_kind, layout, splits):
    """GQA decode steps (the pointer kernel's PACK: a kv head's query heads share one program's rows): output and
    lse against the unpacked kernel's, output and gradients against fp64, with a mask shared by the heads (a query
    that sees no key: o = 0), more rows than one block (5 x 4 = 20 under the interpreter's 16), key splits, both
    layouts; 17 queries x 4 heads pass PACK_ROWS and stay unpacked."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(41)
    B, H, Hk = 2, 8, 2
    q, k, v = make_qkv(B, H, Hk, Sq, Sk, 16, torch.float32, device, layout, grad=True)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(B, 1, Sq, Sk, device=device) > 0.3
        mask[1, 0, -1] = False  # a query that sees no key
    elif mask_kind == "float":
        mask = torch.randn(B, 1, Sq, Sk, device=device)
    bshd = layout == "bshd"
    args = (q.detach(), k.detach(), v.detach(), mask, 0.25, False, bshd, bshd)
    monkeypatch.setattr(flash, "PACK_GQA", False)
    want_o, want_lse = flash._attn_fwd_launch(*args)
    monkeypatch.setattr(flash, "PACK_GQA", True)
    monkeypatch.setattr(flash, "FORCE_SPLITS", splits)
    packs, launch = [], flash.FixedLaunch
    monkeypatch.setattr(flash, "FixedLaunch",
                        lambda kernel, grid, meta, *a: packs.append((dict(meta).get("PACK"), grid[1:2]))
                        or launch(kernel, grid, meta, *a))
    o, lse = flash._attn_fwd_launch(*args)
    packed = Sq * H // Hk <= flash.PACK_ROWS
    assert packs[0] == (packed, (Hk if packed else H,))  # the forward's grid: one program row per kv head if packed
    assert torch.allclose(o, want_o, atol=1e-6, rtol=1e-5)
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and torch.allclose(lse[finite], want_lse[finite], atol=1e-5)
    out = attention.flash_attention(q, k, v, attn_mask=mask, scale=0.25, layout=layout)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(q64, k64, v64, mask=mask, scale=0.25, layout=layout)
    assert_close(out, want.detach(), TOL[torch.float32], "o")
    do = rand(*out.shape, device=device)
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do),
                          torch.autograd.grad(want, (q64, k64, v64), do.double())):
        assert_close(g, w, GRAD_TOL[torch.float32], name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("Hq,Hk,D", [(8, 2, 256), (4, 4, 200), (8, 2, 128)])
def test_decode_tiles_fit(attention, device, dtype, Hq, Hk, D):
    """Decode steps (one query) of every head dim and dtype launch (on a GPU the decode tiles apply to fp16 / bf16
    up to d = 128 only: fp32 at d = 256 in them would need more shared memory than a multiprocessor has) and match
    fp64, with the keys split as a GPU splits them."""
    torch.manual_seed(43)
    q, k, v = make_qkv(1, Hq, Hk, 1, 64, D, dtype, device, "bhsd")
    out = attention.flash_attention(q, k, v)
    want = ref_attention(q.double(), k.double(), v.double())
    assert_close(out, want, TOL[dtype], "o")


def test_key_split_counts(attention, monkeypatch):
    """How many splits the pointer forward takes on a GPU (the multiprocessor count faked: 132): as many as fit two
    programs per multiprocessor in one wave where the grid would leave most idle, none where it fills them or under
    the interpreter."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    monkeypatch.setattr(flash, "sm_count", lambda device: 132)
    gpu = torch.device("cuda", 0)
    assert flash._key_splits(32, 1024, 128, gpu, False) == 8  # batch-1 decode, 32 heads: 256 programs
    assert flash._key_splits(8, 4096, 64, gpu, False) == 33
    assert flash._key_splits(32, 100, 128, gpu, False) == 1  # one key block
    assert flash._key_splits(66, 8192, 128, gpu, False) == 4
    assert flash._key_splits(64, 16384, 64, gpu, False) == 4  # 8 x 8 kv heads: one wave of 256, not 320 programs
    assert flash._key_splits(40, 16384, 64, gpu, False) == 6  # 240 programs, not 280
    assert flash._key_splits(67, 8192, 128, gpu, False) == 1  # more than half the multiprocessors busy
    assert flash._key_splits(32, 1024, 128, gpu, True) == 1  # the interpreter
    assert flash._key_splits(32, 1024, 128, torch.device("cpu"), False) == 1


@pytest.mark.parametrize("Sq,Sk,causal", [(21, 53, True), (53, 21, True), (40, 67, False), (67, 40, False)])
def test_flash_tma_kernels_other_key_lengths(attention, device, Sq, Sk, causal):
    """The TMA forward and backward (the default on sm90+), forced on under the interpreter, with fewer or more keys
    than queries (top-left causal alignment, key tails inside and past a block): equal to the pointer kernels."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(21)
    q, k, v = make_qkv(1, 4, 2, Sq, Sk, 32, torch.float16, device, "bhsd")
    want_o, want_lse = flash._attn_fwd_launch(q, k, v, None, 0.3, causal, False, False)
    do = rand(*want_o.shape, dtype=torch.float16, device=device)
    want = flash._attn_bwd_launch(do, q, k, v, None, want_o, want_lse, 0.3, causal, False, False, False, tma_bwd=False)
    flash.FORCE_TMA = True
    try:
        o, lse = flash._attn_fwd_launch(q, k, v, None, 0.3, causal, False, False)
        got = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.3, causal, False, False, False, tma_bwd=True)
    finally:
        flash.FORCE_TMA = False
    assert_close(o, want_o.double(), TOL[torch.float16], "o")
    rows = torch.isfinite(want_lse)
    assert torch.equal(rows, torch.isfinite(lse)) and torch.allclose(lse[rows], want_lse[rows], atol=1e-4)
    for name, g, w in zip(("dq", "dk", "dv"), got[:3], want[:3]):
        assert_close(g, w.double(), 2e-3, name)


def test_tma_eligibility(attention, monkeypatch):
    """Which calls the tensor-descriptor kernels take on an sm90+ GPU (the device check faked): fp16/bf16 without a
    mask, d = 64 or 128 with Dv = d, at least one query tile, 16-byte aligned strides."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    if flash.TensorDescriptor is None:
        pytest.skip("this Triton has no tensor descriptors")
    monkeypatch.setattr(flash, "_has_tma", lambda device: True)

    def ok(B=1, H=2, S=256, D=128, DV=None, dtype=torch.bfloat16, mask=None, k_stride_pad=0):
        q = torch.empty(B, H, S, D, dtype=dtype)
        k = torch.empty(B, H, S, D + k_stride_pad, dtype=dtype)[..., :D]
        v = torch.empty(B, H, S, DV or D, dtype=dtype)
        return flash._tma_eligible(q, k, v, mask, False)

    assert ok(D=128) and ok(D=64) and ok(D=64, dtype=torch.float16)
    assert not ok(D=32) and not ok(D=256) and not ok(D=96) and not ok(D=128, DV=64)
    assert not ok(dtype=torch.float32) and not ok(mask=torch.zeros(1)) and not ok(S=100)
    assert ok(D=64, S=64) and not ok(D=64, S=63)  # d = 64 runs 64-query tiles
    assert not ok(k_stride_pad=4)  # a row stride of 264 bytes is not a multiple of 16
    assert not flash._tma_eligible(*(torch.empty(1, 2, 256, 128, dtype=torch.bfloat16),) * 3, None, True)  # interp


@pytest.mark.parametrize("causal", [False, True])
def test_flash_tma_backward_path(attention, device, causal):
    """The tensor-descriptor backward kernels (the default on sm90+ where they apply), forced on under the
    interpreter: equal to the pointer ones."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(20)
    q, k, v = make_qkv(1, 4, 2, 37, 37, 32, torch.float16, device, "bshd")
    o, lse = flash._attn_fwd_launch(q, k, v, None, 0.2, causal, True, True)
    do = rand(*o.shape, dtype=torch.float16, device=device)
    want = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.2, causal, True, True, False, tma_bwd=False)
    flash.FORCE_TMA = True
    try:
        with counted_plans(flash, flash, "_descriptor_template") as made:
            got = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.2, causal, True, True, False, tma_bwd=True)
    finally:
        flash.FORCE_TMA = False
    assert len(made) == 8, "the descriptor backward did not run"
    for name, g, w in zip(("dq", "dk", "dv"), got[:3], want[:3]):
        assert_close(g, w.double(), 2e-3, name)


def test_rope_inference_plan_keeps_every_check(attention, device):
    """Plain inference keeps one validated plan per call signature; other arguments are validated again."""
    q, k = rand(1, 4, 3, 8, device=device), rand(1, 2, 3, 8, device=device)
    cos, sin = rand(1, 3, 8, device=device), rand(1, 3, 8, device=device)
    with torch.no_grad():
        for _ in range(2):
            attention.apply_rotary_pos_emb(q, k, cos, sin)
        with pytest.raises(ValueError, match="broadcast"):
            attention.apply_rotary_pos_emb(q, k, cos[:, :2], sin[:, :2])
        with pytest.raises(TypeError, match="cos must be"):
            attention.apply_rotary_pos_emb(q, k, cos.double(), sin)
        with pytest.raises(IndexError):
            attention.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=7)
        with pytest.raises(ValueError, match="even"):
            attention.rotary_embedding(q[..., :7], cos.unsqueeze(1)[..., :7], sin.unsqueeze(1)[..., :7])


def test_checked_inference_calls(attention, device, monkeypatch):
    """Plain inference checks a call signature once: its later calls on new data skip the checks and stay right
    (outputs contiguous in out_layout); another signature, an int scale or a call that needs a gradient is checked
    again, and bad arguments after good ones still raise, naming the argument."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    monkeypatch.setattr(flash, "_CHECKED", type(flash._CHECKED)())
    checks, original = [], flash._check_inputs
    monkeypatch.setattr(flash, "_check_inputs", lambda *a: checks.append(1) or original(*a))

    def call(q, k, v, **kw):
        with torch.no_grad():
            out = attention.flash_attention(q, k, v, out_layout="bshd", **kw)
        want = ref_attention(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale")).transpose(1, 2)
        assert out.is_contiguous() and out.data_ptr() != q.data_ptr()
        assert_close(out, want, TOL[q.dtype], "o")

    for _ in range(3):  # fresh data, one signature: checked once
        call(*make_qkv(1, 6, 2, 13, 29, 24, torch.float16, device), causal=True, scale=0.3)
    assert len(checks) == 1 and len(flash._CHECKED) == 1
    call(*make_qkv(1, 6, 2, 13, 29, 24, torch.float16, device), causal=True)  # scale None: another signature
    assert len(checks) == 2
    call(*make_qkv(1, 6, 2, 13, 29, 24, torch.float16, device), causal=True, scale=1)  # int: checked each call
    call(*make_qkv(1, 6, 2, 13, 29, 24, torch.float16, device), causal=True, scale=1)
    assert len(checks) == 4 and len(flash._CHECKED) == 2
    q, k, v = make_qkv(1, 6, 2, 13, 29, 24, torch.float16, device)
    with pytest.raises(TypeError, match="q, k and v must share one dtype"):
        attention.flash_attention(q, k.float(), v, out_layout="bshd", causal=True, scale=0.3)
    with pytest.raises(ValueError, match="layout"):
        attention.flash_attention(q, k, v, layout=["bhsd"])
    with pytest.raises(ValueError, match="out_layout"):
        attention.flash_attention(q, k, v, out_layout="bsd")
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attention.flash_attention(q, k, v, scale=float("nan"))
    np = pytest.importorskip("numpy")  # NumPy scalars, as SDPA takes them (np.float32 was refused)
    call(q, k, v, causal=True, scale=np.float32(0.3))
    for bad in (True, torch.tensor(0.3), "0.3"):
        with pytest.raises(TypeError, match="scale must be a real number"):
            attention.flash_attention(q, k, v, scale=bad)
    wide = np.longdouble(1e300) * np.longdouble(1e300)  # finite where long double is wider than fp64 (x86)
    for huge in (10 ** 400, wide):  # an OverflowError, and an infinite scale, before
        with pytest.raises(ValueError, match="scale must be a finite number"):
            attention.flash_attention(q, k, v, scale=huge)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        attention.flash_attention(q, k[:, :1].expand(1, 4, 29, 24), v[:, :1].expand(1, 4, 29, 24))
    assert len(flash._CHECKED) == 2


def test_call_plans(attention, device, monkeypatch):
    """One forward and one backward plan per call signature: calls on new data reuse them and stay right; a tensor
    that starts off 16 bytes, another mask or the module's switches make a plan of their own; no plan holds a
    tensor; eager training runs without the dispatcher (the op's autograd formula in a Function)."""
    import sys
    import weakref

    flash = sys.modules[attention.__name__ + ".flash"]
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())
    monkeypatch.setattr(flash, "_BWD_PLANS", type(flash._BWD_PLANS)())
    store = rand(4 * 2 * 19 * 24 + 8, dtype=torch.float16, device=device)

    def check(offset, mask=None):
        torch.manual_seed(offset)
        q = store[offset:offset + 2 * 19 * 24].view(1, 19, 2, 24).normal_().requires_grad_(True)
        k, v = (rand(1, 19, 2, 24, dtype=torch.float16, device=device).requires_grad_(True) for _ in range(2))
        out = attention.flash_attention(q, k, v, attn_mask=mask, causal=True, layout="bshd")
        assert "EagerAutograd" in type(out.grad_fn).__name__
        do = rand(*out.shape, dtype=torch.float16, device=device)
        got = torch.autograd.grad(out, (q, k, v), do)
        q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
        want = ref_attention(q64, k64, v64, mask=mask, causal=True, layout="bshd")
        assert_close(out, want.detach(), TOL[torch.float16], "o")
        for name, g, w in zip(("dq", "dk", "dv"), got, torch.autograd.grad(want, (q64, k64, v64), do.double())):
            assert_close(g, w, GRAD_TOL[torch.float16], name)
        return weakref.ref(q)

    for offset in (0, 2 * 19 * 24, 0):  # new data at aligned starts: one plan each way
        seen = check(offset)
    assert len(flash._FWD_PLANS) == 1 and len(flash._BWD_PLANS) == 1
    assert seen() is None  # neither plan keeps the call's tensors
    check(4)  # 8 bytes off: Triton specialises pointers on 16-byte alignment, so another plan
    assert len(flash._FWD_PLANS) == 2 and len(flash._BWD_PLANS) == 2
    check(0, mask=torch.ones(19, 19, dtype=torch.bool, device=device).tril(-1) | torch.eye(19, dtype=torch.bool,
                                                                                           device=device))
    assert len(flash._FWD_PLANS) == 3
    monkeypatch.setattr(flash, "TMA_REVERSE", not flash.TMA_REVERSE)  # a switch: plans of its own
    check(0)
    assert len(flash._FWD_PLANS) == 4 and len(flash._BWD_PLANS) == 4
    with torch.no_grad():  # inference shares the forward plan
        out = attention.flash_attention(*(rand(1, 19, 2, 24, dtype=torch.float16, device=device) for _ in range(3)),
                                        causal=True, layout="bshd")
    assert len(flash._FWD_PLANS) == 4 and out.grad_fn is None


SM90_CASES = [  # (B, Hq, Hk, Sq, Sk, D, causal, layout): GQA/MQA, ragged and prime lengths, Sq != Sk
    (1, 2, 2, 300, 300, 128, False, "bhsd"),
    (1, 2, 2, 300, 300, 128, True, "bshd"),
    (2, 4, 2, 257, 383, 128, False, "bshd"),
    (2, 4, 1, 521, 521, 128, True, "bhsd"),
    (1, 3, 3, 129, 77, 64, False, "bhsd"),
    (1, 2, 2, 640, 640, 64, True, "bshd"),
    (1, 2, 1, 200, 131, 128, True, "bhsd"),  # more queries than keys, causal
    (1, 2, 1, 130, 700, 128, True, "bshd"),  # causal, keys no query sees (dK/dV programs with no query tile)
    (1, 2, 2, 128, 1, 128, False, "bhsd"),  # one key
]


def _sm90(attention):
    """flash_sm90 and flash of the loaded package; skips off a compute capability 9.0 GPU or without Gluon."""
    import sys

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a compute capability 9.0 GPU")
    sm90 = sys.modules[attention.__name__ + ".flash_sm90"]
    if not sm90.AVAILABLE:
        pytest.skip("this Triton has no usable Gluon")
    return sm90, sys.modules[attention.__name__ + ".flash"]


def _assert_near(actual, expected, rel, what):
    """max |actual - expected| <= rel * max |expected| (no floor: the outputs here are well below 1)."""
    err = (actual.double() - expected.double()).abs().max().item()
    bound = rel * expected.double().abs().max().item()
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


# sm90 forward against the tl forward (same inputs, fp32 accumulation in another order, P rounded the same way):
# a relative bound of a few ulps of the output dtype, and the base-2 lse to 1e-4
SM90_REL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", SM90_CASES)
def test_flash_sm90_forward(attention, device, case, dtype):
    """The warp-specialised Gluon forward (the default on compute capability 9.0 GPUs where it applies): o against
    fp64 and against the tl forward (SM90_FWD off), its base-2 log-sum-exp against the tl forward's, and the
    gradients (the backward reads that lse) against fp64. GPU only: Gluon has no interpreter."""
    if device != "cuda":
        pytest.skip("GPU only")
    sm90, flash = _sm90(attention)
    B, Hq, Hk, Sq, Sk, D, causal, layout = case
    torch.manual_seed(25)
    q, k, v = make_qkv(B, Hq, Hk, Sq, Sk, D, dtype, device, layout, grad=True)
    with counted_plans(flash, sm90, "plan") as calls:  # two scales: two plans
        out = attention.flash_attention(q, k, v, causal=causal, layout=layout)
        o, lse = flash._attn_fwd_launch(q.detach(), k.detach(), v.detach(), None, 0.3, causal, layout == "bshd",
                                        layout == "bshd")
    assert len(calls) == 2, "the sm90 forward did not run"
    flash.SM90_FWD = False
    try:
        want_o, want_lse = flash._attn_fwd_launch(q.detach(), k.detach(), v.detach(), None, 0.3, causal,
                                                  layout == "bshd", layout == "bshd")
    finally:
        flash.SM90_FWD = True
    _assert_near(o, want_o, SM90_REL[dtype], "o (scale 0.3) against the tl forward")
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=0), (lse - want_lse).abs().max()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(q64, k64, v64, causal=causal, layout=layout)
    _assert_near(out, want.detach(), SM90_REL[dtype], "o against fp64")
    do = rand(*out.shape, dtype=dtype, device=device)
    got_g = torch.autograd.grad(out, (q, k, v), do)
    want_g = torch.autograd.grad(want, (q64, k64, v64), do.double())
    for name, g, w in zip(("dq", "dk", "dv"), got_g, want_g):
        assert_close(g, w, GRAD_TOL[dtype], name)


def _sm90_bwd_pair(attention, flash, q, k, v, do, causal, layout, dq_cfg=None, dkdv_cfg=None):
    """(dq, dk, dv) of the Gluon backward (asserting it ran, with optional settings) and of the tl TMA backward,
    both from the same forward's o and lse."""
    import sys

    bwd = sys.modules[attention.__name__ + ".flash_sm90_bwd"]
    bshd = layout == "bshd"
    o, lse = flash._attn_fwd_launch(q, k, v, None, 0.3, causal, bshd, bshd)
    shipped = dict(bwd.DQ_CONFIGS), dict(bwd.DKDV_CONFIGS)
    D = q.shape[-1]
    if dq_cfg:
        bwd.DQ_CONFIGS[D] = bwd.Sm90BwdConfig(*dq_cfg)
    if dkdv_cfg:
        bwd.DKDV_CONFIGS[D] = bwd.Sm90BwdConfig(*dkdv_cfg)
    try:
        with counted_plans(flash, bwd, "plan") as calls:
            got = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.3, causal, bshd, bshd, False)[:3]
    finally:
        bwd.DQ_CONFIGS.update(shipped[0])
        bwd.DKDV_CONFIGS.update(shipped[1])
    assert len(calls) == 1, "the sm90 backward did not run"
    flash.SM90_BWD = False
    try:
        want = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.3, causal, bshd, bshd, False)[:3]
    finally:
        flash.SM90_BWD = True
    return got, want


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", SM90_CASES)
def test_flash_sm90_backward(attention, device, case, dtype):
    """The warp-specialised Gluon backward (dQ and dK/dV kernels, the default on compute capability 9.0 GPUs where
    they apply): dq, dk, dv against the tl TMA backward (SM90_BWD off; same p and ds roundings, fp32 sums in
    another order) at a few ulps, and against fp64. GPU only."""
    import sys

    if device != "cuda":
        pytest.skip("GPU only")
    sm90, flash = _sm90(attention)
    B, Hq, Hk, Sq, Sk, D, causal, layout = case
    if D not in sys.modules[attention.__name__ + ".flash_sm90_bwd"].DQ_CONFIGS:
        pytest.skip(f"d = {D} keeps the tl backward")
    torch.manual_seed(26)
    q, k, v = make_qkv(B, Hq, Hk, Sq, Sk, D, dtype, device, layout)
    do = rand(*q.shape, dtype=dtype, device=device)
    got, want = _sm90_bwd_pair(attention, flash, q, k, v, do, causal, layout)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _assert_near(g, w, SM90_REL[dtype], f"{name} against the tl backward")
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    ref = ref_attention(q64, k64, v64, causal=causal, scale=0.3, layout=layout)
    for name, g, w in zip(("dq", "dk", "dv"), got, torch.autograd.grad(ref, (q64, k64, v64), do.double())):
        assert_close(g, w, GRAD_TOL[dtype], name)


@pytest.mark.parametrize("dq_cfg,dkdv_cfg", [((64, 3, 224), (64, 3, 232)), ((128, 2, 224), (64, 2, 224))])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_sm90_backward_other_settings(attention, device, dq_cfg, dkdv_cfg, causal):
    """The backward settings the shipped configs do not use (ring depths, 128-key dQ blocks, register splits) on
    ragged lengths with GQA, against the tl backward."""
    if device != "cuda":
        pytest.skip("GPU only")
    sm90, flash = _sm90(attention)
    torch.manual_seed(29)
    q, k, v = make_qkv(2, 4, 2, 389, 389, 128, torch.float16, device, "bshd")
    do = rand(*q.shape, dtype=torch.float16, device=device)
    got, want = _sm90_bwd_pair(attention, flash, q, k, v, do, causal, "bshd", dq_cfg, dkdv_cfg)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        _assert_near(g, w, SM90_REL[torch.float16], f"{name} {dq_cfg} {dkdv_cfg}")


@pytest.mark.parametrize("cfg", [(128, 2, True, 232), (128, 3, False, 224), (64, 3, True, 232)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_sm90_other_settings(attention, device, cfg, causal):
    """The settings the shipped CONFIGS do not use (ping-pong turns, 3 stages, 64-key blocks) on ragged lengths,
    against the tl forward."""
    if device != "cuda":
        pytest.skip("GPU only")
    sm90, flash = _sm90(attention)
    torch.manual_seed(27)
    q, k, v = make_qkv(2, 4, 2, 389, 389, 128, torch.float16, device, "bshd")
    shipped = sm90.CONFIGS[128]
    sm90.CONFIGS[128] = sm90.Sm90Config(*cfg)
    try:
        with counted_plans(flash, sm90, "plan") as calls:  # plans keep the config they were built with
            o, lse = flash._attn_fwd_launch(q, k, v, None, 0.09, causal, True, False)
    finally:
        sm90.CONFIGS[128] = shipped
    assert calls == [1], "the sm90 forward did not run with this config"
    flash.SM90_FWD = False
    try:
        want_o, want_lse = flash._attn_fwd_launch(q, k, v, None, 0.09, causal, True, False)
    finally:
        flash.SM90_FWD = True
    _assert_near(o, want_o, SM90_REL[torch.float16], f"o {cfg}")
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=0), (lse - want_lse).abs().max()


@pytest.mark.parametrize("interleaved,layout", [(True, "bshd"), (False, "bhsd")])
def test_flash_sm90_rope(attention, device, interleaved, layout):
    """flash_attention_rope on a compute capability 9.0 GPU: q rotated by one pass, then the Gluon forward; values
    against fp64 attention of the rotated q and k, gradients against the ``tl`` kernels' (SM90_FWD off)."""
    if device != "cuda":
        pytest.skip("GPU only")
    sm90, flash = _sm90(attention)
    torch.manual_seed(26)
    B, H, S, D = 1, 3, 333, 128
    q, k, v = make_qkv(B, H, H, S, S, D, torch.bfloat16, device, layout, grad=True)
    ang = torch.rand(S, D // 2, device=device) * 6
    rep = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat([t, t], -1))
    cos, sin = rep(ang.cos()), rep(ang.sin())
    if layout == "bshd":
        cos, sin = cos[:, None], sin[:, None]
    with counted_plans(flash, sm90, "plan") as calls:
        out = attention.flash_attention_rope(q, k, v, cos, sin, interleaved=interleaved, layout=layout)
    assert calls, "the sm90 forward did not run"
    qr, kr = (attention.rotary_embedding(t.detach(), cos, sin, interleaved=interleaved, fp32_math=True) for t in (q, k))
    assert_close(out, ref_attention(qr, kr, v.detach(), layout=layout), TOL[torch.bfloat16], "o")
    do = rand(*out.shape, dtype=torch.bfloat16, device=device)
    got = torch.autograd.grad(out, (q, k, v), do)
    flash.SM90_FWD = False
    try:
        ref = attention.flash_attention_rope(q, k, v, cos, sin, interleaved=interleaved, layout=layout)
        want = torch.autograd.grad(ref, (q, k, v), do)
    finally:
        flash.SM90_FWD = True
    assert_close(out, ref.double(), TOL[torch.bfloat16], "o against the tl forward")
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_close(g, w.double(), GRAD_TOL[torch.bfloat16], name)


def _fake_fwd_plan(fake_forward):
    """A stand-in for ``flash_sm90.plan`` whose launch calls ``fake_forward(qv, kv, vv, o, lse, qk_scale, causal)``
    on each call's tensors seen as the plan's [B, H, S, D] views (a call passes the tensors the views were taken of)."""
    def plan(qv, kv, vv, o, qk_scale, causal):
        views = (qv, kv, vv, o)

        def args(q, k, v, o, lse):
            return (*(torch.as_strided(t, w.shape, w.stride()) for t, w in zip((q, k, v, o), views)), lse, qk_scale,
                    causal)

        return (lambda a: fake_forward(*a)), args
    return plan


def _fake_bwd_plan(fake_backward):
    """A stand-in for ``flash_sm90_bwd.plan`` whose run calls ``fake_backward(qv, kv, vv, dov, lse, delta, dq, dk,
    dv, scale, causal)`` with each call's tensors seen as the plan's [B, H, S, D] views."""
    def plan(qv, kv, vv, dov, grads, scale, causal):
        views = (qv, kv, vv, dov, *grads)

        def run(q, k, v, do, lse, delta, dq, dk, dv):
            qv, kv, vv, dov, dq, dk, dv = (torch.as_strided(t, w.shape, w.stride())
                                           for t, w in zip((q, k, v, do, dq, dk, dv), views))
            fake_backward(qv, kv, vv, dov, lse, delta, dq, dk, dv, scale, causal)
        return run
    return plan


@pytest.mark.parametrize("rope,layout,out_layout", [(False, "bhsd", "bhsd"), (False, "bshd", "bhsd"),
                                                    (True, "bshd", "bshd"), (True, "bhsd", "bhsd")])
def test_sm90_dispatch(attention, monkeypatch, rope, layout, out_layout):
    """The launcher's glue around the Gluon forward, on the CPU (the device and compile checks faked, the kernel
    replaced by fp64 math on the [B, H, S, D] views it is given): it gets q rotated by one pass when RoPE is fused
    (bit-equal to rotary_embedding), the scale x log2(e), the causal flag and an output view in the asked layout;
    its o and base-2 lse feed the backward (gradients against fp64 attention of the rotated q and k)."""
    import math
    import os
    import sys

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the launcher's other kernels on CPU tensors: needs the interpreter")

    sm90 = sys.modules[attention.__name__ + ".flash_sm90"]
    flash = sys.modules[attention.__name__ + ".flash"]
    seen = []

    def fake_forward(qv, kv, vv, o, lse, qk_scale, causal):
        seen.append((qv.clone(), qk_scale, causal, o.stride()))
        s = (qv.double() @ kv.double().transpose(-1, -2)) * (qk_scale / 1.4426950408889634)
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        o.copy_(torch.softmax(s, -1) @ vv.double())
        lse.copy_(torch.logsumexp(s, -1) / math.log(2))

    monkeypatch.setattr(flash, "is_interpreter", lambda kernel: False)
    monkeypatch.setattr(sm90, "eligible", lambda *a: True)
    monkeypatch.setattr(sm90, "plan", _fake_fwd_plan(fake_forward))
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())  # no plan made here outlives the fakes
    torch.manual_seed(28)
    B, H, S, D = 1, 2, 9, 8
    q, k, v = make_qkv(B, H, H, S, S, D, torch.float32, "cpu", layout, grad=True)
    ang = torch.rand(S, D // 2) * 6
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    if layout == "bshd":
        cos, sin = cos[:, None], sin[:, None]
    if rope:
        out = attention.flash_attention_rope(q, k, v, cos, sin, interleaved=True, causal=True, scale=0.3,
                                             layout=layout, out_layout=out_layout)
    else:
        out = attention.flash_attention(q, k, v, causal=True, scale=0.3, layout=layout, out_layout=out_layout)
    assert len(seen) == 1, "the sm90 branch did not run"
    qv, qk_scale, causal, o_strides = seen[0]
    q_rot = attention.rotary_embedding(q.detach(), cos, sin, interleaved=True, fp32_math=True) if rope else q
    assert torch.equal(qv, q_rot.transpose(1, 2) if layout == "bshd" else q_rot)
    assert math.isclose(qk_scale, 0.3 * 1.4426950408889634) and causal is True
    assert (o_strides[1] == D) == (out_layout == "bshd")  # the kernel wrote the asked layout in place

    def rot(t):  # interleaved pairs (x0, x1) -> x * cos + (-x1, x0) * sin, in fp64
        if not rope:
            return t
        pairs = t.unflatten(-1, (-1, 2))
        return t * cos.double() + torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2) * sin.double()

    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(rot(q64), rot(k64), v64, causal=True, scale=0.3, layout=layout)
    if out_layout != layout:
        want = want.transpose(1, 2)
    assert_close(out, want.detach(), 1e-5, "o")
    do = rand(*out.shape)
    for name, g, w in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do),
                          torch.autograd.grad(want, (q64, k64, v64), do.double())):
        assert_close(g, w, GRAD_TOL[torch.float32], name)


def test_sm90_eligibility(attention, monkeypatch):
    """Which calls take the Gluon forward on a compute capability 9.0 GPU (the device check faked): fp16/bf16
    without a mask, a positive scale, d = 64 or 128 for q, k and v, at least 128 queries and one key, 16-byte aligned
    strides (those of size-1 dimensions too: the descriptor asserts them)."""
    import sys

    sm90 = sys.modules[attention.__name__ + ".flash_sm90"]
    if not sm90.AVAILABLE:
        pytest.skip("this Triton has no usable Gluon")
    monkeypatch.setattr(sm90, "_capability_90", lambda device: True)

    def ok(Sq=256, Sk=256, D=128, DV=None, dtype=torch.bfloat16, mask=None, k_stride_pad=0, scale=0.1, B=1):
        q = torch.empty(B, 2, Sq, D, dtype=dtype)
        k = torch.empty(B, 2, Sk, D + k_stride_pad, dtype=dtype)[..., :D]
        v = torch.empty(B, 2, Sk, DV or D, dtype=dtype)
        return sm90.eligible(q, k, v, torch.empty(B, 2, Sq, DV or D, dtype=dtype), mask, scale)

    assert ok() and ok(D=64) and ok(dtype=torch.float16) and ok(Sq=128, Sk=1)
    assert not ok(D=32) and not ok(D=256) and not ok(D=96) and not ok(DV=64)
    assert not ok(dtype=torch.float32) and not ok(mask=torch.zeros(1)) and not ok(Sq=127) and not ok(Sk=0)
    assert not ok(scale=0.0) and not ok(scale=-0.1)
    assert not ok(k_stride_pad=4)  # a row stride of 264 bytes is not a multiple of 16
    q = torch.empty(2, 256, 128, dtype=torch.bfloat16).as_strided((1, 2, 256, 128), (3, 256 * 128, 128, 1))
    assert not sm90.tma_descriptor_ok(q)  # the size-1 batch dimension's stride of 6 bytes
    monkeypatch.setattr(sm90, "_capability_90", lambda device: False)
    assert not ok()


@pytest.mark.parametrize("layout,causal", [("bhsd", True), ("bshd", False), ("bshd", True)])
def test_sm90_backward_dispatch(attention, monkeypatch, layout, causal):
    """The launcher's glue around the Gluon backward on the CPU (forward and backward kernels faked by fp64 math on
    the arguments they get): the gradients of flash_attention equal fp64 ones only if the backward is handed the
    forward's base-2 lse, delta = rowsum(do * o), the [B, H, S, D] views, the scale and causal flag, and its
    in-place outputs are returned in the caller's layout."""
    import math
    import os
    import sys

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the launcher's other kernels on CPU tensors: needs the interpreter")

    sm90 = sys.modules[attention.__name__ + ".flash_sm90"]
    bwd = sys.modules[attention.__name__ + ".flash_sm90_bwd"]
    flash = sys.modules[attention.__name__ + ".flash"]
    seen = []

    def scores(qv, kv, scale):
        s = (qv.double() @ kv.double().transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return s

    def fake_forward(qv, kv, vv, o, lse, qk_scale, causal_):
        s = scores(qv, kv, qk_scale / 1.4426950408889634)
        o.copy_(torch.softmax(s, -1) @ vv.double())
        lse.copy_(torch.logsumexp(s, -1) / math.log(2))

    def fake_backward(qv, kv, vv, dov, lse, delta, dq, dk, dv, scale, causal_):
        seen.append((scale, causal_))
        p = torch.exp2(scores(qv, kv, scale) * 1.4426950408889634 - lse.double()[..., None])
        ds = p * (dov.double() @ vv.double().transpose(-1, -2) - delta.double()[..., None])
        dq.copy_(ds @ kv.double() * scale)
        dk.copy_(ds.transpose(-1, -2) @ qv.double() * scale)
        dv.copy_(p.transpose(-1, -2) @ dov.double())

    monkeypatch.setattr(flash, "is_interpreter", lambda kernel: False)
    monkeypatch.setattr(flash, "_has_tma", lambda device: True)
    monkeypatch.setattr(sm90, "eligible", lambda *a: True)
    monkeypatch.setattr(sm90, "plan", _fake_fwd_plan(fake_forward))
    monkeypatch.setattr(bwd, "eligible", lambda *a: True)
    monkeypatch.setattr(bwd, "plan", _fake_bwd_plan(fake_backward))
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())  # no plan made here outlives the fakes
    monkeypatch.setattr(flash, "_BWD_PLANS", type(flash._BWD_PLANS)())
    torch.manual_seed(30)
    B, H, S, D = 1, 2, 64, 64  # the smallest the tensor-descriptor branch takes (d = 64: 64-query tiles)
    q, k, v = make_qkv(B, H, H, S, S, D, torch.float16, "cpu", layout, grad=True)
    out = attention.flash_attention(q, k, v, causal=causal, scale=0.3, layout=layout)
    do = rand(*out.shape, dtype=torch.float16)
    got = torch.autograd.grad(out, (q, k, v), do)
    assert seen == [(0.3, causal)], "the sm90 backward branch did not run"
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(q64, k64, v64, causal=causal, scale=0.3, layout=layout)
    for name, g, w in zip(("dq", "dk", "dv"), got, torch.autograd.grad(want, (q64, k64, v64), do.double())):
        assert_close(g, w, GRAD_TOL[torch.float16], name)


def test_sm90_backward_eligibility(attention, monkeypatch):
    """Which backward calls take the Gluon kernels on a compute capability 9.0 GPU (the device check faked):
    fp16/bf16 without a mask, d = 128 for q, k and v, at least 128 queries and one key, 16-byte aligned strides for
    the inputs, do and the gradients."""
    import sys

    bwd = sys.modules[attention.__name__ + ".flash_sm90_bwd"]
    if not bwd.AVAILABLE:
        pytest.skip("this Triton has no usable Gluon")
    monkeypatch.setattr(bwd, "_capability_90", lambda device: True)

    def ok(Sq=256, Sk=256, D=128, DV=None, dtype=torch.bfloat16, mask=None, dk_stride_pad=0):
        q, do, dq = (torch.empty(1, 2, Sq, D, dtype=dtype) for _ in range(3))
        k, v, dv = (torch.empty(1, 2, Sk, DV or D, dtype=dtype) for _ in range(3))
        k = torch.empty(1, 2, Sk, D, dtype=dtype)
        dk = torch.empty(1, 2, Sk, D + dk_stride_pad, dtype=dtype)[..., :D]
        return bwd.eligible(q, k, v, do, (dq, dk, dv), mask)

    assert ok() and ok(dtype=torch.float16) and ok(Sq=128, Sk=1)
    q, k = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16), torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    assert not bwd.eligible(q, k, k, q.float(), (q, k, k), None)  # do in another dtype
    assert not ok(D=64)  # measured slower than the tl backward there
    assert not ok(D=32) and not ok(D=256) and not ok(DV=64) and not ok(dtype=torch.float32)
    assert not ok(mask=torch.zeros(1)) and not ok(Sq=127) and not ok(Sk=0)
    assert not ok(dk_stride_pad=4)  # the gradient's row stride of 264 bytes is not a multiple of 16
    monkeypatch.setattr(bwd, "_capability_90", lambda device: False)
    assert not ok()


def test_sm90_forward_compiles_for_hopper(built):
    """The Gluon forward and backward kernels lower for sm_90 with this Triton: warpgroup MMA (HGMMA) in the SASS,
    register reallocation between the partitions (setmaxnreg), shared memory within the H100/H200's 227 KiB."""
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "compile_attention_sm90.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, script, str(built["triton-attention"].variant("cuda"))],
                         env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    if "SKIPPED" in res.stdout:
        pytest.skip(res.stdout.strip())
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("sm90 ")]
    assert len(lines) == 8 and "COMPILED 8" in res.stdout, res.stdout
    for ln in lines:
        fields = dict(f.split("=") for f in ln.split()[1:])
        assert int(fields["hgmma"]) > 0 and int(fields["setmaxnreg"]) > 0, ln
        assert 0 < int(fields["shared"]) <= 232448, ln


def test_export_with_dynamic_sizes(attention, norms, device):
    """``torch.export.export`` (non-strict, its default) and ``make_fx`` symbolic tracing with a dynamic sequence
    length: the ops' checks run on symbolic sizes (rotary's shape check was cached with ``lru_cache``, which cannot
    hash a SymInt: a TypeError), and the exported program gives eager's values at another length."""
    from torch.export import Dim, export
    from torch.fx.experimental.proxy_tensor import make_fx

    class Block(torch.nn.Module):
        def forward(self, x, cos, sin, w):
            q = attention.rotary_embedding(x, cos, sin)
            return attention.flash_attention(norms.rms_norm(q, w), q, x, causal=True)

    S = Dim("S", min=2, max=64)
    shapes = ({2: S}, {0: S}, {0: S}, None)

    def args(s, seed):
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(*shape, generator=g).to(device) for shape in ((1, 2, s, 16), (s, 16), (s, 16), (16,)))

    program = export(Block(), args(8, 0), dynamic_shapes=shapes)
    for s in (5, 13):
        new = args(s, s)
        assert torch.equal(program.module()(*new), Block()(*new))
    traced = make_fx(lambda *a: attention.rotary_embedding(*a[:3]), tracing_mode="symbolic")(*args(8, 1))
    new = args(11, 2)
    assert torch.equal(traced(*new), attention.rotary_embedding(*new[:3]))


def test_more_programs_than_a_grid_axis_takes_is_refused(attention, norms, softmax, device):
    """Batches over 65535 (window attention folds images x windows into B) and, with torch_order=True, more than
    65535 x 2048 classes exceed a launch grid axis (CUDA's second and third axes take 65535): a clear ValueError
    before any launch instead of the driver's invalid-argument error. 65535 still runs (on a GPU)."""
    q = torch.randn(65536, 1, 2, 8, device=device)
    with pytest.raises(ValueError, match=r"the batch \(65536\) and the query heads \(1\) may be at most 65535"):
        attention.flash_attention(q, q, q)
    if device == "cuda":  # 65535 programs: minutes under the interpreter
        small = q[:65535, :, :1]
        assert attention.flash_attention(small, small, small).shape == (65535, 1, 1, 8)
    x = torch.randn(65536, 1, 8, device=device)
    with pytest.raises(ValueError, match=r"x's batch \(65536\) may be at most 65535"):
        norms.norm_modulate(x, x[0, 0], x[0, 0])
    with pytest.raises(ValueError, match=r"x's batch \(65536\) may be at most 65535"):
        norms.gated_residual(x, x, x[0, 0])
    logits = torch.zeros(1, device=device).expand(65535 * 2048 + 1)
    with pytest.raises(ValueError, match="torch_order=True takes at most 134215680 classes"):
        softmax.cross_entropy(logits, torch.tensor(0, device=device), torch_order=True)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [48, 128])
def test_gpu_sequence_stride_times_a_tile_past_2_31(attention, device, D):
    """q, k, v rows 2^25 elements apart (views of one 17 GB buffer): a key/query tile's step, ``BLOCK * stride``,
    passes 2^31. It was an int32 product: 128 * 2^25 wraps to 0 (the loop read its first tile again), 64 * 2^25 to
    -2^31. 260 rows: two full 128-row tiles and a tail. D = 48 takes the pointer kernels everywhere, D = 128 the
    sm_90 ones where they apply. Forward and backward against fp64 of contiguous copies."""
    if device != "cuda":
        pytest.skip("a 17 GB buffer: GPU only")
    torch.manual_seed(31)
    S, step, dt = 260, 1 << 25, torch.float16
    buf = torch.empty(S, step, device=device, dtype=dt)
    buf[:, :3 * D] = rand(S, 3 * D, dtype=dt, device=device)
    q, k, v = (buf[:, i * D:(i + 1) * D].detach()[None, :, None].requires_grad_() for i in range(3))
    assert q.stride(1) == step
    for causal in (False, True):
        o = attention.flash_attention(q, k, v, causal=causal, layout="bshd")
        qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
        want = ref_attention(qc, kc, vc, causal=causal, layout="bshd")
        assert_close(o, want, TOL[dt], f"forward, causal={causal}")
        do = rand(*o.shape, dtype=dt, device=device)
        grads = torch.autograd.grad(o, (q, k, v), do)
        want_grads = torch.autograd.grad(want, (qc, kc, vc), do.double())
        for name, g, w in zip("qkv", grads, want_grads):
            assert_close(g, w, GRAD_TOL[dt], f"d{name}, causal={causal}")
    del buf, q, k, v
    torch.cuda.empty_cache()


@pytest.mark.gpu
def test_gpu_head_dim_stride_times_d_past_2_31(attention, device):
    """q, k, v whose head-dim stride is 2^24 + 2^18 (columns of one 4.4 GB buffer, read transposed): ``d * stride``
    passes 2^31 at d = 127. The pointer kernels computed it in int32, and so did rotary's pair loads. Attention
    forward and backward against fp64 of contiguous copies; apply_rotary_pos_emb bit-equal to the contiguous call."""
    if device != "cuda":
        pytest.skip("a 4.4 GB buffer: GPU only")
    torch.manual_seed(32)
    S, D, dt = 70, 128, torch.float16
    cols = (1 << 24) + (1 << 18)
    assert (D - 1) * cols >= 1 << 31
    buf = torch.empty(D, cols, device=device, dtype=dt)
    buf[:, :3 * S] = rand(D, 3 * S, dtype=dt, device=device)
    q, k, v = (buf[:, i * S:(i + 1) * S].detach().t()[None, None].requires_grad_() for i in range(3))
    assert q.stride(3) == cols
    o = attention.flash_attention(q, k, v, causal=True)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    want = ref_attention(qc, kc, vc, causal=True)
    assert_close(o, want, TOL[dt], "forward")
    do = rand(*o.shape, dtype=dt, device=device)
    for name, g, w in zip("qkv", torch.autograd.grad(o, (q, k, v), do),
                          torch.autograd.grad(want, (qc, kc, vc), do.double())):
        assert_close(g, w, GRAD_TOL[dt], f"d{name}")
    cos, sin = rand(1, S, D, dtype=dt, device=device), rand(1, S, D, dtype=dt, device=device)
    with torch.no_grad():
        got = attention.apply_rotary_pos_emb(q, k, cos, sin)
        want_rope = attention.apply_rotary_pos_emb(qc, kc, cos, sin)
    for g, w in zip(got, want_rope):
        assert torch.equal(g, w)
    del buf, q, k, v
    torch.cuda.empty_cache()


@pytest.mark.parametrize("Sq,Sk", [(37, 37), (29, 43), (43, 29)])
def test_causal_tiles_of_other_shapes(attention, device, Sq, Sk):
    """Correctness does not depend on the tiles (_launch's contract): causal forward and backward with key tiles
    narrower than the query tiles (BLOCK_N1 16 < BLOCK_M1 32, where the dk/dv kernel's diagonal range must round
    up to a whole query block) and wider ones, against fp64; top-left alignment with Sq != Sk."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    torch.manual_seed(57)
    q, k, v = make_qkv(1, 2, 1, Sq, Sk, 24, torch.float32, device)
    q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
    want = ref_attention(q64, k64, v64, causal=True, scale=0.3)
    do = rand(*want.shape, device=device)
    want_g = torch.autograd.grad(want, (q64, k64, v64), do.double())
    for fwd_cfg, bwd_cfg in ((attention.FwdConfig(32, 16, 1, 1), attention.BwdConfig(32, 16, 16, 32, 1, 1)),
                             (attention.FwdConfig(16, 32, 1, 1), attention.BwdConfig(16, 32, 32, 16, 1, 1))):
        o, lse = flash._attn_fwd_launch(q, k, v, None, 0.3, True, False, False, cfg=fwd_cfg)
        assert_close(o, want.detach(), TOL[torch.float32], f"o {fwd_cfg}")
        got = flash._attn_bwd_launch(do, q, k, v, None, o, lse, 0.3, True, False, False, False, cfg=bwd_cfg)
        for name, g, w in zip(("dq", "dk", "dv"), got[:3], want_g):
            assert_close(g, w, GRAD_TOL[torch.float32], f"{name} {bwd_cfg}")


def test_key_splits_with_every_key_far_below_zero(attention, device, monkeypatch):
    """Key splits whose count is not a power of two (the combine's last load has unused lanes) on a row whose every
    score sits far below 0 (a large negative additive mask on every key): the merged output and lse are the
    softmax's over the keys, not a dropped row (the unused lanes must not lift the running maximum to 0)."""
    import sys

    flash = sys.modules[attention.__name__ + ".flash"]
    monkeypatch.setattr(flash, "FORCE_SPLITS", 3)
    monkeypatch.setattr(flash, "_FWD_PLANS", type(flash._FWD_PLANS)())
    torch.manual_seed(58)
    # 377 keys: three splits of whole key tiles for every tile width the configs use (16 in the interpreter, 32 for
    # fp32 on a GPU, up to 128), so the forced count is taken on every device (45 keys gave 2 splits on CUDA)
    q, k, v = make_qkv(2, 2, 2, 3, 377, 16, torch.float32, device)
    mask = torch.zeros(3, 377, device=device)
    mask[0] = -120.0  # every score of query 0 near -120 (-173 in base 2: exp2 underflows unless taken from the max)
    mask[1, 5:] = -3e3  # query 1: keys 0-4 win outright
    splits, original = [], flash._key_splits
    monkeypatch.setattr(flash, "_key_splits", lambda *a: splits.append(original(*a)) or splits[-1])
    o, lse = flash._attn_fwd_launch(q, k, v, mask, 0.25, False, False, False)
    block_n = sys.modules[attention.__name__ + "._launch"].fwd_config_for(q, 16, device == "cpu", True).block_n
    assert splits == [3] and math.ceil(math.ceil(377 / 3) / block_n) * block_n * 2 < 377  # three non-empty splits
    want = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * 0.25 + mask.double(), -1) @ v.double()
    assert_close(o, want, TOL[torch.float32], "o")
    want_lse = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) * 0.25 + mask.double(), -1) / math.log(2)
    assert torch.allclose(lse.double(), want_lse, rtol=1e-6, atol=1e-3)


def test_rotary_probe_needs_the_output_dtype():
    """A rotary function with Llama's values returned in float32 (for half q / k Llama's stays half): torch.equal
    alone would accept it, RotaryPosEmb would return another dtype; the probe refuses it."""
    import kernels

    from triton_collection.integrations import transformers_attention as ta

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    @kernels.use_kernel_forward_from_hub("rotary_pos_emb")
    def upcast_rotary(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return (q * cos + rotate_half(q) * sin).float(), (k * cos + rotate_half(k) * sin).float()

    @kernels.use_kernel_forward_from_hub("rotary_pos_emb")
    def same_dtype_rotary(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    @kernels.use_kernel_forward_from_hub("rotary_pos_emb")
    def fp64_math_rotary(q, k, cos, sin, unsqueeze_dim=1):  # fp32 q / k: computed in fp64, rounded once (1 ulp off)
        if q.dtype != torch.float32:
            return same_dtype_rotary(q, k, cos, sin, unsqueeze_dim)
        cos, sin = cos.unsqueeze(unsqueeze_dim).double(), sin.unsqueeze(unsqueeze_dim).double()
        return tuple((t.double() * cos + rotate_half(t.double()) * sin).float() for t in (q, k))

    assert "values differ" in (ta._rotary_mismatch(upcast_rotary) or "")
    assert "values differ" in (ta._rotary_mismatch(fp64_math_rotary) or "")  # bit for bit, not within a tolerance
    assert ta._rotary_mismatch(same_dtype_rotary) is None


def test_register_refuses_eager():
    """"eager" is transformers' own implementation though it is not in AttentionInterface's mapping: register
    refuses it (as "sdpa") before registering anything."""
    import types

    from transformers import AttentionInterface

    from triton_collection.integrations import transformers_attention as ta

    stub = types.SimpleNamespace(transformers_attention_forward=lambda *args, **kwargs: None)
    with pytest.raises(ValueError, match="own attention"):
        ta.register("eager", kernel=stub)
    assert "eager" not in AttentionInterface._global_mapping
    for bad in ("", " ", None, 3):  # registered without a word before
        with pytest.raises(ValueError, match="name must be a non-empty string"):
            ta.register(bad, kernel=stub)
        assert bad not in AttentionInterface._global_mapping


def test_kernelize_rotary_checks_mode_device_org_and_version_as_kernelize(monkeypatch):
    """``mode="inference"`` failed with "'in <string>' requires string as left operand", ``device="cuda"`` on a
    CPU-only torch with an AssertionError from torch, ``device="cuda:0"`` with kernels' "Unknown device type: cuda:0",
    ``version="1"`` as "Version 1 not found, available versions: 1": each is now refused naming the argument, and a
    device index or torch.device maps the device type, as the transformers shim's kernelize does."""
    from kernels import Mode
    from transformers.models.llama import modeling_llama

    from triton_collection.integrations import transformers_attention as ta

    llama = modeling_llama.apply_rotary_pos_emb
    if getattr(type(llama), "kernel_layer_name", None) != "rotary_pos_emb":
        pytest.skip("transformers' use_kernelized_func decorator is inactive in this environment")
    holder = torch.nn.Module()
    holder.weight = torch.nn.Parameter(torch.zeros(3))
    holder._kernel_funcs = {"rotary_pos_emb": llama}
    devices = []
    monkeypatch.setattr(ta, "_load_layer", lambda *args: None)
    monkeypatch.setattr(ta.kernels, "kernelize", lambda fn, *, device, **kwargs: devices.append(device))
    with pytest.raises(TypeError, match="mode must be a kernels.Mode"):
        ta.kernelize_rotary(holder, mode="inference")
    with pytest.raises(TypeError, match=r"kernelize_rotary: version must be an int"):
        ta.kernelize_rotary(holder, version="1")
    with pytest.raises(ValueError, match=r"kernelize_rotary: org 'a b' is not a Hub organisation name"):
        ta.kernelize_rotary(holder, org="a b")
    with pytest.raises(ValueError, match="device must be a device type"):
        ta.kernelize_rotary(holder, device="junk")
    with pytest.raises(ValueError, match=r"the kernel packages have no build for device type 'mps'"):
        ta.kernelize_rotary(holder, device="mps")  # (it named triton-norms, not the package this loads)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="this PyTorch has no cuda device"):
        ta.kernelize_rotary(holder, device="cuda")
    assert devices == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ta.kernelize_rotary(holder, device="cuda:0") == 1
    assert ta.kernelize_rotary(holder, device=torch.device("cpu")) == 1
    assert devices == ["rocm" if torch.version.hip else "cuda", "cpu"]


def test_register_checks_org_and_version_before_loading():
    """``register(version="1")`` was kernels' "Version 1 not found, available versions: 1" and ``org="a b"``
    huggingface_hub's HFValidationError; both are refused first, naming the argument."""
    from triton_collection.integrations import transformers_attention as ta

    with pytest.raises(TypeError, match=r"load: version must be an int >= 1 .*got '1'"):
        ta.register(version="1")
    with pytest.raises(ValueError, match=r"load: org 'a b' is not a Hub organisation name"):
        ta.register(org="a b")


def test_rotary_layer_falls_back_when_only_sin_requires_grad(attention, device):
    """The kernel refuses cos OR sin requiring grad; the layer must then run transformers' formula (values and
    the gradient to sin), not re-raise the kernel's ValueError."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 5, 16, generator=g).to(device), torch.randn(1, 2, 5, 16, generator=g).to(device)
    cos, sin = (torch.randn(1, 5, 16, generator=g).to(device) for _ in range(2))
    s1, s2 = sin.clone().requires_grad_(), sin.clone().requires_grad_()
    got = attention.layers.RotaryPosEmb.forward(torch.nn.Module(), q, k, cos, s1)
    want = apply_rotary_pos_emb(q, k, cos, s2)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    (ga,) = torch.autograd.grad(sum(t.sum() for t in got), s1)
    (gb,) = torch.autograd.grad(sum(t.sum() for t in want), s2)
    assert torch.equal(ga, gb)


def test_rotary_layer_still_refuses_bad_input(attention, device):
    """The fallback is only for tensors the kernel cannot take; an odd head dim is still the kernel's
    ValueError (the reference formula would rotate unequal halves and return a result)."""
    q, k = torch.randn(1, 4, 5, 7, device=device), torch.randn(1, 2, 5, 7, device=device)
    cos, sin = torch.randn(1, 5, 7, device=device), torch.randn(1, 5, 7, device=device)
    with pytest.raises(ValueError, match="even"):
        attention.layers.RotaryPosEmb.forward(torch.nn.Module(), q, k, cos, sin)


def test_rotary_layer_names_a_missing_tensor(attention, device):
    """None where a tensor belongs is the kernel's TypeError naming it, not an AttributeError from the
    reference formula the layer falls back to."""
    q, k = torch.randn(1, 4, 5, 16, device=device), torch.randn(1, 2, 5, 16, device=device)
    c = torch.randn(1, 5, 16, device=device)
    for args in ((None, k, c, c), (q, None, c, c), (q, k, None, c), (q, k, c, None)):
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            attention.layers.RotaryPosEmb.forward(torch.nn.Module(), *args)
