"""Test-suite speed-up for the Triton interpreter: patch ``triton.language`` once per launch, not once per call.

Under ``TRITON_INTERPRET=1`` every launch (``GridExecutor.__call__``) swaps ``triton.language``'s builtins for
interpreted ones (``interpreter._patch_lang``) and puts them back when the launch ends. Every call of a nested
``@triton.jit`` helper inside the kernel repeats that swap (``InterpretedFunction.__call__``), although the launch
has already made it: the same modules, the same replacements, and the repeated swap's scope is never restored. In
the property tests that repetition was 31% of the interpreter's time (cProfile, session 62: 8.5 of 27 s).

``install()`` skips a nested call's swap when the running launch has already swapped every language module the
helper's globals hold; anything else goes through the interpreter's own code. What a kernel computes is unchanged:
the helper runs against the same interpreted builtins. Where this Triton's interpreter lacks the names used here,
``install()`` does nothing (the suite is then only slower).
"""

from __future__ import annotations

import inspect


class _KeptScope:
    """What a skipped swap returns: nothing to restore (the launch's own scope restores the modules)."""

    def restore(self):
        pass


_KEPT = _KeptScope()


def install() -> bool:
    """Make nested jit calls reuse the running launch's swap. Returns whether the interpreter was patched."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    if executor is None or patch_lang is None or getattr(patch_lang, "_patched_once", False):
        return False
    langs_of = (tl, tl.core)
    swapped: list[set | None] = [None]  # ids of the language modules the running launch swapped; None: no launch
    langs_by_fn: dict = {}  # a jit function's language modules (its module's globals: read once)

    def _patch_lang(fn):
        langs = langs_by_fn.get(fn)
        if langs is None:
            langs = langs_by_fn[fn] = frozenset(
                id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs_of)
        if swapped[0] is not None and langs and langs <= swapped[0]:
            return _KEPT
        scope = patch_lang(fn)
        if swapped[0] is not None:
            swapped[0] |= langs
        return scope

    launch = executor.__call__

    def __call__(self, *args, **kwargs):
        outer, swapped[0] = swapped[0], set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            swapped[0] = outer

    _patch_lang._patched_once = True
    interpreter._patch_lang = _patch_lang
    executor.__call__ = __call__
    return True
