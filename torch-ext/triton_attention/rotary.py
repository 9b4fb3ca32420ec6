"""Rotary position embedding (RoPE) in Triton: transformers' ``apply_rotary_pos_emb`` and diffusers' real-valued form.

Math, per element d of the last dim (size D, even), with partner p(d) and sign:

    half-split (transformers' rotate_half):  p(d) = d + D/2 (d < D/2) or d - D/2;  sign = -1 for d < D/2, else +1
    interleaved (diffusers Flux/Wan pairs):  p(d) = d xor 1;                       sign = -1 for even d, else +1
    out[d] = x[d] * cos[d] + sign * x[p(d)] * sin[d]

Rounding (``fp32_math``):
    False (transformers): ``q * cos + rotate_half(q) * sin`` evaluated as eager PyTorch does it, each
        product and the sum rounded to the promoted dtype of (x, cos, sin): bit-exact to the eager function.
    True (diffusers ``apply_rotary_emb``): products and sum in fp32, one rounding to x's dtype at the end.

Backward (the transpose of the rotation), in fp32 and rounded once:
    dx[d] = dy[d] * cos[d] - sign * dy[p(d)] * sin[p(d)] cos and sin get no gradient (they are buffers in every model
we serve); a cos/sin that requires grad is refused.
Second derivatives (``create_graph=True``): dx is linear in dy, so the backward op's own gradient is the rotation
itself, run by the forward op (fp32 math), differentiable again.

Addressing: x, cos, sin (expanded to x's shape: stride 0 where broadcast) and the output are
read/written through up to 4 dims of strides (64-bit offsets); nothing is copied. The output has the
strides of the eager expression (computed once per layout on the meta device), so the tensors that
follow (KV caches, SDPA) see the layout they see in the eager model.
"""

from __future__ import annotations

import functools
from typing import Tuple

import torch
import triton
import triton.language as tl

from ._device import cdiv, check_dense, check_flag, check_launch_device, is_interpreter, launch_options, next_power_of_2
from ._dispatch import call_op, eager_autograd, inference
from ._fastlaunch import FixedLaunch, Launch, PlanCache, meta_items
from ._ops import add_op_namespace_prefix
from ._rounding import round_to

Tensor = torch.Tensor
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# elements per program (rows x D): small tiles ran fastest on the H200 (512: 4 rows of 128)
ROPE_TILE = 512


@triton.jit
def _pair_offsets(BLOCK_H: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """[1, BLOCK_H, 2] element indices of the pairs (first, second) of a row: (2j, 2j + 1) or (j, j + D/2)."""
    j = tl.arange(0, BLOCK_H)[None, :, None]
    t = tl.arange(0, 2)[None, None, :]
    if INTERLEAVED:
        return 2 * j + t, (j < D // 2) & (t < 2)
    else:
        return j + t * (D // 2), (j < D // 2) & (t < 2)


@triton.jit
def _load_pairs(ptr, base, offs, stride, mask):
    """(first, second) elements of each pair, [BLOCK_R, BLOCK_H] fp32 each (one vector load of the row)."""
    v = tl.load(ptr + base[:, None, None] + offs.to(tl.int64) * stride, mask=mask, other=0.0).to(tl.float32)
    return tl.split(v)


@triton.jit
def _rope_rows(
    X, C, S, O, pid, n_rows, R1, R2,
    sx0, sx1, sx2, sxd, sc0, sc1, sc2, scd, ss0, ss1, ss2, ssd, so0, so1, so2, sod,
    D: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND_EACH: tl.constexpr, INVERSE: tl.constexpr,
    ROWS64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """Rows [pid * BLOCK_R, + BLOCK_R) of x (see ``_rope_kernel``'s arguments)."""
    # Each row is read once as [D/2, 2] pairs (first, second) and split, so every load is a vector load.
    # Bytes: read x, cos, sin; write out. H200 (Flux q, 56.6 MB): 4 rows x 128 per program, 2 warps: 19 us
    # (2954 GB/s); 32 rows per program with a second gather load of the partners: 79 us. The row split divides
    # in 32 bits where it can.
    if ROWS64:
        rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    else:
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    i2 = (rows % R2).to(tl.int64)
    rest = rows // R2
    i1 = (rest % R1).to(tl.int64)
    i0 = (rest // R1).to(tl.int64)
    offs, pair_ok = _pair_offsets(BLOCK_H, D, INTERLEAVED)
    ok = row_ok[:, None, None] & pair_ok
    xa, xb = _load_pairs(X, i0 * sx0 + i1 * sx1 + i2 * sx2, offs, sxd, ok)
    ca, cb = _load_pairs(C, i0 * sc0 + i1 * sc1 + i2 * sc2, offs, scd, ok)
    sa, sb = _load_pairs(S, i0 * ss0 + i1 * ss1 + i2 * ss2, offs, ssd, ok)
    OUT: tl.constexpr = O.dtype.element_ty
    if INVERSE:
        # dx[d] = dy[d] cos[d] - sign(d) dy[p(d)] sin[p(d)], sign = -1 for the first of a pair
        ya = xa * ca + xb * sb
        yb = xb * cb - xa * sa
    else:
        # out[d] = x[d] cos[d] + sign(d) x[p(d)] sin[d]
        a1 = xa * ca
        b1 = xb * sa
        a2 = xb * cb
        b2 = xa * sb
        if ROUND_EACH:
            a1 = round_to(a1, OUT)
            b1 = round_to(b1, OUT)
            a2 = round_to(a2, OUT)
            b2 = round_to(b2, OUT)
        ya = a1 - b1
        yb = a2 + b2
    y = round_to(tl.join(ya, yb), OUT)
    tl.store(O + (i0 * so0 + i1 * so1 + i2 * so2)[:, None, None] + offs.to(tl.int64) * sod, y.to(OUT), mask=ok)


@triton.jit
def _rope_kernel(
    X, C, S, O,
    n_rows, R1, R2,
    sx0, sx1, sx2, sxd,
    sc0, sc1, sc2, scd,
    ss0, ss1, ss2, ssd,
    so0, so1, so2, sod,
    D: tl.constexpr,
    INTERLEAVED: tl.constexpr,  # pairs (2j, 2j+1) instead of (j, j + D/2)
    ROUND_EACH: tl.constexpr,  # round each product and the sum to the output dtype (eager transformers order)
    INVERSE: tl.constexpr,  # the transpose (backward)
    ROWS64: tl.constexpr,  # row indices need 64 bits (n_rows + BLOCK_R > 2^31 - 1)
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # One program per BLOCK_R rows of D elements of x ([R0, R1, R2, D] through strides; cos / sin expanded to it).
    _rope_rows(X, C, S, O, tl.program_id(0), n_rows, R1, R2, sx0, sx1, sx2, sxd, sc0, sc1, sc2, scd,
               ss0, ss1, ss2, ssd, so0, so1, so2, sod, D, INTERLEAVED, ROUND_EACH, INVERSE, ROWS64, BLOCK_R, BLOCK_H)


@triton.jit
def _rope_pair_kernel(
    X, C, S, O, X2, O2,
    first_programs,
    n_rows, R1, R2, sx0, sx1, sx2, sxd, sc0, sc1, sc2, scd, ss0, ss1, ss2, ssd, so0, so1, so2, sod,
    n_rows2, R1b, R2b, sx0b, sx1b, sx2b, sxdb, sc0b, sc1b, sc2b, scdb, ss0b, ss1b, ss2b, ssdb, so0b, so1b, so2b, sodb,
    D: tl.constexpr, INTERLEAVED: tl.constexpr, ROUND_EACH: tl.constexpr, INVERSE: tl.constexpr,
    ROWS64: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # Two tensors of one head dim in one launch (q and k of apply_rotary_pos_emb, one launch less per layer): the
    # first ``first_programs`` programs rotate X into O as _rope_kernel does, the rest X2 into O2, with the same
    # cos and sin (their strides expanded to each tensor's shape).
    pid = tl.program_id(0)
    if pid < first_programs:
        _rope_rows(X, C, S, O, pid, n_rows, R1, R2, sx0, sx1, sx2, sxd, sc0, sc1, sc2, scd,
                   ss0, ss1, ss2, ssd, so0, so1, so2, sod, D, INTERLEAVED, ROUND_EACH, INVERSE, ROWS64, BLOCK_R,
                   BLOCK_H)
    else:
        _rope_rows(X2, C, S, O2, pid - first_programs, n_rows2, R1b, R2b, sx0b, sx1b, sx2b, sxdb, sc0b, sc1b, sc2b,
                   scdb, ss0b, ss1b, ss2b, ssdb, so0b, so1b, so2b, sodb, D, INTERLEAVED, ROUND_EACH, INVERSE, ROWS64,
                   BLOCK_R, BLOCK_H)


def _as4(t: Tensor) -> Tensor:
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _strides(t: Tensor) -> Tuple[int, int, int, int]:
    return tuple(t.stride(i) if t.shape[i] > 1 else 0 for i in range(4))


def _eager_layout(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` as eager PyTorch (transformers) evaluates it: on meta tensors, an empty
    tensor of the shape, dtype and strides eager gives; on real tensors, the values too (:func:`rotary_reference`).

    The strides follow TensorIterator's layout rule (the output takes the memory order of the
    operands); consumers such as SDPA can choose other kernels for other strides, so matching them
    keeps a swapped model's later results bit-identical too. Works on meta and fake tensors.
    """
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def _meta(t: Tensor) -> Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _rope_launch(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, fp32_math: bool, inverse: bool,
                 out_dtype: torch.dtype) -> Tensor:
    return _rope_run(_cached_rope_plan(x, cos, sin, out_dtype, interleaved, fp32_math, inverse), x, cos, sin)


def _cached_rope_plan(x: Tensor, cos: Tensor, sin: Tensor, out_dtype: torch.dtype, interleaved: bool,
                      fp32_math: bool, inverse: bool) -> tuple:
    """:func:`_rope_plan`, kept in ``_PLANS``: everything but the pointers follows from shapes, strides, dtypes
    and flags, one plan per layout."""
    key = (x.shape, x.stride(), cos.shape, cos.stride(), sin.shape, sin.stride(), x.dtype, out_dtype, x.device,
           interleaved, fp32_math, inverse)
    plan = _PLANS.get(key)
    return plan if plan is not None else _PLANS.add(key, _rope_plan(x, cos, sin, out_dtype, interleaved, fp32_math,
                                                                     inverse))


def _rope_run(plan: tuple, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The output of one call whose :func:`_rope_plan` is ``plan``; ``cos``/``sin`` may be any views that
    start where the plan's ones do (the kernel takes their data pointers)."""
    layout, out_dtype, run = plan
    out = _new_output(x, layout, out_dtype)
    if run is not None:
        # the 4-d views of _rope_plan start at the same addresses: the tensors themselves are the pointers
        run((x, cos, sin, out))
    return out


def _new_output(x: Tensor, layout, out_dtype: torch.dtype) -> Tensor:
    """An empty output for x of a plan's ``layout`` (see :func:`_rope_plan`) and dtype."""
    if layout is None:  # x's own layout
        return torch.empty_like(x, dtype=out_dtype)  # half the host time of torch.empty_strided
    if type(layout) is tuple:
        return torch.empty_strided(x.shape, layout, dtype=out_dtype, device=x.device)
    return torch.empty_like(x, dtype=out_dtype, memory_format=layout)


_PLANS = PlanCache()


def _rope_plan(x: Tensor, cos: Tensor, sin: Tensor, out_dtype: torch.dtype, interleaved: bool, fp32_math: bool,
               inverse: bool):
    """(output layout, out_dtype, the :class:`Launch` or None when x is empty) of one call. The layout is
    None for x's own strides, ``torch.contiguous_format`` for the contiguous ones (``empty_like`` gives
    either with less host time than ``empty_strided``), else the strides."""
    strides = _eager_layout(_meta(x), _meta(cos), _meta(sin)).stride()
    if x.is_contiguous() and strides == x.stride():  # then torch.empty_like(x) gives these strides
        layout = None
    elif strides == torch.empty(x.shape, device="meta").stride():
        layout = torch.contiguous_format
    else:
        layout = strides
    if x.numel() == 0:
        return layout, out_dtype, None
    check_launch_device(x, _rope_kernel)
    out = torch.empty_strided(x.shape, strides, dtype=out_dtype, device="meta")
    x4, o4 = _as4(x), _as4(out)
    c4, s4 = _as4(cos).expand(x4.shape), _as4(sin).expand(x4.shape)
    R0, R1, R2, D = x4.shape
    n_rows = R0 * R1 * R2
    BLOCK_H = next_power_of_2(D // 2)
    BLOCK_R = max(1, min(64, ROPE_TILE // (2 * BLOCK_H)))
    interp = is_interpreter(_rope_kernel)
    scalars = (n_rows, R1, R2, *_strides(x4)[:3], x4.stride(3), *_strides(c4)[:3], c4.stride(3),
               *_strides(s4)[:3], s4.stride(3), *o4.stride())
    meta = meta_items(D=D, INTERLEAVED=interleaved, ROUND_EACH=not fp32_math and not inverse, INVERSE=inverse,
                      ROWS64=n_rows + BLOCK_R > 2**31 - 1, BLOCK_R=BLOCK_R, BLOCK_H=BLOCK_H,
                      **({} if interp else {"num_warps": 2 if 2 * BLOCK_H <= 1024 else 4}),
                      **launch_options(_rope_kernel))
    return layout, out_dtype, Launch(_rope_kernel, (cdiv(n_rows, BLOCK_R),), meta, scalars, x.device)


def _out_dtype(x: Tensor, cos: Tensor, sin: Tensor, fp32_math: bool) -> torch.dtype:
    return x.dtype if fp32_math else torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _rope_impl(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, fp32_math: bool) -> Tensor:
    return _rope_launch(x, cos, sin, interleaved, fp32_math, False, _out_dtype(x, cos, sin, fp32_math))


_rope = torch.library.custom_op(add_op_namespace_prefix("rotary"), _rope_impl, mutates_args=())


@_rope.register_fake
def _(x, cos, sin, interleaved, fp32_math):
    return torch.empty_strided(x.shape, _eager_layout(x, cos, sin).stride(), dtype=_out_dtype(x, cos, sin, fp32_math),
                               device=x.device)


def _rope_bwd_impl(dy: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, dx_dtype: torch.dtype) -> Tensor:
    return _rope_launch(dy, cos, sin, interleaved, True, True, dx_dtype)


_rope_bwd = torch.library.custom_op(add_op_namespace_prefix("rotary_bwd"), _rope_bwd_impl, mutates_args=())


@_rope_bwd.register_fake
def _(dy, cos, sin, interleaved, dx_dtype):
    return torch.empty_strided(dy.shape, _eager_layout(dy, cos, sin).stride(), dtype=dx_dtype, device=dy.device)


def _setup(ctx, inputs, output):
    """Both ops' (the rotation's and its backward's): the input rotated (x, or dy) first, then cos, sin and
    interleaved; the gradient of either is the other op applied to the upstream gradient, in that input's dtype."""
    t, cos, sin, interleaved, _ = inputs
    ctx.save_for_backward(cos, sin)
    ctx.interleaved = interleaved
    ctx.in_dtype = t.dtype


def _bwd_bwd(ctx, ddx):
    """The gradient of dx with respect to dy (a second derivative through the rotation): dx is linear in dy, the
    transposed rotation, so its gradient is the rotation itself (fp32 math, one rounding to dy's dtype, which holds
    ddx's exactly: the promoted dtype of x, cos and sin, or x's)."""
    cos, sin = ctx.saved_tensors
    ddy = call_op(_rope, _rope_impl, ddx.to(ctx.in_dtype), cos, sin, ctx.interleaved, True, autograd=_ROPE_AUTOGRAD)
    return ddy, None, None, None, None


_ROPE_BWD_AUTOGRAD = eager_autograd(_rope_bwd, _rope_bwd_impl, _setup, _bwd_bwd)


def _bwd(ctx, dy):
    cos, sin = ctx.saved_tensors
    return call_op(_rope_bwd, _rope_bwd_impl, dy, cos, sin, ctx.interleaved, ctx.in_dtype,
                   autograd=_ROPE_BWD_AUTOGRAD), None, None, None, None


_ROPE_AUTOGRAD = eager_autograd(_rope, _rope_impl, _setup, _bwd)


def _check(name: str, x: Tensor, cos: Tensor, sin: Tensor) -> None:
    for n, t in ((name, x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(n, t)
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{n} must be torch.float16, torch.bfloat16 or torch.float32, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{n} is on {t.device} but {name} is on {x.device}: all tensors must be on one device")
    if x.dim() < 1 or x.dim() > 4:
        raise ValueError(f"{name} must have 1 to 4 dims, got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"the last dim of {name} (the rotary dim) must be even, got {x.shape[-1]}")
    for n, t in (("cos", cos), ("sin", sin)):
        if not _broadcasts_to(t.shape, x.shape):
            raise ValueError(f"{n} of shape {tuple(t.shape)} does not broadcast to {name}'s shape {tuple(x.shape)}")
        if torch.is_grad_enabled() and t.requires_grad:
            raise ValueError(f"{n} requires grad, but triton-attention's rotary embedding gives no gradient to "
                             f"cos/sin; detach them (they are buffers in transformers and diffusers models)")


def _check_unsqueeze_dim(cos: Tensor, unsqueeze_dim) -> None:
    if type(unsqueeze_dim) is not int:
        raise TypeError(f"unsqueeze_dim must be an int, got {type(unsqueeze_dim).__name__}")
    if not -cos.dim() - 1 <= unsqueeze_dim <= cos.dim():
        raise IndexError(f"unsqueeze_dim must be in [{-cos.dim() - 1}, {cos.dim()}] for cos of {cos.dim()} dims, "
                         f"got {unsqueeze_dim}")


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``shape`` broadcasts to exactly ``target``: cached for plain sizes (host time of every call);
    symbolic sizes (``torch.export``, ``make_fx``: unhashable SymInts) and traced calls are not cached."""
    if torch.compiler.is_compiling():  # dynamo would warn about tracing into an lru_cache
        return _broadcasts(shape, target)
    try:
        return _broadcasts_cached(shape, target)
    except TypeError:  # a SymInt in a shape
        return _broadcasts(shape, target)


def _broadcasts(shape: torch.Size, target: torch.Size) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


_broadcasts_cached = functools.lru_cache(maxsize=1024)(_broadcasts)


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool = False,
                     fp32_math: bool = False) -> Tensor:
    """Applies rotary position embedding to ``x``: ``x * cos + rotate(x) * sin``.

    Args:
        x: [..., D] (1 to 4 dims, D even), fp16/bf16/fp32, any strides (read in place).
        cos, sin: broadcastable to x's shape (e.g. [B, 1, S, D] for x [B, H, S, D], or [S, 1, D] for
            [B, S, H, D]); fp16/bf16/fp32. No gradient flows to them.
        interleaved: rotate pairs (2j, 2j+1) as diffusers' ``apply_rotary_emb(use_real_unbind_dim=-1)``
            (Flux, Wan); default: halves (j, j + D/2) as transformers' ``rotate_half``.
        fp32_math: compute in fp32 and round once to x's dtype (diffusers); default: round every product
            and the sum to the promoted dtype of (x, cos, sin), as the eager transformers expression.

    Returns:
        A new tensor of x's shape (never a view of x) with the strides eager PyTorch gives
        ``x * cos + rotate_half(x) * sin`` (x's memory order, as TensorIterator picks it); dtype: x's
        with ``fp32_math``, else the promoted dtype. Differentiable in x, to any order (``create_graph=True``).

    Raises:
        TypeError: unsupported dtypes, non-tensors, a sparse or nested tensor, an ``interleaved`` or
        ``fp32_math`` that is not a bool. ValueError: odd D, x of 0 or more than 4 dims, cos/sin on another
        device, cos/sin that do not broadcast, cos/sin that require grad (in grad mode). RuntimeError: CPU
        tensors without TRITON_INTERPRET=1.

    Source: Su et al., "RoFormer" (2021); the formulas of transformers' ``apply_rotary_pos_emb`` and
    diffusers' ``apply_rotary_emb``.
    """
    check_flag("interleaved", interleaved)
    check_flag("fp32_math", fp32_math)
    if inference((x, cos, sin), 3):
        # plain eager inference: one validated plan per call signature, 16-byte alignment included (its launch
        # is pinned: host time of small calls)
        try:
            key = (x.dtype, x.shape, x.stride(), x.device, cos.dtype, cos.shape, cos.stride(), cos.device,
                   sin.dtype, sin.shape, sin.stride(), sin.device, interleaved, fp32_math,
                   x.data_ptr() & 15, cos.data_ptr() & 15, sin.data_ptr() & 15)
        except RuntimeError:  # a sparse or nested tensor (no strides or storage): the checks below name it
            pass
        else:
            plan = _INFER_PLANS.get(key)
            if plan is None:
                plan = _INFER_PLANS.add(key, _pinned(_infer_plan("x", x, cos, sin, interleaved, fp32_math)))
            return _rope_run(plan, x, cos, sin)
    _check("x", x, cos, sin)
    return call_op(_rope, _rope_impl, x, cos, sin, interleaved, fp32_math, autograd=_ROPE_AUTOGRAD)


_INFER_PLANS = PlanCache()


def _infer_plan(name: str, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, fp32_math: bool) -> tuple:
    """Validates an inference call (raising as :func:`rotary_embedding` does) and returns its :func:`_rope_plan`."""
    _check(name, x, cos, sin)
    return _cached_rope_plan(x, cos, sin, _out_dtype(x, cos, sin, fp32_math), interleaved, fp32_math, False)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb``, bit-exact: ``(q * cos + rotate_half(q) * sin, same for k)``.

    Args:
        q: [B, Hq, S, D] (or any layout where ``cos.unsqueeze(unsqueeze_dim)`` broadcasts), D even.
        k: [B, Hk, S, D]; Hk may differ from Hq (GQA/MQA, one KV head).
        cos, sin: [B, S, D] (transformers' rotary module output), unsqueezed at ``unsqueeze_dim``.
        unsqueeze_dim: where cos/sin get their broadcast dim (1 for [B, H, S, D], 2 for [B, S, H, D]).

    Returns:
        (q_embed, k_embed): new tensors (inputs are never modified or aliased), dtype promoted as eager.
        Differentiable in q and k, to any order (``create_graph=True``).

    Raises: as :func:`rotary_embedding` (naming q or k for x); TypeError for an ``unsqueeze_dim`` that is not
    an int; IndexError (the type ``cos.unsqueeze`` raises) for one out of range for cos.
    """
    if type(unsqueeze_dim) is int and inference((q, k, cos, sin), 4):
        # plain eager inference: one plan per call signature (16-byte alignment included: its launch is pinned
        # and takes the addresses); cos/sin are passed as they are (their unsqueezed views start at the same
        # addresses), which saves two views per call
        try:
            qp, kp, cp, sp = q.data_ptr(), k.data_ptr(), cos.data_ptr(), sin.data_ptr()
            key = (q.dtype, q.shape, q.stride(), q.device, k.dtype, k.shape, k.stride(), k.device, cos.dtype, cos.shape,
                   cos.stride(), cos.device, sin.dtype, sin.shape, sin.stride(), sin.device, unsqueeze_dim,
                   qp & 15, kp & 15, cp & 15, sp & 15)
        except RuntimeError:  # a sparse or nested tensor (no strides or storage): the checks below name it
            pass
        else:
            plan = _PAIR_PLANS.get(key)
            if plan is None:
                _check_unsqueeze_dim(cos, unsqueeze_dim)
                plan = _PAIR_PLANS.add(key, _pair_plan(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)))
            q_plan, k_plan, launch = plan
            if launch is None:
                return _rope_run(q_plan, q, cos, sin), _rope_run(k_plan, k, cos, sin)
            q_out, k_out = _new_output(q, *q_plan), _new_output(k, *k_plan)
            if not launch.at((qp, cp, sp, q_out.data_ptr(), kp, k_out.data_ptr())):
                launch((q, cos, sin, q_out, k, k_out))
            return q_out, k_out
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(name, t)
    _check_unsqueeze_dim(cos, unsqueeze_dim)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    _check("q", q, cos, sin)  # errors name q and k (rotary_embedding's name x)
    _check("k", k, cos, sin)
    return rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)


_PAIR_PLANS = PlanCache()


def kernel_takes(q, k, cos, sin) -> bool:
    """Whether :func:`apply_rotary_pos_emb` can run these tensors in its kernel: all tensors of fp16 / bf16 / fp32
    on a device the kernel runs on (a CPU tensor only under the interpreter), cos / sin not requiring grad in grad
    mode. False for any of those (the caller may compute :func:`rotary_reference` instead); True for anything
    else, so bad input (non-tensors, odd D, shapes that do not broadcast) reaches the checks that name it."""
    tensors = (q, k, cos, sin)
    if not all(isinstance(t, Tensor) for t in tensors):
        return True
    if any(t.dtype not in SUPPORTED_DTYPES for t in tensors):
        return False
    if any(t.device.type == "cpu" for t in tensors) and not is_interpreter(_rope_kernel):
        return False
    return not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))


def rotary_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb`` in PyTorch ops, the same ops in the same order (so the same bits,
    for any dtype and device, with autograd to cos / sin): ``x * cos + rotate_half(x) * sin``, where
    ``rotate_half(x) = cat(-x2, x1)`` of x's halves on the last dim (RoFormer, Su et al. 2021)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return _eager_layout(q, cos, sin), _eager_layout(k, cos, sin)


def rotary_or_reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`apply_rotary_pos_emb` where the kernel takes the tensors, else :func:`rotary_reference` (the same
    bits): another dtype such as float64, CPU tensors of a GPU build, cos / sin that require grad. What the kernel
    refused is examined only when it refuses (:func:`kernel_takes`), so its calls pay nothing; other bad input
    raises as :func:`apply_rotary_pos_emb`."""
    try:
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    except (TypeError, ValueError, RuntimeError):
        if kernel_takes(q, k, cos, sin):
            raise
        return rotary_reference(q, k, cos, sin, unsqueeze_dim)


def _pinned(plan: tuple) -> tuple:
    """A :func:`_rope_plan` whose launch is pinned (``Launch.pinned``) for a caller whose key fixes alignment."""
    layout, out_dtype, run = plan
    return layout, out_dtype, None if run is None else run.pinned()


def _pair_plan(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple:
    """Validates an inference call of :func:`apply_rotary_pos_emb` (cos / sin unsqueezed) and returns ``((q's
    output layout, dtype), (k's), launch)``: ``launch((q, cos, sin, q_out, k, k_out))`` rotates both in one
    ``_rope_pair_kernel`` launch (cos and sin passed as they are: their unsqueezed views start at the same
    addresses). Where one of them is empty or their tiles differ (q and k of other head dims, which a cos / sin
    broadcast in the last dim allows), launch is None and the two :func:`_rope_plan` s (pinned) replace the
    layouts."""
    q_layout, q_dtype, q_run = _infer_plan("q", q, cos, sin, False, False)
    k_layout, k_dtype, k_run = _infer_plan("k", k, cos, sin, False, False)
    separate = _pinned((q_layout, q_dtype, q_run)), _pinned((k_layout, k_dtype, k_run)), None
    if q_run is None or k_run is None:
        return separate
    meta, k_meta = dict(q_run.meta), dict(k_run.meta)
    rows64 = meta.pop("ROWS64") | k_meta.pop("ROWS64")  # 64-bit rows where either needs them
    if meta != k_meta:  # other tiles: q and k of other head dims (cos / sin broadcast in the last dim)
        return separate
    meta["ROWS64"] = rows64
    meta.update(launch_options(_rope_pair_kernel))  # fp fusion off, as _rope_plan's (the products round each)
    first = q_run.grid[0]
    launch = FixedLaunch(_rope_pair_kernel, (first + k_run.grid[0],), meta_items(**meta), q.device,
                         (first, *q_run.fixed, *k_run.fixed))
    return (q_layout, q_dtype), (k_layout, k_dtype), launch
