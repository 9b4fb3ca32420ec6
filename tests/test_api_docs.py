"""The public docstrings name the errors the bad-input catalog expects.

For every case of ``test_reliability_bad_inputs.CATALOG`` (id ``<fixture>-<function>-...``), the exception class
the case expects must be named in the "Raises" part of that public function's docstring: a paragraph that starts
with "Raises" or holds "Raises:" ("Returns / Raises: as :func:`flash_attention` ..."), together with the Raises
parts of the package functions it refers to there with ``:func:``. A sparse or nested tensor case also needs the
word "sparse" / "nested" there. Reads docstrings only: no kernel runs. Layer classes are not covered: the catalog
calls functions only, and the layers' docstrings (the module each replaces, its numerics) have no Raises parts.
"""

from __future__ import annotations

import inspect
import re

import pytest

from .test_reliability_bad_inputs import CATALOG


def raises_text(pkg, name: str, seen=()) -> str:
    """The Raises paragraphs of ``pkg.<name>``'s docstring and of the functions they refer to."""
    doc = inspect.getdoc(getattr(pkg, name)) or ""
    parts = [p for p in doc.split("\n\n") if re.search(r"\bRaises\b[^\n:]*:", p)]
    text = "\n".join(p[re.search(r"\bRaises\b", p).start():] if p.lstrip().startswith("Raises") else p
                     for p in parts)
    for ref in re.findall(r":func:`(\w+)`", text):
        if ref in pkg.__all__ and ref != name and ref not in seen:
            text += "\n" + raises_text(pkg, ref, seen + (name,))
    return text


CASES = [pytest.param(*p.values, id=p.id) for p in CATALOG]  # without the xfail marks: docs are checked regardless


@pytest.mark.parametrize("fixture, call, exc, words", CASES)
def test_docstring_names_the_catalog_error(request, fixture, call, exc, words):
    pkg = request.getfixturevalue(fixture)
    case = request.node.callspec.id
    name = case[len(fixture) + 1:].split("-")[0]
    assert name in pkg.__all__, f"case {case}: {name} is not a public name of {fixture}"
    text = raises_text(pkg, name)
    assert re.search(rf"\b{exc.__name__}\b", text), \
        f"{fixture}.{name}: the docstring's Raises part does not name {exc.__name__} (case {case}):\n{text or '(none)'}"
    for kind in ("sparse", "nested"):
        if f"-{kind}" in case:
            assert kind in text, f"{fixture}.{name}: the Raises part does not mention {kind} tensors:\n{text}"
