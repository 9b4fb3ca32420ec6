"""The collection manifest (top-level ``build.toml``) and its rendering per package.

The manifest uses kernel-builder's edition-5 vocabulary for the shared ``[general]``
and ``[torch-noarch]`` tables and adds one ``[package.<hub-name>]`` table per Hub
package. :func:`render_package_build_toml` turns one package into the build.toml that
kernel-builder (and ``kernels``' own parser) accepts.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Collection", "Package", "check_org", "load_manifest", "render_package_build_toml"]

_PACKAGE_KEYS = {"python-name", "version", "description", "torch-noarch"}


def check_org(org: str) -> str:
    """``org`` if it is a Hub organisation (or user) name that ``<org>/<package>`` repo ids can use: letters, digits,
    ``-``, ``_`` and ``.``, no ``--`` or ``..``, at most 96 characters (``huggingface_hub.utils.validate_repo_id``'s
    rules). Checked before anything is written: the org also names local folders (``dist/local/<org>``).

    Raises:
        ValueError: naming the org and the rule it breaks.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(org, str) or not org or "/" in org:
        raise ValueError(f"org {org!r} is not a Hub organisation name (one non-empty name, no '/')")
    try:
        validate_repo_id(f"{org}/package")
    except HFValidationError as err:
        raise ValueError(f"org {org!r} is not a Hub organisation name: {err}") from None
    return org


@dataclass(frozen=True)
class Package:
    """One Hub package of the collection.

    Attributes:
        name: Hub repo name, e.g. ``"triton-norms"`` (kernel-builder's name rule).
        python_name: folder under ``torch-ext/`` and Python package name, e.g. ``"triton_norms"``.
        version: major version: the Hub branch ``v<version>`` it is published to.
        description: one line for the card.
        noarch: the package's ``[torch-noarch]`` table (shared settings merged in).
    """

    name: str
    python_name: str
    version: int
    description: str
    noarch: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Collection:
    """The parsed top-level ``build.toml``.

    Attributes:
        root: folder that holds ``build.toml`` and ``torch-ext/``.
        general: shared ``[general]`` keys (edition, license, backends, ...), without ``hub``.
        org: default Hub organisation (``[general.hub] org``).
        packages: the packages, in manifest order.
    """

    root: Path
    general: dict
    org: str
    packages: tuple[Package, ...]

    def package(self, name: str) -> Package:
        """Return the package whose Hub name or Python name is ``name``, or whose Hub name without its first
        dash-separated word is (``"norms"`` for ``"triton-norms"``, as ``triton-collection bench`` reads it) where
        only one package's is; KeyError names the known ones."""
        for pkg in self.packages:
            if name in (pkg.name, pkg.python_name):
                return pkg
        short = [pkg for pkg in self.packages if pkg.name.partition("-")[2] == name]
        if len(short) == 1:
            return short[0]
        known = ", ".join(p.name for p in self.packages)
        raise KeyError(f"no package {name!r} in {self.root / 'build.toml'} (known: {known})")


_TOP_KEYS = ("general", "torch-noarch", "package")
_HUB_KEYS = ("org",)


def _table(value, path: str) -> dict:
    """``value`` if it is a TOML table; else a ValueError naming its key path (``general``, ``[package.x] torch-noarch``)."""
    if not isinstance(value, dict):
        raise ValueError(f"{path} must be a table, got {value!r}")
    return value


_KINDS = {"float": "a float", "dict": "a table", "date": "a date", "datetime": "a date-time", "time": "a time"}


def _unrenderable(value):
    """The first part of ``value`` that :func:`_toml_value` cannot write: not a string, whole number, boolean or an
    array of them (None when it can write all of it)."""
    if isinstance(value, list):
        return next((bad for v in value if (bad := _unrenderable(v)) is not None), None)
    return None if isinstance(value, (str, int, bool)) else value


def _check_renderable(table: dict, path: str) -> None:
    """Every value of ``table`` is one :func:`render_package_build_toml` writes into each package's build.toml."""
    for key, value in table.items():
        bad = _unrenderable(value)
        if bad is not None:
            kind = _KINDS.get(type(bad).__name__, type(bad).__name__)
            raise ValueError(f"{path} {key} = {value!r}: {kind} cannot be rendered into a package's build.toml "
                             "(values must be strings, whole numbers, booleans or arrays of them)")


def _read_general(data: dict) -> tuple[dict, str]:
    """``[general]`` without ``hub``, and ``[general.hub] org``, their structure checked."""
    general = dict(_table(data.get("general", {}), "general"))
    hub = _table(general.pop("hub", {}), "[general] hub")
    unknown = sorted(set(hub) - set(_HUB_KEYS))
    if unknown:
        raise ValueError(f"[general.hub] has unknown keys {unknown}; allowed: {list(_HUB_KEYS)}")
    org = hub.get("org", "")
    if not isinstance(org, str):
        raise ValueError(f"[general.hub] org must be a string (a Hub organisation name), got {org!r}")
    _check_renderable(general, "[general]")
    return general, org


def _read_package(root: Path, name: str, table, shared_noarch: dict) -> Package:
    """One ``[package.<name>]`` table, checked."""
    table = _table(table, f"[package] {name}")
    unknown = set(table) - _PACKAGE_KEYS
    if unknown:
        raise ValueError(f"[package.{name}] has unknown keys {sorted(unknown)}; allowed: {sorted(_PACKAGE_KEYS)}")
    for key in ("python-name", "version"):
        if key not in table:
            raise ValueError(f"[package.{name}] needs `{key}`")
    version = table["version"]
    if type(version) is not int or version < 1:  # 1.5 or true became v1 silently, "abc" a traceback
        raise ValueError(f"[package.{name}]: version must be a whole number >= 1 (the Hub branch v<version>), "
                         f"got {version!r}")
    if not isinstance(table["python-name"], str) or not table["python-name"].isidentifier():
        raise ValueError(f"[package.{name}]: python-name must be a Python package name, got {table['python-name']!r}")
    if not isinstance(table.get("description", ""), str):
        raise ValueError(f"[package.{name}]: description must be a string, got {table['description']!r}")
    noarch = _table(table.get("torch-noarch", {}), f"[package.{name}] torch-noarch")
    _check_renderable(noarch, f"[package.{name}.torch-noarch]")
    if not (root / "torch-ext" / table["python-name"] / "__init__.py").is_file():
        raise ValueError(f"[package.{name}]: torch-ext/{table['python-name']}/__init__.py does not exist")
    return Package(name=name, python_name=table["python-name"], version=version,
                   description=table.get("description", ""), noarch={**shared_noarch, **noarch})


def load_manifest(root: Path | str) -> Collection:
    """Parse ``<root>/build.toml``.

    Raises:
        FileNotFoundError: no build.toml in ``root``.
        ValueError: build.toml is not TOML; a top-level key other than ``general``, ``torch-noarch`` and
            ``package``; one of them (or ``[general] hub``, a package, its ``torch-noarch``) that is not a table;
            ``[general.hub]`` with a key other than a string ``org``; a ``[general]`` or ``torch-noarch`` value that
            cannot be rendered into a package's build.toml (a float, a date, a nested table); no package at all; or
            a package table that misses a key, has an unknown key, a version that is not a whole number >= 1, a
            description that is not a string, or whose source folder is absent. Each message names the key path.
    """
    root = Path(root).resolve()
    data = tomllib.loads((root / "build.toml").read_text(encoding="utf-8"))
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ValueError(f"unknown top-level keys {unknown}; allowed: {list(_TOP_KEYS)}")
    general, org = _read_general(data)
    shared_noarch = _table(data.get("torch-noarch", {}), "torch-noarch")
    _check_renderable(shared_noarch, "[torch-noarch]")
    package_tables = _table(data.get("package", {}), "package (the [package.<hub-name>] tables)")
    if not package_tables:
        raise ValueError("no [package.<hub-name>] table: the collection has no package to build")
    packages = tuple(_read_package(root, name, table, shared_noarch) for name, table in package_tables.items())
    return Collection(root=root, general=general, org=org, packages=packages)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r} as TOML")


def render_package_build_toml(collection: Collection, package: Package, *, org: str, backends: list[str]) -> str:
    """Render ``package``'s own kernel-builder build.toml (edition 5, ``[torch-noarch]``).

    Args:
        org: Hub organisation for ``[general.hub] repo-id``.
        backends: the backends this build carries (``cpu`` only in local test builds).
    """
    general = {
        "name": package.name,
        "version": package.version,
        **{k: v for k, v in collection.general.items() if k != "backends"},
        "backends": list(backends),
    }
    lines = ["[general]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in general.items()]
    lines += ["", "[general.hub]", f"repo-id = {_toml_value(f'{org}/{package.name}')}", "", "[torch-noarch]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in package.noarch.items()]
    return "\n".join(lines) + "\n"
