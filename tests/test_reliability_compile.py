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

import contextlib
import importlib
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


@contextlib.contextmanager
def _recording(pkg, package):
    """Records the distinct interpreted launches of ``pkg`` (triton-``package``)'s kernels into the list it yields."""
    from triton.runtime.interpreter import InterpretedFunction

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
        yield launches
    finally:
        InterpretedFunction.run = original


def _record(request, package) -> list:
    """The distinct launches of ``package``'s catalog samples (both dtypes of each sample)."""
    pkg = _pkg(request, package)
    with _recording(pkg, package) as launches:
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
    if package == "softmax":  # the inner tiles' looped forms: both passes in one program, and N split (two phases)
        for kernel in ("_inner_fwd_kernel", "_inner_bwd_kernel"):
            assert {rec["meta"].get("PHASE") for rec in launches if rec["kernel"] == kernel} == {0, 1, 2}, kernel
    _compile_for_targets(built, package, launches, tmp_path)


def _compile_for_targets(built, package, launches, tmp_path) -> None:
    """Compiles ``launches`` for sm_90 and gfx942 in two subprocesses at once; every one must compile."""
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


# ----------------------------------------------------------------------------- persistent teams (GPU-only paths)

@contextlib.contextmanager
def _teams_on_cpu(pkg, package):
    """The shipped team tiers on CPU tensors too (off by default there), on any row, with as many multiprocessors
    as an H200 (the interpreter runs a team as two launches, PHASE 1 publishes and PHASE 2 gathers and writes, so
    that no program waits on one not yet run; a GPU runs it as one, PHASE 0)."""
    team = importlib.import_module(pkg.__name__ + "._team")
    cpu_sms, team.CPU_SMS = team.CPU_SMS, 132
    team.sm_count.cache_clear()  # cached per device: an earlier call has kept CPU_SMS
    try:
        with _team_switch(pkg, package):
            yield
    finally:
        team.CPU_SMS = cpu_sms
        team.sm_count.cache_clear()


@contextlib.contextmanager
def _team_switch(pkg, package):
    """The package's switch for teams on CPU tensors, on (softmax: on rows of any alignment too)."""
    if package == "softmax":
        launch = importlib.import_module(pkg.__name__ + "._launch")
        saved = launch.TEAM_ON_CPU, launch.TEAM_ALIGNED_ROWS_ONLY
        launch.TEAM_ON_CPU, launch.TEAM_ALIGNED_ROWS_ONLY = True, False
        launch.retuned()
        try:
            yield
        finally:
            launch.TEAM_ON_CPU, launch.TEAM_ALIGNED_ROWS_ONLY = saved
            launch.retuned()
    else:
        wide = importlib.import_module(pkg.__name__ + "._wide")
        saved = wide.WIDE_ON_CPU
        wide.WIDE_ON_CPU = True
        try:
            yield
        finally:
            wide.WIDE_ON_CPU = saved


def _team_calls(pkg, package) -> None:
    """Calls whose rows go to teams under the shipped tiers (a bf16 and an fp32 width each, at the narrowest team
    rows: the interpreter's time grows with the width), forward and backward, with the options that change a team
    kernel's constexprs (mask, scale, causal, log; smoothing, z-loss, reductions, inference; bias, residual, no
    affine)."""
    torch.manual_seed(0)
    if package == "softmax":
        x = torch.randn(2, 70000, dtype=torch.bfloat16).requires_grad_()  # 140 KB: forward and backward teams
        mask = torch.zeros(70000, dtype=torch.bfloat16)
        for f in (pkg.softmax, pkg.log_softmax):
            for kw in ({}, dict(scale=0.5, mask=mask), dict(causal=True)):
                f(x, **kw).sum().backward()
        for n, dtype in ((40000, torch.bfloat16), (20000, torch.float32)):
            x = torch.randn(2, n, dtype=dtype).requires_grad_()
            t = torch.tensor([3, n - 1])
            for kw in ({}, dict(label_smoothing=0.1, z_loss=1e-4, reduction="sum"), dict(reduction="none")):
                pkg.cross_entropy(x, t, **kw).sum().backward()
                with torch.no_grad():
                    pkg.cross_entropy(x, t, **kw)
        pkg.softmax(x).sum().backward()
    else:
        for n, dtype in ((40000, torch.bfloat16), (20000, torch.float32)):
            x = torch.randn(2, n, dtype=dtype).requires_grad_()
            r = torch.randn(2, n, dtype=dtype)
            w, b = (torch.rand(n, dtype=dtype) + 0.5).requires_grad_(), torch.randn(n, dtype=dtype).requires_grad_()
            pkg.rms_norm(x, w).sum().backward()
            pkg.rms_norm(x, w, b).sum().backward()
            pkg.layer_norm(x, w, b).sum().backward()
            pkg.layer_norm(x).sum().backward()
            pkg.add_rms_norm(x, r, w)[0].sum().backward()
            with torch.no_grad():
                pkg.rms_norm(x, w)
                pkg.layer_norm(x, w, b)


@pytest.mark.parametrize("package", ["softmax", "norms"])
def test_team_kernels_compile_for_gpu_targets(request, built, device, tmp_path, package):
    """The persistent team kernels run only on GPUs by default, so the catalog's CPU runs never record them (session
    50: a cross-entropy team kernel that bound two types to one name compiled nowhere but ran under the
    interpreter). Their launches under the shipped tiers, switched on for CPU tensors, with the interpreter's two
    phases compiled as the GPU's one (PHASE 0), for sm_90 and gfx942."""
    if device != "cpu":
        pytest.skip("records interpreted launches (the CPU suite)")
    pkg = _pkg(request, package)
    with _teams_on_cpu(pkg, package), _recording(pkg, package) as launches:
        _team_calls(pkg, package)
    gpu = []
    for rec in launches:
        if "PHASE" in rec["meta"]:
            rec = {**rec, "meta": {**rec["meta"], "PHASE": 0}}
        if rec not in gpu:
            gpu.append(rec)
    kernels = {rec["kernel"] for rec in gpu if rec["meta"].get("PHASE") == 0}
    want = ({"_softmax_team_fwd_kernel", "_softmax_team_bwd_kernel", "_cross_entropy_team_fwd_kernel"}
            if package == "softmax" else {"_rms_team_fwd_kernel", "_ln_team_fwd_kernel", "_rms_team_bwd_kernel",
                                          "_ln_team_bwd_kernel"})
    assert want <= kernels, kernels
    _compile_for_targets(built, package, gpu, tmp_path)
