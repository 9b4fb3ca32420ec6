"""Helpers shared by the softmax and cross-entropy kernels and wrappers.

Row addressing without copies
-----------------------------
A kernel reduces "rows": the 1-D fibres of a tensor along the reduced dimension
``dim``. ``row_layout`` moves ``dim`` last (a view: ``movedim``) and describes the
remaining leading dims of every tensor of the call (input, mask, output, ...)
jointly as at most ``MAX_LEAD = 3`` dims of sizes ``(R0, R1, R2)`` with one stride
per tensor and dim, plus the stride of the reduced dim itself. Adjacent leading
dims are merged when every tensor allows it (outer stride == inner stride *
inner size); size-1 dims are dropped. Row ``r`` (the row-major index over the
leading dims) starts at ``i0*s0 + i1*s1 + i2*s2`` with ``(i0, i1, i2)`` the digits
of ``r`` in base ``(R0, R1, R2)`` (``row_start``, int64). Fewer than 3 groups are padded with
size-1 dims at the end, so that a launch specialises ``R2`` (and ``R1``) to the constant 1 and
``row_start`` divides by nothing for one group and once for two (the integer division in front
of every program's loads cost 3% at 16384 x 16384 bf16, session 15). So sliced rows, a
non-unit column stride (``dim`` other than the last), expanded (stride-0) masks and
gradients, and a (B, 1, S, S) mask broadcast against (B, H, S, S) scores are all
read in place. Only a layout that keeps more than 3 unmergeable leading dims is
copied once (``contiguous``), the one documented copy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl
from ._device import check_dense
from ._fastlaunch import PlanCache
from ._rounding import round_to

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"
MAX_LEAD = 3


# Compiled kernels convert with the hardware's round-to-nearest-even (cvt.rn: one instruction);
# the Triton interpreter truncates fp32 -> bf16, so there the rounding is done with integer ops.
NATIVE_ROUNDING = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def store_rounded(ptr, offsets, value, mask):
    """Stores fp32 ``value`` into ``ptr``'s dtype, rounded to nearest even."""
    DTYPE: tl.constexpr = ptr.dtype.element_ty
    if NATIVE_ROUNDING:
        tl.store(ptr + offsets, value.to(DTYPE), mask=mask)
    else:
        tl.store(ptr + offsets, round_to(value, DTYPE).to(DTYPE), mask=mask)


@triton.jit
def row_start(row, R1, R2, s0, s1, s2):
    """Element offset (int64) of row ``row`` (int64) for leading sizes (., R1, R2) and strides (s0, s1, s2)."""
    i2 = row % R2
    rest = row // R2
    return (rest // R1) * s0 + (rest % R1) * s1 + i2 * s2


@dataclass(frozen=True)
class RowLayout:
    """Leading sizes (R0, R1, R2) and, per tensor, strides (s0, s1, s2, s_col). See the module docstring."""

    sizes: Tuple[int, int, int]
    strides: Tuple[Tuple[int, int, int, int], ...]

    @property
    def rows(self) -> int:
        return self.sizes[0] * self.sizes[1] * self.sizes[2]

    def args(self, i: int) -> Tuple[int, int, int, int]:
        """The four stride arguments of tensor ``i`` (zeros for a missing tensor)."""
        return self.strides[i]


# row_layout's results per (dim, shape, strides): the layout is a pure function of them, and working it out
# took ~25 us of Python per call (twice per softmax forward+backward).
_LAYOUTS = PlanCache()
_MISSING = object()


def row_layout(tensors: Sequence[Optional[torch.Tensor]], dim: int) -> Optional[RowLayout]:
    """Joint row layout of same-shaped tensors reduced over ``dim``; None if more than 3 leading dims remain.

    ``None`` entries get zero strides (an absent optional tensor).
    """
    shape = next(t for t in tensors if t is not None).shape
    key = (dim, shape, *[None if t is None else t.stride() for t in tensors])
    layout = _LAYOUTS.get(key, _MISSING)
    return _LAYOUTS.add(key, _row_layout(tensors, dim, shape)) if layout is _MISSING else layout


def _row_layout(tensors: Sequence[Optional[torch.Tensor]], dim: int, shape: torch.Size) -> Optional[RowLayout]:
    # the registered ops may be called directly with a negative or bad dim (IndexError); cached, so free per call
    dim = normalize_dim(dim, len(shape))
    groups: List[Tuple[int, List[int]]] = []  # (size, stride per tensor)
    for d in range(len(shape)):
        if d == dim or shape[d] == 1:
            continue
        strides = [t.stride(d) if t is not None else 0 for t in tensors]
        if groups:
            size0, strides0 = groups[-1]
            if all(s0 == s * shape[d] for s0, s in zip(strides0, strides)):
                groups[-1] = (size0 * shape[d], strides)
                continue
        groups.append((shape[d], strides))
    if len(groups) > MAX_LEAD:
        return None
    while len(groups) < MAX_LEAD:
        groups.append((1, [0] * len(tensors)))
    sizes = tuple(g[0] for g in groups)
    strides = []
    for i, t in enumerate(tensors):
        col = t.stride(dim) if t is not None and len(shape) > 0 else 0
        strides.append(tuple(g[1][i] for g in groups) + (col,))
    return RowLayout(sizes, tuple(strides))  # immutable: row_layout hands the same object to every caller


def broadcast_innermost(layout: RowLayout, i: int) -> RowLayout:
    """``layout`` with the leading groups along which tensor ``i`` (a mask broadcast over them) has stride 0 and more
    than one index moved innermost, enumerated fastest: the programs that read the same mask row then run one after
    another, so that the mask comes from DRAM about once rather than once per index of those groups (a (4096, 4096)
    mask over 16 x 4096 x 4096 scores was read 16 times). Every row maps to the same elements; only the order of the
    rows changes (not for causal rows, whose query index is the row number modulo Sq)."""
    moved = [g for g in range(MAX_LEAD) if layout.sizes[g] > 1 and layout.strides[i][g] == 0]
    order = [g for g in range(MAX_LEAD) if g not in moved] + moved
    if order == list(range(MAX_LEAD)):  # nothing moved, or the moved groups are innermost already
        return layout
    return RowLayout(tuple(layout.sizes[g] for g in order),
                     tuple((*(s[g] for g in order), s[3]) for s in layout.strides))


def rows_aligned(layout: RowLayout, tensors: Sequence[Optional[torch.Tensor]]) -> bool:
    """Whether the compiler can see that every row of each tensor given (``None``: skipped; the order of
    ``row_layout``'s call) starts on 16 bytes: a 16-byte-aligned base, unit column stride and leading strides
    that are multiples of 16 elements (Triton marks an integer argument divisible by 16, never by 8; a bf16 row
    stride of 8 elements is aligned but not known to be), so that a row's loads and stores can be vectorised."""
    for i, t in enumerate(tensors):
        if t is None:
            continue
        s0, s1, s2, col = layout.strides[i]
        if col != 1 or t.data_ptr() % 16 or s0 % 16 or s1 % 16 or s2 % 16:
            return False
    return True


class LaunchPlan(NamedTuple):
    """The launches of one call signature (shapes, strides, dtypes, device, flags), worked out once.

    ``copy``: the layout keeps more than 3 unmergeable leading dims, so the caller passes contiguous copies
    (the plan was made for their strides). ``workspace``: None, or ``(numel, dtype, zeroed)`` of the scratch
    tensor allocated per call. ``launches``: ``(Launch, picks)`` pairs in launch order; ``picks`` index the
    kernel's pointer arguments in the call's pointers followed by the workspace (see :func:`run_plan`).
    """

    copy: bool
    workspace: Optional[Tuple[int, torch.dtype, bool]]
    launches: Tuple[tuple, ...]


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor with the shape, dtype and strides of ``t.contiguous()``, without memory (a layout to plan with)."""
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def run_plan(plan: LaunchPlan, ptrs: tuple, device: torch.device) -> None:
    """Runs ``plan``'s launches on the pointers ``ptrs`` (tensors or None) and a fresh workspace (the last
    pointer) on ``device``."""
    ws = None
    if plan.workspace is not None:
        numel, dtype, zeroed = plan.workspace
        ws = (torch.zeros if zeroed else torch.empty)(numel, dtype=dtype, device=device)
    ptrs = (*ptrs, ws)
    for run, picks in plan.launches:
        run(tuple([ptrs[i] for i in picks]))


def normalize_dim(dim, ndim: int) -> int:
    """``dim`` in [0, ndim) (a 0-d tensor counts as 1-d); IndexError as torch raises it."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def check_float_tensor(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype {_DTYPE_NAMES}, got {t.dtype}")


def check_same_device(name: str, t: torch.Tensor, x: torch.Tensor, x_name: str = "x") -> None:
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but {x_name} is on {x.device}: all tensors must be on one device")


def check_real(name: str, value, *, low: Optional[float] = None, high: Optional[float] = None) -> float:
    """A finite Python number (not a tensor: a tensor would need a host sync), optionally in [low, high]."""
    if isinstance(value, (torch.Tensor, bool)) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float or int, got {type(value).__name__}")
    value = float(value)
    if not -math.inf < value < math.inf or (low is not None and value < low) or (high is not None and value > high):
        bounds = f" in [{low}, {high}]" if low is not None and high is not None else (f" >= {low}" if low is not None else "")
        raise ValueError(f"{name} must be a finite number{bounds}, got {value}")
    return value
