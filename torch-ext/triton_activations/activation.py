"""Activation kernels (plain and gated ``act(gate) * up``): Triton kernels, launchers, ops, autograd.

Forward, per element (fp32 math, see ``_math.py`` for each activation):

    y = round_out(act(x))                                   plain activation
    y = round_out(round_r(act(g)) * u)                      gated; g, u the halves of x

``round_r`` is the identity for ``rounding="fused"`` and a rounding to x.dtype for
``rounding="eager"`` (the rounding point of eager ``act(g) * u`` in PyTorch, and of
kernels-community/activation's CUDA kernels, which round ``act(g)`` to the input type
before the multiply). ``round_out`` rounds once to the output dtype (= x.dtype). Where
``act(x)`` is rounded to bf16 right away, NVIDIA GPUs take the fast forms of ``_math``
once ``_fast_math`` has checked them on the device (same bits for every bf16 input).

Backward (roundings count as identity, as autograd treats ``.to``):

    dx = dy * act'(x)                                       plain
    dg = dy * u * act'(g),  du = dy * round_r(act(g))       gated

Second derivatives (``create_graph=True``): the backward ops' own gradient is the same math as fp32 PyTorch ops
(``_act_and_grad``, ``_gated_grads``), differentiated by ``torch.func.vjp``.

Memory: every operand is addressed through its own strides (three merged leading
dims plus the column stride, 64-bit offsets), so ``chunk``/``narrow`` halves, expanded
(stride-0) or transposed inputs and outputs with a storage offset are read and
written in place: no copy is ever made. (Plain forwards of contiguous tensors in small launches address
runs of consecutive elements with 32-bit offsets instead: ``_flat_tiles``.) Bytes moved: plain ``2 * numel * elem``;
gated ``3 * M * d * elem`` (x read once, y written once); backward adds dy and dx.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import OPS, OpSpec, leading_layout, out_shape, padded_layout, pow_rounds_square, rounding_dtype
from ._launch import MIN_PROGRAMS, ONE_WAVE_PLAIN_THREADS, pick_config, tile_for
from ._libm import use_libdevice
from ._device import cdiv, check_launch_device, device_warp_size, is_interpreter, launch_options
from ._dispatch import call_op, eager_autograd, fp32_vjp, sigmoid_pair
from ._fastlaunch import Launch, PlanCache, meta_items
from ._fast_math import fast_math_eligible, fast_math_verified
from ._math import (ACT_IDS, GELU, GELU_FAST, GELU_NEW, GELU_TANH, activation, activation_and_grad, activation_grad,
                    round_to)
from ._ops import add_op_namespace_prefix
from ._rounding import round_dtype

Tensor = torch.Tensor



@triton.jit
def _row_offset(row, D1, D2, s0, s1, s2):
    """Element offset of row ``row`` of a tensor with leading sizes (., D1, D2) and strides (s0, s1, s2)."""
    i2 = row % D2
    rest = row // D2
    return (rest // D1) * s0 + (rest % D1) * s1 + i2 * s2


@triton.jit
def _tile_offsets(rows, cols, D1, D2, s0, s1, s2, sn):
    """Element offsets (ROWS, BLOCK_N) of a tile of a tensor with leading sizes (., D1, D2) and strides (s0, s1, s2, sn)."""
    return _row_offset(rows, D1, D2, s0, s1, s2)[:, None] + cols[None, :] * sn


@triton.jit
def _act_fwd_kernel(
    g_ptr,  # activation input: x, or the half of x the activation is applied to
    u_ptr,  # the other half of x (the multiplier), or None for a plain activation
    y_ptr,  # output, x's dtype, any strides
    M,  # rows: the product of the leading sizes
    D1, D2,  # sizes of leading dims 1 and 2 (dim 0 spans the rest); 1 when unused (constants then)
    N,  # columns per row (d)
    stride_x0, stride_x1, stride_x2, stride_xn,  # elements g moves per leading index / per column
    stride_u0, stride_u1, stride_u2, stride_un,  # the same for u (g's for a plain activation: unused)
    stride_y0, stride_y1, stride_y2, stride_yn,  # the same for y
    threshold,  # fatrelu threshold (fp32)
    round_square,  # GELU_NEW eager: 1 if pow(x, 3.0) rounds x * x first
    ACT: tl.constexpr,  # activation id (_math)
    R: tl.constexpr,  # None (fused) or the dtype eager steps round to
    LIBDEVICE: tl.constexpr,  # exp/tanh/erf from the vendor math library: 1 or 2 (NVIDIA, torch on CUDA 13), 0 none (_libm)
    FAST: tl.constexpr,  # sigmoid / tanh from NVIDIA's approximate instructions (_fast_math: when exact)
    GRID_1D: tl.constexpr,  # one grid axis over the tiles in row-major order (else rows x column blocks)
    U_FIRST: tl.constexpr,  # gated: load u before the math (else after it; see _load_u_first)
    FLAT: tl.constexpr,  # plain op, x and y contiguous, M * N < 2**31: tiles of ROWS * BLOCK_N consecutive elements
    ROWS: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # columns per program
):
    # One program per tile of ROWS x BLOCK_N. Reads the tile of g (and u), writes the tile of y.
    if FLAT:  # one grid axis over the M * N elements: no row / column split (see _flat_tiles)
        x_off = tl.program_id(0) * (ROWS * BLOCK_N) + tl.arange(0, ROWS * BLOCK_N)
        mask = x_off < M * N
        u_off = x_off
        y_off = x_off
    else:
        if GRID_1D:
            column_blocks = tl.cdiv(N, BLOCK_N)
            row_block = tl.program_id(0) // column_blocks
            column_block = tl.program_id(0) - row_block * column_blocks
        else:
            row_block = tl.program_id(0)
            column_block = tl.program_id(1)
        rows = row_block.to(tl.int64) * ROWS + tl.arange(0, ROWS)
        col0 = column_block.to(tl.int64) * BLOCK_N  # int64: a row may pass 2^31 elements (the tile index may not)
        offs = tl.arange(0, BLOCK_N)
        mask = (rows < M)[:, None] & (offs < tl.minimum(N - col0, BLOCK_N).to(tl.int32))[None, :]
        cols = col0 + offs
        x_off = _tile_offsets(rows, cols, D1, D2, stride_x0, stride_x1, stride_x2, stride_xn)
        u_off = _tile_offsets(rows, cols, D1, D2, stride_u0, stride_u1, stride_u2, stride_un)
        y_off = _tile_offsets(rows, cols, D1, D2, stride_y0, stride_y1, stride_y2, stride_yn)
    g = tl.load(g_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    if U_FIRST:
        u = tl.load(u_ptr + u_off, mask=mask, other=0.0).to(tl.float32)
    y = activation(g, threshold, round_square, ACT, R, LIBDEVICE, FAST)
    if u_ptr is not None:
        if not U_FIRST:
            u = tl.load(u_ptr + u_off, mask=mask, other=0.0).to(tl.float32)
        y = round_to(y, R) * u
    OUT: tl.constexpr = y_ptr.dtype.element_ty
    tl.store(y_ptr + y_off, round_to(y, OUT).to(OUT), mask=mask)


@triton.jit
def _act_bwd_kernel(
    dy_ptr,  # upstream gradient, any strides (0 for expanded)
    g_ptr, u_ptr,  # as in the forward
    dg_ptr, du_ptr,  # gradient of g and of u (du_ptr None when plain); x's dtype
    M, D1, D2, N,
    stride_dy0, stride_dy1, stride_dy2, stride_dyn,
    stride_x0, stride_x1, stride_x2, stride_xn,  # g's
    stride_u0, stride_u1, stride_u2, stride_un,  # u's (g's for a plain activation: unused)
    stride_dx0, stride_dx1, stride_dx2, stride_dxn,  # dg's and du's
    threshold, round_square,
    ACT: tl.constexpr, R: tl.constexpr, LIBDEVICE: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Reads dy and x, writes dx: 3 (plain) or 5 (gated) tiles per program.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    col0 = tl.program_id(1).to(tl.int64) * BLOCK_N  # int64, as in the forward
    offs = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (offs < tl.minimum(N - col0, BLOCK_N).to(tl.int32))[None, :]
    cols = col0 + offs
    dy_off = _tile_offsets(rows, cols, D1, D2, stride_dy0, stride_dy1, stride_dy2, stride_dyn)
    x_off = _tile_offsets(rows, cols, D1, D2, stride_x0, stride_x1, stride_x2, stride_xn)
    dx_off = _tile_offsets(rows, cols, D1, D2, stride_dx0, stride_dx1, stride_dx2, stride_dxn)
    dy = tl.load(dy_ptr + dy_off, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    DX: tl.constexpr = dg_ptr.dtype.element_ty
    if u_ptr is not None:
        u_off = _tile_offsets(rows, cols, D1, D2, stride_u0, stride_u1, stride_u2, stride_un)
        u = tl.load(u_ptr + u_off, mask=mask, other=0.0).to(tl.float32)
        y, grad = activation_and_grad(g, threshold, round_square, ACT, R, LIBDEVICE)
        dg = dy * grad * u
        du = dy * round_to(y, R)
        tl.store(du_ptr + dx_off, round_to(du, DX).to(DX), mask=mask)
    else:
        dg = dy * activation_grad(g, threshold, ACT, LIBDEVICE)
    tl.store(dg_ptr + dx_off, round_to(dg, DX).to(DX), mask=mask)


def _halves(x: Tensor, spec: OpSpec) -> Tuple[Tensor, Optional[Tensor]]:
    """(activation input, multiplier) as views of x: no copy."""
    if not spec.gated:
        return x, None
    d = x.shape[-1] // 2
    first, second = x.narrow(-1, 0, d), x.narrow(-1, d, d)
    return (second, first) if spec.act_on_second else (first, second)


def _fwd_lead(g: Tensor, u: Optional[Tensor], y: Tensor) -> Tuple[Tensor, ...]:
    """The tensors whose strides the forward kernel takes, in its order: g, u (g again for a plain op), y."""
    return g, g if u is None else u, y


def _bwd_lead(dy: Tensor, g: Tensor, u: Optional[Tensor], dg: Tensor) -> Tuple[Tensor, ...]:
    """The same for the backward kernel: dy, g, u (or g), dg (du shares dg's strides)."""
    return dy, g, g if u is None else u, dg


def _launch(kernel, spec: OpSpec, eager: bool, threshold: float, x: Tensor, d: int, lead: Tuple[Tensor, ...],
            ptrs: tuple):
    """Launches ``kernel`` over ``d`` columns of the rows shared by ``lead``; ptrs are its tensor arguments.

    ``lead``: the tensors whose strides the kernel takes, in its argument order. Layouts
    whose leading dims do not merge into three are split along dim 0 (views). Everything but the
    pointers is a function of the shapes, strides, dtype and device (:func:`_cached_plan`: host time).
    """
    plan = _cached_plan(kernel, spec, eager, threshold, x, d, lead)
    if plan is _SPLIT:
        for i in range(x.shape[0]):
            sub_ptrs = tuple(p[i] if p is not None else None for p in ptrs)
            _launch(kernel, spec, eager, threshold, x[i], d, tuple(t[i] for t in lead), sub_ptrs)
        return
    plan(ptrs)


_PLANS = PlanCache()
_SPLIT = object()  # plan of a layout whose leading dims do not merge into three


def _cached_plan(kernel, spec: OpSpec, eager: bool, threshold: float, x: Tensor, d: int, lead: Tuple[Tensor, ...]):
    """:func:`_plan`, kept in ``_PLANS`` per kernel, op, shape, dtype, device and strides."""
    # spec.gated: a plain op on x and act_and_mul on (gate, up) of x's shape and strides have the same d
    key = (kernel, spec.act, spec.gated, eager, threshold, x.shape, x.dtype, x.device, d, *[t.stride() for t in lead])
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.add(key, _plan(kernel, spec, eager, threshold, x, d, lead))


def _plan(kernel, spec: OpSpec, eager: bool, threshold: float, x: Tensor, d: int, lead: Tuple[Tensor, ...],
          fast: Optional[bool] = None):
    """The :class:`Launch` of one call (pointers given per call), or ``_SPLIT``. ``fast``: take the fast math of
    the forward (None: where ``_fast_math`` allows it)."""
    sizes, strides = leading_layout(x.shape[:-1], [t.stride()[:-1] for t in lead])
    if len(sizes) > 3:
        return _SPLIT
    sizes, strides = padded_layout(sizes, strides)
    check_launch_device(x, kernel)
    M = sizes[0] * sizes[1] * sizes[2]
    tile, threads = tile_for(kernel is _act_bwd_kernel, spec.gated, d * x.element_size())
    interpreter, warp = is_interpreter(kernel), device_warp_size(x.device)
    cfg = pick_config(d, x.element_size(), warp, M, tile, not interpreter, threads)
    R = rounding_dtype(x, eager)
    forward = kernel is _act_fwd_kernel
    if forward and fast is None:
        fast = fast_math_eligible(spec.act, spec.gated, x.dtype, R, x.device, interpreter) \
            and fast_math_verified(x.device, spec.act, _fast_math_exact)
    if forward and not spec.gated and not fast:
        wide = pick_config(d, x.element_size(), warp, M, tile, not interpreter, ONE_WAVE_PLAIN_THREADS)
        cfg = wide if _one_vector_per_thread(spec, fast, wide) else cfg
    stride_args = [v for t, st in zip(lead, strides) for v in (*st, t.stride(-1))]
    scalars = (M, sizes[1], sizes[2], d, *stride_args, threshold, int(pow_rounds_square(x)))
    meta = dict(ACT=spec.act, R=round_dtype(R), LIBDEVICE=use_libdevice(x.device, kernel), ROWS=cfg.rows,
                BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **launch_options(kernel))
    grid = (cfg.row_blocks, cfg.column_blocks)
    if forward:
        grid_1d, flat = _one_axis_grid(fast, cfg), _flat_tiles(spec, cfg, fast, M, d, lead)
        meta.update(FAST=fast, GRID_1D=grid_1d, U_FIRST=_load_u_first(spec, cfg), FLAT=flat)
        if flat:
            grid = (cdiv(M * d, cfg.rows * cfg.block_n),)
        elif grid_1d:
            grid = (cfg.row_blocks * cfg.column_blocks,)
    return Launch(kernel, grid, meta_items(**meta), scalars, x.device)


def _one_vector_per_thread(spec: OpSpec, fast: bool, wide) -> bool:
    """Whether a plain forward spreads its tile over ``ONE_WAVE_PLAIN_THREADS`` threads (one 16-byte vector each;
    ``wide``: that config) instead of ``PLAIN_THREADS`` (two): with the exact math, when that launch fits in one
    wave, where each thread's chain of loads and math is the kernel's time. H200, session 12 (CUDA-graph, three rounds,
    results/activations_plain_tiles_2026-12-01.txt): gelu_tanh / gelu_new / gelu_fast 256 x 4096 fp16 3.17 -> 2.80
    us, fp32 3.12 -> 2.73 us, 67 x 5003 fp32 +14%, silu +4% / +10%; at 16384 x 14336 (many waves) two vectors stay
    2.5-3% faster in fp16, and with the fast math (bf16) also in one wave (-8% with one)."""
    return not spec.gated and not fast and wide.one_wave


def _one_axis_grid(fast: bool, cfg) -> bool:
    """Whether a forward walks its tiles in row-major order on one grid axis (programs launched one after another
    then read neighbouring memory) rather than on a (rows, column blocks) grid. H200, bf16 16384 x 2*14336: with
    the fast math 4% faster (4376 against 4195 GB/s), with the exact math 2% slower. With one column block both
    orders are the same, and the one-axis grid's division costs a latency-bound launch 10% (5 x 96: 1.11 against
    1.01 us; ``benchmarks/NOTES.md``)."""
    return fast and cfg.column_blocks > 1 and cfg.row_blocks * cfg.column_blocks < 2**31


# Activations whose exact math is a long chain after the load (libdevice tanh / erf): flat tiles pay even in launches
# of one element per thread (_flat_tiles).
_LONG_CHAIN = tuple(int(a) for a in (GELU, GELU_TANH, GELU_NEW, GELU_FAST))


def _flat_tiles(spec: OpSpec, cfg, fast: bool, M: int, N: int, lead: Tuple[Tensor, ...]) -> bool:
    """Whether a plain forward addresses its tiles as runs of consecutive elements (``FLAT``) instead of 2-D tiles.

    When: x and the output contiguous; a launch that runs in one wave (``cfg.one_wave``: the instructions before the
    load are part of the kernel's time); fewer than 2**31 elements (32-bit offsets); M or N a multiple of 16, so that
    the compiler sees the bound ``M * N`` as one and keeps the tile's 16-byte vectors whole; and, in launches of fewer
    than MIN_PROGRAMS programs (one element per thread), only for the exact tanh / erf GELUs.

    H200, CUDA-graph A/B on shared buffers, session 14 (``results/activations_small_session14_2026-12-01.txt``):
    256 x 4096 +0.3...+7.8% for every op and dtype. 5 x 96: the exact tanh / erf GELUs +1...+4.5%, silu, gelu_quick
    and the fast-math (bf16) tanh GELUs -1...-4%. 67 x 5003 (bound not a multiple of 16) fp16/bf16 -9...-27%: the tile
    kept 8 elements per thread but its loads became scalar and uncoalesced."""
    tiny = cfg.row_blocks * cfg.column_blocks < MIN_PROGRAMS
    return (not spec.gated and cfg.one_wave and M * N < 2**31 and (M % 16 == 0 or N % 16 == 0)
            and (not tiny or (spec.act in _LONG_CHAIN and not fast))
            and all(t.is_contiguous() and t.shape == lead[0].shape for t in lead))


def _load_u_first(spec: OpSpec, cfg) -> bool:
    """Whether a gated forward loads u before the math. Where u's load is written decides where it is issued: the
    compiler does not move it across the math's branches (libdevice, the IEEE division's slow path). Before the
    math both loads are in flight at once; after it, fewer registers are live during the math. H200 (CUDA-graph
    A/B, bf16), exact math: first is +6% for gelu_tanh (16384 x 2*14336: 3843 -> 4090 GB/s), -3.5% for silu
    (4098 -> 3962); with the fast math either place is within 0.2% for both; for the erf GELU first is 0.4-1.4%
    slower at the throughput shapes but 11% faster at 67 x 2*5003. So u comes first for gelu_tanh, and for every
    gated op in a launch that runs in one wave (``cfg.one_wave``: the time is one program's chain of two loads and
    the math). Session 12, exact math: silu_and_mul 5 x 96 fp16 1.20 -> 1.08 us, fp32 1.29 -> 1.14 us; 67 x 2*5003
    fp16 2.22 -> 2.08 us, fp32 2.31 -> 1.94 us (results/activations_small_u_first_2026-12-01.txt)."""
    return spec.gated and (spec.act == GELU_TANH or cfg.one_wave)


def _fast_math_exact(device: torch.device, act: int) -> bool:
    """Whether the fast forward of ``act`` gives the exact forward's bits for every one of the 65536 bf16 inputs,
    through the kernel the ops launch: the plain op with either rounding, the gated ops (``rounding="eager"``,
    multiplier 1) where ``act`` has one (``_fast_math``). NaN outputs count as equal whatever their payload (NVIDIA
    arithmetic returns the canonical NaN on both paths; torch's own comparisons treat NaNs alike)."""
    with torch.cuda.device(device):  # Triton launches on the current device
        g = torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(torch.int16).view(torch.bfloat16)
        for spec in OPS.values():
            if spec.act != act or spec.act_on_second:  # mul_and_silu: silu_and_mul's kernel on the other half
                continue
            x = torch.cat([g, torch.ones_like(g)]).view(1, -1) if spec.gated else g.view(1, -1)
            for eager in ((True,) if spec.gated else (False, True)):
                fast, exact = (_forward_all_bf16(spec, eager, x, f) for f in (True, False))
                same = (fast.view(torch.int16) == exact.view(torch.int16)) | (torch.isnan(fast) & torch.isnan(exact))
                if not bool(same.all()):
                    return False
        return True


def _forward_all_bf16(spec: OpSpec, eager: bool, x: Tensor, fast: bool) -> Tensor:
    """The forward of the (1, 65536) activation input ``x`` (gated: with its multiplier half) with ``fast`` forced."""
    out = torch.full((1, 65536), float("nan"), dtype=torch.bfloat16, device=x.device)
    first, second = _halves(x, spec)
    _plan(_act_fwd_kernel, spec, eager, 0.0, x, 65536, _fwd_lead(first, second, out), fast=fast)((first, second, out))
    return out


def _as_1d(*ts: Tensor) -> Tuple[Tensor, ...]:
    """0-d tensors as (1,) views."""
    return tuple(t.reshape(1) if t.dim() == 0 else t for t in ts)


def forward_into(out: Tensor, x: Tensor, spec: OpSpec, eager: bool, threshold: float) -> None:
    """Writes op ``spec`` of ``x`` into ``out`` (validated shapes; any strides). Raises TypeError when out's dtype is
    not x's (the public functions check it first; the registered op is reachable without them, and the launch
    plans, the fast-math check included, assume it)."""
    if out.dtype != x.dtype:
        raise TypeError(f"out must have x's dtype {x.dtype}, got {out.dtype}")
    if out.numel() == 0:
        return
    out, x = _as_1d(out, x)
    g, u = _halves(x, spec)
    _launch(_act_fwd_kernel, spec, eager, threshold, x, g.shape[-1], _fwd_lead(g, u, out), (g, u, out))


def _new_output(x: Tensor, spec: OpSpec) -> Tensor:
    """The output of the allocating forward: contiguous, x's dtype."""
    if not spec.gated and x.is_contiguous():
        return torch.empty_like(x)  # half the host time of torch.empty(shape, dtype=, device=)
    return torch.empty(out_shape(x.shape, spec.gated), dtype=x.dtype, device=x.device)


def _act_fwd_impl(x: Tensor, op: str, eager: bool, threshold: float) -> Tensor:
    """The allocating forward: a contiguous output of x's dtype."""
    spec = OPS[op]
    out = _new_output(x, spec)
    forward_into(out, x, spec, eager, threshold)
    return out


def infer_plan(x: Tensor, op: str, eager: bool, threshold: float):
    """Everything but the pointers of the allocating forward of a validated call, for :func:`infer`:
    ``(output shape, or None for empty_like(x); op spec; FixedLaunch (``Launch.pinned``), or None for an empty
    output; byte offsets of the activation input and the multiplier (None if not gated) from x's address)``, or
    None for a layout that takes several launches (the general path serves it). A function of x's shape, strides,
    dtype, device and 16-byte alignment and the arguments: callers keep it per such signature."""
    spec = OPS[op]
    out = _new_output(x, spec)
    x1, out1 = _as_1d(x, out)
    g, u = _halves(x1, spec)
    run = None
    if out.numel() > 0:
        run = _cached_plan(_act_fwd_kernel, spec, eager, threshold, x1, g.shape[-1], _fwd_lead(g, u, out1))
        if run is _SPLIT:
            return None
    # byte offsets of the two operands from x's address (the views _halves would build per call)
    offsets = (g.data_ptr() - x1.data_ptr(), None if u is None else u.data_ptr() - x1.data_ptr())
    shape = None if not spec.gated and x.is_contiguous() else tuple(out.shape)
    return shape, spec, None if run is None else run.pinned(), offsets


def infer(plan: tuple, x: Tensor) -> Tensor:
    """``_act_fwd_impl`` of a call whose :func:`infer_plan` is ``plan`` (the same output, one launch)."""
    shape, spec, run, (g_offset, u_offset) = plan
    out = torch.empty_like(x) if shape is None else torch.empty(shape, dtype=x.dtype, device=x.device)
    if run is not None:
        # a 0-d x or out starts where its (1,) view does: the tensors themselves are the pointers
        base = x.data_ptr()
        if not run.at((base + g_offset, None if u_offset is None else base + u_offset, out.data_ptr())):
            g, u = _halves(x, spec)
            run((g, u, out))
    return out


_act_fwd = torch.library.custom_op(add_op_namespace_prefix("act_fwd"), _act_fwd_impl, mutates_args=())


@_act_fwd.register_fake
def _(x, op, eager, threshold):
    return x.new_empty(out_shape(x.shape, OPS[op].gated))


def _act_fwd_out_impl(out: Tensor, x: Tensor, op: str, eager: bool, threshold: float) -> None:
    """The ``(out, x)`` form: writes into ``out`` in place, whatever its strides."""
    forward_into(out, x, OPS[op], eager, threshold)


_act_fwd_out = torch.library.custom_op(add_op_namespace_prefix("act_fwd_out"), _act_fwd_out_impl,
                                       mutates_args=("out",))


@_act_fwd_out.register_fake
def _(out, x, op, eager, threshold):
    return None


def _act_bwd_impl(dy: Tensor, x: Tensor, op: str, eager: bool, threshold: float) -> Tensor:
    """Gradient of the allocating forward with respect to x: contiguous, x's shape and dtype."""
    spec = OPS[op]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if dy.numel() == 0:
        return dx.zero_()
    dy1, x1, dx1 = _as_1d(dy, x, dx)
    g, u = _halves(x1, spec)
    dg, du = _halves(dx1, spec)
    _launch(_act_bwd_kernel, spec, eager, threshold, x1, g.shape[-1], _bwd_lead(dy1, g, u, dg), (dy1, g, u, dg, du))
    return dx


_act_bwd = torch.library.custom_op(add_op_namespace_prefix("act_bwd"), _act_bwd_impl, mutates_args=())


@_act_bwd.register_fake
def _(dy, x, op, eager, threshold):
    return x.new_empty(x.shape)


def _act_and_grad(x: Tensor, act: int, threshold: float) -> Tuple[Tensor, Tensor]:
    """``(act(x), act'(x))`` as differentiable PyTorch ops: ``_math``'s formulas and constants (roundings as
    identity), with the sigmoids (and ``1 + tanh = 2 sigmoid(2 z)``) from ``sigmoid_pair``: accurate second
    derivatives where the sigmoid is near 1. FATRELU's derivative is a step: its own derivative is 0 (as torch's,
    where it exists)."""
    if act == ACT_IDS["silu"]:
        s, c = sigmoid_pair(x)
        return x * s, s * (1.0 + x * c)
    if act == ACT_IDS["gelu"]:
        cdf = 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))
        return x * cdf, cdf + x * (torch.exp(-0.5 * x * x) * 0.3989422804014327)
    if act == ACT_IDS["gelu_quick"]:
        z = 1.702 * x
        s, c = sigmoid_pair(z)
        return x * s, s + z * s * c
    if act == ACT_IDS["fatrelu"]:
        keep = x > threshold
        return torch.where(keep, x, 0.0), keep.to(x.dtype)
    # GELU_TANH, GELU_NEW, GELU_FAST: 0.5 * x * (1 + tanh(k0 * (x + k1 * x**3)))
    k0 = 0.7978845608 if act == ACT_IDS["gelu_fast"] else 0.7978845608028654
    # 0.5 (1 + t) = s and 0.5 x (1 - t) (1 + t) = 2 x s c for t = tanh(z), (s, c) = sigmoid_pair(2 z)
    x2 = x * x
    s, c = sigmoid_pair(2.0 * (k0 * x * (1.0 + 0.044715 * x2)))
    return x * s, s + 2.0 * x * s * c * (k0 * (1.0 + 3.0 * 0.044715 * x2))


def _gated_grads(dy: Tensor, g: Tensor, u: Tensor, act: int, threshold: float) -> Tuple[Tensor, Tensor]:
    """The backward kernel's ``(dg, du)`` of ``act(g) * u`` (module docstring) as fp32 PyTorch ops, differentiable."""
    y, grad = _act_and_grad(g, act, threshold)
    return dy * u * grad, dy * y


def _bwd_model(dy: Tensor, x: Tensor, op: str, threshold: float) -> Tuple[Tensor]:
    """``_act_bwd_impl``'s dx as fp32 PyTorch ops, differentiable: the double backward's model."""
    spec = OPS[op]
    g, u = _halves(x, spec)
    if u is None:
        return (dy * _act_and_grad(g, spec.act, threshold)[1],)
    dg, du = _gated_grads(dy, g, u, spec.act, threshold)
    return (torch.cat((du, dg) if spec.act_on_second else (dg, du), dim=-1),)


def _bwd_setup_context(ctx, inputs, output):
    dy, x, op, eager, threshold = inputs
    ctx.save_for_backward(dy, x)
    ctx.op, ctx.threshold = op, threshold


def _bwd_backward(ctx, ddx):
    """The gradients of dx with respect to dy and x (a second derivative; x's flows on through the forward):
    ``_bwd_model`` differentiated in fp32 (``_dispatch.fp32_vjp``)."""
    dy, x = ctx.saved_tensors
    ddy, dxx = fp32_vjp(lambda a, b: _bwd_model(a, b, ctx.op, ctx.threshold), (dy, x), (ddx,))
    return ddy, dxx, None, None, None


_ACT_BWD_AUTOGRAD = eager_autograd(_act_bwd, _act_bwd_impl, _bwd_setup_context, _bwd_backward)


def _setup_context(ctx, inputs, output):
    x, op, eager, threshold = inputs
    ctx.save_for_backward(x)
    ctx.op, ctx.eager, ctx.threshold = op, eager, threshold


def _backward(ctx, dy):
    (x,) = ctx.saved_tensors
    dx = call_op(_act_bwd, _act_bwd_impl, dy, x, ctx.op, ctx.eager, ctx.threshold, autograd=_ACT_BWD_AUTOGRAD)
    return dx, None, None, None


_ACT_AUTOGRAD = eager_autograd(_act_fwd, _act_fwd_impl, _setup_context, _backward)


def act_forward(x: Tensor, op: str, eager: bool, threshold: float) -> Tensor:
    """The allocating forward with autograd (the op, or its implementation in plain eager code)."""
    return call_op(_act_fwd, _act_fwd_impl, x, op, eager, threshold, autograd=_ACT_AUTOGRAD)


def act_forward_out(out: Tensor, x: Tensor, op: str, eager: bool, threshold: float) -> None:
    """The ``(out, x)`` form (the op, or its implementation in plain eager code). An ``out`` with the negative bit
    set (``z.conj().imag``) holds the negated values in memory: the result goes to a plain buffer, then through
    ``copy_``, which honours the bit (the dispatcher's fallback for the bit cannot write a custom op's output).
    Not under compile tracing: dynamo cannot trace ``is_neg``."""
    if not torch.compiler.is_compiling() and out.is_neg():
        buffer = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        call_op(_act_fwd_out, _act_fwd_out_impl, buffer, x, op, eager, threshold)
        out.copy_(buffer)
        return
    call_op(_act_fwd_out, _act_fwd_out_impl, out, x, op, eager, threshold)


# ----------------------------------------------------------------------------- act(gate) * up on two tensors
# The gated ops above read the two halves of one tensor; a gated MLP (LlamaMLP: act_fn(gate_proj(x)) * up_proj(x))
# has them as two tensors. The same kernels read them through their own pointers and strides.


def _act_mul_fwd_impl(gate: Tensor, up: Tensor, op: str, eager: bool) -> Tensor:
    """``act(gate) * up`` (op: a gated op of ``OPS``, its activation on gate): contiguous, gate's shape and dtype."""
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() > 0:
        g, u, y = _as_1d(gate, up, out)
        _launch(_act_fwd_kernel, OPS[op], eager, 0.0, g, g.shape[-1], (g, u, y), (g, u, y))
    return out


EMPTY = object()  # act_mul_plan of an empty output: nothing to launch


def act_mul_plan(gate: Tensor, up: Tensor, op: str, eager: bool):
    """The pinned launch (:class:`FixedLaunch`) of ``_act_mul_fwd_impl`` for a validated call, ``EMPTY`` for an
    empty output, or None for a layout that takes several launches (the general path serves it). A function of both
    inputs' shapes, strides, dtype, device and 16-byte alignment and the arguments: callers keep it per such
    signature and run it with :func:`act_mul_infer`."""
    if gate.numel() == 0:
        return EMPTY
    g, u = _as_1d(gate, up)
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    run = _cached_plan(_act_fwd_kernel, OPS[op], eager, 0.0, g, g.shape[-1], (g, u, y))
    return None if run is _SPLIT else run.pinned()


def act_mul_infer(run, gate: Tensor, up: Tensor) -> Tensor:
    """``_act_mul_fwd_impl`` of a call whose :func:`act_mul_plan` is ``run`` (the same output, one launch)."""
    out = torch.empty_like(gate) if gate.is_contiguous() else torch.empty(gate.shape, dtype=gate.dtype,
                                                                          device=gate.device)
    if run is not EMPTY and not run.at((gate.data_ptr(), up.data_ptr(), out.data_ptr())):
        run(_as_1d(gate, up, out))
    return out


_act_mul_fwd = torch.library.custom_op(add_op_namespace_prefix("act_mul_fwd"), _act_mul_fwd_impl, mutates_args=())


@_act_mul_fwd.register_fake
def _(gate, up, op, eager):
    return gate.new_empty(gate.shape)


def _act_mul_bwd_impl(dy: Tensor, gate: Tensor, up: Tensor, op: str, eager: bool) -> Tuple[Tensor, Tensor]:
    """Gradients of ``act(gate) * up`` with respect to gate and up: contiguous, gate's shape and dtype."""
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if dy.numel() > 0:
        dy1, g, u, dg, du = _as_1d(dy, gate, up, dgate, dup)
        _launch(_act_bwd_kernel, OPS[op], eager, 0.0, g, g.shape[-1], _bwd_lead(dy1, g, u, dg), (dy1, g, u, dg, du))
    return dgate, dup


_act_mul_bwd = torch.library.custom_op(add_op_namespace_prefix("act_mul_bwd"), _act_mul_bwd_impl, mutates_args=())


@_act_mul_bwd.register_fake
def _(dy, gate, up, op, eager):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _act_mul_bwd_setup_context(ctx, inputs, output):
    dy, gate, up, op, eager = inputs
    ctx.save_for_backward(dy, gate, up)
    ctx.act = OPS[op].act


def _act_mul_bwd_backward(ctx, ddgate, ddup):
    """The gradients of (dgate, dup) with respect to dy, gate and up: ``_gated_grads`` differentiated in fp32."""
    dy, gate, up = ctx.saved_tensors
    grads = fp32_vjp(lambda a, b, c: _gated_grads(a, b, c, ctx.act, 0.0), (dy, gate, up), (ddgate, ddup))
    return *grads, None, None


_ACT_MUL_BWD_AUTOGRAD = eager_autograd(_act_mul_bwd, _act_mul_bwd_impl, _act_mul_bwd_setup_context,
                                       _act_mul_bwd_backward)


def _act_mul_setup_context(ctx, inputs, output):
    gate, up, op, eager = inputs
    ctx.save_for_backward(gate, up)
    ctx.op, ctx.eager = op, eager


def _act_mul_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = call_op(_act_mul_bwd, _act_mul_bwd_impl, dy, gate, up, ctx.op, ctx.eager,
                         autograd=_ACT_MUL_BWD_AUTOGRAD)
    return dgate, dup, None, None


_ACT_MUL_AUTOGRAD = eager_autograd(_act_mul_fwd, _act_mul_fwd_impl, _act_mul_setup_context, _act_mul_backward)


def act_mul_forward(gate: Tensor, up: Tensor, op: str, eager: bool) -> Tensor:
    """``act(gate) * up`` with autograd (the op, or its implementation in plain eager code)."""
    return call_op(_act_mul_fwd, _act_mul_fwd_impl, gate, up, op, eager, autograd=_ACT_MUL_AUTOGRAD)
