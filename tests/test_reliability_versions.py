"""Concurrency: two versions of a package loaded in one process do not clobber each other's ops.

A fresh Python process (its own Hugging Face cache, so the session's cache keeps only v1) installs
two builds of triton-activations with the repository's own tooling (``build_package`` +
``install_local``): v1 from this checkout and v2 from a copy whose op table maps ``silu`` to the
GELU kernel and ``gelu`` to the SiLU kernel (a v2 whose ops really differ). ``kernels.get_kernel``
loads ``version=1`` and ``version=2`` side by side; the process checks that their op namespaces
differ, that each version's ops are registered in its own namespace, and that calls interleaved
in eager mode, in backward and under ``torch.compile(fullgraph=True)`` give each version's own
results. A v2 with code identical to v1 (only the version bumped) shares v1's namespace and
therefore the same, identical, ops: that is checked too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from .conftest import DEVICE, ROOT

SCRIPT = textwrap.dedent(r'''
    import dataclasses, os, shutil, sys
    from pathlib import Path
    device = sys.argv[2]
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from triton_collection.scratch import scratch_dir
    os.environ["HF_HOME"] = str(scratch_dir("two-versions-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    for k in ("HF_HUB_CACHE", "KERNELS_CACHE", "LOCAL_KERNELS"):
        os.environ.pop(k, None)
    import torch, torch.nn.functional as F
    from triton_collection.build import build_package
    from triton_collection.install import install_local
    from triton_collection.manifest import load_manifest

    root = Path(sys.argv[1])
    col = load_manifest(root)
    pkg = col.package("triton-activations")
    tmp = scratch_dir("two-versions-build-")
    # v2: a copy of the sources whose op table swaps the silu and gelu kernels
    root2 = tmp / "root2"
    shutil.copytree(root / "torch-ext", root2 / "torch-ext")
    (root2 / "benchmarks").mkdir()
    math_py = root2 / "torch-ext" / "triton_activations" / "_math.py"
    text = math_py.read_text()
    anchor = 'ACT_IDS = {"silu": 0, "gelu": 1,'
    assert anchor in text, "the v2 patch anchor moved: update tests/test_reliability_versions.py"
    math_py.write_text(text.replace(anchor, 'ACT_IDS = {"silu": 1, "gelu": 0,'))
    col2 = dataclasses.replace(col, root=root2)
    v1 = install_local(build_package(col, pkg, tmp / "v1", org="tc", cpu_variant=True), org="tc")
    v2 = install_local(build_package(col2, dataclasses.replace(pkg, version=2), tmp / "v2", org="tc",
                                     cpu_variant=True), org="tc")
    import kernels
    a = kernels.get_kernel("tc/triton-activations", version=1)
    b = kernels.get_kernel("tc/triton-activations", version=2)
    ns_a, ns_b = a._ops.NAMESPACE, b._ops.NAMESPACE
    assert ns_a != ns_b, (ns_a, ns_b)
    names = torch._C._dispatch_get_all_op_names()
    for ns in (ns_a, ns_b):
        assert {f"{ns}::act_fwd", f"{ns}::act_bwd", f"{ns}::act_fwd_out"} <= set(names), ns

    torch.manual_seed(0)
    x = torch.randn(3, 40, device=device)
    silu, gelu = F.silu(x), F.gelu(x)
    close = lambda u, v: torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
    for _ in range(2):  # interleaved, twice: neither load nor call order matters
        close(a.silu(x), silu); close(b.silu(x), gelu)
        close(b.gelu(x), silu); close(a.gelu(x), gelu)
    # backward of each version's op: its own derivative
    for mod, want in ((a, F.silu), (b, F.gelu)):
        xa = x.clone().requires_grad_(); xe = x.clone().requires_grad_()
        mod.silu(xa).sum().backward(); want(xe).sum().backward()
        close(xa.grad, xe.grad)
    # both in one compiled graph
    f = torch.compile(lambda t: (a.silu(t), b.silu(t)), fullgraph=True,
                      backend="aot_eager" if device == "cpu" else "inductor")
    ya, yb = f(x)
    close(ya, silu); close(yb, gelu)
    # the (out, x) form into preallocated buffers
    oa, ob = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    a.silu(oa, x); b.silu(ob, x)
    close(oa, silu); close(ob, gelu)

    # a v2 that only bumps the version: same code, same namespace, same (identical) ops
    norms = col.package("triton-norms")
    install_local(build_package(col, norms, tmp / "n1", org="tc", cpu_variant=True), org="tc")
    install_local(build_package(col, dataclasses.replace(norms, version=2), tmp / "n2", org="tc",
                                cpu_variant=True), org="tc")
    n1 = kernels.get_kernel("tc/triton-norms", version=1)
    n2 = kernels.get_kernel("tc/triton-norms", version=2)
    assert n1.__name__ == n2.__name__ == n1._ops.NAMESPACE  # the module name is the op namespace (metadata id)
    assert n1.rms_norm is n2.rms_norm  # v2's package reuses the already imported, identical submodules
    w = torch.randn(40, device=device)
    torch.testing.assert_close(n1.rms_norm(x, w), n2.rms_norm(x, w), rtol=0, atol=0)
    print("TWO-VERSIONS-OK", ns_a, ns_b)
''')


def test_two_versions_in_one_process_do_not_clobber_ops():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), DEVICE], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0 and "TWO-VERSIONS-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
