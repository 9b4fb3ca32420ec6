"""End-to-end greedy decode: eager transformers vs our kernelize (vs torch.compile), same tokens.

    triton-collection bench --e2e smollm2-135m llama3-8b --batch 1 64 --new-tokens 32

For each model shape of :data:`MODELS` (random weights, real sizes, built from a transformers
``LlamaConfig``; norm weights drawn around 1 so a wrong norm family would change the tokens):

1. eager: prefill time (one forward over ``batch × prompt_len`` tokens, logits of the last
   position only, as ``generate`` does) and greedy decode throughput;
2. optionally ``torch.compile`` of the eager model's forward (``--compile``; dynamic shapes);
3. ours: :func:`triton_collection.integrations.transformers.kernelize` with ``ALL_FAMILIES``
   (the norms and decoder layers from triton-norms; transformers' decorated activations and gated MLPs,
   ``act_fn(gate) * up`` in one kernel, from triton-activations; Llama-form attentions with the rotary in one
   kernel from triton-attention), then the same measurements; the greedy tokens must equal the eager ones.
   (``kernelize_rotary`` is not used: its swap is process-wide, so the eager copy would run it too.)

Eager and kernelized are two copies of the model (same weights), timed in alternation: each repeat
runs both (the order flips every repeat), so a host that slows down or speeds up during the run
weighs on both variants alike (batch-1 decode is bound by host time). Decode throughput excludes
the prefill: ``generate`` of ``new_tokens`` tokens minus ``generate`` of one token (both medians
of the repeats, ``min_new_tokens`` forcing the full length), so
``tokens/s = batch × (new_tokens - 1) / (t_new - t_1)``; ``per-sequence`` tokens/s divides by
batch. ``--layers N`` builds fewer decoder layers than the real model (time-bound runs): the
report states it, and tokens/s then is not the real model's.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from .demo import same_tokens

__all__ = ["MODELS", "build_model", "decode_rate", "model_config", "run_e2e", "run_e2e_cli", "write_e2e_report"]

log = logging.getLogger(__name__)

MODELS: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M's config.json
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                         tie_word_embeddings=True),
    # meta-llama/Meta-Llama-3-8B's config.json
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"},
                      tie_word_embeddings=False),
    # tests only: the same architecture, tiny
    "tiny-llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=256,
                       rms_norm_eps=1e-5, rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                       tie_word_embeddings=False),
}
"""Model name -> ``LlamaConfig`` keyword arguments (the real sizes)."""


def model_config(name: str, layers: int | None = None):
    """The ``LlamaConfig`` of ``name`` (optionally with ``layers`` decoder layers).

    Raises:
        ValueError: unknown model name, or ``layers`` < 1.
    """
    from transformers import LlamaConfig

    if name not in MODELS:
        raise ValueError(f"e2e: unknown model {name!r}; known: {', '.join(MODELS)}")
    kwargs = dict(MODELS[name])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"e2e: layers must be >= 1, got {layers}")
        kwargs["num_hidden_layers"] = layers
    return LlamaConfig(**kwargs, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build_model(name: str, *, device: str, dtype, layers: int | None = None, seed: int = 0):
    """Random-weight ``LlamaForCausalLM`` of ``name``'s shape on ``device`` (built there directly)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = model_config(name, layers)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model = model.to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:  # all-ones weights would hide a wrong norm family
                p.copy_(torch.randn_like(p) * 0.3 + 1.0)
    return model


def decode_rate(batch: int, new_tokens: int, t_new: float, t_one: float) -> dict:
    """Decode throughput from the two ``generate`` times (seconds); see the module docstring."""
    steps = new_tokens - 1
    dt = t_new - t_one
    if steps <= 0 or dt <= 0:
        return {"decode_tok_s": float("nan"), "per_seq_tok_s": float("nan"), "ms_per_step": float("nan")}
    return {"decode_tok_s": batch * steps / dt, "per_seq_tok_s": steps / dt, "ms_per_step": 1e3 * dt / steps}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed_once(fn, device: str) -> tuple[float, Any]:
    """(seconds, output) of one call, synchronised on both ends."""
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def _measure(models: dict, ids, *, new_tokens: int, device: str, repeats: int) -> dict[str, tuple[dict, Any]]:
    """Times every model of ``models`` (variant -> model) on ``ids``, the variants alternating within each
    repeat (order reversed every other repeat); returns variant -> (row of medians, generated tokens)."""
    import torch

    mask = torch.ones_like(ids)
    gen = dict(attention_mask=mask, do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=0)
    samples = {v: {"prefill": [], "one": [], "new": [], "outs": []} for v in models}

    def generate(model, n):
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)

    with torch.no_grad():
        for model in models.values():
            # warm-up over every length the timed calls reach: Triton JIT / compile, and the first calls at each
            # cache length (H200, session 51: with 4 warm-up tokens eager's first timed repeat ran at 37% of its
            # rate, and the kernelized model, timed after it on the same lengths, did not pay it)
            generate(model, new_tokens)
        order = list(models)
        for rep in range(repeats):
            for v in (order if rep % 2 == 0 else order[::-1]):
                model, acc = models[v], samples[v]
                acc["prefill"].append(_timed_once(lambda: model(ids, attention_mask=mask, logits_to_keep=1), device)[0])
                acc["one"].append(_timed_once(lambda: generate(model, 1), device)[0])
                t_new, out = _timed_once(lambda: generate(model, new_tokens), device)
                acc["new"].append(t_new)
                acc["outs"].append(out)
    result = {}
    for v, acc in samples.items():
        outs = acc["outs"]
        t_new, t_one = statistics.median(acc["new"]), statistics.median(acc["one"])
        # whether the model itself gives the same tokens every run (cuBLAS / cuDNN may pick split reductions whose
        # order varies: then eager-vs-kernelized token equality says nothing about the kernels)
        repeatable = all(torch.equal(o, outs[0]) for o in outs[1:])
        row = {"prefill_ms": 1e3 * statistics.median(acc["prefill"]), "generate_s": t_new, "repeatable": repeatable,
               **decode_rate(ids.shape[0], new_tokens, t_new, t_one),
               "decode_tok_s_runs": [decode_rate(ids.shape[0], new_tokens, n, o)["decode_tok_s"]
                                     for n, o in zip(acc["new"], acc["one"])]}
        result[v] = (row, outs[-1][:, ids.shape[1]:])
    return result


def run_e2e(name: str, *, batches=(1, 64), new_tokens: int = 32, prompt_len: int = 128, layers: int | None = None,
            device: str = "cuda", dtype: str = "bfloat16", compile: bool = False, repeats: int = 3,
            on_row=None) -> dict:
    """Measure ``name`` eager, (compiled), and kernelized; returns ``{"env", "rows"}``.

    Each row: model, layers, batch, variant (``eager``, ``torch.compile``, ``kernelize``), prefill_ms,
    decode_tok_s, per_seq_tok_s, ms_per_step, decode_tok_s_runs (one per repeat), speedup (decode, vs eager at that
    batch), speedup_runs (kernelize: per repeat, against the eager run in the same repeat), tokens_equal
    (greedy tokens equal eager's), and ``error`` where a step failed. ``on_row(rows so far)`` is
    called after each row (the CLI writes its files then).
    """
    from .bench import load_packages  # sets up the HF cache before transformers imports huggingface_hub

    load_packages(["triton-norms", "triton-activations", "triton-attention"])
    import torch
    from kernels import Mode

    from .integrations.families import ALL_FAMILIES
    from .integrations.transformers import kernelize

    tdtype = getattr(torch, dtype)
    model = build_model(name, device=device, dtype=tdtype, layers=layers)
    cfg = model.config
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompts = {b: torch.randint(3, cfg.vocab_size, (b, prompt_len), generator=gen).to(device) for b in batches}
    base = {"model": name, "layers": cfg.num_hidden_layers, "real_layers": MODELS[name]["num_hidden_layers"],
            "prompt_len": prompt_len, "new_tokens": new_tokens, "dtype": dtype}
    rows, eager_tokens, eager_rate, eager_runs = [], {}, {}, {}

    def record(variant: str, batch: int, measured: tuple | None, error: str | None = None, paired: bool = True) -> None:
        """One row: ``measured`` = (row of medians, tokens) from :func:`_measure`, or ``error``; ``paired``: the
        variant ran in turn with eager, repeat by repeat (its speedup in each repeat is then recorded too)."""
        row = dict(base, batch=batch, variant=variant)
        if error is not None:
            row["error"] = error
        else:
            measured, tokens = measured
            row.update(measured)
            if variant == "eager":
                eager_tokens[batch], eager_rate[batch] = tokens, measured["decode_tok_s"]
                eager_runs[batch] = measured["decode_tok_s_runs"]
            elif batch in eager_tokens:
                row["tokens_equal"] = same_tokens(eager_tokens[batch], tokens)
            if batch in eager_rate and variant != "eager":
                row["speedup"] = measured["decode_tok_s"] / eager_rate[batch]
                if paired:  # repeat by repeat against the eager run next to it: the host's drift cancels
                    row["speedup_runs"] = [v / e for v, e in zip(measured["decode_tok_s_runs"], eager_runs[batch])]
        log.info("e2e %s", row)
        rows.append(row)
        if on_row is not None:
            on_row(rows)

    models = {"eager": model}
    kernelized = copy.deepcopy(model)  # same weights; kernelize swaps the copy's forwards
    try:
        report = kernelize(kernelized, mode=Mode.INFERENCE, device=device, families=ALL_FAMILIES)
        layers_swapped: dict[str, int] = {}
        for layer in report.swapped.values():
            layers_swapped[layer] = layers_swapped.get(layer, 0) + 1
        base["swapped"] = layers_swapped
        models["kernelize"] = kernelized
    except Exception as exc:  # noqa: BLE001
        rows.append(dict(base, variant="kernelize", error=f"kernelize: {type(exc).__name__}: {str(exc)[:300]}"))
    for b in batches:
        try:
            measured = _measure(models, prompts[b], new_tokens=new_tokens, device=device, repeats=repeats)
            for variant in models:  # eager first: the others compare with it
                record(variant, b, measured[variant])
        except Exception as exc:  # noqa: BLE001 - one failing batch must not hide the others
            log.exception("e2e %s batch %d failed", name, b)
            for variant in models:
                record(variant, b, None, error=f"{type(exc).__name__}: {str(exc)[:300]}")
    if compile:  # not interleaved: a compiled forward of the eager copy, after the others
        eager_forward = model.forward
        model.forward = torch.compile(eager_forward, dynamic=True)
        for b in batches:
            try:
                measured = _measure({"torch.compile": model}, prompts[b], new_tokens=new_tokens, device=device,
                                    repeats=repeats)["torch.compile"]
                record("torch.compile", b, measured, paired=False)
            except Exception as exc:  # noqa: BLE001
                log.exception("e2e %s torch.compile batch %d failed", name, b)
                record("torch.compile", b, None, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        model.forward = eager_forward
    env = {"gpu": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": device,
           "repeats": repeats}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return {"env": env, "rows": rows}


def _md(result: dict) -> str:
    env = result["env"]
    lines = [f"# End-to-end greedy decode, {env.get('date', '')[:10]}", "",
             f"{env.get('gpu')}; torch {env.get('torch')}, transformers {env.get('transformers')}; random weights, "
             f"medians of {env.get('repeats')} runs, eager and kernelized alternating within each. Decode tokens/s = batch × (new tokens − 1) / (t(generate new) − t(generate 1)); "
             "prefill = one forward over the prompt (last-position logits). Same tokens: greedy tokens equal eager's; "
             "repeatable: the runs of this variant gave the same tokens (where eager's do not, the comparison is void). "
             "Per run: the speedup in each repeat against the eager run next to it (lowest … highest).", "",
             "| model | layers | batch | variant | prefill ms | decode tokens/s | per sequence tokens/s | ms/step | vs eager | per run | same tokens | repeatable | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def f(key, d=1):
            v = r.get(key)
            return "" if v is None else f"{v:.{d}f}"

        layers = f"{r.get('layers')}" + ("" if r.get("layers") == r.get("real_layers") else f" (real {r.get('real_layers')})")
        same = "" if "tokens_equal" not in r else ("yes" if r["tokens_equal"] else "NO")
        repeatable = "" if "repeatable" not in r else ("yes" if r["repeatable"] else "no")
        runs = [v for v in r.get("speedup_runs") or () if v == v]  # NaN: a repeat whose decode time was not positive
        per_run = f"{min(runs):.2f} … {max(runs):.2f}" if runs else ""
        if runs and len(runs) < len(r["speedup_runs"]):
            per_run += f" ({len(runs)} of {len(r['speedup_runs'])})"
        lines.append(f"| {r['model']} | {layers} | {r.get('batch', '')} | {r['variant']} | {f('prefill_ms', 2)} | {f('decode_tok_s')} | "
                     f"{f('per_seq_tok_s')} | {f('ms_per_step', 2)} | {f('speedup', 2)} | {per_run} | {same} | {repeatable} | {r.get('error', '')} |")
    swapped = {r["model"]: r.get("swapped") for r in result["rows"] if r.get("swapped")}
    for model, layers in swapped.items():
        lines.append(f"\n{model}: kernelize swapped " + ", ".join(f"{n} × {k}" for k, n in sorted(layers.items())) + ".")
    return "\n".join(lines) + "\n"


def write_e2e_report(result: dict, out: Path, name: str) -> list[Path]:
    """``<name>.json`` and ``<name>.md`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(_md(result))
    return paths


def run_e2e_cli(args, out: Path, *, device: str = "cuda") -> int:
    """``bench --e2e MODEL ...``: one result (JSON + Markdown) for all the models named."""
    unknown = [m for m in args.e2e if m not in MODELS]
    if unknown:
        raise SystemExit(f"bench --e2e: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[args.dtype]
    result: dict = {"env": {}, "rows": []}
    name = args.name or f"e2e_{'_'.join(args.e2e)}_{datetime.datetime.now(datetime.timezone.utc).date().isoformat()}"
    for model in args.e2e:
        done = list(result["rows"])

        def save(rows, done=done):  # after each row: a run cut short keeps what it measured
            write_e2e_report({"env": result["env"] or {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
                              "rows": done + rows}, out, name)

        part = run_e2e(model, batches=tuple(args.batch), new_tokens=args.new_tokens, prompt_len=args.prompt_len,
                       layers=args.layers, dtype=dtype, compile=args.compile, device=device, repeats=args.repeats, on_row=save)
        result["env"] = part["env"]
        result["rows"] += part["rows"]
        paths = write_e2e_report(result, out, name)
    for path in paths:
        print(path)
    bad = [r for r in result["rows"] if r.get("tokens_equal") is False or "error" in r]
    for r in result["rows"]:
        print(f"{r['model']} b{r.get('batch', '-')} {r['variant']}: prefill {r.get('prefill_ms', float('nan')):.2f} ms, "
              f"decode {r.get('decode_tok_s', float('nan')):.1f} tok/s, speedup {r.get('speedup', float('nan')):.2f}, "
              f"same tokens {r.get('tokens_equal', '-')} {r.get('error', '')}")
    return 1 if bad else 0
