"""A/B of a triton-matmul epilogue change (GPU): the package built from a base checkout against this checkout's, on
the fused-epilogue shapes of issue 5 and controls, with cuBLAS peers, in one process.

    python3 benchmarks/matmul_epilogue_ab.py BASE ROUNDS

BASE: a checkout of the base revision (``git archive <rev> | tar -x -C DIR``; build.toml and torch-ext suffice).
Per shape: both packages' fused ``matmul`` (and, on the bias+GELU and plain rows, this checkout's with three forced
configs: the gelu_tanh bucket's, Gluon ping-pong 128 x 128, Gluon cooperative 128 x 256), ``sep`` = F.linear then
the activation (cuBLAS + the eager op), F.linear alone; CUDA-graph medians of ROUNDS interleaved rounds, every
other round in reverse order; max error against fp64 and whether new and base agree bit for bit (a control row
whose code did not change shows the run's noise). Session 55 (GELU's Phi from one exp2): results/
matmul_gelu_epilogue_s55_h100_2026-12-06.txt.
"""
import statistics
import sys

sys.path.insert(0, "benchmarks")
from sweep_common import load_packages, prepare  # noqa: E402

prepare("/tmp/gelu_ab", False)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton_collection.bench import graph_median  # noqa: E402

base_root, rounds = sys.argv[1], int(sys.argv[2])
from pathlib import Path  # noqa: E402

(new,) = load_packages(["triton-matmul"], cpu=False)
(base,) = load_packages(["triton-matmul"], cpu=False, root=Path(base_root))
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
MC = sys.modules[new.__name__ + "._launch"].MatmulConfig
EXTRA = {"tanhcfg": MC(128, 256, 64, 16, 8, 3, tma=1, persistent=1, epilogue_subtile=1),
         "pp128": MC(128, 128, 64, 8, 4, 5, gluon=2), "co256": MC(128, 256, 64, 8, 4, 3, gluon=1)}
ACT = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), None: lambda h: h}
SHAPES = [("bias+gelu (diffusers GELU)", 4096, 12288, 3072, "gelu"),
          ("flux ff up, bias+gelu_tanh", 4096, 12288, 3072, "gelu_tanh"),
          ("plain + bias", 4096, 12288, 3072, None),
          ("SD GEGLU 1280->2x5120", 4096, 10240, 1280, "geglu"),
          ("Flux GEGLU 3072->2x12288", 4096, 24576, 3072, "geglu"),
          ("bias+gelu M=1024", 1024, 12288, 3072, "gelu"),
          ("bias+gelu 16384x3072x3072", 16384, 3072, 3072, "gelu")]
torch.manual_seed(0)
for name, M, N, K, act in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) * 0.5
    if act == "geglu":
        def sep():
            p, g = F.linear(a, w, bias).chunk(2, -1)
            return p * F.gelu(g)
    else:
        def sep():
            return ACT[act](F.linear(a, w, bias))
    sides = {"new": lambda: new.matmul(a, w.t(), bias, act), "base": lambda: base.matmul(a, w.t(), bias, act),
             "sep": sep, "linear": lambda: F.linear(a, w, bias)}
    if name.startswith("bias+gelu (") or name.startswith("plain"):
        for k, cfg in EXTRA.items():
            sides[k] = (lambda cfg=cfg: new.matmul(a, w.t(), bias, act, config=cfg))
    h64 = a.double() @ w.double().t() + bias.double()
    if act == "geglu":
        p, g = h64.chunk(2, -1)
        r64 = p * F.gelu(g)
    else:
        r64 = ACT[act](h64)
    err = {k: float((sides[k]().double() - r64).abs().max() / r64.abs().max()) for k in sides if k != "linear"}
    eq = torch.equal(sides["new"](), sides["base"]())
    times = {k: [] for k in sides}
    for r in range(rounds):  # every other round in reverse order (the first timed side read slower or faster)
        for k, fn in (list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]):
            times[k].append(graph_median(fn, rep=40))
    med = {k: statistics.median(v) for k, v in times.items()}
    fl = 2 * M * N * K / 1e12
    ratios = f"sep/new {med['sep'] / med['new']:.3f} sep/base {med['sep'] / med['base']:.3f} " \
             f"new/base {med['base'] / med['new']:.3f}"
    errs = " ".join(f"{k} {v:.2e}" for k, v in err.items())
    print(f"{name:30s} {M}x{N}x{K}: " + " ".join(f"{k} {med[k] * 1e3:7.1f}us ({fl / med[k] * 1e3:5.0f} TF)"
                                                   for k in med) + f" | {ratios} | err {errs} bitequal {eq}", flush=True)
    del a, w, bias, h64, r64
