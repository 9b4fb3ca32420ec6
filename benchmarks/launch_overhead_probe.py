"""Host time of one small kernel launch by each route a Python caller has (issue 7's small calls), GPU only.

    python3 benchmarks/launch_overhead_probe.py OUT [--calls N] [--rounds N]

Routes, each launching the same compiled Triton copy kernel (or, for the torch rows, one ATen kernel):
``triton jit``: ``kernel[grid](...)``; ``triton C launch``: the compiled kernel's C launcher called directly, as
``_fastlaunch``'s direct path does; ``torch static launcher``: ``torch._C._StaticCudaLauncher._launch_kernel`` (the
launcher torch.compile's generated code uses for Triton kernels) with tensors and with integer addresses;
``torch.neg out=``: one ATen kernel through the dispatcher; plus ``torch.empty_like`` and, for reference,
triton-norms' ``rms_norm`` and ``F.rms_norm`` on 16 x 4096 bf16. Per route: ``bench.wall_us_interleaved``, the median over
rounds of the mean wall time of ``--calls`` calls back to back with one synchronize (routes in turn within each
round: the host drifts).
Every route's output is checked first. Writes ``OUT/launch_overhead.txt``.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_common import load_packages, prepare, tee  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    out = prepare(args.out, cpu=False)
    say = tee(out / "launch_overhead.txt")
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import driver

    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=0.0), mask=offs < n)

    (norms,) = load_packages(["triton-norms"], cpu=False)
    fl = sys.modules[norms.__name__ + "._fastlaunch"]
    n, block = 4096, 1024
    grid = (triton.cdiv(n, block),)
    x = torch.randn(n, device="cuda")
    ys = {name: torch.empty_like(x) for name in ("jit", "c", "static", "static_int", "neg")}
    compiled = copy_kernel[grid](x, ys["jit"], n, BLOCK=block)
    launch, head = fl._bind(compiled)
    get_stream = driver.active.get_current_stream
    say(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
        f"direct C launch: {launch is not compiled.run}")
    routes = {
        "triton jit": lambda: copy_kernel[grid](x, ys["jit"], n, BLOCK=block),
        "triton C launch": lambda: launch(grid[0], 1, 1, get_stream(0), *head, x, ys["c"], n, block),  # constexprs follow
        "torch.neg out=": lambda: torch.neg(x, out=ys["neg"]),
        "torch.empty_like": lambda: torch.empty_like(x),
    }
    try:
        static = torch._C._StaticCudaLauncher
        cubin = out / "copy_kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        meta = compiled.metadata
        loaded = static._load_kernel(str(cubin), meta.name, meta.shared, 0)  # ([module,] function, regs, spills)
        function, n_regs, n_spills = loaded[-3:]
        scratch = ("O" if hasattr(meta, "global_scratch_size") else "") + ("O" if hasattr(meta, "profile_scratch_size") else "")
        tys = "OOi" + scratch
        nones = (None,) * len(scratch)
        xp, yp = x.data_ptr(), ys["static_int"].data_ptr()
        raw_stream = torch._C._cuda_getCurrentRawStream
        routes["torch static launcher"] = lambda: static._launch_kernel(
            function, grid[0], 1, 1, meta.num_warps, meta.shared, tys, (x, ys["static"], n, *nones), raw_stream(0))
        routes["torch static launcher, int addresses"] = lambda: static._launch_kernel(
            function, grid[0], 1, 1, meta.num_warps, meta.shared, tys, (xp, yp, n, *nones), raw_stream(0))
        say(f"static launcher: arg types {tys!r}, {n_regs} registers, {n_spills} spills")
    except Exception as err:  # noqa: BLE001
        say(f"static launcher unavailable: {type(err).__name__}: {err}")
    xs, w = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16), torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    routes["triton-norms rms_norm 16x4096"] = lambda: norms.rms_norm(xs, w)
    routes["F.rms_norm 16x4096"] = lambda: torch.nn.functional.rms_norm(xs, (4096,), w, 1e-6)
    for fn in routes.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    checked = ("jit", "c", "neg") + (("static", "static_int") if "torch static launcher" in routes else ())
    for name in checked:
        want = -x if name == "neg" else x
        say(f"output of {name}: {'ok' if torch.equal(ys[name], want) else 'WRONG'}")
    from triton_collection.bench import wall_us_interleaved  # the harness's latency timer (routes in turn)

    for name, us in zip(routes, wall_us_interleaved(list(routes.values()), calls=args.calls, rounds=args.rounds)):
        say(f"{name:40s} {us:7.2f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
