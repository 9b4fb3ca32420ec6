"""Every kernel launch of the catalog's samples compiles for an H100/H200 (sm_90) and an MI300 (gfx942).

The CPU suite runs the kernels under the Triton interpreter, which executes their Python and never compiles
them: a kernel can pass every CPU test and not compile for a GPU (session 46's ``stride_n.to(tl.int64)`` in
``norm_modulate``: a unit stride reaches a GPU compile as the constant 1, which has no ``.to``; found on the GPU a
session later). Here each package's public ops and layers run once per sample and dtype (forward, backward,
no-grad forward, as ``test_reliability_ops`` runs them) with every interpreted launch recorded: kernel, argument
dtypes and alignment, scalar values and meta-parameters. A subprocess without the interpreter then compiles each
distinct launch for the target through the kernel's own ``warmup`` (``tests/compile_launches.py``), so the
specialisation is the one a GPU launch of the same arguments gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from .reliability_catalog import CATALOG, clone_inputs, loss_of
from .test_reliability_ops import PACKAGES, _pkg, _runs

pytestmark = pytest.mark.slow


def _describe(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"unrecorded argument type {type(value).__name__}")


def _record(request, package) -> list:
    """The distinct launches of ``package``'s catalog samples (both dtypes of each sample)."""
    from triton.runtime.interpreter import InterpretedFunction

    pkg = _pkg(request, package)
    prefix = pkg.__name__ + "."
    seen, launches = set(), []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if self.fn.__module__.startswith(prefix):
            try:
                rec = {"package": f"triton-{package}", "module": self.fn.__module__[len(prefix):],
                       "kernel": self.fn.__name__, "args": [_describe(a) for a in args],
                       "meta": {k: _describe(v) for k, v in kwargs.items()}}
            except TypeError:  # a host tensor descriptor (TMA paths forced under the interpreter): not recorded
                rec = None
            key = json.dumps(rec, sort_keys=True)
            if rec is not None and key not in seen:
                seen.add(key)
                launches.append(rec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        torch.manual_seed(0)
        for dtype_index in (0, -1):
            for name, fn, make, grad, out_arg, dtype, params in _runs(pkg, CATALOG[package], "cpu",
                                                                      dtype_index=dtype_index):
                inputs = clone_inputs(make("cpu", dtype), grad)
                out = fn(*inputs)
                if grad:
                    loss_of(out).backward()
                with torch.no_grad():
                    fn(*clone_inputs(inputs))
    finally:
        InterpretedFunction.run = original
    return launches + _gpu_tiles(pkg, launches)


def _gpu_tiles(pkg, launches) -> list:
    """The GPU form of launches whose tile differs under the interpreter: triton-norms' column sums take 1024
    columns a program on CPU tensors and ``_BLOCK_N`` on a GPU."""
    partials = sys.modules.get(pkg.__name__ + "._partials")
    if partials is None:
        return []
    return [{**rec, "meta": {**rec["meta"], "BLOCK_N": partials._BLOCK_N}} for rec in launches
            if rec["kernel"] == "_column_sums_kernel" and rec["meta"]["BLOCK_N"] == partials._CPU_BLOCK_N]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_launch_compiles_for_gpu_targets(request, built, device, tmp_path, package):
    """sm_90 (H100/H200) and gfx942 (MI300, 64-wide waves), each in its own subprocess, both at once."""
    if device != "cpu":
        pytest.skip("records interpreted launches (the CPU suite)")
    launches = _record(request, package)
    assert launches, f"no launch of {package} was recorded"
    if package == "norms":  # the column sums' GPU tile is compiled too, not only the interpreter's
        assert {rec["meta"]["BLOCK_N"] for rec in launches if rec["kernel"] == "_column_sums_kernel"} == {32, 1024}
    script = os.path.join(os.path.dirname(__file__), "compile_launches.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    runs = {}
    for arch, backend in (("90", "cuda"), ("gfx942", "rocm")):
        records = tmp_path / f"launches_{arch}.json"
        variant = built[f"triton-{package}"].variant(backend)
        records.write_text(json.dumps({"variants": {f"triton-{package}": str(variant)}, "launches": launches}))
        runs[arch] = subprocess.Popen([sys.executable, script, str(records), arch], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
    for arch, proc in runs.items():
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0 and f"COMPILED {len(launches)}" in out, f"{arch}: {out[-6000:]}{err[-3000:]}"
