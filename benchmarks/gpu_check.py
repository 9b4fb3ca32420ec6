"""The GPU half of the foundation checks, in one process (``make gpu-check``).

1. bf16 bit-exactness of every triton-norms layer to the module it replaces, on random data, and of
   the torch-order statistics (rstd, mean) to torch's own CUDA kernels.
2. A kernelized random-weight Llama (bf16) gives logits bit-identical to the eager model (case 6).
3. Case 2: rms_norm forward+backward on (1, 1048576, 4096) bf16 (> 2^31 elements).
4. A first benchmark: rms_norm / layer_norm forward and forward+backward in GB/s next to HF eager,
   F.rms_norm / F.layer_norm, torch.compile and Liger, plus the device copy ceiling.

The package is built with ``triton_collection`` and loaded through ``kernels`` exactly as users
load it. Results go to ``$OUT`` (or ``benchmarks/results/``) as JSON and Markdown.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RESULTS: dict = {"checks": [], "bench": []}


def log(msg: str) -> None:
    print(msg, flush=True)


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
    log(f"[{'PASS' if ok else 'FAIL'}] {name} {detail}")


def load_norms():
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    from triton_collection.build import build_collection
    from triton_collection.install import install_local
    from triton_collection.manifest import load_manifest

    import kernels

    built = build_collection(load_manifest(ROOT), Path(tempfile.mkdtemp()) / "hub", packages=["triton-norms"])[0]
    install_local(built, org="triton-collection")
    return kernels.get_kernel("triton-collection/triton-norms", version=1)


# ---------------------------------------------------------------- exactness
def modules_under_test(hidden: int, dtype: torch.dtype):
    """(name, module, layer class name) for every module family triton-norms replaces."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    out = [
        ("LlamaRMSNorm", LlamaRMSNorm(hidden, eps=1e-6), "LlamaRMSNorm"),
        ("Olmo2RMSNorm", Olmo2RMSNorm(hidden, eps=1e-6), "Olmo2RMSNorm"),
        ("GemmaRMSNorm", GemmaRMSNorm(hidden, eps=1e-6), "GemmaRMSNorm"),
        ("nn.LayerNorm", torch.nn.LayerNorm(hidden), "LayerNorm"),
        ("nn.LayerNorm(no bias)", torch.nn.LayerNorm(hidden, bias=False), "LayerNorm"),
        ("nn.RMSNorm", torch.nn.RMSNorm(hidden), "TorchRMSNorm"),
        ("nn.RMSNorm(eps=1e-5)", torch.nn.RMSNorm(hidden, eps=1e-5), "TorchRMSNorm"),
    ]
    try:
        from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

        out.append(("diffusers.RMSNorm", DiffusersRMSNorm(hidden, eps=1e-6), "DiffusersRMSNorm"))
        out.append(("diffusers.RMSNorm(no weight)", DiffusersRMSNorm(hidden, eps=1e-6, elementwise_affine=False), "DiffusersRMSNorm"))
    except ImportError:
        log("diffusers not installed: its RMSNorm is not checked here")
    for _, module, _ in out:
        for p in module.parameters():
            with torch.no_grad():
                p.copy_(torch.randn_like(p) * 0.5 + 1.0)
        module.to("cuda", dtype)
    return out


def check_layers_exact(norms) -> None:
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for rows, hidden in ((7, 576), (333, 4096), (5, 5121), (2, 65537)):
            for name, module, layer in modules_under_test(hidden, dtype):
                x = torch.randn(rows, hidden, device="cuda", dtype=dtype) * 3
                ref = module(x)
                got = getattr(norms.layers, layer).forward(module, x)
                same = got.dtype == ref.dtype and torch.equal(got, ref)
                diff = (got.float() - ref.float()).abs().max().item() if got.shape == ref.shape else float("nan")
                check(f"exact {name} {str(dtype)[6:]} {rows}x{hidden}", same, f"max|diff|={diff:.3g} dtype {got.dtype}/{ref.dtype}")


def check_torch_orders(norms) -> None:
    """The statistics of the bit-exact forwards equal torch's on CUDA, bit for bit (bf16 input).

    ``torch_order="mean"``: rstd vs ``rsqrt(x.float().pow(2).mean(-1) + eps)``; ``"fused"``: rstd and
    y vs ``aten._fused_rms_norm``, mean/rstd/y vs ``native_layer_norm`` (vectorized N % 4 == 0 and
    row-wise Welford paths)."""
    ops = norms._ops.ops

    def same(a, b):
        return torch.equal(a.reshape(-1).view(torch.int32), b.reshape(-1).contiguous().view(torch.int32)) \
            if a.dtype == torch.float32 else torch.equal(a, b)

    torch.manual_seed(0)
    for N in (576, 2048, 4096, 5120, 5121, 8192, 65537):
        bad = []
        for M in (1, 2, 7, 37, 333, 4096):
            x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 3
            _, _, rstd = ops.rms_norm_fwd(x, None, None, None, 1e-6, 0.0, torch.bfloat16, torch.bfloat16, 1)
            if not same(rstd, torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)):
                bad.append(M)
        check(f"torch order mean: rstd bit-exact, N={N}, M in 1..4096", not bad, f"inexact M={bad}")
    for M, N in ((333, 4096), (7, 576), (5, 5121), (2, 65537), (64, 1000)):
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) * 3 + 0.5
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        y, _, rstd = ops.rms_norm_fwd(x, None, w, None, 1e-6, 0.0, None, torch.bfloat16, 2)
        yt, rt = torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6)
        check(f"torch order fused rms_norm {M}x{N}", same(rstd, rt) and torch.equal(y, yt))
        y, _, mean, rstd = ops.layer_norm_fwd(x, None, w, b, 1e-5, 2)
        yt, mt, rt = torch.native_layer_norm(x, [N], w, b, 1e-5)
        check(f"torch order fused layer_norm {M}x{N}", same(mean, mt) and same(rstd, rt) and torch.equal(y, yt),
              f"mean {same(mean, mt)} rstd {same(rstd, rt)} y {torch.equal(y, yt)}")


def check_kernelized_models(norms) -> None:
    """Case 6: kernelized Llama, Olmo2 and Gemma models (bf16, random norm weights) give bit-identical logits."""
    from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig, Olmo2Config

    from kernels import Mode
    from triton_collection.integrations.transformers import kernelize

    shape = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=4096, max_position_embeddings=512)
    for cfg in (LlamaConfig(**shape), Olmo2Config(**shape), GemmaConfig(**shape, head_dim=64)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).to("cuda", torch.bfloat16).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:  # all-ones weights would hide a wrong family
                    p.copy_(torch.randn_like(p) * 0.5 + 1.0)
        ids = torch.randint(0, cfg.vocab_size, (2, 37), device="cuda")
        with torch.no_grad():
            ref = model(ids).logits
            report = kernelize(model, mode=Mode.INFERENCE, device="cuda")
            got = model(ids).logits
        layers = sorted(set(report.swapped.values()))
        check(f"case6 kernelized {cfg.model_type} bf16 logits bit-identical", torch.equal(ref, got),
              f"swapped={len(report)} {layers} max|diff|={(ref.float() - got.float()).abs().max().item():.3g}")


def check_case2(norms) -> None:
    """(1, 1048576, 4096) bf16: 2^32 elements, so row * stride passes 2^31 from row 524288 on."""
    torch.manual_seed(0)
    x = torch.randn(1, 1048576, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = norms.rms_norm(x, w, eps=1e-6, cast_dtype=torch.bfloat16)
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.cuda.synchronize()
    worst = 0.0
    for start in (0, 524287, 524288, 1048576 - 64):
        xs = x.detach()[0, start:start + 64].float()
        xn = (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
        ref = (w.detach() * xn)
        worst = max(worst, (y[0, start:start + 64].float() - ref.float()).abs().max().item())
    ok_fwd = worst == 0.0
    check("case2 rms_norm fwd > 2^31 elements (rows 0, 524287, 524288, last)", ok_fwd, f"max|diff|={worst:.3g}")
    # backward: compare the tail rows' dx with fp32 autograd of the same formula
    xs = x.detach()[0, -64:].float().requires_grad_(True)
    ws = w.detach().float().requires_grad_(True)
    ref = ws * (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6))
    ref.backward(dy[0, -64:].float())
    rel = ((x.grad[0, -64:].float() - xs.grad).norm() / xs.grad.norm()).item()
    finite = bool(torch.isfinite(w.grad).all()) and bool(torch.isfinite(x.grad).all())
    check("case2 rms_norm bwd > 2^31 elements (last rows dx, finite dw)", rel < 1e-2 and finite, f"rel dx err={rel:.2e}")
    del x, w, y, dy


# ---------------------------------------------------------------- benchmark
# GB/s and the copy ceiling are defined once, in the harness (`triton-collection bench`)
from triton_collection.bench import gbps, measure_ceilings  # noqa: E402


def copy_ceiling() -> float:
    return measure_ceilings(matmul=False)["copy_gbps"]


def bench_norms(norms, ceiling: float) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception as exc:  # noqa: BLE001 - report, carry on without the peer
        log(f"liger-kernel not importable ({exc}); skipped as a peer")
        LigerRMSNormFunction = LigerLayerNormFunction = None

    shapes = [(32768, 4096), (16384, 8192), (4096, 65536), (140, 4096), (2, 262144)]
    dtype = torch.bfloat16
    for op in ("rms_norm", "layer_norm"):
        for rows, n in shapes:
            x = torch.randn(rows, n, device="cuda", dtype=dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            if op == "rms_norm":
                hf = LlamaRMSNorm(n, eps=1e-6).to("cuda", dtype)
                providers = {
                    "triton-norms": lambda x: norms.rms_norm(x, w, eps=1e-6, cast_dtype=x.dtype),
                    "hf-eager": lambda x: hf.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype),
                    "F.rms_norm": lambda x: F.rms_norm(x, (n,), w, 1e-6),
                }
                providers["triton-norms LlamaRMSNorm layer (bit-exact order)"] = lambda x: norms.layers.LlamaRMSNorm.forward(hf, x)
                providers["torch.compile"] = torch.compile(providers["hf-eager"])
                if LigerRMSNormFunction is not None:
                    providers["liger"] = lambda x: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
            else:
                providers = {
                    "triton-norms": lambda x: norms.layer_norm(x, w, b, eps=1e-5),
                    "F.layer_norm": lambda x: F.layer_norm(x, (n,), w, b, 1e-5),
                }
                ln = torch.nn.LayerNorm(n).to("cuda", dtype)
                providers["triton-norms LayerNorm layer (bit-exact order)"] = lambda x: norms.layers.LayerNorm.forward(ln, x)
                providers["torch.compile"] = torch.compile(lambda x: F.layer_norm(x, (n,), w, b, 1e-5))
                if LigerLayerNormFunction is not None:
                    providers["liger"] = lambda x: LigerLayerNormFunction.apply(x, w, b, 1e-5)
            fwd_bytes = 2 * x.numel() * x.element_size() + n * 2
            for name, fn in providers.items():
                row = {"op": op, "rows": rows, "N": n, "dtype": "bf16", "provider": name}
                try:
                    ms = do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                    row.update(fwd_ms=ms, fwd_gbps=gbps(fwd_bytes, ms), fwd_frac=gbps(fwd_bytes, ms) / ceiling)
                    xg = x.clone().requires_grad_(True)
                    y = fn(xg)
                    dy = torch.randn_like(y)
                    # fwd+bwd: read x, write y; read x, dy (and w), write dx
                    fb_bytes = 5 * x.numel() * x.element_size()

                    def fwd_bwd():
                        xg.grad = None
                        fn(xg).backward(dy)

                    ms = do_bench(fwd_bwd, warmup=10, rep=60, return_mode="median")
                    row.update(fwdbwd_ms=ms, fwdbwd_gbps=gbps(fb_bytes, ms))
                except Exception as exc:  # noqa: BLE001 - a failing peer is reported, not fatal
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                RESULTS["bench"].append(row)
                log(f"{op:10s} {rows:6d}x{n:<6d} {name[:28]:28s} fwd {row.get('fwd_gbps', float('nan')):7.0f} GB/s  "
                    f"fwd+bwd {row.get('fwdbwd_gbps', float('nan')):7.0f} GB/s {row.get('error', '')}")


def write_results(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.date.today().isoformat()
    (out / f"gpu_check_{stamp}.json").write_text(json.dumps(RESULTS, indent=2))
    lines = [f"# triton-norms GPU check, {stamp}", "", f"GPU: {RESULTS['env']['gpu']}; torch {RESULTS['env']['torch']}, "
             f"triton {RESULTS['env']['triton']}; copy ceiling {RESULTS['env']['copy_gbps']:.0f} GB/s", "",
             "## Checks", ""] + [f"- {'PASS' if c['ok'] else 'FAIL'} {c['name']} {c['detail']}" for c in RESULTS["checks"]]
    lines += ["", "## Benchmark (bf16, median of do_bench; GB/s counts each tensor read or written once)", "",
              "| op | shape | provider | fwd GB/s | fwd % of copy | fwd+bwd GB/s |", "|---|---|---|---|---|---|"]
    for r in RESULTS["bench"]:
        lines.append(f"| {r['op']} | {r['rows']}x{r['N']} | {r['provider']} | {r.get('fwd_gbps', float('nan')):.0f} | "
                     f"{100 * r.get('fwd_frac', float('nan')):.0f}% | {r.get('fwdbwd_gbps', float('nan')):.0f} |")
    (out / f"gpu_check_{stamp}.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    assert torch.cuda.is_available(), "gpu_check needs a CUDA device"
    RESULTS["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                      "python": platform.python_version(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    norms = load_norms()
    ceiling = copy_ceiling()
    RESULTS["env"]["copy_gbps"] = ceiling
    log(f"copy ceiling {ceiling:.0f} GB/s on {RESULTS['env']['gpu']}")
    steps = [check_layers_exact, check_torch_orders, check_kernelized_models, check_case2]
    if "--no-bench" not in sys.argv:
        steps.append(lambda n: bench_norms(n, ceiling))
    for step in steps:
        try:
            step(norms)
        except Exception:  # noqa: BLE001 - one broken step must not hide the others
            check(f"{getattr(step, '__name__', 'bench')} raised", False, traceback.format_exc()[-1500:])
        torch.cuda.empty_cache()
    write_results(Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results"))
    failed = [c for c in RESULTS["checks"] if not c["ok"]]
    log(f"{len(RESULTS['checks']) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
