"""Lay rendered builds into the Hugging Face cache so ``kernels`` loads them by Hub name.

The layout is the one ``huggingface_hub`` writes for a full ``snapshot_download`` of a
kernel repo, which ``kernels`` reads offline (``HF_HUB_OFFLINE=1``)::

    <cache>/kernels--<org>--<name>/refs/v<version>          # holds <commit>
    <cache>/kernels--<org>--<name>/snapshots/<commit>/...   # the Hub tree of that version

``<cache>`` is ``$KERNELS_CACHE`` if set, else huggingface_hub's cache (``$HF_HUB_CACHE``,
``$HF_HOME/hub``, ...). After it, ``get_kernel("<org>/<name>", version=<version>)`` and
``get_kernel(..., revision=<commit>)`` load the build with no network.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants
from huggingface_hub.file_download import repo_folder_name

from .build import BuiltPackage, tree_commit
from .manifest import check_org

__all__ = ["InstalledPackage", "cache_dir", "install_local"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InstalledPackage:
    """A build laid into the cache: ``repo_id`` at ``version`` resolves to ``commit``."""

    repo_id: str
    version: int
    commit: str
    snapshot: Path


def cache_dir() -> Path:
    """The cache ``kernels`` reads: ``$KERNELS_CACHE``, else huggingface_hub's hub cache."""
    return Path(os.environ.get("KERNELS_CACHE") or constants.HF_HUB_CACHE)


def install_local(built: BuiltPackage, *, org: str, cache: Path | None = None) -> InstalledPackage:
    """Install one rendered package into the cache as ``<org>/<name>`` at its version.

    Reinstalling the same tree is a no-op apart from the ref (a snapshot of its commit whose files were changed in
    the cache is laid again); a changed tree gets a new
    commit, and the ``v<version>`` ref moves to it (the old snapshot stays, so a
    ``revision=<old commit>`` pin keeps loading the old build).

    Args:
        built: from :func:`triton_collection.build.build_package`.
        org: Hub organisation of the repo id.
        cache: cache folder; default :func:`cache_dir`.

    Raises:
        ValueError: ``org`` is not a Hub organisation name (``manifest.check_org``).
    """
    check_org(org)
    cache = Path(cache) if cache is not None else cache_dir()
    repo_id = f"{org}/{built.package.name}"
    commit = tree_commit(built.path)
    repo_dir = cache / repo_folder_name(repo_id=repo_id, repo_type="kernel")
    snapshot = repo_dir / "snapshots" / commit
    # a snapshot folder of this commit that no longer holds exactly the tree (files deleted or edited in the cache)
    # is laid again: it was kept, and the install reported a revision that did not load
    if not snapshot.is_dir() or tree_commit(snapshot) != commit:
        tmp = snapshot.with_name(commit + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(built.path, tmp)
        stale = snapshot.with_name(commit + ".stale")  # a changed snapshot is moved aside, then removed
        shutil.rmtree(stale, ignore_errors=True)
        if snapshot.exists() or snapshot.is_symlink():
            snapshot.rename(stale)
        tmp.rename(snapshot)  # atomic: a reader never sees half a snapshot
        shutil.rmtree(stale, ignore_errors=True)
    refs = repo_dir / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / f"v{built.package.version}").write_text(commit, encoding="utf-8")
    log.info("installed %s v%d as commit %s in %s", repo_id, built.package.version, commit, cache)
    return InstalledPackage(repo_id=repo_id, version=built.package.version, commit=commit, snapshot=snapshot)
