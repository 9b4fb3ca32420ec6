"""Does allocating the output inside a CUDA-graph-timed call cost time? (issues 4 and 7; prepared in session 14, run
in session 15: no, results/softmax_layout_2026-12-02.txt.)

    python3 benchmarks/graph_alloc_check.py OUT_DIR      (GPU)

Session 12's softmax sweep (``results/softmax_wide_sweep_2026-12-01.txt``) timed the package's ``softmax(x)``, which
allocates its output per call, at 3826 GB/s (16384 x 16384 bf16) against 3957 for a standalone kernel writing one
preallocated ``y``. Session 14 compiled both for sm_90 on the CPU machine and found the same SASS, assuming the
package's row layout specialised R2 = 1. In session 15 this check showed allocation costs nothing (fixed ``y`` 3959,
allocating 3955), and the package's compiled kernel showed R2 = 16384 as a runtime integer: the row layout padded a
single leading dim at the front, so every program divided its row index before its loads. With the padding at the
end the package moved 3982 GB/s (standalone 3988).

For the standalone kernel of ``softmax_wide_sweep.py`` (``reg 16``) this prints:
- the distinct output addresses of 8 allocating calls captured in one graph (1 or 2: the private pool reuses a
  freed block; 8: every call writes fresh memory);
- graph and eager (``do_bench``) medians of the kernel writing a fixed ``y`` against the same kernel allocating
  its output per call, and the package's ``softmax(x)``, min of 3 interleaved rounds.
"""
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench


def main(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from softmax_wide_sweep import reg_kernel
    from sweep_common import load_packages, tee
    from triton_collection.bench import graph_median

    out.mkdir(parents=True, exist_ok=True)
    say = tee(out / "graph_alloc_check.txt")
    say(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
        f"{time.strftime('%Y-%m-%d %H:%M')}")
    (pkg,) = load_packages(["triton-softmax"], False)
    for M, N in ((16384, 16384), (8192, 32768)):
        x = torch.randn(M, N, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        warps = 16 if N <= 16384 else 32

        def run(dst):
            reg_kernel[(M,)](x, dst, N, N, N, BLOCK=N, RCP=False, num_warps=warps)
            return dst

        seen = []
        g = torch.cuda.CUDAGraph()
        run(torch.empty_like(x))
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(8):
                seen.append(run(torch.empty_like(x)).data_ptr())
        del g
        say(f"{M}x{N}: distinct output addresses of 8 allocating calls in one graph: {len(set(seen))}")
        cands = {"fixed y": lambda: run(y), "allocating": lambda: run(torch.empty_like(x)),
                 "package softmax(x)": lambda: pkg.softmax(x)}
        times = {k: {"graph": [], "eager": []} for k in cands}
        for _ in range(3):
            for k, fn in cands.items():
                times[k]["graph"].append(graph_median(fn, rep=60))
                times[k]["eager"].append(do_bench(fn, warmup=10, rep=60, return_mode="median"))
        for k in cands:
            g_ms, e_ms = min(times[k]["graph"]), min(times[k]["eager"])
            say(f"  {k:20s} graph {g_ms * 1e3:7.1f} us {4 * M * N / g_ms / 1e6:6.0f} GB/s | eager {e_ms * 1e3:7.1f} us "
                f"{4 * M * N / e_ms / 1e6:6.0f} GB/s | graph rounds "
                f"{statistics.median(times[k]['graph']) * 1e3:.1f} median")
        del x, y
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
