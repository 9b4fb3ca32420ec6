"""Wide softmax rows against a copy of the same bytes, as the row count varies (issue 4's N = 262144 row).

    python3 benchmarks/softmax_size_probe.py

The harness's 256 x 262144 row moves 256 MiB where the other softmax rows move 512 MiB. do_bench flushes the L2 by
zeroing a 256 MiB buffer before each call, which leaves up to the L2's size of dirty lines to be written back while the
timed kernel runs: a larger share of a small kernel's traffic. This prints, per shape, the package's softmax and a
device copy of the same bytes, each as do_bench (L2 flushed) and as CUDA-graph replays (GB/s), and the ratio.
"""
import sys, torch, triton
sys.path.insert(0, "benchmarks")
from sweep_common import load_packages
(S,) = load_packages(["triton-softmax"], cpu=False)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)

def graph_ms(fn, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps): fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / reps)
    return sorted(ts)[3]

for M, N in [(4096, 32768), (2048, 131072), (256, 262144), (512, 262144), (1024, 262144), (2048, 262144)]:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    nb = 2 * x.numel() * 2
    ref = torch.softmax(x.float(), -1)
    err = (S.softmax(x).float() - ref).abs().max().item()
    out = []
    for name, fn in (("copy", lambda: y.copy_(x)), ("ours", lambda: S.softmax(x))):
        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
        gms = graph_ms(fn)
        out.append((name, nb / ms / 1e6, nb / gms / 1e6))
    c, o = out
    print(f"{M:5d}x{N:<6d} MiB={nb/2**20:6.0f} copy {c[1]:5.0f}/{c[2]:5.0f}  ours {o[1]:5.0f}/{o[2]:5.0f} GB/s "
          f"(do_bench/graph)  ours/copy {o[1]/c[1]:.3f}/{o[2]/c[2]:.3f} err {err:.1e}", flush=True)
    del x, y, ref
