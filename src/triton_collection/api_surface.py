"""The versioned API of a package, read from source with ``ast`` (nothing is imported), and the rule
that guards a Hub version branch.

A package's API is what ``kernels`` users can reach by name on ``get_kernel(repo, version=N)``:

- the names in ``__init__.py``'s ``__all__``, and for those defined as functions (in
  ``__init__.py`` or imported from a sibling module with ``from .mod import name``) their signature;
- for ``__all__`` names that are classes, their constructor: ``__init__``'s signature, or a dataclass's fields;
- the layer classes of ``layers.py`` (public ``nn.Module`` classes that ``kernelize`` maps by name),
  the signature of their ``forward`` and their ``has_backward`` / ``can_torch_compile`` flags.

Within one major version (one ``v<N>`` branch) additions are allowed: new ``__all__`` names, new
layers, new parameters with defaults on functions. Everything already published must stay: a removed
name or layer, a parameter removed, renamed, reordered, turned keyword-only or given a different
default, any change at all to a layer's ``forward`` (``kernelize`` needs it to match the module
it replaces), or a layer flag turned off (``kernelize`` then silently keeps the original forward in training or
under ``torch.compile``) is a breaking change that needs the next major version.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

__all__ = ["ApiSurface", "Param", "breaking_changes", "format_signature", "read_surface", "surface_of_dir"]

_POSITIONAL = ("positional_only", "positional_or_keyword")


@dataclass(frozen=True)
class Param:
    """One parameter: its name, kind (``inspect.Parameter`` kind names, lower case) and default source."""

    name: str
    kind: str
    default: str | None = None

    def __str__(self) -> str:
        prefix = {"var_positional": "*", "var_keyword": "**"}.get(self.kind, "")
        return f"{prefix}{self.name}" + (f"={self.default}" if self.default is not None else "")


Signature = tuple[Param, ...]


def format_signature(sig: Signature) -> str:
    """``(x, weight=None, *, eps=1e-06)``: a signature as Python writes it."""
    parts: list[str] = []
    for i, p in enumerate(sig):
        if p.kind == "keyword_only" and not any(q.kind in ("keyword_only", "var_positional") for q in sig[:i]):
            parts.append("*")
        parts.append(str(p))
        if p.kind == "positional_only" and (i + 1 == len(sig) or sig[i + 1].kind != "positional_only"):
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


@dataclass(frozen=True)
class ApiSurface:
    """What one build exposes.

    Attributes:
        names: ``__all__`` of the package.
        functions: signature of each ``__all__`` name that is a plain function we could locate.
        layers: forward signature (without ``self``) of each public class of ``layers.py``.
        layer_flags: each layer's ``has_backward`` and ``can_torch_compile`` as written (``kernels``' defaults,
            ``True`` / ``False``, where the class does not set them).
    """

    names: tuple[str, ...]
    functions: dict[str, Signature]
    layers: dict[str, Signature]
    layer_flags: dict[str, dict[str, str]] = field(default_factory=dict)


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_self: bool) -> Signature:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    params = [
        Param(a.arg, "positional_only" if i < len(args.posonlyargs) else "positional_or_keyword", d)
        for i, (a, d) in enumerate(zip(positional, defaults))
    ]
    if args.vararg:
        params.append(Param(args.vararg.arg, "var_positional"))
    params += [
        Param(a.arg, "keyword_only", None if d is None else ast.unparse(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)
    ]
    if args.kwarg:
        params.append(Param(args.kwarg.arg, "var_keyword"))
    return tuple(params[1:] if drop_self and params else params)


def _is_dataclass(cls: ast.ClassDef) -> bool:
    """Decorated ``@dataclass``, ``@dataclass(...)`` or ``@dataclasses.dataclass(...)``."""
    for decorator in cls.decorator_list:
        fn = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)) == "dataclass":
            return True
    return False


def _constructor(cls: ast.ClassDef) -> Signature | None:
    """A class's constructor signature: its ``__init__`` without ``self``, or a dataclass's fields in order (bare
    annotations and annotated defaults, ``ClassVar`` left out); None for any other class."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        return _signature(init, drop_self=True)
    if not _is_dataclass(cls):
        return None
    return tuple(Param(n.target.id, "positional_or_keyword", None if n.value is None else ast.unparse(n.value))
                 for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and "ClassVar" not in ast.unparse(n.annotation))


_FLAG_DEFAULTS = {"has_backward": "True", "can_torch_compile": "False"}  # kernels' getattr defaults


def _layer_flags(cls: ast.ClassDef) -> dict[str, str]:
    """``has_backward`` / ``can_torch_compile`` as the class body assigns them (source text), defaults elsewhere."""
    flags = dict(_FLAG_DEFAULTS)
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Name) and t.id in flags:
                flags[t.id] = ast.unparse(stmt.value)
    return flags


def _module_source(files: Mapping[str, str], module: str) -> tuple[str | None, str]:
    """Source of a module named relative to the package root (``""`` is the root) and its package."""
    if not module:
        return files.get("__init__.py"), ""
    base = module.replace(".", "/")
    if f"{base}.py" in files:
        return files[f"{base}.py"], module.rpartition(".")[0]
    return files.get(f"{base}/__init__.py"), module


def _find_function(files: Mapping[str, str], module: str, name: str, depth: int = 0) -> Signature | None:
    """Signature of ``name`` as defined in (or re-exported by relative import into) ``module``."""
    source, package = _module_source(files, module)
    if source is None or depth > 4:
        return None
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return _signature(node, drop_self=False)
        if isinstance(node, ast.ClassDef) and node.name == name:
            return _constructor(node)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    parts = package.split(".") if package else []
                    base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                    return _find_function(files, target, alias.name, depth + 1)
    return None


def read_surface(files: Mapping[str, str]) -> ApiSurface:
    """The API of one build variant, from ``{relative path: source text}`` of its ``.py`` files.

    Raises:
        ValueError: no ``__init__.py``, or an ``__all__`` that is not a literal list/tuple of strings.
    """
    if "__init__.py" not in files:
        raise ValueError("the build has no __init__.py")
    names: tuple[str, ...] = ()
    for node in ast.parse(files["__init__.py"]).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                names = tuple(ast.literal_eval(node.value))
            except ValueError as err:
                raise ValueError("__init__.py: __all__ must be a literal list of strings") from err
    functions = {}
    for name in names:
        sig = _find_function(files, "", name)
        if sig is not None:
            functions[name] = sig
    layers: dict[str, Signature] = {}
    flags: dict[str, dict[str, str]] = {}
    if "layers.py" in files:
        for node in ast.parse(files["layers.py"]).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                forward = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
                layers[node.name] = _signature(forward, drop_self=True) if forward else ()
                flags[node.name] = _layer_flags(node)
    return ApiSurface(names=names, functions=functions, layers=layers, layer_flags=flags)


def surface_of_dir(path: Path) -> ApiSurface:
    """:func:`read_surface` over the ``.py`` files below ``path`` (a build variant or source folder)."""
    path = Path(path)
    files = {
        p.relative_to(path).as_posix(): p.read_text(encoding="utf-8")
        for p in path.rglob("*.py")
        if "__pycache__" not in p.parts
    }
    return read_surface(files)


def _function_breaks(name: str, old: Signature, new: Signature) -> list[str]:
    """Ways in which a call that worked against ``old`` fails or changes meaning against ``new``."""
    problems = []
    new_by_name = {p.name: p for p in new}
    old_pos = [p for p in old if p.kind in _POSITIONAL]
    new_pos = [p for p in new if p.kind in _POSITIONAL]
    for i, p in enumerate(old_pos):
        if i >= len(new_pos) or new_pos[i].name != p.name:
            problems.append(f"parameter {p.name!r} is no longer positional argument {i + 1}")
        elif p.kind == "positional_or_keyword" and new_pos[i].kind == "positional_only":
            problems.append(f"parameter {p.name!r} became positional-only")
    for p in old:
        q = new_by_name.get(p.name)
        if p.kind in ("var_positional", "var_keyword"):
            if not any(x.kind == p.kind for x in new):
                problems.append(f"{p} was removed")
        elif q is None:
            problems.append(f"parameter {p.name!r} was removed")
        elif p.kind == "keyword_only" and q.kind not in ("keyword_only", "positional_or_keyword"):
            problems.append(f"keyword argument {p.name!r} can no longer be passed by keyword")
        elif p.default is not None and q.default is None:
            problems.append(f"parameter {p.name!r} lost its default ({p.default})")
        elif p.default != q.default:
            problems.append(f"parameter {p.name!r} default changed from {p.default} to {q.default}")
    old_names = {p.name for p in old}
    for q in new:
        if q.name not in old_names and q.kind in (*_POSITIONAL, "keyword_only") and q.default is None:
            problems.append(f"new parameter {q.name!r} has no default")
    return [f"{name}(): {p}" for p in problems]


def breaking_changes(old: ApiSurface, new: ApiSurface) -> list[str]:
    """What ``new`` removes or changes of ``old`` (empty when ``new`` only adds). One line each."""
    problems = [f"__all__ no longer exports {n!r}" for n in old.names if n not in new.names]
    for name, sig in old.functions.items():
        if name in new.names and name in new.functions:
            problems += _function_breaks(name, sig, new.functions[name])
        elif name in new.names:
            problems.append(f"{name} is no longer a function")
    for layer, sig in old.layers.items():
        if layer not in new.layers:
            problems.append(f"layer {layer!r} was removed")
        elif new.layers[layer] != sig:
            problems.append(f"layer {layer}.forward{format_signature(sig)} changed to forward{format_signature(new.layers[layer])}")
    for layer, old_flags in old.layer_flags.items():
        new_flags = new.layer_flags.get(layer)  # None: the layer was removed (reported above)
        for flag, value in old_flags.items():
            if new_flags is not None and value == "True" and new_flags[flag] != "True":
                problems.append(f"layer {layer}.{flag} changed from True to {new_flags[flag]}")
    return problems
