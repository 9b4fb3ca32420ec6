"""triton-softmax ``torch_order=True`` (the ``Softmax`` layer): the kernels add the exponentials in the
order of ATen's CUDA softmax kernels.

The reference is a numpy model of each ATen kernel's order (``_aten_order`` below: per-thread
sequential sums, then halving trees), in float32 with numpy's ``exp``, the ``exp`` the interpreter
uses; so on the CPU the kernels must match it bit for bit. On a CUDA device the same tests compare
with ``torch.softmax`` itself (``exp`` is then libdevice's ``expf`` on both sides).
"""

import numpy as np
import pytest
import torch

THREADS, ILP_BYTES = 1024, 16


def _tree(v: np.ndarray) -> np.ndarray:
    """Halving tree over the last axis: element l + element l + half, until one is left."""
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:]
    return v[..., 0]


def _aten_order(x: np.ndarray, path: str, elem: int, misalign: int) -> np.ndarray:
    """softmax over the last axis of float32 rows x (M, N) in the order of ATen's kernel ``path``."""
    mx, total = aten_row_stats(x, path, elem, misalign)
    return (np.exp(x - mx[:, None]).astype(np.float32) / total[:, None]).astype(np.float32)


def aten_row_stats(x: np.ndarray, path: str, elem: int, misalign: int):
    """(max, sum of exp(x - max)) of each float32 row of x (M, N), the sum in the order of ATen's kernel ``path``."""
    M, N = x.shape
    mx = x.max(axis=1).astype(np.float32)
    sums = np.empty(M, np.float32)
    ilp = ILP_BYTES // elem
    for r in range(M):
        row = x[r]
        e = np.exp(row - mx[r]).astype(np.float32)
        if path == "warp":
            n2 = 1 << max(0, (N - 1).bit_length())
            w = min(n2, 32)
            lanes = np.zeros(w, np.float32)
            for i in range(n2 // w):
                idx = i * w + np.arange(w)
                lanes = lanes + np.where(idx < N, e[np.minimum(idx, N - 1)], np.float32(0))
            total = _tree(lanes)
        else:
            t = np.arange(THREADS)
            p = np.zeros(THREADS, np.float32)

            def add(p, idx, ok):
                return p + np.where(ok, e[np.clip(idx, 0, N - 1)], np.float32(0))

            if path == "reg":
                for start in range(0, N, THREADS):
                    p = add(p, start + t, start + t < N)
            elif path == "smem":
                for start in range(0, N, THREADS * ilp):
                    for i in range(ilp):
                        p = add(p, start + t * ilp + i, start + t * ilp + i < N)
            else:  # ilpReduce with the row's misalignment
                shift = (misalign + r * N) % ilp
                base = 0
                if shift:
                    p = add(p, t - shift, t >= shift)
                    base = THREADS - shift
                size = N - base
                vec_end = size - size % (ilp * THREADS)
                for start in range(0, vec_end, THREADS * ilp):
                    for i in range(ilp):
                        p = add(p, base + start + t * ilp + i, np.ones(THREADS, bool))
                for start in range(vec_end, size, THREADS):
                    p = add(p, base + start + t, start + t < size)
            total = _tree(_tree(p.reshape(THREADS // 32, 32))[None, :])[0]
        sums[r] = total
    return mx, sums


CASES = [  # (N, dtype, misaligned base, expected path)
    (1, torch.float32, False, "warp"), (7, torch.float32, False, "warp"), (100, torch.float16, False, "warp"),
    (1024, torch.float32, False, "warp"), (1500, torch.float32, False, "warp"), (2049, torch.float32, False, "reg"),
    (3001, torch.float16, False, "reg"),
    (10000, torch.float32, False, "smem"), (24000, torch.float16, False, "smem"), (10001, torch.float32, False, "ilp"),
    (10000, torch.float32, True, "ilp"), (12289, torch.float32, False, "ilp"), (65536, torch.float32, False, "ilp"),
]


@pytest.mark.parametrize("N,dtype,misaligned,path", CASES,
                         ids=[f"{n}-{str(d)[6:]}-{'mis' if m else 'al'}-{p}" for n, d, m, p in CASES])
def test_torch_order_softmax_matches_aten_order(softmax, device, N, dtype, misaligned, path):
    from importlib import import_module

    order = import_module(softmax.__name__ + "._torch_order")
    torch.manual_seed(N)
    M = 5 if N > 1024 else 37
    # wide rows: exponentials of one magnitude, so that every order rounds its sums differently
    buf = torch.randn(M * N + 1, device=device) * (0.1 if N > 2048 else 3.0)
    flat = buf[1:] if misaligned else buf[:-1]
    x = flat.to(dtype) if dtype != torch.float32 else flat
    x = x.view(M, N)
    mis = (x.data_ptr() % 16) // x.element_size()
    assert bool(mis) == misaligned
    assert order.path_name(order.torch_order_path(N, x.element_size(), mis)) == path
    y = softmax.softmax(x, -1, torch_order=True)
    if device == "cuda":
        want = torch.softmax(x, -1)
    else:
        want = torch.from_numpy(_aten_order(x.float().numpy(), path, x.element_size(), mis)).to(dtype)
    assert y.dtype == dtype and y.shape == x.shape
    assert torch.equal(y, want), (y.float() - want.float()).abs().max().item()


def test_torch_order_differs_from_a_plain_sum(softmax, device):
    """The order matters at these sizes: a plain left-to-right sum gives other bits, so the test above can fail."""
    torch.manual_seed(0)
    x = torch.randn(16, 3001, device=device) * 3
    y = softmax.softmax(x, -1, torch_order=True).cpu().numpy()
    xs = x.cpu().numpy()
    e = np.exp(xs - xs.max(-1, keepdims=True)).astype(np.float32)
    plain = e / np.cumsum(e, axis=-1, dtype=np.float32)[:, -1:]
    assert (plain != y).any()


def test_torch_order_rows_and_views(softmax, device):
    """Strided rows (a slice), a 0-d tensor, a dim whose trailing sizes are 1, and a dim that is not (fast kernels)."""
    torch.manual_seed(1)
    wide = torch.randn(6, 3000, device=device)
    x = wide[:, :2500]  # rows 3000 apart: torch copies; the kernel reads in place, misalignment 0
    y = softmax.softmax(x, -1, torch_order=True)
    ref = torch.from_numpy(_aten_order(x.cpu().numpy(), "reg", 4, 0))
    want = torch.softmax(x, -1) if device == "cuda" else ref
    assert torch.equal(y.cpu() if device == "cpu" else y, want)
    s = torch.tensor(2.5, device=device)
    assert softmax.softmax(s, 0, torch_order=True).item() == 1.0
    x3 = torch.randn(4, 33, 1, device=device)
    assert torch.equal(softmax.softmax(x3, 1, torch_order=True).squeeze(-1),
                       softmax.softmax(x3.squeeze(-1), -1, torch_order=True))
    x4 = torch.randn(4, 33, 3, device=device)
    assert torch.allclose(softmax.softmax(x4, 1, torch_order=True), torch.softmax(x4, 1), rtol=1e-5, atol=1e-6)
    # the reduced dim last but strided (a transpose): read through a copy, as torch does (it read the wrong
    # elements: found by a review in session 38)
    xt = torch.randn(37, 6, device=device).t()
    y = softmax.softmax(xt, -1, torch_order=True)
    assert torch.equal(y, softmax.softmax(xt.contiguous(), -1, torch_order=True))
    assert torch.allclose(y, torch.softmax(xt, -1), rtol=1e-5, atol=1e-7)
    if device == "cuda":
        assert torch.equal(y, torch.softmax(xt, -1))


def test_torch_order_bad_input(softmax, device):
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="torch_order"):
        softmax.softmax(x, -1, scale=2.0, torch_order=True)
    with pytest.raises(ValueError, match="torch_order"):
        softmax.softmax(x, -1, causal=True, torch_order=True)
    with pytest.raises(TypeError, match="torch_order"):
        softmax.softmax(x, -1, torch_order=1)


def test_softmax_layer_uses_torch_order(softmax, device):
    """The Hub layer equals nn.Softmax's forward (aten order model on the CPU, torch itself on CUDA)."""
    torch.manual_seed(2)
    x = torch.randn(9, 1500, device=device) * 3
    layer = torch.nn.Softmax(dim=-1)
    out = softmax.layers.Softmax.forward(layer, x)
    want = layer(x) if device == "cuda" else torch.from_numpy(_aten_order(x.numpy(), "warp", 4, 0))
    assert torch.equal(out, want)
