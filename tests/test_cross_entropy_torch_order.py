"""triton-softmax ``cross_entropy(..., torch_order=True)`` (the ``CrossEntropyLoss`` layer): torch's steps,
roundings and summation orders.

On the CPU the reference is a numpy model of ATen's steps (``_model`` below: the row sums of
``aten_row_stats``, log-softmax's epilogue, nll_loss's slots and tree, the backward's fused
multiply-add) with numpy's ``exp``/``log``, which the interpreter also uses; the kernels must match
it bit for bit. On CUDA the same tests compare with ``F.cross_entropy`` and its autograd gradient.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.test_softmax_torch_order import _tree, aten_row_stats

IGNORE = -100


def _round(a: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float32 values rounded to ``dtype`` (nearest even), as float32."""
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(dtype).float().numpy()


def _fma_f32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """a * b + c rounded once to float32 (exact rational arithmetic, ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    guess = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))):
        err = abs(Fraction(float(cand)) - exact)
        key = (err, int(np.float32(cand).view(np.uint32)) & 1)  # nearest, then the even mantissa
        if best is None or key < best[0]:
            best = (key, cand)
    return np.float32(best[1])


def _model(x: torch.Tensor, target: torch.Tensor, reduction: str, path: str, misalign: int, dloss: float,
           fma: bool = True):
    """(loss, dlogits) of F.cross_entropy in ATen's order for CPU logits (C,) or (N, C), float32 numpy math
    (``fma``: the backward's ``grad - exp(out) * sum`` as one fused multiply-add, else two roundings)."""
    dtype = x.dtype
    one_d = x.dim() == 1
    xs = x.float().reshape(1 if one_d else x.shape[0], -1).numpy()
    t = target.reshape(-1).numpy()
    M, V = xs.shape
    mx, s = aten_row_stats(xs, path, x.element_size(), misalign)
    logsum = np.log(s).astype(np.float32)
    logp = _round((xs - mx[:, None]) - logsum[:, None], dtype)
    valid = t != IGNORE
    nll = np.where(valid, -logp[np.arange(M), np.where(valid, t, 0)], np.float32(0)).astype(np.float32)
    if reduction == "none" or one_d:
        loss = nll.reshape(target.shape)
        count = np.float32(valid.sum())
    else:
        q = M // 16  # nll_loss_threads(M): clamp(1 << round(log2(M / 16)), 32, 1024)
        threads = 32 if q == 0 else min(max(1 << round(np.log2(q)), 32), 1024)
        slots, cnt = np.zeros(threads, np.float32), np.zeros(threads, np.float32)
        for i in range(M):
            if valid[i]:
                slots[i % threads] = np.float32(slots[i % threads] - logp[i, t[i]])
                cnt[i % threads] = np.float32(cnt[i % threads] + np.float32(1))
        total, count = _tree(slots[None, :])[0], _tree(cnt[None, :])[0]
        loss = np.float32(total / count) if reduction == "mean" else total
    loss = torch.from_numpy(np.asarray(loss, np.float32)).to(dtype)
    # backward for an upstream gradient dloss (a value of x's dtype)
    d = np.float32(float(torch.tensor(dloss).to(dtype)))
    if reduction == "mean" and not one_d:
        d = _round(np.float32(d / _round(np.float32(count), dtype)), dtype)
    g = np.where(valid, -d, np.float32(0)).astype(np.float32)  # per row: the gradient at the target
    e = np.exp(logp).astype(np.float32)
    dx = (-e * g[:, None]).astype(np.float32)  # fma(-e, g, 0) = one rounding of the product
    for i in range(M):
        if valid[i]:
            dx[i, t[i]] = _fma_f32(-e[i, t[i]], g[i], g[i]) if fma else np.float32(g[i] - np.float32(e[i, t[i]] * g[i]))
    return loss, torch.from_numpy(_round(dx, dtype)).to(dtype).reshape(x.shape)


CASES = [  # (shape, dtype, reduction, expected softmax path)
    ((37, 1000), torch.bfloat16, "mean", "warp"),
    ((70, 1000), torch.float32, "sum", "warp"),
    ((1500, 100), torch.float32, "mean", "warp"),  # 128 slots
    ((9, 3001), torch.float16, "mean", "reg"),
    ((9, 3001), torch.float32, "none", "reg"),
    ((5, 10000), torch.float32, "mean", "smem"),
    ((5, 12289), torch.bfloat16, "sum", "ilp"),
    ((1000,), torch.bfloat16, "mean", "warp"),
    ((3001,), torch.float32, "sum", "reg"),
]


@pytest.mark.parametrize("shape,dtype,reduction,path", CASES,
                         ids=[f"{'x'.join(map(str, s))}-{str(d)[6:]}-{r}-{p}" for s, d, r, p in CASES])
def test_cross_entropy_torch_order_matches_torch(softmax, device, shape, dtype, reduction, path):
    from importlib import import_module

    order = import_module(softmax.__name__ + "._torch_order")
    torch.manual_seed(hash((shape, str(dtype), reduction)) % 1000)
    V = shape[-1]
    assert order.path_name(order.torch_order_path(V, torch.tensor([], dtype=dtype).element_size(), 0)) == path
    x = (torch.randn(shape) * (0.1 if V > 2048 else 3.0)).to(dtype)
    target = torch.randint(0, V, shape[:-1])
    if len(shape) == 2:
        target[::7] = IGNORE  # some rows ignored
    xd = x.clone().to(device).requires_grad_(True)
    td = target.to(device)
    dloss = 3.0
    loss = softmax.cross_entropy(xd, td, reduction=reduction, torch_order=True)
    (loss.sum() * dloss).backward() if reduction == "none" else (loss * dloss).backward()
    if device == "cuda":
        xr = x.to(device).requires_grad_(True)
        want = F.cross_entropy(xr, td, reduction=reduction, ignore_index=IGNORE)
        (want.sum() * dloss).backward() if reduction == "none" else (want * dloss).backward()
        want_grad = xr.grad
    else:
        want, want_grad = _model(x, target, reduction, path, 0, dloss)
    assert loss.dtype == dtype and loss.shape == want.shape
    assert torch.equal(loss.detach().cpu(), want.detach().cpu()), (loss, want)
    assert torch.equal(xd.grad.cpu(), want_grad.cpu()), (xd.grad.float() - want_grad.float().cpu()).abs().max()


def _placed(x: torch.Tensor, misalign: int) -> torch.Tensor:
    """x on CUDA, contiguous ones starting ``misalign`` elements past a 16-byte boundary; views keep their strides."""
    if not x.is_contiguous():
        return x.cuda()
    buf = torch.empty(x.numel() + misalign, dtype=x.dtype, device="cuda")
    out = buf[misalign:].view(x.shape)
    out.copy_(x)
    return out


def test_cross_entropy_torch_order_misaligned_and_strided(softmax, device):
    """A contiguous input starting 4 bytes past a 16-byte boundary (ATen's ilpReduce shifts its vectors) and a
    row-strided view (torch copies it to an aligned buffer; the kernels read it in place)."""
    torch.manual_seed(3)
    buf = (torch.randn(5 * 12289 + 2) * 0.1).to(torch.bfloat16)
    x = buf[2:].view(5, 12289)
    target = torch.randint(0, 12289, (6,))
    wide = torch.randn(6, 13000) * 0.1
    for logits, mis in ((x, 2), (wide[:, :12289], 0)):
        xd = logits.to(device) if device == "cpu" else _placed(logits, mis)
        loss = softmax.cross_entropy(xd, target[: logits.shape[0]].to(device), torch_order=True)
        if device == "cuda":
            want = F.cross_entropy(xd, target[: logits.shape[0]].to(device))
        else:
            want, _ = _model(logits, target[: logits.shape[0]], "mean", "ilp", mis, 1.0)
        assert torch.equal(loss.cpu(), want.cpu())


def test_cross_entropy_torch_order_is_not_a_plain_sum(softmax, device):
    """The reduction order shows in fp32: a plain row sum of the per-row losses gives other bits here, so the
    slot-and-tree order of the tests above is really exercised."""
    torch.manual_seed(4)
    x = torch.randn(333, 1000, device=device) * 3
    target = torch.randint(0, 1000, (333,), device=device)
    loss = softmax.cross_entropy(x, target, reduction="sum", torch_order=True)
    rows = softmax.cross_entropy(x, target, reduction="none", torch_order=True).cpu().numpy()
    assert np.float32(np.cumsum(rows, dtype=np.float32)[-1]) != loss.item()


def test_cross_entropy_torch_order_backward_fma(softmax, device):
    """fp32 gradients where one fused multiply-add and two roundings differ at some targets: the kernel follows
    the fused form (nvcc's contraction of ATen's ``grad - exp(out) * sum``; on CUDA, torch itself decides)."""
    torch.manual_seed(6)
    x = torch.randn(500, 64) * 2
    t = torch.randint(0, 64, (500,))
    fused = _model(x, t, "mean", "warp", 0, 3.0, fma=True)[1]
    assert not torch.equal(fused, _model(x, t, "mean", "warp", 0, 3.0, fma=False)[1])
    xd = x.clone().to(device).requires_grad_(True)
    (softmax.cross_entropy(xd, t.to(device), torch_order=True) * 3.0).backward()
    if device == "cuda":
        xr = x.to(device).requires_grad_(True)
        (F.cross_entropy(xr, t.to(device)) * 3.0).backward()
        fused = xr.grad
    assert torch.equal(xd.grad.cpu(), fused.cpu())


def test_cross_entropy_torch_order_edges(softmax, device):
    """Every target ignored: NaN for "mean" (0/0), 0 for "sum", zero gradient; 1-D logits with an ignored target
    give 0 (torch's 1-D kernel); bad combinations raise."""
    x = torch.randn(4, 50, device=device, requires_grad=True)
    t = torch.full((4,), IGNORE, device=device)
    loss = softmax.cross_entropy(x, t, torch_order=True)
    assert torch.isnan(loss).item()
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert softmax.cross_entropy(x, t, reduction="sum", torch_order=True).item() == 0.0
    x1 = torch.randn(50, device=device)
    assert softmax.cross_entropy(x1, torch.tensor(IGNORE, device=device), torch_order=True).item() == 0.0
    with pytest.raises(ValueError, match="torch_order"):
        softmax.cross_entropy(x, t, label_smoothing=0.1, torch_order=True)
    with pytest.raises(ValueError, match="torch_order"):
        softmax.cross_entropy(torch.randn(2, 5, 3, device=device), torch.zeros(2, 3, dtype=torch.long,
                                                                               device=device), torch_order=True)
    with pytest.raises(TypeError, match="torch_order"):
        softmax.cross_entropy(x, t, torch_order=1)


def test_cross_entropy_layer_is_torch_order(softmax, device):
    """The Hub layer equals nn.CrossEntropyLoss (loss and gradient) without label smoothing."""
    torch.manual_seed(5)
    module = torch.nn.CrossEntropyLoss()
    x = (torch.randn(21, 1000) * 3).to(torch.bfloat16)
    t = torch.randint(0, 1000, (21,))
    xd = x.clone().to(device).requires_grad_(True)
    loss = softmax.layers.CrossEntropyLoss.forward(module, xd, t.to(device))
    loss.backward()
    if device == "cuda":
        xr = x.to(device).requires_grad_(True)
        want = module(xr, t.to(device))
        want.backward()
        want_grad = xr.grad
    else:
        want, want_grad = _model(x, t, "mean", "warp", 0, 1.0)
    assert torch.equal(loss.detach().cpu(), want.detach().cpu())
    assert torch.equal(xd.grad.cpu(), want_grad.cpu())


def test_out_of_range_target_gives_a_nan_gradient_row(softmax, device):
    """torch_order=True (the CrossEntropyLoss layer's mode) with a target outside [0, V): the loss was NaN but the
    row's gradient finite (the plain softmax), so a check of the gradients alone (GradScaler) passed it. The row is
    NaN now, as on the fused path; the other rows keep their gradients."""
    torch.manual_seed(21)
    x = torch.randn(3, 4, device=device, requires_grad=True)
    t = torch.tensor([0, 9, 2], device=device)
    for reduction in ("mean", "sum", "none"):
        loss = softmax.cross_entropy(x, t, reduction=reduction, torch_order=True)
        (g,) = torch.autograd.grad(loss.sum(), x)
        assert loss.isnan().any()
        assert g[1].isnan().all() and g[[0, 2]].isfinite().all(), (reduction, g)
