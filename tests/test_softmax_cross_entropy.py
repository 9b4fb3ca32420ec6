"""triton-softmax ``cross_entropy`` and the layers: values and gradients against fp64 PyTorch.

Reference: ``torch.nn.functional.cross_entropy`` in fp64 (label smoothing and ignore_index
included) plus ``z_loss * logsumexp(x)^2`` on non-ignored rows (PaLM's z-loss), reduced the
same way. Tolerances: the loss is computed in fp32 and rounded once (``ULPS`` of
test_softmax, plus ``ATOL_REL`` of the largest reference value for the fp32 sum); the gradient is
computed in fp32, rounded at the store and once more by the upstream-gradient multiply when that
is not 1 (the mean's 1/count), hence 2 ulps for half dtypes.
"""

import dataclasses
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .conftest import ORG
from .test_softmax import DTYPES, assert_close_ref, rand, team_mode  # noqa: F401 (team_mode: a fixture)

GRAD_ULPS = {torch.float32: 8, torch.float16: 2, torch.bfloat16: 2}


def ce_ref(x, t, *, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0):
    """fp64 reference: F.cross_entropy + z_loss * lse^2 on non-ignored rows, reduced as torch reduces."""
    x = x.double()
    loss = F.cross_entropy(x, t.long(), ignore_index=ignore_index, reduction="none", label_smoothing=label_smoothing)
    if z_loss:
        class_dim = 0 if x.dim() == 1 else 1
        loss = loss + z_loss * torch.logsumexp(x, class_dim).square() * (t != ignore_index)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (t != ignore_index).sum()


def targets(shape, V, device, ignore_frac=0.25, ignore_index=-100):
    t = torch.randint(0, V, shape, device=device)
    return t.masked_fill(torch.rand(shape, device=device) < ignore_frac, ignore_index)


def check(softmax, x, t, dtype, **kw):
    """Loss and gradient of ours against the fp64 reference."""
    xs = x.detach().to(dtype).requires_grad_()
    loss = softmax.cross_entropy(xs, t, **kw)
    assert loss.dtype == dtype
    xr = xs.detach().double().requires_grad_()
    ref = ce_ref(xr, t, **kw)
    assert_close_ref(loss, ref.detach(), rel_atol=1e-6)
    dl = torch.randn(loss.shape, device=x.device).to(dtype) if loss.dim() else None
    (g,) = torch.autograd.grad(loss, xs, dl)
    (gr,) = torch.autograd.grad(ref, xr, dl.double() if dl is not None else None)
    assert_close_ref(g, gr, ulps=GRAD_ULPS[dtype], rel_atol=1e-5)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- values and gradients


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("V", [1, 3, 127, 5003, 20011])  # 20011: looped for fp32
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_and_gradients(softmax, device, V, dtype, reduction):
    x = rand((6, V), torch.float32, device, scale=2.0)
    t = targets((6,), V, device)
    check(softmax, x, t, dtype, reduction=reduction)


@pytest.mark.parametrize("V", [7, 20011])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing,z_loss", [(0.1, 0.0), (0.0, 1e-3), (0.3, 0.5)])
def test_label_smoothing_and_z_loss(softmax, device, V, reduction, label_smoothing, z_loss):
    x = rand((5, V), torch.float32, device, scale=3.0)
    t = targets((5,), V, device)
    check(softmax, x, t, torch.float32, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
    check(softmax, x, t, torch.bfloat16, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)


@pytest.mark.parametrize("V", [7, 4099, 20011])  # one block; looped for fp32
def test_label_smoothing_sums_every_column(softmax, device, V):
    """Large first and last logits: the smoothing term's sum over the classes must hold both (with randn logits a
    column left out costs ~5e-6, inside the loss tolerance; here 1e-3)."""
    x = rand((4, V), torch.float32, device)
    x[:, 0], x[:, -1] = 40.0, -40.0
    t = torch.tensor([1, 2, 0, V - 1], device=device) % V
    loss = softmax.cross_entropy(x, t, reduction="none", label_smoothing=0.5)
    assert_close_ref(loss, ce_ref(x, t, reduction="none", label_smoothing=0.5), rel_atol=2e-6)


@pytest.mark.parametrize("ignore_index", [-100, 0, 3, -1])
def test_ignore_index_everywhere(softmax, device, ignore_index):
    x = rand((8, 11), torch.float32, device)
    t = torch.randint(0, 11, (8,), device=device)
    t[::3] = ignore_index
    for reduction in ("mean", "sum", "none"):
        for ls in (0.0, 0.2):
            check(softmax, x, t, torch.float32, ignore_index=ignore_index, reduction=reduction, label_smoothing=ls,
                  z_loss=1e-2)


def test_reductions_span_several_blocks(softmax, device, monkeypatch):
    """More rows than one step of the one-program count and sum (``REDUCE_BLOCK``, 1024; 64 here, so that the
    interpreter runs 131 rows instead of thousands), over a plain and a (N, C, d) layout, with targets ignored at
    random; one row counted of 131; the same bits twice."""
    import sys

    ce = sys.modules[softmax.__name__ + ".cross_entropy"]
    retuned = sys.modules[softmax.__name__ + "._launch"].retuned
    monkeypatch.setattr(ce, "REDUCE_BLOCK", 64)
    ce._reduce_meta.cache_clear()
    retuned()
    try:
        x = rand((131, 5), torch.float32, device, scale=2.0)
        t = targets((131,), 5, device, ignore_frac=0.4)
        for reduction in ("mean", "sum"):
            check(softmax, x, t, torch.float32, reduction=reduction)
        x3 = rand((3, 4, 47), torch.float32, device)  # classes in dim 1: rows strided by 1 within a sample
        check(softmax, x3, targets((3, 47), 4, device), torch.float32)
        one = torch.full((131,), -100, device=device)
        one[130] = 2
        check(softmax, x, one, torch.float32)
        assert torch.equal(softmax.cross_entropy(x, t), softmax.cross_entropy(x, t))
    finally:
        monkeypatch.undo()
        ce._reduce_meta.cache_clear()
        retuned()


def test_all_targets_ignored_and_out_of_range(softmax, device):
    x = rand((4, 9), torch.float32, device).requires_grad_()
    t = torch.full((4,), -100, device=device)
    loss = softmax.cross_entropy(x, t)
    ref = F.cross_entropy(x, t)
    assert torch.isnan(loss) and torch.isnan(ref)  # 0 / 0, as torch
    (g,) = torch.autograd.grad(loss, x)
    assert torch.equal(g, torch.zeros_like(x))  # torch's gradient is 0 too
    assert softmax.cross_entropy(x, t, reduction="sum") == 0
    bad = torch.tensor([0, 9, -5, 2], device=device)  # torch raises; no host sync here: NaN on those rows
    rows = softmax.cross_entropy(x.detach(), bad, reduction="none")
    assert torch.isnan(rows[1:3]).all() and torch.isfinite(rows[[0, 3]]).all()


def test_masked_vocabulary_with_minus_inf_logits(softmax, device):
    x = rand((3, 50), torch.float32, device)
    x[:, 40:] = float("-inf")  # e.g. padded vocabulary
    t = torch.tensor([1, 39, -100], device=device)
    check(softmax, x, t, torch.float32)  # finite: the smoothing term is off, never 0 * inf


# ----------------------------------------------------------------------------- case 4: tiny shapes, optional outputs


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("requires_grad", [True, False])
@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-4), (0.2, 0.1)])
def test_case4_tiny_logits_targets_all_zero(softmax, device, reduction, requires_grad, label_smoothing, z_loss):
    """(4, 3) fp32 logits from randn, targets [0, 0, 0, 0] (a peer returned 0.0: an optional output aliased the
    loss). Every optional output on and off: the stored gradient (requires_grad), z-loss, label smoothing."""
    x = torch.randn(4, 3, device=device).requires_grad_(requires_grad)
    t = torch.zeros(4, dtype=torch.long, device=device)
    kw = dict(reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss)
    loss = softmax.cross_entropy(x, t, **kw)
    xr = x.detach().double().requires_grad_()
    ref = ce_ref(xr, t, **kw)
    assert (loss != 0).all()
    assert_close_ref(loss.detach(), ref.detach())
    if z_loss == 0:
        torch.testing.assert_close(loss, F.cross_entropy(x, t, reduction=reduction, label_smoothing=label_smoothing))
    if requires_grad:
        loss.sum().backward()
        ref.sum().backward()
        assert_close_ref(x.grad, xr.grad, rel_atol=1e-6)
    with torch.no_grad():  # inference: no gradient stored, same loss
        assert torch.equal(softmax.cross_entropy(x, t, **kw), loss.detach())


# ----------------------------------------------------------------------------- views and shapes


def test_views_sliced_shifted_and_k_dim(softmax, device):
    B, S, V = 2, 6, 40
    h = rand((B, S, V + 8), torch.float32, device)
    labels = torch.randint(0, V, (B, S), device=device)
    sliced = h[..., :V]  # vocabulary slice: row stride V + 8
    check(softmax, h.reshape(-1, V + 8)[:, :V], labels.reshape(-1), torch.float32)
    # causal-LM shift without a copy: (B, V, S-1) view of h[:, :-1] in F.cross_entropy's K-dim form
    shifted = sliced[:, :-1].transpose(1, 2)
    assert shifted.data_ptr() == h.data_ptr()
    check(softmax, shifted, labels[:, 1:], torch.float32)
    check(softmax, shifted, labels[:, 1:], torch.bfloat16, reduction="none")
    x2 = rand((9, V), torch.float32, device)
    check(softmax, x2[:-1], labels.reshape(-1)[:8], torch.float32)  # rows view
    check(softmax, rand((V,), torch.float32, device), torch.tensor(3, device=device), torch.float32)  # 1-D
    x4 = rand((2, 5, 3, 4), torch.float32, device)  # (N, C, d1, d2)
    check(softmax, x4, targets((2, 3, 4), 5, device), torch.float32, label_smoothing=0.1)
    texp = torch.tensor([1], device=device).expand(8)  # stride-0 target
    check(softmax, x2[:8], texp, torch.float32)
    check(softmax, x2[:8], texp.to(torch.int32), torch.float32)


def test_empty_batch(softmax, device):
    x = torch.empty(0, 7, device=device, requires_grad=True)
    t = torch.empty(0, dtype=torch.long, device=device)
    assert torch.isnan(softmax.cross_entropy(x, t)) and torch.isnan(F.cross_entropy(x, t))
    assert softmax.cross_entropy(x, t, reduction="none").shape == (0,)
    softmax.cross_entropy(x, t, reduction="sum").backward()
    assert x.grad.shape == x.shape


def test_backward_twice_and_loss_used_twice(softmax, device):
    """Case 3 for the loss: the stored gradient is not consumed or overwritten by a backward."""
    x = rand((5, 13), torch.float32, device).requires_grad_()
    t = targets((5,), 13, device)
    loss = softmax.cross_entropy(x, t, label_smoothing=0.1)
    total = loss * 2 + loss.square()
    total.backward(retain_graph=True)
    first = x.grad.clone()
    total.backward()
    xr = x.detach().double().requires_grad_()
    lr = ce_ref(xr, t, label_smoothing=0.1)
    (lr * 2 + lr.square()).backward()
    assert_close_ref(first, xr.grad, rel_atol=1e-6)
    assert_close_ref(x.grad, 2 * xr.grad, rel_atol=1e-6)


def test_batched_upstream_gradients_after_an_in_place_backward(softmax, device):
    """A backward with upstream gradients batched by PyTorch's legacy vmap (``is_grads_batched``, jacobian /
    hessian with ``vectorize=True``) after an eager backward that rescaled the stored gradient in place: each
    batch entry is the gradient for its own upstream gradient, not for that times the one applied before."""
    x = rand((4, 11), torch.float32, device).requires_grad_()
    t = targets((4,), 11, device)
    t[1] = -100
    rows = softmax.cross_entropy(x, t, reduction="none")
    first = torch.tensor([2.0, 1.0, -3.0, 0.5], device=device)
    torch.autograd.grad(rows, x, first, retain_graph=True)  # rescales g in place
    batched = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.25, 4.0, -1.0, 2.0]], device=device)
    (got,) = torch.autograd.grad(rows, x, batched, is_grads_batched=True)
    xr = x.detach().double().requires_grad_()
    ref_rows = ce_ref(xr, t, reduction="none")
    for b in range(2):
        (want,) = torch.autograd.grad(ref_rows, xr, batched[b].double(), retain_graph=True)
        assert_close_ref(got[b], want, rel_atol=1e-6)


def test_backward_rescales_only_rows_whose_upstream_gradient_is_not_one(softmax, device):
    """The forward stores the gradient for an upstream gradient of 1; the backward rescales in place only
    the rows whose upstream gradient differs from the one already applied. Repeated backwards through
    the same graph (retain_graph) with upstream gradients 1, 3, 3 accumulate 1 + 3 + 3 times the gradient;
    per-row upstream gradients mixing exact 1s, other values and inf on ignored rows ("none")."""
    x = rand((6, 29), torch.float32, device).requires_grad_()
    t = targets((6,), 29, device)
    t[2] = -100
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(ce_ref(xr, t, label_smoothing=0.05), xr)
    loss = softmax.cross_entropy(x, t, label_smoothing=0.05)
    loss.backward(retain_graph=True)
    assert_close_ref(x.grad, gr, rel_atol=1e-6)
    (loss * 3).backward(retain_graph=True)
    assert_close_ref(x.grad, 4 * gr, rel_atol=1e-6)
    (loss * 3).backward()
    assert_close_ref(x.grad, 7 * gr, rel_atol=1e-6)

    xb = x.detach().to(torch.bfloat16).requires_grad_()
    rows = softmax.cross_entropy(xb, t, reduction="none")
    dl = torch.tensor([1.0, 0.5, float("inf"), 1.0, -2.0, 1.0], device=device)  # row 2 is ignored
    (g,) = torch.autograd.grad(rows, xb, dl.to(torch.bfloat16), retain_graph=True)
    xr = xb.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(ce_ref(xr, t, reduction="none"), xr, dl.double().nan_to_num(posinf=0.0))
    assert torch.equal(g[2], torch.zeros_like(g[2]))  # torch: ignored rows get 0 whatever the upstream gradient
    assert_close_ref(g, gr, ulps=2, rel_atol=1e-5)
    (g2,) = torch.autograd.grad(rows, xb, dl.to(torch.bfloat16))  # same upstream gradient again: same values
    assert torch.equal(g2, g)


def test_case3_gradient_handed_out_is_never_changed_by_a_later_backward(softmax, device):
    """The first backward hands out the stored gradient itself; a later backward through the same graph
    (retain_graph) with another upstream gradient must not rescale that tensor under the caller's feet."""
    x = rand((5, 31), torch.float32, device).requires_grad_()
    t = targets((5,), 31, device)
    loss = softmax.cross_entropy(x, t)
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    kept = g1.clone()
    (g3,) = torch.autograd.grad(loss * 3, x, retain_graph=True)
    (g5,) = torch.autograd.grad(loss, x, torch.tensor(5.0, device=device))
    assert torch.equal(g1, kept)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(ce_ref(xr, t), xr)
    for g, k in [(g1, 1), (g3, 3), (g5, 5)]:
        assert_close_ref(g, k * gr, rel_atol=1e-6)


def test_later_backward_after_the_handed_out_gradient_changed_in_place_names_the_cause(softmax, device):
    """The first backward hands out the stored gradient itself. A caller that changes it in place (a clip in a
    hook, ``g.mul_``) and then runs a later backward through the same graph (retain_graph), which torch's
    ``F.cross_entropy`` allows, got PyTorch's generic "one of the variables needed for gradient computation has
    been modified by an inplace operation" about a tensor it never saved: the error names the cause and the
    way out (clone the gradient before changing it)."""
    x = rand((4, 9), torch.float32, device).requires_grad_()
    t = targets((4,), 9, device)
    loss = softmax.cross_entropy(x, t)
    (g1,) = torch.autograd.grad(loss, x, retain_graph=True)
    g1.mul_(0.5)
    with pytest.raises(RuntimeError, match="handed out by an earlier backward .* changed in place"):
        torch.autograd.grad(loss, x)

    h = x.detach().clone().requires_grad_()
    logits = h * 1.0
    logits.register_hook(lambda g: g.clamp_(-0.05, 0.05))  # in place: clamps the stored gradient
    loss = softmax.cross_entropy(logits, t, reduction="sum")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="clone"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_recompute_backward_equals_fused(softmax, device, reduction):
    """The recompute mode (the forward keeps the logsumexp, the backward recomputes the gradient from
    the logits in one pass; what torch.compile uses) against the fp64 reference and the fused mode."""
    import sys

    mod = sys.modules[softmax.__name__ + ".cross_entropy"]
    x = rand((7, 20011), torch.float32, device, scale=2.0)
    t = targets((7,), 20011, device)
    kw = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    dl = torch.randn(7, device=device) if reduction == "none" else torch.tensor(0.75, device=device)
    grads = []
    for recompute in (False, True):
        mod.RECOMPUTE = recompute
        try:
            check(softmax, x, t, torch.float32, **kw)
            check(softmax, x, t, torch.bfloat16, **kw)
            xs = x.clone().requires_grad_()
            loss = softmax.cross_entropy(xs, t, **kw)
            grads.append(torch.autograd.grad(loss, xs, dl)[0])
        finally:
            mod.RECOMPUTE = False
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kw", [dict(), dict(reduction="sum", label_smoothing=0.1), dict(reduction="none", z_loss=1e-3),
                                dict(label_smoothing=0.3, z_loss=0.5, ignore_index=5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_team_path_values_and_gradients(softmax, device, team_mode, dtype, kw):
    """Rows over a team of programs (1024-byte chunks: 2053 bf16 / 1031 fp32 classes -> 5 members): loss
    (member 0 writes it) and gradient (every member its chunk) against fp64, with ignored targets,
    targets in the first, a middle and the last member's chunk, and a fully -inf row chunk."""
    V = 2053 if dtype == torch.bfloat16 else 1031
    x = rand((6, V), torch.float32, device, scale=2.0)
    x[2, : V // 2] = float("-inf")  # the first members of that row see only -inf
    t = torch.tensor([0, V - 1, V - 3, kw.get("ignore_index", -100), 5, V // 2 + 1], device=device)
    check(softmax, x, t, dtype, **kw)
    assert [c[0] for c in team_mode.calls] == [5] * len(team_mode.calls) and team_mode.calls


def test_team_path_recompute_no_grad_and_bad_targets(softmax, device, team_mode):
    """The recompute mode (member 0 stores the row's logsumexp for the backward) equals the fused one;
    the no-grad forward only reads; out-of-range targets give NaN rows (no host sync), as the looped path."""
    import sys

    mod = sys.modules[softmax.__name__ + ".cross_entropy"]
    x = rand((5, 1031), torch.float32, device, scale=2.0)
    t = targets((5,), 1031, device)
    kw = dict(reduction="none", label_smoothing=0.1, z_loss=1e-3)
    dl = torch.randn(5, device=device)
    grads = []
    for recompute in (False, True):
        mod.RECOMPUTE = recompute
        try:
            xs = x.clone().requires_grad_()
            grads.append(torch.autograd.grad(softmax.cross_entropy(xs, t, **kw), xs, dl)[0])
        finally:
            mod.RECOMPUTE = False
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-9)
    with torch.no_grad():
        assert_close_ref(softmax.cross_entropy(x, t, **kw), ce_ref(x, t, **kw), rel_atol=1e-6)
    bad = torch.tensor([0, 1031, -5, 2, 1030], device=device)
    rows = softmax.cross_entropy(x, bad, reduction="none")
    assert torch.isnan(rows[1:3]).all() and torch.isfinite(rows[[0, 3, 4]]).all()
    # the gradient written by the members: NaN rows for the bad targets, exactly 0 on an ignored row
    bad[4] = -100
    xs = x.clone().requires_grad_()
    g = torch.autograd.grad(softmax.cross_entropy(xs, bad, reduction="none").sum(), xs)[0]
    assert torch.isnan(g[1:3]).all() and torch.isfinite(g[[0, 3]]).all() and torch.equal(g[4], torch.zeros_like(g[4]))
    xr = x[[0, 3]].double().requires_grad_()
    assert_close_ref(g[[0, 3]], torch.autograd.grad(ce_ref(xr, bad[[0, 3]], reduction="none").sum(), xr)[0],
                     rel_atol=1e-6)
    assert len(team_mode.calls) == 5 and all(c[0] == 5 for c in team_mode.calls)


def test_team_path_all_targets_ignored(softmax, device, team_mode):
    """The team path with every target ignored: "mean" is 0 / 0 = NaN as torch, the gradient exactly 0 (w = 1/0 is
    never multiplied in), "sum" 0; also on rows of -inf logits."""
    x = rand((4, 1031), torch.float32, device, scale=2.0)
    x[1] = float("-inf")
    t = torch.full((4,), -100, device=device)
    xs = x.clone().requires_grad_()
    loss = softmax.cross_entropy(xs, t)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x, t))
    (g,) = torch.autograd.grad(loss, xs)
    assert torch.equal(g, torch.zeros_like(x))
    assert softmax.cross_entropy(x, t, reduction="sum") == 0
    assert team_mode.calls and all(c[0] == 5 for c in team_mode.calls)


def test_team_tiers_by_width(softmax):
    """The shipped teams of the cross-entropy and the softmax forward (``_launch.TEAM_TUNED``): rows of at least
    64 KiB, on the smallest chunk whose team has at most 32 members, the widest rows on the last tier; a * b + c
    may contract in the cross-entropy only; the softmax forward's fp32 rows of 32-64 KiB on teams of one (not 16-bit
    rows of those bytes). The softmax backward: 4 KiB chunks from 128 KiB rows up to 32 members, else 8 KiB chunks
    from 32 KiB rows."""
    launch = sys.modules[softmax.__name__ + "._launch"]
    team = sys.modules[softmax.__name__ + "._team"]
    widths = (16384, 32000, 32768, 65536, 100000, 128256, 131072, 151936, 262144, 524288)
    want = {65536: 4, 100000: 8, 128256: 8, 131072: 8, 151936: 16, 262144: 16, 524288: 16}
    for kind, min_bytes, fusion in (("cross_entropy", 65536, True), ("softmax", 65536, False)):
        chunk = {}
        for V in widths:
            s = team.tier_for(launch.TEAM_TUNED[kind], 2 * V, V)
            if 2 * V < min_bytes:
                assert 2 * V < s["min_row_bytes"]  # the looped kernels
                continue
            assert s["num_warps"] * s["programs_per_sm"] == 16 and s["min_row_bytes"] == min_bytes
            assert s.get("fp_fusion", False) is fusion
            chunk[V] = s["chunk_bytes"] // 1024
        assert chunk == {32768: 4, **want}
    bwd = {V: team.tier_for(launch.TEAM_TUNED["softmax_bwd"], 2 * V, V)["chunk_bytes"] // 1024 for V in widths}
    for V in widths:  # the backward's teams from 128 KiB rows only (looped below: faster on the H200, session 16)
        s = team.tier_for(launch.TEAM_TUNED["softmax_bwd"], 2 * V, V)
        assert (2 * V >= s["min_row_bytes"]) is (V >= 65536)
    assert bwd == {16384: 8, 32000: 8, 32768: 8, 65536: 4, 100000: 8, 128256: 8, 131072: 8, 151936: 8, 262144: 8,
                   524288: 8}
    # fp32 rows of 32-64 KiB: one program per row (a team of one); 16-bit rows of those bytes: looped below 64 KiB,
    # teams from 64 KiB
    for N, alone in ((8192, False), (8193, True), (12007, True), (16384, True), (16385, False)):
        s = team.tier_for(launch.TEAM_TUNED["softmax"], 4 * N, N)
        assert (4 * N >= s["min_row_bytes"] and s.get("max_team") == 1) is alone
        s = team.tier_for(launch.TEAM_TUNED["softmax"], 2 * 2 * N, 2 * N)  # bf16, the same bytes
        assert s.get("max_team") != 1 and (4 * N >= s["min_row_bytes"]) is (N >= 16384)
    assert team.tier_for(None, 1 << 20, 1 << 19) is None
    assert team.tier_for({"chunk_bytes": 1}, 1 << 20, 1 << 19) == {"chunk_bytes": 1}


def test_team_plan_fp_fusion_option(softmax, monkeypatch):
    """``fp_fusion`` goes from a setting into the plan, and the plan names ``enable_fp_fusion`` (True with it,
    False without) wherever the launch takes options, never leaving it to Triton's default."""
    team = sys.modules[softmax.__name__ + "._team"]
    setting = {"min_row_bytes": 1, "chunk_bytes": 1024, "num_warps": 1, "programs_per_sm": 1, "maxnreg": 128}
    cpu = torch.device("cpu")
    assert team.team_split(2048, 2, 4, cpu, setting, True).fp_fusion is False
    plan = team.team_split(2048, 2, 4, cpu, {**setting, "fp_fusion": True}, True)
    assert plan.fp_fusion is True and plan.team == 4
    monkeypatch.setattr(team, "launch_options", lambda kernel, fp_fusion=False: {"enable_fp_fusion": fp_fusion})  # GPU
    assert dict(plan.meta(None, cpu, 0))["enable_fp_fusion"] is True
    assert dict(dataclasses.replace(plan, fp_fusion=False).meta(None, cpu, 0))["enable_fp_fusion"] is False
    monkeypatch.setattr(team, "launch_options", lambda kernel, fp_fusion=False: {})  # the interpreter: no options
    assert "enable_fp_fusion" not in dict(plan.meta(None, cpu, 0))


def test_misaligned_rows_stay_off_the_teams(softmax, device, team_mode):
    """With ``TEAM_ALIGNED_ROWS_ONLY`` (shipped; the team tests switch it off) a cross-entropy whose rows do not
    start on 16 bytes runs looped and an aligned one on teams; the alignment test runs only where a team would."""
    launch = team_mode.launch
    x0 = torch.empty(0, dtype=torch.bfloat16, device=device)
    asked = []

    def misaligned():
        asked.append(1)
        return False
    assert launch.team_for(2048, x0, 10, "cross_entropy", misaligned) is not None  # rule off in team_mode
    launch.TEAM_ALIGNED_ROWS_ONLY = True
    launch.retuned()  # the launch plans follow the setting
    assert launch.team_for(2048, x0, 10, "cross_entropy", misaligned) is None
    assert launch.team_for(2048, x0, 10, "cross_entropy", lambda: True) is not None
    for V, on_teams in ((2056, False), (2048, True)):  # 2056 = 16 * 128 + 8: 16-byte rows, not known to be
        del team_mode.calls[:]
        x = rand((3, V), torch.float32, device, scale=2.0)
        t = targets((3,), V, device)
        check(softmax, x, t, torch.float32)
        assert bool(team_mode.calls) is on_teams
    launch.TEAM_TUNED["cross_entropy"] = None
    n = len(asked)
    assert launch.team_for(2048, x0, 10, "cross_entropy", misaligned) is None and len(asked) == n


def test_rows_aligned(softmax, device):
    """rows_aligned: every row of every tensor given starts on 16 bytes, with unit column stride."""
    common = sys.modules[softmax.__name__ + "._common"]
    buf = torch.zeros(4 * 4096 + 8, dtype=torch.bfloat16, device=device)
    for x, want in ((buf[:4 * 4096].view(4, 4096), True), (buf[8:].view(4, 4096), True),
                    (buf[1:4097].view(1, 4096), False),  # base pointer off by 2 bytes
                    (buf[:4 * 4095].view(4, 4095), False),  # row stride 8190 bytes
                    (buf[:4 * 4088].view(4, 4088), False),  # 16-byte rows, but 4088 is not a multiple of 16
                    (buf[:4 * 4096].view(4, 4096)[:, :4093], True),  # sliced rows keep their starts
                    (torch.zeros(2, 12320, device=device)[:, :12312].view(2, 3, 4104)[:, :, :4096], False),  # 2 groups,
                    # the outer stride 12320 a multiple of 16, the inner 4104 not
                    (buf[:4 * 4096].view(4096, 4).t(), False)):  # column stride 4
        layout = common.row_layout([x, None], x.dim() - 1)
        assert common.rows_aligned(layout, [x, None]) is want, (x.shape, x.stride(), x.storage_offset())
    x = buf[:4 * 4096].view(4, 4096)
    other = buf[2:4 * 4096 + 2].view(4, 4096)  # the second tensor decides
    assert not common.rows_aligned(common.row_layout([x, None, other], 1), [x, None, other])


@pytest.mark.gpu
@pytest.mark.parametrize("V,setting", [(65536, "shipped"), (128256, "shipped"), (262144, "shipped"),
                                       (128256, "pinned")])
def test_team_spinning_path_on_gpu(softmax, device, monkeypatch, V, setting):
    """The team path on a GPU (persistent teams whose members spin on each other's partials): the shipped tiers
    (1-, 2- and 4-warp programs, fp contraction, the target's element written after a barrier) and one pinned
    setting; loss and gradient against fp64, torch's F.cross_entropy in bf16, the same bits twice."""
    if device != "cuda":
        pytest.skip("the spinning path needs TEST_DEVICE=cuda")
    launch = sys.modules[softmax.__name__ + "._launch"]
    if setting == "pinned":
        monkeypatch.setitem(launch.TEAM_TUNED, "cross_entropy", {"min_row_bytes": 65537, "chunk_bytes": 8192,
                                                                 "num_warps": 4, "programs_per_sm": 5, "maxnreg": 96})
    launch.retuned()  # the launch plans follow the setting, both ways
    try:
        _spin_checks(softmax, device, launch, V)
    finally:
        monkeypatch.undo()
        launch.retuned()


def _spin_checks(softmax, device, launch, V):
    x0 = torch.empty(0, dtype=torch.bfloat16, device=device)
    assert launch.team_for(V, x0, 512, "cross_entropy", lambda: True) is not None
    for dtype in (torch.bfloat16, torch.float32):
        x = rand((512, V), torch.float32, device, scale=2.0)
        t = targets((512,), V, device)
        t[0] = V - 1  # the last member's last column
        check(softmax, x, t, dtype, label_smoothing=0.1)
        xs = x.to(dtype).requires_grad_()
        g1 = torch.autograd.grad(softmax.cross_entropy(xs, t), xs)[0]
        g2 = torch.autograd.grad(softmax.cross_entropy(xs, t), xs)[0]
        gt = torch.autograd.grad(F.cross_entropy(xs, t), xs)[0]
        assert torch.equal(g1, g2)
        torch.testing.assert_close(g1.float(), gt.float(), rtol=0, atol=2 ** -7 * float(gt.abs().max()))


@pytest.mark.gpu
def test_cuda_graph_capture_forward_backward(softmax, device):
    """Loss and gradient captured in one CUDA graph (no host sync anywhere) and replayed on new logits."""
    if device != "cuda":
        pytest.skip("CUDA graphs need TEST_DEVICE=cuda")
    x = torch.randn(64, 5003, device=device, dtype=torch.bfloat16).requires_grad_()
    t = targets((64,), 5003, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            x.grad = None
            softmax.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-4).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = softmax.cross_entropy(x, t, label_smoothing=0.1, z_loss=1e-4)
        loss.backward()
    new = torch.randn_like(x)
    with torch.no_grad():
        x.copy_(new)
        x.grad.fill_(float("nan"))  # poisoned: x.grad was None at capture, so the replay overwrites it
    graph.replay()
    xe = new.clone().requires_grad_()
    le = softmax.cross_entropy(xe, t, label_smoothing=0.1, z_loss=1e-4)
    le.backward()
    assert torch.equal(loss, le) and torch.equal(x.grad, xe.grad)


def test_rows_past_16_kib_loop_with_the_setting_of_their_mode(softmax, device):
    """Rows wider than 16 KiB loop over chunks (a row of up to 64 KiB in one block left one program per SM with
    its loads not overlapped): 4 KiB chunks when the forward also writes the gradient, 8 KiB for the forward
    alone; 16 KiB rows stay in one block. Loss and gradient of a 40 KiB bf16 row in both modes against fp64."""
    launch = sys.modules[softmax.__name__ + "._launch"]
    x = rand((5, 20011), torch.float32, device, scale=2.0)
    xb = x.to(torch.bfloat16)
    grad_cfg, fwd_cfg = (launch.config_for(20011, xb, k) for k in ("cross_entropy_grad", "cross_entropy"))
    assert grad_cfg.loop and grad_cfg.block_n * 2 == 4096 and grad_cfg.num_warps == 4 and grad_cfg.prefetch
    assert fwd_cfg.loop and fwd_cfg.block_n * 2 == 8192 and fwd_cfg.num_warps == 4
    assert not launch.config_for(8192, xb, "cross_entropy_grad").loop
    t = torch.tensor([0, 20010, 777, -100, 12345], device=device)
    check(softmax, x, t, torch.bfloat16, reduction="sum")
    with torch.no_grad():
        assert_close_ref(softmax.cross_entropy(xb, t, reduction="none"), ce_ref(xb.double(), t, reduction="none"),
                         rel_atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("V", [131072, 262144])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_wide_vocabulary(softmax, device, V, dtype):
    x = rand((3, V), torch.float32, device, scale=2.0)
    t = torch.tensor([0, V - 1, 12345], device=device)
    check(softmax, x, t, dtype, label_smoothing=0.1, z_loss=1e-4)


# ----------------------------------------------------------------------------- ops, compile, errors


def test_opcheck(softmax, device):
    op = getattr(softmax._ops.ops, "cross_entropy_fwd").default
    x = rand((4, 37), torch.float32, device).requires_grad_()
    t = targets((4,), 37, device)
    torch.library.opcheck(op, (x, t, 1, -100, 0.0, 0.0, "mean", 1))  # fused gradient
    torch.library.opcheck(op, (x, t, 1, -100, 0.1, 1e-3, "sum", 1))
    torch.library.opcheck(op, (x, t, 1, -100, 0.1, 1e-3, "mean", 2))  # recompute: each row's max, log sum exp kept
    torch.library.opcheck(op, (x.detach(), t, 1, -100, 0.0, 0.0, "none", 0))
    x3, t3 = rand((2, 5, 3), torch.float32, device), targets((2, 3), 5, device)
    torch.library.opcheck(op, (x3, t3, 1, -100, 0.2, 0.0, "none", 0))

    def stats(logits):  # what the recompute forward keeps: (rows, 2) flat, the max and the log of the sum of exp
        rows = logits.movedim(1, -1).reshape(-1, logits.shape[1]).detach()
        mx = rows.max(-1).values
        return torch.stack([mx, torch.logsumexp(rows - mx[:, None], -1)], -1).flatten()

    bwd = getattr(softmax._ops.ops, "cross_entropy_bwd").default
    torch.library.opcheck(bwd, (x.detach(), t, stats(x), torch.tensor(0.5, device=device), 1, -100, 0.1, 1e-3, "mean"))
    torch.library.opcheck(bwd, (x3, t3, stats(x3), rand((2, 3), torch.float32, device), 1, -100, 0.0, 0.0, "none"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_case5_compile_fullgraph_no_host_sync(softmax, device, backend):
    """fullgraph=True fails on a graph break, so a ``.item()`` (host sync) anywhere would fail here."""
    def f(x, t):
        return (softmax.cross_entropy(x, t) + softmax.cross_entropy(x, t, reduction="sum", label_smoothing=0.1,
                                                                     z_loss=1e-3) * 0.5)

    x = rand((6, 19), torch.float32, device)
    t = targets((6,), 19, device)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(f, fullgraph=True, backend=backend)(xc, t)
    y.backward()
    ye = f(xe, t)
    ye.backward()
    assert torch.equal(y, ye)
    assert torch.equal(xc.grad, xe.grad)


def test_bad_inputs_raise_clear_errors(softmax, device):
    x = torch.randn(4, 5, device=device)
    t = torch.zeros(4, dtype=torch.long, device=device)
    with pytest.raises(TypeError, match=r"logits must have dtype .*float64"):
        softmax.cross_entropy(x.double(), t)
    with pytest.raises(TypeError, match="class-probability targets are not supported"):
        softmax.cross_entropy(x, torch.rand(4, 5, device=device))
    with pytest.raises(TypeError, match="target must have dtype torch.int64 or torch.int32"):
        softmax.cross_entropy(x, t.to(torch.int16))
    with pytest.raises(ValueError, match=r"target must have shape \(4,\)"):
        softmax.cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="reduction must be one of"):
        softmax.cross_entropy(x, t, reduction="batchmean")
    with pytest.raises(ValueError, match=r"label_smoothing must be a finite number in \[0.0, 1.0\]"):
        softmax.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="z_loss must be a finite number >= 0"):
        softmax.cross_entropy(x, t, z_loss=-1.0)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        softmax.cross_entropy(x, t, ignore_index=1.0)
    with pytest.raises(ValueError, match="at least one dimension"):
        softmax.cross_entropy(torch.tensor(1.0, device=device), t)
    with pytest.raises(ValueError, match="target is on meta"):
        softmax.cross_entropy(x, t.to("meta"))


def test_gradient_of_the_gradient_raises(softmax, device):
    """create_graph=True through the fused eager backward raises (the stored gradient has no graph back to the
    logits: it used to come back detached, so a gradient penalty added nothing); a first-order gradient with
    create_graph off still equals F.cross_entropy's, and the same loss then backpropagates normally."""
    x = torch.randn(3, 8, device=device, requires_grad=True)
    t = torch.randint(0, 8, (3,), device=device)
    with pytest.raises(RuntimeError, match=r"cross_entropy: a gradient of the gradient \(create_graph=True\)"):
        torch.autograd.grad(softmax.cross_entropy(x, t), x, create_graph=True)
    loss = softmax.cross_entropy(x, t)
    (g,) = torch.autograd.grad(loss, x, retain_graph=True)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(F.cross_entropy(xr, t), xr)
    assert_close_ref(g, gr)
    loss.backward()
    assert_close_ref(x.grad, gr)


@pytest.mark.parametrize("torch_order", [False, True], ids=["fused", "torch_order"])
def test_gradient_of_the_gradient_raises_under_torch_func_and_torch_order(softmax, device, torch_order):
    """A gradient of the gradient under torch.func (grad of grad, jacrev of grad: Hessians) raises the
    cross_entropy message, as in eager code; before, the fused path's stored gradient (no graph back to the
    logits) gave a second derivative of 0 without a word. The torch-order backward (the CrossEntropyLoss layer's)
    raises it too at the second backward, in eager code (before: PyTorch's generic 'no autograd formula') and under
    torch.func; torch.func's first-order gradient still equals autograd's."""
    x = torch.randn(3, 8, device=device)
    t = torch.randint(0, 8, (3,), device=device)
    f = lambda x: softmax.cross_entropy(x, t, torch_order=torch_order)  # noqa: E731
    message = r"cross_entropy: a gradient of the gradient \(create_graph=True\).*torch\.nn\.functional\.cross_entropy"
    with pytest.raises(RuntimeError, match=message):
        torch.func.grad(lambda x: torch.func.grad(f)(x).square().sum())(x)
    with pytest.raises(RuntimeError, match=message):
        torch.func.jacrev(torch.func.grad(f))(x)
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(xg), xg)
    assert torch.equal(torch.func.grad(f)(x), g)
    if torch_order:  # create_graph=True alone works; the second backward raises
        (g,) = torch.autograd.grad(f(xg), xg, create_graph=True)
        with pytest.raises(RuntimeError, match=message):
            torch.autograd.grad(g.square().sum(), xg)


# ----------------------------------------------------------------------------- layers


def test_layers_follow_the_hub_layer_rules(softmax):
    for name in ["Softmax", "CrossEntropyLoss"]:
        cls = getattr(softmax.layers, name)
        assert issubclass(cls, nn.Module) and cls.__init__ is nn.Module.__init__
        assert cls.has_backward is True and cls.can_torch_compile is True
        assert "Shapes:" in cls.__doc__
        extra = {n for n in dir(cls)} - {n for n in dir(nn.Module)}
        assert extra <= {"has_backward", "can_torch_compile"}, extra


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_layer_matches_module(softmax, device, dim, dtype):
    """Same dim choice (incl. torch's legacy implicit dim for dim=None), dtype and shape as nn.Softmax;
    values within 1 ulp of the module's fp64 result (bf16/fp16 exactness is checked on the GPU)."""
    module = nn.Softmax(dim=dim)
    for shape in [(7,), (3, 9), (2, 3, 5), (2, 3, 4, 5)]:
        if dim is not None and dim >= len(shape):
            continue
        x = rand(shape, dtype, device, scale=2.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # dim=None: torch's implicit-dim warning
            expected = module(x)
            ref = module(x.double())
        ours = softmax.layers.Softmax.forward(module, x)
        assert ours.dtype == expected.dtype and ours.shape == expected.shape
        assert_close_ref(ours, ref)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.15])
def test_cross_entropy_layer_matches_module(softmax, device, reduction, label_smoothing):
    module = nn.CrossEntropyLoss(ignore_index=2, reduction=reduction, label_smoothing=label_smoothing)
    x = rand((6, 10), torch.float32, device).requires_grad_()
    t = torch.tensor([2, 0, 9, 2, 5, 1], device=device)
    ours = softmax.layers.CrossEntropyLoss.forward(module, x, t)
    expected = module(x, t)
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-7)
    (g,) = torch.autograd.grad(ours.sum(), x)
    (ge,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g, ge, rtol=1e-5, atol=1e-7)


def test_cross_entropy_layer_runs_the_module_for_class_weights_and_probability_targets(softmax, device):
    """A class weight and probability targets (soft labels: mixup, distillation) are the module's own forward,
    loss and gradient bit for bit: the layer raised for both where ``nn.CrossEntropyLoss`` works. A module
    without a forward of its own (a stand-in) still gets the layer's error."""
    x = rand((6, 10), torch.float32, device).requires_grad_()
    t = torch.tensor([2, 0, 9, 2, 5, 1], device=device)
    soft = rand((6, 10), torch.float32, device).softmax(-1)
    weight = rand((10,), torch.float32, device).abs()
    for module, target in ((nn.CrossEntropyLoss(weight=weight), t), (nn.CrossEntropyLoss(), soft),
                           (nn.CrossEntropyLoss(weight=weight, label_smoothing=0.1, reduction="none"), soft)):
        ours = softmax.layers.CrossEntropyLoss.forward(module, x, target)
        expected = module(x, target)
        assert torch.equal(ours, expected)
        assert torch.equal(*(torch.autograd.grad(y.sum(), x)[0] for y in (ours, expected)))
    stand_in = nn.Module()
    stand_in.weight, stand_in.ignore_index, stand_in.reduction, stand_in.label_smoothing = weight, -100, "mean", 0.0
    with pytest.raises(ValueError, match="class weight is not supported"):
        softmax.layers.CrossEntropyLoss.forward(stand_in, x, t)


def test_kernelize_swaps_both_layers_and_compiles(installed, device):
    import kernels
    from kernels import LayerRepository, Mode

    class SoftmaxA(nn.Softmax):
        pass

    class LossA(nn.CrossEntropyLoss):
        pass

    kernels.replace_kernel_forward_from_hub(SoftmaxA, "Softmax")
    kernels.replace_kernel_forward_from_hub(LossA, "CrossEntropyLoss")

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 12)
            self.act = SoftmaxA(dim=-1)
            self.loss = LossA(label_smoothing=0.1)

        def forward(self, x, t):
            return self.loss(self.proj(x) * self.act(x[:, :12]), t)

    def build():
        torch.manual_seed(3)
        return Model().to(device)

    ref, model = build(), build()
    mapping = {name: {device: LayerRepository(repo_id=f"{ORG}/triton-softmax", layer_name=name, version=1)}
               for name in ["Softmax", "CrossEntropyLoss"]}
    with kernels.use_kernel_mapping(mapping, inherit_mapping=False):
        kernels.kernelize(model, mode=Mode.TRAINING | Mode.TORCH_COMPILE, device=device, use_fallback=False)
    assert model.act.forward.__func__.__qualname__ == "Softmax.forward"
    assert model.loss.forward.__func__.__qualname__ == "CrossEntropyLoss.forward"
    x, t = torch.randn(5, 16, device=device), torch.randint(0, 12, (5,), device=device)
    out = torch.compile(model, fullgraph=True, backend="aot_eager")(x, t)
    out_ref = ref(x, t)
    torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-6)
    out.backward()
    out_ref.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


def test_layer_takes_byte_targets_and_ignore_index_must_fit_int64(softmax, device):
    """nn.CrossEntropyLoss takes uint8 targets (the layer refused them); an ignore_index outside int64 was taken
    silently at 2**63 (torch: an overflow error) and failed without naming the argument at 2**64."""
    torch.manual_seed(19)
    x = torch.randn(4, 6, device=device)
    t = torch.tensor([0, 1, 5, 3], device=device)
    module = torch.nn.CrossEntropyLoss()
    want = softmax.layers.CrossEntropyLoss.forward(module, x, t)
    assert torch.equal(softmax.layers.CrossEntropyLoss.forward(module, x, t.to(torch.uint8)), want)
    for bad in (2**63, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="ignore_index must fit in int64"):
            softmax.cross_entropy(x, t, ignore_index=bad)


@pytest.mark.parametrize("path", ["block", "looped", "team", "recompute"])
def test_large_logits_keep_fp32_accuracy(softmax, device, path, request):
    """Cross-entropy does not change when a row's logits are shifted together; torch computes ``(x - max) - log s``
    and stays within a few fp32 ulps at any offset. The kernels rounded ``lse = max + log s`` to fp32 first, then
    took ``lse - x_t`` and ``exp(x - lse)``: 28 ulp of the loss (2.4e-5) and 3e-6 of the gradient at logits near
    1000, 4.7e-4 at 10000. Loss and gradient (the fused forward's, the team's and the recompute backward's, which
    now keeps the max and log s) against fp64, at offsets 1000 and 10000."""
    import sys

    mod = sys.modules[softmax.__name__ + ".cross_entropy"]
    if path == "team":
        request.getfixturevalue("team_mode")
    V = {"block": 50, "looped": 20011, "team": 3001, "recompute": 20011}[path]
    torch.manual_seed(20)
    t = torch.randint(0, V, (4,), device=device)
    mod.RECOMPUTE = path == "recompute"
    try:
        for offset in (1000.0, 10000.0):
            x = (torch.randn(4, V, device=device) + offset).requires_grad_()
            loss = softmax.cross_entropy(x, t, reduction="none")
            (g,) = torch.autograd.grad(loss.sum(), x)
            xd = x.detach().double().requires_grad_()
            ref = torch.nn.functional.cross_entropy(xd, t, reduction="none")
            (gr,) = torch.autograd.grad(ref.sum(), xd)
            assert (loss.double() - ref).abs().max().item() < 2e-6, (offset, loss, ref)
            assert (g.double() - gr).abs().max().item() < 1e-7, offset
    finally:
        mod.RECOMPUTE = False


@pytest.mark.parametrize("path", ["block", "looped", "team"])
def test_label_smoothing_keeps_fp32_accuracy_at_large_logits(softmax, device, path, request):
    """Label smoothing's term ``lse - mean_j x_j`` is a difference of two numbers near the logits' offset; torch sums
    the log-probabilities ``(x_j - max) - log s``, whose size is the row's spread, not its offset. The kernels summed
    the logits themselves and took ``max - sum / V``: 9e-6 off at 1000, 1.4e-4 at 10000. They now sum ``x - max``
    (the looped kernel rescales its sums when the max grows; a team adds each member's count times its max's
    distance to the row's). Loss (fp32) against fp64 at offsets 0, 1000 and 10000, and a row whose maximum arrives
    in its last chunk (the rescale)."""
    if path == "team":
        request.getfixturevalue("team_mode")
    V = {"block": 50, "looped": 20011, "team": 3001}[path]
    torch.manual_seed(21)
    t = torch.randint(0, V, (4,), device=device)
    x0 = torch.randn(4, V, device=device)
    x0[1, -3:] += 40.0  # row 1's max in its last chunk, far above the rest
    x0[2, : V // 2] -= 1e4  # row 2: a first half far below the rest
    for offset in (0.0, 1000.0, 10000.0):
        x = x0 + offset
        loss = softmax.cross_entropy(x, t, reduction="none", label_smoothing=0.3)
        ref = torch.nn.functional.cross_entropy(x.double(), t, reduction="none", label_smoothing=0.3)
        tol = 4e-6 * ref.abs().clamp_min(1.0)
        assert ((loss.double() - ref).abs() <= tol).all(), (offset, loss, ref)


def test_cross_entropy_changed_target_gets_pytorchs_version_error(softmax, device):
    """A target changed in place between forward and backward (no gradient was handed out yet) gets
    PyTorch's in-place error, not the message blaming a handed-out gradient."""
    x = torch.randn(4, 10, device=device, requires_grad=True)
    t = torch.tensor([1, 2, 3, 4], device=device)
    loss = softmax.cross_entropy(x, t)
    t[0] = 5
    with pytest.raises(RuntimeError) as err:
        loss.backward()
    assert "handed out by an earlier backward" not in str(err.value), str(err.value)
    assert "modified by an inplace operation" in str(err.value)
