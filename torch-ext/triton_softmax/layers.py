"""Hub layers for ``kernels.kernelize``: drop-in forwards for the PyTorch modules they replace.

``Softmax`` computes the forward in torch's CUDA order (``softmax(..., torch_order=True)``): the
same kernel choice, ``expf`` and summation order as ATen's softmax, so on CUDA its output equals
``nn.Softmax``'s bit for bit when the dims after ``dim`` have size 1 (always for the last dim);
otherwise, and for the backward, it is the package's fast kernels (within an ulp or two).
Exactness costs speed: on an H200 the torch-order forward ran at 0.47-2.3x torch's own kernel
(``benchmarks/results/softmax_vs_torch_2026-12-01.md``); ``softmax(x, dim)`` is the fast path.

``CrossEntropyLoss`` follows ``F.cross_entropy``'s steps for (C,) and (N, C) input without label
smoothing (``cross_entropy(..., torch_order=True)``): loss and input gradient bit-exact on CUDA. With
label smoothing or (N, C, d1, ...) input it is the fused kernel (within an ulp or two).

Each class is stateless (no ``__init__``, no methods besides ``forward``) and reads the
replaced module's own attributes. Under ``torch.autocast`` each computes in the dtype PyTorch's op
would (``_autocast.autocast_to``: on CUDA softmax and cross-entropy in fp32).

=================  ===========================  ==============================================
layer              replaces                     reads
=================  ===========================  ==============================================
Softmax            torch.nn.Softmax             ``dim`` (None: torch's legacy implicit dim)
CrossEntropyLoss   torch.nn.CrossEntropyLoss    ``ignore_index``, ``reduction``, ``label_smoothing``;
                                                ``weight`` must be None (class weights: ValueError)
=================  ===========================  ==============================================
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ._common import SUPPORTED_DTYPES
from ._replaced import replaced_forward
from ._autocast import autocast_to
from .cross_entropy import cross_entropy
from .softmax import softmax


class Softmax(nn.Module):
    """``nn.Softmax``: softmax over ``self.dim`` (any dim; the last is the fast one).

    ``dim=None`` picks torch's legacy implicit dim (0 for 0-, 1- and 3-d input, else 1), as
    ``nn.Softmax(dim=None)`` does.

    Shapes:
        - input: any shape, fp16/bf16/fp32
        - output: input's shape and dtype (contiguous)
    """

    dim: Optional[int]

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in SUPPORTED_DTYPES and (own := replaced_forward(self, Softmax)) is not None:
            return own(self, input)
        dim = self.dim
        if dim is None:
            dim = 0 if input.dim() in (0, 1, 3) else 1
        to = autocast_to("softmax", input)
        if to is not None:  # under autocast torch.softmax computes in another dtype (fp32 on CUDA)
            input = input.to(to)
        return softmax(input, dim, torch_order=True)


class CrossEntropyLoss(nn.Module):
    """``nn.CrossEntropyLoss`` for class-index targets.

    (C,) or (N, C) input without label smoothing: torch's order (``cross_entropy(..., torch_order=True)``),
    so on CUDA the loss and the input's gradient equal the module's bit for bit. Otherwise the fused
    kernel (loss and gradient in one pass, within an ulp or two of torch's). What the kernel does not take (a
    class ``weight``, probability targets, a float64 input) runs the module's own forward.

    Shapes:
        - input: (C,), (N, C) or (N, C, d1, ...), fp16/bf16/fp32
        - target: int64 (int32, uint8) class indices of input's shape without the class dim
        - output: scalar, or target's shape for ``reduction="none"``; input's dtype
    """

    weight: Optional[torch.Tensor]
    ignore_index: int
    reduction: str
    label_smoothing: float

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if ((input.dtype not in SUPPORTED_DTYPES or getattr(self, "weight", None) is not None
             or isinstance(target, torch.Tensor) and target.is_floating_point())
                and (own := replaced_forward(self, CrossEntropyLoss)) is not None):
            return own(self, input, target=target)  # what the kernel does not take: the module's own forward
        if getattr(self, "weight", None) is not None:
            raise ValueError("CrossEntropyLoss with a class weight is not supported by triton-softmax "
                             "(weight must be None)")
        to = autocast_to("cross_entropy", input)
        if to is not None:  # under autocast F.cross_entropy computes in another dtype (fp32 on CUDA and the CPU)
            input = input.to(to)
        if isinstance(target, torch.Tensor) and target.dtype == torch.uint8:  # nn.CrossEntropyLoss takes Byte targets
            target = target.long()
        return cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                             label_smoothing=self.label_smoothing,
                             torch_order=self.label_smoothing == 0.0 and input.dim() <= 2)
