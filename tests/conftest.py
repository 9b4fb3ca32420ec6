"""Shared fixtures: build the collection once, install it into a private HF cache, load by Hub name.

Environment is fixed here, before torch/triton/huggingface_hub are imported by any test:
- ``TRITON_INTERPRET=1`` unless ``TEST_DEVICE=cuda`` (the GPU run), so kernels run on CPU tensors;
- ``HF_HOME`` points at a fresh temporary folder (removed at exit) and ``HF_HUB_OFFLINE=1``: tests load the
  kernels exactly as users do (``kernels.get_kernel("<org>/triton-norms", version=1)``),
  never by importing ``torch-ext/``.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

DEVICE = os.environ.get("TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
_HF_HOME = tempfile.mkdtemp(prefix="triton-collection-hf-")
atexit.register(shutil.rmtree, _HF_HOME, ignore_errors=True)  # each process (xdist worker) removes its own
os.environ["HF_HOME"] = _HF_HOME
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("KERNELS_CACHE", None)
os.environ.pop("LOCAL_KERNELS", None)
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402

if DEVICE == "cpu":
    from tests._interpreter_patch_once import install as _install_interpreter_patch_once

    _install_interpreter_patch_once()  # nested jit helpers reuse their launch's language swap (a third faster)

ROOT = Path(__file__).resolve().parents[1]
ORG = "triton-collection"


@pytest.fixture(scope="session")
def device() -> str:
    """``"cpu"`` (Triton interpreter) or ``"cuda"``."""
    return DEVICE


@pytest.fixture(scope="session")
def hf_home() -> Path:
    """The private HF_HOME every test of the session shares."""
    return Path(_HF_HOME)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Every package rendered (with the local ``torch-cpu`` variant) into a temporary dist/hub."""
    from triton_collection.build import build_collection
    from triton_collection.manifest import load_manifest

    out = tmp_path_factory.mktemp("dist") / "hub"
    return {b.package.name: b for b in build_collection(load_manifest(ROOT), out, org=ORG, cpu_variant=True)}


@pytest.fixture(scope="session")
def installed(built):
    """The builds laid into the private HF cache: ``{name: InstalledPackage}``."""
    from triton_collection.install import install_local

    return {name: install_local(b, org=ORG) for name, b in built.items()}


def _hub_fixture(hub_name: str):
    """A session fixture loading ``<ORG>/<hub_name>`` v1 by Hub name, offline, the way users load it."""

    @pytest.fixture(scope="session")
    def load(installed):
        import kernels

        return kernels.get_kernel(f"{ORG}/{hub_name}", version=1)

    load.__doc__ = f"{hub_name} v1 loaded by Hub name, offline, the way users load it."
    return load


norms = _hub_fixture("triton-norms")
activations = _hub_fixture("triton-activations")
softmax = _hub_fixture("triton-softmax")
matmul = _hub_fixture("triton-matmul")
attention = _hub_fixture("triton-attention")


def pytest_terminal_summary(terminalreporter):
    """The number of hypothesis cases the reliability generators ran (tests/test_reliability_properties.py)."""
    import sys

    mod = sys.modules.get("tests.test_reliability_properties")
    if mod is not None and getattr(mod, "COUNTS", None):
        terminalreporter.write_line(f"reliability: {sum(mod.COUNTS.values())} generated cases {dict(mod.COUNTS)}")


# The test files that take the longest on the CPU (minutes under the interpreter), collected first: `make test` hands
# out work in collection order (`--dist loadgroup`), and the hypothesis module (one group, one process) started last
# would run alone at the end.
_LONGEST_FIRST = ("test_reliability_properties.py", "test_demo.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keeps its order


if DEVICE == "cuda":

    @pytest.fixture(autouse=True)
    def _release_cached_gpu_memory():
        """On the GPU run, give each test's freed blocks back to the driver: the caching allocator otherwise keeps
        every worker's peak (the all-values fp32 tests hold several GiB), and with `-n 14` processes on one GPU the
        sum of those peaks ran out of memory (session 54, `--dist load` over the whole suite)."""
        yield
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
