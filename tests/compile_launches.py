"""Compile recorded kernel launches for GPU targets on a machine without a GPU.

    python tests/compile_launches.py <records.json> <arch>

``records.json``: ``{"variants": {package: build variant folder}, "launches": [record, ...]}``, each record a
launch the Triton interpreter ran (``tests/test_reliability_compile.py`` writes them): the package, the kernel's
module (relative to the package) and name, its positional arguments (tensors as dtype and 16-byte alignment,
scalars as values) and its keyword arguments (constexprs, ``num_warps``, ...). ``arch``: an NVIDIA compute
capability (``90``) or an AMD target (``gfx942``).

Each launch is compiled through the kernel's own ``warmup`` (Triton's binder: the same specialisation a GPU
launch gets, integers equal to 1 made constants and multiples of 16 marked, pointers' alignment) against a
stand-in driver that reports the target, so what only the compiler sees (a method called on a specialised
constant, a type error in a branch the interpreter never takes, ptxas limits, a block of more than 1024
threads on AMD's 64-wide waves) fails here. Must run without ``TRITON_INTERPRET=1``. Prints ``COMPILED <n>``
and, for each launch that failed, ``FAILED <kernel>: <error>``; exit status 1 if any failed.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import kernels
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class _TargetDriver:
    """What ``JITFunction.warmup`` asks of the active driver: a device, a stream and the target to compile for."""

    def __init__(self, target: GPUTarget):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def _argument(spec):
    """A stand-in for a recorded argument: a CPU tensor of the dtype, misaligned by one element where the recorded
    pointer was not a multiple of 16 bytes; scalars as recorded."""
    if isinstance(spec, dict) and "tensor" in spec:
        dtype = getattr(torch, spec["tensor"])
        base = torch.empty(64, dtype=dtype)
        return base if spec["aligned"] else base[1:]
    return spec


def main(records: Path, arch: str) -> int:
    data = json.loads(records.read_text())
    packages = {name: kernels.get_local_kernel(Path(folder)) for name, folder in data["variants"].items()}
    target = GPUTarget("cuda", int(arch), 32) if arch.isdigit() else GPUTarget("hip", arch, 64)
    driver.set_active(_TargetDriver(target))
    compiled, failed = 0, []
    for rec in data["launches"]:
        module = importlib.import_module(f"{packages[rec['package']].__name__}.{rec['module']}")  # also one imported lazily
        kernel = getattr(module, rec["kernel"])
        try:
            kernel.warmup(*[_argument(a) for a in rec["args"]], grid=(1,), **rec["meta"])
            compiled += 1
        except Exception as err:  # noqa: BLE001 -- every failure is reported with its kernel
            failed.append(f"FAILED {rec['package']}.{rec['module']}.{rec['kernel']} {rec['meta']}: "
                          f"{type(err).__name__}: {str(err)[:2000]}")
    print("COMPILED", compiled)
    print("\n".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
