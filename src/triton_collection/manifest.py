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
        """Return the package whose Hub name or Python name is ``name``; KeyError names the known ones."""
        for pkg in self.packages:
            if name in (pkg.name, pkg.python_name):
                return pkg
        known = ", ".join(p.name for p in self.packages)
        raise KeyError(f"no package {name!r} in {self.root / 'build.toml'} (known: {known})")


def load_manifest(root: Path | str) -> Collection:
    """Parse ``<root>/build.toml``.

    Raises:
        FileNotFoundError: no build.toml in ``root``.
        ValueError: build.toml is not TOML, or a package table misses a key, has an unknown key, a version that is
            not a whole number >= 1, or its source folder is absent.
    """
    root = Path(root).resolve()
    data = tomllib.loads((root / "build.toml").read_text(encoding="utf-8"))
    general = dict(data.get("general", {}))
    hub = general.pop("hub", {})
    shared_noarch = data.get("torch-noarch", {})
    packages = []
    for name, table in data.get("package", {}).items():
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
        if not (root / "torch-ext" / table["python-name"] / "__init__.py").is_file():
            raise ValueError(f"[package.{name}]: torch-ext/{table['python-name']}/__init__.py does not exist")
        packages.append(
            Package(
                name=name,
                python_name=table["python-name"],
                version=version,
                description=table.get("description", ""),
                noarch={**shared_noarch, **table.get("torch-noarch", {})},
            )
        )
    return Collection(root=root, general=general, org=hub.get("org", ""), packages=tuple(packages))


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
