"""A plain numpy model of PyTorch's CUDA summation orders (the reference of the bit-exact kernels).

Written from the order of operations of ATen's CUDA kernels (see
``torch-ext/triton_norms/_torch_order.py``), independently of the Triton code:
loops over CUDA threads and explicit fp32 roundings. The tests compare the
kernels (Triton interpreter) with it bit for bit; on a GPU it is compared with
torch itself.
"""

from __future__ import annotations

import numpy as np

f32 = np.float32

try:  # exact fp32 fma (one rounding), as the interpreter of recent triton has it
    from triton._C.libtriton import interpreter as _interp

    _fma_fp32 = _interp.fma_fp32  # absent from builds without the interpreter helpers: the fallback below

    def fma(a, b, c):
        a, b, c = np.broadcast_arrays(f32(a), f32(b), f32(c))
        return _fma_fp32(np.ascontiguousarray(a), np.ascontiguousarray(b), np.ascontiguousarray(c))
except Exception:  # noqa: BLE001 - float64 product + sum, then one more rounding (wrong only on rare ties)
    def fma(a, b, c):
        return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)


def _halves(v, axis=-1):
    """v[..., :n/2] + v[..., n/2:] along axis."""
    n = v.shape[axis] // 2
    lo, hi = np.split(v, [n], axis=axis)
    return (lo + hi).astype(f32)


def _fold(v, axis):
    """Halving tree along ``axis`` (shared-memory stages and ``shfl_down`` with decreasing offsets)."""
    while v.shape[axis] > 1:
        v = _halves(v, axis=axis)
    return np.squeeze(v, axis=axis)


def _x_then_y(vals):
    """block_x_reduce, then block_y_reduce, of vals (..., bh, bw)."""
    return _fold(_fold(vals, -1), -1)


def _y_then_x(vals):
    """The final block of a global reduce: block_y_reduce, then block_x_reduce."""
    return _fold(_fold(vals, -2), -1)


def mean_sq(x: np.ndarray, cfg) -> np.ndarray:
    """``x.float().pow(2).mean(-1)`` of a (M, N) array as ATen's generic reduce with ``cfg`` (a MeanConfig)."""
    x = np.asarray(x, dtype=f32)
    M, N = x.shape
    sq = (x * x).astype(f32)
    bw, bhr, ctas = cfg.bw, cfg.bhr, cfg.ctas
    nt = bw * bhr
    T = nt * ctas
    out = np.empty(M, dtype=f32)
    for s in range(4) if cfg.vec else range(1):
        rows = np.nonzero((np.arange(M, dtype=np.int64) * N) % 4 == s)[0] if cfg.vec else np.arange(M)
        if rows.size == 0:
            continue
        q = sq[rows]
        acc = np.zeros((rows.size, T, 4), dtype=f32)
        if cfg.vec:
            head = (4 - s) % 4
            nvec = (N - head) // 4
            for j in range(head):
                acc[:, j + s, 0] = q[:, j]
            vecs = q[:, head:head + 4 * nvec].reshape(rows.size, nvec, 4)
            for it in range(-(-nvec // T)):
                chunk = vecs[:, it * T:(it + 1) * T]
                acc[:, :chunk.shape[1]] += chunk
            for i in range((N - head) % 4):
                acc[:, i, 0] += q[:, head + 4 * nvec + i]
        else:
            for m in range(-(-N // T)):
                seg = q[:, m * T:(m + 1) * T]
                acc[:, :seg.shape[1], m % 4] += seg
        lanes = (((acc[..., 0] + acc[..., 1]).astype(f32) + acc[..., 2]).astype(f32) + acc[..., 3]).astype(f32)
        partial = _x_then_y(lanes.reshape(rows.size, ctas, bhr, bw))  # (G, ctas)
        if ctas == 1:
            total = partial[:, 0]
        else:
            nthreads = cfg.bh * bw
            grid = np.zeros((rows.size, nthreads), dtype=f32)
            for c in range(ctas):
                grid[:, c % nthreads] += partial[:, c]
            total = _y_then_x(grid.reshape(rows.size, cfg.bh, bw))
        out[rows] = (total * f32(cfg.factor)).astype(f32)
    return out


def fused_rms_sumsq(x: np.ndarray) -> np.ndarray:
    """vectorized_layer_norm_kernel<rms_norm>: per-thread fma(v, v, s), trees over lanes then warps. (M,)"""
    x = np.asarray(x, dtype=f32)
    M, N = x.shape
    vecs = x.reshape(M, N // 4, 4)
    acc = np.zeros((M, 128), dtype=f32)
    for k in range(-(-(N // 4) // 128)):
        chunk = vecs[:, k * 128:(k + 1) * 128]
        n = chunk.shape[1]
        for ii in range(4):
            acc[:, :n] = fma(chunk[..., ii], chunk[..., ii], acc[:, :n])
    a = acc.reshape(M, 4, 32)
    while a.shape[-1] > 1:
        a = _halves(a)
    a = a[..., 0]
    while a.shape[-1] > 1:
        a = _halves(a)
    return a[:, 0]


def _ln_combine(bm, bs, bc, am, as_, ac, mean_fma=0):
    delta = (bm - am).astype(f32)
    count = (ac + bc).astype(f32)
    pos = count > 0
    coef = (f32(1) / np.where(pos, count, f32(1))).astype(f32)
    na, nb = (ac * coef).astype(f32), (bc * coef).astype(f32)
    if mean_fma == 0:
        mean = fma(na, am, (nb * bm).astype(f32))
    elif mean_fma == 1:
        mean = fma(nb, bm, (na * am).astype(f32))
    else:
        mean = ((na * am).astype(f32) + (nb * bm).astype(f32)).astype(f32)
    s = fma(((delta * delta).astype(f32) * ac).astype(f32), nb, (as_ + bs).astype(f32))
    return np.where(pos, mean, f32(0)), np.where(pos, s, f32(0)), count


def fused_ln_stats(x: np.ndarray, mean_fma: int = 0):
    """vectorized_layer_norm_kernel (LayerNorm): (mean, sum of squared deviations / N), (M,) each."""
    x = np.asarray(x, dtype=f32)
    M, N = x.shape
    vecs = x.reshape(M, N // 4, 4)
    m, s, c = (np.zeros((M, 128), dtype=f32) for _ in range(3))
    for k in range(-(-(N // 4) // 128)):
        chunk = vecs[:, k * 128:(k + 1) * 128]
        n = chunk.shape[1]
        for ii in range(4):
            v = chunk[..., ii]
            delta = (v - m[:, :n]).astype(f32)
            c1 = (c[:, :n] + f32(1)).astype(f32)
            m1 = fma(delta, (f32(1) / c1).astype(f32), m[:, :n])
            s[:, :n] = fma(delta, (v - m1).astype(f32), s[:, :n])
            m[:, :n], c[:, :n] = m1, c1
    m, s, c = (a.reshape(M, 4, 32) for a in (m, s, c))
    for axis in (-1, -2):
        while m.shape[axis] > 1:
            n = m.shape[axis] // 2
            (ml, mh), (sl, sh), (cl, ch) = (np.split(a, [n], axis=axis) for a in (m, s, c))
            m, s, c = _ln_combine(ml, sl, cl, mh, sh, ch, mean_fma)
    return m.reshape(M), (s.reshape(M) / f32(N)).astype(f32)


def _wf_combine(am, a2, an, bm, b2, bn):
    delta = (bm - am).astype(f32)
    n = (an + bn).astype(f32)
    r = (bn / np.where(n > 0, n, f32(1))).astype(f32)
    m = fma(delta, r, am)
    q = fma(((delta * delta).astype(f32) * an).astype(f32), r, (a2 + b2).astype(f32))
    m = np.where(an == 0, bm, np.where(bn == 0, am, m))
    q = np.where(an == 0, b2, np.where(bn == 0, a2, q))
    return m, q, n


def rowwise_welford(x: np.ndarray):
    """RowwiseMomentsCUDAKernel: ATen WelfordOps over threads j, j + 512, ..., BlockReduce. (mean, var)."""
    x = np.asarray(x, dtype=f32)
    M, N = x.shape
    m, q, n = (np.zeros((M, 512), dtype=f32) for _ in range(3))
    for k in range(-(-N // 512)):
        v = x[:, k * 512:(k + 1) * 512]
        w = v.shape[1]
        n1 = (n[:, :w] + f32(1)).astype(f32)
        delta = (v - m[:, :w]).astype(f32)
        m1 = (m[:, :w] + (delta / n1).astype(f32)).astype(f32)
        q[:, :w] = fma(delta, (v - m1).astype(f32), q[:, :w])
        m[:, :w], n[:, :w] = m1, n1
    m, q, n = (a.reshape(M, 16, 32) for a in (m, q, n))
    for axis in (-1, -2):
        while m.shape[axis] > 1:
            h = m.shape[axis] // 2
            (ml, mh), (ql, qh), (nl, nh) = (np.split(a, [h], axis=axis) for a in (m, q, n))
            m, q, n = _wf_combine(ml, ql, nl, mh, qh, nh)
    m, q, n = (a.reshape(M) for a in (m, q, n))
    return m, (q / np.where(n > 0, n, f32(1))).astype(f32)
