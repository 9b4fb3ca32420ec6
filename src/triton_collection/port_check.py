"""``triton-collection port-check``: run a CUDA kernel and its Triton port side by side.

    triton-collection port-check ports/activations ports/rms_norm            # table
    triton-collection port-check ports/activations --kernel silu_and_mul --dtype bfloat16
    triton-collection port-check ports/rms_norm --json --out report.json --out report.md
    triton-collection port-check ports/activations --validate                # no GPU needed

A *port fixture* is a folder with a ``.cu`` source and a launch description, ``port.toml``::

    name = "activations"
    source = "activation_kernels.cu"        # __global__ kernels, templated on scalar_t
    dtypes = ["float32", "float16", "bfloat16"]
    params = { threshold = 0.25 }           # named constants usable in expressions
    bytes = "3 * M * d * elem"              # bytes moved per call (for GB/s)

    [[shape]]                               # >= 3; one with a prime size, one all powers of 2
    name = "small"
    M = 5
    d = 96
    # ... more [[shape]] tables; `throughput = true` marks the headline shape(s)

    [tolerance]                             # per dtype: |triton - cuda| <= atol + rtol * |cuda|
    bfloat16 = { atol = 1e-2, rtol = 1.6e-2 }

    [tensors]                               # allocated fresh per shape x dtype
    x = { shape = ["M", "2 * d"], scale = 2.0 }     # input: randn * scale + shift
    out = { shape = ["M", "d"], output = true }     # output: filled with NaN (poison) first

    [[kernel]]
    name = "silu_and_mul"
    cuda = "gated_act_kernel<scalar_t, act::silu, true>"   # the kernel; scalar_t = dtype under test
    grid = ["M"]                            # 1 to 3 expressions (x, y, z)
    block = ["min(d, 1024)"]
    shared_mem = "0"                        # dynamic shared memory in bytes (optional)
    args = ["out", "x", "int d", "float 0.0"]   # tensors by name, scalars as "<int|int64|float> <expr>"
    triton = "triton-activations:silu_and_mul"  # <hub-package of this collection>:<function>
    triton_args = ["out", "x"]              # expressions; tensor names give the Triton side's own buffers
    triton_kwargs = { rounding = "'eager'" }
    triton_returns = []                     # outputs the function returns (else it writes into its args)

A kernel may override ``dtypes``, ``bytes``, ``tensors``, ``tolerance`` and ``params``.
Expressions are Python arithmetic over the shape variables, ``params``, ``elem`` (bytes per
element of the dtype under test) and ``dtype`` (the torch dtype), with ``min``, ``max``,
``abs``, ``cdiv``, ``next_power_of_2`` and ``a if cond else b``; nothing else is evaluated.
A tensor may set ``dtype = "float32"`` (its CUDA pointer is then ``float*`` for every run).

What it does (:func:`run_port_check`): validates every description (:class:`PortError`
naming the file and key), checks for a CUDA GPU and ``nvcc``, compiles **all** kernels of all
fixtures into one extension with ``torch.utils.cpp_extension.load_inline`` (generated
launchers, ``-O3``, the GPU's own architecture, e.g. ``sm_90``; cached under
``$TMPDIR/triton-collection-port-check``), loads each Triton port the way the rest of the tooling
loads our packages (build + ``install_local`` + ``kernels.get_kernel`` by Hub name, offline),
then for every kernel x dtype x shape: fresh random inputs (seeded, the seed is reported),
poisoned outputs for each side, one launch of each, the elementwise comparison (max abs and
max relative error, mismatch count; NaN only where both sides have NaN), and the median time
of each with ``triton.testing.do_bench`` as GB/s and the ratio Triton/CUDA (> 1: the port is
faster). While timed, both sides read the same inputs, and the CUDA kernel writes the output
tensors the port writes into (not those the port returns: it allocates them per call). The exit
code is 1 when any comparison fails or a kernel raises, 2 for a bad description or a machine
without a CUDA GPU or ``nvcc``.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import tomllib
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from . import DEFAULT_ORG
from .argtypes import hub_org, positive_int

__all__ = [
    "CheckRow",
    "CudaCall",
    "KernelSpec",
    "NvccBackend",
    "PortError",
    "PortSpec",
    "Report",
    "TensorSpec",
    "add_parser",
    "build_sources",
    "compare",
    "evaluate",
    "load_port",
    "main",
    "make_timer",
    "require_cuda_toolchain",
    "run",
    "run_port_check",
]

log = logging.getLogger(__name__)

DESCRIPTION_FILE = "port.toml"
DTYPE_NAMES = ("float32", "float16", "bfloat16")
SCALAR_TYPES = {"int": "int", "int64": "int64_t", "float": "float"}
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
DEFAULT_BUILD_ROOT = Path(tempfile.gettempdir()) / "triton-collection-port-check"  # honours $TMPDIR
_FUNCTIONS = {
    "min": min,
    "max": max,
    "abs": abs,
    "cdiv": lambda a, b: -(-a // b),
    "next_power_of_2": lambda n: 1 if n <= 1 else 1 << (int(n) - 1).bit_length(),
}
_RESERVED = {"elem", "dtype", *_FUNCTIONS}


class PortError(ValueError):
    """A launch description (or the machine) cannot be used; the message says which file/key and why."""


# ---------------------------------------------------------------- expressions
_MAX_EXPONENT = 64  # sizes and byte counts need no more; a larger power of a big int would run for minutes


def _power(a, b):
    if abs(b) > _MAX_EXPONENT:
        raise OverflowError(f"exponent {b} is beyond +-{_MAX_EXPONENT}")
    return a ** b


_BINOPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.Pow: _power,
}
_CMPOPS = {
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
}


def _parse_expr(text: str, where: str) -> ast.expr:
    if not isinstance(text, str):
        raise PortError(f"{where}: expected an expression string, got {text!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise PortError(f"{where}: cannot parse expression {text!r}: {err.msg}") from None
    for node in ast.walk(tree):
        allowed = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd,
                   ast.Compare, ast.IfExp, ast.BoolOp, ast.And, ast.Or, ast.Not, ast.Call, *_BINOPS, *_CMPOPS)
        if not isinstance(node, allowed):
            raise PortError(f"{where}: {type(node).__name__} is not allowed in expression {text!r} "
                            "(arithmetic, comparisons, `a if c else b`, min/max/abs/cdiv/next_power_of_2 only)")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                                               and not node.keywords):
            raise PortError(f"{where}: only min, max, abs, cdiv, next_power_of_2 may be called, in {text!r}")
    return tree.body


def _names(node: ast.expr) -> set[str]:
    calls = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in calls}


def _eval(node: ast.expr, env: Mapping[str, Any], text: str, where: str):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise PortError(f"{where}: unknown name {node.id!r} in {text!r}; known: {', '.join(sorted(env))}")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, text, where), _eval(node.right, env, text, where)
        try:
            return _BINOPS[type(node.op)](a, b)
        except (ZeroDivisionError, TypeError, OverflowError) as err:
            raise PortError(f"{where}: {text!r}: {err}") from None
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text, where)
        return -v if isinstance(node.op, ast.USub) else (not v if isinstance(node.op, ast.Not) else +v)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text, where)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env, text, where)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        test = _eval(node.test, env, text, where)
        return _eval(node.body if test else node.orelse, env, text, where)
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env, text, where) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Call):
        args = [_eval(a, env, text, where) for a in node.args]
        try:
            return _FUNCTIONS[node.func.id](*args)
        except (TypeError, ValueError, ZeroDivisionError) as err:
            raise PortError(f"{where}: {text!r}: {err}") from None
    raise PortError(f"{where}: cannot evaluate {text!r}")  # unreachable after _parse_expr


def evaluate(text: str, env: Mapping[str, Any], where: str = "expression"):
    """Evaluates a launch-description expression over ``env`` (see the module docstring).

    Raises:
        PortError: syntax error, a construct other than arithmetic/comparisons/conditionals
            and the whitelisted functions, an unknown name, a division by zero.
    """
    return _eval(_parse_expr(text, where), env, text, where)


def _as_int(value, text: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise PortError(f"{where}: {text!r} must give a whole number, got {value!r}")
    return int(value)


# ---------------------------------------------------------------- the description
@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: ``shape`` expressions; inputs ``randn * scale + shift``; outputs poisoned."""

    name: str
    shape: tuple[str, ...]
    output: bool = False
    scale: float = 1.0
    shift: float = 0.0
    dtype: Optional[str] = None  # None: the dtype under test


@dataclass(frozen=True)
class KernelSpec:
    """One CUDA kernel and its Triton port, with every default of the file resolved."""

    name: str
    cuda: str
    grid: tuple[str, ...]
    block: tuple[str, ...]
    shared_mem: str
    args: tuple[tuple[str, str], ...]  # (kind, text): kind "tensor" or a SCALAR_TYPES key
    triton: str
    triton_args: tuple[str, ...]
    triton_kwargs: tuple[tuple[str, str], ...]
    triton_returns: tuple[str, ...]
    dtypes: tuple[str, ...]
    bytes: str
    tensors: tuple[TensorSpec, ...]
    tolerance: Mapping[str, tuple[float, float]]
    params: Mapping[str, Any]
    fixture: str = ""  # the port's name (for the report)

    @property
    def package(self) -> str:
        return self.triton.split(":", 1)[0]

    @property
    def function(self) -> str:
        return self.triton.split(":", 1)[1]

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)


@dataclass(frozen=True)
class PortSpec:
    """A parsed and validated port fixture folder."""

    name: str
    folder: Path
    source_path: Path
    source: str
    shapes: tuple[Mapping[str, Any], ...]  # each: {"name": ..., "throughput": bool, <var>: int}
    kernels: tuple[KernelSpec, ...]

    def shape_vars(self, shape: Mapping[str, Any]) -> dict[str, int]:
        return {k: v for k, v in shape.items() if k not in ("name", "throughput")}


def _is_prime(n: int) -> bool:
    return n > 2 and all(n % p for p in range(2, int(math.isqrt(n)) + 1))


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _check_keys(table: Mapping, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PortError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _expr_list(value, where: str, *, lo: int = 1, hi: int = 3) -> tuple[str, ...]:
    if isinstance(value, (str, int)):
        value = [value]
    if not isinstance(value, list) or not lo <= len(value) <= hi:
        raise PortError(f"{where}: expected a list of {lo} to {hi} expressions, got {value!r}")
    out = tuple(str(v) for v in value)
    for i, text in enumerate(out):
        _parse_expr(text, f"{where}[{i}]")
    return out


def _parse_tensors(table, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(table, dict) or not table:
        raise PortError(f"{where}: expected a table of tensors (name = {{ shape = [...] }}), got {table!r}")
    out = []
    for name, t in table.items():
        w = f"{where}.{name}"
        if not name.isidentifier() or name in _RESERVED:
            raise PortError(f"{w}: a tensor name must be an identifier other than {', '.join(sorted(_RESERVED))}")
        if not isinstance(t, dict) or "shape" not in t:
            raise PortError(f"{w}: expected {{ shape = [...] }} (and optionally output, scale, shift, dtype)")
        _check_keys(t, {"shape", "output", "scale", "shift", "dtype"}, w)
        dtype = t.get("dtype")
        if dtype is not None and dtype not in DTYPE_NAMES:
            raise PortError(f"{w}.dtype: must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
        if not isinstance(t.get("output", False), bool):
            raise PortError(f"{w}.output: must be true or false")
        for key in ("scale", "shift"):
            if key in t and (isinstance(t[key], bool) or not isinstance(t[key], (int, float))
                             or not math.isfinite(t[key])):
                raise PortError(f"{w}.{key}: must be a finite number, got {t[key]!r}")
        out.append(TensorSpec(name, _expr_list(t["shape"], f"{w}.shape", lo=1, hi=8), t.get("output", False),
                              float(t.get("scale", 1.0)), float(t.get("shift", 0.0)), dtype))
    if not any(t.output for t in out):
        raise PortError(f"{where}: no tensor is marked output = true: nothing would be compared")
    return tuple(out)


def _parse_tolerance(table, where: str) -> dict[str, tuple[float, float]]:
    if not isinstance(table, dict):
        raise PortError(f"{where}: expected a table dtype = {{ atol = ..., rtol = ... }}")
    out = {}
    for dtype, tol in table.items():
        if dtype not in DTYPE_NAMES:
            raise PortError(f"{where}.{dtype}: unknown dtype; use {', '.join(DTYPE_NAMES)}")
        if not isinstance(tol, dict) or set(tol) != {"atol", "rtol"}:
            raise PortError(f"{where}.{dtype}: expected {{ atol = <number>, rtol = <number> }}, got {tol!r}")
        vals = []
        for key in ("atol", "rtol"):
            v = tol[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isinf(v):
                raise PortError(f"{where}.{dtype}.{key}: must be a finite number >= 0, got {v!r}")
            vals.append(float(v))
        out[dtype] = (vals[0], vals[1])
    return out


def _parse_shapes(shapes, where: str) -> tuple[dict, ...]:
    if not isinstance(shapes, list) or len(shapes) < 3:
        n = len(shapes) if isinstance(shapes, list) else 0
        raise PortError(f"{where}: at least 3 [[shape]] tables are needed (small, power of 2, prime), got {n}")
    out, var_set = [], None
    for i, s in enumerate(shapes):
        w = f"{where}[{i}]"
        if not isinstance(s, dict):
            raise PortError(f"{w}: expected a table of sizes")
        s = dict(s)
        name = s.pop("name", f"shape{i}")
        throughput = s.pop("throughput", False)
        if not isinstance(throughput, bool):
            raise PortError(f"{w}.throughput: must be true or false")
        if not s:
            raise PortError(f"{w}: no size variables")
        for k, v in s.items():
            if not k.isidentifier() or k in _RESERVED:
                raise PortError(f"{w}.{k}: a size name must be an identifier other than {', '.join(sorted(_RESERVED))}")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PortError(f"{w}.{k}: sizes must be integers >= 1, got {v!r}")
        if var_set is None:
            var_set = set(s)
        elif set(s) != var_set:
            raise PortError(f"{w}: defines {sorted(s)} but the first shape defines {sorted(var_set)}; every shape "
                            "needs the same variables")
        out.append({"name": str(name), "throughput": throughput, **s})
    names = [s["name"] for s in out]
    if len(set(names)) != len(names):
        raise PortError(f"{where}: shape names must be unique, got {names}")
    sizes = [{k: v for k, v in s.items() if k not in ("name", "throughput")} for s in out]
    if not any(all(_is_pow2(v) for v in s.values()) for s in sizes):
        raise PortError(f"{where}: no shape has only power-of-2 sizes; add one (e.g. 256 x 4096)")
    if not any(any(_is_prime(v) for v in s.values()) for s in sizes):
        raise PortError(f"{where}: no shape has a prime size (> 2); add one (e.g. 131 x 5003)")
    return tuple(out)


def _parse_args(args, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(args, list) or not args:
        raise PortError(f"{where}: expected a list of CUDA arguments (tensor names, or \"int d\" / \"float eps\")")
    out = []
    for i, a in enumerate(args):
        if not isinstance(a, str) or not a.strip():
            raise PortError(f"{where}[{i}]: expected a string, got {a!r}")
        parts = a.strip().split(None, 1)
        if len(parts) == 2 and parts[0] in SCALAR_TYPES:
            _parse_expr(parts[1], f"{where}[{i}]")
            out.append((parts[0], parts[1]))
        elif len(parts) == 1 and parts[0].isidentifier():
            out.append(("tensor", parts[0]))
        else:
            raise PortError(f"{where}[{i}]: {a!r} is neither a tensor name nor \"<{'|'.join(SCALAR_TYPES)}> <expression>\"")
    return tuple(out)


_KERNEL_KEYS = {"name", "cuda", "grid", "block", "shared_mem", "args", "triton", "triton_args", "triton_kwargs",
                "triton_returns", "dtypes", "bytes", "tensors", "tolerance", "params"}
_TOP_KEYS = {"name", "source", "dtypes", "params", "bytes", "shape", "tolerance", "tensors", "kernel"}


def _parse_dtypes(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or any(d not in DTYPE_NAMES for d in value):
        raise PortError(f"{where}: expected a non-empty list of {', '.join(DTYPE_NAMES)}, got {value!r}")
    return tuple(value)


def _parse_params(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise PortError(f"{where}: expected a table of named numbers")
    for k, v in value.items():
        if not k.isidentifier() or k in _RESERVED:
            raise PortError(f"{where}.{k}: a parameter name must be an identifier other than {', '.join(sorted(_RESERVED))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PortError(f"{where}.{k}: must be a number, got {v!r}")
    return dict(value)


def _parse_kernel(k, i: int, top: dict, shape_vars: set[str], fixture: str, where: str) -> KernelSpec:
    w = f"{where}: [[kernel]] #{i + 1}" + (f" ({k['name']})" if isinstance(k, dict) and "name" in k else "")
    if not isinstance(k, dict):
        raise PortError(f"{w}: expected a table")
    _check_keys(k, _KERNEL_KEYS, w)
    for key in ("name", "cuda", "grid", "block", "args", "triton"):
        if key not in k:
            raise PortError(f"{w}: missing required key {key!r}")
    name = k["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise PortError(f"{w}.name: letters, digits, _ . - only, got {name!r}")
    cuda = k["cuda"]
    if not isinstance(cuda, str) or not re.fullmatch(r"[A-Za-z_][\w:<>, ]*", cuda.strip()):
        raise PortError(f"{w}.cuda: expected a kernel name or template id (e.g. \"my_kernel<scalar_t>\"), got {cuda!r}")
    triton = k["triton"]
    if not isinstance(triton, str) or not re.fullmatch(r"[a-z][a-z0-9\-_]*:[A-Za-z_]\w*", triton):
        raise PortError(f"{w}.triton: expected \"<hub-package>:<function>\" (e.g. \"triton-activations:silu_and_mul\"), "
                        f"got {triton!r}")
    dtypes = _parse_dtypes(k.get("dtypes", top.get("dtypes")), f"{w}.dtypes")
    tensors = _parse_tensors(k.get("tensors", top.get("tensors")), f"{w}.tensors" if "tensors" in k else f"{where}: [tensors]")
    tol = dict(top.get("tolerance", {}))
    tol.update(_parse_tolerance(k.get("tolerance", {}), f"{w}.tolerance"))
    missing = [d for d in dtypes if d not in tol]
    if missing:
        raise PortError(f"{w}: no tolerance for {', '.join(missing)} (add [tolerance] {missing[0]} = {{ atol = ..., rtol = ... }})")
    params = dict(top.get("params", {}))
    params.update(_parse_params(k.get("params", {}), f"{w}.params"))
    bytes_expr = k.get("bytes", top.get("bytes"))
    if bytes_expr is None:
        raise PortError(f"{w}: no bytes formula (top-level `bytes = \"...\"` or per kernel)")
    _parse_expr(bytes_expr, f"{w}.bytes")
    args = _parse_args(k["args"], f"{w}.args")
    tensor_names = {t.name for t in tensors}
    clash = tensor_names & (shape_vars | set(params))
    if clash:
        raise PortError(f"{w}: {', '.join(sorted(clash))} is both a tensor and a size/parameter name")
    for kind, text in args:
        if kind == "tensor" and text not in tensor_names:
            raise PortError(f"{w}.args: {text!r} is not a tensor of this kernel ({', '.join(sorted(tensor_names))}); "
                            "scalars are written \"int d\" / \"float eps\"")
    unused = tensor_names - {text for kind, text in args if kind == "tensor"}
    if unused:
        raise PortError(f"{w}.args: tensor(s) {', '.join(sorted(unused))} are declared but not passed to the CUDA kernel")
    triton_args = k.get("triton_args", [])
    triton_kwargs = k.get("triton_kwargs", {})
    triton_returns = k.get("triton_returns", [])
    if not isinstance(triton_args, list) or not isinstance(triton_kwargs, dict) or not isinstance(triton_returns, list):
        raise PortError(f"{w}: triton_args must be a list, triton_kwargs a table, triton_returns a list")
    scalar_env = shape_vars | set(params) | {"elem", "dtype"}
    full_env = scalar_env | tensor_names
    texts = [(f"{w}.grid", g, scalar_env) for g in _expr_list(k["grid"], f"{w}.grid")]
    texts += [(f"{w}.block", b, scalar_env) for b in _expr_list(k["block"], f"{w}.block")]
    texts += [(f"{w}.shared_mem", str(k.get("shared_mem", "0")), scalar_env), (f"{w}.bytes", bytes_expr, scalar_env)]
    texts += [(f"{w}.args", text, scalar_env) for kind, text in args if kind != "tensor"]
    texts += [(f"{w}.tensors.{t.name}.shape", s, scalar_env) for t in tensors for s in t.shape]
    texts += [(f"{w}.triton_args[{j}]", str(a), full_env) for j, a in enumerate(triton_args)]
    texts += [(f"{w}.triton_kwargs.{key}", str(a), full_env) for key, a in triton_kwargs.items()]
    for where_, text, env in texts:
        unknown = _names(_parse_expr(text, where_)) - env
        if unknown:
            raise PortError(f"{where_}: unknown name(s) {', '.join(sorted(unknown))} in {text!r}; "
                            f"known: {', '.join(sorted(env))}")
    outputs = {t.name for t in tensors if t.output}
    if len(set(map(str, triton_returns))) != len(triton_returns):
        raise PortError(f"{w}.triton_returns: each output may be named once, got {triton_returns!r}")
    for r in triton_returns:
        if r not in outputs:
            raise PortError(f"{w}.triton_returns: {r!r} is not an output tensor ({', '.join(sorted(outputs))})")
    passed = {str(a) for a in triton_args} | {str(a) for a in triton_kwargs.values()}
    for o in sorted(outputs - set(triton_returns)):
        if o not in passed:
            raise PortError(f"{w}: output {o!r} is neither passed to the Triton function (triton_args/triton_kwargs) "
                            "nor named in triton_returns: the port's result for it would be unknown")
    return KernelSpec(
        name=name, cuda=cuda.strip(), grid=_expr_list(k["grid"], f"{w}.grid"), block=_expr_list(k["block"], f"{w}.block"),
        shared_mem=str(k.get("shared_mem", "0")), args=args, triton=triton,
        triton_args=tuple(str(a) for a in triton_args),
        triton_kwargs=tuple((str(key), str(v)) for key, v in triton_kwargs.items()),
        triton_returns=tuple(triton_returns), dtypes=dtypes, bytes=str(bytes_expr), tensors=tensors,
        tolerance={d: tol[d] for d in dtypes}, params=params, fixture=fixture,
    )


def _check_cuda_signature(source: str, kernel: KernelSpec, where: str, source_name: str) -> None:
    """The ``__global__`` function that ``kernel.cuda`` names is defined in ``source``, with as many parameters as
    ``args`` passes (comments stripped; template arguments and default-free parameter lists)."""
    base = kernel.cuda.split("<", 1)[0].strip().split("::")[-1]
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    found = re.search(rf"__global__\s[^;{{}}]*?\b{re.escape(base)}\s*\(", text)
    if found is None:
        raise PortError(f"{where}.cuda: no __global__ function {base!r} in {source_name}")
    depth, params, start = 1, [], found.end()
    for j in range(start, len(text)):
        c = text[j]
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
            if depth == 0:
                params.append(text[start:j])
                break
        elif c == "," and depth == 1:
            params.append(text[start:j])
            start = j + 1
    count = 0 if len(params) == 1 and not params[0].strip() else len(params)
    if count != len(kernel.args):
        raise PortError(f"{where}.args: {len(kernel.args)} given, but {base!r} in {source_name} takes {count}")


def load_port(folder: Path | str) -> PortSpec:
    """Reads and validates ``<folder>/port.toml`` (or a .toml file given directly) and its ``.cu`` source.

    Every expression is parsed and checked for unknown names, every kernel's ``cuda`` name must be a
    ``__global__`` function of the source taking as many parameters as ``args`` passes, and every
    kernel's launch geometry is evaluated at every shape and dtype (at most 1024 threads per block,
    CUDA's grid limits, scalar arguments that fit their C type), so a description that loads here runs without a
    description error. Inside a collection checkout each ``triton`` target's package must be in its build.toml
    and the function in the package's ``__all__`` (outside one, the packages come from the cache at run time).

    Raises:
        PortError: a missing file or key, an unknown key, a bad value, fewer than 3 shapes or
            none with a prime / all-power-of-2 sizes, a dtype without tolerance, ... (the message
            names the file and key).
    """
    path = Path(folder)
    desc = path if path.suffix == ".toml" else path / DESCRIPTION_FILE
    if not desc.is_file():
        raise PortError(f"{desc}: no launch description (a port fixture folder holds {DESCRIPTION_FILE} and a .cu source)")
    where = str(desc)
    try:
        top = tomllib.loads(desc.read_text())
    except tomllib.TOMLDecodeError as err:
        raise PortError(f"{where}: not valid TOML: {err}") from None
    _check_keys(top, _TOP_KEYS, where)
    for key in ("source", "shape", "kernel"):
        if key not in top:
            raise PortError(f"{where}: missing required key {key!r}" + (" ([[shape]] tables)" if key == "shape" else
                                                                         " ([[kernel]] tables)" if key == "kernel" else ""))
    name = top.get("name", desc.parent.name)
    source_path = desc.parent / str(top["source"])
    if not source_path.is_file():
        raise PortError(f"{where}: source {top['source']!r} not found ({source_path})")
    source = source_path.read_text()
    if "dtypes" in top:
        _parse_dtypes(top["dtypes"], f"{where}: dtypes")
    if "params" in top:
        top["params"] = _parse_params(top["params"], f"{where}: [params]")
    if "tolerance" in top:
        top["tolerance"] = _parse_tolerance(top["tolerance"], f"{where}: [tolerance]")
    shapes = _parse_shapes(top["shape"], f"{where}: [[shape]]")
    shape_vars = set(shapes[0]) - {"name", "throughput"}
    clash = shape_vars & set(top.get("params", {}))
    if clash:
        raise PortError(f"{where}: {', '.join(sorted(clash))} is both a shape size and a parameter")
    kernels_raw = top["kernel"]
    if not isinstance(kernels_raw, list) or not kernels_raw:
        raise PortError(f"{where}: expected one or more [[kernel]] tables")
    kernels = tuple(_parse_kernel(k, i, top, shape_vars, str(name), where) for i, k in enumerate(kernels_raw))
    names = [k.name for k in kernels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PortError(f"{where}: kernel names must be unique; repeated: {', '.join(dup)}")
    for i, k in enumerate(kernels):
        _check_cuda_signature(source, k, f"{where}: kernel[{i}] ({k.name})", source_path.name)
    _check_triton_targets(kernels, where)
    spec = PortSpec(str(name), desc.parent, source_path, source, shapes, kernels)
    for k in kernels:
        for shape in shapes:
            for dtype in k.dtypes:
                try:
                    launch_geometry(spec, k, shape, dtype)
                    tensor_shapes(spec, k, shape, dtype)
                    bytes_moved(spec, k, shape, dtype)
                    scalar_args(spec, k, shape, dtype)
                except PortError as err:
                    raise PortError(f"{where}: {err}") from None
    return spec


def _check_triton_targets(kernels: Sequence[KernelSpec], where: str) -> None:
    """Each kernel's ``triton = "<package>:<function>"``: the package in the checkout's build.toml and the function
    in its ``__all__`` (read from source, nothing imported); nothing to check outside a checkout."""
    root = _find_collection_root()
    if root is None:
        return
    from .api_surface import surface_of_dir
    from .manifest import load_manifest

    collection = load_manifest(root)
    exports: dict[str, tuple[str, ...]] = {}  # package -> its __all__, read once
    for i, k in enumerate(kernels):
        package, function = k.triton.split(":")
        if package not in exports:
            try:
                pkg = collection.package(package)
            except KeyError as err:
                raise PortError(f"{where}: kernel[{i}] ({k.name}).triton: {err.args[0]}") from None
            exports[package] = surface_of_dir(root / "torch-ext" / pkg.python_name).names
        names = exports[package]
        if function not in names:
            raise PortError(f"{where}: kernel[{i}] ({k.name}).triton: {package} exports no {function!r} "
                            f"(its __all__: {', '.join(n for n in names if n != 'layers')})")


def check_fixture_names(specs: Sequence[PortSpec]) -> None:
    """Fixture names must differ across one run: the compiled CUDA launchers and the report rows are keyed by them.

    Raises:
        PortError: naming the repeated name and its folders.
    """
    seen: dict[str, Path] = {}
    for spec in specs:
        if spec.name in seen:
            raise PortError(f"two fixtures are named {spec.name!r} ({seen[spec.name]} and {spec.folder}): their CUDA "
                            "kernels would share one compiled launcher; give one another `name` in its port.toml")
        seen[spec.name] = spec.folder


# ---------------------------------------------------------------- per-case values
_ELEM = {"float32": 4, "float16": 2, "bfloat16": 2}


def case_env(spec: PortSpec, kernel: KernelSpec, shape: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The names an expression sees for one case (sizes, params, elem, dtype)."""
    env: dict[str, Any] = dict(kernel.params)
    env.update(spec.shape_vars(shape))
    env["elem"] = _ELEM[dtype]
    try:
        import torch

        env["dtype"] = getattr(torch, dtype)
    except ImportError:  # validation without torch: a dtype name is enough for the arithmetic
        env["dtype"] = dtype
    return env


def launch_geometry(spec: PortSpec, kernel: KernelSpec, shape, dtype: str) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared memory bytes) of ``kernel`` at one shape and dtype.

    Raises:
        PortError: a non-integer or non-positive size, more than 1024 threads per block,
            or a grid/block dimension beyond CUDA's limits.
    """
    env = case_env(spec, kernel, shape, dtype)
    where = f"{spec.name}/{kernel.name} at {shape['name']} ({dtype})"
    grid = [_as_int(evaluate(g, env, f"{where}: grid"), g, f"{where}: grid") for g in kernel.grid]
    block = [_as_int(evaluate(b, env, f"{where}: block"), b, f"{where}: block") for b in kernel.block]
    smem = _as_int(evaluate(kernel.shared_mem, env, f"{where}: shared_mem"), kernel.shared_mem, f"{where}: shared_mem")
    grid += [1] * (3 - len(grid))
    block += [1] * (3 - len(block))
    for what, dims, limits in (("grid", grid, MAX_GRID), ("block", block, MAX_BLOCK)):
        for axis, (v, lim) in enumerate(zip(dims, limits)):
            if not 1 <= v <= lim:
                raise PortError(f"{where}: {what} dimension {'xyz'[axis]} = {v} is outside [1, {lim}]")
    if math.prod(block) > MAX_THREADS_PER_BLOCK:
        raise PortError(f"{where}: block {tuple(block)} has {math.prod(block)} threads > {MAX_THREADS_PER_BLOCK}")
    if smem < 0:
        raise PortError(f"{where}: shared_mem = {smem} < 0")
    return tuple(grid), tuple(block), smem


def tensor_shapes(spec: PortSpec, kernel: KernelSpec, shape, dtype: str) -> dict[str, tuple[int, ...]]:
    env = case_env(spec, kernel, shape, dtype)
    out = {}
    for t in kernel.tensors:
        where = f"{spec.name}/{kernel.name} at {shape['name']}: tensor {t.name}"
        dims = tuple(_as_int(evaluate(s, env, where), s, where) for s in t.shape)
        if any(d < 0 for d in dims):
            raise PortError(f"{where}: negative size in {dims}")
        out[t.name] = dims
    return out


def bytes_moved(spec: PortSpec, kernel: KernelSpec, shape, dtype: str) -> int:
    env = case_env(spec, kernel, shape, dtype)
    where = f"{spec.name}/{kernel.name} at {shape['name']}: bytes"
    value = _as_int(evaluate(kernel.bytes, env, where), kernel.bytes, where)
    if value < 0:
        raise PortError(f"{where}: {kernel.bytes!r} gives {value} < 0")
    return value


_SCALAR_RANGES = {"int": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def scalar_args(spec: PortSpec, kernel: KernelSpec, shape, dtype: str) -> list:
    """Per entry of the CUDA kernel's ``args`` at one case: ``(kind, value)`` for a scalar (``int`` / ``int64`` whole
    numbers within their C type's range, ``float`` finite numbers), None for a tensor.

    Raises:
        PortError: a value its C type would silently change (``int eps`` = 1e-6 would pass 0) or a NaN / inf.
    """
    env = case_env(spec, kernel, shape, dtype)
    out = []
    for kind, text in kernel.args:
        if kind == "tensor":
            out.append(None)
            continue
        where = f"{spec.name}/{kernel.name} at {shape['name']}: args \"{kind} {text}\""
        value = evaluate(text, env, where)
        if kind in _SCALAR_RANGES:
            value = _as_int(value, text, where)
            lo, hi = _SCALAR_RANGES[kind]
            if not lo <= value <= hi:
                raise PortError(f"{where}: {value} does not fit the C type {SCALAR_TYPES[kind]}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise PortError(f"{where}: must give a finite number, got {value!r}")
        out.append((kind, value))
    return out


# ---------------------------------------------------------------- the CUDA side
@dataclass
class CudaCall:
    """One launch of a CUDA kernel: what a backend needs (args in the kernel's order)."""

    kernel: KernelSpec
    dtype: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    tensors: dict  # name -> torch.Tensor
    args: list  # (kind, value): kind "tensor" (value: the tensor) or a SCALAR_TYPES key (value: number)


_DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
_CXX_TYPES = {"float32": "float", "float16": "c10::Half", "bfloat16": "c10::BFloat16"}


def _split_includes(source: str) -> tuple[list[str], str]:
    includes, body = [], []
    for line in source.splitlines():
        (includes if line.lstrip().startswith("#include") else body).append(line)
    return includes, "\n".join(body)


def build_sources(specs: Sequence[PortSpec]) -> tuple[str, str, list[str]]:
    """(cpp source, cuda source, function names) of ONE extension holding every kernel of ``specs``.

    Each fixture's source goes into its own namespace (``#include`` lines are hoisted
    above), followed by one generated launcher per kernel,
    ``port_launch_<i>(cfg, tensors, scalars)``: ``cfg`` = (dtype code, grid xyz, block xyz,
    dynamic shared memory), the tensors in argument order, the scalars as doubles. The
    launcher instantiates the kernel for ``scalar_t`` = float / c10::Half / c10::BFloat16,
    launches it on the current stream and checks the launch.
    """
    includes = ["#include <c10/cuda/CUDAGuard.h>", "#include <c10/cuda/CUDAStream.h>",
                "#include <c10/cuda/CUDAException.h>", "#include <vector>"]
    bodies, decls, names = [], [], []
    idx = 0
    for s_i, spec in enumerate(specs):
        inc, body = _split_includes(spec.source)
        includes += [i for i in inc if i not in includes]
        ns = f"port_src_{s_i}"
        bodies.append(f"// ---- {spec.name}: {spec.source_path.name}\nnamespace {ns} {{\n{body}\n}}  // namespace {ns}\n")
        for k in spec.kernels:
            fn = f"port_launch_{idx}"
            idx += 1
            t_i = s_i_ = 0
            cargs = []
            for kind, text in k.args:
                if kind == "tensor":
                    t = k.tensor(text)
                    ctype = _CXX_TYPES[t.dtype] if t.dtype else "scalar_t"
                    cargs.append(f"reinterpret_cast<{ctype}*>(t[{t_i}].data_ptr())")
                    t_i += 1
                else:
                    cargs.append(f"static_cast<{SCALAR_TYPES[kind]}>(s[{s_i_}])")
                    s_i_ += 1
            launch = f"{k.cuda}<<<grid, block, smem, stream>>>({', '.join(cargs)})"
            sig = f"void {fn}(std::vector<int64_t> cfg, std::vector<at::Tensor> t, std::vector<double> s)"
            bodies.append(
                f"// {spec.name}/{k.name}\n{sig} {{\n"
                f"  using namespace {ns};\n"
                f"  TORCH_CHECK(cfg.size() == 8 && t.size() == {t_i} && s.size() == {s_i_}, \"{fn}: bad argument count\");\n"
                f"  const c10::cuda::CUDAGuard guard(t[0].device());\n"
                f"  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();\n"
                f"  const dim3 grid(cfg[1], cfg[2], cfg[3]), block(cfg[4], cfg[5], cfg[6]);\n"
                f"  const size_t smem = static_cast<size_t>(cfg[7]);\n"
                f"  switch (cfg[0]) {{\n"
                + "".join(f"    case {code}: {{ using scalar_t = {_CXX_TYPES[d]}; {launch}; break; }}\n"
                          for d, code in _DTYPE_CODES.items() if d in k.dtypes)
                + f"    default: TORCH_CHECK(false, \"{fn}: dtype code \", cfg[0], \" not instantiated\");\n"
                f"  }}\n"
                f"  C10_CUDA_KERNEL_LAUNCH_CHECK();\n}}\n"
            )
            decls.append(sig + ";")
            names.append(fn)
    cuda = "\n".join(includes) + "\n\n" + "\n".join(bodies)
    return "\n".join(decls) + "\n", cuda, names


def require_cuda_toolchain() -> None:
    """Raises PortError unless torch sees a CUDA GPU and ``nvcc`` is found (CUDA_HOME or PATH)."""
    import torch

    if torch.version.cuda is None:
        raise PortError(f"needs a CUDA GPU and a CUDA build of PyTorch; this torch ({torch.__version__}) "
                        "is built without CUDA (use --validate to check the launch descriptions here)")
    if not torch.cuda.is_available():
        raise PortError("needs a CUDA GPU: torch.cuda.is_available() is False "
                        "(use --validate to check the launch descriptions here)")
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    nvcc = Path(home) / "bin" / "nvcc" if home else None
    if not (nvcc and nvcc.is_file()) and shutil.which("nvcc") is None:
        raise PortError("needs nvcc (the CUDA compiler) to build the CUDA side: none found in "
                        f"CUDA_HOME ({home}) or on PATH; install the CUDA toolkit or set CUDA_HOME")


class NvccBackend:
    """Compiles every kernel of the given fixtures into one extension (``load_inline``) and launches them."""

    def __init__(self, specs: Sequence[PortSpec], build_root: Path = DEFAULT_BUILD_ROOT, verbose: bool = False):
        import torch
        from torch.utils.cpp_extension import load_inline

        cpp, cuda, names = build_sources(specs)
        major, minor = torch.cuda.get_device_capability()
        self.arch = f"sm_{major}{minor}"
        # the arch flags torch adds: -gencode=arch=compute_XY,code=sm_XY for this GPU only (= -arch=sm_XY)
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        flags = ["-O3"]
        digest = hashlib.sha256("\0".join([cpp, cuda, self.arch, *flags, torch.__version__]).encode()).hexdigest()[:12]
        self.name = f"port_check_{digest}"
        build_dir = Path(build_root) / self.name
        build_dir.mkdir(parents=True, exist_ok=True)
        (build_dir / "generated_source.cu").write_text(cuda)  # for reading compile errors
        self.cached = any(build_dir.glob(f"{self.name}*.so"))
        start = time.perf_counter()
        log.info("compiling %d CUDA kernel(s) into %s (%s, -O3) ...", len(names), build_dir, self.arch)
        try:
            self.module = load_inline(name=self.name, cpp_sources=[cpp], cuda_sources=[cuda], functions=names,
                                      extra_cuda_cflags=flags, build_directory=str(build_dir), verbose=verbose,
                                      with_cuda=True)
        except Exception as err:  # compiler output is in the message
            raise PortError(f"compiling the CUDA sources failed ({build_dir}/generated_source.cu):\n{err}") from None
        self.compile_seconds = round(time.perf_counter() - start, 1)
        log.info("CUDA extension %s ready in %.1f s", self.name, self.compile_seconds)
        self.build_dir = build_dir
        self._fns = {}
        i = 0
        for spec in specs:
            for k in spec.kernels:
                self._fns[(spec.name, k.name)] = getattr(self.module, names[i])
                i += 1

    def launch(self, call: CudaCall) -> None:
        fn = self._fns[(call.kernel.fixture, call.kernel.name)]
        cfg = [_DTYPE_CODES[call.dtype], *call.grid, *call.block, call.shared_mem]
        tensors = [v for kind, v in call.args if kind == "tensor"]
        scalars = [float(v) for kind, v in call.args if kind != "tensor"]
        fn(cfg, tensors, scalars)


# ---------------------------------------------------------------- the Triton side
def _find_collection_root() -> Optional[Path]:
    here = Path(__file__).resolve()
    for folder in (Path.cwd(), *Path.cwd().parents, *here.parents):
        if (folder / "build.toml").is_file() and (folder / "torch-ext").is_dir():
            return folder
    return None


class HubLoader:
    """Loads ``<hub-package>:<function>`` as users do: ``kernels.get_kernel("<org>/<package>", version=N)``.

    Inside a collection checkout the package is built and installed into the HF cache first
    (like ``triton-collection install-local``; an unchanged tree keeps its revision), so the
    port under test is the checkout's code. Loading is offline.
    """

    def __init__(self, org: str = DEFAULT_ORG):
        self.org = org
        self._modules: dict[str, Any] = {}

    def module(self, package: str):
        if package not in self._modules:
            os.environ["HF_HUB_OFFLINE"] = "1"
            hub_constants = sys.modules.get("huggingface_hub.constants")
            if hub_constants is not None:
                hub_constants.HF_HUB_OFFLINE = True
            import kernels

            from .build import build_collection
            from .install import install_local
            from .manifest import load_manifest

            root = _find_collection_root()
            version = 1
            if root is not None:
                collection = load_manifest(root)
                try:
                    version = collection.package(package).version
                except KeyError as err:
                    raise PortError(f"triton = \"{package}:...\": {err.args[0]}") from None
                out = root / "dist" / "local" / self.org
                for built in build_collection(collection, out, org=self.org, packages=[package], cpu_variant=True):
                    install_local(built, org=self.org)
            self._modules[package] = kernels.get_kernel(f"{self.org}/{package}", version=version)
        return self._modules[package]

    def __call__(self, package: str, function: str) -> Callable:
        mod = self.module(package)
        fn = getattr(mod, function, None)
        if fn is None:
            raise PortError(f"{package} has no function {function!r} (its __all__: {', '.join(getattr(mod, '__all__', []))})")
        return fn


# ---------------------------------------------------------------- comparison and report
def compare(result, reference, atol: float, rtol: float) -> dict:
    """Elementwise ``|result - reference| <= atol + rtol * |reference|`` (fp32 arithmetic).

    NaN passes only where both have NaN (an unwritten, poisoned element fails); infinities
    must be equal. Returns ``{"max_abs", "max_rel", "tol_used", "mismatches", "numel", "ok"}``:
    ``max_rel`` is ``max |diff| / max(|reference|, atol)``; ``tol_used`` is
    ``max |diff| / (atol + rtol * |reference|)`` (<= 1 passes). A shape or dtype difference is a
    failure with ``error`` set.
    """
    import torch

    out = {"numel": int(reference.numel())}
    if tuple(result.shape) != tuple(reference.shape) or result.dtype != reference.dtype:
        return {**out, "ok": False, "max_abs": math.inf, "max_rel": math.inf, "tol_used": math.inf,
                "mismatches": int(reference.numel()),
                "error": f"Triton gave {tuple(result.shape)} {result.dtype}, CUDA {tuple(reference.shape)} {reference.dtype}"}
    if reference.numel() == 0:
        return {**out, "ok": True, "max_abs": 0.0, "max_rel": 0.0, "tol_used": 0.0, "mismatches": 0}
    a, b = result.float(), reference.float()
    both_nan = a.isnan() & b.isnan()
    same_inf = a.isinf() & (a == b)
    diff = (a - b).abs()
    good = ((diff <= atol + rtol * b.abs()) & a.isfinite() & b.isfinite()) | both_nan | same_inf
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, math.inf), diff)  # NaN on one side only
    rel = diff / b.abs().clamp_min(max(atol, torch.finfo(torch.float32).tiny))
    used = diff / (atol + rtol * b.abs()).clamp_min(torch.finfo(torch.float32).tiny)
    used = torch.where(diff == 0, torch.zeros_like(used), used)
    mismatches = int((~good).sum().item())
    return {**out, "ok": mismatches == 0, "max_abs": float(diff.max().item()), "max_rel": float(rel.max().item()),
            "tol_used": float(used.max().item()), "mismatches": mismatches}


@dataclass
class CheckRow:
    """One kernel x dtype x shape: the comparison per output and the timings."""

    fixture: str
    kernel: str
    dtype: str
    shape: str
    sizes: dict
    throughput: bool
    ok: bool
    outputs: dict = field(default_factory=dict)  # output name -> compare() result
    error: Optional[str] = None
    grid: Optional[list] = None
    block: Optional[list] = None
    bytes: Optional[int] = None
    cuda_ms: Optional[float] = None
    triton_ms: Optional[float] = None
    cuda_gbps: Optional[float] = None
    triton_gbps: Optional[float] = None
    ratio: Optional[float] = None  # Triton GB/s / CUDA GB/s (= CUDA time / Triton time)

    @property
    def max_abs(self) -> float:
        return max((o["max_abs"] for o in self.outputs.values()), default=math.nan)

    @property
    def max_rel(self) -> float:
        return max((o["max_rel"] for o in self.outputs.values()), default=math.nan)

    @property
    def tol_used(self) -> float:
        return max((o["tol_used"] for o in self.outputs.values()), default=math.nan)

    @property
    def mismatches(self) -> int:
        return sum(o["mismatches"] for o in self.outputs.values())


@dataclass
class Report:
    """All rows of a run and the environment they were measured in."""

    rows: list
    env: dict

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def summary(self) -> dict:
        timed = [r for r in self.rows if r.ratio]
        headline = [r for r in timed if r.throughput]
        per_kernel = {}
        for r in headline:
            key = f"{r.fixture}/{r.kernel}"
            per_kernel[key] = min(per_kernel.get(key, math.inf), r.ratio)

        def geomean(vals):
            return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 3) if vals else None

        return {
            "checks": len(self.rows), "failed": sum(not r.ok for r in self.rows), "ok": self.ok,
            "throughput_ratio_min": round(min(r.ratio for r in headline), 3) if headline else None,
            "throughput_ratio_geomean": geomean([r.ratio for r in headline]),
            "all_shapes_ratio_min": round(min(r.ratio for r in timed), 3) if timed else None,
            "all_shapes_ratio_geomean": geomean([r.ratio for r in timed]),
            "throughput_ratio_min_per_kernel": {k: round(v, 3) for k, v in per_kernel.items()},
        }

    def as_dict(self) -> dict:
        rows = []
        for r in self.rows:
            d = asdict(r)
            d.update(max_abs=r.max_abs, max_rel=r.max_rel, tol_used=r.tol_used, mismatches=r.mismatches)
            rows.append(d)
        return {"env": self.env, "summary": self.summary(), "rows": rows}

    def plot(self, path: Path) -> bool:
        """Bar chart of CUDA and Triton GB/s at the throughput shapes (needs matplotlib); False if nothing was timed."""
        rows = [r for r in self.rows if r.throughput and r.ratio]
        if not rows:
            return False
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [f"{r.kernel}\n{r.dtype}" for r in rows]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(rows) + 2), 5.0))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r.cuda_gbps for r in rows], width=0.4, label="CUDA (classic fixture)")
        ax.bar([x + 0.2 for x in xs], [r.triton_gbps for r in rows], width=0.4, label="Triton port")
        for x, r in zip(xs, rows):
            ax.text(x, max(r.cuda_gbps, r.triton_gbps), f"{r.ratio:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("GB/s (bytes moved / median time)")
        ax.set_title(f"port-check, throughput shapes, {self.env.get('gpu', self.env.get('device'))}: Triton/CUDA above bars",
                     fontsize=9)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return True

    def table(self, markdown: bool = False) -> str:
        head = ["port", "kernel", "dtype", "shape", "ok", "max abs", "max rel", "tol used", "bad", "CUDA µs", "Triton µs",
                "CUDA GB/s", "Triton GB/s", "Triton/CUDA"]

        def f(v, fmt):
            return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

        lines = []
        for r in self.rows:
            sizes = "x".join(str(v) for v in r.sizes.values())
            lines.append([r.fixture, r.kernel, r.dtype, f"{r.shape} {sizes}" + (" *" if r.throughput else ""),
                          "ok" if r.ok else ("ERROR" if r.error else "FAIL"), f(r.max_abs, ".2e"), f(r.max_rel, ".2e"),
                          f(r.tol_used, ".2f"),
                          str(r.mismatches), f(r.cuda_ms and r.cuda_ms * 1e3, ".1f"),
                          f(r.triton_ms and r.triton_ms * 1e3, ".1f"), f(r.cuda_gbps, ".0f"), f(r.triton_gbps, ".0f"),
                          f(r.ratio, ".2f")])
        s = self.summary()
        foot = (f"{s['checks']} checks, {s['failed']} failed (seed {self.env.get('seed')}); Triton/CUDA at the throughput shapes (*): "
                f"min {s['throughput_ratio_min']}, geomean {s['throughput_ratio_geomean']}; all shapes: min "
                f"{s['all_shapes_ratio_min']}, geomean {s['all_shapes_ratio_geomean']}")
        errors = [f"{r.fixture}/{r.kernel} {r.dtype} {r.shape}: {r.error}" for r in self.rows if r.error]
        if markdown:
            out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            out += ["| " + " | ".join(line) + " |" for line in lines]
            return "\n".join(out + ["", foot] + [f"- {e}" for e in errors]) + "\n"
        widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
        out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
        out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
        return "\n".join(out + [foot] + errors) + "\n"


def _seed_for(seed: int, *parts: str) -> int:
    return zlib.crc32("/".join([str(seed), *parts]).encode()) & 0x7FFFFFFF


def _make_tensors(spec: PortSpec, kernel: KernelSpec, shape, dtype: str, device, seed: int) -> tuple[dict, dict]:
    """(inputs, outputs) for one case: inputs randn * scale + shift; outputs NaN-filled (poison)."""
    import torch

    shapes = tensor_shapes(spec, kernel, shape, dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(_seed_for(seed, spec.name, kernel.name, dtype, shape["name"]))
    inputs, outputs = {}, {}
    for t in kernel.tensors:
        tdtype = getattr(torch, t.dtype or dtype)
        if t.output:
            outputs[t.name] = torch.full(shapes[t.name], math.nan, dtype=tdtype, device=device)
        else:
            x = torch.randn(shapes[t.name], generator=gen, dtype=torch.float32, device=device)
            inputs[t.name] = (x * t.scale + t.shift).to(tdtype)
    return inputs, outputs


def _triton_call(spec: PortSpec, kernel: KernelSpec, fn: Callable, shape, dtype: str, inputs: dict, outputs: dict):
    """A no-argument callable running the port on ``inputs`` into ``outputs`` (returned values copied in)."""
    env = case_env(spec, kernel, shape, dtype)
    env.update(inputs)
    env.update(outputs)
    where = f"{spec.name}/{kernel.name}"
    args = [evaluate(a, env, f"{where}: triton_args") for a in kernel.triton_args]
    kwargs = {k: evaluate(v, env, f"{where}: triton_kwargs.{k}") for k, v in kernel.triton_kwargs}
    returns = kernel.triton_returns

    def call():
        result = fn(*args, **kwargs)
        if returns:
            values = (result,) if len(returns) == 1 else tuple(result)
            if len(values) != len(returns):
                raise PortError(f"{where}: {kernel.triton} returned {len(values)} values, triton_returns names {len(returns)}")
            for name, v in zip(returns, values):
                outputs[name] = v

    return call


TIMERS = ("do_bench", "cudagraph")


def make_timer(kind: str = "do_bench", rep_ms: int = 50) -> Callable[[Callable[[], Any]], float]:
    """``fn -> median milliseconds``.

    ``"do_bench"``: ``triton.testing.do_bench`` (L2 flushed before each call; host launch
    overhead included where it exceeds the GPU time). ``"cudagraph"``:
    ``triton.testing.do_bench_cudagraph`` (calls replayed from a CUDA graph: kernel time
    without host overhead, L2 not flushed), for comparing kernels at small shapes.
    """
    if kind not in TIMERS:
        raise PortError(f"unknown timer {kind!r}; use one of {', '.join(TIMERS)}")

    def timer(fn: Callable[[], Any]) -> float:
        from triton.testing import do_bench, do_bench_cudagraph

        if kind == "cudagraph":
            return float(do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        return float(do_bench(fn, warmup=max(rep_ms // 4, 5), rep=rep_ms, return_mode="median"))

    return timer


def select(specs: Sequence[PortSpec], kernels: Optional[Sequence[str]] = None,
           dtypes: Optional[Sequence[str]] = None, shapes: Optional[Sequence[str]] = None) -> list[PortSpec]:
    """The specs with only the named kernels (all by default) that run in one of ``dtypes`` (any by default); a spec
    left without any kernel is dropped. PortError names unknown names in ``kernels`` / ``dtypes`` / ``shapes``, and a
    selection that leaves nothing to run (a check of no rows would fail at its end)."""
    known_k = {k.name for s in specs for k in s.kernels}
    known_s = {sh["name"] for s in specs for sh in s.shapes}
    for what, asked, known in (("kernel", kernels, known_k), ("dtype", dtypes, set(DTYPE_NAMES)), ("shape", shapes, known_s)):
        bad = sorted(set(asked or ()) - known)
        if bad:
            raise PortError(f"unknown {what}(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    selected = [PortSpec(s.name, s.folder, s.source_path, s.source, s.shapes,
                         tuple(k for k in s.kernels if (not kernels or k.name in kernels)
                               and (not dtypes or set(k.dtypes) & set(dtypes)))) for s in specs]
    selected = [s for s in selected if s.kernels]
    if not selected:
        raise PortError("nothing to run: no selected kernel takes " + ", ".join(dtypes or ()) + " (a kernel's dtypes "
                        "come from its port.toml)")
    return selected


def run_port_check(
    specs: Sequence[PortSpec],
    *,
    cuda: Any = None,
    triton_loader: Optional[Callable[[str, str], Callable]] = None,
    device: str = "cuda",
    kernels: Optional[Sequence[str]] = None,
    dtypes: Optional[Sequence[str]] = None,
    shapes: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
    timer: Optional[Callable[[Callable[[], Any]], float]] = None,
    time_results: bool = True,
    rep_ms: int = 50,
    timer_kind: str = "do_bench",
    org: str = DEFAULT_ORG,
    build_root: Path = DEFAULT_BUILD_ROOT,
    verbose_build: bool = False,
    progress: Optional[Callable[[CheckRow], None]] = None,
) -> Report:
    """Runs every kernel of ``specs`` against its Triton port; see the module docstring.

    Args:
        specs: fixtures from :func:`load_port`.
        cuda: the CUDA side: an object with ``launch(CudaCall)``; default :class:`NvccBackend`
            (needs a GPU and nvcc). Tests pass a torch implementation instead.
        triton_loader: ``(package, function) -> callable``; default :class:`HubLoader` (by Hub name).
        device: where the tensors live (``"cuda"``; ``"cpu"`` only with a non-CUDA ``cuda`` backend
            and the Triton interpreter).
        kernels, dtypes, shapes: run only these names (default: all).
        seed: base seed of the random inputs (default: a fresh one, reported in ``env``).
        timer: ``fn -> milliseconds``; default :func:`make_timer` (``timer_kind``, ``rep_ms``).
        time_results: False skips timing (correctness only).

    Returns:
        A :class:`Report`; each failure (mismatch or exception) is a row with ``ok=False``.

    Raises:
        PortError: an unknown name in ``kernels``/``dtypes``/``shapes``; with the default
            backend, no CUDA GPU or nvcc, or a compile error.
    """
    import torch

    selected = select(specs, kernels, dtypes, shapes)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "torch": torch.__version__, "device": device,
        "fixtures": [str(s.folder) for s in selected],
    }
    if cuda is None:
        require_cuda_toolchain()
        # every kernel of the given fixtures, whatever the filters: one extension that later runs reuse
        cuda = NvccBackend(specs, build_root=build_root, verbose=verbose_build)
        env.update(compile_seconds=cuda.compile_seconds, extension=cuda.name, arch=cuda.arch, extension_cached=cuda.cached)
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    env["seed"] = seed
    loader = triton_loader or HubLoader(org)
    if time_results and timer is None:
        timer = make_timer(timer_kind, rep_ms)
        env["timer"] = timer_kind
    rows = []
    for spec in selected:
        for kernel in spec.kernels:
            load_error = None
            try:
                fn = loader(kernel.package, kernel.function)
                if not callable(fn):
                    raise PortError(f"the loader gave {fn!r}, not a callable")
            except Exception as err:  # report and go on with the other kernels
                fn, load_error = None, f"loading {kernel.triton}: {type(err).__name__}: {err}"
            for dtype in kernel.dtypes:
                if dtypes and dtype not in dtypes:
                    continue
                for shape in spec.shapes:
                    if shapes and shape["name"] not in shapes:
                        continue
                    row = CheckRow(spec.name, kernel.name, dtype, shape["name"], spec.shape_vars(shape),
                                   bool(shape.get("throughput")), ok=False)
                    if fn is None:
                        row.error = load_error
                    else:
                        _run_case(spec, kernel, fn, shape, dtype, cuda, device, seed, timer if time_results else None, row)
                    rows.append(row)
                    if progress is not None:
                        progress(row)
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
    return Report(rows, env)


def _run_case(spec, kernel, fn, shape, dtype, cuda, device, seed, timer, row: CheckRow) -> None:
    import torch

    try:
        grid, block, smem = launch_geometry(spec, kernel, shape, dtype)
        row.grid, row.block = list(grid), list(block)
        row.bytes = bytes_moved(spec, kernel, shape, dtype)
        inputs, cuda_out = _make_tensors(spec, kernel, shape, dtype, device, seed)
        triton_out = {name: torch.full_like(t, math.nan) for name, t in cuda_out.items()}

        scalars = scalar_args(spec, kernel, shape, dtype)

        def cuda_call(outputs: dict) -> CudaCall:
            tensors = {**inputs, **outputs}
            args = [("tensor", tensors[text]) if scalar is None else scalar
                    for (_, text), scalar in zip(kernel.args, scalars)]
            return CudaCall(kernel, dtype, grid, block, smem, tensors, args)

        call = cuda_call(cuda_out)
        inputs_before = {k: v.clone() for k, v in inputs.items()} if device == "cpu" else None
        cuda.launch(call)
        port = _triton_call(spec, kernel, fn, shape, dtype, inputs, triton_out)
        port()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        tol = kernel.tolerance[dtype]
        for name in cuda_out:
            row.outputs[name] = compare(triton_out[name], cuda_out[name], *tol)
        if inputs_before is not None:
            for k, v in inputs_before.items():
                if not torch.equal(v, inputs[k]):
                    raise PortError(f"input {k!r} was modified by one of the kernels")
        row.ok = all(o["ok"] for o in row.outputs.values())
        if timer is not None:
            # while timed, the CUDA kernel writes the output tensors the port writes into (those it does not return:
            # a returned tensor is the port's own, allocated per call), as a tiny kernel's time depends on where its
            # buffers lie (the same CUDA kernel took 1.04 or 1.14 us at 5 x 96 fp32 with other buffers)
            timed = cuda_call({name: cuda_out[name] if name in kernel.triton_returns else t
                               for name, t in triton_out.items()})
            row.cuda_ms = timer(lambda: cuda.launch(timed))
            row.triton_ms = timer(port)
            row.cuda_gbps = float(f"{row.bytes / (row.cuda_ms * 1e-3) / 1e9:.4g}")
            row.triton_gbps = float(f"{row.bytes / (row.triton_ms * 1e-3) / 1e9:.4g}")
            row.ratio = round(row.cuda_ms / row.triton_ms, 3)
    except Exception as err:  # one case failing must not hide the others
        row.ok = False
        row.error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        log.debug("port-check %s/%s %s %s failed", spec.name, kernel.name, dtype, shape["name"], exc_info=True)


# ---------------------------------------------------------------- CLI
def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``port-check`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser("port-check", help="compile CUDA kernels and compare them with their Triton ports",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", nargs="+", help="port fixture folders (each with port.toml + .cu), e.g. ports/activations")
    parser.add_argument("--kernel", action="append", help="only this kernel (repeat)")
    parser.add_argument("--dtype", action="append", choices=DTYPE_NAMES, help="only this dtype (repeat)")
    parser.add_argument("--shape", action="append", help="only the shape of this name (repeat)")
    parser.add_argument("--seed", type=int, help="base seed of the random inputs (default: fresh, printed)")
    parser.add_argument("--no-time", action="store_true", help="correctness only, no timing")
    parser.add_argument("--rep-ms", type=positive_int, default=50, help="do_bench repetition time per measurement, ms >= 1 (default 50)")
    parser.add_argument("--timer", choices=TIMERS, default="do_bench", help="do_bench (default: L2 flushed, host overhead "
                        "included) or cudagraph (replayed CUDA graph: kernel time only)")
    parser.add_argument("--validate", action="store_true", help="only parse and validate the launch descriptions; print the "
                        "plan (--kernel / --dtype / --shape select, --json / --out as for a check; no GPU needed)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--out", action="append", default=[], help="also write the report to FILE (.json: JSON, .md: Markdown "
                        "table, .png: GB/s bar chart of the throughput shapes, else text); repeat for several")
    parser.add_argument("--log-jsonl", help="append each finished row to FILE as one JSON line (survives a killed run)")
    parser.add_argument("--org", type=hub_org, default=DEFAULT_ORG, help=f"Hub organisation the ports are loaded from (default: {DEFAULT_ORG})")
    parser.add_argument("--build-dir", default=str(DEFAULT_BUILD_ROOT), help=f"extension build cache (default: {DEFAULT_BUILD_ROOT})")
    parser.add_argument("--verbose-build", action="store_true", help="show the compiler's command lines")
    parser.set_defaults(func=run)
    return parser


def _plan(specs: Sequence[PortSpec], dtypes: Optional[Sequence[str]] = None,
          shapes: Optional[Sequence[str]] = None) -> list[dict]:
    """What a check of ``specs`` (already :func:`select`-ed) would run: per kernel its CUDA and Triton names, dtypes
    and, per shape, the launch geometry."""
    plan = []
    for spec in specs:
        kept = [s for s in spec.shapes if not shapes or s["name"] in shapes]
        for k in spec.kernels:
            kd = [d for d in k.dtypes if not dtypes or d in dtypes]
            geometry = {}
            for s in kept:
                g, b, _ = launch_geometry(spec, k, s, kd[0] if kd else k.dtypes[0])
                geometry[s["name"]] = {"size": spec.shape_vars(s), "grid": list(g), "block": list(b)}
            plan.append({"fixture": spec.name, "folder": str(spec.folder), "source": spec.source_path.name,
                         "kernel": k.name, "cuda": k.cuda, "triton": k.triton, "dtypes": kd, "shapes": geometry})
    return plan


def _plan_text(plan: list[dict]) -> str:
    lines, fixture = [], None
    for row in plan:
        if row["fixture"] != fixture:
            fixture = row["fixture"]
            lines.append(f"{fixture} ({row['folder']}): {row['source']}, shapes " + ", ".join(
                f"{name} " + "x".join(str(v) for v in g["size"].values()) for name, g in row["shapes"].items()))
        geo = "; ".join(f"{name}: grid {g['grid'][0] if g['grid'][1:] == [1, 1] else tuple(g['grid'])} block "
                        f"{g['block'][0] if g['block'][1:] == [1, 1] else tuple(g['block'])}"
                        for name, g in row["shapes"].items())
        lines.append(f"  {row['kernel']}: {row['cuda']} -> {row['triton']} [{', '.join(row['dtypes'])}]; {geo}")
    return "\n".join(lines)


def _unwritable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file (a folder, below a file, no write permission); None when it can."""
    if path.is_dir():
        return "a folder"
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    return None if os.access(folder, os.W_OK) else f"no write permission in {folder}"


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out`` / ``--log-jsonl`` checked before a check runs (a run's compile and timings are not lost to an
    unwritable path at the end); with ``--validate``, ``--out`` takes .json or text (the plan has no table or plot)."""
    for flag, value in [("--out", o) for o in args.out] + ([("--log-jsonl", args.log_jsonl)] if args.log_jsonl else []):
        path = Path(value)
        reason = _unwritable_reason(path)
        if reason is not None:
            raise PortError(f"{flag} {value}: cannot be written ({reason})")
        if flag == "--out" and args.validate and path.suffix in (".md", ".png"):
            raise PortError(f"--out {value}: --validate writes its plan as .json or text; .md and .png are a "
                            "check's report formats")


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``port-check`` subcommand; exit code 0 all equal, 1 any mismatch/error, 2 unusable input/machine."""
    try:
        _check_outputs(args)
        specs = [load_port(f) for f in args.fixtures]
        check_fixture_names(specs)
        if args.validate:  # the plan of what a check would run, with this call's --kernel / --dtype / --shape
            plan = _plan(select(specs, args.kernel, args.dtype, args.shape), args.dtype, args.shape)
            as_json, as_text = json.dumps(plan, indent=2), _plan_text(plan)
            print(as_json if args.json else as_text)
            for out in args.out:
                path = Path(out)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text((as_json if path.suffix == ".json" else as_text) + "\n")
            return 0

        def progress(row: CheckRow) -> None:
            status = "ok" if row.ok else ("ERROR " + (row.error or "") if row.error else "FAIL")
            ratio = f" Triton/CUDA {row.ratio:.2f}" if row.ratio else ""
            print(f"[port-check] {row.fixture}/{row.kernel} {row.dtype} {row.shape}: {status}{ratio}", file=sys.stderr,
                  flush=True)
            if args.log_jsonl:
                d = asdict(row)
                d.update(max_abs=row.max_abs, max_rel=row.max_rel, tol_used=row.tol_used, mismatches=row.mismatches)
                with open(args.log_jsonl, "a") as fh:
                    fh.write(json.dumps(d) + "\n")

        report = run_port_check(specs, kernels=args.kernel, dtypes=args.dtype, shapes=args.shape, seed=args.seed,
                                time_results=not args.no_time, rep_ms=args.rep_ms, timer_kind=args.timer, org=args.org,
                                build_root=Path(args.build_dir), verbose_build=args.verbose_build, progress=progress)
    except PortError as err:
        print(f"port-check: {err}", file=sys.stderr)
        return 2
    data = report.as_dict()
    print(json.dumps(data, indent=2) if args.json else report.table())
    for out in args.out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(data, indent=2) + "\n")
        elif path.suffix == ".md":
            env = report.env
            head = (f"# port-check, {env.get('date')}\n\n{env.get('gpu', env.get('device'))}, torch {env.get('torch')}, "
                    f"triton {env.get('triton')}, seed {env.get('seed')}"
                    + (f", CUDA compiled with nvcc -O3 for {env['arch']}" + (" (extension from the cache)" if env.get("extension_cached")
                       else f" in {env['compile_seconds']} s") if "arch" in env else "")
                    + f". GB/s = bytes moved (the fixture's formula) / median time ({env.get('timer', 'untimed')}); "
                    "Triton/CUDA > 1: the port is faster. `*`: throughput shape.\n\n")
            path.write_text(head + report.table(markdown=True))
        elif path.suffix == ".png":
            if not report.plot(path):
                print(f"port-check: nothing timed, no plot written to {path}", file=sys.stderr)
        else:
            path.write_text(report.table())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m triton_collection.port_check FIXTURE ...``."""
    parser = argparse.ArgumentParser(prog="triton-collection-port-check")
    add_parser(parser.add_subparsers(dest="command")).prog = "triton-collection port-check"
    args = parser.parse_args(["port-check", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
