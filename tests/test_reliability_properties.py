"""Property-based tests (hypothesis) of every op of the collection against fp64 PyTorch.

Each test draws shapes (0 rows, 1, primes, odd widths; > 64K widths in ``test_*_wide_rows``),
layouts (contiguous, storage offset, padded rows, non-unit last stride, transposed, stride-0
expanded), dtypes (fp32/fp16/bf16, mixed weight dtypes), arguments (eps, scale, masks, ignored
targets, activations) and, in forward-only examples, NaN/+inf/-inf at random positions, then
compares with the same math in fp64 PyTorch on the same input values (NaN and infinities must
sit where PyTorch's are). Backward examples pass an upstream gradient that may itself be a
strided, transposed or expanded view (case 8) and compare every gradient with fp64 autograd.

Tolerance (one rule, ``check``): ``ULPS[dtype]`` units in the last place of the reference
rounded to the output dtype, plus ``REL[dtype]`` times a per-row magnitude of the terms that
can cancel (e.g. ``|xn|*|w| + |b|`` for a norm, the row's largest ``|g|`` for a gradient).
The kernels compute in fp32 and round once: half precision is within 1 ulp (+1 for the
interpreter, whose fp32 -> bf16 conversion truncates); fp32 carries reduction/transcendental error.

Scale: ``HYPOTHESIS_SCALE`` (default 1) multiplies every ``max_examples`` (the GPU run uses more);
``HYPOTHESIS_SEED`` picks a seed (default: derandomized, the same examples every run). The number
of examples run is counted per test; ``test_zz_generated_case_count`` asserts the total is at
least ``10000 * HYPOTHESIS_SCALE`` when the whole module ran, and ``RELIABILITY_COUNTS`` (a path)
receives the counts as JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

# one test process runs the whole module (`make test` runs with `--dist loadgroup`): COUNTS is per process
pytestmark = pytest.mark.xdist_group("reliability_properties")

SCALE = float(os.environ.get("HYPOTHESIS_SCALE", "1"))
SEED = os.environ.get("HYPOTHESIS_SEED")
TARGET = 10_000
COUNTS: Counter = Counter()

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANT = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
MIN_EXP = {torch.float32: -126, torch.float16: -14, torch.bfloat16: -126}
ULPS = {torch.float32: 8, torch.float16: 2, torch.bfloat16: 2}
REL = {torch.float32: 2.0 ** -17, torch.float16: 2.0 ** -17, torch.bfloat16: 2.0 ** -17}
# widths: 1, tiny, primes, powers of two and their neighbours, above one 4K block
WIDTHS = [1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 97, 127, 128, 257, 1000, 1024, 4095, 4097, 5121]
WIDE = [65537, 131072, 262147]
LAYOUTS = ["contiguous", "offset", "padded", "stepped", "transposed", "expanded"]


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def cases(n: int):
    """hypothesis settings for a test of ``n`` examples (times HYPOTHESIS_SCALE), reproducible."""
    s = settings(max_examples=examples(n), deadline=None, database=None, derandomize=SEED is None,
                 suppress_health_check=list(HealthCheck), print_blob=True)
    if SEED is None:
        return s
    return lambda f: seed(int(SEED))(s(f))


def count(request):
    COUNTS[request.node.originalname] += 1
    if sum(COUNTS.values()) % 100 == 0:
        _write_counts()


def _write_counts():
    """Counts so far into ``$RELIABILITY_COUNTS`` (a killed GPU run still reports how far it got)."""
    path = os.environ.get("RELIABILITY_COUNTS")
    if path:
        with open(path, "w") as fh:
            json.dump({"scale": SCALE, "seed": SEED, "total": sum(COUNTS.values()), "per_test": dict(COUNTS)}, fh,
                      indent=1)


# ----------------------------------------------------------------------------- tensors


@st.composite
def tensors(draw, shape, dtype, device, *, layouts=LAYOUTS, scale=None, specials=False, grad=False):
    """A tensor of ``shape``/``dtype`` in a drawn layout with random values (fp64 normal * scale).

    ``specials``: NaN / +inf / -inf at a few drawn positions. ``grad``: the storage is a leaf that
    requires grad and the returned tensor is a view of it (the op sees the strided view).
    """
    shape = tuple(shape)
    layout = draw(st.sampled_from(layouts))
    if layout == "transposed" and (len(shape) < 2 or shape[-1] == 1 or shape[-2] == 1):
        layout = "offset"
    if layout == "expanded" and (len(shape) < 2 or shape[0] < 2):
        layout = "padded"
    if scale is None:
        scale = draw(st.sampled_from([1.0, 1.0, 3.0, 1e-3, 20.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
    vals = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if specials and vals.numel():
        k = draw(st.integers(1, 3))
        for _ in range(k):
            i = draw(st.integers(0, vals.numel() - 1))
            vals.view(-1)[i] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    vals = vals.to(dtype)
    n = shape[-1] if shape else 1
    if layout == "contiguous" or not shape:
        storage = torch.empty(shape, dtype=dtype)
        view = lambda s: s  # noqa: E731
    elif layout == "offset":
        off = draw(st.integers(1, 3))
        storage = torch.empty(math.prod(shape) + off, dtype=dtype)
        view = lambda s: s[off:].view(shape)  # noqa: E731
    elif layout == "padded":
        pad = draw(st.integers(1, 5))
        storage = torch.empty(shape[:-1] + (n + pad,), dtype=dtype)
        view = lambda s: s[..., pad:]  # noqa: E731
    elif layout == "stepped":
        storage = torch.empty(shape[:-1] + (2 * n,), dtype=dtype)
        view = lambda s: s[..., ::2]  # noqa: E731
    elif layout == "transposed":
        storage = torch.empty(shape[:-2] + (shape[-1], shape[-2]), dtype=dtype)
        view = lambda s: s.transpose(-1, -2)  # noqa: E731
    else:  # expanded: every index of dim 0 reads the same values (stride 0)
        vals = vals[:1].expand(shape)
        storage = torch.empty((1,) + shape[1:], dtype=dtype)
        view = lambda s: s.expand(shape)  # noqa: E731
    with torch.no_grad():
        if layout == "expanded":
            storage.copy_(vals[:1])
        else:
            view(storage).copy_(vals)
    storage = storage.to(device)
    if grad:
        storage.requires_grad_(True)
    t = view(storage)
    assert t.shape == shape
    return t


@st.composite
def lead_dims(draw, max_rows=4):
    """0 to 2 leading dims; rows (their product) from 0 to max_rows."""
    ndim = draw(st.integers(0, 2))
    dims = tuple(draw(st.integers(0, 3)) for _ in range(ndim))
    while math.prod(dims) > max_rows:
        dims = dims[1:]
    return dims


def ulp(t: torch.Tensor, dtype) -> torch.Tensor:
    _, e = torch.frexp(t.double().nan_to_num(0.0, 0.0, 0.0))
    return torch.pow(2.0, (torch.clamp(e - 1, min=MIN_EXP[dtype]) - MANT[dtype]).double())


def check(what, actual, ref, mag=None, ulps=None, rel=None, flush=1.0):
    """``actual`` (any dtype) against the fp64 ``ref``: NaN/inf where ref has them; elsewhere within
    ``ulps`` ulps of ref plus ``rel`` times ``mag`` (a broadcastable magnitude of cancelling terms) plus
    ``flush`` x 2^-126 (an fp32 subnormal flushed to zero, times what the formula multiplies it by)."""
    dtype = actual.dtype
    assert actual.shape == ref.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    a = actual.detach().double().cpu()
    r = ref.detach().to(dtype).double().cpu()  # the reference as representable in the output dtype
    assert torch.equal(a.isnan(), r.isnan()), f"{what}: NaN at {a.isnan().sum()} vs torch's {r.isnan().sum()} places"
    inf = r.isinf()
    assert torch.equal(a.isinf(), inf) and torch.equal(a[inf], r[inf]), f"{what}: infinities differ from torch's"
    fin = r.isfinite()
    ulps = ULPS[dtype] if ulps is None else ulps
    rel = REL[dtype] if rel is None else rel
    tol = ulps * ulp(r, dtype) + 2.0 ** -126 * torch.as_tensor(flush).double().cpu()  # GPUs flush fp32 subnormals
    if mag is not None:
        tol = tol + rel * torch.as_tensor(mag).detach().double().cpu().nan_to_num(0.0, 0.0, 0.0)
    tol = tol.expand_as(r) if tol.dim() else tol
    diff = (a - r).abs()
    bad = fin & ~(diff <= tol)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {r.numel()} off; first at flat index {i}: "
                             f"got {a.flatten()[i].item()!r}, fp64 reference {ref.flatten()[i].item()!r}, "
                             f"tolerance {tol.flatten()[i].item() if tol.dim() else tol.item():.3g}")


def row_max(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().double().abs().nan_to_num(0.0, 0.0, 0.0)
    if t.dim() == 0:
        return t
    if t.numel() == 0:
        return t.new_zeros(t.shape[:-1] + (1,))
    return t.amax(-1, keepdim=True)


def grads(out, inputs, dy):
    """Gradients of ``out`` (with upstream ``dy``) with respect to ``inputs`` (None where unused)."""
    return torch.autograd.grad(out, inputs, grad_outputs=dy, allow_unused=True)


# ----------------------------------------------------------------------------- norms


def _rms_ref(h, w, b, eps, offset):
    rstd = torch.rsqrt((h * h).mean(-1, keepdim=True) + eps)
    xn = h * rstd
    y = xn * (w + offset) if w is not None else xn
    y = y + b if b is not None else y
    mag = xn.abs() * ((w + offset).abs() if w is not None else 1.0) + (b.abs() if b is not None else 0.0)
    return y, mag, rstd


def _ln_ref(h, w, b, eps, offset):
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    xn = (h - mean) * rstd
    y = xn * w if w is not None else xn
    y = y + b if b is not None else y
    # h - mean cancels in fp32 at the size of |h| + |mean|, and the fp32 mean itself is off by a few ulps of
    # mean(|h|) (a row of +-20 values whose mean is ~1e-3: an element near the mean is off by ~1e-8 / std, far
    # more than ulps of |h| + |mean|; session 16 found such a row, 3.4e-9 off at xn ~1e-4)
    mag = (xn.abs() + (h.abs() + mean.abs() + h.abs().mean(-1, keepdim=True)) * rstd) * \
        (w.abs() if w is not None else 1.0) + (b.abs() if b is not None else 0.0)
    return y, mag, rstd


@st.composite
def norm_case(draw, device, widths=WIDTHS, max_rows=4):
    kind = draw(st.sampled_from(["rms_norm", "layer_norm", "add_rms_norm", "add_layer_norm"]))
    n = draw(st.sampled_from(widths))
    lead = draw(lead_dims(max_rows))
    shape = lead + (n,)
    dtype = draw(st.sampled_from(DTYPES))
    backward = draw(st.booleans())
    specials = not backward and draw(st.integers(0, 4)) == 0
    x = draw(tensors(shape, dtype, device, specials=specials, grad=backward))
    residual = None
    if kind.startswith("add_"):
        rdtype = draw(st.sampled_from([dtype, dtype, torch.float32]))
        residual = draw(tensors(shape, rdtype, device, grad=backward))
    wdtype = draw(st.sampled_from([None, dtype, dtype, torch.float32]))
    w = draw(tensors((n,), wdtype, device, layouts=["contiguous", "offset", "stepped"], scale=1.0,
                     grad=backward)) if wdtype is not None else None
    b = None
    if draw(st.booleans()):
        b = draw(tensors((n,), wdtype or dtype, device, layouts=["contiguous", "offset"], scale=1.0, grad=backward))
    eps = draw(st.sampled_from([0.0, 1e-6, 1e-5, 1e-2]))
    if eps == 0.0 and n == 1 and kind.endswith("layer_norm"):
        eps = 1e-5  # var == 0 exactly: 0 * inf, NaN in both; not informative
    extra = {}
    if kind in ("rms_norm", "layer_norm"):
        order = draw(st.sampled_from([None, None, "fused"] + (["mean"] if kind == "rms_norm" else [])))
        extra["torch_order"] = order
        if kind == "rms_norm" and draw(st.integers(0, 3)) == 0:
            extra["weight_offset"] = 1.0
    return kind, x, residual, w, b, eps, extra, backward


def _norm_run(pkg, kind, x, residual, w, b, eps, extra):
    if kind == "rms_norm":
        return pkg.rms_norm(x, w, b, eps, **extra), None
    if kind == "layer_norm":
        return pkg.layer_norm(x, w, b, eps, **extra), None
    f = pkg.add_rms_norm if kind == "add_rms_norm" else pkg.add_layer_norm
    return f(x, residual, w, b, eps)


def _norm_property(pkg, device, case, draw_dy):
    kind, x, residual, w, b, eps, extra, backward = case
    out, h = _norm_run(pkg, kind, x, residual, w, b, eps, extra)
    d = lambda t: t.detach().double().requires_grad_(backward) if t is not None else None  # noqa: E731
    x64, r64, w64, b64 = d(x), d(residual), d(w), d(b)
    h64 = x64 if r64 is None else (x64 + r64).to(residual.dtype).double()
    if r64 is not None and backward:  # rounding of h is identity for autograd: h = x + r + const
        h64 = x64 + r64 + ((x64 + r64).detach().to(residual.dtype).double() - (x64 + r64).detach())
    ref = _rms_ref if kind.endswith("rms_norm") else _ln_ref
    y64, mag, rstd = ref(h64, w64, b64, eps, extra.get("weight_offset", 0.0))
    if extra.get("torch_order") == "fused" and not backward and x.numel():
        # F.rms_norm's / F.layer_norm's CUDA kernels (the order "fused" reproduces) combine partial
        # statistics Welford-style: in a row holding +-inf some partials meet as inf - inf and the
        # row's other elements may be NaN where the CPU formula gives +-0; accept either there
        rows = h64.detach().isinf().any(-1, keepdim=True).expand_as(out).to(out.device)
        out = torch.where(rows & out.isnan(), y64.detach().to(out.device, out.dtype), out)
    out_dtype = residual.dtype if residual is not None else x.dtype
    assert out.dtype == out_dtype and out.shape == x.shape, (out.dtype, out.shape)
    check(f"{kind} out", out, y64, mag)
    if h is not None:
        check(f"{kind} h", h, h64, ulps=0)
    if not backward:
        return
    dy = draw_dy(tensors(x.shape, out.dtype, device, scale=1.0))
    leaves = [t for t in (x, residual, w, b) if t is not None]
    leaves64 = [t for t in (x64, r64, w64, b64) if t is not None]
    got = grads(out, leaves, dy)
    want = grads(y64, leaves64, dy.double())
    rows = rstd * row_max(dy.double() * ((w64.detach() + extra.get("weight_offset", 0.0)).abs() if w64 is not None
                                           else 1.0)) * 4
    names = [n for n, t in zip(("dx", "dresidual", "dweight", "dbias"), (x, residual, w, b)) if t is not None]
    for name, gt, wt in zip(names, got, want):
        if name in ("dx", "dresidual"):
            mag = rows.detach()
        else:  # sums over rows of dy * xn or dy
            flat = (dy.double().abs() * (rstd.detach() * (h64.detach().abs() + h64.detach().abs().mean(-1, keepdim=True))
                                          if name == "dweight" else 1.0))
            mag = flat.reshape(-1, flat.shape[-1]).sum(0) if flat.numel() else torch.zeros(())
        if wt is None:
            wt = torch.zeros_like(gt, dtype=torch.float64)
        check(f"{kind} {name}", gt, wt, mag)


@given(data=st.data())
@cases(2600)
def test_norms_against_fp64(norms, device, request, data):
    """rms_norm / layer_norm / add_rms_norm / add_layer_norm forward (NaN/inf included) and backward (case 8 dy)."""
    case = data.draw(norm_case(device))
    _norm_property(norms, device, case, data.draw)
    count(request)  # a case counts once every check of it passed


@given(data=st.data())
@cases(12)
def test_case1_norms_wide_rows_against_fp64(norms, device, request, data):
    """Rows wider than 64K (65537, 131072, 262147): the looped path (case 1)."""
    case = data.draw(norm_case(device, widths=WIDE, max_rows=2))
    _norm_property(norms, device, case, data.draw)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- activations

THRESHOLDS = [0.0, 0.25, -1.0]


def _act64(name, x, threshold):
    if name in ("silu", "silu_and_mul", "mul_and_silu"):
        return F.silu(x)
    if name in ("gelu", "gelu_and_mul"):
        return F.gelu(x)
    if name in ("gelu_tanh", "gelu_tanh_and_mul", "gelu_new"):
        return F.gelu(x, approximate="tanh")
    if name == "gelu_fast":
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    if name == "gelu_quick":
        return x * torch.sigmoid(1.702 * x)
    if name == "fatrelu_and_mul":
        return torch.where(x > threshold, x, torch.zeros_like(x))
    raise AssertionError(name)


GATED = ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "gelu_tanh_and_mul", "fatrelu_and_mul"]
PLAIN = ["silu", "gelu", "gelu_tanh", "gelu_new", "gelu_fast", "gelu_quick"]


def _act_ref(name, x64, threshold):
    if name not in GATED:
        y = _act64(name, x64, threshold)
        return y, y.abs() + x64.abs()
    d = x64.shape[-1] // 2
    a, u = x64[..., :d], x64[..., d:]
    if name == "mul_and_silu":
        a, u = u, a
    act = _act64(name, a, threshold)
    return act * u, (act.abs() + a.abs()) * u.abs()


@given(data=st.data())
@cases(3500)
def test_activations_against_fp64(activations, device, request, data):
    """Every activation, allocating form with autograd and ``(out, x)`` form into a poisoned strided out."""
    draw = data.draw
    name = draw(st.sampled_from(GATED + PLAIN))
    gated = name in GATED
    width = draw(st.sampled_from(WIDTHS)) * (2 if gated else 1)
    shape = draw(lead_dims()) + (width,)
    dtype = draw(st.sampled_from(DTYPES))
    form = draw(st.sampled_from(["alloc", "alloc", "out"]))
    backward = form == "alloc" and draw(st.booleans())
    specials = not backward and draw(st.integers(0, 4)) == 0
    # gated inputs are also the chunk views of case 7 (row stride 2x the width): "padded"/"stepped"
    x = draw(tensors(shape, dtype, device, specials=specials, grad=backward))
    rounding = draw(st.sampled_from(["fused", "eager"])) if dtype == torch.float32 or name in (
        "silu", "gelu", "gelu_tanh", "fatrelu_and_mul") else "fused"
    threshold = draw(st.sampled_from(THRESHOLDS))
    kw = {"rounding": rounding}
    f = getattr(activations, name)
    out_shape = shape[:-1] + (width // 2 if gated else width,)
    if form == "out":
        out = draw(tensors(out_shape, dtype, device, layouts=["contiguous", "offset", "padded", "stepped",
                                                               "transposed"], scale=1.0))
        with torch.no_grad():
            out.fill_(math.nan)
        args = (out, x, threshold) if name == "fatrelu_and_mul" else (out, x)
        res = f(*args, **kw)
        assert res is out
    else:
        args = (x, threshold) if name == "fatrelu_and_mul" else (x,)
        out = f(*args, **kw)
    x64 = x.detach().double().requires_grad_(backward)
    y64, mag = _act_ref(name, x64, threshold)
    check(f"{name} ({form}, {rounding})", out, y64, mag, rel=2.0 ** -20)
    if backward:
        dy = draw(tensors(out_shape, dtype, device, scale=1.0))
        (gx,) = grads(out, [x], dy)
        (gx64,) = grads(y64, [x64], dy.double())
        check(f"{name} dx", gx, gx64, row_max(dy) * (1.0 + row_max(x64)) * 4, rel=2.0 ** -18)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- softmax


@st.composite
def softmax_case(draw, device, widths=WIDTHS, max_rows=4):
    log = draw(st.booleans())
    n = draw(st.sampled_from(widths))
    lead = draw(lead_dims(max_rows))
    shape = lead + (n,)
    dtype = draw(st.sampled_from(DTYPES))
    # the reduced dim: the last, or another one (read through its stride)
    dim = -1
    if len(shape) > 1 and draw(st.integers(0, 3)) == 0:
        dim = draw(st.integers(-len(shape), len(shape) - 2))
    backward = draw(st.booleans())
    specials = not backward and draw(st.integers(0, 4)) == 0
    x = draw(tensors(shape, dtype, device, specials=specials, grad=backward))
    scale = draw(st.sampled_from([None, None, 0.125, 2.0]))
    mask = None
    if draw(st.integers(0, 2)) == 0:
        mshape = tuple(1 if draw(st.booleans()) else s for s in shape)
        mdtype = draw(st.sampled_from(DTYPES))
        mask = draw(tensors(mshape, mdtype, device, layouts=["contiguous", "offset", "transposed"], scale=1.0))
        with torch.no_grad():
            drop = torch.rand(mshape, generator=torch.Generator().manual_seed(draw(st.integers(0, 999)))) < 0.2
            mask.masked_fill_(drop.to(mask.device), -math.inf)
    causal = len(shape) >= 2 and dim == -1 and draw(st.integers(0, 3)) == 0
    return log, x, dim, scale, mask, causal, backward


def _softmax_property(pkg, device, case, draw):
    log, x, dim, scale, mask, causal, backward = case
    f = pkg.log_softmax if log else pkg.softmax
    out = f(x, dim, scale=scale, mask=mask, causal=causal)
    x64 = x.detach().double().requires_grad_(backward)
    z = x64 * (1.0 if scale is None else scale)
    if mask is not None:
        z = z + mask.double()
    if causal:
        i = torch.arange(x.shape[-2], device=x.device)[:, None]
        j = torch.arange(x.shape[-1], device=x.device)[None, :]
        z = z.masked_fill(j > i, -math.inf)
    y64 = torch.log_softmax(z, dim) if log else torch.softmax(z, dim)
    # log_softmax: z - lse cancels at the size of |z| and lse
    zz = z.detach().movedim(dim, -1)
    if log:
        mag = (zz.abs().nan_to_num(0, 0, 0).amax(-1, keepdim=True) + 1.0).movedim(-1, dim) if zz.numel() else None
    else:  # the fp32 sum of N exponentials: a relative error of the size of log2(N) ulps
        mag = y64.detach().abs()
    check(f"{'log_' if log else ''}softmax dim={dim} causal={causal} mask={mask is not None}", out, y64, mag)
    if not backward:
        return
    dy = draw(tensors(x.shape, x.dtype, device, scale=1.0))
    (gx,) = grads(out, [x], dy)
    (gx64,) = grads(y64, [x64], dy.double())
    # the kernel differentiates through its own rounded output y: an error of one ulp of y (dtype) times the
    # terms of the formula, dx = s * y * (dy - sum(dy * y)) or s * (dy - exp(y) * sum(dy))
    p = (y64.detach().exp() if log else y64.detach()).nan_to_num(0, 0, 0)
    yy = y64.detach().abs().nan_to_num(0, 0, 0)
    dyd = dy.double().abs()
    rsum = lambda t: t.movedim(dim, -1).sum(-1, keepdim=True).movedim(-1, dim) if t.numel() else t  # noqa: E731
    dmag = p * (dyd + rsum(dyd)) * (1.0 + yy) * 4 * (1.0 if scale is None else scale)
    # a subnormal y (or exp(y)) flushed to zero inside the kernel changes dx by up to 2^-126 x |dy - sum(dy y)|
    # (a draw of session 25: dx -0.0 against -1.59e-38)
    flush = 1.0 + (dyd + rsum(dyd)) * (1.0 if scale is None else scale)
    check(f"{'log_' if log else ''}softmax dx", gx, gx64, dmag, rel=max(2.0 ** -MANT[x.dtype], 2.0 ** -18), flush=flush)


@given(data=st.data())
@cases(2000)
def test_softmax_against_fp64(softmax, device, request, data):
    """softmax / log_softmax over any dim, scale, broadcast additive masks with -inf, causal; NaN/inf."""
    _softmax_property(softmax, device, data.draw(softmax_case(device)), data.draw)
    count(request)  # a case counts once every check of it passed


@given(data=st.data())
@cases(12)
def test_case1_softmax_wide_rows_against_fp64(softmax, device, request, data):
    _softmax_property(softmax, device, data.draw(softmax_case(device, widths=WIDE, max_rows=2)), data.draw)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- cross-entropy


@given(data=st.data())
@cases(1500)
def test_cross_entropy_against_fp64(softmax, device, request, data):
    """cross_entropy: (C,), (N, C), (N, C, d); ignore_index, reductions, label smoothing, z-loss (case 4)."""
    draw = data.draw
    c = draw(st.sampled_from(WIDTHS[:-2]))
    form = draw(st.sampled_from(["1d", "2d", "2d", "3d"]))
    n = draw(st.integers(0, 6))
    shape = {"1d": (c,), "2d": (n, c), "3d": (max(n // 2, 1), c, draw(st.integers(0, 3)))}[form]
    dtype = draw(st.sampled_from(DTYPES))
    backward = draw(st.booleans())
    specials = not backward and draw(st.integers(0, 4)) == 0
    logits = draw(tensors(shape, dtype, device, specials=specials, grad=backward))
    tshape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
    ignore_index = draw(st.sampled_from([-100, 0, c - 1]))
    target = torch.randint(0, c, tshape, generator=g)
    if target.numel():
        target.view(-1)[torch.rand(target.numel(), generator=g) < 0.25] = ignore_index
    target = target.to(draw(st.sampled_from([torch.int64, torch.int32]))).to(device)
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    smoothing = draw(st.sampled_from([0.0, 0.0, 0.1, 1.0]))
    z_loss = draw(st.sampled_from([0.0, 0.0, 1e-4, 0.5]))
    loss = softmax.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                                 label_smoothing=smoothing, z_loss=z_loss)
    x64 = logits.detach().double().requires_grad_(backward)
    cdim = 0 if len(shape) == 1 else 1
    per = F.cross_entropy(x64.unsqueeze(0) if cdim == 0 else x64, target.long().unsqueeze(0) if cdim == 0 else target.long(),
                          ignore_index=ignore_index, reduction="none", label_smoothing=smoothing)
    per = per.squeeze(0) if cdim == 0 else per
    keep = target != ignore_index
    if z_loss:
        per = per + torch.where(keep, z_loss * torch.logsumexp(x64, cdim) ** 2, 0.0)  # 0 where ignored, NaN or not
    if reduction == "none":
        ref = per
    elif reduction == "sum":
        ref = per.sum()
    else:  # torch: every target ignored gives a NaN loss but a zero gradient
        ref = per.sum() / keep.sum().clamp(min=1) + (math.nan if not keep.any() else 0.0)
    lse = torch.logsumexp(x64.detach(), cdim).abs().nan_to_num(0, 0, 0)
    xmax = x64.detach().abs().nan_to_num(0, 0, 0).amax(cdim) if x64.numel() else lse
    mag = (lse + xmax + 1.0) * (1.0 + z_loss * lse)
    if reduction != "none":
        mag = mag.sum() / (keep.sum().clamp(min=1) if reduction == "mean" else 1)
    assert loss.dtype == dtype
    check(f"cross_entropy {form} {reduction} ls={smoothing} z={z_loss}", loss, ref, mag, ulps=ULPS[dtype] + 2,
          rel=2.0 ** -18)
    if backward:
        dy = draw(tensors(ref.shape, dtype, device, scale=1.0)) if ref.dim() else \
            torch.tensor(draw(st.sampled_from([1.0, 0.5, -2.0])), dtype=dtype, device=device)
        (gx,) = grads(loss, [logits], dy)
        (gx64,) = grads(ref, [x64], dy.double())
        dmag = dy.double().abs().max() * (1.0 + z_loss * (lse.max() if lse.numel() else 0) * 2) * 4 if dy.numel() else 0
        check("cross_entropy dlogits", gx, gx64, dmag, ulps=ULPS[dtype] + 2, rel=2.0 ** -18)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- matmul


@given(data=st.data())
@cases(500)  # ~0.15 s a case under the interpreter
def test_matmul_against_fp64(matmul, device, request, data):
    """matmul(a, b, bias, activation): any M, K, N (0, 1, primes), transposed/strided operands."""
    draw = data.draw
    acts = [None, "gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu"]
    act = draw(st.sampled_from(acts))
    gated = act in ("geglu", "swiglu")
    m = draw(st.sampled_from([0, 1, 2, 3, 5, 17, 33]))
    k = draw(st.sampled_from([1, 2, 3, 7, 16, 31, 64]))
    n = draw(st.sampled_from([1, 2, 3, 5, 16, 33, 67])) * (2 if gated else 1)
    lead = (m,) if draw(st.booleans()) else ((1, m) if m else (0, 2))
    dtypes = [torch.float16, torch.bfloat16] + ([torch.float32] if device == "cpu" else [])
    dtype = draw(st.sampled_from(dtypes))
    backward = draw(st.booleans())
    specials = not backward and draw(st.integers(0, 5)) == 0
    a = draw(tensors(lead + (k,), dtype, device, scale=1.0, specials=specials, grad=backward))
    b = draw(tensors((k, n), dtype, device, layouts=["contiguous", "transposed", "padded", "offset"], scale=0.5,
                     grad=backward))
    bias = draw(tensors((n,), dtype, device, layouts=["contiguous", "offset"], scale=1.0, grad=backward)) \
        if draw(st.booleans()) else None
    y = matmul.matmul(a, b, bias, act)
    a64, b64 = a.detach().double().requires_grad_(backward), b.detach().double().requires_grad_(backward)
    bias64 = bias.detach().double().requires_grad_(backward) if bias is not None else None
    h = a64 @ b64 + (bias64 if bias64 is not None else 0.0)
    hmag = a64.detach().abs() @ b64.detach().abs() + (bias64.detach().abs() if bias is not None else 0.0)
    base = {"gelu": "gelu", "geglu": "gelu", "gelu_tanh": "gelu_tanh", "silu": "silu", "swiglu": "silu"}.get(act)
    if act is None:
        ref, mag = h, hmag
    elif act == "relu":
        ref, mag = torch.relu(h), hmag
    elif gated:
        p, gate = h.chunk(2, -1)
        pm, gm = hmag.chunk(2, -1)
        ref = p * _act64(base, gate, 0.0)
        mag = pm * (gate.detach().abs() + 1) + p.detach().abs() * gm * 1.2
    else:
        ref, mag = _act64(base, h, 0.0), hmag * 1.2
    # the kernel rounds once from fp32; products of half inputs are exact, the K-sum is fp32
    check(f"matmul act={act} {dtype}", y, ref, mag, rel=2.0 ** -16)
    if backward:
        dy = draw(tensors(ref.shape, dtype, device, scale=1.0))
        leaves = [a, b] + ([bias] if bias is not None else [])
        leaves64 = [a64, b64] + ([bias64] if bias is not None else [])
        got = grads(y, leaves, dy)
        want = grads(ref, leaves64 + [h], dy.double())
        # backward rounds dL/dh to the dtype, then two torch matmuls in the dtype: ulps of the sums of |terms|
        dh = want[-1].abs()
        if act is not None:  # act' is evaluated at h saved in the dtype (as eager saves linear's output)
            dyf = dy.double().abs()
            dh = dh + (dyf.repeat_interleave(2, -1) if gated else dyf) * (h.detach().abs() + 1.0)
        dh = dh.reshape(-1, h.shape[-1])
        a2 = a64.detach().abs().reshape(-1, k)
        mags = [(dh @ b64.detach().abs().t()).reshape(a.shape), a2.t() @ dh, dh.sum(0)]
        rel = 2.0 ** (2 - MANT[dtype]) if dtype != torch.float32 else 2.0 ** -16
        for name, gt, wt, mg in zip(("da", "db", "dbias"), got, want, mags):
            check(f"matmul act={act} {name}", gt, wt, mg, rel=rel)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- attention


@given(data=st.data())
@cases(100)  # ~0.4 s a case under the interpreter: fewer examples than the cheap ops
def test_attention_against_fp64(attention, device, request, data):
    """flash_attention: MHA/GQA/MQA, Sq/Sk from 1 to 33, head dims 8-80 (not powers of 2 too), bhsd/bshd,
    causal, boolean or additive broadcast masks (fully masked queries give 0), scale; strided q/k/v views."""
    draw = data.draw
    b = draw(st.integers(1, 2))
    hk = draw(st.sampled_from([1, 2]))
    hq = hk * draw(st.sampled_from([1, 2, 3]))
    sq, sk = draw(st.sampled_from([1, 2, 3, 5, 8, 17])), draw(st.sampled_from([1, 2, 3, 5, 8, 17, 33]))
    d = draw(st.sampled_from([8, 16, 24, 40, 64, 80]))
    dv = draw(st.sampled_from([d, d, 16]))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["bhsd", "bshd"]))
    backward = draw(st.booleans())
    shape = (lambda h, n, e: (b, n, h, e)) if layout == "bshd" else (lambda h, n, e: (b, h, n, e))
    q = draw(tensors(shape(hq, sq, d), dtype, device, scale=1.0, grad=backward,
                     layouts=["contiguous", "offset", "padded", "transposed"]))
    k = draw(tensors(shape(hk, sk, d), dtype, device, scale=1.0, grad=backward,
                     layouts=["contiguous", "offset", "padded", "transposed"]))
    v = draw(tensors(shape(hk, sk, dv), dtype, device, scale=1.0, grad=backward,
                     layouts=["contiguous", "offset", "padded"]))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.5]))
    mask_kind = draw(st.sampled_from([None, None, "bool", "add"]))
    mask = None
    if mask_kind:
        mshape = (draw(st.sampled_from([1, b])), draw(st.sampled_from([1, hq])), draw(st.sampled_from([1, sq])), sk)
        g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 31 - 1)))
        keep = torch.rand(mshape, generator=g) > 0.3
        mask = keep if mask_kind == "bool" else (torch.randn(mshape, generator=g).masked_fill(~keep, -math.inf)
                                                 .to(draw(st.sampled_from(DTYPES))))
        mask = mask.to(device)
    out = attention.flash_attention(q, k, v, attn_mask=mask, causal=causal, scale=scale, layout=layout)
    to_bhsd = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    q64, k64, v64 = (t.detach().double().requires_grad_(backward) for t in (q, k, v))
    qh, kh, vh = (to_bhsd(t) for t in (q64, k64, v64))
    kh, vh = kh.repeat_interleave(hq // hk, 1), vh.repeat_interleave(hq // hk, 1)
    sc = (1.0 / math.sqrt(d)) if scale is None else scale
    z = qh @ kh.transpose(-1, -2) * sc
    if mask is not None:
        z = z.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else z + mask.double()
    if causal:
        z = z.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=z.device).triu(1), -math.inf)
    dead = torch.isneginf(z).all(-1, keepdim=True)  # fully masked query: output 0 and no gradient
    p = torch.where(dead, 0.0, torch.softmax(torch.where(dead, 0.0, z), -1))  # (softmax of all -inf is NaN, and
    # its NaN gradient would leak through a where taken after it)
    o = p @ vh
    pd = p.detach()
    mag = pd @ vh.detach().abs()
    rel = 2.0 ** -MANT[dtype] if dtype != torch.float32 else 2.0 ** -17  # P is rounded to q's dtype before P @ V
    check(f"flash_attention {layout} causal={causal} mask={mask_kind} hq={hq} hk={hk}", out, to_bhsd(o), to_bhsd(mag),
          rel=rel)
    if backward:
        dy = draw(tensors(out.shape, dtype, device, scale=1.0))
        got = grads(out, [q, k, v], dy)
        want = grads(to_bhsd(o), [q64, k64, v64], dy.double())
        dyh = to_bhsd(dy.double()).abs()
        ds = pd * (dyh @ vh.detach().abs().transpose(-1, -2) + (dyh * o.detach().abs()).sum(-1, keepdim=True))
        group = lambda t: t.reshape(b, hk, hq // hk, *t.shape[2:]).sum(2)  # noqa: E731
        mags = [sc * ds @ kh.detach().abs(), group(sc * ds.transpose(-1, -2) @ qh.detach().abs()),
                group(pd.transpose(-1, -2) @ dyh)]
        grel = 2.0 ** (3 - MANT[dtype]) if dtype != torch.float32 else 2.0 ** -16
        for name, gt, wt, mg in zip(("dq", "dk", "dv"), got, want, mags):
            check(f"flash_attention {name}", gt, wt, to_bhsd(mg), rel=grel)
    count(request)  # a case counts once every check of it passed


# ----------------------------------------------------------------------------- the count


def test_zz_generated_case_count(request):
    """At least 10,000 x HYPOTHESIS_SCALE generated cases ran in this module (when the whole module ran)."""
    expected = {"test_norms_against_fp64", "test_case1_norms_wide_rows_against_fp64", "test_activations_against_fp64",
                "test_softmax_against_fp64", "test_case1_softmax_wide_rows_against_fp64",
                "test_cross_entropy_against_fp64", "test_matmul_against_fp64", "test_attention_against_fp64"}
    total = sum(COUNTS.values())
    _write_counts()
    print(f"\nreliability: {total} generated cases: {dict(COUNTS)}")
    if set(COUNTS) != expected:
        pytest.skip(f"only {sorted(COUNTS)} ran (of {len(expected)} property tests): count not asserted")
    assert total >= TARGET * SCALE, f"{total} generated cases < {TARGET * SCALE}"
