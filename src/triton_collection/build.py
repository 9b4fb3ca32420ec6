"""Render each package of the collection into the tree its Hub repo holds.

``dist/hub/<name>/`` gets:

- ``build.toml`` (kernel-builder edition 5, ``[torch-noarch]``), ``flake.nix``, ``README.md`` (the card);
- ``torch-ext/<python_name>/``: the source, so kernel-builder can rebuild the repo;
- ``benchmarks/benchmark_*.py`` for ``kernels benchmark``;
- ``build/torch-<backend>/``: the package itself plus a generated ``_ops.py`` and a
  ``metadata.json`` whose digest is computed with ``kernels_data``.

Build ids are ``_<python_name>_<backend>_<hash>`` where ``<hash>`` is the first 10 hex
digits of the SHA-256 of the package's source files: two builds share an id (and would
replace each other in ``sys.modules``) only when their code is identical.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import kernels_data

from .manifest import Collection, Package, render_package_build_toml

__all__ = ["BACKENDS", "BuiltPackage", "build_collection", "build_package", "source_hash", "tree_commit"]

log = logging.getLogger(__name__)

BACKENDS = ("cuda", "rocm", "xpu")
"""Backends every published build carries. ``cpu`` is added for local test builds only."""

_KERNELS_MINVER = "0.17.0"


@dataclass(frozen=True)
class BuiltPackage:
    """Where a package was rendered and what it holds."""

    package: Package
    path: Path
    backends: tuple[str, ...]
    source_hash: str

    def variant(self, backend: str) -> Path:
        """Folder of the ``torch-<backend>`` build variant."""
        return self.path / "build" / f"torch-{backend}"


def _template(name: str) -> str:
    return resources.files("triton_collection").joinpath("templates", name).read_text(encoding="utf-8")


def _source_files(src: Path, extensions: list[str]) -> list[Path]:
    suffixes = {f".{ext.lstrip('.')}" for ext in extensions}
    return sorted(
        p for p in src.rglob("*") if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts
    )


def source_hash(src: Path, extensions: list[str]) -> str:
    """SHA-256 (hex, first 10 digits) over the relative paths and bytes of a package's source files."""
    digest = hashlib.sha256()
    for path in _source_files(src, extensions):
        digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:10]


def tree_commit(tree: Path) -> str:
    """A 40-hex "commit" id for a rendered Hub tree: SHA-1 over its relative paths and bytes.

    Used as the revision of local installs, so ``revision=<commit>`` pins one exact build.
    """
    digest = hashlib.sha1()
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        digest.update(path.relative_to(tree).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _public_names(src: Path) -> tuple[list[str], list[str]]:
    """``__all__`` of the package and the layer classes of ``layers.py``, read without importing."""
    functions: list[str] = []
    for node in ast.walk(ast.parse((src / "__init__.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            functions = [ast.literal_eval(elt) for elt in node.value.elts]
    layers: list[str] = []
    layers_py = src / "layers.py"
    if layers_py.is_file():
        tree = ast.parse(layers_py.read_text(encoding="utf-8"))
        layers = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
    return [f for f in functions if f != "layers"], layers


def _write_variant(variant: Path, src: Path, files: list[Path], package: Package, backend: str, collection: Collection, namespace: str) -> None:
    variant.mkdir(parents=True)
    for path in files:
        target = variant / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (variant / "_ops.py").write_text(_template("_ops.py.tmpl").format(namespace=namespace), encoding="utf-8")
    metadata = {
        "name": package.name,
        "id": namespace,
        "version": package.version,
        "license": collection.general.get("license", "Apache-2.0"),
        "python-depends": [],
        "backend": {"type": backend},
        "kernels-minver": _KERNELS_MINVER,
    }
    if "upstream" in collection.general:
        metadata["upstream"] = collection.general["upstream"]
    digest = kernels_data.Digest.hash_variant(kernels_data.DigestAlgorithm.SHA256, variant)
    metadata["digest"] = {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}
    (variant / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    kernels_data.Metadata.read_from_file(variant / "metadata.json")  # fail here, not at load time


def build_package(collection: Collection, package: Package, out: Path, *, org: str, cpu_variant: bool = False) -> BuiltPackage:
    """Render one package into ``out/<package.name>/`` (replacing what was there).

    Args:
        collection: the parsed manifest.
        package: which package.
        out: parent folder, usually ``dist/hub``.
        org: Hub organisation written into build.toml and the card.
        cpu_variant: also write ``build/torch-cpu`` (local test builds; never published).

    Returns:
        The rendered package.
    """
    src = collection.root / "torch-ext" / package.python_name
    extensions = package.noarch.get("pyext", ["py"])
    files = _source_files(src, extensions)
    if any(p.name == "_ops.py" for p in files):
        raise ValueError(f"{src}/_ops.py exists: it is generated by the build, remove it from the source")
    backends = BACKENDS + (("cpu",) if cpu_variant else ())
    dest = out / package.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)

    (dest / "build.toml").write_text(render_package_build_toml(collection, package, org=org, backends=list(backends)), encoding="utf-8")
    (dest / "flake.nix").write_text(_template("flake.nix.tmpl").format(name=package.name), encoding="utf-8")
    functions, layers = _public_names(src)
    (dest / "README.md").write_text(
        _template("card.md.tmpl").format(
            license=collection.general.get("license", "apache-2.0").lower(),
            name=package.name,
            python_name=package.python_name,
            description=package.description,
            repo_id=f"{org}/{package.name}",
            version=package.version,
            functions="\n".join(f"- `{f}`" for f in functions) or "(none)",
            layers="\n".join(f"- `{layer}`" for layer in layers) or "(none)",
        ),
        encoding="utf-8",
    )
    for path in files:
        target = dest / "torch-ext" / package.python_name / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    short = package.python_name.removeprefix("triton_")
    for bench in sorted((collection.root / "benchmarks").glob(f"benchmark_{short}*.py")):
        (dest / "benchmarks").mkdir(exist_ok=True)
        shutil.copyfile(bench, dest / "benchmarks" / bench.name)

    digest = source_hash(src, extensions)
    for backend in backends:
        namespace = f"_{package.python_name}_{backend}_{digest}"
        _write_variant(dest / "build" / f"torch-{backend}", src, files, package, backend, collection, namespace)
    log.info("built %s v%d (%s) into %s", package.name, package.version, ", ".join(backends), dest)
    return BuiltPackage(package=package, path=dest, backends=backends, source_hash=digest)


def build_collection(collection: Collection, out: Path, *, org: str | None = None, packages: list[str] | None = None, cpu_variant: bool = False) -> list[BuiltPackage]:
    """Render every package (or those named in ``packages``) into ``out``. See :func:`build_package`."""
    chosen = [collection.package(name) for name in packages] if packages else list(collection.packages)
    return [build_package(collection, pkg, Path(out), org=org or collection.org, cpu_variant=cpu_variant) for pkg in chosen]
