"""Session 28 prototype: softmax forward over a shared-memory ring filled by TMA (Gluon, sm_90).

One persistent program per SM (or two). Each row of N elements is cut into chunks of R x 256 elements; a ring of
SLOTS chunk slots (SLOTS >= chunks per row) holds a whole row plus the next row's first chunks. Three passes over
the row in shared memory: max, sum of exp, output (st.global). A slot is refilled (TMA) as soon as the output pass
is done with it, so HBM streams the next row while this one is reduced.
"""
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
W = 256
LOG2E = 1.4426950408889634


@gluon.jit
def _max2(a, b):
    """Elementwise max of two 16-bit float tensors, two elements per instruction (max.bf16x2 / max.f16x2)."""
    if a.dtype == gl.bfloat16:
        return gl.inline_asm_elementwise("max.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.bfloat16,
                                         is_pure=True, pack=2)
    else:
        return gl.inline_asm_elementwise("max.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.float16,
                                         is_pure=True, pack=2)


@gluon.jit
def _to_f32(x, CVT: gl.constexpr):
    """x as fp32; CVT (bf16 only): a shift and a mask per pair of elements."""
    if CVT:
        return gl.inline_asm_elementwise("shl.b32 $0, $2, 16; and.b32 $1, $2, -65536;", "=r,=r,r", [x],
                                         dtype=gl.float32, is_pure=True, pack=2)
    else:
        return x.to(gl.float32)


@gluon.jit
def _ring_softmax_kernel(desc_x, Y, M, C, stride_y, qk, scale, R: gl.constexpr, SLOTS: gl.constexpr,
                         VEC: gl.constexpr, LOG: gl.constexpr, PACKED: gl.constexpr = False,
                         FOLD: gl.constexpr = False, REFILL_ROW: gl.constexpr = False,
                         CVT: gl.constexpr = False, COPY: gl.constexpr = False):
    NW: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = desc_x.dtype
    WIDTH: gl.constexpr = desc_x.block_type.shape[2]
    CHUNK_BYTES: gl.constexpr = R * WIDTH * (dtype.primitive_bitwidth // 8)
    blk: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [NW, 1], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    cnt = (M - pid + nprog - 1) // nprog
    total = cnt * C
    ring = gl.allocate_shared_memory(dtype, [SLOTS, 1, R, WIDTH], desc_x.layout)
    bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    for p in range(0, gl.minimum(SLOTS, total)):
        mbarrier.expect(bars.index(p), CHUNK_BYTES)
        _tma_load(desc_x, [pid + (p // C) * nprog, (p % C) * R, 0], bars.index(p), ring.index(p))
    offs_r = gl.arange(0, R, layout=gl.SliceLayout(1, blk))
    offs_c = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, blk))
    offs = offs_r[:, None] * WIDTH + offs_c[None, :]
    for i in range(cnt):
        row = pid + i * nprog
        base = i * C
        if COPY:
            for c in range(C):
                p = base + c
                s = p % SLOTS
                mbarrier.wait(bars.index(s), (p // SLOTS) & 1)
            mx = 0.0
            tot = 1.0
        elif PACKED:
            accb = gl.full([R, WIDTH], float("-inf"), dtype, blk)
            for c in range(C):
                p = base + c
                s = p % SLOTS
                mbarrier.wait(bars.index(s), (p // SLOTS) & 1)
                accb = _max2(accb, ring.index(s).reshape([R, WIDTH]).load(blk))
            mx = gl.max(gl.max(accb.to(gl.float32), 1), 0)
        else:
            acc = gl.full([R, WIDTH], float("-inf"), gl.float32, blk)
            for c in range(C):
                p = base + c
                s = p % SLOTS
                mbarrier.wait(bars.index(s), (p // SLOTS) & 1)
                acc = gl.maximum(acc, ring.index(s).reshape([R, WIDTH]).load(blk).to(gl.float32))
            mx = gl.max(gl.max(acc, 1), 0)
        mq = mx * qk
        acc = gl.zeros([R, WIDTH], gl.float32, blk)
        for c in range(C * (1 - COPY)):
            s = (base + c) % SLOTS
            x = _to_f32(ring.index(s).reshape([R, WIDTH]).load(blk), CVT)
            acc += gl.exp2(x * qk - mq)
        if not COPY:
            tot = gl.sum(gl.sum(acc, 1), 0)
        if LOG:
            shift = mx * scale + gl.log(tot)
        else:
            inv = 1.0 / tot
            if FOLD:
                mq = mq + gl.log2(tot)
        yrow = Y + row.to(gl.int64) * stride_y
        for c in range(C):
            p = base + c
            s = p % SLOTS
            x = _to_f32(ring.index(s).reshape([R, WIDTH]).load(blk), CVT)
            if COPY:
                y = x
            elif LOG:
                y = x * scale - shift
            elif FOLD:
                y = gl.exp2(x * qk - mq)
            else:
                y = gl.exp2(x * qk - mq) * inv
            gl.store(yrow + c * (R * WIDTH) + offs, y.to(Y.dtype.element_ty))
            if not REFILL_ROW:
                gl.thread_barrier()
                fence_async_shared()
                nxt = p + SLOTS
                if nxt < total:
                    mbarrier.expect(bars.index(s), CHUNK_BYTES)
                    _tma_load(desc_x, [pid + (nxt // C) * nprog, (nxt % C) * R, 0], bars.index(s), ring.index(s))
        if REFILL_ROW:
            gl.thread_barrier()
            fence_async_shared()
            for c in range(C):
                nxt = base + c + SLOTS
                s = (base + c) % SLOTS
                if nxt < total:
                    mbarrier.expect(bars.index(s), CHUNK_BYTES)
                    _tma_load(desc_x, [pid + (nxt // C) * nprog, (nxt % C) * R, 0], bars.index(s), ring.index(s))


@gluon.jit
def _ws_producer(desc_x, Y, ring, full, empty, M, C, stride_y, qk, scale, log):
    SLOTS: gl.constexpr = ring.shape[0]
    R: gl.constexpr = ring.shape[2]
    WIDTH: gl.constexpr = ring.shape[3]
    CHUNK_BYTES: gl.constexpr = R * WIDTH * (desc_x.dtype.primitive_bitwidth // 8)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    total = ((M - pid + nprog - 1) // nprog) * C
    for p in range(total):
        s = p % SLOTS
        mbarrier.wait(empty.index(s), ((p // SLOTS) & 1) ^ 1)
        mbarrier.expect(full.index(s), CHUNK_BYTES)
        _tma_load(desc_x, [pid + (p // C) * nprog, (p % C) * R, 0], full.index(s), ring.index(s))


@gluon.jit
def _ws_consumer(desc_x, Y, ring, full, empty, M, C, stride_y, qk, scale, log):
    NW: gl.constexpr = gl.num_warps()
    SLOTS: gl.constexpr = ring.shape[0]
    R: gl.constexpr = ring.shape[2]
    WIDTH: gl.constexpr = ring.shape[3]
    VEC: gl.constexpr = 128 // desc_x.dtype.primitive_bitwidth
    blk: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [NW, 1], [1, 0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    cnt = (M - pid + nprog - 1) // nprog
    offs_r = gl.arange(0, R, layout=gl.SliceLayout(1, blk))
    offs_c = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, blk))
    offs = offs_r[:, None] * WIDTH + offs_c[None, :]
    for i in range(cnt):
        row = pid + i * nprog
        base = i * C
        acc = gl.full([R, WIDTH], float("-inf"), gl.float32, blk)
        for c in range(C):
            p = base + c
            s = p % SLOTS
            mbarrier.wait(full.index(s), (p // SLOTS) & 1)
            acc = gl.maximum(acc, ring.index(s).reshape([R, WIDTH]).load(blk).to(gl.float32))
        mx = gl.max(gl.max(acc, 1), 0)
        mq = mx * qk
        acc = gl.zeros([R, WIDTH], gl.float32, blk)
        for c in range(C * (1 - COPY)):
            s = (base + c) % SLOTS
            x = _to_f32(ring.index(s).reshape([R, WIDTH]).load(blk), CVT)
            acc += gl.exp2(x * qk - mq)
        tot = gl.sum(gl.sum(acc, 1), 0)
        shift = mx * scale + gl.log(tot)
        inv = 1.0 / tot
        yrow = Y + row.to(gl.int64) * stride_y
        for c in range(C):
            s = (base + c) % SLOTS
            x = ring.index(s).reshape([R, WIDTH]).load(blk).to(gl.float32)
            if log != 0:
                y = x * scale - shift
            else:
                y = gl.exp2(x * qk - mq) * inv
            gl.store(yrow + c * (R * WIDTH) + offs, y.to(Y.dtype.element_ty))
            gl.thread_barrier()
            mbarrier.arrive(empty.index(s))


@gluon.jit
def _ring_ws_kernel(desc_x, Y, M, C, stride_y, qk, scale, R: gl.constexpr, SLOTS: gl.constexpr, LOG: gl.constexpr):
    dtype: gl.constexpr = desc_x.dtype
    WIDTH: gl.constexpr = desc_x.block_type.shape[2]
    ring = gl.allocate_shared_memory(dtype, [SLOTS, 1, R, WIDTH], desc_x.layout)
    full = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SLOTS):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    log = LOG
    args = (desc_x, Y, ring, full, empty, M, C, stride_y, qk, scale, log)
    gl.warp_specialize([(_ws_consumer, args), (_ws_producer, args)], [1], [24])


def ring_softmax(x, R, slots, warps, per_sm, log=False, scale=1.0, **flags):
    M, N = x.shape
    assert N % (R * W) == 0
    C = N // (R * W)
    assert slots >= C
    y = torch.empty_like(x)
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else (gl.float16 if x.dtype == torch.float16 else gl.float32)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=x.element_size() * 8, rank=3)
    desc = TensorDescriptor(x, [M, N // W, W], [x.stride(0), W, 1], [1, R, W], layout)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(M, sms * per_sm),)
    _ring_softmax_kernel[grid](desc, y, M, C, y.stride(0), scale * LOG2E, scale, R=R, SLOTS=slots,
                               VEC=16 // x.element_size(), LOG=log, num_warps=warps, **flags)
    return y


def ring_ws(x, R, slots, warps, per_sm, log=False, scale=1.0):
    M, N = x.shape
    assert N % (R * W) == 0
    C = N // (R * W)
    assert slots >= C
    y = torch.empty_like(x)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=x.element_size() * 8, rank=3)
    desc = TensorDescriptor(x, [M, N // W, W], [x.stride(0), W, 1], [1, R, W], layout)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(M, sms * per_sm),)
    _ring_ws_kernel[grid](desc, y, M, C, y.stride(0), scale * LOG2E, scale, R=R, SLOTS=slots, LOG=log,
                          num_warps=warps)
    return y


if __name__ == "__main__":
    sys.path.insert(0, "benchmarks")
    from triton.testing import do_bench
    from sweep_common import load_packages
    (pkg,) = load_packages(["triton-softmax"], False)
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        liger = lambda x: LigerSoftmaxFunction.apply(x)  # noqa: E731
    except Exception as e:  # noqa: BLE001
        print("no liger", e)
        liger = None
    a = torch.empty(2 ** 28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    copy = 2 * a.numel() * 4 / do_bench(lambda: b.copy_(a), rep=200) / 1e6
    print(f"copy {copy:.0f} GB/s", flush=True)
    del a, b
    SMEM = 227 * 1024 - 2048
    shapes = [(4096, 32768, torch.bfloat16), (16384, 16384, torch.bfloat16), (2048, 65536, torch.bfloat16)]
    P, F, Cv, RR, CP = ({"PACKED": True}, {"FOLD": True}, {"CVT": True}, {"REFILL_ROW": True}, {"COPY": True})
    variants = [("PFC", 16, 2, 4, {**P, **F, **Cv}), ("PFC", 32, 3, 4, {**P, **F, **Cv}),
                ("copy", 16, 1, 4, CP), ("copy", 16, 2, 4, CP), ("copy", 16, 3, 4, CP), ("copy", 32, 1, 4, CP),
                ("copy", 32, 2, 4, CP), ("copy", 64, 1, 8, CP), ("copy", 32, 1, 8, CP), ("copy", 16, 2, 8, CP)]
    for (M, N, dt) in shapes:
        torch.manual_seed(0)
        x = torch.randn(M, N, device="cuda", dtype=dt) * 3
        x[1, 5] = float("-inf")
        nbytes = 2 * x.numel() * x.element_size()
        ref = torch.softmax(x.float(), -1)
        refmax = ref.abs().max().item()
        def run(name, fn):
            try:
                y = fn()
                err = ((y.float() - ref).abs().max().item() / refmax if "copy" not in name
                       else float(not torch.equal(y, x)))
                ms = do_bench(fn, rep=200)
                gbs = nbytes / ms / 1e6
                print(f"  {M}x{N} {str(dt)[6:]} {name:28s} {gbs:6.0f} GB/s  {100 * gbs / copy:4.1f}%"
                      f"  err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"  {M}x{N} {name} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        run("package", lambda: pkg.softmax(x))
        es = x.element_size()
        for (tag, R, per_sm, warps, flags) in variants:
            chunk = R * W * es
            if N % (R * W):
                continue
            C = N // (R * W)
            slots = min(SMEM // per_sm // chunk, 64)
            if slots < C:
                continue
            run(f"{tag} R{R} S{slots} w{warps} x{per_sm}",
                lambda: ring_softmax(x, R, slots, warps, per_sm, **flags))
        del x, ref
        torch.cuda.empty_cache()
