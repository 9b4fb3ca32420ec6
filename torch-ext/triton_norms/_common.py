"""Helpers shared by the RMSNorm and LayerNorm kernels and wrappers.

* ``@triton.jit`` loaders of input/gradient chunks (``round_to`` comes from the
  collection's shared ``_rounding`` module);
* argument validation for the public functions (ValueError / TypeError naming the
  argument; never ``assert``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from ._device import check_dense
from ._rounding import round_to

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"


def check_float_tensor(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype {_DTYPE_NAMES}, got {t.dtype}")


def check_dtype_arg(name: str, dtype: Optional[torch.dtype]) -> None:
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be None or {_DTYPE_NAMES}, got {dtype}")


def check_db_dtype(db_dtype) -> None:
    """The norm backward ops' bias-gradient dtype: None (not wanted) or a floating dtype; a bool (the flag this
    argument replaced) reaches an op as an integer dtype, so it is refused by name here."""
    if db_dtype is not None and not (isinstance(db_dtype, torch.dtype) and db_dtype.is_floating_point):
        raise TypeError(f"db_dtype must be None or a floating dtype, got {db_dtype!r}")


def bwd_op_outputs(grads: tuple, x: torch.Tensor, dx_dtype: torch.dtype) -> tuple:
    """What a norm backward op returns for ``grads`` = (dx, dres, dw, db) of its grads function: an empty tensor in
    place of each gradient not requested (None there; a custom op cannot return None)."""
    dx, dres, dw, db = grads
    return (dx, dres if dres is not None else x.new_empty(0, dtype=dx_dtype), dw if dw is not None else x.new_empty(0),
            db if db is not None else x.new_empty(0))


def bwd_op_fake(x: torch.Tensor, weight: Optional[torch.Tensor], dx_dtype: torch.dtype,
                dres_dtype: Optional[torch.dtype], need_dw: bool, db_dtype: Optional[torch.dtype]) -> tuple:
    """The fake (meta) outputs of a norm backward op, shaped as :func:`bwd_op_outputs` gives them.

    Raises:
        TypeError: ``db_dtype`` neither None nor a floating dtype (see :func:`check_db_dtype`).
    """
    check_db_dtype(db_dtype)
    N = x.shape[-1]
    dres = x.new_empty(x.shape, dtype=dres_dtype) if dres_dtype is not None else x.new_empty(0, dtype=dx_dtype)
    dw = x.new_empty((N,), dtype=weight.dtype) if need_dw else x.new_empty(0)
    db = x.new_empty((N,), dtype=db_dtype) if db_dtype is not None else x.new_empty(0)
    return x.new_empty(x.shape, dtype=dx_dtype), dres, dw, db


def check_eps(eps: float) -> float:
    if isinstance(eps, (torch.Tensor, bool)) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a Python float or int, got {type(eps).__name__}")
    eps = float(eps)
    if not 0.0 <= eps < math.inf:  # comparisons, not math.isinf: traceable on symbolic floats (compile)
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def check_inputs(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
) -> None:
    """Validates dtypes, devices and shapes of a norm's tensor arguments.

    Raises:
        TypeError: a tensor that is not fp16/bf16/fp32.
        ValueError: x with no dimension, residual.shape != x.shape,
            weight/bias shape != (N,), or a tensor on another device than x.
    """
    check_float_tensor("x", x)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the normalised one), got a 0-d tensor")
    N = x.shape[-1]
    if residual is not None:
        check_float_tensor("residual", residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have the shape of x {tuple(x.shape)}, got {tuple(residual.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        check_float_tensor(name, t)
        if t.dim() != 1 or t.shape[0] != N:
            raise ValueError(f"{name} must have shape (N,) = ({N},) for x of shape {tuple(x.shape)}, got {tuple(t.shape)}")
    for name, t in (("residual", residual), ("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: all tensors must be on one device")


def offset_for_kernel(weight_offset: float) -> float:
    """The weight offset the kernels add to the weight: a zero as -0.0, because ``w + (-0.0) == w`` for every w,
    while ``w + 0.0`` turns a weight of -0.0 into +0.0 (a zero output's sign would then differ from the module's
    ``weight * x``). Launch plans cached by the offset's value (0.0 == -0.0) call it too."""
    return -0.0 if weight_offset == 0.0 else weight_offset


def check_weight_offset(weight_offset) -> float:
    """``weight_offset`` as a finite Python float (TypeError / ValueError naming it otherwise), as
    :func:`offset_for_kernel` passes it."""
    if isinstance(weight_offset, (torch.Tensor, bool)) or not isinstance(weight_offset, (int, float)):
        raise TypeError(f"weight_offset must be a Python float or int, got {type(weight_offset).__name__}")
    weight_offset = float(weight_offset)
    if not -math.inf < weight_offset < math.inf:  # also False for NaN; traceable (see check_eps)
        raise ValueError(f"weight_offset must be a finite number, got {weight_offset}")
    return offset_for_kernel(weight_offset)


def prepare_rms_args(x, residual, weight, bias, eps, cast_dtype, out_dtype):
    """Validates rms_norm/add_rms_norm arguments; returns (eps, out_dtype) with the default filled in."""
    check_inputs(x, residual, weight, bias)
    check_dtype_arg("cast_dtype", cast_dtype)
    check_dtype_arg("out_dtype", out_dtype)
    eps = check_eps(eps)
    if out_dtype is None:
        out_dtype = residual.dtype if residual is not None else x.dtype
    return eps, out_dtype



def rows_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a (M, N) matrix with a unit last-dim stride.

    A view whenever the leading dims collapse to one row stride; otherwise (or if
    the last dim is not contiguous) this is the one documented copy.
    """
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


def rows_of(t: torch.Tensor):
    """``(t2, M, row_stride)``: a tensor whose data pointer starts row 0 of ``t`` as an (M, N) matrix with
    unit last-dim stride, and the elements one row moves. A contiguous ``t`` is passed as it is (no
    reshape: on a slow host one view costs as much as a small kernel); otherwise :func:`rows_view`."""
    if t.is_contiguous():
        n = t.shape[-1]
        return t, (t.numel() // n if n else 0), n
    t2 = rows_view(t)
    return t2, t2.shape[0], t2.stride(0)


def empty_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous tensor of x's shape and ``dtype`` on x's device (``empty_like`` of a
    contiguous x is contiguous and costs half of ``torch.empty(shape, dtype=, device=)`` in host time)."""
    if x.is_contiguous():
        return torch.empty_like(x, dtype=dtype)
    return torch.empty(x.shape, dtype=dtype, device=x.device)


def addressed_signature(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> tuple:
    """``(x's, weight's and bias' addresses (None where absent), what an inference plan depends on of them)``: dtype,
    shape, device, contiguity and the address modulo 16 bytes (Triton's pointer specialisation, and ``F.rms_norm`` /
    ``F.layer_norm``'s choice of kernel). The addresses go to a pinned launch (``FixedLaunch.at``)."""
    xp = x.data_ptr()
    wp = None if weight is None else weight.data_ptr()
    bp = None if bias is None else bias.data_ptr()
    return xp, wp, bp, (x.dtype, x.shape, x.device, x.is_contiguous(), xp & 15,
                        None if weight is None else (weight.dtype, weight.shape, weight.device, weight.is_contiguous(),
                                                     wp & 15),
                        None if bias is None else (bias.dtype, bias.shape, bias.device, bias.is_contiguous(), bp & 15))


def normalized_model(x: torch.Tensor, rstd: torch.Tensor, rms: bool) -> tuple:
    """``(xhat, rstd)`` of a row (last dim) for the double-backward models of the norm backward ops, as fp32
    PyTorch ops differentiable in x: ``xhat = (x - mean) * rstd`` (mean 0 for ``rms``) with the statistics
    recomputed from x, because the forwards save mean and rstd as outputs without a gradient while they depend on
    x. The saved ``rstd`` only fixes eps, per row (``1 / rstd**2 - var``, held constant), so the recomputed rstd has
    its value (to fp32 rounding) whatever the order its kernel summed in."""
    centred = x if rms else x - x.mean(-1, keepdim=True)
    var = centred.square().mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + (rstd.unsqueeze(-1).pow(-2) - var).detach())
    return centred * rstd, rstd


def column_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over every row (all dims but the last): a weight or bias gradient, in a model."""
    return t.reshape(-1, t.shape[-1]).sum(0)


def vector(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A weight/bias vector with unit stride (copies only a strided slice)."""
    if t is None or t.stride(0) == 1 or t.numel() <= 1:
        return t
    return t.contiguous()


@triton.jit
def load_input_chunk(
    x_ptr,  # (M, N) input rows, unit column stride
    res_ptr,  # (M, N) residual rows, or None
    h_ptr,  # (M, N) contiguous output for x + residual, or None
    row,  # int64 row index
    stride_x_row,  # elements x_ptr moves for one row
    stride_res_row,  # elements res_ptr moves for one row
    N,  # row length
    offs,  # column offsets of this chunk
    mask,  # offs < N
    STORE_H: tl.constexpr,  # write the rounded sum to h_ptr
    EVICT: tl.constexpr,  # L2 eviction hint of the loads: "" or "evict_last" (the one-chunk forwards, measured)
):
    """Loads one chunk of a row as fp32: x, or round(x + residual) to the residual's dtype.

    Masked lanes are 0. With a residual the sum is rounded to h's dtype (as
    ``residual + hidden_states`` in the model dtype) and the norm uses that
    rounded value; STORE_H also stores it (exact: it is representable).
    """
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=mask, other=0.0, eviction_policy=EVICT)
    r = x
    if res_ptr is not None:
        r = tl.load(res_ptr + row * stride_res_row + offs, mask=mask, other=0.0, eviction_policy=EVICT)
    return input_of(x, r, res_ptr, h_ptr, row, N, offs, mask, STORE_H)


@triton.jit
def input_of(x, r, res_ptr, h_ptr, row, N, offs, mask, STORE_H: tl.constexpr):
    """The norm's input from a chunk of x and of the residual ``r`` as loaded (any float dtype): fp32 x,
    or round(x + r) to h's dtype (stored when STORE_H); the arithmetic of :func:`load_input_chunk`, which
    the team kernels (``_wide``) apply to chunks they loaded a row ahead."""
    x = x.to(tl.float32)
    if res_ptr is not None:
        x = round_to(x + r.to(tl.float32), h_ptr.dtype.element_ty)
        if STORE_H:
            tl.store(h_ptr + row * N + offs, x.to(h_ptr.dtype.element_ty), mask=mask)
    return x


@triton.jit
def load_grad_chunk(
    g_ptr,  # upstream gradient, any strides (0 for expanded, transposed ok)
    row,  # int64 row index
    stride_g_row,  # elements g_ptr moves for one row
    stride_g_col,  # elements g_ptr moves for one column (often 1, then specialised)
    offs,
    mask,
):
    """Loads one chunk of an upstream-gradient row as fp32 (masked lanes 0)."""
    return tl.load(g_ptr + row * stride_g_row + offs.to(tl.int64) * stride_g_col, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def load_grad_raw(dy_ptr, x_ptr, row, M, N, stride_dy_row, stride_dy_col, stride_x_row, offs):
    """One chunk of dy and of x (h) of ``row`` as stored, nothing past the row end or for ``row >= M``: the
    backwards load the next row with it before reducing this one, so the loads stay in flight meanwhile
    (no arithmetic on the values until the next iteration)."""
    live = offs < tl.where(row < M, N, 0)
    dy = tl.load(dy_ptr + row * stride_dy_row + offs.to(tl.int64) * stride_dy_col, mask=live, other=0.0)
    x = tl.load(x_ptr + row * stride_x_row + offs, mask=live, other=0.0)
    return dy, x


@triton.jit
def store_dx(dx, dh_ptr, dx_ptr, dres_ptr, row, stride_dh_row, stride_dh_col, N, offs, mask):
    """Adds the gradient of h (fused residual, any strides) to a chunk of dx and stores it (and a second
    copy, in the residual's dtype, for the residual): the backward kernels of both norms share it."""
    if dh_ptr is not None:
        dx += load_grad_chunk(dh_ptr, row, stride_dh_row, stride_dh_col, offs, mask)
    tl.store(dx_ptr + row * N + offs, round_to(dx, dx_ptr.dtype.element_ty).to(dx_ptr.dtype.element_ty), mask=mask)
    if dres_ptr is not None:
        tl.store(dres_ptr + row * N + offs, round_to(dx, dres_ptr.dtype.element_ty).to(dres_ptr.dtype.element_ty),
                 mask=mask)


def grad_rows(g: torch.Tensor, N: int) -> torch.Tensor:
    """An upstream gradient as (M, N) with any strides: a view for expanded
    (stride-0) and 2-D transposed gradients, a copy only if rows do not collapse."""
    return g.reshape(-1, N)


@triton.jit
def load_affine(w_ptr, b_ptr, offs, mask, RAW: tl.constexpr, EVICT: tl.constexpr):
    """``(w, b)`` of one chunk in fp32 (``RAW``: as stored, for :func:`affine_f32` later); 0.0 for an absent one
    (its pointer None: never used). ``EVICT``: the loads' L2 eviction hint ("" or "evict_last")."""
    w = 0.0
    b = 0.0
    if w_ptr is not None:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)
        if not RAW:
            w = w.to(tl.float32)
    if b_ptr is not None:
        b = tl.load(b_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT)
        if not RAW:
            b = b.to(tl.float32)
    return w, b


@triton.jit
def affine_f32(w, b, w_ptr, b_ptr):
    """``(w, b)`` from :func:`load_affine` with ``RAW`` in fp32 (absent ones stay 0.0)."""
    if w_ptr is not None:
        w = w.to(tl.float32)
    if b_ptr is not None:
        b = b.to(tl.float32)
    return w, b


@triton.jit
def rms_affine(x, rstd, w, b, w_ptr, b_ptr, weight_offset, CAST_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """RMSNorm's output for one chunk (``x`` fp32, ``rstd`` of its row, ``w``/``b`` from :func:`load_affine`):
    normalises and applies weight/bias with the documented rounding points (``rms_norm`` module docstring)."""
    y = round_to(x * rstd, CAST_DTYPE)
    if w_ptr is not None:
        y = y * (w + weight_offset)
    if b_ptr is not None:
        if CAST_DTYPE is not None:
            y = round_to(y, OUT_DTYPE)
        y = y + b
    return round_to(y, OUT_DTYPE)


@triton.jit
def rms_apply(x, rstd, w_ptr, b_ptr, offs, mask, weight_offset, CAST_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """:func:`rms_affine` with w/b loaded here (after the row's reduction, where the call stands); the
    one-program kernels and the team forward (``_wide``) share it."""
    w, b = load_affine(w_ptr, b_ptr, offs, mask, False, "")
    return rms_affine(x, rstd, w, b, w_ptr, b_ptr, weight_offset, CAST_DTYPE, OUT_DTYPE)


@triton.jit
def ln_apply(x, mean, rstd, w_ptr, b_ptr, offs, mask, OUT_DTYPE: tl.constexpr):
    """LayerNorm's output for one chunk: ``round((x - mean) * rstd * w + b)`` in fp32, rounded once; the
    one-program kernels share it (loads after the normalisation, as measured; the team forward: ln_affine)."""
    y = (x - mean) * rstd
    if w_ptr is not None:
        y = y * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if b_ptr is not None:
        y = y + tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return round_to(y, OUT_DTYPE)


@triton.jit
def ln_affine(x, mean, rstd, w, b, w_ptr, b_ptr, OUT_DTYPE: tl.constexpr):
    """:func:`ln_apply`'s arithmetic with ``w`` / ``b`` already loaded (fp32, :func:`load_affine`): the team
    forward (``_wide``) loads them where its setting says."""
    y = (x - mean) * rstd
    if w_ptr is not None:
        y = y * w
    if b_ptr is not None:
        y = y + b
    return round_to(y, OUT_DTYPE)
