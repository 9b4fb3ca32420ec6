"""``argparse`` types the subcommands share: each refuses a bad value in one line naming the argument (argparse
prefixes ``argument --flag:``), before anything is built, loaded or measured."""

from __future__ import annotations

import argparse
import math

__all__ = ["file_stem", "hub_org", "non_negative_float", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _finite_float(text: str, low: float, inclusive: bool) -> float:
    """A finite number above ``low`` (or equal to it when ``inclusive``); nan and inf refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (low <= value if inclusive else low < value) or not value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number {'>=' if inclusive else '>'} {low:g}, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    return _finite_float(text, 0.0, inclusive=False)


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (nan, inf and negative numbers refused)."""
    return _finite_float(text, 0.0, inclusive=True)


def hub_org(text: str) -> str:
    """A Hub organisation name (``manifest.check_org``): it also names local folders (``dist/local/<org>``)."""
    from .manifest import check_org

    try:
        return check_org(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def file_stem(text: str) -> str:
    """A results file stem: a name, not a path (the files go into ``--out``)."""
    if not text or "/" in text or "\\" in text or text in (".", "..") or text.startswith("."):
        raise argparse.ArgumentTypeError(f"expected a file name stem without folders, got {text!r} (use --out for the folder)")
    return text
