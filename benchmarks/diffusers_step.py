"""One diffusion-transformer step, eager against the diffusers shim and torch.compile, in one process (issue 6).

    python3 benchmarks/diffusers_step.py OUT [--models flux sd3 wan] [--rounds 4] [--no-compile] [--tag NAME]
    python3 benchmarks/diffusers_step.py OUT --smoke      # CPU check of this script: tiny models, interpreter

Models at their real widths and depths with random bf16 weights (default init scaled by 0.5, so that a step stays
finite) and realistic token counts: Flux-dev (19 + 38 blocks, 4096 image + 512 text tokens), SD3.5-large (38 blocks
of 38 x 64 heads, 4096 + 333 tokens), Wan2.1-1.3B (30 blocks, 81 frames of 480 x 832: 32760 tokens).

Per model: a copy of the eager model goes through ``triton_collection.integrations.diffusers.kernelize`` with its
defaults (packages built from this checkout and installed in a private cache, loaded by Hub name); then ``rounds`` rounds each time eager and the shim in turn (2
warm-up calls, then the CUDA-event median of 5 calls, ``torch.inference_mode``); then the eager model gets
``compile_repeated_blocks(fullgraph=True)`` (torch.compile of each repeated block, diffusers' regional compile;
for a class that names none, SD3, each of its ``transformer_blocks``)
and ``rounds`` more rounds time it against the shim again. The shim's output is compared with eager's
(max |difference| / max |eager|, cosine). Writes ``OUT/<tag>.json`` and ``OUT/<tag>.md``.
Before this script (untracked, session 6): ``results/diffusers_step_2026-12-01.md`` and ``_interleaved_``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import prepare  # noqa: E402

MODELS = ("flux", "sd3", "wan")
NAMES = {"flux": "Flux-dev", "sd3": "SD3.5-large", "wan": "Wan2.1-1.3B"}


def build(name: str, device, dtype, smoke: bool):
    """(model, inputs, tokens) of ``name``: real configs, or tiny ones for ``smoke``."""
    import torch
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, WanTransformer3DModel

    def r(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    if name == "flux":
        cfg = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                   axes_dims_rope=(16, 56, 56))
        side, txt = 64, 512
        if smoke:
            cfg.update(in_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                       joint_attention_dim=24, pooled_projection_dim=12, axes_dims_rope=(4, 6, 6))
            side, txt = 4, 5
        model_cls = FluxTransformer2DModel
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        img_ids = torch.stack([torch.zeros_like(ys), ys, xs], -1).reshape(-1, 3).float().to(device)
        inputs = dict(hidden_states=r(1, side * side, cfg["in_channels"]),
                      encoder_hidden_states=r(1, txt, cfg["joint_attention_dim"]),
                      pooled_projections=r(1, cfg["pooled_projection_dim"]),
                      timestep=torch.tensor([0.5], device=device, dtype=dtype), img_ids=img_ids,
                      txt_ids=torch.zeros(txt, 3, device=device), guidance=torch.tensor([3.5], device=device, dtype=dtype))
        tokens = side * side + txt
    elif name == "sd3":
        cfg = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                   num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                   pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm")
        side, txt = 128, 333
        if smoke:
            cfg.update(sample_size=8, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                       joint_attention_dim=24, caption_projection_dim=16, pooled_projection_dim=12, out_channels=4,
                       pos_embed_max_size=8)
            side, txt = 8, 5
        model_cls = SD3Transformer2DModel
        inputs = dict(hidden_states=r(1, cfg["in_channels"], side, side),
                      encoder_hidden_states=r(1, txt, cfg["joint_attention_dim"]),
                      pooled_projections=r(1, cfg["pooled_projection_dim"]),
                      timestep=torch.tensor([500.0], device=device, dtype=dtype))
        tokens = (side // 2) ** 2 + txt
    elif name == "wan":
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                   out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
        frames, height, width, txt = 21, 60, 104, 512
        if smoke:
            cfg.update(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
                       freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32)
            frames, height, width, txt = 2, 6, 4, 7
        model_cls = WanTransformer3DModel
        inputs = dict(hidden_states=r(1, cfg["in_channels"], frames, height, width),
                      encoder_hidden_states=r(1, txt, cfg["text_dim"]),
                      timestep=torch.tensor([700], device=device))
        tokens = frames * (height // 2) * (width // 2)
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters made in bf16 (Flux-dev in fp32 would take 48 GB)
    try:
        with torch.device(device):
            model = model_cls(**cfg).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model, inputs, tokens


def step_ms(model, inputs, timer) -> float:
    """Median ms of one step (2 warm-up calls, then 5 timed)."""
    return timer(lambda: model(**inputs, return_dict=False)[0])


def cuda_timer(fn) -> float:
    import torch

    for _ in range(2):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_timer(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def compare(out, ref) -> dict:
    import torch

    a, b = out.float().flatten(), ref.float().flatten()
    return {"max_abs_over_max_ref": ((a - b).abs().max() / b.abs().max()).item(),
            "cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item(), "finite": bool(torch.isfinite(a).all())}


def run_model(name: str, args, packages, device, dtype, say) -> dict:
    import torch
    from triton_collection.integrations.diffusers import kernelize

    attention, norms, matmul = packages
    timer = wall_timer if args.smoke else cuda_timer
    model, inputs, tokens = build(name, device, dtype, args.smoke)
    shim = copy.deepcopy(model)
    report = kernelize(shim, device=None if args.smoke else "cuda", kernel=attention, norms_kernel=norms,
                       matmul_kernel=matmul)
    row = {"model": NAMES[name], "tokens": tokens, "swapped": report.summary(), "rounds": [], "compile_rounds": []}
    say(f"{NAMES[name]}: {tokens} tokens; {report.summary()}")
    with torch.inference_mode():
        ref = model(**inputs, return_dict=False)[0]
        row["shim_vs_eager"] = compare(shim(**inputs, return_dict=False)[0], ref)
        say(f"  shim vs eager {row['shim_vs_eager']}")
        for i in range(args.rounds):
            eager_ms, shim_ms = step_ms(model, inputs, timer), step_ms(shim, inputs, timer)
            row["rounds"].append({"eager_ms": eager_ms, "shim_ms": shim_ms})
            say(f"  round {i}: eager {eager_ms:.1f} ms, shim {shim_ms:.1f} ms ({eager_ms / shim_ms:.3f}x)")
    if args.compile:
        if getattr(model, "_repeated_blocks", None):
            model.compile_repeated_blocks(fullgraph=True)
        else:  # a class that names no repeated blocks (SD3): each of its transformer blocks, as the regional compile
            for block in model.transformer_blocks:
                block.compile(fullgraph=True)
        start = time.perf_counter()
        with torch.inference_mode():
            row["compile_vs_eager"] = compare(model(**inputs, return_dict=False)[0], ref)
            row["compile_s"] = time.perf_counter() - start
            say(f"  torch.compile (regional): first call {row['compile_s']:.0f} s; vs eager {row['compile_vs_eager']}")
            for i in range(args.rounds):
                compiled_ms, shim_ms = step_ms(model, inputs, timer), step_ms(shim, inputs, timer)
                row["compile_rounds"].append({"compile_ms": compiled_ms, "shim_ms": shim_ms})
                say(f"  round {i}: torch.compile {compiled_ms:.1f} ms, shim {shim_ms:.1f} ms "
                    f"({compiled_ms / shim_ms:.3f}x)")
    for key in ("eager_ms", "shim_ms"):
        row[key] = statistics.median(r[key] for r in row["rounds"])
    row["speedup"] = statistics.median(r["eager_ms"] / r["shim_ms"] for r in row["rounds"])
    if row["compile_rounds"]:
        row["compile_ms"] = statistics.median(r["compile_ms"] for r in row["compile_rounds"])
        row["shim_vs_compile"] = statistics.median(r["compile_ms"] / r["shim_ms"] for r in row["compile_rounds"])
    del model, shim, inputs, ref
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def markdown(data: dict) -> str:
    out = [f"# One diffusion-transformer step: eager, the diffusers shim, torch.compile ({data['device']}, {data['date']})",
           "", f"torch {data['torch']}, triton {data['triton']}, diffusers {data['diffusers']}; `benchmarks/diffusers_step.py`"
           f" (tree {data['tree']}): random bf16 weights, real widths and depths; CUDA-event medians of 5 steps per "
           f"round, {data['rounds']} rounds with eager and the shim in turn, then torch.compile (regional, fullgraph) "
           "and the shim in turn. Speedups are medians of the per-round ratios.", "",
           "| model (tokens) | eager ms | shim ms | shim vs eager | torch.compile ms | compile vs eager | shim vs compile "
           "| shim output vs eager |", "|---|---|---|---|---|---|---|---|"]
    for row in data["models"]:
        c = row.get("compile_ms")
        compiled = (f"{c:.1f} | {row['eager_ms'] / c:.2f}x | {row['shim_vs_compile']:.2f}x" if c else "– | – | –")
        diff = row["shim_vs_eager"]
        out.append(f"| {row['model']} ({row['tokens']}) | {row['eager_ms']:.1f} | {row['shim_ms']:.1f} | "
                   f"**{row['speedup']:.2f}x** | {compiled} | {diff['max_abs_over_max_ref']:.4f}, cos {diff['cos']:.6f} |")
    out += [""] + [f"- {row['model']}: {row['swapped']}" for row in data["models"]]
    out += [f"- error: {e}" for e in data["errors"]]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--tag", default="diffusers_step_" + time.strftime("%Y-%m-%d", time.gmtime()))
    ap.add_argument("--tree", help="the commit measured, for the report (default: git's HEAD here)")
    ap.add_argument("--smoke", action="store_true", help="tiny models on the CPU under the Triton interpreter")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    out = prepare(args.out, cpu=args.smoke)
    import subprocess

    import diffusers
    import torch
    import triton

    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    tree = args.tree or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "?"
    data = {"device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "diffusers": diffusers.__version__, "tree": tree, "rounds": args.rounds,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "models": [], "errors": []}
    from triton_collection.bench import load_packages  # built from this checkout, installed, loaded by Hub name

    names = ["triton-attention", "triton-norms", "triton-matmul"]
    loaded = load_packages(names, root=Path(__file__).resolve().parents[1])
    packages = [loaded[n] for n in names]

    def say(*a):
        print(*a, flush=True)

    for name in args.models:
        try:
            data["models"].append(run_model(name, args, packages, device, dtype, say))
        except Exception as err:  # noqa: BLE001  (one model failing keeps the others' rows)
            data["errors"].append(f"{name}: {type(err).__name__}: {str(err)[:300]}")
            say(f"{name} failed: {type(err).__name__}: {err}")
        (out / f"{args.tag}.json").write_text(json.dumps(data, indent=1))
        (out / f"{args.tag}.md").write_text(markdown(data))
    print(markdown(data))
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
