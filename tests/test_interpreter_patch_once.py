"""The suite's interpreter speed-up (tests/_interpreter_patch_once.py) keeps kernels' values and skips only repeats."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's patch only")


@triton.jit
def _inner(x):
    return tl.where(x > 0, tl.exp(x), -x)


@triton.jit
def _outer(x):
    return _inner(x) * 2.0 + _inner(x + 1.0)


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, _outer(x) + tl.sum(_inner(x), axis=0), mask=offs < n)


def test_nested_helpers_compute_the_same_and_the_launch_swaps_once(monkeypatch):
    from triton.runtime import interpreter

    from tests import _interpreter_patch_once

    assert getattr(interpreter._patch_lang, "_patched_once", False), "conftest installs the patch"
    assert _interpreter_patch_once.install() is False  # once per process

    swaps = []  # the functions whose call reached the interpreter's own swap
    patch_lang = interpreter._patch_lang

    def counting(fn):
        scope = patch_lang(fn)
        if not isinstance(scope, _interpreter_patch_once._KeptScope):
            swaps.append(fn.__name__)
        return scope

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    for n in (37, 64, 1):
        x = torch.randn(n, dtype=torch.float64).float()
        y = torch.full_like(x, float("nan"))
        _kernel[(1,)](x, y, n, BLOCK=64)
        f = lambda v: torch.where(v > 0, v.exp(), -v)  # noqa: E731
        x64 = x.double()
        torch.testing.assert_close(y.double(), f(x64) * 2 + f(x64 + 1) + f(x64).sum(), rtol=1e-5, atol=1e-5)
    # each launch swaps `triton.language` once, and `tl.sum` (its module holds `triton.language.core`, which the
    # kernel's module does not) swaps `core` once; the helpers' 4 calls reuse the launch's swap
    assert swaps == ["_kernel", "sum"] * 3
