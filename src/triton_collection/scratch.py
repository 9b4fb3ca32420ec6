"""Temporary folders that live as long as the process: builds loaded for one run and their private HF caches.

Standard library only, so that a caller can make an ``HF_HOME`` here before ``huggingface_hub`` is imported.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

__all__ = ["scratch_dir"]


def scratch_dir(prefix: str) -> Path:
    """A new temporary folder, removed when this process exits (modules loaded from it keep reading it until then)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return Path(path)
