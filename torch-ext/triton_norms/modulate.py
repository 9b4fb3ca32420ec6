"""Norm + adaptive modulation in one kernel: ``y = norm(x) * (1 + scale) + shift`` (AdaLayerNorm).

Diffusion transformers (Flux, SD3/SD3.5, Wan, DiT, PixArt) condition each block on the timestep
through a per-sample ``scale`` and ``shift`` applied right after a LayerNorm (or RMSNorm) without
affine weights (diffusers ``AdaLayerNormZero``, ``AdaLayerNormZeroSingle``, ``AdaLayerNormContinuous``).
Eagerly that is four passes over the activations (norm, ``1 + scale``, multiply, add); here it is
one read of x and one write of y.

Math, per row x (N elements), everything in fp32:

    mean = sum(x) / N                       (0 for ``norm="rms"``)
    rstd = 1 / sqrt(sum((x - mean)^2) / N + eps)
    xhat = (x - mean) * rstd
    xn   = xhat * weight + bias             (weight / bias optional, per column)
    y    = xn * (1 + scale[b]) + shift[b]   (scale / shift per sample b and column)

Backward (per row, then summed over the rows of a sample for scale/shift and over all rows for
weight/bias): ``dshift = sum dy``, ``dscale = sum dy * xn``, ``g = dy * (1 + scale)``,
``dweight = sum g * xhat``, ``dbias = sum g``, and with ``gh = g * weight``:
``dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))`` (LayerNorm; RMSNorm drops ``mean(gh)``).
Second derivatives (``create_graph=True``): the backward op's own gradient is the same math as fp32 PyTorch
ops (``_bwd_model``, mean and rstd recomputed from x), differentiated by ``torch.func.vjp``.
Source: Ba et al. (2016) LayerNorm, Zhang & Sennrich (2019) RMSNorm, Peebles & Xie (2023) adaLN.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ._common import check_eps, check_float_tensor, column_sum, normalized_model, vector
from ._device import MAX_GRID_YZ, cdiv, check_flag, check_launch_device, device_warp_size, is_interpreter, launch_options, next_power_of_2
from ._dispatch import call_op, eager_autograd, fp32_vjp
from ._fastlaunch import launch, meta_items
from ._ops import add_op_namespace_prefix
from ._rounding import round_dtype, round_to

Tensor = torch.Tensor

MAX_N = 32768  # one row is held in registers


@triton.jit
def per_sample_row(ptr, b, stride_b, stride_n, offs, mask):
    """Sample b's row of a per-sample, per-column tensor (scale, shift, gate), fp32, 0 past N."""
    return tl.load(ptr + b * stride_b + offs.to(tl.int64) * stride_n, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _modulate_fwd_kernel(X, SCALE, SHIFT, W, B_, Y, MEAN, RSTD,
                         S, N, sxb, sxs, scb, scn, shb, shn, eps,
                         RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, SAVE: tl.constexpr,
                         ROUND_X: tl.constexpr, ROUND_S: tl.constexpr, ROUND_Y: tl.constexpr,
                         ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program: ROWS consecutive rows of sample b (scale / shift loaded once)
    pid = tl.program_id(0).to(tl.int64)  # int64: S may pass 2^31
    b = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    scale = per_sample_row(SCALE, b, scb, scn, offs, mask)
    shift = per_sample_row(SHIFT, b, shb, shn, offs, mask)
    one_plus = round_to(1.0 + scale, ROUND_S)  # eager: (1 + scale) in scale's dtype
    if HAS_W:
        w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        bb = tl.load(B_ + offs, mask=mask, other=0.0).to(tl.float32)
    for r in range(ROWS):
        s = pid * ROWS + r
        if s < S:
            x = tl.load(X + b * sxb + s * sxs + offs, mask=mask, other=0.0).to(tl.float32)
            if RMS:
                mean = 0.0
                xc = x
            else:
                mean = tl.sum(x, axis=0) / N
                xc = tl.where(mask, x - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
            xn = xc * rstd
            if HAS_W:
                xn = xn * w
            if HAS_B:
                xn = xn + bb
            xn = round_to(xn, ROUND_X)  # eager: the norm's output in x's dtype
            y = round_to(xn * one_plus, ROUND_Y) + shift  # eager: product, then sum, each rounded
            row = b * S + s
            tl.store(Y + row * N + offs, round_to(y, Y.dtype.element_ty).to(Y.dtype.element_ty), mask=mask)
            if SAVE:
                tl.store(MEAN + row, mean)
                tl.store(RSTD + row, rstd)


@triton.jit
def _modulate_bwd_kernel(DY, X, SCALE, W, B_, MEAN, RSTD, DX, DSC, DSH, DW, DB,
                         S, N, rows_per_program, P, sxb, sxs, scb, scn,
                         RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                         NEED_W: tl.constexpr, NEED_B: tl.constexpr, BLOCK_N: tl.constexpr):
    # one program: rows [pid * rows_per_program, ...) of sample b; partial column sums to [B, P, N]
    pid = tl.program_id(0).to(tl.int64)  # int64: S may pass 2^31
    b = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    one_plus = 1.0 + per_sample_row(SCALE, b, scb, scn, offs, mask)
    if HAS_W:
        w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        bb = tl.load(B_ + offs, mask=mask, other=0.0).to(tl.float32)
    dsc = tl.zeros([BLOCK_N], dtype=tl.float32)
    dsh = tl.zeros([BLOCK_N], dtype=tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    lo = pid * rows_per_program
    hi = tl.minimum(lo + rows_per_program, S)
    for s in range(lo, hi):
        row = b * S + s
        x = tl.load(X + b * sxb + s * sxs + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        xn = xhat
        if HAS_W:
            xn = xn * w
        if HAS_B:
            xn = xn + bb
        dsh += dy
        dsc += dy * xn
        g = dy * one_plus
        if NEED_W:
            dw += g * xhat
        if NEED_B:
            db += g
        if HAS_W:
            g = g * w
        c2 = tl.sum(g * xhat, axis=0) / N
        if RMS:
            dx = (g - xhat * c2) * rstd
        else:
            c1 = tl.sum(g, axis=0) / N
            dx = (g - c1 - xhat * c2) * rstd
        tl.store(DX + row * N + offs, round_to(dx, DX.dtype.element_ty).to(DX.dtype.element_ty), mask=mask)
    part = (b * P + pid) * N + offs
    tl.store(DSC + part, dsc, mask=mask)
    tl.store(DSH + part, dsh, mask=mask)
    if NEED_W:
        tl.store(DW + part, dw, mask=mask)
    if NEED_B:
        tl.store(DB + part, db, mask=mask)


# ----------------------------------------------------------------------------- host side



def _rows(x: Tensor):
    """(x as [B, S, N] with unit column stride (a view where possible), its row strides)."""
    if x.stride(-1) != 1:
        x = x.contiguous()  # only for column-strided inputs (documented)
    return x, x.stride(0), x.stride(1)


def _vec2(t: Tensor):
    """(t, strides over (sample, column)) for t of shape [N], [B|1, N] or [B|1, 1, N]."""
    sb = t.stride(0) if t.dim() >= 2 and t.shape[0] > 1 else 0
    return t, sb, t.stride(-1)


@functools.lru_cache(maxsize=256)
def _meta(N: int, elem: int, warp: int, interp: bool):
    block = next_power_of_2(N)
    if interp:
        return block, 1, 2
    warps = max(1, min(16, block * elem // (64 * 8)))  # ~8 x 16-byte loads per thread
    warps = min(warps, 1024 // warp)
    return block, warps, 4


def _fwd(x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype, save):
    weight, bias = vector(weight), vector(bias)  # the kernels read them at unit stride
    xr, sxb, sxs = _rows(x)
    B, S, N = x.shape
    y = torch.empty((B, S, N), dtype=out_dtype, device=x.device)
    mean = torch.empty((B, S), dtype=torch.float32, device=x.device) if save else None
    rstd = torch.empty((B, S), dtype=torch.float32, device=x.device) if save else None
    if y.numel() == 0:
        return y, mean, rstd
    check_launch_device(x, _modulate_fwd_kernel)
    interp = is_interpreter(_modulate_fwd_kernel)
    block, warps, rows = _meta(N, x.element_size(), device_warp_size(x.device), interp)
    sc, scb, scn = _vec2(scale)
    sh, shb, shn = _vec2(shift)
    prod_dtype = torch.promote_types(x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype),
                                     scale.dtype)
    launch(_modulate_fwd_kernel, (cdiv(S, rows), B),
           (xr, sc, sh, weight, bias, y, mean, rstd, S, N, sxb, sxs, scb, scn, shb, shn, eps),
           meta_items(RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, SAVE=save,
                      ROUND_X=round_dtype(x.dtype) if eager_rounding else None,
                      ROUND_S=round_dtype(scale.dtype) if eager_rounding else None,
                      ROUND_Y=round_dtype(prod_dtype) if eager_rounding else None,
                      ROWS=rows, BLOCK_N=block, **({} if interp else {"num_warps": warps}),
                      **launch_options(_modulate_fwd_kernel, fp_fusion=True)), x.device)
    return y, mean, rstd


def _modulate_fwd_impl(x: Tensor, scale: Tensor, shift: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                       eps: float, rms: bool, eager_rounding: bool, out_dtype: torch.dtype
                       ) -> Tuple[Tensor, Tensor, Tensor]:
    return _fwd(x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype, True)


def _modulate_infer(x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype):
    return _fwd(x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype, False)


_modulate_fwd = torch.library.custom_op(add_op_namespace_prefix("norm_modulate_fwd"), _modulate_fwd_impl,
                                        mutates_args=())
"""The registered op (autograd, fake, compile); eager inference calls ``_modulate_infer`` directly."""


@_modulate_fwd.register_fake
def _(x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype):
    B, S, N = x.shape
    return (x.new_empty((B, S, N), dtype=out_dtype), x.new_empty((B, S), dtype=torch.float32),
            x.new_empty((B, S), dtype=torch.float32))


def _modulate_bwd_impl(dy: Tensor, x: Tensor, scale: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                       mean: Tensor, rstd: Tensor, rms: bool, need_w: bool, need_b: bool
                       ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dscale [B, N] fp32, dshift [B, N] fp32, dweight [N] fp32 or empty, dbias [N] fp32 or empty)."""
    weight, bias = vector(weight), vector(bias)  # the kernels read them at unit stride
    xr, sxb, sxs = _rows(x)
    B, S, N = x.shape
    dx = torch.empty((B, S, N), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        z = x.new_zeros((B, N), dtype=torch.float32)
        zn = x.new_zeros((N,), dtype=torch.float32)
        return dx, z, z.clone(), zn if need_w else x.new_empty(0), zn.clone() if need_b else x.new_empty(0)
    dy = dy.contiguous()
    check_launch_device(x, _modulate_bwd_kernel)
    interp = is_interpreter(_modulate_bwd_kernel)
    block, warps, _ = _meta(N, x.element_size(), device_warp_size(x.device), interp)
    if interp:
        per = max(1, cdiv(S, 2))
    else:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 64
        per = max(1, cdiv(S * B, 4 * sms))  # ~4 programs per SM, fewer partial rows to sum
    P = cdiv(S, per)
    part = lambda: torch.empty((B, P, N), dtype=torch.float32, device=x.device)  # noqa: E731
    dsc, dsh = part(), part()
    dw = part() if need_w else None
    db = part() if need_b else None
    sc, scb, scn = _vec2(scale)
    launch(_modulate_bwd_kernel, (P, B),
           (dy, xr, sc, weight, bias, mean, rstd, dx, dsc, dsh, dw, db, S, N, per, P, sxb, sxs, scb, scn),
           meta_items(RMS=rms, HAS_W=weight is not None, HAS_B=bias is not None, NEED_W=need_w, NEED_B=need_b,
                      BLOCK_N=block, **({} if interp else {"num_warps": warps}),
                      **launch_options(_modulate_bwd_kernel, fp_fusion=True)), x.device)
    return (dx, dsc.sum(1), dsh.sum(1), dw.sum((0, 1)) if need_w else x.new_empty(0),
            db.sum((0, 1)) if need_b else x.new_empty(0))


_modulate_bwd = torch.library.custom_op(add_op_namespace_prefix("norm_modulate_bwd"), _modulate_bwd_impl,
                                        mutates_args=())


@_modulate_bwd.register_fake
def _(dy, x, scale, weight, bias, mean, rstd, rms, need_w, need_b):
    B, S, N = x.shape
    f = lambda *s: x.new_empty(s, dtype=torch.float32)  # noqa: E731
    return (x.new_empty((B, S, N)), f(B, N), f(B, N), f(N) if need_w else x.new_empty(0),
            f(N) if need_b else x.new_empty(0))


def _bwd_model(dy: Tensor, x: Tensor, scale: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], rstd: Tensor,
               rms: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The backward kernel's (dx, dscale, dshift, dweight, dbias) (module docstring) as fp32 PyTorch ops,
    differentiable: the double backward's model, the statistics recomputed from x (``normalized_model``)."""
    xhat, rstd = normalized_model(x, rstd, rms)
    xn = xhat if weight is None else xhat * weight
    xn = xn if bias is None else xn + bias
    g = dy * (1 + scale.reshape(-1, 1, x.shape[-1]))  # scale per sample [B, 1, N] or shared [1, 1, N]
    gh = g if weight is None else g * weight
    centred = gh if rms else gh - gh.mean(-1, keepdim=True)
    dx = rstd * (centred - xhat * (gh * xhat).mean(-1, keepdim=True))
    return dx, (dy * xn).sum(1), dy.sum(1), column_sum(g * xhat), column_sum(g)


def _bwd_setup_context(ctx, inputs, output):
    dy, x, scale, weight, bias, _, rstd, rms, need_w, need_b = inputs
    ctx.save_for_backward(dy, x, scale, weight, bias, rstd)
    ctx.args = (rms, need_w, need_b)


def _bwd_backward(ctx, ddx, ddsc, ddsh, ddw, ddb):
    """The gradients of (dx, dscale, dshift, dweight, dbias) with respect to dy, x, scale, weight and bias (a second
    derivative through norm_modulate): ``_bwd_model`` differentiated in fp32."""
    dy, x, scale, weight, bias, rstd = ctx.saved_tensors
    rms, need_w, need_b = ctx.args
    grads = (ddx, ddsc, ddsh, ddw if need_w else None, ddb if need_b else None)
    ddy, dxx, dscale, dweight, dbias, _ = fp32_vjp(lambda *t: _bwd_model(*t, rms), (dy, x, scale, weight, bias, rstd),
                                                   grads)
    return ddy, dxx, dscale, dweight, dbias, None, None, None, None, None


_MODULATE_BWD_AUTOGRAD = eager_autograd(_modulate_bwd, _modulate_bwd_impl, _bwd_setup_context, _bwd_backward)


def _setup_context(ctx, inputs, output):
    x, scale, shift, weight, bias, eps, rms, eager_rounding, out_dtype = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, scale, weight, bias, mean, rstd)
    ctx.rms = rms
    ctx.meta = (scale.shape, scale.dtype, shift.shape, shift.dtype)
    ctx.mark_non_differentiable(mean, rstd)


def _backward(ctx, dy, dmean, drstd):
    x, scale, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_w = weight is not None and need[3]
    need_b = bias is not None and need[4]
    dx, dsc, dsh, dw, db = call_op(_modulate_bwd, _modulate_bwd_impl, dy, x, scale, weight, bias, mean, rstd,
                                   ctx.rms, need_w, need_b, autograd=_MODULATE_BWD_AUTOGRAD)
    sc_shape, sc_dtype, sh_shape, sh_dtype = ctx.meta
    B, N = dsc.shape
    as_param = lambda g, shape: g.sum_to_size(shape[:-1][:1] + (N,) if len(shape) >= 2 else (N,)  # noqa: E731
                                              ).reshape(shape)
    return (dx if need[0] else None,
            as_param(dsc, sc_shape).to(sc_dtype) if need[1] else None,
            as_param(dsh, sh_shape).to(sh_dtype) if need[2] else None,
            dw.to(weight.dtype) if need_w else None, db.to(bias.dtype) if need_b else None,
            None, None, None, None)


_MODULATE_AUTOGRAD = eager_autograd(_modulate_fwd, _modulate_fwd_impl, _setup_context, _backward)


def check_out_dtype(out_dtype) -> None:
    """An explicit ``out_dtype`` must be fp16, bf16 or fp32 (TypeError naming the argument)."""
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be None, torch.float16, torch.bfloat16 or torch.float32, got {out_dtype}")


def _check_vec(name: str, t: Tensor, x: Tensor) -> None:
    check_float_tensor(name, t)
    B, _, N = x.shape
    ok = t.shape[-1:] == (N,) and (
        t.dim() == 1 or (t.dim() == 2 and t.shape[0] in (1, B)) or (t.dim() == 3 and t.shape[0] in (1, B)
                                                                     and t.shape[1] == 1))
    if not ok:
        raise ValueError(f"{name} must have shape (N,), (B, N), (B, 1, N) or B = 1 there, with B = {B}, N = {N} "
                         f"for x of shape {tuple(x.shape)} (one value per sample and column), got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}: all tensors must be on one device")


def norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, weight: Optional[Tensor] = None,
                  bias: Optional[Tensor] = None, eps: float = 1e-6, *, norm: str = "layer",
                  eager_rounding: bool = False, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``norm(x) * (1 + scale) + shift`` in one kernel (adaLN: diffusers ``AdaLayerNormZero`` and friends).

    Args:
        x: [B, S, N] activations, fp16/bf16/fp32, any strides with a unit column stride (else copied once).
        scale, shift: one value per sample and column: [B, N], [B, 1, N], [1, N] or [N]; fp16/bf16/fp32.
        weight, bias: optional affine parameters of the norm, [N] each (``elementwise_affine``).
        eps: added to the variance (LayerNorm) or mean square (RMSNorm), a Python float >= 0.
        norm: ``"layer"`` (LayerNorm: subtract the mean) or ``"rms"`` (RMSNorm).
        eager_rounding: round where the eager module chain ``norm(x) * (1 + scale[:, None]) +
            shift[:, None]`` does in half precision (norm output to x's dtype, ``1 + scale`` to scale's
            dtype, the product to their promoted dtype). Close to that chain, not bit-identical: the
            norm's own fp32 arithmetic differs from torch's CUDA LayerNorm, so on an H200 (bf16,
            2026-11-30) 74-75% of elements were equal and the rest one bf16 ulp apart. Default False:
            fp32 throughout, rounded once (closer to fp64 than the eager chain).
        out_dtype: output dtype (default: ``promote_types(x, weight, scale, shift)``, as the eager chain).

    Returns:
        [B, S, N] in ``out_dtype``, contiguous. Differentiable in x, scale, shift, weight and bias (the
        backward uses the fp32 formula whatever ``eager_rounding``).

    Raises:
        TypeError: a non-tensor, a sparse or nested tensor, or a dtype other than fp16/bf16/fp32; an eps
            that is not a Python number (an int is taken as a float); a bad ``out_dtype``; an
            ``eager_rounding`` that is not a bool.
        ValueError: x not 3-D, N > 32768, a batch above 65535, scale/shift/weight/bias of the wrong shape or
            device, eps < 0 or not finite, unknown norm.
        RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.
    """
    check_float_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [B, S, N], got shape {tuple(x.shape)}")
    if x.shape[-1] > MAX_N:
        raise ValueError(f"x rows (N = {x.shape[-1]}) must have at most {MAX_N} elements")
    if x.shape[0] > MAX_GRID_YZ:  # one launch grid axis over the samples
        raise ValueError(f"x's batch ({x.shape[0]}) may be at most {MAX_GRID_YZ} (a launch grid axis): split it")
    _check_vec("scale", scale, x)
    _check_vec("shift", shift, x)
    N = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_float_tensor(name, t)
            if t.dim() != 1 or t.shape[0] != N:
                raise ValueError(f"{name} must have shape ({N},), got {tuple(t.shape)}")
            if t.device != x.device:
                raise ValueError(f"{name} is on {t.device} but x is on {x.device}: all tensors must be on one device")
    eps = check_eps(eps)
    if norm not in ("layer", "rms"):
        raise ValueError(f"norm must be 'layer' or 'rms', got {norm!r}")
    check_flag("eager_rounding", eager_rounding)
    if out_dtype is None:
        out_dtype = torch.promote_types(torch.promote_types(x.dtype, scale.dtype), shift.dtype)
        if weight is not None:
            out_dtype = torch.promote_types(out_dtype, weight.dtype)
    else:
        check_out_dtype(out_dtype)
    y, _, _ = call_op(_modulate_fwd, _modulate_fwd_impl, x, scale, shift, weight, bias, eps, norm == "rms",
                      eager_rounding, out_dtype, autograd=_MODULATE_AUTOGRAD, infer=_modulate_infer)
    return y
