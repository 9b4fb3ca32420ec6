"""Device facts and launch guards every package of the collection shares.

``triton-collection build`` copies the modules of ``torch-ext/_shared/`` into each
package (a Hub package may import only the standard library, torch, triton and
itself), so this file is written once and shipped in every build.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["check_launch_device", "device_warp_size", "is_interpreter", "launch_options"]


@functools.lru_cache(maxsize=64)
def device_warp_size(device: torch.device) -> int:
    """Lanes per warp of ``device``: the device property where torch has it (64 on AMD CDNA), else 32."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(device), "warp_size", 32))
    return 32


def is_interpreter(kernel) -> bool:
    """True when ``kernel`` was decorated while ``TRITON_INTERPRET=1`` was set."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_launch_device(x: torch.Tensor, kernel) -> None:
    """Raises a clear error before launching ``kernel`` on a tensor it cannot run on.

    Raises:
        RuntimeError: ``x`` is on the CPU but the Triton kernels were compiled for a GPU
            (``TRITON_INTERPRET=1`` was not set before ``triton`` was first imported).
    """
    if x.device.type == "cpu" and not is_interpreter(kernel):
        value = os.environ.get("TRITON_INTERPRET")
        if value == "1":
            why = "TRITON_INTERPRET=1 was set after triton had been imported; set it before the first import of triton"
        else:
            why = ("set the environment variable TRITON_INTERPRET=1 before importing triton and this kernel "
                   f"(it is {'unset' if value is None else repr(value)})")
        package = (__package__ or "this package").lstrip("_")
        raise RuntimeError(f"{package} got a CPU tensor, but CPU tensors only run under the Triton interpreter: {why}.")


def launch_options(kernel) -> dict:
    """Keyword options for a kernel launch.

    ``enable_fp_fusion=False`` keeps ``a * b + c`` as two rounded operations, as PyTorch's
    eager elementwise ops compute it, instead of one fused multiply-add: needed wherever a
    kernel must match eager rounding bit for bit (the interpreter takes no such option).
    """
    return {} if is_interpreter(kernel) else {"enable_fp_fusion": False}
