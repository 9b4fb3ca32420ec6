"""triton-matmul ``matmul``: values and gradients against fp64 PyTorch, layouts, configs, ops, errors.

Loaded by Hub name through the ``matmul`` fixture (conftest); on CPU the kernel runs under the
Triton interpreter, so shapes are tiny (primes 17, 31, 67 cover partial tiles on every edge).

Tolerance (``assert_matmul_close``): the kernel accumulates in fp32 and rounds once, so the
error is at most 1 ulp of the output dtype (the rounding; ``ULPS``) plus the fp32 accumulation
error, bounded by ``EPS_ACC[dtype] * (|a| @ |b| + |bias|)`` (K products summed in fp32 grow
with the magnitudes summed, not with the result, which may cancel to ~0). Gated outputs
``p * act(g)`` propagate both halves' slack (|act'| <= 1.13 for gelu, 1.1 for silu, bound 1.2).
On CUDA fp32 inputs run as tf32 (10-bit mantissa products): ``EPS_ACC`` is 2^-10 there.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = os.environ.get("TEST_DEVICE", "cpu")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ULPS = {torch.float32: 2, torch.float16: 1, torch.bfloat16: 1}
MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
MIN_EXP = {torch.float32: -126, torch.float16: -14, torch.bfloat16: -126}
EPS_ACC = {torch.float32: 2.0 ** -10 if DEVICE == "cuda" else 1e-6, torch.float16: 1e-6, torch.bfloat16: 1e-6}
ACTIVATIONS = [None, "gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu"]
GATED = {"geglu": "gelu", "swiglu": "silu"}


def act_ref(h, name):
    if name is None:
        return h
    return {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
            "relu": F.relu}[name](h)


def ref(a, b, bias, activation):
    """fp64 reference of ``matmul`` (diffusers' split for the gated forms: proj first, gate activated)."""
    h = a.double().reshape(math.prod(a.shape[:-1]), a.shape[-1]) @ b.double()
    if bias is not None:
        h = h + bias.double()
    if activation in GATED:
        p, g = h.chunk(2, dim=-1)
        y = p * act_ref(g, GATED[activation])
    else:
        y = act_ref(h, activation)
    return y.reshape(*a.shape[:-1], y.shape[-1])


def slack(a, b, bias, activation):
    """fp32-accumulation error bound per output element (see the module docstring), fp64."""
    s = a.double().abs().reshape(math.prod(a.shape[:-1]), a.shape[-1]) @ b.double().abs()
    if bias is not None:
        s = s + bias.double().abs()
    eps = EPS_ACC[a.dtype]
    if activation in GATED:
        h = a.double().reshape(math.prod(a.shape[:-1]), a.shape[-1]) @ b.double() + (bias.double() if bias is not None else 0)
        p, g = h.chunk(2, dim=-1)
        sp, sg = s.chunk(2, dim=-1)
        out = eps * (sp * act_ref(g, GATED[activation]).abs() + 1.2 * (p.abs() + eps * sp) * sg)
    else:
        out = eps * 1.2 * s
    return out.reshape(*a.shape[:-1], out.shape[-1])


def ulp(t, dtype):
    _, e = torch.frexp(t.double())
    e = torch.clamp(e - 1, min=MIN_EXP[dtype])
    return torch.pow(2.0, (e - MANTISSA[dtype]).double())


def assert_matmul_close(y, a, b, bias, activation):
    expected = ref(a, b, bias, activation)
    assert y.shape == expected.shape and y.dtype == a.dtype
    rounded = expected.to(y.dtype).double()
    tol = ULPS[y.dtype] * ulp(rounded, y.dtype) + slack(a, b, bias, activation)
    diff = (y.double() - rounded).abs()
    bad = ~(diff <= tol)
    assert not bad.any(), f"{int(bad.sum())} of {y.numel()} off; worst {diff.max().item():.3g} (tol {tol.flatten()[diff.argmax()].item():.3g})"


def assert_grads_fp64(y, a, b, bias, activation, rtol):
    """The gradients of ``y`` for a fresh random upstream gradient match fp64 autograd through ``ref``:
    within ``rtol`` relative and ``rtol`` times the largest fp64 gradient absolute, in the inputs' dtype."""
    dy = torch.randn_like(y)
    ins = [t for t in (a, b, bias) if t is not None]
    grads = torch.autograd.grad(y, ins, dy)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    bias64 = bias.detach().double().requires_grad_() if bias is not None else None
    grads64 = torch.autograd.grad(ref(a64, b64, bias64, activation), [t for t in (a64, b64, bias64) if t is not None],
                                  dy.double())
    for t, g, g64 in zip(ins, grads, grads64):
        assert g.dtype == t.dtype and g.shape == g64.shape
        torch.testing.assert_close(g.double(), g64, rtol=rtol, atol=rtol * g64.abs().max().item())


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(shape) * scale).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("has_bias", [False, True])
def test_values(matmul, dtype, activation, has_bias):
    # M=17, K=31, N=22 (gated: 11 outputs): every edge of every tile partial
    torch.manual_seed(0)
    a, b = rand(17, 31, dtype=dtype), rand(31, 22, dtype=dtype, scale=0.3)
    bias = rand(22, dtype=dtype) if has_bias else None
    assert_matmul_close(matmul.matmul(a, b, bias, activation), a, b, bias, activation)


@pytest.mark.parametrize("M,N,K", [(1, 16, 16), (67, 31, 17), (3, 67, 67), (17, 2, 1), (5, 7, 0)])
def test_shapes(matmul, M, N, K):
    # 1 row; primes on each dim; K = 1; K = 0 (y = bias)
    torch.manual_seed(1)
    a, b, bias = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16), rand(N, dtype=torch.float16)
    assert_matmul_close(matmul.matmul(a, b, bias, "gelu"), a, b, bias, "gelu")


def test_empty(matmul):
    a = rand(0, 5, dtype=torch.float16)
    assert matmul.matmul(a, rand(5, 7, dtype=torch.float16)).shape == (0, 7)


@pytest.mark.parametrize("activation", [None, "geglu"])
def test_transposed_and_strided(matmul, activation):
    # a^T and b^T read in place, a column slice (row stride > K), batch dims flattened
    torch.manual_seed(2)
    dt = torch.bfloat16
    at = rand(31, 17, dtype=dt).t()
    bt = rand(22, 31, dtype=dt).t()
    assert not at.is_contiguous() and not bt.is_contiguous()
    assert_matmul_close(matmul.matmul(at, bt, None, activation), at, bt, None, activation)
    wide = rand(17, 40, dtype=dt)[:, 3:34]
    assert_matmul_close(matmul.matmul(wide, bt, None, activation), wide, bt, None, activation)
    batched = rand(2, 3, 5, 31, dtype=dt)
    y = matmul.matmul(batched, bt, None, activation)
    assert y.shape == (2, 3, 5, 22 if activation is None else 11)
    assert_matmul_close(y, batched, bt, None, activation)
    vec = rand(31, dtype=dt)
    assert matmul.matmul(vec, bt).shape == (22,)


def test_configs_agree(matmul, device):
    # correctness never depends on the config: every tile shape gives the fp64 result within tolerance,
    # and on a GPU configs with the same BLOCK_K (same fp32 summation order per element) agree bit for bit.
    # Not under the interpreter: there tl.dot is numpy's matmul, whose order within a block is the BLAS
    # kernel's and changes with the tile's shape on some CPUs (OpenBLAS on an AMD EPYC, 2026-12-02)
    torch.manual_seed(3)
    a, b, bias = rand(37, 67, dtype=torch.float16), rand(67, 46, dtype=torch.float16), rand(46, dtype=torch.float16)
    C = matmul.MatmulConfig
    configs = [C(16, 16, 16, 1, 1, 1), C(32, 16, 16, 4, 2, 2), C(16, 64, 16, 8, 4, 3), C(64, 32, 32, 2, 4, 3),
               C(128, 128, 64, 8, 8, 4)]
    outs = [matmul.matmul(a, b, bias, "swiglu", config=c) for c in configs]
    for y in outs:
        assert_matmul_close(y, a, b, bias, "swiglu")
    if device == "cuda":
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])


@pytest.mark.parametrize("activation", [None, "gelu", "swiglu"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_tma_kernel(matmul, activation, b_layout):
    # the Hopper TMA-descriptor kernel (run by the interpreter here, with 4 "SMs"): every variant
    # (one program per tile / persistent, whole or split epilogue, b as (K, N) or read through W.T)
    # gives the fp64 result, on prime M and K / N that are not multiples of the tiles
    torch.manual_seed(6)
    dt = torch.bfloat16
    M, K, n_total = 37, 72, 80 if activation == "swiglu" else 40
    a = rand(M, K, dtype=dt)
    b = rand(K, n_total, dtype=dt) if b_layout == "kn" else rand(n_total, K, dtype=dt).t()
    bias = rand(n_total, dtype=dt)
    C = matmul.MatmulConfig
    outs = []
    for persistent, subtile in [(0, 0), (1, 0), (1, 1), (2, 1)]:
        cfg = C(16, 32, 32, 2, 4, 2, tma=1, persistent=persistent, epilogue_subtile=subtile)
        y = matmul.matmul(a, b, bias, activation, config=cfg)
        assert_matmul_close(y, a, b, bias, activation)
        outs.append(y)
    # same BLOCK_K: same summation order per element as the pointer kernel, bit for bit
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert torch.equal(outs[0], matmul.matmul(a, b, bias, activation, config=C(16, 32, 32, 2, 4, 2)))
    # split-K (3 programs per tile; K = 72 has 3 k-tiles of 32, 5 of 16: one split runs empty)
    for bk in (32, 16):
        y = matmul.matmul(a, b, bias, activation, config=C(16, 32, bk, 2, 4, 2, tma=1, split_k=3))
        assert_matmul_close(y, a, b, bias, activation)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_tma_kernel_sub_n(matmul, activation, b_layout):
    # tiles of SUB_N accumulators of BLOCK_N columns (48 = 3 x 16 wide, 32 = 2 x 16): prime M; N = 88 ends in a
    # tile whose last sub-tile is partly past N, N = 56 in one whose last two sub-tiles lie wholly past N; one
    # program per tile, persistent (1 and 2 per "SM"), split epilogue, split-K (3 k-tiles of 32; 5 of 16 with an
    # empty split): fp64 results, and with BLOCK_K 32 the same bits as 16-wide tiles (same order per element)
    torch.manual_seed(14)
    dt = torch.bfloat16
    C = matmul.MatmulConfig
    M, K = 37, 72
    for n_out in (88, 56):
        a = rand(M, K, dtype=dt)
        b = rand(K, n_out, dtype=dt) if b_layout == "kn" else rand(n_out, K, dtype=dt).t()
        bias = rand(n_out, dtype=dt)
        plain = matmul.matmul(a, b, bias, activation, config=C(16, 16, 32, 2, 4, 2, tma=1))
        assert_matmul_close(plain, a, b, bias, activation)
        for sub_n, persistent, subtile, split, bk in ((3, 0, 0, 1, 32), (3, 1, 1, 1, 32), (2, 2, 0, 1, 32),
                                                      (3, 0, 0, 3, 32), (3, 0, 1, 3, 16)):
            cfg = C(16, 16, bk, 2, 4, 2, tma=1, persistent=persistent, epilogue_subtile=subtile, split_k=split,
                    sub_n=sub_n)
            y = matmul.matmul(a, b, bias, activation, config=cfg)
            assert_matmul_close(y, a, b, bias, activation)
            if split == 1:
                assert torch.equal(y, plain), cfg
    # where SUB_N does not apply (gated, the pointer kernel) tiles are BLOCK_N wide: the same values
    w = rand(2 * 88, K, dtype=dt)
    for act, tma in (("swiglu", 1), (activation, 0)):
        b = w.t() if act == "swiglu" else w[:88].t()
        y = matmul.matmul(a, b, None, act, config=C(16, 16, 32, 2, 4, 2, tma=tma, sub_n=3))
        assert_matmul_close(y, a, b, None, act)


GLUON_CASES = [  # (M, N, K) with N and K multiples of 8 (16-byte TMA strides) but of no tile; M prime
    (37, 88, 72), (257, 136, 200), (1, 24, 8)]
# on the GPU also: several tiles per persistent program (each ping-pong consumer takes turns over many tiles), with
# K over several ring passes per tile, and with K <= BLOCK_K (the ring wraps across tile boundaries within one pass)
GLUON_CASES_CUDA = [(1031, 4104, 520), (1031, 4104, 64)]


def _count_gluon_calls(matmul, monkeypatch):
    """A list that gets one entry per launch of the Gluon kernel (by the plans of matmul_sm90.plan; the test starts
    with no plans, so that none built before escapes the count)."""
    import sys

    sm90 = sys.modules[matmul.__name__ + ".matmul_sm90"]
    mod = sys.modules[matmul.__name__ + ".matmul"]
    calls, plan = [], sm90.plan

    def counted(*args, **kw):
        launch, make_args = plan(*args, **kw)
        return (lambda kernel_args: (calls.append(1), launch(kernel_args))[1]), make_args

    monkeypatch.setattr(sm90, "plan", counted)
    monkeypatch.setattr(mod, "_PLANS", type(mod._PLANS)())
    return sm90, calls


@pytest.mark.parametrize("gluon,bm,bn,bk,stages", [(1, 128, 64, 64, 4), (2, 64, 128, 64, 8), (2, 128, 32, 32, 3),
                                                   (1, 256, 16, 16, 2)])
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu", "relu"])
def test_gluon_configs(matmul, monkeypatch, gluon, bm, bn, bk, stages, activation):
    # configs asking for the sm_90 Gluon kernel (cooperative 1 / ping-pong 2): on an sm_90 GPU that kernel runs (its
    # launches counted), elsewhere the other kernels do; either way the fp64 result, with and without bias, on shapes
    # whose every tile edge is partial; bf16 and fp16
    sm90, calls = _count_gluon_calls(matmul, monkeypatch)
    torch.manual_seed(15)
    cfg = matmul.MatmulConfig(bm, bn, bk, 2, 4, stages, tma=1, gluon=gluon)
    cases = GLUON_CASES + (GLUON_CASES_CUDA if DEVICE == "cuda" else [])
    dtypes = [torch.bfloat16, torch.float16] * len(cases)
    for i, ((M, N, K), dt) in enumerate(zip(cases, dtypes)):
        a = rand(M, K, dtype=dt)
        w = rand(N, K, dtype=dt, scale=K ** -0.5)
        bias = rand(N, dtype=dt) if i % 2 == 0 else None
        y = matmul.matmul(a, w.t(), bias, activation, config=cfg)
        assert_matmul_close(y, a, w.t(), bias, activation)
    on_sm90 = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0) and sm90.AVAILABLE
    assert len(calls) == (len(cases) if on_sm90 else 0)


def test_gluon_fallbacks(matmul, monkeypatch):
    # calls a Gluon config must not take to the Gluon kernel (it has neither a gated epilogue, nor a saved
    # pre-activation, nor a (K, N) row-major b, nor 8-byte row strides): the other kernels, right values; a plain
    # call with gradients takes it (nothing to save) and its gradients are right
    sm90, calls = _count_gluon_calls(matmul, monkeypatch)
    torch.manual_seed(16)
    dt = torch.bfloat16
    cfg = matmul.MatmulConfig(64, 64, 64, 2, 4, 4, tma=1, gluon=2)
    M, N, K = 67, 96, 136
    a, w, bias = rand(M, K, dtype=dt), rand(2 * N, K, dtype=dt, scale=K ** -0.5), rand(2 * N, dtype=dt)
    assert_matmul_close(matmul.matmul(a, w.t(), bias, "swiglu", config=cfg), a, w.t(), bias, "swiglu")
    kn = w[:N].t().contiguous()  # (K, N) row-major
    assert_matmul_close(matmul.matmul(a, kn, bias[:N], "gelu", config=cfg), a, kn, bias[:N], "gelu")
    narrow = rand(M, 4, dtype=dt)  # rows of 8 bytes: no TMA descriptor
    assert_matmul_close(matmul.matmul(narrow, w[:N, :4].t(), None, None, config=cfg), narrow, w[:N, :4].t(), None,
                        None)
    a_grad = a.clone().requires_grad_()
    y = matmul.matmul(a_grad, w[:N].t(), bias[:N], "gelu", config=cfg)  # saves h for the backward
    assert_matmul_close(y, a, w[:N].t(), bias[:N], "gelu")
    assert calls == []
    on_sm90 = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0) and sm90.AVAILABLE
    b = w[:N].clone().requires_grad_().t()
    y = matmul.matmul(a_grad, b, None, None, config=cfg)
    assert_matmul_close(y, a, w[:N].t(), None, None)
    assert len(calls) == int(on_sm90)
    assert_grads_fp64(y, a_grad, b, None, None, 2e-2)


def test_config_gluon(matmul):
    # GLUON: JSON key (absent: 0), list round trip, check(); the lookup keeps it for plain calls and drops it for
    # gated ones (the Gluon kernel has no gated epilogue); shared-memory fitting lowers the ring, never below 2
    import sys

    launch = sys.modules[matmul.__name__ + "._launch"]
    sm90 = sys.modules[matmul.__name__ + ".matmul_sm90"]
    C = matmul.MatmulConfig
    entry = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 8, "TMA": 1}
    assert C.from_json(entry).gluon == 0
    cfg = C.from_json({**entry, "GLUON": 2})
    assert cfg.gluon == 2 and cfg.to_json()["GLUON"] == 2 and C.from_json(cfg.to_json()) == cfg
    assert C.from_list(cfg.as_list()) == cfg
    with pytest.raises(ValueError, match="gluon must be 0, 1"):
        C.from_json({**entry, "GLUON": 3}).check()
    buckets = (launch.Bucket((256, 3072, 3072), cfg),)
    assert launch.lookup(buckets, 256, 3072, 3072, activation="gelu").gluon == 2
    assert launch.lookup(buckets, 256, 3072, 3072, activation="swiglu").gluon == 0
    # 8 stages of (64 + 128) x 64 bf16 (24 KiB) and two 64 x 128 output tiles (32 KiB) fit in 227 KiB
    assert sm90.fitting_stages(cfg) == 8
    assert sm90.fitting_stages(C(128, 256, 64, 8, 4, 9, gluon=1)) == 3  # 48 KiB a stage, 64 KiB of output tiles
    assert sm90.fitting_stages(C(256, 256, 128, 8, 4, 4, gluon=2)) == 0  # not even two stages


def test_gluon_eligibility(matmul, monkeypatch):
    # the tiles and operands the Gluon kernel takes, with the device check patched (CPU tensors): 64 or 128 rows per
    # consumer, power-of-two block_n / block_k, at most 128 x 128 accumulators per consumer; TMA-aligned a, w, y
    import sys

    sm90 = sys.modules[matmul.__name__ + ".matmul_sm90"]
    if not sm90.AVAILABLE:
        pytest.skip("this Triton has no usable Gluon")
    monkeypatch.setattr(sm90, "capability_90", lambda device: True)
    C = matmul.MatmulConfig
    a, w = torch.zeros(256, 64, dtype=torch.bfloat16), torch.zeros(128, 64, dtype=torch.bfloat16)
    y = torch.empty(256, 128, dtype=torch.bfloat16)
    for cfg, ok in ((C(64, 128, 64, 8, 4, 8, gluon=2), True), (C(128, 256, 64, 8, 4, 3, gluon=1), True),
                    (C(128, 256, 64, 8, 4, 3, gluon=2), False), (C(64, 128, 64, 8, 4, 8, gluon=1), False),
                    (C(128, 96, 64, 8, 4, 4, gluon=1), False), (C(128, 128, 48, 8, 4, 4, gluon=1), False),
                    (C(64, 128, 64, 8, 4, 8, gluon=0), False)):
        assert sm90.eligible(a, w.t(), y, "gelu", cfg) == ok, cfg
    cfg = C(64, 128, 64, 8, 4, 8, gluon=2)
    assert not sm90.eligible(a, w.t(), y, "swiglu", cfg)  # gated
    assert not sm90.eligible(a.float(), w.t().float(), y.float(), None, cfg)  # fp32
    assert not sm90.eligible(a, w.t().contiguous(), y, None, cfg)  # (K, N) row-major b
    assert not sm90.eligible(a[:1].expand(256, 64), w.t(), y, None, cfg)  # a broadcast row: stride 0
    assert not sm90.eligible(a[:, 4:], w[:, 4:].t(), y, None, cfg)  # 8-byte aligned bases


def test_config_sub_n(matmul):
    # SUB_N: JSON key (absent: 1), list round trip, check(); the lookup keeps it for plain calls, lowers it to the
    # sub-tiles N needs, and drops it for gated calls (two accumulators instead)
    import sys

    launch = sys.modules[matmul.__name__ + "._launch"]
    C = matmul.MatmulConfig
    entry = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "TMA": 1,
             "PERSISTENT": 1}
    assert C.from_json(entry).sub_n == 1
    cfg = C.from_json({**entry, "SUB_N": 3})
    assert cfg.sub_n == 3 and cfg.to_json()["SUB_N"] == 3 and C.from_json(cfg.to_json()) == cfg
    assert C.from_list(cfg.as_list()) == cfg
    for bad in (0, 4):
        with pytest.raises(ValueError, match="sub_n must be 1, 2 or 3"):
            C.from_json({**entry, "SUB_N": bad}).check()
    buckets = (launch.Bucket((1024, 3072, 3072), cfg),)
    assert launch.lookup(buckets, 1024, 3072, 3072).sub_n == 3
    assert launch.lookup(buckets, 1024, 100, 3072).sub_n == 2  # 100 columns: two 64-column sub-tiles
    assert launch.lookup(buckets, 1024, 40, 3072).sub_n == 1
    assert launch.lookup(buckets, 1024, 3072, 3072, gated=True).sub_n == 1
    assert launch.lookup(buckets, 1024, 3072, 3072, activation="geglu").sub_n == 1
    assert launch.lookup(buckets, 1024, 3072, 3072, activation="gelu").sub_n == 3


@pytest.mark.parametrize("activation", [None, "gelu_tanh", "geglu"])
@pytest.mark.parametrize("b_layout", ["nk", "kn", "strided"])
def test_gemv_kernel(matmul, activation, b_layout):
    # the few-row GEMV kernel: M = 1 (decode), 3 (BLOCK_M 4 with a masked row), 8 (GEMV_MAX_M); prime K (masked
    # k chunks) and an exact multiple (EVEN_K); output columns per program 1, 4, 16 (N = 23 leaves partial
    # programs); W read as W.t(), a row-major (K, N) b, and a b with both strides > 1
    torch.manual_seed(11)
    dt = torch.bfloat16
    C = matmul.MatmulConfig
    n_out = 23
    n_total = 2 * n_out if activation == "geglu" else n_out
    for M, K in ((1, 67), (3, 64), (8, 37)):
        a = rand(M, K, dtype=dt)
        if b_layout == "nk":
            b = rand(n_total, K, dtype=dt).t()
        elif b_layout == "kn":
            b = rand(K, n_total, dtype=dt)
        else:
            b = rand(2 * K, 3 * n_total, dtype=dt)[::2, ::3]
        bias = rand(n_total, dtype=dt)
        for bn in (1, 4, 16):
            y = matmul.matmul(a, b, bias, activation, config=C(16, bn, 32, 1, 4, 1, gemv=1))
            assert_matmul_close(y, a, b, bias, activation)
    # a strided (transposed) a and a 3-d a with M = 1 row
    w = rand(n_total, 40, dtype=dt)
    at = rand(40, 2, dtype=dt).t()
    assert_matmul_close(matmul.matmul(at, w.t(), None, activation, config=C(16, 8, 16, 1, 2, 1, gemv=1)),
                        at, w.t(), None, activation)


def test_gemv_config_rows_and_grad(matmul):
    # a GEMV config on more rows than the GEMV kernel takes runs the tensor-core kernels (tiles >= 16);
    # with autograd the GEMV kernel saves h and the backward matches fp64
    torch.manual_seed(12)
    dt = torch.float16
    cfg = matmul.MatmulConfig(16, 4, 64, 1, 4, 2, gemv=1)
    a, b, bias = rand(19, 33, dtype=dt), rand(33, 20, dtype=dt), rand(20, dtype=dt)
    assert_matmul_close(matmul.matmul(a, b, bias, "silu", config=cfg), a, b, bias, "silu")
    a = rand(2, 33, dtype=dt).requires_grad_()
    b = rand(33, 20, dtype=dt, scale=0.3).requires_grad_()
    y = matmul.matmul(a, b, None, "gelu", config=cfg)
    assert_matmul_close(y, a, b, None, "gelu")
    assert_grads_fp64(y, a, b, None, "gelu", 4 * 2.0 ** -10)
    with pytest.raises(ValueError, match="block_n of a GEMV config"):
        matmul.matmul(a.detach(), b.detach(), config=matmul.MatmulConfig(16, 3, 64, 1, 4, 2, gemv=1))
    with pytest.raises(ValueError, match="persistent must be 0, 1 or 2"):
        matmul.matmul(a.detach(), b.detach(), config=matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1, persistent=3))


@pytest.mark.parametrize("activation", [None, "gelu", "swiglu"])
@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_stream_k_kernel(matmul, activation, b_layout):
    # stream-K (the interpreter has 4 "SMs": 4 or 8 programs): tiles cut between programs at every position
    # (k tiles per tile 1, 3, 5; tile counts 2, 6 and 9, so ranges start mid-tile, span several tiles, lie inside
    # one, or start exactly where a tile starts without finishing it), prime M; the result matches fp64 and,
    # pieces being summed in program order, repeats bit for bit
    torch.manual_seed(13)
    dt = torch.bfloat16
    C = matmul.MatmulConfig
    for M, K, n_out in ((37, 16, 40), (37, 72, 40), (53, 80, 24), (13, 80, 32)):
        n_total = 2 * n_out if activation == "swiglu" else n_out
        a = rand(M, K, dtype=dt)
        b = rand(K, n_total, dtype=dt) if b_layout == "kn" else rand(n_total, K, dtype=dt).t()
        bias = rand(n_total, dtype=dt)
        for bk, pers, sub in ((16, 1, 0), (16, 2, 1), (32, 1, 1)):
            cfg = C(16, 16, bk, 2, 4, 2, tma=1, persistent=pers, epilogue_subtile=sub, stream_k=1)
            y = matmul.matmul(a, b, bias, activation, config=cfg)
            assert_matmul_close(y, a, b, bias, activation)
            assert torch.equal(y, matmul.matmul(a, b, bias, activation, config=cfg))


def test_gluon_capability_is_sm90_exactly(matmul, monkeypatch):
    # wgmma and setmaxnreg exist on sm_90a only: the Gluon kernels are off on every other capability, later ones
    # (sm_100, sm_120) included, on ROCm and without CUDA
    import sys

    gluon = sys.modules[matmul.__name__ + "._gluon"]
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap[0])
    monkeypatch.setattr(torch.version, "hip", None)
    dev = torch.device("cuda", 0)
    try:
        for c, want in (((9, 0), True), ((10, 0), False), ((12, 0), False), ((8, 9), False), ((9, 1), False)):
            cap[0] = c
            gluon.capability_90.cache_clear()
            assert gluon.capability_90(dev) is want, c
        cap[0] = (9, 0)
        gluon.capability_90.cache_clear()
        assert not gluon.capability_90(torch.device("cpu"))
        monkeypatch.setattr(torch.version, "hip", "6.4")
        gluon.capability_90.cache_clear()
        assert not gluon.capability_90(dev)
    finally:
        gluon.capability_90.cache_clear()


def test_tma_kernel_grad_and_fallback(matmul):
    # h saved through pointers by the TMA kernel; unaligned strides (K = 31) fall back to the pointer kernel
    torch.manual_seed(7)
    dt = torch.float16
    cfg = matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1, persistent=1)
    for K in (40, 31):
        a = rand(19, K, dtype=dt).requires_grad_()
        b = rand(K, 48, dtype=dt, scale=0.3).requires_grad_()
        y = matmul.matmul(a, b, None, "geglu", config=cfg)
        assert_matmul_close(y, a, b, None, "geglu")
        assert_grads_fp64(y, a, b, None, "geglu", 4 * 2.0 ** -10)


def test_broadcast_operands(matmul):
    # stride-0 operands (x.expand: one row repeated; a broadcast weight column) never reach a TMA descriptor; the
    # pointer kernel reads them through their strides: fp64 values with a config asking for TMA
    import sys

    mod = sys.modules[matmul.__name__ + ".matmul"]
    torch.manual_seed(17)
    dt = torch.bfloat16
    a_row, w = rand(1, 40, dtype=dt), rand(24, 40, dtype=dt, scale=0.3)
    a = a_row.expand(19, 40)
    assert mod._tma_layout(a, w.t(), 24) is None and mod._tma_layout(a_row, w.t(), 24) is True  # (N, K) w
    b = rand(40, 1, dtype=dt).expand(40, 24)  # every output column the same
    assert mod._tma_layout(a_row.expand(1, 40), b, 24) is None
    cfg = matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1)
    for x, y in ((a, w.t()), (rand(19, 40, dtype=dt), b)):
        assert_matmul_close(matmul.matmul(x, y, None, "gelu", config=cfg), x, y, None, "gelu")


def test_call_plans(matmul, monkeypatch):
    # a call signature picks its kernel once (_new_plan) and later calls launch from its plan with their own data:
    # fresh operands give their own fp64 values (TMA descriptors rebased on each call's tensors, split-K scratch
    # made per call); an operand that no longer starts on 16 bytes, another dtype, bias or none, and another config
    # are other signatures, a single row's stride is not; a plan keeps none of its first call's tensors
    import sys
    import weakref

    mod = sys.modules[matmul.__name__ + ".matmul"]
    monkeypatch.setattr(mod, "_PLANS", type(mod._PLANS)())
    built, new_plan = [], mod._new_plan
    monkeypatch.setattr(mod, "_new_plan", lambda *args: (built.append(1), new_plan(*args))[1])
    torch.manual_seed(18)
    dt = torch.bfloat16
    M, N, K = 37, 48, 80
    for cfg in (matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1), matmul.MatmulConfig(16, 16, 16, 1, 4, 2),
                matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1, split_k=3)):
        before = len(built)
        for _ in range(3):
            a, w, bias = rand(M, K, dtype=dt), rand(N, K, dtype=dt, scale=K ** -0.5), rand(N, dtype=dt)
            assert_matmul_close(matmul.matmul(a, w.t(), bias, "gelu", config=cfg), a, w.t(), bias, "gelu")
        assert len(built) == before + 1
    store = rand(M * K + 8, dtype=dt)
    shifted = store[1:M * K + 1].view(M, K)  # 2 bytes past a 16-byte boundary: no TMA descriptor
    cfg = matmul.MatmulConfig(16, 16, 16, 1, 4, 2, tma=1)
    aligned = store[8:M * K + 8].view(M, K)
    for x, bias in ((shifted, None), (aligned, None), (aligned, rand(N, dtype=dt))):
        before = len(built)
        for _ in range(2):
            assert_matmul_close(matmul.matmul(x, w.t(), bias, None, config=cfg), x, w.t(), bias, None)
        assert len(built) == before + 1
    before = len(built)
    for S in (3, 4, 5):  # the last position of a growing sequence: row strides S * K, one plan
        hidden = rand(2, S, K, dtype=dt)
        x = hidden[1:, -1]
        assert_matmul_close(matmul.matmul(x, w.t(), None, "gelu", config=cfg), x, w.t(), None, "gelu")
    assert len(built) == before + 1
    a = rand(M, K, dtype=dt)
    seen = weakref.ref(a)
    matmul.matmul(a, w.t(), None, "relu", config=cfg)  # a new signature: its plan is built on a
    del a
    assert seen() is None


def test_checked_inference_calls(matmul, monkeypatch):
    """Plain inference (no config) checks a call signature once, keyed as its plan (a as 2-d rows): later calls on
    new data, other leading shapes of the same rows and a single row's other strides skip the checks and stay
    right; bad arguments after good ones still raise, naming the argument."""
    import sys

    mod = sys.modules[matmul.__name__ + ".matmul"]
    monkeypatch.setattr(mod, "_CHECKED", type(mod._CHECKED)())
    checks, original = [], mod._check
    monkeypatch.setattr(mod, "_check", lambda *a: checks.append(1) or original(*a))
    torch.manual_seed(19)
    dt = torch.float16
    K, N = 37, 29
    w, bias = rand(N, K, dtype=dt, scale=K ** -0.5), rand(N, dtype=dt)
    with torch.no_grad():
        for shape in ((6, K), (2, 3, K), (6, K)):  # one signature of rows: checked once
            a = rand(*shape, dtype=dt)
            assert_matmul_close(matmul.matmul(a, w.t(), bias, "silu"), a, w.t(), bias, "silu")
        assert len(checks) == 1
        for S in (3, 4):  # the last position of a growing sequence: one contiguous row, one signature
            x = rand(1, S, K, dtype=dt)[:, -1]
            assert_matmul_close(matmul.matmul(x, w.t(), bias, "silu"), x, w.t(), bias, "silu")
        assert len(checks) == 2 and len(mod._CHECKED) == 2
        a = rand(6, K, dtype=dt)
        with pytest.raises(ValueError, match="activation must be one of"):
            matmul.matmul(a, w.t(), bias, "swish")
        with pytest.raises(ValueError, match="activation must be one of"):
            matmul.matmul(a, w.t(), bias, ["silu"])
        with pytest.raises(TypeError, match="bias must have a's dtype"):
            matmul.matmul(a, w.t(), bias.float(), "silu")
        with pytest.raises(ValueError, match="cannot be multiplied"):
            matmul.matmul(a[:, :36], w.t(), bias, "silu")
        with pytest.raises(ValueError, match="a must have >= 1 dims"):
            matmul.matmul(torch.tensor(1.0, dtype=dt, device=DEVICE), w.t())
    assert len(mod._CHECKED) == 2


@pytest.mark.parametrize("activation", ["geglu", "swiglu"])
def test_epilogue_grad_h_with_a_column_stride(matmul, activation):
    """epilogue_grad takes h at any strides (its docstring): a gated h transposed in memory, the same bits."""
    import sys

    grad = sys.modules[matmul.__name__ + ".epilogue_grad"].epilogue_grad
    torch.manual_seed(56)
    h = torch.randn(2 * 13, 5, device=DEVICE).t()
    dy = torch.randn(5, 13, device=DEVICE)
    assert torch.equal(grad(dy, h, activation), grad(dy, h.contiguous(), activation))


def _bf16_grid(low, high):
    """Every bfloat16 value in [low, high] with |x| >= 2^-20 or 0, in fp32 (exact under TF32 too)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    keep = torch.isfinite(bits) & (bits >= low) & (bits <= high) & ((bits.abs() >= 2.0 ** -20) | (bits == 0))
    return bits[keep]


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_epilogue_activation_accuracy(matmul, activation):
    """The epilogue activations against fp64 on every bf16 value of [-12, 12] (a (M, 1) @ ones(1, 1) product, so y
    = act(x) in fp32): gelu within 6e-6 relative for x >= -4 and 8e-5 down to -6 (its polynomial Phi), gelu_tanh
    and silu within 1e-6 + 1e-7 |z| (z the sigmoid's argument, rounded before its exp); below -6 gelu is under 2x the true value (which is < 6e-9); +inf -> +inf, -inf and NaN
    -> NaN for gelu (NaN -> NaN for all)."""
    x = _bf16_grid(-12.0, 12.0)
    specials = torch.tensor([float("inf"), float("-inf"), float("nan")])
    a = torch.cat([x, specials]).reshape(-1, 1).to(DEVICE)
    y = matmul.matmul(a, torch.ones(1, 1, device=DEVICE), None, activation).reshape(-1).cpu().double()
    x64 = x.double()
    if activation == "gelu":
        ref = x64 * 0.5 * torch.special.erfc(-x64 / math.sqrt(2.0))
        rel = torch.where(x64 >= -4, 6e-6, 8e-5)
    else:
        z = 2 * math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3) if activation == "gelu_tanh" else x64
        ref, rel = x64 * torch.sigmoid(z), 1e-6 + 1e-7 * z.abs()  # exp(-z) of a rounded z: ~|z| ulps
    got, expected = y[: x.numel()], ref
    near = x64 >= -6
    bad = ~((got[near] - expected[near]).abs() <= rel[near] * expected[near].abs())
    assert not bad.any(), f"{int(bad.sum())} off; worst at x = {x64[near][bad][0].item()}: {got[near][bad][0].item()} " \
                          f"vs {expected[near][bad][0].item()}"
    assert ((got[~near].abs() <= 2 * expected[~near].abs()) & (got[~near] <= 0)).all()
    assert torch.isnan(y[-1])
    if activation == "gelu":
        assert y[-3] == float("inf") and torch.isnan(y[-2])


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_epilogue_grad(matmul, activation, dtype):
    # the backward's dh kernel against fp64 formulas on the same h: a prime width (partial blocks), dy transposed
    # and broadcast (stride 0, as from y.sum()), h a column slice (strided rows); one rounding of dh (1 ulp) plus
    # the fp32 math (the gelu's erfc approximation: 1.5e-7 absolute); NaN in h where fp64 autograd has it
    import sys

    grad = sys.modules[matmul.__name__ + ".epilogue_grad"].epilogue_grad
    torch.manual_seed(19)
    M, N = 5, 1031
    width = 2 * N if activation in GATED else N
    h = (rand(M, width + 6, dtype=torch.float32) * 3).to(dtype)[:, 3:width + 3]  # values to |h| ~ 10
    h[0, 0] = float("nan")
    base = GATED.get(activation, activation)
    h64 = h.double().requires_grad_()
    for dy in (rand(N, M, dtype=dtype).t(), rand(1, 1, dtype=dtype).expand(M, N)):
        if activation in GATED:
            p, g = h64.chunk(2, dim=-1)
            out = p * act_ref(g, base)
        else:
            out = act_ref(h64, base)
        (expected,) = torch.autograd.grad(out, h64, dy.double())
        dh = grad(dy, h, activation)
        assert dh.shape == h.shape and dh.dtype == dtype and dh.is_contiguous()
        nan = torch.isnan(expected)
        assert torch.equal(torch.isnan(dh), nan), "NaN where fp64 has NaN, nowhere else"
        rounded = expected.nan_to_num().to(dtype).double()
        scale = (dy.double().abs().max() * h.double().nan_to_num().abs().max()).item()
        tol = ULPS[dtype] * ulp(rounded, dtype) + (2e-6 if dtype == torch.float32 else 1e-6) * scale
        diff = (dh.double().nan_to_num() - rounded).abs()
        assert (diff <= tol).all(), f"worst {diff.max().item():.3g}"


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu", "geglu", "swiglu"])
def test_double_backward(matmul, activation):
    # create_graph=True through an activated matmul (a gradient penalty): the second-order gradients of a, b and
    # bias, through the dh kernel's own autograd formula, against fp64 autograd through the reference
    torch.manual_seed(21)
    width = 20 if activation in GATED else 10
    a, b, bias = rand(7, 13, dtype=torch.float32), rand(13, width, dtype=torch.float32, scale=0.5), rand(
        width, dtype=torch.float32)
    dy, v = rand(7, 10, dtype=torch.float32), rand(7, 13, dtype=torch.float32)

    def second_order(fn, tensors):
        ins = [t.detach().clone().requires_grad_() for t in tensors]
        (ga,) = torch.autograd.grad(fn(*ins), ins[0], dy.to(ins[0].dtype), create_graph=True)
        return torch.autograd.grad((ga * v.to(ga.dtype)).sum(), ins, allow_unused=True)

    def second_order_functorch(fn, tensors):  # the same through torch.func (the dh op's functorch Function)
        def penalty(*ins):
            _, vjp = torch.func.vjp(lambda a: fn(a, *ins[1:]), ins[0])
            return (vjp(dy.to(ins[0].dtype))[0] * v.to(ins[0].dtype)).sum()
        return torch.func.grad(penalty, argnums=(0, 1, 2))(*tensors)

    got = second_order(lambda a, b, bias: matmul.matmul(a, b, bias, activation), (a, b, bias))
    want = second_order(lambda a, b, bias: ref(a, b, bias, activation), (a.double(), b.double(), bias.double()))
    functorch = second_order_functorch(lambda a, b, bias: matmul.matmul(a, b, bias, activation), (a, b, bias))
    rtol = 1e-4 if DEVICE == "cpu" else 5e-3
    for g, f, w in zip(got, functorch, want):
        if w is None:
            assert g is None or not g.any()
            continue
        torch.testing.assert_close(g.double(), w, rtol=rtol, atol=rtol * w.abs().max().item())
        torch.testing.assert_close(f.double(), w, rtol=rtol, atol=rtol * w.abs().max().item())


@pytest.mark.parametrize("activation", ["gelu_tanh", "silu", "swiglu"])
def test_double_backward_where_the_sigmoid_is_near_one(matmul, activation):
    # the second derivative of the activation where sigmoid (or tanh) is near 1, element by element: h = a @ I is a
    # (integers, exact in tf32 too); the dh formula took 1 - sigmoid from the rounded sigmoid (torch's sigmoid
    # backward), 1e-3 off for silu at h = 10 and 100% for the tanh GELU where 1 - tanh is below fp32's resolution
    vals = [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, -3.0, -4.0, -5.0, -6.0, -8.0, 0.0, 1.0, 2.0]
    a = torch.tensor(vals, device=DEVICE).view(2, 8)
    if activation in GATED:  # the gate half of h is a, the projection half ones
        a = torch.cat([torch.ones_like(a), a], dim=-1)
    eye = torch.eye(a.shape[-1], device=DEVICE)

    def second_order(fn, a):
        a = a.clone().requires_grad_()
        (ga,) = torch.autograd.grad(fn(a).sum(), a, create_graph=True)
        return torch.autograd.grad(ga.sum(), a)[0]

    got = second_order(lambda a: matmul.matmul(a, eye, None, activation), a)
    want = second_order(lambda a: ref(a, eye.double(), None, activation), a.double())
    rtol = 1e-4 if DEVICE == "cpu" else 5e-3
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=1e-12)


def test_weight_grad_layout(matmul):
    # the gradient of an nn.Linear weight read as b = W.t() comes out in W's own layout (contiguous), as F.linear's:
    # no transposing copy by autograd; a row-major (K, N) b gets a row-major gradient; values as fp64
    torch.manual_seed(20)
    dt = torch.bfloat16
    x = rand(23, 40, dtype=dt).requires_grad_()
    for w, b_of in ((rand(24, 40, dtype=dt, scale=0.3), lambda w: w.t()), (rand(40, 24, dtype=dt, scale=0.3),
                                                                         lambda w: w)):
        b = b_of(w.requires_grad_())
        y = matmul.matmul(x, b, None, "silu")
        dx, dw = torch.autograd.grad(y, (x, w), torch.ones_like(y))  # as computed (AccumulateGrad would copy)
        assert dw.is_contiguous() and dx.is_contiguous()
        assert_grads_fp64(matmul.matmul(x, b, None, "silu"), x, b, None, "silu", 4 * 2.0 ** -7)


def test_config_lookup(matmul):
    pick = matmul.pick_config
    # unknown GPU -> default.json; tiny problems clamp blocks to 16
    small = pick(5, 7, 9, "Some Unknown GPU")
    assert (small.block_m, small.block_n, small.block_k) == (16, 16, 16)
    big_default = pick(4096, 4096, 4096, None)
    big_h200 = pick(4096, 4096, 4096, "NVIDIA H200")
    assert big_default.num_warps * 32 <= 1024 and big_h200.num_warps * 32 <= 1024
    assert big_h200.block_n == 256 and big_default.block_n == 128
    gated = pick(4096, 4096, 4096, "NVIDIA H200", True)
    assert gated.block_n == 128 and gated.persistent == 0 and gated.epilogue_subtile == 0  # gated: two accumulators
    assert pick(4096, 4096, 4096, "NVIDIA H200", itemsize=4).block_k == big_h200.block_k // 2  # fp32: same smem
    assert pick(4096, 4096, 4096, None, False, 64).num_warps * 64 <= 1024
    # arguments matmul would refuse are refused here too, naming them (they were accepted silently)
    for args, kw, message in [((-1, 7, 9), {}, "M must be an int >= 0, got -1"), ((5, 7.0, 9), {}, "N must be an int"),
                              ((5, 7, 9), {"activation": "foo"}, "activation must be None or one of"),
                              ((5, 7, 9), {"warp_size": 16}, "warp_size must be 32 or 64")]:
        with pytest.raises(ValueError, match=f"pick_config: {message}"):
            pick(*args, **kw)
    assert pick(5, 7, 9, gated=True, activation="swiglu") == pick(5, 7, 9, gated=True)  # no epilogue entry here


def test_config_lookup_falls_back_to_a_tuned_file_of_the_architecture(matmul, tmp_path, monkeypatch):
    """A GPU without a config file of its own uses a tuned file of its architecture (an H100 the H200's: the same
    sm_90 SMs), else default.json; its own file always wins, a hand-written ("tuned": false) file never serves
    other GPUs, and CPU tensors (no GPU name) keep default.json."""
    import json
    import shutil
    import sys

    launch = sys.modules[matmul.__name__ + "._launch"]
    pick = launch.pick_config
    shipped = json.loads((launch.CONFIG_DIR / "NVIDIA_H200.json").read_text())
    assert shipped["arch"] == "sm_90" and shipped["tuned"] is True
    h100 = pick(4096, 4096, 4096, "NVIDIA H100 80GB HBM3", arch="sm_90")
    assert h100 == pick(4096, 4096, 4096, "NVIDIA H200") != pick(4096, 4096, 4096, None)
    assert launch.config_path("NVIDIA H100 PCIe", "sm_90").name == "NVIDIA_H200.json"
    for name, arch in (("NVIDIA A100-SXM4-80GB", "sm_80"), ("NVIDIA H100 80GB HBM3", None), (None, "sm_90")):
        assert launch.config_path(name, arch).name == "default.json", (name, arch)
    with pytest.raises(ValueError, match="arch must be None or a string"):
        pick(64, 64, 64, "NVIDIA H100 80GB HBM3", arch=90)

    for f in ("NVIDIA_H200.json", "default.json"):
        shutil.copy(launch.CONFIG_DIR / f, tmp_path / f)
    hand = dict(shipped, gpu="Hand GPU", tuned=False, configs=shipped["configs"][:1])
    (tmp_path / "A_Hand_GPU.json").write_text(json.dumps(hand))  # first by name, but not tuned
    own = dict(shipped, gpu="NVIDIA H100 80GB HBM3", configs=[dict(shipped["configs"][0], M=4096, N=4096, K=4096)])
    monkeypatch.setattr(launch, "CONFIG_DIR", tmp_path)
    launch.load_buckets.cache_clear()
    pick.cache_clear()
    try:
        assert launch.config_path("NVIDIA H100 PCIe", "sm_90").name == "NVIDIA_H200.json"
        (tmp_path / "NVIDIA_H100_80GB_HBM3.json").write_text(json.dumps(own))
        assert launch.config_path("NVIDIA H100 80GB HBM3", "sm_90").name == "NVIDIA_H100_80GB_HBM3.json"
        assert pick(4096, 4096, 4096, "NVIDIA H100 80GB HBM3", arch="sm_90") == launch.MatmulConfig.from_json(
            shipped["configs"][0])
    finally:
        launch.load_buckets.cache_clear()
        pick.cache_clear()


def test_config_lookup_epilogue(matmul, tmp_path, monkeypatch):
    # "epilogue" entries serve calls with that activation (as written, gated ones included), plain entries every
    # call; the call's activation reaches the lookup from matmul(); values never depend on the entry picked
    import json
    import sys

    launch = sys.modules[matmul.__name__ + "._launch"]
    mod = sys.modules[matmul.__name__ + ".matmul"]
    assert {k: v[1] for k, v in mod.ACTIVATIONS.items() if k is not None} == launch.EPILOGUES

    def entry(M, N, K, bm, bn, bk, stages, **extra):
        return {"M": M, "N": N, "K": K, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "num_warps": 2,
                "num_stages": stages, **extra}

    configs = [entry(16, 64, 64, 16, 64, 32, 2, TMA=1, PERSISTENT=1, EPILOGUE_SUBTILE=1),
               entry(512, 64, 64, 64, 64, 64, 2),
               entry(16, 64, 64, 32, 16, 16, 3, epilogue="gelu_tanh"),
               entry(16, 64, 64, 16, 32, 16, 1, TMA=1, PERSISTENT=1, epilogue="geglu")]
    (tmp_path / "Test_GPU_E.json").write_text(json.dumps({"gpu": "Test GPU E", "configs": configs}))
    monkeypatch.setattr(launch, "CONFIG_DIR", tmp_path)
    pick = launch.pick_config
    launch.load_buckets.cache_clear()
    pick.cache_clear()
    try:
        plain, tanh = pick(20, 64, 64, "Test GPU E"), pick(20, 64, 64, "Test GPU E", activation="gelu_tanh")
        assert (plain.block_m, plain.num_stages, plain.persistent) == (16, 2, 1)
        assert (tanh.block_m, tanh.block_n, tanh.num_stages, tanh.persistent) == (32, 16, 3, 0)
        assert pick(20, 64, 64, "Test GPU E", activation="gelu") == plain  # no gelu entry: the plain bucket
        assert pick(400, 64, 64, "Test GPU E", activation="gelu_tanh").block_m == 64  # nearer plain bucket wins
        # gated: a plain bucket is halved and loses the persistent loop; a geglu entry is used as written
        swiglu, geglu = pick(20, 64, 64, "Test GPU E", True, activation="swiglu"), pick(20, 64, 64, "Test GPU E",
                                                                                        activation="geglu")
        assert (swiglu.block_n, swiglu.persistent, swiglu.epilogue_subtile) == (32, 0, 0)
        assert (geglu.block_n, geglu.persistent, geglu.num_stages) == (32, 1, 1)
        fp32 = pick(20, 64, 64, "Test GPU E", itemsize=4, activation="gelu_tanh")
        assert fp32.block_k == 16  # fp32: half the entry's BLOCK_K, floor 16
        buckets = launch.load_buckets("Test GPU E")
        assert [b.epilogue for b in buckets] == [None, None, "gelu_tanh", "geglu"] and buckets[0][0] == (16, 64, 64)
        with pytest.raises(ValueError, match="no config bucket serves"):
            launch.lookup(buckets[2:], 20, 64, 64, activation="silu")
        with pytest.raises(ValueError, match="epilogue 'gelu_tan'"):
            launch.parse_buckets({"configs": [entry(16, 64, 64, 16, 16, 16, 1, epilogue="gelu_tan")]})
        # matmul() hands its activation to the lookup: the gelu_tanh / geglu entries run here
        picked = []
        monkeypatch.setattr(launch, "device_info", lambda device: ("Test GPU E", 32, None))
        monkeypatch.setattr(launch, "pick_config", lambda *args: picked.append(pick(*args)) or picked[-1])
        torch.manual_seed(5)
        dt = torch.bfloat16
        a, w = rand(20, 40, dtype=dt), rand(128, 40, dtype=dt, scale=0.3)
        for act, n_total, expect in (("gelu_tanh", 64, tanh), ("geglu", 128, geglu), (None, 64, plain)):
            bias = rand(n_total, dtype=dt)
            y = matmul.matmul(a, w[:n_total].t(), bias, act)
            assert picked[-1] == expect, act
            assert_matmul_close(y, a, w[:n_total].t(), bias, act)
    finally:
        launch.load_buckets.cache_clear()
        pick.cache_clear()


def _grad_check(matmul, dtype, activation, has_bias, rtol):
    torch.manual_seed(4)
    a = rand(2, 9, 31, dtype=dtype).requires_grad_()
    b = rand(31, 22, dtype=dtype, scale=0.3).requires_grad_()
    bias = rand(22, dtype=dtype).requires_grad_() if has_bias else None
    assert_grads_fp64(matmul.matmul(a, b, bias, activation), a, b, bias, activation, rtol)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("has_bias", [False, True])
def test_gradients_fp32(matmul, activation, has_bias):
    # fp32 (exact products on CPU): error ~ K * eps32 relative to the largest gradient
    _grad_check(matmul, torch.float32, activation, has_bias, 1e-4 if DEVICE == "cpu" else 5e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "gelu_tanh", "geglu", "swiglu"])
def test_gradients_half(matmul, dtype, activation):
    # h and dh rounded to the dtype (as eager PyTorch), then dtype matmuls: a few ulps of the largest gradient
    _grad_check(matmul, dtype, activation, True, 4 * 2.0 ** -MANTISSA[dtype])


@pytest.mark.parametrize("activation", [None, "gelu", "geglu"])
def test_opcheck(matmul, activation):
    op = next(getattr(getattr(torch.ops, ns), "matmul_fwd") for ns in dir(torch.ops)
              if ns.startswith("_triton_matmul") and hasattr(getattr(torch.ops, ns), "matmul_fwd"))
    a = rand(17, 31, dtype=torch.float16).requires_grad_()
    b = rand(31, 22, dtype=torch.float16).requires_grad_()
    bias = rand(22, dtype=torch.float16).requires_grad_()
    torch.library.opcheck(op, (a, b, bias, activation, activation is not None, None))


def test_epilogue_grad_errors(matmul):
    # the dh op checks what it is given: an activation (None has no gradient kernel), matching shapes (a gated h has
    # 2N columns), one dtype
    import sys

    grad = sys.modules[matmul.__name__ + ".epilogue_grad"].epilogue_grad
    dy, h = rand(3, 4, dtype=torch.float16), rand(3, 4, dtype=torch.float16)
    with pytest.raises(ValueError, match="activation must be one of"):
        grad(dy, h, None)
    with pytest.raises(ValueError, match=r"expected \(3, 8\)"):
        grad(dy, h, "geglu")
    with pytest.raises(ValueError, match=r"expected \(3, 4\)"):
        grad(dy, rand(2, 4, dtype=torch.float16), "gelu")
    with pytest.raises(TypeError, match="share dtype"):
        grad(dy, h.float(), "gelu")
    with pytest.raises(ValueError, match="2-D"):
        grad(dy[0], h, "gelu")
    # relu drops a non-finite dy where h <= 0, as torch's backward does
    h = torch.tensor([[-1.0, 0.0, 2.0]], dtype=torch.float16).to(DEVICE)
    dy = torch.tensor([[float("nan"), float("inf"), float("nan")]], dtype=torch.float16).to(DEVICE)
    out = grad(dy, h, "relu").float().cpu()
    assert out[0, 0] == 0 and out[0, 1] == 0 and torch.isnan(out[0, 2])


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_opcheck_epilogue_grad(matmul, activation):
    op = next(getattr(getattr(torch.ops, ns), "matmul_epilogue_grad") for ns in dir(torch.ops)
              if ns.startswith("_triton_matmul") and hasattr(getattr(torch.ops, ns), "matmul_epilogue_grad"))
    width = 22 if activation == "swiglu" else 11
    torch.library.opcheck(op, (rand(17, 11, dtype=torch.float16), rand(17, width, dtype=torch.float16), activation))


def test_compile_fullgraph(matmul):
    torch.manual_seed(5)
    a = rand(17, 31, dtype=torch.bfloat16).requires_grad_()
    b = rand(31, 22, dtype=torch.bfloat16).requires_grad_()
    bias = rand(22, dtype=torch.bfloat16)

    def f(a, b, bias):
        return matmul.matmul(a, b, bias, "geglu").float().square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss_c = compiled(a, b, bias)
    ga_c, gb_c = torch.autograd.grad(loss_c, [a, b])
    loss_e = f(a, b, bias)
    ga_e, gb_e = torch.autograd.grad(loss_e, [a, b])
    assert torch.equal(loss_c, loss_e) and torch.equal(ga_c, ga_e) and torch.equal(gb_c, gb_e)


def test_errors(matmul):
    f16 = torch.float16
    a, b = rand(4, 8, dtype=f16), rand(8, 6, dtype=f16)
    with pytest.raises(ValueError, match=r"a of shape \(4, 9\) and b of shape \(8, 6\)"):
        matmul.matmul(rand(4, 9, dtype=f16), b)
    with pytest.raises(TypeError, match="same dtype"):
        matmul.matmul(a, b.float())
    with pytest.raises(TypeError, match="dtype"):
        matmul.matmul(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(ValueError, match="activation must be one of"):
        matmul.matmul(a, b, None, "tanh")
    with pytest.raises(ValueError, match="even number of columns"):
        matmul.matmul(a, rand(8, 5, dtype=f16), None, "geglu")
    with pytest.raises(ValueError, match=r"bias of shape \(5,\)"):
        matmul.matmul(a, b, rand(5, dtype=f16))
    with pytest.raises(ValueError, match="b exactly 2"):
        matmul.matmul(a, b[None])
    with pytest.raises(ValueError, match="power of two"):
        matmul.matmul(a, b, config=matmul.MatmulConfig(24, 16, 16, 1, 4, 2))
    if torch.device(DEVICE).type == "cpu":
        meta = torch.empty(8, 6, dtype=f16, device="meta")
        with pytest.raises(ValueError, match="one device"):
            matmul.matmul(a, meta)


@pytest.mark.gpu
def test_gpu_k_stride_times_a_tile_past_2_31(matmul):
    """a read transposed from a [K, M] buffer with M = 2^26 (13 GB): the k loop advanced its pointers by
    ``BLOCK_K * M`` in int32, which passes 2^31 for BLOCK_K >= 32. Small-integer inputs make every product and sum
    exact in fp16, so the rows checked at both ends and in the middle must equal fp64."""
    if DEVICE != "cuda":
        pytest.skip("a 13 GB operand: GPU only")
    torch.manual_seed(33)
    M, K, N = 1 << 26, 96, 8
    a = torch.randint(-2, 3, (K, M), device=DEVICE, dtype=torch.float16).t()  # (drawn as fp16: int64 took 51 GB)
    b = torch.randint(-2, 3, (K, N), device=DEVICE, dtype=torch.float16)
    assert a.stride() == (1, M)
    y = matmul.matmul(a, b)
    for rows in (slice(0, 512), slice(M // 2, M // 2 + 512), slice(M - 512, M)):
        assert torch.equal(y[rows].double(), a[rows].double() @ b.double()), rows
    del a, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_loss_and_gradient_penalty_in_one_backward(matmul, activation):
    # a loss of y plus a penalty on y's input gradient (create_graph=True), differentiated in one backward: the
    # matmul's backward then gets both y's gradient and the saved pre-activation's, and must add them
    torch.manual_seed(22)
    width = 20 if activation in GATED else 10
    a, b, bias = rand(7, 13, dtype=torch.float32), rand(13, width, dtype=torch.float32, scale=0.5), rand(
        width, dtype=torch.float32)
    dy, w, v = rand(7, 10, dtype=torch.float32), rand(7, 10, dtype=torch.float32), rand(7, 13, dtype=torch.float32)

    def grads(fn, tensors):
        ins = [t.detach().clone().requires_grad_() for t in tensors]
        y = fn(*ins)
        (ga,) = torch.autograd.grad(y, ins[0], dy.to(y.dtype), create_graph=True)
        return torch.autograd.grad((y * w.to(y.dtype)).sum() + (ga * v.to(ga.dtype)).sum(), ins)

    got = grads(lambda a, b, bias: matmul.matmul(a, b, bias, activation), (a, b, bias))
    want = grads(lambda a, b, bias: ref(a, b, bias, activation), (a.double(), b.double(), bias.double()))
    rtol = 1e-4 if DEVICE == "cpu" else 5e-3
    for g, r in zip(got, want):
        torch.testing.assert_close(g.double(), r, rtol=rtol, atol=rtol * r.abs().max().item())
