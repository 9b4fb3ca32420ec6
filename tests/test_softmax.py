"""triton-softmax ``softmax`` / ``log_softmax``: values and gradients against fp64 PyTorch, layouts, masks, ops.

The package is loaded by Hub name through the ``softmax`` fixture (conftest), as users
load it; on CPU the kernels run under the Triton interpreter.

Tolerances (one table, ``ULPS``, plus an absolute slack ``ATOL_REL`` times the largest
reference value): the kernel computes in fp32 and rounds once, so a half-precision value
is within 1 ulp of the fp64 reference rounded to its dtype. fp32 values carry the error
of exp on arguments up to ~|z - max| and of the N-term fp32 sum: a few ulps relative, and
at most ~1e-6 absolute for log-probabilities around -20 (``ATOL_REL``). Half-precision
gradients are checked against the fp64 backward formula evaluated on the kernel's own
rounded output (what the kernel and torch both use), so rounding of y is not counted twice.
"""

import importlib
import math
import os
import subprocess
import sys

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
MIN_EXP = {torch.float32: -126, torch.float16: -14, torch.bfloat16: -126}
ULPS = {torch.float32: 8, torch.float16: 1, torch.bfloat16: 1}
ATOL_REL = 1e-6
# N regimes: 1 and 3 (tiny), 127 (odd, < one warp of vectors), 4097 (just above 4K, one
# block), 20011 (prime: looped for fp32 rows > 16K elements, one block for half).
SIZES = [1, 3, 127, 4097, 20011]


def ulp(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of each value of ``t`` in ``dtype`` (fp64 result)."""
    _, e = torch.frexp(t.double().nan_to_num(posinf=0.0, neginf=0.0))
    e = torch.clamp(e - 1, min=MIN_EXP[dtype])
    return torch.pow(2.0, (e - MANTISSA[dtype]).double())


def assert_close_ref(actual, ref64, *, ulps=None, rel_atol=ATOL_REL, scale=0.0):
    """``actual`` within ulps + rel_atol * max(max|ref|, scale) of the fp64 reference (same infinities and NaNs).

    ``scale``: the size of the terms that cancel when the reference itself is ~0 (e.g. 1 for a
    softmax gradient of ``sum()``, whose exact value is 0)."""
    dtype = actual.dtype
    assert actual.shape == ref64.shape, (actual.shape, ref64.shape)
    ulps = ULPS[dtype] if ulps is None else ulps
    expected = ref64.to(dtype).double()
    a = actual.double()
    assert torch.equal(torch.isnan(a), torch.isnan(expected)), "NaNs differ"
    assert torch.equal(torch.isinf(a), torch.isinf(expected)), "infinities differ"
    fin = torch.isfinite(expected)
    a, expected, ref_f = a[fin], expected[fin], ref64[fin]
    if a.numel() == 0:
        return
    tol = ulps * ulp(expected, dtype) + rel_atol * ref_f.abs().max().clamp(min=max(float(scale), 1e-30))
    diff = (a - expected).abs()
    bad = ~(diff <= tol)
    assert not bad.any(), (
        f"{int(bad.sum())} of {a.numel()} off; worst diff {diff.max().item():.3g} "
        f"(actual {a[diff.argmax()].item()}, expected {expected[diff.argmax()].item()})"
    )


def rand(shape, dtype, device, scale=1.0):
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dtype)


def sm_ref(x, dim=-1, *, scale=1.0, mask=None, causal=False, log=False):
    """fp64 reference: torch's (log_)softmax of x * scale + mask, causal positions filled with -inf."""
    z = x.double() * scale
    if mask is not None:
        z = z + mask.double()
    if causal:
        L, S = z.shape[-2:]
        z = z.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=z.device).tril(), float("-inf"))
    return torch.log_softmax(z, dim) if log else torch.softmax(z, dim)


def bwd_ref(y, dy, dim=-1, *, scale=1.0, log=False):
    """fp64 backward formula evaluated on the kernel's own output y."""
    y, dy = y.double(), dy.double()
    if log:
        return scale * (dy - y.exp() * dy.sum(dim, keepdim=True))
    return scale * y * (dy - (dy * y).sum(dim, keepdim=True))


def fn(softmax, log):
    return softmax.log_softmax if log else softmax.softmax


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("N", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_odd_sizes(softmax, device, N, dtype, log):
    x = rand((3, N), dtype, device, scale=3.0)
    assert_close_ref(fn(softmax, log)(x), sm_ref(x, log=log))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("N", [3, 127, 20011])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients(softmax, device, N, dtype, log):
    x = rand((2, N), dtype, device, scale=2.0).requires_grad_()
    dy = rand((2, N), dtype, device)
    y = fn(softmax, log)(x)
    y.backward(dy)
    if dtype == torch.float32:
        xr = x.detach().double().requires_grad_()
        sm_ref(xr, log=log).backward(dy.double())
        assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)
    else:
        assert_close_ref(x.grad, bwd_ref(y.detach(), dy, log=log), rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_checked_inference_calls(softmax, device, monkeypatch, log):
    """Plain inference checks a call signature once: later calls on new data skip the checks and stay right;
    another dim, an int scale or a call that needs a gradient is checked again; bad arguments after good ones
    still raise, naming the argument."""
    import sys

    module = sys.modules[softmax.__name__ + ".softmax"]
    monkeypatch.setattr(module, "_CHECKED", type(module._CHECKED)())
    checks, original = [], module._prepare
    monkeypatch.setattr(module, "_prepare", lambda *a: checks.append(1) or original(*a))
    f = fn(softmax, log)
    mask = rand((1, 37), torch.float32, device)
    for _ in range(3):
        x = rand((5, 37), torch.float16, device, scale=3.0)
        assert_close_ref(f(x, -1, scale=0.5, mask=mask), sm_ref(x, scale=0.5, mask=mask, log=log))
    assert len(checks) == 1 and len(module._CHECKED) == 1
    x = rand((5, 37), torch.float16, device, scale=3.0)
    assert_close_ref(f(x, 0), sm_ref(x, 0, log=log))  # another dim: checked
    assert_close_ref(f(x, 0, scale=2), sm_ref(x, 0, scale=2.0, log=log))  # an int scale: checked every call
    assert_close_ref(f(x, 0, scale=2), sm_ref(x, 0, scale=2.0, log=log))
    assert len(checks) == 4 and len(module._CHECKED) == 2
    xg = x.float().requires_grad_()
    f(xg, -1, scale=0.5).sum().backward()  # training: the general path
    assert len(checks) == 5 and xg.grad is not None
    with pytest.raises(IndexError):
        f(x, 2, scale=0.5, mask=mask)
    with pytest.raises(ValueError, match="does not broadcast"):
        f(x, -1, scale=0.5, mask=mask[:, :36])
    with pytest.raises(ValueError, match="finite"):
        f(x, -1, scale=float("inf"), mask=mask)
    with pytest.raises(TypeError, match="causal"):
        f(x, -1, causal=1)
    assert len(module._CHECKED) == 2


def test_forward_plans_per_alignment(softmax, device, monkeypatch):
    """The forward keeps one plan per call signature, x's and the mask's 16-byte alignment included (its launches
    are pinned to it): new data 2, 4 and 16 bytes off stays right, each alignment with its own plan."""
    import sys

    module = sys.modules[softmax.__name__ + ".softmax"]
    monkeypatch.setattr(module, "_FWD_PLANS", type(module._FWD_PLANS)())
    store = rand((8 + 5 * 37,), torch.float16, device)
    mask = rand((37,), torch.float32, device)
    with torch.no_grad():
        for off in (0, 1, 2, 8, 0):
            x = store[off:off + 5 * 37].view(5, 37)
            x.copy_(rand((5, 37), torch.float16, device, scale=3.0))
            assert_close_ref(softmax.softmax(x, -1, mask=mask), sm_ref(x, mask=mask))
    assert len(module._FWD_PLANS) == 3  # 0 and 8 elements (16 bytes) share one


def test_properties_rows_sum_to_one_and_shift_invariance(softmax, device):
    x = rand((5, 333), torch.float32, device, scale=4.0)
    y = softmax.softmax(x)
    torch.testing.assert_close(y.double().sum(-1), torch.ones(5, dtype=torch.float64, device=y.device), rtol=0,
                               atol=1e-6)
    torch.testing.assert_close(softmax.softmax(x + 100.0), y, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(softmax.log_softmax(x).exp(), y, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("N", [1021, 20011])
def test_tiny_probabilities_within_the_smallest_normal(softmax, device, N):
    """Rows whose z - max spans -200 .. 0 (one block at 1021 fp32 columns; at 20011 a row split over programs on
    few rows, looped on many; on NVIDIA the exps flush results below 2^-126 to 0): every probability within 2^-126
    absolutely plus, relatively, the exp's error (2^-22 for ex2.approx and the division, 2^-23 per unit of |log p|
    for rounding (z - m) * log2(e)), so the tiny ones are 0 or right and the rest keep fp32 accuracy; log_softmax
    within 8 ulps."""
    x = -torch.rand(2, N, device=device) * 200.0
    x[:, N // 3] = 0.0
    ref = torch.softmax(x.double(), -1)
    err = (softmax.softmax(x).double() - ref).abs()
    assert (err <= (2.0**-22 + 2.0**-23 * ref.log().abs()) * ref + 2.0**-126).all(), err.max()
    assert_close_ref(softmax.log_softmax(x), torch.log_softmax(x.double(), -1), ulps=8, rel_atol=1e-8)


# ----------------------------------------------------------------------------- case 1: wide rows


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(2, 131072), (3, 262147)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_case1_wide_rows_forward_backward(softmax, device, shape, dtype, log):
    """Rows wider than 64K (a peer refused them): the looped path, forward and backward."""
    x = rand(shape, dtype, device, scale=3.0).requires_grad_()
    dy = rand(shape, dtype, device)
    y = fn(softmax, log)(x)
    assert_close_ref(y, sm_ref(x.detach(), log=log))
    y.backward(dy)
    if dtype == torch.float32:
        xr = x.detach().double().requires_grad_()
        sm_ref(xr, log=log).backward(dy.double())
        assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)
    else:
        assert_close_ref(x.grad, bwd_ref(y.detach(), dy, log=log), rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_looped_rows_one_program_per_row_and_split(softmax, device, log):
    """fp32 rows past one block (> 16K elements): 40 rows take one program per row (online max/sum,
    then the re-read: prefetched, last chunk first), 3 rows are split over programs (two launches; on
    the CPU the split starts below 32 rows). Scale, -inf mask and causal folded in; forward + backward."""
    N = 16411
    mask = rand((N,), torch.float32, device)
    mask[::7] = float("-inf")
    for M, kw in [(40, dict(scale=0.5, mask=mask)), (40, dict(causal=True)), (3, dict(scale=0.5, mask=mask))]:
        x = rand((M, N), torch.float32, device, scale=3.0).requires_grad_()
        dy = rand((M, N), torch.float32, device)
        y = fn(softmax, log)(x, **kw)
        assert_close_ref(y, sm_ref(x.detach(), log=log, **kw))
        y.backward(dy)
        xr = x.detach().double().requires_grad_()
        sm_ref(xr, log=log, **kw).backward(dy.double())
        assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)


def test_per_kind_loop_settings_change_speed_not_values(softmax, device):
    """LOOP_TUNED (measured per kernel kind) replaces block and warps of looped rows; values stay exact."""
    import sys

    launch = sys.modules[softmax.__name__ + "._launch"]
    x = rand((36, 16411), torch.float32, device, scale=3.0).requires_grad_()
    dy = rand((36, 16411), torch.float32, device)
    saved = dict(launch.LOOP_TUNED)
    try:
        launch.LOOP_TUNED.update({"softmax": {"block_bytes": 8192, "num_warps": 2, "prefetch": False},
                                  "softmax_bwd": {"block_bytes": 32768, "num_warps": 64, "reverse": False}})
        launch.retuned()
        cfg = launch.config_for(16411, x, "softmax_bwd")
        assert cfg.block_n == 8192 and cfg.num_warps * 32 <= 1024 and not cfg.reverse
        y = softmax.softmax(x)
        assert_close_ref(y, sm_ref(x.detach()))
        y.backward(dy)
    finally:
        launch.LOOP_TUNED.clear()
        launch.LOOP_TUNED.update(saved)
        launch.retuned()
    xr = x.detach().double().requires_grad_()
    sm_ref(xr).backward(dy.double())
    assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)


# ----------------------------------------------------------------------------- teams (wide rows read once)


@pytest.fixture
def team_mode(softmax):
    """Forces the team path (``_team``) with small chunks, on the CPU too, and counts the team launches.

    On the CPU the interpreter runs a team of K > 1 as two launches (publish, then wait and write, so
    it never spins) and a team of one in one launch (the softmax forward's never meets, the backward's and the
    cross-entropy's only ever wait on themselves); on a GPU (TEST_DEVICE=cuda) every team runs in one launch."""
    import sys

    launch = sys.modules[softmax.__name__ + "._launch"]
    mods = [sys.modules[softmax.__name__ + m] for m in (".softmax", ".cross_entropy")]
    saved_tuned, saved_cpu, saved_aligned = dict(launch.TEAM_TUNED), launch.TEAM_ON_CPU, launch.TEAM_ALIGNED_ROWS_ONLY
    orig = mods[0]._team_phases
    calls = []

    def counting(device, team):
        phases = orig(device, team)
        calls.append((team, phases))
        return phases

    def set_chunk(chunk_bytes, num_warps=4, min_row_bytes=1):
        for k in launch.TEAM_TUNED:
            launch.TEAM_TUNED[k] = {"min_row_bytes": min_row_bytes, "chunk_bytes": chunk_bytes, "num_warps": num_warps,
                                    "programs_per_sm": 2, "maxnreg": 128}
        launch.retuned()

    launch.TEAM_ON_CPU = True
    launch.TEAM_ALIGNED_ROWS_ONLY = False  # teams on any row (prime widths included)
    set_chunk(1024)
    for m in mods:
        m._team_phases = counting
    try:
        yield type("TeamMode", (), {"calls": calls, "set_chunk": staticmethod(set_chunk), "launch": launch})
    finally:
        for m in mods:
            m._team_phases = orig
        launch.TEAM_TUNED.clear()
        launch.TEAM_TUNED.update(saved_tuned)
        launch.TEAM_ON_CPU = saved_cpu
        launch.TEAM_ALIGNED_ROWS_ONLY = saved_aligned
        launch.retuned()


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_team_path_values_and_gradients(softmax, device, team_mode, dtype, log):
    """A row split over a team (1024-byte chunks: 2053 bf16 -> 5 programs, 1031 fp32 -> 5, the last
    one partial); masked and scaled, causal, and a strided dim; forward and backward against fp64."""
    N = 2053 if dtype == torch.bfloat16 else 1031
    mask = rand((N,), dtype, device)
    mask[::7] = float("-inf")
    for shape, kw in [((3, N), {}), ((3, N), dict(scale=0.5, mask=mask)), ((2, 3, N), dict(causal=True))]:
        x = rand(shape, dtype, device, scale=3.0).requires_grad_()
        dy = rand(shape, dtype, device)
        y = fn(softmax, log)(x, **kw)
        assert_close_ref(y, sm_ref(x.detach(), log=log, **kw))
        y.backward(dy)
        if dtype == torch.float32:
            xr = x.detach().double().requires_grad_()
            sm_ref(xr, log=log, **kw).backward(dy.double())
            assert_close_ref(x.grad, xr.grad, rel_atol=1e-5)
        else:
            ref = bwd_ref(y.detach(), dy, log=log, scale=kw.get("scale", 1.0))
            if kw.get("causal"):  # causal positions are filled, not added: no gradient there
                ref = ref.masked_fill(torch.isinf(y.detach()), 0.0)
            assert_close_ref(x.grad, ref, rel_atol=1e-5)
    xt = rand((N, 3), dtype, device, scale=3.0)  # the reduced dim strided (dim=0): inner tiles (_inner), no team
    assert_close_ref(fn(softmax, log)(xt, 0), sm_ref(xt, 0, log=log))
    assert [c[0] for c in team_mode.calls] == [5] * 6
    expected = ((0,) if device != "cpu" else (1, 2))
    assert all(c[1] == expected for c in team_mode.calls)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_team_chunks_that_tile_the_row(softmax, device, team_mode, dtype, log):
    """Rows that the team's chunks tile exactly (the forward's EVEN form: no masked columns): 2048 bf16 / 1024 fp32
    in 1024-byte chunks, 4 full members. Against fp64, and bit for bit against the same rows with 16 more columns of
    -inf (a fifth member holding only those, which adds 0 to the row's sum; both read from rows of the same stride,
    so that the GPU kernels' vector widths, and so their summation orders, agree): plain, masked and scaled,
    causal."""
    N = 2048 if dtype == torch.bfloat16 else 1024
    mask = rand((N + 16,), dtype, device)
    mask[::5] = float("-inf")
    for kw in [{}, dict(scale=0.5, mask=mask), dict(causal=True)]:
        x = rand((2, 3, N + 16), dtype, device, scale=3.0)
        x[..., N:] = float("-inf")
        even_kw = dict(kw, mask=mask[:N]) if "mask" in kw else kw
        y = fn(softmax, log)(x[..., :N], **even_kw)
        assert_close_ref(y, sm_ref(x[..., :N], log=log, **even_kw))
        assert torch.equal(y, fn(softmax, log)(x, **kw)[..., :N])
    assert [c[0] for c in team_mode.calls] == [4, 5] * 3


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_team_rows_far_from_zero_keep_their_ulps(softmax, device, team_mode, log):
    """bf16 rows around -300 (5 members) whose largest element leads the next by 8 (in another member) and the rest
    by about 60, so that log_softmax's largest output is -log(1 + e^-8) ~ -3.4e-4: every output within 2 ulps of
    fp64, with no allowance relative to the row's largest value. The exps take z - max exactly; an exp of
    z * log2(e) - round(max * log2(e)) (one FFMA, tried in session 33) is off by up to |max| * 2^-24 even at
    z = max, which the log of a sum near 1 turns into several ulps (21-328 on the H200 over wider rows)."""
    rows = torch.arange(8, dtype=torch.float32)
    x = -360.0 - 2 * rows[:, None] + torch.randn(8, 2053)
    x[:, 100] = -300.0 - 2 * rows  # the maximum (member 0) ...
    x[:, 1700] = -308.0 - 2 * rows  # ... 8 above the runner-up (member 3)
    x = x.to(device=device, dtype=torch.bfloat16)
    y = fn(softmax, log)(x)
    assert_close_ref(y, sm_ref(x, log=log), ulps=2, rel_atol=0.0)
    assert [c[0] for c in team_mode.calls] == [5]


def test_team_of_one_and_partial_last_member(softmax, device, team_mode):
    """K = 1 (one chunk holds the row: the kernel's ALONE path, no meeting, on the CPU too; taken with at least
    SPLIT_BELOW_ROWS_PER_SM rows per SM, more rows than programs), the one-block kernel's bits; and rows whose last
    member holds a single column, whose bf16 outputs equal torch's own softmax."""
    team_mode.set_chunk(8192)
    launch = team_mode.launch
    x = rand((launch.SPLIT_BELOW_ROWS_PER_SM * launch._sm_count(torch.device(device)) + 1, 4000), torch.bfloat16,
             device, scale=3.0)
    y = softmax.softmax(x)
    assert team_mode.calls[-1] == (1, (0,))
    assert_close_ref(y, sm_ref(x))
    launch.TEAM_TUNED["softmax"] = None
    launch.retuned()
    assert torch.equal(y, softmax.softmax(x))
    team_mode.set_chunk(256)  # 128 bf16 per member: 897 columns -> 8 members, the last with one column
    x = rand((3, 897), torch.bfloat16, device, scale=3.0)
    y = softmax.softmax(x)
    assert team_mode.calls[-1][0] == 8
    assert_close_ref(y, sm_ref(x))
    assert_torch_softmax(y, x)


def assert_torch_softmax(y, x):
    """y equals torch.softmax(x, -1): bitwise under the interpreter (numpy's exp on both sides); on a GPU
    within one ulp (``tl.exp`` is not CUDA's ``expf``; measured 99.99% of bf16 elements equal)."""
    want = torch.softmax(x, -1)
    if y.device.type == "cpu":
        assert torch.equal(y, want)
    else:
        torch.testing.assert_close(y, want, rtol=2 * torch.finfo(y.dtype).eps, atol=0)
        assert (y == want).float().mean().item() > 0.999


def test_team_fully_masked_rows_and_poisoned_outputs(softmax, device, team_mode):
    """A fully masked row gives NaN as torch; every other element written (outputs start as NaN)."""
    poison = torch.full((1 << 16,), float("nan"), device=device)
    del poison
    x = rand((3, 2053), torch.bfloat16, device, scale=3.0)
    x[1] = float("-inf")
    for log in (False, True):
        y = fn(softmax, log)(x)
        ref = fn(torch, log)(x.float(), -1)
        assert torch.isnan(y[1]).all()
        assert not torch.isnan(y[[0, 2]]).any()
        assert_close_ref(y[[0, 2]], ref[[0, 2]].double())


def test_team_results_are_deterministic_and_independent_of_team_size(softmax, device, team_mode):
    """The partials are combined in member order: the same bits on every run; a different team size
    changes the fp32 summation order only (values within the tolerance)."""
    x = rand((5, 3001), torch.float32, device, scale=3.0).requires_grad_()
    dy = rand((5, 3001), torch.float32, device)
    runs = []
    for chunk in (2048, 2048, 4096):
        team_mode.set_chunk(chunk)
        x.grad = None
        y = softmax.softmax(x)
        y.backward(dy)
        runs.append((y.detach(), x.grad.clone()))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.testing.assert_close(runs[0][0], runs[2][0], rtol=1e-6, atol=1e-9)
    assert [c[0] for c in team_mode.calls] == [6, 6, 6, 6, 3, 3]


def test_team_config_rules(softmax, device, team_mode):
    """team_for: only rows of at least min_row_bytes, a power-of-2 chunk, a persistent grid the device
    holds at once (SMs x programs per SM: forward progress), at most one team per row, the 1024-thread
    limit, and off on CPU tensors unless TEAM_ON_CPU."""
    launch = team_mode.launch
    team_mod = sys.modules[launch.__name__.rsplit(".", 1)[0] + "._team"]
    x = torch.empty(0, dtype=torch.bfloat16, device=device)
    team_mode.set_chunk(3000, num_warps=64, min_row_bytes=4096)
    assert launch.team_for(2047, x, 10, "softmax") is None  # 4094 bytes < 4096
    plan = launch.team_for(2048, x, 10, "softmax")
    assert plan.block_n == 2048 and plan.team == 1 and plan.num_warps * 32 <= 1024 and plan.teams <= 10
    plan = launch.team_for(2049, x, 10000, "cross_entropy")
    per_sm = team_mod.programs_per_sm(x.device, plan.num_warps, launch.TEAM_TUNED["cross_entropy"])
    sms = launch._sm_count(x.device)
    assert plan.team == 2 and plan.teams == sms * per_sm // 2 and plan.grid == (plan.teams * 2,)
    assert launch.team_for(2048 * sms * per_sm, x, 1, "softmax").team == sms * per_sm
    assert launch.team_for(2048 * sms * per_sm + 1, x, 1, "softmax") is None  # no team fits: the looped path
    launch.TEAM_TUNED["softmax"] = None
    assert launch.team_for(1 << 20, x, 1, "softmax") is None
    if device == "cpu":
        launch.TEAM_ON_CPU = False
        assert launch.team_for(2048, x, 10, "softmax_bwd") is None


def test_fp32_rows_of_32_to_64_kib_run_one_row_per_program(softmax, device, monkeypatch):
    """fp32 rows of 8193-16384 elements, at least 4 per SM, take the shipped team-of-one tier (no meeting, no
    workspace; on the CPU with TEAM_ON_CPU) and give the one-block kernel's bits (that kernel run at these rows by
    raising the softmax's FWD_MAX_FUSED_BYTES): plain, scaled log, a fully masked row NaN, more rows than programs.
    Masked or causal rows, fewer rows, and bf16 rows of the same bytes stay off it (not measured there)."""
    launch = sys.modules[softmax.__name__ + "._launch"]
    smod = sys.modules[softmax.__name__ + ".softmax"]
    teams = []
    orig = smod._team_phases
    monkeypatch.setattr(smod, "_team_phases", lambda dev, team: teams.append(team) or orig(dev, team))
    monkeypatch.setattr(launch, "TEAM_ON_CPU", True)
    monkeypatch.setattr(launch, "TEAM_ALIGNED_ROWS_ONLY", False)
    launch.retuned()
    N = 8209
    x = rand((launch.SPLIT_BELOW_ROWS_PER_SM * launch._sm_count(torch.device(device)) + 3, N), torch.float32, device,
             scale=3.0)
    x[5] = float("-inf")
    mask = rand((N,), torch.float32, device)
    mask[::5] = float("-inf")
    calls = [lambda: softmax.softmax(x), lambda: softmax.log_softmax(x, scale=0.5)]
    try:
        got = [f() for f in calls]
        assert teams == [1, 1]
        softmax.softmax(x, mask=mask)
        softmax.softmax(x.view(1, *x.shape), causal=True)
        softmax.softmax(x[:7])
        softmax.softmax(x.to(torch.bfloat16)[..., :N // 2 * 2].repeat(1, 2))  # 32 KiB+ bf16 rows: looped
        assert teams == [1, 1]
        monkeypatch.setitem(launch.TEAM_TUNED, "softmax", None)
        monkeypatch.setitem(launch.FWD_MAX_FUSED_BYTES, "softmax", launch.MAX_FUSED_BYTES)
        launch.retuned()
        want = [f() for f in calls]
    finally:
        launch.retuned()
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
    assert got[0][5].isnan().all() and not got[0][[0, -1]].isnan().any()
    assert_close_ref(got[0], sm_ref(x))
    assert_close_ref(got[1], sm_ref(x, scale=0.5, log=True))


@pytest.mark.gpu
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_team_spinning_path_on_gpu(softmax, device, log):
    """The default team path on a GPU (persistent teams, members spin on each other's partials in one
    launch): many rows per team, rows of 1 to 64 members, against fp64 within ulps, the same bits
    twice, and a CUDA graph replay equal to eager."""
    if device != "cuda":
        pytest.skip("the spinning path needs TEST_DEVICE=cuda")
    for M, N, dtype in [(4096, 32771, torch.bfloat16), (64, 262144, torch.bfloat16), (3, 524288, torch.bfloat16),
                        (16, 131075, torch.float32)]:
        x = rand((M, N), dtype, device, scale=3.0).requires_grad_()
        dy = rand((M, N), dtype, device)
        y = fn(softmax, log)(x)
        y.backward(dy)
        g = x.grad.clone()
        x.grad = None
        y2 = fn(softmax, log)(x)
        y2.backward(dy)
        assert torch.equal(y, y2) and torch.equal(g, x.grad)
        assert_close_ref(y, sm_ref(x.detach(), log=log), ulps=ULPS[dtype] if dtype != torch.float32 else 64)
        if dtype != torch.float32:
            assert_close_ref(g, bwd_ref(y.detach(), dy, log=log), rel_atol=1e-5)
    x = rand((256, 65536), torch.bfloat16, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(softmax, log)(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = fn(softmax, log)(x)
    for _ in range(3):
        x.copy_(rand((256, 65536), torch.bfloat16, device))
        graph.replay()
        assert torch.equal(yg, fn(softmax, log)(x))


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("dim", [0, 1, 2, -2])
def test_dim_other_than_last(softmax, device, dim):
    """A movedim view read through its column stride; forward and backward."""
    x = rand((4, 6, 9), torch.float32, device).requires_grad_()
    dy = rand((4, 6, 9), torch.float32, device)
    for log in (False, True):
        y = fn(softmax, log)(x, dim)
        assert y.is_contiguous()
        assert_close_ref(y, sm_ref(x.detach(), dim, log=log))
        (gx,) = torch.autograd.grad(y, x, dy)
        xr = x.detach().double().requires_grad_()
        (gr,) = torch.autograd.grad(sm_ref(xr, dim, log=log), xr, dy.double())
        assert_close_ref(gx, gr, rel_atol=1e-5)


def _inner_kernels(softmax) -> list:
    """Names of the kernels the forward and backward plans cached so far launch (cleared first by the caller)."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    return sorted({run.kernel.fn.__name__ if hasattr(run.kernel, "fn") else run.kernel.__name__
                   for cache in (mod._FWD_PLANS, mod._BWD_PLANS) for plan in cache.values() for run, _ in plan.launches})


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", ["nchw-dim1", "prime-channels", "transposed-dim0", "looped", "permuted", "masked",
                                  "masked-size-one-dim"])
def test_inner_dims_after_the_reduced_one(softmax, device, case, log):
    """A reduced dim with dims after it (the contiguous output's reduced stride is then the inner size) runs in
    (outer, reduced, inner) tiles (``_inner``): a program per row wrote each element to a sector of its own, 2-8% of
    the H100's copy bandwidth. Forward and backward against fp64 for each layout: (B, C, H, W) over C, a prime channel
    count, a transposed view over dim 0 (x's reduced dim unit-stride, y's not), a reduced dim of 20011 (two passes
    over tiles), a permuted view (x's inner stride not 1), a scaled mask broadcast over batch and space, the same
    with a size-1 inner dim (where the expanded mask's stride does not continue its inner stride: size-1 dims are
    skipped when merging); the plans cached are the tile kernels'. Poisoned upstream gradients are not needed: dx is
    a new tensor."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    mod._BWD_PLANS.clear()
    kw: dict = {}
    if case == "nchw-dim1":
        x, dim = rand((2, 6, 5, 7), torch.float32, device), 1
    elif case == "prime-channels":
        x, dim = rand((3, 13, 11), torch.float32, device), 1
    elif case == "transposed-dim0":
        x, dim = rand((9, 300), torch.float32, device).t(), 0
    elif case == "looped":
        x, dim = rand((2, 20011, 3), torch.float32, device), 1
    elif case == "permuted":
        x, dim = rand((2, 5, 7, 6), torch.float32, device).permute(0, 3, 1, 2), 1  # (2, 6, 5, 7), inner stride 6
    elif case == "masked":
        x, dim = rand((2, 6, 5, 7), torch.float32, device), 1
        kw = dict(scale=0.5, mask=rand((6, 1, 1), torch.float32, device))
        kw["mask"][2] = float("-inf")
    else:  # a size-1 inner dim: the expanded mask's stride there (1) is not its inner stride (0) times 7
        x, dim = rand((2, 6, 1, 7), torch.float32, device), 1
        kw = dict(scale=0.5, mask=rand((6, 1, 1), torch.float32, device))
        kw["mask"][2] = float("-inf")
    x = x.requires_grad_()
    dy = rand(tuple(x.shape), torch.float32, device)
    y = fn(softmax, log)(x, dim, **kw)
    assert y.is_contiguous()
    assert_close_ref(y, sm_ref(x.detach(), dim, log=log, **kw))
    (gx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(xr, dim, log=log, **kw), xr, dy.double())
    assert_close_ref(gx, gr, rel_atol=1e-5)
    assert _inner_kernels(softmax) == ["_inner_bwd_kernel", "_inner_fwd_kernel"]


@pytest.mark.parametrize("mask_shape", [(37, 53), (1, 37, 53), (4, 1, 1, 53)])
def test_broadcast_mask_rows_run_innermost(softmax, device, mask_shape):
    """A mask broadcast over outer dims (one (Sq, Sk) mask for every batch and head) has its rows' readers enumerated
    one after another (``_common.broadcast_innermost``); every row's value is the same bits as with the mask
    expanded into memory (nothing but the order of the rows changes), and matches fp64, forward and the mask's
    gradient. The layout moves exactly the broadcast groups."""
    common = sys.modules[softmax.__name__ + "._common"]
    x = rand((4, 3, 37, 53), torch.float32, device, scale=3.0)
    mask = rand(mask_shape, torch.float32, device)
    mask.view(-1)[::7] = float("-inf")
    full = mask.expand(x.shape).contiguous()
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    softmax.softmax(x, mask=mask)
    ((run, _),) = next(iter(mod._FWD_PLANS.values())).launches
    # (R1, R2) of the launch: the broadcast rows innermost (12 batch x head rows per query row for a (37, 53) mask)
    assert run.fixed[:2] == {2: (1, 12), 3: (1, 12), 4: (1, 111)}[mask.dim()], run.fixed[:2]
    for log in (False, True):
        y = fn(softmax, log)(x, scale=0.5, mask=mask)
        assert torch.equal(y, fn(softmax, log)(x, scale=0.5, mask=full))
        assert_close_ref(y, sm_ref(x, log=log, scale=0.5, mask=mask))
    mg = mask.clone().requires_grad_()
    dy = rand(tuple(x.shape), torch.float32, device)
    (g,) = torch.autograd.grad(softmax.softmax(x, mask=mg), mg, dy)
    md = mask.double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(x.double(), mask=md), md, dy.double())
    assert_close_ref(g, gr, rel_atol=1e-5)
    ms = mask.expand(x.shape)
    layout = common.row_layout([x, ms, x], 3)
    moved = common.broadcast_innermost(layout, 1)
    assert moved.rows == layout.rows
    zero = [g for g in range(3) if moved.sizes[g] > 1 and moved.strides[1][g] == 0]
    assert zero and zero == list(range(3 - len(zero), 3)), (layout, moved)  # the broadcast groups last
    assert common.broadcast_innermost(common.row_layout([x, full, x], 3), 1) == common.row_layout([x, full, x], 3)


def test_inner_layout_merges_or_refuses(softmax, device):
    """``inner_layout``: (O, N, I, strides) where the dims before and after the reduced one merge in every tensor;
    None for an inner size of 1 (the row kernels) and for inner dims that do not merge (a strided slice of them),
    which still give the right values through the row kernels."""
    import importlib

    inner = importlib.import_module(softmax.__name__ + "._inner")
    x = rand((2, 3, 4, 5), torch.float32, device)
    assert inner.inner_layout([x, None, x], 1) == (2, 3, 20, ((60, 20, 1), (0, 0, 0), (60, 20, 1)))
    assert inner.inner_layout([x, None, x], 0) == (1, 2, 60, ((0, 60, 1), (0, 0, 0), (0, 60, 1)))
    assert inner.inner_layout([x, None, x], 3) is None
    assert inner.inner_layout([x[..., :1], None, x[..., :1]], 2) is None  # inner size 1
    xw = rand((2, 3, 4, 10), torch.float32, device)[..., ::2]  # (2, 3, 4, 5): W stride 2, H stride 10 = 2 * 5
    assert inner.inner_layout([xw, None, x], 1) == (2, 3, 20, ((120, 40, 2), (0, 0, 0), (60, 20, 1)))
    xs = rand((2, 3, 8, 5), torch.float32, device)[:, :, ::2]  # (2, 3, 4, 5): H stride 10, W stride 1: not 1 * 5
    assert inner.inner_layout([xs, None, x], 1) is None
    assert_close_ref(softmax.softmax(xs, 1), sm_ref(xs, 1))


def _inner_fresh_plans(softmax, monkeypatch, split: bool):
    """The softmax module with its plan caches cleared; two-pass inner tiles split N below 2 programs per SM,
    forward and backward, with ``split``, else never."""
    inner = importlib.import_module(softmax.__name__ + "._inner")
    monkeypatch.setattr(inner, "SPLIT_BELOW_PER_SM", 2 if split else 0)
    monkeypatch.setattr(inner, "SPLIT_BELOW_PER_SM_BWD", 2 if split else 0)
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    mod._BWD_PLANS.clear()
    return mod


@pytest.mark.parametrize("split", [False, True], ids=["one-program", "split"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_inner_looped_tiles_with_scale_and_mask(softmax, device, log, split, monkeypatch):
    """The two-pass form of ``_inner`` (a reduced dim of 601 with 17 inner positions: over 512 x 16) with a scale and
    a mask broadcast over the batch and the inner dim (its reduced stride 1, x's 17): the second pass reads the
    mask through its own stride and scales x, and the looped backward's dx carries the scale (the mask does not
    require grad, so the kernel applies it). Both passes in one program, or (4 programs, fewer than 2 per SM) N
    split in two parts over two launches. Forward and backward against fp64; the plans are the tile kernels'."""
    mod = _inner_fresh_plans(softmax, monkeypatch, split)
    x = rand((2, 601, 17), torch.float32, device, scale=3.0).requires_grad_()
    mask = rand((601, 1), torch.float32, device)
    mask[::7] = float("-inf")
    dy = rand((2, 601, 17), torch.float32, device)
    y = fn(softmax, log)(x, 1, scale=0.5, mask=mask)
    assert_close_ref(y, sm_ref(x.detach(), 1, scale=0.5, mask=mask, log=log))
    (gx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(xr, 1, scale=0.5, mask=mask, log=log), xr, dy.double())
    assert_close_ref(gx, gr, rel_atol=1e-5)
    assert _inner_kernels(softmax) == ["_inner_bwd_kernel", "_inner_fwd_kernel"]
    plans = [plan for cache in (mod._FWD_PLANS, mod._BWD_PLANS) for plan in cache.values()]
    assert all(dict(run.meta)["LOOP"] for plan in plans for run, _ in plan.launches)
    assert all([dict(run.meta)["PHASE"] for run, _ in plan.launches] == ([1, 2] if split else [0]) for plan in plans)
    assert all(run.fixed[-2:] == ((2, 512) if split else (1, 1024)) for plan in plans for run, _ in plan.launches)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_inner_split_over_a_long_reduced_dim(softmax, device, log):
    """Attention pooling over the tokens of (B, S, heads): softmax over dim 1 of (2, 5000, 3), 2 programs of
    (outer, column block) on a device of 8 SMs (the CPU's), so N is split over 3 parts of 2048 (the last 904): a
    part's statistics of -inf only (the mask's rows 2048-4095 of column 1, with rows of other parts finite) and a
    column masked in every part (NaN, as torch); large offsets between the parts' maxima. Forward and backward
    (a non-contiguous upstream gradient) against fp64."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    mod._BWD_PLANS.clear()
    x = rand((2, 5000, 3), torch.float32, device, scale=2.0)
    x[:, 4500:] += 40.0  # the last part holds the maximum
    x = x.requires_grad_()
    mask = torch.zeros((5000, 3), dtype=torch.float32, device=device)
    mask[2048:4096, 1] = float("-inf")
    mask[:, 2] = float("-inf")
    dy = rand((2, 3, 5000), torch.float32, device).transpose(1, 2)
    y = fn(softmax, log)(x, 1, mask=mask)
    ref = sm_ref(x.detach(), 1, mask=mask, log=log)
    assert torch.isnan(y[..., 2]).all() and torch.isnan(ref[..., 2]).all()
    assert_close_ref(y[..., :2], ref[..., :2])
    (gx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(xr, 1, mask=mask, log=log)[..., :2], xr, dy[..., :2].double())
    assert_close_ref(gx[..., :2], gr[..., :2], rel_atol=1e-5)
    for cache in (mod._FWD_PLANS, mod._BWD_PLANS):
        (plan,) = cache.values()
        assert [dict(run.meta)["PHASE"] for run, _ in plan.launches] == [1, 2]
        assert plan.launches[0][0].fixed[-2:] == (3, 2048) and plan.workspace[1] == torch.float32


def test_inner_split_rule(softmax):
    """``_inner._split``: one part in one pass or with at least ``SPLIT_BELOW_PER_SM`` programs per SM
    (``SPLIT_BELOW_PER_SM_BWD`` in the backward); otherwise parts of whole tiles for about ``SPLIT_PER_SM`` programs
    per SM, never more parts than tiles."""
    inner = importlib.import_module(softmax.__name__ + "._inner")
    cpu = torch.device("cpu")
    sms = inner.sm_count(cpu)
    assert inner._split(2, 5000, 512, False, cpu) == 1
    for backward in (False, True):
        below = math.ceil((inner.SPLIT_BELOW_PER_SM_BWD if backward else inner.SPLIT_BELOW_PER_SM) * sms)
        assert inner._split(below, 10**6, 512, True, cpu, backward) == 1
        assert inner._split(2, 10**6, 512, True, cpu, backward) == inner.SPLIT_PER_SM * sms // 2
        assert inner._split(3, 1025, 512, True, cpu, backward) == 3  # cdiv(1025, 512) tiles
        few = below - 1
        assert inner._split(few, 10**6, 512, True, cpu, backward) == -(-inner.SPLIT_PER_SM * sms // few)
    # between the two thresholds the forward splits and the backward does not
    assert inner._split(sms - 1, 10**6, 512, True, cpu) > 1 and inner._split(sms - 1, 10**6, 512, True, cpu, True) == 1


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_inner_split_column_far_below_zero(softmax, device, log):
    """N split in 3 parts (combined over a power-of-2 block of 4 part rows, one of them padding) where a column's
    scores are all far below 0 (about -1000, as after a large finite fill): the combine must take a padding row's
    maximum as -inf, not 0, or every exp underflows and the column becomes NaN (log: inf). (1, 4100, 3) over dim 1,
    parts of 2048, 2048 and 4. Forward against fp64."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    x = rand((1, 4100, 3), torch.float32, device, scale=2.0)
    x[..., 1] -= 1000.0
    y = fn(softmax, log)(x, 1)
    assert_close_ref(y, sm_ref(x, 1, log=log))
    (plan,) = mod._FWD_PLANS.values()
    assert plan.launches[0][0].fixed[-2:] == (3, 2048)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_inner_looped_running_max_falls_across_tiles(softmax, device, log, monkeypatch):
    """The two-pass form in one program over tiles of 512 x 16, (2, 601, 17) over dim 1, where the first tile's
    scores are about 120 above the second's: the running maximum must keep the first tile's (a maximum of the
    last tile alone rescales the sum by exp(120), inf in fp32, and every output is NaN). Forward against fp64."""
    mod = _inner_fresh_plans(softmax, monkeypatch, False)
    x = rand((2, 601, 17), torch.float32, device, scale=2.0)
    x[:, :512] += 60.0
    x[:, 512:] -= 60.0
    y = fn(softmax, log)(x, 1)
    assert_close_ref(y, sm_ref(x, 1, log=log))
    (plan,) = mod._FWD_PLANS.values()
    assert [(dict(run.meta)["LOOP"], dict(run.meta)["BLOCK_N"], run.fixed[-2:]) for run, _ in plan.launches] == [
        (True, 512, (1, 1024))]


@pytest.mark.parametrize("split", [False, True], ids=["one-program", "split"])
def test_inner_looped_last_tile_of_one_row(softmax, device, split, monkeypatch):
    """A reduced dim one row past whole tiles, (1, 4097, 3) over dim 1 (tiles of 2048 x 4): the last tile (split:
    the third part, [4096, 4097)) holds a single row, which the second pass must still write. Both passes in one
    program, or N split in 3 parts. Forward and backward against fp64."""
    mod = _inner_fresh_plans(softmax, monkeypatch, split)
    x = rand((1, 4097, 3), torch.float32, device, scale=2.0).requires_grad_()
    dy = rand((1, 4097, 3), torch.float32, device)
    y = softmax.softmax(x, 1)
    assert_close_ref(y, sm_ref(x.detach(), 1))
    (gx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(xr, 1), xr, dy.double())
    assert_close_ref(gx, gr, rel_atol=1e-5)
    for cache in (mod._FWD_PLANS, mod._BWD_PLANS):
        (plan,) = cache.values()
        assert plan.launches[0][0].fixed[-2:] == ((3, 2048) if split else (1, 6144))


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_inner_split_stays_inside_its_workspace(softmax, device, backward):
    """The split's two launches write only inside the workspace their plan sizes: run on the first half of a
    NaN-filled buffer of twice that size, the second half stays NaN (the interpreter checks no bounds; on a GPU such
    a write lands in another tensor). (1, 1100, 24) over dim 1: 2 column blocks of 16 inner positions (the second
    one 8 wide), N in 3 parts of 512. Results against fp64."""
    inner = importlib.import_module(softmax.__name__ + "._inner")
    x = rand((1, 1100, 24), torch.float32, device, scale=2.0)
    ref = sm_ref(x, 1)
    if backward:
        y, dy = ref.float(), rand((1, 1100, 24), torch.float32, device)
        tensors = [y, dy, torch.empty_like(y)]
        expected = bwd_ref(y, dy, 1)
    else:
        tensors = [x, None, torch.empty_like(x)]
        expected = ref
    layout = inner.inner_layout(tensors, 1)
    consts = dict(LOG=False) if backward else dict(LOG=False, SCALED=False)
    plan = inner.inner_plan((1.0,), layout, x.device, backward, **consts)
    assert [dict(run.meta)["PHASE"] for run, _ in plan.launches] == [1, 2]
    assert plan.launches[0][0].fixed[-2:] == (3, 512)
    words, dtype, _ = plan.workspace
    buf = torch.full((2 * words,), float("nan"), dtype=dtype, device=device)
    ptrs = (*tensors, buf[:words])
    for run, picks in plan.launches:
        run(tuple(ptrs[i] for i in picks))
    assert torch.isnan(buf[words:]).all(), "a write past the workspace"
    assert_close_ref(tensors[2], expected, rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (2, 601, 17)], ids=["one-pass", "looped"])
def test_backward_op_inner_tiles_with_strided_y_and_dy(softmax, device, shape, log):
    """The backward op called directly (opcheck, custom code) over dim 1 with y, dy and dx of three different
    layouts that all merge into (O, N, I): y a permuted view (reduced stride 1), dy a slice (inner stride 2), dx
    contiguous; each tensor is read or written through its own strides. One-pass and two-pass tiles, against the
    fp64 backward formula on the same y."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    mod._BWD_PLANS.clear()
    B, N, *inner = shape
    perm = (0, len(shape) - 1, *range(1, len(shape) - 1))
    z = rand((B, *inner, N), torch.float32, device, scale=2.0)
    y = (torch.log_softmax(z, -1) if log else torch.softmax(z, -1)).permute(perm)
    assert y.shape == shape and y.stride(1) == 1
    dy = rand((*shape[:-1], 2 * shape[-1]), torch.float32, device)[..., ::2]
    dx = _op(softmax, "softmax_bwd")(dy, y, 1, 0.5, False, log, torch.float32)
    assert dx.is_contiguous()
    assert_close_ref(dx, bwd_ref(y, dy, 1, scale=0.5, log=log), rel_atol=1e-5)
    assert _inner_kernels(softmax) == ["_inner_bwd_kernel"]


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_causal_with_a_mask_broadcast_over_batch_and_heads(softmax, device, log):
    """causal=True with a (Sq, Sk) mask over (B, H, Sq, Sk) scores: the causal query index is the row number modulo
    Sq, so the rows keep their order (``broadcast_innermost`` is not applied: it would enumerate batch and head
    innermost). Forward and the gradients of x and the mask against fp64."""
    B, H, Sq, Sk = 2, 3, 7, 11
    x = rand((B, H, Sq, Sk), torch.float32, device, scale=2.0).requires_grad_()
    mask = rand((Sq, Sk), torch.float32, device)
    mask[:, 1::3] = float("-inf")  # column 0 stays: no fully masked row
    mask.requires_grad_()
    dy = rand((B, H, Sq, Sk), torch.float32, device)
    y = fn(softmax, log)(x, scale=0.5, mask=mask, causal=True)
    assert_close_ref(y, sm_ref(x.detach(), scale=0.5, mask=mask.detach(), causal=True, log=log))
    gx, gm = torch.autograd.grad(y, (x, mask), dy)
    xr, mr = x.detach().double().requires_grad_(), mask.detach().double().requires_grad_()
    rx, rm = torch.autograd.grad(sm_ref(xr, scale=0.5, mask=mr, causal=True, log=log), (xr, mr), dy.double())
    assert_close_ref(gx, rx, rel_atol=1e-5)
    assert_close_ref(gm, rm, rel_atol=1e-5)


def test_inner_config_rules(softmax):
    """``_inner._config``'s documented rules for any (O, N, I): one pass where N fits a tile of ``TILE`` with
    ``MIN_INNER`` inner positions (N <= 512 whatever I), its BLOCK_N covering N; two passes over tiles of exactly
    ``TILE``; never narrower than ``MIN_INNER`` inner positions (or I's power of 2 where smaller), never wider than
    I's power of 2 or 128; one to eight warps. Only the tiles' shapes: values are checked by the tests above."""
    import importlib

    inner = importlib.import_module(softmax.__name__ + "._inner")
    p2 = lambda v: 1 << (v - 1).bit_length()  # noqa: E731
    for O in (1, 3, 64):
        for N in (1, 3, 19, 300, 512, 513, 601, 4099, 20011):
            for I in (2, 3, 17, 128, 1000):
                block_n, block_i, loop, warps = inner._config(O, N, I, torch.device("cpu"))
                case = (O, N, I, block_n, block_i, loop, warps)
                assert p2(block_n) == block_n and p2(block_i) == block_i, case
                assert min(p2(I), inner.MIN_INNER) <= block_i <= min(p2(I), 128), case
                assert 1 <= warps <= 8, case
                assert loop == (p2(N) * min(p2(I), inner.MIN_INNER) > inner.TILE), case
                if N <= inner.TILE // inner.MIN_INNER:
                    assert not loop, case
                if loop:
                    assert block_n * block_i == inner.TILE, case
                else:
                    assert block_n >= N and block_n * block_i <= inner.TILE, case


def test_strided_and_non_contiguous_inputs(softmax, device):
    big = rand((6, 300), torch.float32, device)
    x = big[::2, 10:138]  # row stride 600
    assert_close_ref(softmax.softmax(x), sm_ref(x))
    xt = rand((64, 5), torch.float32, device).t()  # column stride 5
    assert_close_ref(softmax.log_softmax(xt), sm_ref(xt, log=True))
    x3 = rand((4, 5, 32), torch.float32, device)[:, 1:4]  # leading dims that do not merge
    assert_close_ref(softmax.softmax(x3), sm_ref(x3))
    xe = rand((1, 33), torch.float32, device).expand(7, 33)  # stride-0 rows
    assert_close_ref(softmax.softmax(xe), sm_ref(xe))
    # five leading dims that cannot merge: the one documented copy
    x6 = rand((3, 4, 5, 6, 7, 40), torch.float32, device)[:, ::2, :, 1:, ::2]
    assert_close_ref(softmax.softmax(x6), sm_ref(x6))
    buf = rand(3 * 127 + 1, torch.bfloat16, device)
    xm = buf[1:].view(3, 127)  # base pointer not 16-byte aligned
    assert_close_ref(softmax.softmax(xm), sm_ref(xm))


def test_row_layouts_are_cached_per_strides(softmax, device):
    """row_layout keeps one layout per (dim, shape, strides): the same shape with other strides (a transposed
    view) gets its own, and a repeated call reuses the first (same object, same values)."""
    common = sys.modules[softmax.__name__ + "._common"]
    a = rand((4, 5, 32), torch.float32, device)
    b = rand((5, 4, 32), torch.float32, device).transpose(0, 1)  # shape (4, 5, 32), strides (32, 128, 1)
    la, lb = common.row_layout([a, None, a], 2), common.row_layout([b, None, b], 2)
    assert la.sizes == (20, 1, 1) and la.strides[0] == (32, 0, 0, 1) and la.strides[1] == (0, 0, 0, 0)
    assert lb.sizes == (4, 5, 1) and lb.strides[0] == (32, 128, 0, 1)
    assert common.row_layout([a.clone(), None, a], 2) is la and common.row_layout([b, None, b], 2) is lb
    for x in (a, b, a):
        assert_close_ref(softmax.softmax(x), sm_ref(x))
        assert_close_ref(softmax.log_softmax(x, dim=1), sm_ref(x, dim=1, log=True))


def test_host_integer_helpers_match_triton(softmax):
    """_device.cdiv / next_power_of_2 (the launch paths' plain-int versions) agree with triton's."""
    import triton

    dev = sys.modules[softmax.__name__ + "._device"]
    for a in [0, 1, 2, 3, 15, 16, 17, 1023, 1024, 1025, 65537, 2**31 + 5]:
        for b in [1, 2, 3, 16, 128, 1000]:
            assert dev.cdiv(a, b) == triton.cdiv(a, b)
        if a >= 1:
            assert dev.next_power_of_2(a) == triton.next_power_of_2(a)


def test_empty_and_scalar_inputs(softmax, device):
    for shape in [(0, 16), (3, 0), (2, 0, 5)]:
        x = torch.empty(shape, device=device, requires_grad=True)
        y = softmax.softmax(x)
        assert y.shape == x.shape
        y.sum().backward()
        assert x.grad.shape == x.shape
    s = torch.tensor(2.5, device=device)
    assert torch.equal(softmax.softmax(s), torch.softmax(s, 0))
    assert torch.equal(softmax.log_softmax(s), torch.log_softmax(s, 0))


def test_poisoned_outputs(softmax, device):
    poison = torch.full((1 << 16,), float("nan"), device=device)
    del poison  # its memory is likely handed to the outputs below
    x = rand((8, 1000), torch.bfloat16, device).requires_grad_()
    for log in (False, True):
        y = fn(softmax, log)(x)
        assert not torch.isnan(y).any()
        (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
        assert not torch.isnan(g).any()


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_case8_expanded_and_transposed_upstream_gradient(softmax, device, log):
    x = rand((24, 40), torch.float32, device).requires_grad_()
    fn(softmax, log)(x).sum().backward()  # stride-0 gradient
    xr = x.detach().double().requires_grad_()
    sm_ref(xr, log=log).sum().backward()
    assert_close_ref(x.grad, xr.grad, rel_atol=1e-5, scale=1.0)  # softmax: exactly 0, fp32 leaves ~1e-7
    gt = rand((40, 24), torch.float32, device).t()  # column stride 24
    (g,) = torch.autograd.grad(fn(softmax, log)(x), x, gt)
    (gr,) = torch.autograd.grad(sm_ref(xr, log=log), xr, gt.double())
    assert_close_ref(g, gr, rel_atol=1e-5)


# ----------------------------------------------------------------------------- scale and masks


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bfloat16])
def test_scale_and_broadcast_mask_forward_backward(softmax, device, log, mask_dtype):
    """Attention-shaped scores (B, H, S, S) with a (B, 1, S, S) mask: three leading dims, no copy."""
    B, H, S = 2, 3, 17
    x = rand((B, H, S, S), torch.float32, device, scale=2.0).requires_grad_()
    mask = rand((B, 1, S, S), mask_dtype, device)
    mask = mask.masked_fill(torch.rand(B, 1, S, S, device=device) < 0.3, float("-inf"))
    mask[..., 0] = 0.0  # keep every row partly alive
    mask.requires_grad_()
    dy = rand((B, H, S, S), torch.float32, device)
    y = fn(softmax, log)(x, scale=0.125, mask=mask)
    assert_close_ref(y, sm_ref(x.detach(), scale=0.125, mask=mask.detach(), log=log))
    gx, gm = torch.autograd.grad(y, (x, mask), dy)
    xr, mr = x.detach().double().requires_grad_(), mask.detach().double().requires_grad_()
    rx, rm = torch.autograd.grad(sm_ref(xr, scale=0.125, mask=mr, log=log), (xr, mr), dy.double())
    assert_close_ref(gx, rx, rel_atol=1e-5)
    assert gm.dtype == mask_dtype and gm.shape == mask.shape
    assert_close_ref(gm, rm, ulps=ULPS[mask_dtype] + 1, rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("N", [37, 4099])
def test_scale_alone_backward(softmax, device, log, N):
    """A scale without a mask through the public API: the one-block backward's dx carries the scale."""
    x = rand((5, N), torch.float32, device).requires_grad_()
    dy = rand((5, N), torch.float32, device)
    (g,) = torch.autograd.grad(fn(softmax, log)(x, scale=0.5), x, dy)
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad(sm_ref(xr, scale=0.5, log=log), xr, dy.double())
    assert_close_ref(g, gr, rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (9, 6), (1, 5, 20011)])
def test_causal_mask_forward_backward(softmax, device, log, shape):
    """Top-left aligned causal mask over the last two dims (SDPA's is_causal), with and without a tensor mask."""
    x = rand(shape, torch.float32, device).requires_grad_()
    dy = rand(shape, torch.float32, device)
    for mask in (None, rand(shape[-1:], torch.float32, device)):
        y = fn(softmax, log)(x, causal=True, mask=mask)
        assert_close_ref(y, sm_ref(x.detach(), mask=mask, causal=True, log=log))
        (g,) = torch.autograd.grad(y, x, dy)
        xr = x.detach().double().requires_grad_()
        (gr,) = torch.autograd.grad(sm_ref(xr, mask=mask, causal=True, log=log), xr, dy.double())
        assert_close_ref(g, gr, rel_atol=1e-5)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("case", ["plain", "scale_mask", "causal", "inner_dim"])
def test_second_derivatives(softmax, device, log, case):
    """create_graph=True (a gradient penalty): the second-order gradients of x and of a mask that requires grad,
    through the backward op's own formula, against fp64 autograd through the reference; also through torch.func
    (the ops' functorch Functions)."""
    shape, dim, kw = {"plain": ((3, 7), -1, {}), "scale_mask": ((2, 3, 11), -1, {"scale": 0.5}),
                      "causal": ((2, 4, 6), -1, {"causal": True}), "inner_dim": ((5, 3, 4), 0, {})}[case]
    x = rand(shape, torch.float32, device, scale=2.0)
    mask = rand(shape[-1:], torch.float32, device) if case == "scale_mask" else None
    dy, v = rand(shape, torch.float32, device), rand(shape, torch.float32, device)

    def ours(x, mask):
        return fn(softmax, log)(x, dim, mask=mask, **kw)

    def ref(x, mask):
        return sm_ref(x, dim, mask=mask, log=log, **kw)

    def second_order(f, x, mask):
        ins = [t.detach().clone().requires_grad_() for t in (x, mask) if t is not None]
        (gx,) = torch.autograd.grad(f(*ins, *[None] * (2 - len(ins))), ins[0], dy.to(x.dtype), create_graph=True)
        return torch.autograd.grad((gx * v.to(x.dtype)).sum(), ins)

    def second_order_functorch(f, x, mask):
        def penalty(*ins):
            _, vjp = torch.func.vjp(lambda a: f(a, *ins[1:], *[None] * (2 - len(ins))), ins[0])
            return (vjp(dy)[0] * v).sum()
        ins = [t for t in (x, mask) if t is not None]
        return torch.func.grad(penalty, argnums=tuple(range(len(ins))))(*ins)

    want = second_order(ref, x.double(), None if mask is None else mask.double())
    for got in (second_order(ours, x, mask), second_order_functorch(ours, x, mask)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == torch.float32 and g.shape == w.shape
            assert_close_ref(g, w, ulps=64, rel_atol=1e-5)


# one block; looped (the first chunks entirely -inf): 3 rows split over programs, 40 rows one program per row
@pytest.mark.parametrize("M, N", [(3, 7), (3, 20011), (40, 20011)])
def test_fully_masked_rows_match_torch(softmax, device, M, N):
    x = rand((M, N), torch.float32, device)
    mask = torch.zeros((M, N), device=device)
    mask[0] = float("-inf")  # every position dropped: torch gives NaN
    mask[1, : N - 2] = float("-inf")  # only the last two positions alive
    mask[2:, : max(N - 5000, 0)] = float("-inf")  # several chunks alive after the dead ones
    for log in (False, True):
        y = fn(softmax, log)(x, mask=mask)
        ref = sm_ref(x, mask=mask, log=log)
        assert torch.isnan(ref[0]).all() and torch.isnan(y[0]).all()
        assert_close_ref(y, ref)
        torch_y = (torch.log_softmax if log else torch.softmax)(x + mask, -1)
        assert torch.equal(torch.isnan(y), torch.isnan(torch_y))


# ----------------------------------------------------------------------------- ops and compile


def _op(softmax, name):
    return getattr(softmax._ops.ops, name).default


def test_opcheck_every_op(softmax, device):
    x = rand((3, 5, 33), torch.float32, device).requires_grad_()
    mask = rand((5, 33), torch.bfloat16, device).requires_grad_()
    fwd = _op(softmax, "softmax_fwd")
    torch.library.opcheck(fwd, (x, None, 2, 1.0, False, False, False))
    torch.library.opcheck(fwd, (x, mask, 2, 0.5, True, True, False))
    torch.library.opcheck(fwd, (x, None, 1, 2.0, False, True, False))
    torch.library.opcheck(fwd, (x, None, 2, 1.0, False, False, True))  # torch order (the Softmax layer)
    y = torch.softmax(x.detach(), -1)
    dy = rand((3, 5, 33), torch.float32, device)
    torch.library.opcheck(_op(softmax, "softmax_bwd"), (dy, y, 2, 1.0, False, False, torch.float32))
    torch.library.opcheck(_op(softmax, "softmax_bwd"), (dy, y.log(), 2, 0.5, True, True, torch.bfloat16))


def test_ops_called_directly_take_negative_dims(softmax, device):
    """The registered ops called directly (torch.ops, custom code) with dim = -1 (``softmax()`` passes it
    normalised) compute the same as with dim = 1; an out-of-range dim raises IndexError (it once laid the rows
    out over the wrong dim and wrote out of bounds)."""
    x = rand((5, 333), torch.float32, device)
    y, dy = torch.softmax(x, -1), rand((5, 333), torch.float32, device)
    fwd, bwd = _op(softmax, "softmax_fwd"), _op(softmax, "softmax_bwd")
    assert_close_ref(fwd(x, None, -1, 1.0, False, False, False), torch.softmax(x.double(), -1))
    assert torch.equal(fwd(x, None, -1, 1.0, False, False, True), fwd(x, None, 1, 1.0, False, False, True))  # torch order
    assert_close_ref(bwd(dy, y, -1, 1.0, False, False, torch.float32), bwd_ref(y, dy), rel_atol=1e-6)
    with pytest.raises(IndexError, match="Dimension out of range"):
        bwd(dy, y, 2, 1.0, False, False, torch.float32)
    with pytest.raises(IndexError, match="Dimension out of range"):  # the torch-order path checks it too
        fwd(x, None, 2, 1.0, False, False, True)


def test_backward_op_with_unmergeable_strided_y(softmax, device):
    """The backward op called directly (as opcheck, custom code may) with y and dy of more than 3 unmergeable
    leading dims: both are copied once (y from the forward is contiguous, so only a direct call pays for it)."""
    y = torch.softmax(rand((2, 3, 2, 3, 7), torch.float32, device), -1).permute(3, 1, 0, 2, 4)
    dy = rand((2, 2, 3, 3, 7), torch.float32, device).permute(2, 3, 0, 1, 4)
    assert not y.is_contiguous() and not dy.is_contiguous() and dy.shape == y.shape
    dx = _op(softmax, "softmax_bwd")(dy, y, 4, 0.5, False, False, torch.float32)
    assert_close_ref(dx, bwd_ref(y, dy, scale=0.5), rel_atol=1e-6)


def test_registered_ops_keep_causal_off_the_inner_tiles(softmax, device):
    """The public functions refuse causal with a dim other than the last; the registered ops, called directly, take
    it (the row kernels' causal mask, query index = row number modulo the second-to-last size). The inner tiles have
    no causal mask, so such a call stays on the row kernels, forward and backward."""
    mod = sys.modules[softmax.__name__ + ".softmax"]
    mod._FWD_PLANS.clear()
    mod._BWD_PLANS.clear()
    x = rand((5, 7), torch.float32, device)
    y = _op(softmax, "softmax_fwd")(x, None, 0, 1.0, True, False, False)
    _op(softmax, "softmax_bwd")(rand((5, 7), torch.float32, device), y, 0, 1.0, True, False, torch.float32)
    assert not any(k.startswith("_inner") for k in _inner_kernels(softmax)), _inner_kernels(softmax)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_case5_compile_fullgraph(softmax, device, backend):
    def f(x, mask):
        a = softmax.softmax(x, scale=0.5, mask=mask)
        b = softmax.log_softmax(x, dim=1, causal=False)
        c = softmax.softmax(x, causal=True)
        return a * 2 + b + c

    x = rand((2, 6, 6), torch.float32, device)
    mask = rand((6, 6), torch.float32, device)
    leaves = [t.clone().requires_grad_() for t in (x, mask)]
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    y = compiled(*leaves)
    y.sum().backward()
    eager = [t.clone().requires_grad_() for t in (x, mask)]
    y_eager = f(*eager)
    y_eager.sum().backward()
    assert torch.equal(y, y_eager)
    for a, e in zip(leaves, eager):  # x's three gradients may be summed in another order: a few fp32 ulps
        torch.testing.assert_close(a.grad, e.grad, rtol=2e-6, atol=1e-6)


def test_eager_fast_path_equals_the_registered_op(softmax, device):
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func.namespace)
            return func(*args, **(kwargs or {}))

    x = rand((5, 77), torch.float16, device)
    with torch.no_grad():
        fast = [softmax.softmax(x), softmax.log_softmax(x, 0)]
        with Count():
            via_op = [softmax.softmax(x), softmax.log_softmax(x, 0)]
    assert calls.count(softmax._ops.NAMESPACE) == 2, calls
    for a, b in zip(fast, via_op):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------- launch config


def triton_cdiv(a, b):
    return -(-a // b)


@pytest.mark.parametrize("warp_size", [32, 64])
def test_case10_config_picker_respects_warp_size(softmax, warp_size):
    for N in [1, 3, 127, 4095, 4097, 32771, 65537, 131072, 262147]:
        for element_size in (2, 4):
            cfg = softmax.pick_config(N, element_size, warp_size)
            assert cfg.num_warps * warp_size <= 1024
            assert cfg.num_warps >= 1 and cfg.num_warps & (cfg.num_warps - 1) == 0
            assert cfg.block_n & (cfg.block_n - 1) == 0
            assert cfg.loop == (cfg.block_n < N)
    assert not softmax.pick_config(16384, 4, warp_size).loop
    assert softmax.pick_config(16385, 4, warp_size).loop
    # narrow rows share a program; looped rows use one, or a split over several when rows are few
    assert softmax.pick_config(1024, 2, warp_size).rows == 1
    assert softmax.pick_config(100, 2, warp_size).rows > 1
    assert softmax.pick_config(131072, 2, warp_size).rows == 1
    import sys

    launch = sys.modules[softmax.__name__ + "._launch"]
    cfg = softmax.pick_config(131072, 2, warp_size)
    cpu = torch.device("cpu")  # the interpreter counts launch.CPU_SMS streaming multiprocessors
    assert launch.split_for(cfg, 131072, 4 * launch.CPU_SMS * launch.SPLIT_BELOW_ROWS_PER_SM, cpu) == 1
    assert 1 < launch.split_for(cfg, 131072, 2, cpu) <= triton_cdiv(131072, cfg.block_n)
    assert launch.split_for(softmax.pick_config(1024, 2, warp_size), 1024, 1, cpu) == 1
    with pytest.raises(ValueError, match="warp_size"):
        softmax.pick_config(128, 2, 48)
    with pytest.raises(ValueError, match="N must be"):
        softmax.pick_config(0, 2, warp_size)


@pytest.mark.parametrize("args, name", [(("4096", 2), "N"), ((4096.0, 2), "N"), ((True, 2), "N"),
                                        ((4096, 2.0), "element_size"), ((4096, None), "element_size"),
                                        ((4096, 2, "32"), "warp_size"), ((4096, 2, 32.0), "warp_size")])
def test_config_pickers_refuse_wrong_types_naming_the_argument(softmax, norms, activations, args, name):
    # every package's pick_config shares these checks (softmax, norms and activations export one)
    for pick in (softmax.pick_config, norms.pick_config, activations.pick_config):
        pick(4096, 2, 32)  # cached: an equal key (2.0 == 2, True == 1) must not return it unchecked
        with pytest.raises(ValueError, match=f"^{name} must be an int >= 1, got"):
            pick(*args)


@pytest.mark.parametrize("warp_size", [1, 1024])
def test_config_pickers_take_every_power_of_two_warp_size(softmax, norms, activations, warp_size):
    # warp_size may be any power of two in [1, 1024] (one warp may fill a program); 2048 is refused
    for pick in (softmax.pick_config, norms.pick_config, activations.pick_config):
        cfg = pick(4096, 2, warp_size)
        assert 1 <= cfg.num_warps and cfg.num_warps * warp_size <= 1024
        with pytest.raises(ValueError, match="warp_size must be a power of two in"):
            pick(4096, 2, 2 * 1024)


@pytest.mark.parametrize("value", [0, -5, 64.0, "64"])
def test_norms_pick_config_refuses_a_bad_bytes_per_thread(norms, value):
    # 0 silently meant the default and -5 gave one warp
    with pytest.raises(ValueError, match="bytes_per_thread must be an int >= 1"):
        norms.pick_config(4096, 2, 32, value)


# ----------------------------------------------------------------------------- errors


def test_bad_inputs_raise_clear_errors(softmax, device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(TypeError, match=r"x must have dtype .*float64"):
        softmax.softmax(x.double())
    with pytest.raises(TypeError, match=r"x must have dtype .*int64"):
        softmax.log_softmax(torch.ones(2, 8, dtype=torch.int64, device=device))
    with pytest.raises(IndexError, match="Dimension out of range"):
        softmax.softmax(x, 2)
    with pytest.raises(TypeError, match="dim must be an int"):
        softmax.softmax(x, None)
    with pytest.raises(TypeError, match="boolean keep-mask"):
        softmax.softmax(x, mask=torch.ones(2, 8, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 8\) does not broadcast"):
        softmax.softmax(x, mask=torch.zeros(3, 8, device=device))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 2, 8\) does not broadcast"):
        softmax.softmax(x, mask=torch.zeros(2, 2, 8, device=device))
    with pytest.raises(ValueError, match="mask is on meta"):
        softmax.softmax(x, mask=torch.zeros(8, device="meta"))
    with pytest.raises(TypeError, match="scale must be a Python float"):
        softmax.softmax(x, scale=torch.tensor(0.5))
    with pytest.raises(ValueError, match="scale must be a finite number"):
        softmax.softmax(x, scale=float("inf"))
    with pytest.raises(ValueError, match="causal=True .* needs dim=-1"):
        softmax.softmax(x, 0, causal=True)
    with pytest.raises(ValueError, match="causal=True"):
        softmax.softmax(torch.randn(8, device=device), causal=True)


def test_cpu_tensor_without_interpreter_raises(built):
    """Without TRITON_INTERPRET=1 the kernels are GPU kernels: a CPU tensor gets a clear error."""
    variant = built["triton-softmax"].variant("cpu")
    code = (
        "import kernels, torch\n"
        f"m = kernels.get_local_kernel(__import__('pathlib').Path({str(variant)!r}))\n"
        "for f in (lambda: m.softmax(torch.randn(2, 8)), lambda: m.cross_entropy(torch.randn(2, 8), torch.zeros(2, dtype=torch.long))):\n"
        "    try:\n"
        "        f()\n"
        "    except RuntimeError as e:\n"
        "        print('ERR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.stdout.count("ERR") == 2 and "TRITON_INTERPRET=1" in res.stdout, res.stdout + res.stderr


_COMPILE_SCRIPT = r'''
import itertools, sys
from pathlib import Path
import kernels, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
name = kernels.get_local_kernel(Path(sys.argv[1])).__name__
smod, cmod = sys.modules[name + ".softmax"], sys.modules[name + ".cross_entropy"]
def sig(kernel, dtype, consts, ptr_types):
    if "FTZ" in kernel.arg_names:  # the NVIDIA-only exps (inline PTX) on sm_90, tl.exp on gfx942
        consts.setdefault("FTZ", arch == "90")
    if "EVEN" in kernel.arg_names:  # the team forward's chunks tiling the row
        consts.setdefault("EVEN", 0)
    return {n: "constexpr" if n in consts else ("*" + ptr_types.get(n, dtype)) if n.endswith("_ptr")
            else "fp32" if n in ("scale", "smoothing", "z_loss") else "i64" for n in kernel.arg_names}
count = 0
for arch in ("90", "gfx942"):
    target = GPUTarget("cuda", 90, 32) if arch == "90" else GPUTarget("hip", arch, 64)
    for dtype, loop, flag in itertools.product(["bf16", "fp32"], [False, True], [False, True]):
        # looped: second pass reversed with eviction hints, or prefetching; one block: 1 or 4 rows per program
        opt = {"ROWS": 1 if loop or not flag else 4, "REVERSE": flag and loop,
               "EVICT1": "evict_last" if flag and loop else "", "EVICT2": "evict_first" if flag and loop else "",
               "PREFETCH": loop and not flag}
        for kernel, consts, pt in [
            (smod._softmax_fwd_kernel, {"CAUSAL": flag, "LOG": not flag, "SCALED": True, "BLOCK_N": 1024,
                                        "LOOP": loop, **opt}, {}),
            (smod._softmax_fwd_kernel, {"CAUSAL": flag, "LOG": flag, "SCALED": flag, "BLOCK_N": 1024, "LOOP": loop,
                                        "m_ptr": None, **opt}, {}),
            (smod._softmax_bwd_kernel, {"CAUSAL": flag, "LOG": flag, "BLOCK_N": 1024, "LOOP": loop, **opt}, {}),
            (cmod._cross_entropy_fwd_kernel, {"BLOCK_N": 1024, "LOOP": loop, "SMOOTH": flag,
                                              **({"count_ptr": None} if flag else {"g_ptr": None, "lse_ptr": None}),
                                              **{k: v for k, v in opt.items() if k != "ROWS"}},
             {"t_ptr": "i64", "loss_ptr": "fp32", "count_ptr": "i64", "lse_ptr": "fp32", "applied_ptr": "fp32"}),
        ] + ([(cmod._scale_grad_kernel, {"BLOCK_N": 1024, "INPLACE": True},
               {"applied_ptr": "fp32", "d_ptr": "fp32", "t_ptr": "i64"}),
              (cmod._cross_entropy_bwd_kernel, {"BLOCK_N": 1024},
               {"t_ptr": "i64", "lse_ptr": "fp32", "d_ptr": "fp32", "count_ptr": "i64"}),
              (cmod._count_kernel, {"BLOCK": 1024}, {"t_ptr": "i64", "count_ptr": "i64"}),
              (cmod._reduce_loss_kernel, {"BLOCK": 1024}, {"rows_ptr": "fp32", "count_ptr": "i64"}),
              (cmod._reduce_loss_kernel, {"BLOCK": 1024, "count_ptr": None}, {"rows_ptr": "fp32"})]
             if not (loop or flag) else []) + ([  # few wide rows: split over programs
            (smod._softmax_split_stats_kernel, {"CAUSAL": True, "SCALED": True, "BLOCK_N": 1024}, {"ws_ptr": "fp32"}),
            (smod._softmax_split_out_kernel, {"CAUSAL": False, "LOG": True, "SCALED": False, "BLOCK_N": 1024,
                                              "SPLIT_P2": 8, "m_ptr": None}, {"ws_ptr": "fp32"}),
            (smod._softmax_bwd_split_stats_kernel, {"LOG": False, "BLOCK_N": 1024}, {"ws_ptr": "fp32"}),
            (smod._softmax_bwd_split_out_kernel, {"CAUSAL": True, "LOG": True, "BLOCK_N": 1024, "SPLIT_P2": 8},
             {"ws_ptr": "fp32"}),
        ] if loop and flag else []):
            src = ASTSource(kernel, sig(kernel, dtype, consts, pt),
                            constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
            triton.compile(src, target=target, options={"num_warps": 4, "enable_fp_fusion": False})
            count += 1
    # wide rows over persistent teams (64-bit atomic exchange, volatile polling, row loop with prefetch)
    tp = {"ws_ptr": "i64", "t_ptr": "i64", "loss_ptr": "fp32", "lse_ptr": "fp32", "count_ptr": "i64",
          "applied_ptr": "fp32"}
    team = {"BLOCK_N": 1024, "TEAM_P2": 64}
    for dtype in ("bf16", "fp32"):
        for kernel, consts in [
            (smod._softmax_team_fwd_kernel, {"CAUSAL": True, "LOG": False, "SCALED": True, "PHASE": 0,
                                             "ALONE": False, "EVEN": 1, **team}),
            (smod._softmax_team_fwd_kernel, {"CAUSAL": False, "LOG": True, "SCALED": False, "PHASE": 1,
                                             "ALONE": False, "m_ptr": None, **team}),
            (smod._softmax_team_fwd_kernel, {"CAUSAL": False, "LOG": False, "SCALED": True, "PHASE": 0,
                                             "ALONE": True, "ws_ptr": None, **team}),
            (smod._softmax_team_bwd_kernel, {"CAUSAL": True, "LOG": True, "PHASE": 0, **team}),
            (cmod._cross_entropy_team_fwd_kernel, {"SMOOTH": True, "PHASE": 0, "count_ptr": None, **team}),
            (cmod._cross_entropy_team_fwd_kernel, {"SMOOTH": False, "PHASE": 2, "g_ptr": None, "lse_ptr": None,
                                                   **team}),
        ]:
            src = ASTSource(kernel, sig(kernel, dtype, consts, tp),
                            constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
            triton.compile(src, target=target, options={"num_warps": 8, "enable_fp_fusion": False})
            count += 1
    # the shipped team tiers as launched (bf16; fp32 for a tier of fp32 rows only, ``max_elems``): their warps, chunk,
    # register cap and fp contraction, a team of one without its workspace
    launch = sys.modules[name + "._launch"]
    for kind, kernel, consts in [
        ("softmax", smod._softmax_team_fwd_kernel, {"CAUSAL": False, "LOG": False, "SCALED": False, "PHASE": 0,
                                                    "m_ptr": None, "ALONE": False, "EVEN": 1}),
        ("softmax_bwd", smod._softmax_team_bwd_kernel, {"CAUSAL": False, "LOG": False, "PHASE": 0}),
        ("cross_entropy", cmod._cross_entropy_team_fwd_kernel, {"SMOOTH": False, "PHASE": 0, "lse_ptr": None}),
    ]:
        for s in launch.TEAM_TUNED[kind]:
            elem = 4 if s["chunk_bytes"] // 2 > s.get("max_elems", s["chunk_bytes"]) else 2
            full = {**consts, "BLOCK_N": s["chunk_bytes"] // elem, "TEAM_P2": 32}
            if s.get("max_team") == 1:
                full.update(ALONE=True, ws_ptr=None)
            options = {"num_warps": s["num_warps"], "enable_fp_fusion": s.get("fp_fusion", False)}
            if arch == "90":
                options["maxnreg"] = s["maxnreg"]
            src = ASTSource(kernel, sig(kernel, "bf16" if elem == 2 else "fp32", full, tp),
                            constexprs={(kernel.arg_names.index(k),): v for k, v in full.items()})
            triton.compile(src, target=target, options=options)
            count += 1
    # torch-order softmax (the Softmax layer): warp order, and the Reg / Smem / ilpReduce block orders
    omod = sys.modules[name + "._torch_order"]
    for dtype in ("bf16", "fp32"):
        block = {"ILP": 8 if dtype == "bf16" else 4, "T": 1024, "LOG_WARPS": 5, "BLOCK": 2048, "LIBDEVICE": 1}
        for kernel, consts in [
            (omod._softmax_warp_order_kernel, {"ROWS": 4, "W": 32, "LOG_W": 5, "ITERS": 32, "LIBDEVICE": 1}),
            (omod._softmax_warp_order_kernel, {"ROWS": 64, "W": 8, "LOG_W": 3, "ITERS": 1, "LIBDEVICE": 1}),
        ] + [(omod._softmax_block_order_kernel, {"PATH": path, **block}) for path in (1, 2, 3)]:
            src = ASTSource(kernel, sig(kernel, dtype, consts, {}),
                            constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
            triton.compile(src, target=target, options={"num_warps": 8, "enable_fp_fusion": False})
            count += 1
print("COMPILED", count)
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90_and_gfx942(built):
    """Lower every kernel (fwd/bwd, looped or not, split or team, the shipped team tiers, causal/log, with and
    without optional pointers, the torch-order kernels) to a binary for an H100/H200 and an MI300 without a GPU: catches what the interpreter never
    sees."""
    variant = built["triton-softmax"].variant("cpu")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, str(variant)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert "COMPILED 162" in res.stdout, res.stdout + res.stderr
