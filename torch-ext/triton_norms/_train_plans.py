"""Planned eager training of rms_norm and layer_norm: the forward's launch, and one backward plan per upstream
gradient's signature.

A plain eager training call of :func:`rms_norm` / :func:`layer_norm` whose forward has a plan (contiguous x,
weight and bias; rows of one block) keeps, with that plan, a :class:`PlanCache` of backward plans keyed by the
dtype, shape, strides and 16-byte alignment of the upstream gradient and of the saved tensors, and by which
parameter gradients are needed. A backward plan holds the one-block kernel's launch and the column sums' launch,
both pinned, so a backward allocates its outputs and launches twice with device addresses: none of the general
path's views, stride tuples, plan-cache lookups or checks (on the H100 host the general backward body took 61 us
called directly, 90 inside the autograd engine, session 44). The kernels, their arguments and therefore the bits
are the general path's (``_rms_norm_bwd_grads`` / ``_layer_norm_bwd_grads``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._common import grad_rows
from ._dispatch import IMPL, eager_mode, legacy_batched
from ._launch import backward_strides, bwd_max_fused_bytes
from ._partials import column_sums_plan

__all__ = ["planned_grads", "run_forward_plan"]

_GENERAL = object()  # a gradient signature the general backward serves


def run_forward_plan(exact: bool, run, x: torch.Tensor, weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], y: torch.Tensor, stats: tuple) -> None:
    """Launches a training plan's one-block norm forward (``run``, a pinned launch) storing the fp32 ``stats``:
    the torch-order kernels (``exact``) take (x, weight, bias, y, *stats), the free-order ones (x, residual,
    weight, bias, y, h, *stats) without a residual; device addresses where the launch takes them
    (``FixedLaunch.at``), else the tensors. (The inference plans launch inline, with the addresses their key
    already read: host time of small calls.)"""
    xp, wp, bp, yp = (None if t is None else t.data_ptr() for t in (x, weight, bias, y))
    sp = [s.data_ptr() for s in stats]
    if exact:
        if not run.at((xp, wp, bp, yp, *sp)):
            run((x, weight, bias, y, *stats))
    elif not run.at((xp, None, wp, bp, yp, None, *sp)):
        run((x, None, weight, bias, y, None, *stats))


def _plan(dy: torch.Tensor, xs: torch.Tensor, weight: Optional[torch.Tensor], stats: tuple, need_dw: bool,
          need_db: bool, kernel_plan: Callable, kernel_args: tuple):
    """``(P, the kernel's FixedLaunch, the column sums' FixedLaunch or None)`` for these tensors' signatures, or
    ``_GENERAL`` for wide rows (teams), for a dy whose rows do not collapse to one stride (the general path
    copies it) and for non-contiguous saved tensors. ``kernel_plan(M, N, elem, device, strides, *kernel_args)`` is
    the op's cached ``(P, Launch)``."""
    N = xs.shape[-1]
    M = xs.numel() // N
    dy2 = grad_rows(dy, N)
    if (N * xs.element_size() > bwd_max_fused_bytes(xs.device) or dy2.data_ptr() != dy.data_ptr()
            or not all(t is None or t.is_contiguous() for t in (xs, weight, *stats))):
        return _GENERAL
    P, run = kernel_plan(M, N, xs.element_size(), xs.device, backward_strides(dy2, xs.view(M, N), None),
                         *kernel_args)
    sums = column_sums_plan(P, N, need_dw + need_db, xs.device).pinned() if need_dw or need_db else None
    return P, run.pinned(), sums


def planned_grads(plans, dy: torch.Tensor, xs: torch.Tensor, weight: Optional[torch.Tensor], stats: tuple,
                  dx_dtype: torch.dtype, db_dtype: Optional[torch.dtype], need_dw: bool, need_db: bool,
                  kernel_plan: Callable, kernel_args: tuple = ()):
    """``(dx, dw, db)`` (None for a gradient not needed) of a planned training call's backward, or None where the
    caller runs the op's backward instead: no gradient for y (``dy`` None), a backward that builds a graph through
    these tensors (``create_graph`` with one of them needing a gradient), a dispatch mode, a negative-bit or
    subclass tensor, wide rows, a gradient that would be copied, or non-contiguous saved tensors.

    Args:
        plans: the forward plan's :class:`PlanCache` of backward plans.
        dy: the upstream gradient of y, any strides, or None.
        xs, weight: the saved contiguous x (M rows of N) and weight (N,) or None.
        stats: the saved fp32 statistics the kernel reads after the weight: ``(rstd,)`` or ``(mean, rstd)``.
        dx_dtype, db_dtype: dx's dtype (x's) and db's (the bias'; None without a bias).
        kernel_plan, kernel_args: the op's ``_bwd_plan`` and its arguments after the strides.
    """
    if eager_mode((dy, xs, weight, *stats), 2) != IMPL or legacy_batched(dy):  # (dy None: y unused, the op's zeros;
        return None  # a legacy-vmap batched dy has no storage: the op's backward)
    # every tensor's signature: a saved-tensor hook (offloading, compression) may unpack x, the weight or the
    # statistics as new tensors of another alignment, layout or dtype than the forward's plan had
    key = (need_dw, need_db, *[None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15)
                               for t in (dy, xs, weight, *stats)])
    plan = plans.get(key)
    if plan is None:
        plan = plans.add(key, _plan(dy, xs, weight, stats, need_dw, need_db, kernel_plan, kernel_args))
    if plan is _GENERAL:
        return None
    P, run, sums = plan
    N, device = xs.shape[-1], xs.device
    dx = torch.empty_like(xs, dtype=dx_dtype)
    dw_part, db_part = (torch.empty((P, N), dtype=torch.float32, device=device) if wanted else None
                        for wanted in (need_dw, need_db))
    w, dwp, dbp = (None if t is None else t.data_ptr() for t in (weight, dw_part, db_part))
    if not run.at((dy.data_ptr(), xs.data_ptr(), w, *(s.data_ptr() for s in stats), None, dx.data_ptr(), None,
                   dwp, dbp)):
        run((grad_rows(dy, N), xs, weight, *stats, None, dx, None, dw_part, db_part))
    dw = torch.empty((N,), dtype=weight.dtype, device=device) if need_dw else None
    db = torch.empty((N,), dtype=db_dtype, device=device) if need_db else None
    if sums is not None and not sums.at((dwp, dbp, None if dw is None else dw.data_ptr(),
                                         None if db is None else db.data_ptr())):
        sums((dw_part, db_part, dw, db))
    return dx, dw, db
