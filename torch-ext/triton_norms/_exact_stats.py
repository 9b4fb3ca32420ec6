"""Row statistics summed in the order of PyTorch's CUDA kernels (see ``_torch_order.py``).

Each helper takes ``ROWS`` rows (``base``: (ROWS, 1) row pointers, ``rm``: (ROWS, 1)
row mask), reads them chunk by chunk in the order one CUDA thread reads its
elements, keeps one accumulator per CUDA thread (and per vector lane) in a
register tensor, and combines the accumulators with explicit halving trees (element i +=
element i + half), as ATen's shared-memory and ``shfl_down`` stages are (intra-warp offsets
decreasing since torch 2.10 or so; older releases paired adjacent lanes instead). ``tl.sum``
never adds more than two floats (its order over more is the compiler's): each level of the sums of
squares adds one pair, as a sum over an axis of size 2 or as the halves of a split
(:func:`_fold_mid`, whichever the schedule picks), and the Welford states (LayerNorm, the
row-wise order) move with gathers that do what ``shfl_down`` does (:func:`_down`). Loads that
fall outside a row give 0, which leaves a sum of squares unchanged; the Welford updates are
masked instead, except in LayerNorm rows of a multiple of 512 elements, where every thread
updates (``FULL``).

Divisions use ``div_rn`` (IEEE, like nvcc without fast math; Triton's ``/`` is
approximate) and the multiply-adds that nvcc contracts by default are explicit
``tl.fma`` calls, with ``enable_fp_fusion=False`` at launch for everything else.

Every load of the rows here is ``evict_last``: the normalisation (``_exact``) reads the same rows again right
after, ``evict_first``; on the H200 the pair made the exact forwards 3-17% faster (benchmarks/NOTES.md, session 22).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._rounding import round_to


@triton.jit
def _fold_mid(t, LEVELS: tl.constexpr, SPLIT: tl.constexpr):
    """Halving tree along axis 1 of (R, H, W): row h += row h + H/2, LEVELS times; the same additions either way.

    ``SPLIT`` False: each level sums an axis of size 2 (one addition in any order), which compiles to shuffles and
    keeps a few registers per thread. ``SPLIT`` True: each level splits a permuted reshape into its halves, which
    Triton 3.6 lays out with a row's partial sums in every thread: faster on narrow rows (mean order at 4096
    elements, same schedule: 3888 against 3252 GB/s on the H200), 255 registers and spills at 16384
    (``results/norms_exact_2026-12-02_session19.md``)."""
    for _ in tl.static_range(LEVELS):
        if SPLIT:
            lo, hi = tl.split(tl.permute(tl.reshape(t, (t.shape[0], 2, t.shape[1] // 2, t.shape[2])), (0, 2, 3, 1)))
            t = lo + hi
        else:
            t = tl.sum(tl.reshape(t, (t.shape[0], 2, t.shape[1] // 2, t.shape[2])), axis=1)
    return t


@triton.jit
def _lanes4(t):
    """(R, T, 4) -> the 4 lanes (R, T) each, in lane order."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 2, 2)))
    v0, v2 = tl.split(a)
    v1, v3 = tl.split(b)
    return v0, v1, v2, v3


@triton.jit
def _down(t, slot, off: tl.constexpr, span: tl.constexpr):
    """One step of a halving tree over a row's slots (axis 1 of (R, K), ``slot`` = arange(K) broadcast): slot i
    gets slot i + off's value where ``i % span < off``, as ``shfl_down(v, off)`` within a warp (span 32) or a
    shared-memory step across warps do; other slots get their own value and are never read by slot 0's chain.

    A gather keeps every tensor of the tree in one layout: the reshape / split trees this replaced made Triton 3.6
    hold a row's 128 states in every thread's registers (LayerNorm: 126-255 registers per thread on sm_90,
    ``results/norms_exact_registers_2026-12-02.md``)."""
    return tl.gather(t, tl.where(slot % span < off, slot + off, slot), 1)


@triton.jit
def _slot0(t, slot):
    """(R, K) -> (R,): slot 0 of each row, bit for bit (-0.0 and NaN payloads included): an integer sum of its
    bits and zeros."""
    bits = t.to(tl.int32, bitcast=True)
    return tl.sum(tl.where(slot == 0, bits, 0), axis=1).to(tl.float32, bitcast=True)


@triton.jit
def _x_then_y(t, BHR: tl.constexpr, BW: tl.constexpr, LOG_BHR: tl.constexpr, LOG_BW: tl.constexpr,
              SPLIT: tl.constexpr):
    """Reduce.cuh's block_x_reduce then block_y_reduce of thread values t (R, BHR * BW), tid = y * BW + x:
    halving trees (shared memory down to a warp, then ``shfl_down`` 16, 8, ..., 1) over x, then over y."""
    R: tl.constexpr = t.shape[0]
    t = _fold_mid(tl.permute(tl.reshape(t, (R, BHR, BW)), (0, 2, 1)), LOG_BW, SPLIT)  # (R, 1, BHR)
    t = _fold_mid(tl.reshape(t, (R, BHR, 1)), LOG_BHR, SPLIT)
    return tl.reshape(t, (R,))


@triton.jit
def _y_then_x(t, BHR: tl.constexpr, BW: tl.constexpr, LOG_BHR: tl.constexpr, LOG_BW: tl.constexpr,
              SPLIT: tl.constexpr):
    """The final block of a global reduce: block_y_reduce, then block_x_reduce (both halving trees)."""
    R: tl.constexpr = t.shape[0]
    t = _fold_mid(tl.reshape(t, (R, BHR, BW)), LOG_BHR, SPLIT)  # (R, 1, BW)
    t = _fold_mid(tl.reshape(t, (R, BW, 1)), LOG_BW, SPLIT)
    return tl.reshape(t, (R,))


@triton.jit
def row_values(base, rbase, off, mask, EVICT: tl.constexpr):
    """fp32 values of the rows at ``base + off`` (0 where ``mask`` is false); with ``rbase`` (the residual's rows,
    or None) the sum ``base[off] + rbase[off]`` computed in fp32 and rounded once to the residual's dtype, as
    ``residual + hidden_states`` rounds in a model's dtype, then widened."""
    v = tl.load(base + off, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
    if rbase is not None:  # the rounding of _common.input_of (nearest even under the interpreter too)
        v = round_to(v + tl.load(rbase + off, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32),
                     rbase.dtype.element_ty)
    return v


@triton.jit
def _mean_chunk(acc, base, rbase, rm, c, it, head, nvec, inner, tid, N, T: tl.constexpr, NT: tl.constexpr,
                VEC: tl.constexpr):
    if VEC:
        q0 = it * T + c * NT
        m = rm & (q0 + tid < nvec)
        v = row_values(base, rbase, head + q0 * 4 + inner, m, "evict_last")
    else:
        e = (4 * it + inner // NT) * T + c * NT + inner % NT
        v = row_values(base, rbase, e, rm & (e < N), "evict_last")
    return acc + v * v


@triton.jit
def mean_sq_torch_order(
    base, rbase, rm, rows, N, factor,
    ROWS: tl.constexpr, VEC: tl.constexpr, BW: tl.constexpr, BHR: tl.constexpr, CTAS: tl.constexpr,
    CP: tl.constexpr, ITERS: tl.constexpr, LOG_BHR: tl.constexpr, LOG_BW: tl.constexpr, LOG_PAD: tl.constexpr,
    LOG_WRAP: tl.constexpr, ALIGNED: tl.constexpr, UNROLL: tl.constexpr, SPLIT: tl.constexpr,
):
    """``x.float().pow(2).mean(-1)`` of ROWS rows, summed as ATen's generic reduce kernel does. Returns (ROWS,).
    ``rbase``: None, or the residual's rows: then x is ``row_values``' rounded sum of both.

    ``ALIGNED``: N is a multiple of 4, so every row of the fp32 copy starts on a 16-byte boundary (no head
    elements; the loads then vectorise). ``UNROLL``: loop trips per unrolled group (each thread still adds its
    elements in order). ``SPLIT``: the trees' layout (:func:`_fold_mid`)."""
    NT: tl.constexpr = BHR * BW
    T: tl.constexpr = CTAS * NT
    INNER: tl.constexpr = 4 * NT
    inner = tl.arange(0, INNER)[None, :]
    tid = inner // 4
    lane = inner % 4
    if VEC and ALIGNED:
        head = 0
        nvec = N // 4
    elif VEC:
        # the fp32 copy torch reduces is contiguous: row r starts (r * N) % 4 floats past a 16-byte boundary
        s = ((rows.to(tl.int64) * N) % 4).to(tl.int32)[:, None]
        head = (4 - s) % 4  # elements before the first aligned vector, added first by threads s..3
        nvec = (N - head) // 4
    else:
        s = tl.zeros([ROWS, 1], tl.int32)
        head = s
        nvec = s
    part = tl.zeros([ROWS, CP], tl.float32)
    cidx = tl.arange(0, CP)[None, :]
    for c in range(CTAS):
        if VEC and not ALIGNED:
            hm = rm & (c == 0) & (s > 0) & (lane == 0) & (tid >= s) & (tid < 4)
            acc = row_values(base, rbase, tid - s, hm, "evict_last")
            acc = acc * acc
        else:
            acc = tl.zeros([ROWS, INNER], tl.float32)
        if UNROLL >= ITERS:
            for it in tl.static_range(ITERS):
                acc = _mean_chunk(acc, base, rbase, rm, c, it, head, nvec, inner, tid, N, T, NT, VEC)
        else:
            for g in range(ITERS // UNROLL):
                for u in tl.static_range(UNROLL):
                    acc = _mean_chunk(acc, base, rbase, rm, c, g * UNROLL + u, head, nvec, inner, tid, N, T, NT,
                                      VEC)
            for u in tl.static_range(ITERS % UNROLL):
                acc = _mean_chunk(acc, base, rbase, rm, c, ITERS - ITERS % UNROLL + u, head, nvec, inner, tid, N,
                                  T, NT, VEC)
        if VEC:
            if not ALIGNED:
                tm = rm & (c == 0) & (lane == 0) & (tid < (N - head) % 4)
                v = row_values(base, rbase, head + 4 * nvec + tid, tm, "evict_last")
                acc = acc + v * v  # the row's tail, after the vectors (threads 0..2)
            a0, a1, a2, a3 = _lanes4(tl.reshape(acc, (ROWS, NT, 4)))
        else:
            a0, a1, a2, a3 = _lanes4(tl.permute(tl.reshape(acc, (ROWS, 4, NT)), (0, 2, 1)))
        lanes = ((a0 + a1) + a2) + a3
        p = _x_then_y(lanes, BHR, BW, LOG_BHR, LOG_BW, SPLIT)
        part = tl.where(cidx == c, p[:, None], part)
    if CTAS == 1:
        total = tl.reshape(part, (ROWS,))
    else:
        # global reduce: the last block's thread t adds the staged partial sums t, t + NT
        # (zeros where there are none), then the same block trees
        # exact for up to 2 partial sums per thread (t, then t + NT): CTAS <= 2 * BW * BH (mean_config passes it
        # only for rows of more than 2^27 elements on GPUs of up to 170 SMs); a tree beyond, which may differ by an ulp
        part = tl.reshape(_fold_mid(tl.reshape(part, (ROWS, 1 << LOG_WRAP, CP >> LOG_WRAP)), LOG_WRAP, SPLIT),
                          (ROWS, CP >> LOG_WRAP))
        for _ in tl.static_range(LOG_PAD):
            z = tl.join(part, tl.zeros_like(part))
            part = tl.reshape(tl.permute(z, (0, 2, 1)), (ROWS, 2 * part.shape[1]))
        total = _y_then_x(part, BHR, BW, LOG_BHR, LOG_BW, SPLIT)
    return total * factor


@triton.jit
def _rms_vec_chunk(acc, base, rm, k, N, inner, ROWS: tl.constexpr):
    e = k * 512 + inner
    v = tl.load(base + e, mask=rm & (e < N), other=0.0, eviction_policy="evict_last").to(tl.float32)
    v0, v1, v2, v3 = _lanes4(tl.reshape(v, (ROWS, 128, 4)))
    acc = tl.fma(v0, v0, acc)
    acc = tl.fma(v1, v1, acc)
    acc = tl.fma(v2, v2, acc)
    return tl.fma(v3, v3, acc)


@triton.jit
def fused_rms_sumsq_vec(base, rm, N, ROWS: tl.constexpr, ITERS: tl.constexpr, UNROLL: tl.constexpr,
                        SPLIT: tl.constexpr):
    """``vectorized_layer_norm_kernel<rms_norm=true>``: sum of squares of ROWS rows (N % 4 == 0).

    Thread t = x + 32 y (128 threads) reads vectors t, t + 128, ... and does
    ``s = fma(v, v, s)`` per element; halving trees over the 32 lanes, then the 4 warps.
    ``UNROLL``: loop trips per unrolled group, ``SPLIT``: the trees' layout (:func:`_fold_mid`)."""
    inner = tl.arange(0, 512)[None, :]
    acc = tl.zeros([ROWS, 128], tl.float32)
    if UNROLL >= ITERS:
        for k in tl.static_range(ITERS):
            acc = _rms_vec_chunk(acc, base, rm, k, N, inner, ROWS)
    else:
        for g in range(ITERS // UNROLL):
            for u in tl.static_range(UNROLL):
                acc = _rms_vec_chunk(acc, base, rm, g * UNROLL + u, N, inner, ROWS)
        for u in tl.static_range(ITERS % UNROLL):
            acc = _rms_vec_chunk(acc, base, rm, ITERS - ITERS % UNROLL + u, N, inner, ROWS)
    t = tl.permute(tl.reshape(acc, (ROWS, 4, 32)), (0, 2, 1))  # (R, lane, warp)
    t = _fold_mid(t, 5, SPLIT)  # shfl_down 16, 8, 4, 2, 1 within each warp
    t = _fold_mid(tl.reshape(t, (ROWS, 4, 1)), 2, SPLIT)  # warps 2, 3 onto 0, 1; then 1 onto 0
    return tl.reshape(t, (ROWS,))


@triton.jit
def _recip(x):
    return tl.math.div_rn(tl.zeros_like(x) + 1.0, x)


@triton.jit
def _ln_terms(bm, bs, am, as_, ac, na, nb, MEAN_FMA: tl.constexpr):
    """cuWelfordCombine's new (mean, sigma2) from this thread's (bm, bs), the other's (am, as_) and count ac, and
    nA = ac * coef, nB = bc * coef (coef = 1 / (ac + bc)); MEAN_FMA: which product nvcc fuses into the mean's fma."""
    delta = bm - am
    if MEAN_FMA == 0:
        mean = tl.fma(na, am, nb * bm)
    elif MEAN_FMA == 1:
        mean = tl.fma(nb, bm, na * am)
    else:
        mean = na * am + nb * bm
    return mean, tl.fma((delta * delta) * ac, nb, as_ + bs)


@triton.jit
def _ln_combine(bm, bs, bc, am, as_, ac, MEAN_FMA: tl.constexpr):
    """layer_norm_kernel.cu's cuWelfordCombine(dataB = this thread, dataA = the other), fp32 counts."""
    count = ac + bc
    pos = count > 0.0
    coef = _recip(tl.where(pos, count, 1.0))
    mean, s = _ln_terms(bm, bs, am, as_, ac, ac * coef, bc * coef, MEAN_FMA)
    return tl.where(pos, mean, 0.0), tl.where(pos, s, 0.0), count


@triton.jit
def _ln_tree(m, s, c, MEAN_FMA: tl.constexpr):
    """vectorized_layer_norm_kernel's reduction of the (R, 128) thread states (thread t = x + 32 y):
    ``shfl_down`` 16 ... 1 within each warp, then warps 2, 3 onto 0, 1 and 1 onto 0. Returns slot 0's (mean, m2)."""
    slot = tl.broadcast_to(tl.arange(0, 128)[None, :], m.shape)
    for i in tl.static_range(5):
        m, s, c = _ln_combine(m, s, c, _down(m, slot, 16 >> i, 32), _down(s, slot, 16 >> i, 32),
                              _down(c, slot, 16 >> i, 32), MEAN_FMA)
    for i in tl.static_range(2):
        m, s, c = _ln_combine(m, s, c, _down(m, slot, 64 >> i, 128), _down(s, slot, 64 >> i, 128),
                              _down(c, slot, 64 >> i, 128), MEAN_FMA)
    return _slot0(m, slot), _slot0(s, slot)


@triton.jit
def _ln_update_full(m, s, v, rcp):
    """cuWelfordOnlineSum: mean += delta * (1 / count) and sigma2 += delta * (v - new mean), both fused.
    ``rcp`` is 1 / (c + 1), IEEE-rounded. Every thread updates (rows past M load zeros and stay at zero)."""
    delta = v - m
    m1 = tl.fma(delta, rcp, m)
    return m1, tl.fma(delta, v - m1, s)


@triton.jit
def _ln_update(m, s, c, v, ok, rcp):
    """:func:`_ln_update_full` for the threads where ``ok``; the others keep their state."""
    m1, s1 = _ln_update_full(m, s, v, rcp)
    return tl.where(ok, m1, m), tl.where(ok, s1, s), tl.where(ok, c + 1.0, c)


@triton.jit
def _ln_chunk_full(m, s, base, rm, k, inner, r0, r1, r2, r3, ROWS: tl.constexpr):
    """:func:`_ln_chunk` when N % 512 == 0: every thread holds vector k, so no update is masked."""
    v = tl.load(base + (k * 512 + inner), mask=rm, other=0.0, eviction_policy="evict_last").to(tl.float32)
    v0, v1, v2, v3 = _lanes4(tl.reshape(v, (ROWS, 128, 4)))
    m, s = _ln_update_full(m, s, v0, r0)
    m, s = _ln_update_full(m, s, v1, r1)
    m, s = _ln_update_full(m, s, v2, r2)
    m, s = _ln_update_full(m, s, v3, r3)
    return m, s


@triton.jit
def _ln_combine_full(ml, sl, mh, sh, n: tl.constexpr, MEAN_FMA: tl.constexpr):
    """:func:`_ln_combine` (this = l, the other = h) when both sides hold ``n`` elements: cuWelfordCombine's
    ``coef = 1 / (2n)`` and ``nA = nB = n * coef`` are constants (``1 / (2n)`` a Python double rounded once to
    fp32, exact as in :func:`fused_ln_stats_vec`; the product rounded in fp32 as the kernel rounds it)."""
    nf = tl.full([], n, tl.float32)
    half = nf * (1.0 / (2 * n))
    return _ln_terms(ml, sl, mh, sh, nf, half, half, MEAN_FMA)


@triton.jit
def _ln_tree_full(m, s, ITERS: tl.constexpr, MEAN_FMA: tl.constexpr):
    """:func:`_ln_tree` when every thread holds 4 * ITERS elements (the counts double per step)."""
    slot = tl.broadcast_to(tl.arange(0, 128)[None, :], m.shape)
    for i in tl.static_range(5):
        m, s = _ln_combine_full(m, s, _down(m, slot, 16 >> i, 32), _down(s, slot, 16 >> i, 32), (4 * ITERS) << i,
                                MEAN_FMA)
    for i in tl.static_range(2):
        m, s = _ln_combine_full(m, s, _down(m, slot, 64 >> i, 128), _down(s, slot, 64 >> i, 128),
                                (128 * ITERS) << i, MEAN_FMA)
    return _slot0(m, slot), _slot0(s, slot)


@triton.jit
def _ln_chunk(m, s, c, base, rm, k, N, inner, t, r0, r1, r2, r3, ROWS: tl.constexpr):
    """Vector k of every thread. ``r0..r3``: 1 / (4k + 1 .. 4k + 4), the reciprocal counts of its 4 updates (an
    element of vector k is a thread's (4k + j + 1)-th: the threads that hold vector k held vectors 0..k - 1)."""
    e = k * 512 + inner
    v = tl.load(base + e, mask=rm & (e < N), other=0.0, eviction_policy="evict_last").to(tl.float32)
    v0, v1, v2, v3 = _lanes4(tl.reshape(v, (ROWS, 128, 4)))
    ok = rm & (k * 128 + t < N // 4)
    m, s, c = _ln_update(m, s, c, v0, ok, r0)
    m, s, c = _ln_update(m, s, c, v1, ok, r1)
    m, s, c = _ln_update(m, s, c, v2, ok, r2)
    m, s, c = _ln_update(m, s, c, v3, ok, r3)
    return m, s, c


@triton.jit
def _recip4(k):
    """1 / (4k + 1) ... 1 / (4k + 4), IEEE-rounded, for a run-time k (scalars: four divisions per vector)."""
    c0 = (tl.zeros([], tl.int32) + 4 * k).to(tl.float32)  # k: a loop index, or a constexpr in the tail
    one = tl.full([], 1.0, tl.float32)
    return (tl.math.div_rn(one, c0 + 1.0), tl.math.div_rn(one, c0 + 2.0), tl.math.div_rn(one, c0 + 3.0),
            tl.math.div_rn(one, c0 + 4.0))


@triton.jit
def _ln_chunk_at(m, s, c, base, rm, k, N, inner, t, ROWS: tl.constexpr):
    """:func:`_ln_chunk` for a run-time k."""
    r0, r1, r2, r3 = _recip4(k)
    return _ln_chunk(m, s, c, base, rm, k, N, inner, t, r0, r1, r2, r3, ROWS)


@triton.jit
def fused_ln_stats_vec(base, rm, N, ROWS: tl.constexpr, ITERS: tl.constexpr, MEAN_FMA: tl.constexpr,
                       UNROLL: tl.constexpr, FULL: tl.constexpr):
    """``vectorized_layer_norm_kernel`` (LayerNorm): Welford per thread (vectors t, t + 128, ...),
    combined over 32 lanes then 4 warps. Returns (mean, sum of squared deviations) (ROWS,) each.
    ``UNROLL``: loop trips per unrolled group; when it is ITERS (the whole loop unrolled) the reciprocal
    counts are compile-time constants (a Python double rounded once to fp32: 1 / n for n < 2**26 is never
    close enough to an fp32 rounding boundary for the double's rounding to matter).
    ``FULL``: N % 512 == 0, so every thread holds ITERS vectors: no update is masked and every count of the
    combine tree is the constant 4 * ITERS * 2**level (the same arithmetic without selects or divisions)."""
    if FULL:
        m, s = _ln_stats_full(base, rm, ROWS, ITERS, MEAN_FMA, UNROLL)
    else:
        m, s = _ln_stats_masked(base, rm, N, ROWS, ITERS, MEAN_FMA, UNROLL)
    return m, s


@triton.jit
def _ln_stats_full(base, rm, ROWS: tl.constexpr, ITERS: tl.constexpr, MEAN_FMA: tl.constexpr,
                   UNROLL: tl.constexpr):
    """:func:`fused_ln_stats_vec` for N % 512 == 0 (N = 512 * ITERS)."""
    inner = tl.arange(0, 512)[None, :]
    m = tl.zeros([ROWS, 128], tl.float32)
    s = tl.zeros([ROWS, 128], tl.float32)
    if UNROLL >= ITERS:
        for k in tl.static_range(ITERS):
            m, s = _ln_chunk_full(m, s, base, rm, k, inner, 1.0 / (4 * k + 1), 1.0 / (4 * k + 2),
                                  1.0 / (4 * k + 3), 1.0 / (4 * k + 4), ROWS)
    else:
        for g in range(ITERS // UNROLL):
            for u in tl.static_range(UNROLL):
                r0, r1, r2, r3 = _recip4(g * UNROLL + u)
                m, s = _ln_chunk_full(m, s, base, rm, g * UNROLL + u, inner, r0, r1, r2, r3, ROWS)
        for u in tl.static_range(ITERS % UNROLL):
            r0, r1, r2, r3 = _recip4(ITERS - ITERS % UNROLL + u)
            m, s = _ln_chunk_full(m, s, base, rm, ITERS - ITERS % UNROLL + u, inner, r0, r1, r2, r3, ROWS)
    return _ln_tree_full(m, s, ITERS, MEAN_FMA)


@triton.jit
def _ln_stats_masked(base, rm, N, ROWS: tl.constexpr, ITERS: tl.constexpr, MEAN_FMA: tl.constexpr,
                     UNROLL: tl.constexpr):
    """:func:`fused_ln_stats_vec` for any N (a multiple of 4)."""
    inner = tl.arange(0, 512)[None, :]
    t = tl.arange(0, 128)[None, :]
    m = tl.zeros([ROWS, 128], tl.float32)
    s = tl.zeros([ROWS, 128], tl.float32)
    c = tl.zeros([ROWS, 128], tl.float32)
    if UNROLL >= ITERS:
        for k in tl.static_range(ITERS):
            m, s, c = _ln_chunk(m, s, c, base, rm, k, N, inner, t, 1.0 / (4 * k + 1), 1.0 / (4 * k + 2),
                                1.0 / (4 * k + 3), 1.0 / (4 * k + 4), ROWS)
    else:
        for g in range(ITERS // UNROLL):
            for u in tl.static_range(UNROLL):
                m, s, c = _ln_chunk_at(m, s, c, base, rm, g * UNROLL + u, N, inner, t, ROWS)
        for u in tl.static_range(ITERS % UNROLL):
            m, s, c = _ln_chunk_at(m, s, c, base, rm, ITERS - ITERS % UNROLL + u, N, inner, t, ROWS)
    return _ln_tree(m, s, c, MEAN_FMA)


@triton.jit
def _wf_combine(am, a2, an, bm, b2, bn):
    """SharedReduceOps.h WelfordOps::combine(a = this thread, b = the other); an empty side returns the other."""
    delta = bm - am
    n = an + bn
    r = tl.math.div_rn(bn, tl.where(n > 0.0, n, 1.0))
    m = tl.fma(delta, r, am)
    q = tl.fma((delta * delta) * an, r, a2 + b2)
    m = tl.where(an == 0.0, bm, tl.where(bn == 0.0, am, m))
    q = tl.where(an == 0.0, b2, tl.where(bn == 0.0, a2, q))
    return m, q, n


@triton.jit
def _wf_tree(m, q, n):
    """BlockReduce of the (R, 512) WelfordOps states (thread t = x + 32 y): ``shfl_down`` 16 ... 1 within each
    warp, then the 16 warps' results 8 ... 1 warps apart. Returns slot 0's (mean, m2, count)."""
    slot = tl.broadcast_to(tl.arange(0, 512)[None, :], m.shape)
    for i in tl.static_range(5):
        m, q, n = _wf_combine(m, q, n, _down(m, slot, 16 >> i, 32), _down(q, slot, 16 >> i, 32),
                              _down(n, slot, 16 >> i, 32))
    for i in tl.static_range(4):
        m, q, n = _wf_combine(m, q, n, _down(m, slot, 256 >> i, 512), _down(q, slot, 256 >> i, 512),
                              _down(n, slot, 256 >> i, 512))
    return _slot0(m, slot), _slot0(q, slot), _slot0(n, slot)


@triton.jit
def _wf_chunk(m, q, n, base, rm, k, N, j):
    e = k * 512 + j
    ok = rm & (e < N)
    v = tl.load(base + e, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    n1 = n + 1.0
    delta = v - m
    m1 = m + tl.math.div_rn(delta, n1)
    q1 = tl.fma(delta, v - m1, q)
    return tl.where(ok, m1, m), tl.where(ok, q1, q), tl.where(ok, n1, n)


@triton.jit
def rowwise_welford(base, rm, N, ROWS: tl.constexpr, ITERS: tl.constexpr, UNROLL: tl.constexpr):
    """``RowwiseMomentsCUDAKernel``: ATen's WelfordOps per thread (elements j, j + 512, ...), then
    ``BlockReduce`` (halving trees over each warp's 32 lanes, then over the 16 warps).
    Returns (mean, biased variance) (ROWS,) each. ``UNROLL``: loop trips per unrolled group."""
    j = tl.arange(0, 512)[None, :]
    m = tl.zeros([ROWS, 512], tl.float32)
    q = tl.zeros([ROWS, 512], tl.float32)
    n = tl.zeros([ROWS, 512], tl.float32)
    if UNROLL >= ITERS:
        for k in tl.static_range(ITERS):
            m, q, n = _wf_chunk(m, q, n, base, rm, k, N, j)
    else:
        for g in range(ITERS // UNROLL):
            for u in tl.static_range(UNROLL):
                m, q, n = _wf_chunk(m, q, n, base, rm, g * UNROLL + u, N, j)
        for u in tl.static_range(ITERS % UNROLL):
            m, q, n = _wf_chunk(m, q, n, base, rm, ITERS - ITERS % UNROLL + u, N, j)
    m, q, n = _wf_tree(m, q, n)
    return m, tl.math.div_rn(q, tl.where(n > 0.0, n, 1.0))
