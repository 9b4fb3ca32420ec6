"""triton-norms wide rows over persistent teams of programs (``_wide``): values, statistics, rules.

On the CPU the team forwards are off by default (the looped kernels run); these tests switch them on
(``WIDE_ON_CPU``) so that the interpreter runs them as two launches, publish then gather (never spinning). The
GPU test (TEST_DEVICE=cuda) runs the default spinning path. References: fp64 torch, and the looped
one-program-per-row kernel (the same math in another summation order).
"""

import sys

import pytest
import torch
import torch.nn.functional as F

from .test_norms_functional import assert_close_ref, rms_ref


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def wide(norms):
    """The team path on (CPU included); counts the team launches as (team, phases)."""
    mod = sys.modules[norms.__name__ + "._wide"]
    saved_tuned, saved_cpu, orig = {k: v for k, v in mod.WIDE_TUNED.items()}, mod.WIDE_ON_CPU, mod.team_phases
    calls = []

    def counting(device, team):
        phases = orig(device, team)
        calls.append((team, phases))
        return phases

    mod.WIDE_ON_CPU = True
    mod.team_phases = counting
    # pinned here (the team sizes below follow from it); the GPU test at the end runs the shipped setting
    mod.WIDE_TUNED.update({k: dict(v[-1] if isinstance(v, list) else v, chunk_bytes=16384, num_warps=4)
                           for k, v in mod.WIDE_TUNED.items()})
    try:
        yield type("Wide", (), {"calls": calls, "mod": mod})
    finally:
        mod.team_phases = orig
        mod.WIDE_TUNED.clear()
        mod.WIDE_TUNED.update(saved_tuned)
        mod.WIDE_ON_CPU = saved_cpu


def ln_ref(x, w=None, b=None, eps=1e-5):
    return F.layer_norm(x.double(), x.shape[-1:], None if w is None else w.double(),
                        None if b is None else b.double(), eps)


def assert_near_looped(a, b):
    """Same math, another fp32 summation order (LayerNorm: another variance formula): equal but for rare
    rounding differences of an ulp or two. Two results each within the fp64 check's 1 ulp + 1e-6 * max|y| differ
    by up to twice that: where w * (x - mean) * rstd and b nearly cancel, an fp32 difference of the statistics is
    several ulps of the small result."""
    assert a.shape == b.shape and a.dtype == b.dtype
    same = (a == b).float().mean().item()
    assert same >= 0.999, same
    assert_close_ref(a, b.double(), ulps=2, rel_atol=2e-6)


def looped(wide, fn):
    """``fn()`` on the one-program-per-row path."""
    saved = dict(wide.mod.WIDE_TUNED)
    for k in wide.mod.WIDE_TUNED:
        wide.mod.WIDE_TUNED[k] = None
    try:
        return fn()
    finally:
        wide.mod.WIDE_TUNED.update(saved)


# 32771 bf16 = 65542 bytes: just past one block; 16 KiB chunks -> a team of 5, the last member 3 columns
N_WIDE = 32771


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_team_values(norms, device, wide, dtype):
    x = (torch.randn(3, N_WIDE, device=device) * 2 + 0.5).to(dtype)
    w = torch.randn(N_WIDE, device=device).to(dtype)
    y = norms.rms_norm(x, w, eps=1e-6)
    assert_close_ref(y, rms_ref(x, w, eps=1e-6))
    assert_near_looped(y, looped(wide, lambda: norms.rms_norm(x, w, eps=1e-6)))
    # Gemma-style offset, the cast before the weight, no weight
    y = norms.rms_norm(x, w, eps=1e-6, weight_offset=1.0, cast_dtype=dtype)
    assert_near_looped(y, looped(wide, lambda: norms.rms_norm(x, w, eps=1e-6, weight_offset=1.0, cast_dtype=dtype)))
    assert_close_ref(norms.rms_norm(x), rms_ref(x))
    assert [c[0] for c in wide.calls] == [5, 5, 5]
    expected = (0,) if device != "cpu" else (1, 2)
    assert all(c[1] == expected for c in wide.calls)


def test_add_rms_norm_team_values_and_h(norms, device, wide):
    x = torch.randn(2, N_WIDE, device=device).to(torch.bfloat16)
    r = torch.randn(2, N_WIDE, device=device).to(torch.bfloat16)
    w = torch.randn(N_WIDE, device=device).to(torch.bfloat16)
    y, h = norms.add_rms_norm(x, r, w, eps=1e-6)
    assert torch.equal(h, x + r)  # every member stores its chunk of h exactly once
    assert_close_ref(y, rms_ref(h, w, eps=1e-6))
    y0, h0 = looped(wide, lambda: norms.add_rms_norm(x, r, w, eps=1e-6))
    assert torch.equal(h, h0)
    assert_near_looped(y, y0)
    assert [c[0] for c in wide.calls] == [5]
    wide.mod.WIDE_TUNED["add_rms_norm"] = None  # the residual form has its own setting
    norms.add_rms_norm(x, r, w, eps=1e-6)
    assert len(wide.calls) == 1
    norms.rms_norm(x, w, eps=1e-6)
    assert len(wide.calls) == 2


# 40960 bf16 = 5 chunks of 16 KiB exactly: every member full (the kernel's EVEN form, no masked deviations)
@pytest.mark.parametrize("n", [N_WIDE, 40960])
def test_layer_norm_team_values_one_meeting(norms, device, wide, n):
    """LayerNorm meets once (each member's sum and squared deviations around its own mean, combined
    pairwise): two launches on the CPU; a large mean must not cancel."""
    x = (torch.randn(3, n, device=device) * 3 + 7.0).to(torch.bfloat16)  # a large mean: needs the 2nd pass
    w = torch.randn(n, device=device).to(torch.bfloat16)
    b = torch.randn(n, device=device).to(torch.bfloat16)
    y = norms.layer_norm(x, w, b)
    assert_close_ref(y, ln_ref(x, w, b))
    assert_near_looped(y, looped(wide, lambda: norms.layer_norm(x, w, b)))
    r = torch.randn(3, n, device=device).to(torch.bfloat16)
    y, h = norms.add_layer_norm(x, r, w, b)
    assert torch.equal(h, x + r)
    assert_close_ref(y, ln_ref(h, w, b))
    expected = (0,) if device != "cpu" else (1, 2)
    assert wide.calls == [(5, expected), (5, expected)]


@pytest.mark.parametrize("affine, hold", [(1, False), (2, False), (1, True), (2, True)])
def test_team_affine_load_points_change_no_bit(norms, device, wide, affine, hold):
    """Where a member loads its weight and bias (``affine``: after the meeting, before it, once for every row of
    the persistent grid) and whether x waits for the meeting in bf16 (``hold``) change nothing: rms_norm (weight,
    Gemma offset, bias) and layer_norm (with a residual; fp32 w / b, which never hold), bit for bit."""
    x = (torch.randn(5, N_WIDE, device=device) * 2 + 0.5).to(torch.bfloat16)
    r = torch.randn(5, N_WIDE, device=device).to(torch.bfloat16)
    w = torch.randn(N_WIDE, device=device).to(torch.bfloat16)
    b = torch.randn(N_WIDE, device=device).to(torch.bfloat16)
    rms = [lambda: norms.rms_norm(x, w, eps=1e-6), lambda: norms.rms_norm(x, w, b, weight_offset=1.0)]
    ln = [lambda: norms.layer_norm(x, w, b), lambda: norms.layer_norm(x, None, b),
          lambda: norms.add_layer_norm(x, r, w, b), lambda: norms.layer_norm(x, w.float(), b.float())]
    calls = rms + ln
    want = [f() for f in calls]
    wide.mod.WIDE_TUNED.update({k: dict(v, affine=affine, hold=hold) for k, v in wide.mod.WIDE_TUNED.items()})
    for f, y in zip(calls, want):
        assert all(torch.equal(a, b) for a, b in zip(*((o,) if torch.is_tensor(o) else o for o in (f(), y))))
    assert_close_ref(norms.rms_norm(x, w, eps=1e-6), rms_ref(x, w, eps=1e-6))
    assert_close_ref(want[-4], ln_ref(x, w, b))
    assert len(wide.calls) == 2 * len(calls) + 1
    can_hold = wide.mod.can_hold
    assert can_hold(torch.bfloat16, w, b) and can_hold(torch.bfloat16, None, b) and can_hold(torch.bfloat16)
    assert not can_hold(torch.bfloat16, w.float(), b) and not can_hold(torch.float16, w) and not can_hold(torch.float32)


@pytest.mark.parametrize("affine, hold", [(1, False), (2, True)])
def test_rms_team_depth_changes_no_bit(norms, device, wide, affine, hold):
    """Two rows of a member's chunk loaded ahead (tier ``depth`` 2, the rms_norm team forward's ``DEPTH``) change no
    bit: rms_norm (weight; Gemma offset and bias) and add_rms_norm (y and h), over more rows than the grid has teams
    (the interpreter's grid holds one team of 5, so it loops over all 13 rows; a GPU's over ~12 rows each)."""
    M = 13 if device == "cpu" else 2000
    x = (torch.randn(M, N_WIDE, device=device) * 2 + 0.5).to(torch.bfloat16)
    r = torch.randn(M, N_WIDE, device=device).to(torch.bfloat16)
    w = torch.randn(N_WIDE, device=device).to(torch.bfloat16)
    b = torch.randn(N_WIDE, device=device).to(torch.bfloat16)
    calls = [lambda: (norms.rms_norm(x, w, eps=1e-6),), lambda: (norms.rms_norm(x, w, b, weight_offset=1.0),),
             lambda: norms.add_rms_norm(x, r, w, eps=1e-6)]
    wide.mod.WIDE_TUNED.update({k: dict(v, affine=affine, hold=hold) for k, v in wide.mod.WIDE_TUNED.items()})
    want = [f() for f in calls]
    wide.mod.WIDE_TUNED.update({k: dict(v, depth=2) for k, v in wide.mod.WIDE_TUNED.items()})
    for f, y in zip(calls, want):
        assert all(torch.equal(a, b) for a, b in zip(f(), y))
    assert_close_ref(want[0][0], rms_ref(x, w, eps=1e-6))
    assert len(wide.calls) == 2 * len(calls) and all(team == 5 for team, _ in wide.calls)


def test_team_backward_hold_changes_no_bit(norms, device, wide):
    """The team backwards with dy, x and w kept in bf16 while a team meets (tier ``hold``, the kernels' ``HOLD``)
    give the same dx, dw and db bits: rms_norm (weight; Gemma offset with the Llama cast; no weight) and
    layer_norm (w and b; b alone), 7 rows through one team; an fp32 weight never holds (checked through the
    launch's constexprs)."""
    M, N = 7, N_WIDE  # bf16: 65542 bytes, teams of 5 over 16 KiB chunks (the fixture's setting)
    x = (torch.randn(M, N, device=device) * 2 + 0.5).to(torch.bfloat16)
    w = (torch.rand(N, device=device) + 0.5).to(torch.bfloat16)
    b = torch.randn(N, device=device).to(torch.bfloat16)
    dy = torch.randn(M, N, device=device).to(torch.bfloat16)
    cases = [(lambda a, p: norms.rms_norm(a, p[0], eps=1e-6), (w,)),
             (lambda a, p: norms.rms_norm(a, p[0], weight_offset=1.0, cast_dtype=torch.bfloat16), (w,)),
             (lambda a, p: norms.rms_norm(a, None, eps=1e-6), ()),
             (lambda a, p: norms.layer_norm(a, p[0], p[1]), (w, b)),
             (lambda a, p: norms.layer_norm(a, None, p[0]), (b,)),
             (lambda a, p: norms.rms_norm(a, p[0], eps=1e-6), (w.float(),))]

    def grads(fn, params):
        leaves = [t.detach().clone().requires_grad_() for t in (x, *params)]
        return torch.autograd.grad(fn(leaves[0], leaves[1:]), leaves, dy)

    want = [grads(fn, p) for fn, p in cases]
    seen = []
    launch = wide.mod.launch

    def spy(kernel, grid, args, meta, device_, *rest, **kw):
        seen.append(dict(meta).get("HOLD"))
        return launch(kernel, grid, args, meta, device_, *rest, **kw)

    wide.mod.launch = spy
    try:
        wide.mod.WIDE_TUNED.update({k: dict(v, hold=True) for k, v in wide.mod.WIDE_TUNED.items()
                                    if k.endswith("_bwd")})
        for (fn, p), w_grads in zip(cases, want):
            seen.clear()
            got = grads(fn, p)
            assert all(torch.equal(a, c) for a, c in zip(got, w_grads))
            assert seen[-1] == (0 if p and p[0].dtype == torch.float32 else 1)  # the backward's launch
    finally:
        wide.mod.launch = launch
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    rms_ref(xr, wr, eps=1e-6).backward(dy.double())
    assert_close_ref(want[0][0], xr.grad, rel_atol=1e-5)


@pytest.mark.parametrize("kind", ["rms", "ln"])
@pytest.mark.parametrize("chunk_bytes, team", [(16384, 5), (2048, 33)])
def test_team_statistics_feed_the_backward(norms, device, wide, kind, chunk_bytes, team, monkeypatch):
    """Member 0 stores the row's rstd (and mean); the backward reads them: gradients against fp64. Teams of 5 and
    33 members (the layer_norm backward's tiers meet on one pair word up to 16 members, on two words beyond; the CPU
    "device" counts 64 multiprocessors here, so that a team of 33 fits it)."""
    if device == "cpu":
        monkeypatch.setattr(sys.modules[norms.__name__ + "._team"], "sm_count", lambda dev: 64)
    wide.mod.WIDE_TUNED.update({k: dict(v, min_row_bytes=1, chunk_bytes=chunk_bytes, pair_max_team=16)
                                for k, v in wide.mod.WIDE_TUNED.items()})
    plans, team_for = [], wide.mod.team_for
    monkeypatch.setattr(wide.mod, "team_for", lambda *a: plans.append(team_for(*a)) or plans[-1])
    x = (torch.randn(3, 16411, device=device) * 2 + 1.0).requires_grad_()  # fp32: 4096 or 512 per member
    w = torch.randn(16411, device=device).requires_grad_()
    dy = torch.randn(3, 16411, device=device)
    if kind == "rms":
        y = norms.rms_norm(x, w, eps=1e-6)
        ref = lambda a, b: rms_ref(a, b, eps=1e-6)  # noqa: E731
    else:
        y = norms.layer_norm(x, w, None)
        ref = lambda a, b: ln_ref(a, b)  # noqa: E731
    assert_close_ref(y, ref(x.detach(), w.detach()))
    y.backward(dy)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref(xr, wr).backward(dy.double())
    assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)
    assert_close_ref(w.grad, wr.grad, rel_atol=1e-5)
    assert [c[0] for c in wide.calls] == [team, team]  # the forward's team, then the backward's
    assert [p.pair_word for p in plans] == [team <= 16] * 2  # the layer_norm kernels' PAIR_WORD


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_team_backward_with_residual_against_looped(norms, device, wide, kind):
    """The backward over persistent teams with a fused residual: dx, dresidual, dw, db against the looped
    kernel and fp64. On the CPU one team takes all rows, so dw / db are summed across rows in registers;
    an unused h gets no gradient."""
    N = 16411  # fp32: 65644 bytes, 4096 columns per member -> 5 members
    x = (torch.randn(7, N, device=device) * 2 + 0.5).requires_grad_()
    r = torch.randn(7, N, device=device).requires_grad_()
    w = (torch.rand(N, device=device) + 0.5).requires_grad_()
    b = torch.randn(N, device=device).requires_grad_()
    dy, dh = torch.randn(7, N, device=device), torch.randn(7, N, device=device)

    def grads(use_h=True):
        for t in (x, r, w, b):
            t.grad = None
        y, h = norms.add_rms_norm(x, r, w, eps=1e-6) if kind == "rms" else norms.add_layer_norm(x, r, w, b)
        ((y * dy).sum() + ((h * dh).sum() if use_h else 0)).backward()
        return [t.grad.clone() for t in (x, r, w) + ((b,) if kind == "ln" else ())]

    team = grads()
    old = looped(wide, grads)
    for a, c in zip(team, old):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
    assert torch.equal(team[0], team[1])  # dx and dresidual: the same fp32 values
    hr = (x.detach() + r.detach()).double().requires_grad_()
    wr, br = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    yr = rms_ref(hr, wr, eps=1e-6) if kind == "rms" else ln_ref(hr, wr, br)
    ((yr * dy.double()).sum() + (hr * dh.double()).sum()).backward()
    assert_close_ref(team[0], hr.grad, rel_atol=1e-5)
    assert_close_ref(team[2], wr.grad, rel_atol=1e-5)
    without_h = grads(use_h=False)
    torch.testing.assert_close(without_h[0], team[0] - dh, rtol=1e-4, atol=1e-4)
    assert [c[0] for c in wide.calls] == [5, 5, 5, 5]  # forward and backward teams of the two team calls



@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_backward_teams_from_16_kib_rows(norms, device, wide, kind):
    """The backwards take teams for rows over BWD_MAX_FUSED_BYTES (16 KiB; one block spilled there on the H200),
    the forwards only past one block (64 KiB): fp32 rows of 4099 (16396 bytes) run a one-block forward and a
    backward team of 2 (16 KiB chunks), rows of 4096 no team at all; gradients against fp64."""
    launch = sys.modules[norms.__name__ + "._launch"]
    if torch.version.hip is not None:
        pytest.skip("ROCm keeps one block up to 64 KiB in the backward")
    assert launch.bwd_max_fused_bytes(torch.device(device)) == 16384
    for N, teams in ((4099, [2]), (4096, [])):
        wide.calls.clear()
        x = (torch.randn(6, N, device=device) * 2 + 1.0).requires_grad_()
        w = torch.randn(N, device=device).requires_grad_()
        dy = torch.randn(6, N, device=device)
        fn = (lambda a, b: norms.rms_norm(a, b, eps=1e-6)) if kind == "rms" else (lambda a, b: norms.layer_norm(a, b))
        ref = (lambda a, b: rms_ref(a, b, eps=1e-6)) if kind == "rms" else ln_ref
        fn(x, w).backward(dy)
        assert [c[0] for c in wide.calls] == teams
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref(xr, wr).backward(dy.double())
        assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)
        assert_close_ref(w.grad, wr.grad, rel_atol=1e-5)


def test_backward_one_block_limit_by_device(norms, monkeypatch):
    """16 KiB rows of the backward on NVIDIA (and CPU tensors, whose teams are off unless asked for), 64 KiB on
    XPU and ROCm, where the teams were never measured (one program per compute unit there)."""
    launch = sys.modules[norms.__name__ + "._launch"]
    monkeypatch.setattr(torch.version, "hip", None)
    assert launch.bwd_max_fused_bytes(torch.device("cuda", 0)) == launch.BWD_MAX_FUSED_BYTES == 16384
    assert launch.bwd_max_fused_bytes(torch.device("cpu")) == 16384
    assert launch.bwd_max_fused_bytes(torch.device("xpu", 0)) == launch.MAX_FUSED_BYTES == 65536
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert launch.bwd_max_fused_bytes(torch.device("cuda", 0)) == 65536


@pytest.fixture
def gpu_team_calls(norms, device, monkeypatch):
    """On a GPU only (the spinning path): the team size of every team launch of ``_wide``, in order."""
    if device != "cuda":
        pytest.skip("the spinning path needs TEST_DEVICE=cuda")
    mod = sys.modules[norms.__name__ + "._wide"]
    calls = []
    orig = mod.team_phases
    monkeypatch.setattr(mod, "team_phases", lambda dev, team: calls.append(team) or orig(dev, team))
    return calls


@pytest.mark.gpu
def test_layer_norm_backward_tiers_on_gpu(norms, device, gpu_team_calls):
    """The layer_norm backward's team tiers on a GPU (fp32 rows against fp64): 8 KiB chunks for rows of 64-256 KiB
    (20000 columns: a team of 10 on the 8-warp tier; 50000: 25 on the 4-warp, 255-register one), 8 KiB chunks of
    4 warps beyond (70000 columns: 35; fp32, so not held in bf16)."""
    calls = gpu_team_calls
    for N, team in ((20000, 10), (50000, 25), (70000, 35)):
        x = torch.randn(48, N, device=device) * 2 + 0.5
        w, b, dy = torch.rand(N, device=device) + 0.5, torch.randn(N, device=device), torch.randn(48, N, device=device)
        xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
        calls.clear()
        norms.layer_norm(xx, ww, b).backward(dy)
        assert calls[-1] == team  # the backward's team (the forward's comes first)
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        ln_ref(xr, wr, b).backward(dy.double())
        assert_close_ref(xx.grad, xr.grad, rel_atol=1e-5)
        assert_close_ref(ww.grad, wr.grad, rel_atol=1e-5)


@pytest.mark.gpu
def test_backward_teams_on_gpu(norms, device, gpu_team_calls):
    """The shipped backward teams on a GPU for rows of 16-64 KiB (bf16 12288 and 16384 columns, fp32 5000): dx and
    dw of rms_norm and layer_norm against the one-block kernel (another fp32 summation order: equal but for rare
    last-bit differences) and, in fp32, against fp64."""
    mod = sys.modules[norms.__name__ + "._wide"]
    calls = gpu_team_calls
    for M, N, dtype in [(512, 12288, torch.bfloat16), (64, 16384, torch.bfloat16), (100, 5000, torch.float32)]:
        x = (torch.randn(M, N, device=device) * 2 + 0.5).to(dtype)
        w = (torch.rand(N, device=device) + 0.5).to(dtype)
        b = torch.randn(N, device=device).to(dtype)
        dy = torch.randn(M, N, device=device).to(dtype)
        for kind in ("rms", "ln"):
            def grads():
                xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
                (norms.rms_norm(xx, ww) if kind == "rms" else norms.layer_norm(xx, ww, b)).backward(dy)
                return xx.grad, ww.grad
            calls.clear()
            team = grads()
            assert len(calls) == 1  # the backward's team (the forward stays in one block)
            saved = dict(mod.WIDE_TUNED)
            mod.WIDE_TUNED.update(rms_norm_bwd=None, layer_norm_bwd=None)
            try:
                block = grads()
            finally:
                mod.WIDE_TUNED.update(saved)
            assert len(calls) == 1
            for a, c in zip(team, block):
                if dtype != torch.float32:  # one rounding to 16 bits hides most fp32 last-bit differences
                    assert (a == c).float().mean().item() > 0.99
                torch.testing.assert_close(a.float(), c.float(), rtol=2 * torch.finfo(dtype).eps,
                                           atol=1e-3 * c.float().abs().max().item())
            if dtype == torch.float32:
                xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
                ref = rms_ref(xr, wr) if kind == "rms" else ln_ref(xr, wr, b)
                ref.backward(dy.double())
                assert_close_ref(team[0], xr.grad, rel_atol=1e-5)
                assert_close_ref(team[1], wr.grad, rel_atol=1e-5)

def test_team_results_are_deterministic(norms, device, wide):
    x = torch.randn(4, 20011, device=device) * 3
    w = torch.randn(20011, device=device)
    runs = [(norms.rms_norm(x, w), norms.layer_norm(x, w, w)) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert [c[0] for c in wide.calls] == [5, 5, 5, 5]


def test_team_rules(norms, device, wide):
    """Only rows past min_row_bytes; a persistent grid of whole teams that the device holds at once (SMs x
    programs per SM), at most one team per row; 1024 threads at most; off on CPU tensors unless
    WIDE_ON_CPU; rows that stay in one block never reach the hook."""
    mod = wide.mod
    dev = torch.device(device)
    team_mod = sys.modules[norms.__name__ + "._team"]
    assert mod.team_for("rms_norm", 32768, 2, 10, dev) is None  # 65536 bytes: one block
    plan = mod.team_for("rms_norm", 32769, 2, 1000, dev)
    assert plan.block_n == 8192 and plan.team == 5 and plan.num_warps * 32 <= 1024
    sms = team_mod.sm_count(dev)
    per_sm = team_mod.programs_per_sm(dev, plan.num_warps, mod.WIDE_TUNED["rms_norm"])
    assert plan.teams == sms * per_sm // 5 and plan.grid == (plan.teams * 5,)
    assert plan.num_warps * 32 * per_sm <= 2048 and (device == "cpu" or per_sm * plan.num_warps * 32 * plan.maxnreg <= 65536)
    assert mod.team_for("rms_norm", 32769, 2, 1, dev).teams == 1  # never more teams than rows
    per_sm = team_mod.programs_per_sm(dev, 4, mod.WIDE_TUNED["layer_norm"])
    widest = 8192 * sms * per_sm
    plan = mod.team_for("layer_norm", widest, 2, 1, dev)
    assert (plan.team, plan.teams) == (sms * per_sm, 1)
    assert mod.team_for("layer_norm", widest + 1, 2, 1, dev) is None
    mod.WIDE_TUNED["rms_norm"] = None
    assert mod.team_for("rms_norm", 1 << 20, 2, 1, dev) is None
    if device == "cpu":
        mod.WIDE_ON_CPU = False
        assert mod.team_for("layer_norm", 32769, 2, 10, dev) is None
    x = torch.randn(2, 4097, device=device)
    norms.rms_norm(x)
    assert wide.calls == []


_PAIR_KERNELS = """
import sys
import triton
import triton.language as tl
T = sys.modules[{name!r}]


@triton.jit
def publish(a_ptr, b_ptr, ws_ptr):
    i = tl.program_id(0)
    T.team_publish_pair(ws_ptr + i, tl.load(a_ptr + i), tl.load(b_ptr + i))


@triton.jit
def gather(ws_ptr, out_a_ptr, out_b_ptr, count, P2: tl.constexpr):
    k = tl.arange(0, P2)
    a, b = T.team_gather_pair(ws_ptr, k, count, -7.0, 9.0)
    tl.store(out_a_ptr + k, a)
    tl.store(out_b_ptr + k, b)
"""


def test_team_pair_words_round_trip(norms, device, tmp_path):
    """``team_publish_pair`` / ``team_gather_pair`` (the layer_norm, softmax and cross-entropy meetings): any two
    fp32 values, bit for bit (signed zeros, infinities, NaNs, subnormals), in one non-zero word per member, so
    that a published pair never reads as an empty slot; the b whose bits would make a zero word (0xFFFFFFFF) comes
    back as another NaN; lanes past the count give ``other``."""
    import importlib.util

    path = tmp_path / "pair_kernels.py"
    path.write_text(_PAIR_KERNELS.format(name=norms.__name__ + "._team"))
    spec = importlib.util.spec_from_file_location("pair_kernels_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0xFFFFFFFF, 0x7FFFFFFF, 0x7FC00000, 1, 0x807FFFFF,
               0x3F800000, 0xBF800000, 0x00800000]
    rng = torch.Generator().manual_seed(1)
    # (+0, +0) and (+0, 0xFFFFFFFF) first: the pairs whose words could be 0
    bits_a = [0, 0] + special + torch.randint(0, 2**32, (15,), generator=rng).tolist()
    bits_b = [0, 0xFFFFFFFF] + list(reversed(special)) + torch.randint(0, 2**32, (15,), generator=rng).tolist()
    n, p2 = len(bits_a), 32

    def as_f32(bits):
        return torch.tensor([b - 2**32 if b >= 2**31 else b for b in bits], dtype=torch.int32).view(torch.float32)

    a, b = as_f32(bits_a).to(device), as_f32(bits_b).to(device)
    ws = torch.zeros(p2, dtype=torch.int64, device=device)
    mod.publish[(n,)](a, b, ws)
    assert (ws[:n] != 0).all() and (ws[n:] == 0).all()
    out_a, out_b = (torch.full((p2,), float("nan"), device=device) for _ in range(2))
    mod.gather[(1,)](ws, out_a, out_b, n, P2=p2)
    got_a = out_a.cpu().view(torch.int32).tolist()
    got_b = out_b.cpu().view(torch.int32).tolist()
    assert [v & 0xFFFFFFFF for v in got_a[:n]] == bits_a
    assert [v & 0xFFFFFFFF for v in got_b[:n]] == [0x7FFFFFFF if v == 0xFFFFFFFF else v for v in bits_b]
    assert out_a[n:].eq(-7.0).all() and out_b[n:].eq(9.0).all()


def test_shipped_team_tiers(norms, monkeypatch):
    """The shipped forward teams by row width (bf16 rows of 65536, 131072, 262144): chunk bytes and warps; where the
    layer_norm teams meet on one pair word."""
    mod = sys.modules[norms.__name__ + "._wide"]
    team_mod = sys.modules[norms.__name__ + "._team"]
    want = {"rms_norm": [(4096, 1), (8192, 2), (8192, 2)], "add_rms_norm": [(4096, 2), (8192, 4), (8192, 4)],
            "layer_norm": [(4096, 1), (4096, 1), (8192, 2)]}
    for kind, settings in want.items():
        got = []
        for N in (65536, 131072, 262144):
            s = team_mod.tier_for(mod.WIDE_TUNED[kind], 2 * N, N)
            assert s["min_row_bytes"] == 65537 and s["num_warps"] * 32 * s["maxnreg"] * s["programs_per_sm"] <= 65536
            got.append((s["chunk_bytes"], s["num_warps"]))
        assert got == settings, kind
    # the layer_norm forward's teams up to 512 KiB rows load w / b before they wait, x held in bf16 meanwhile; wider
    # rows after the meeting; rms_norm holds x on its 8 KiB tier (w once per program)
    ln_tiers = [team_mod.tier_for(mod.WIDE_TUNED["layer_norm"], 2 * N, N) for N in (65536, 262144, 262145)]
    assert [(s.get("affine", 0), s.get("hold", False)) for s in ln_tiers] == [(1, True), (1, True), (0, False)]
    rms_tiers = [team_mod.tier_for(mod.WIDE_TUNED["rms_norm"], 2 * N, N) for N in (65536, 131072)]
    assert [(s.get("affine", 0), s.get("hold", False)) for s in rms_tiers] == [(1, False), (2, True)]
    assert team_mod.tier_for(mod.WIDE_TUNED["rms_norm"], 65536, 32768)["min_row_bytes"] > 65536  # 32768 bf16: looped
    # the layer_norm backward: 4 KiB chunks up to 64 KiB rows, 8 KiB of 8 warps for rows of 64-128 KiB (teams of
    # 9-16), 8 KiB of 4 warps at 255 registers for rows of 128-256 KiB (17-32), 8 KiB of 4 warps held in bf16
    # beyond; the rms_norm backward: 4 KiB of 2 warps up to 128 KiB rows, then 8 KiB of 4 warps, both held
    bwd = {N: team_mod.tier_for(mod.WIDE_TUNED["layer_norm_bwd"], 2 * N, N)
           for N in (8193, 32768, 32769, 65536, 65537, 131072, 131073)}
    assert [(s["chunk_bytes"], s["num_warps"], s["maxnreg"], s.get("hold", False)) for s in bwd.values()] == [
        (4096, 4, 128, False), (4096, 4, 128, False), (8192, 8, 128, False), (8192, 8, 128, False),
        (8192, 4, 255, False), (8192, 4, 255, False), (8192, 4, 168, True)]
    rms_bwd = [team_mod.tier_for(mod.WIDE_TUNED["rms_norm_bwd"], 2 * N, N) for N in (8193, 65536, 65537, 262144)]
    assert [(s["chunk_bytes"], s["num_warps"], s["hold"]) for s in rms_bwd] == [(4096, 2, True)] * 2 + [(8192, 4, True)] * 2
    assert all(s["min_row_bytes"] == 16385 for s in [*bwd.values(), *rms_bwd])
    # one pair word per member where it was measured faster: every layer_norm team here (the forward's 16 KiB tier,
    # rows over 512 KiB, keeps two words, gathered one after the other, for teams of more than 16)
    monkeypatch.setattr(team_mod, "sm_count", lambda dev: 132)  # an H200's, with or without a GPU here
    pairs = {(kind, N): mod.team_for(kind, N, 2, 4096, torch.device("cuda")).pair_word for kind, N in [
        ("layer_norm", 65536), ("layer_norm", 131072), ("layer_norm", 262144), ("layer_norm_bwd", 12288),
        ("layer_norm_bwd", 65536), ("layer_norm_bwd", 131072), ("layer_norm_bwd", 262144)]}
    assert list(pairs.values()) == [True, True, True, True, True, True, True], pairs


@pytest.mark.gpu
def test_team_spinning_path_on_gpu(norms, device):
    """The default path on a GPU for rows of 65536 and 262144 (teams of 32 and 64, many rows per team),
    with a residual and fp32 inputs, against fp64 and the same bits twice."""
    if device != "cuda":
        pytest.skip("the spinning path needs TEST_DEVICE=cuda")
    for M, N, dtype in [(2048, 65536, torch.bfloat16), (64, 262144, torch.bfloat16), (7, 100003, torch.bfloat16),
                        (300, 40000, torch.float32)]:
        x = (torch.randn(M, N, device=device) * 2 + 0.5).to(dtype)
        w = torch.randn(N, device=device).to(dtype)
        b = torch.randn(N, device=device).to(dtype)
        y1, y2 = norms.rms_norm(x, w), norms.layer_norm(x, w, b)
        assert torch.equal(y1, norms.rms_norm(x, w)) and torch.equal(y2, norms.layer_norm(x, w, b))
        assert_close_ref(y1, rms_ref(x, w))
        assert_close_ref(y2, ln_ref(x, w, b))
        r = torch.randn_like(x)
        y3, h3 = norms.add_rms_norm(x, r, w)
        assert torch.equal(h3, x + r)
        assert_close_ref(y3, rms_ref(h3, w))


_COMPILE_SCRIPT = r'''
import sys
from pathlib import Path
import kernels, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
W = sys.modules[kernels.get_local_kernel(Path(sys.argv[1])).__name__ + "._wide"]
def sig(k, consts):
    return {n: "constexpr" if n in consts else "*i64" if n == "ws_ptr" else
            "*fp32" if n in ("rstd_ptr", "mean_ptr", "dw_ptr", "db_ptr") else "*bf16" if n.endswith("_ptr") else
            "fp32" if n in ("eps", "weight_offset") else "i32" for n in k.arg_names}
count = 0
for target in (GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)):
    for k, consts in [
            (W._rms_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, b_ptr=None, CAST_DTYPE=None, PHASE=0)),
            (W._rms_team_fwd_kernel, dict(CAST_DTYPE=tl.bfloat16, PHASE=1)),
            (W._ln_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, PHASE=0)),
            (W._ln_team_fwd_kernel, dict(mean_ptr=None, rstd_ptr=None, PHASE=2)),
            (W._rms_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, CAST_DTYPE=None, PHASE=0, AFFINE=2)),
            (W._ln_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, PHASE=0, AFFINE=1)),
            (W._ln_team_fwd_kernel, dict(PHASE=0, AFFINE=1, HOLD=1)),  # x held as h (bf16) while it waits
            (W._rms_team_fwd_kernel, dict(CAST_DTYPE=None, PHASE=0, AFFINE=2, HOLD=1)),
            (W._rms_team_bwd_kernel, dict(dh_ptr=None, dres_ptr=None, db_ptr=None, CAST_DTYPE=tl.bfloat16, PHASE=0)),
            (W._ln_team_bwd_kernel, dict(PHASE=0)),
            # two statistics in two words (tiers with pair_max_team), the smallest gather (TEAM_P2 16)
            (W._ln_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, PHASE=0, TEAM_P2=16, PAIR_WORD=0)),
            (W._ln_team_bwd_kernel, dict(PHASE=0, PAIR_WORD=0))]:
        consts.update(BLOCK_N=8192, TEAM_P2=consts.get("TEAM_P2", 64))
        if "AFFINE" in k.arg_names:
            consts.setdefault("AFFINE", 0)
            consts.setdefault("HOLD", 0)
        if "EVEN" in k.arg_names:
            consts.setdefault("EVEN", 0)
        src = ASTSource(k, sig(k, consts), constexprs={(k.arg_names.index(m),): v for m, v in consts.items()})
        triton.compile(src, target=target, options={"num_warps": 8})
        count += 1
    # the shipped tiers as launched (bf16): their warps, chunk, register cap and largest team
    for kind, k, consts in [("rms_norm", W._rms_team_fwd_kernel, dict(res_ptr=None, h_ptr=None, b_ptr=None)),
                            ("add_rms_norm", W._rms_team_fwd_kernel, dict(b_ptr=None)),
                            ("layer_norm", W._ln_team_fwd_kernel, dict(res_ptr=None, h_ptr=None)),
                            ("rms_norm_bwd", W._rms_team_bwd_kernel, dict(dh_ptr=None, dres_ptr=None, db_ptr=None,
                                                                          CAST_DTYPE=None)),
                            ("layer_norm_bwd", W._ln_team_bwd_kernel, dict(dh_ptr=None, dres_ptr=None))]:
        tiers = W.WIDE_TUNED[kind]
        for s in tiers if isinstance(tiers, list) else [tiers]:
            full = dict(consts, BLOCK_N=s["chunk_bytes"] // 2, TEAM_P2=min(max(s.get("max_team", 64), 16), 64), PHASE=0,
                        **({"AFFINE": s.get("affine", 0)} if "AFFINE" in k.arg_names else {}),
                        **({"HOLD": int(s.get("hold", False))} if "HOLD" in k.arg_names else {}),
                        **({"PAIR_WORD": int(s.get("max_team", 64) <= s.get("pair_max_team", 64))}
                           if "PAIR_WORD" in k.arg_names else {}),
                        **({"CAST_DTYPE": None} if "CAST_DTYPE" in k.arg_names else {}))
            options = {"num_warps": s["num_warps"], "enable_fp_fusion": s.get("fp_fusion", False)}
            if target.backend == "cuda":
                options["maxnreg"] = s["maxnreg"]
            src = ASTSource(k, sig(k, full), constexprs={(k.arg_names.index(m),): v for m, v in full.items()})
            triton.compile(src, target=target, options=options)
            count += 1
print("COMPILED", count)
'''


@pytest.mark.slow
def test_team_kernels_compile_for_sm90_and_gfx942(built):
    """Lower the team kernels (64-bit atomic exchange, volatile polling, persistent row loop; the shipped forward tiers
    with their warps and register caps) for an H100/H200 and an MI300 without a GPU: catches what the interpreter never
    sees."""
    import os
    import subprocess

    variant = built["triton-norms"].variant("cpu")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(variant)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert "COMPILED 50" in res.stdout, res.stdout + res.stderr


def test_team_split_boundaries(norms):
    """The rules' edges: a tier applies from exactly its ``min_row_bytes``; NVIDIA programs per SM are capped by 2048
    threads (a grid the SMs cannot hold at once would spin for ever); no team where the rows' workspace slots
    (rows x team) would pass 2**31."""
    team_mod = sys.modules[norms.__name__ + "._team"]
    small = {"min_row_bytes": 100, "chunk_bytes": 64, "num_warps": 1, "programs_per_sm": 8, "maxnreg": 32}
    big = dict(small, min_row_bytes=1000, chunk_bytes=256)
    assert team_mod.tier_for([big, small], 1000, 500) is big
    assert team_mod.tier_for([big, small], 999, 500) is small
    cuda = torch.device("cuda")
    # 16 warps = 512 threads: 2048 // 512 = 4 programs, below the tuned 8 and the register bound 65536 // (16 * 512)
    assert team_mod.programs_per_sm(cuda, 16, dict(small, maxnreg=16)) == 4
    assert team_mod.programs_per_sm(cuda, 4, dict(small, maxnreg=16)) == 8  # 128 threads: the tuned 8
    assert team_mod.programs_per_sm(cuda, 4, dict(small, maxnreg=255)) == 2  # 65536 // (255 * 128)
    assert team_mod.programs_per_sm(torch.device("cpu"), 16, small) == 1
    tuned = dict(small, min_row_bytes=1, chunk_bytes=1024)
    cpu = torch.device("cpu")
    plan = team_mod.team_split(4096, 2, 2**31 // 8 - 1, cpu, tuned, True)  # 4096 bf16 / 512 per member: 8
    assert plan is not None and plan.team == 8
    assert team_mod.team_split(4096, 2, 2**31 // 8, cpu, tuned, True) is None
