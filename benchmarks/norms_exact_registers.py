"""Registers and spills of the bit-exact norm forwards as ``kernelize``'s layers launch them, without a GPU.

    python benchmarks/norms_exact_registers.py PKG_DIR [--arch 90,gfx942] [--kinds mean,fused,ln]
                                               [--shapes MxN,...] [--max-regs [KIND=]R,...]
                                               [--dtype bf16|fp16|fp32]

``PKG_DIR`` is a built triton-norms variant (``triton-collection build``, then ``build/torch-cuda``, or the
``torch-cpu`` variant the tests build: the kernels are the same). Run it without ``TRITON_INTERPRET``. Each layer's
shipped schedule for the H200 (``_exact.rms_exact_plan`` / ``ln_exact_plan`` on a non-CUDA device take the H200's
limits) is compiled for every ``--arch`` with the runtime's specialisation of a contiguous inference call
(``--dtype``, bf16 by default; no bias for the RMS layers, no saved statistics; pointers 16-byte aligned, integers
marked divisible by 16 where they are), and on NVIDIA targets ``cuobjdump -res-usage`` reads its registers and
stack. On the H200 these counts equal what the runtime reports for the same launches (session 17's sweep:
59 / 86 / 86 / 57 / 255 + spills / 128 + spills for the mean order). Prints ``REGS`` and ``COMPILED`` lines; ``--max-regs``: a bound for every kind or per kind
(``mean=128,fused=128,ln=64``); exit status 1 when a kernel takes more registers or any stack.

``LlamaRMSNorm`` = the mean order, ``nn.RMSNorm`` = the fused order, ``nn.LayerNorm`` = ``ln``. Needs a build with
``ln_exact_plan`` (session 18 on); the results' "before" columns came from c77638a's LayerNorm launcher, planned alike.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import kernels
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SHAPES = "65536x2048,32768x4096,26214x5120,16384x8192,8192x16384,2048x65536"
OPTIONS = ("num_warps", "enable_fp_fusion", "maxnreg")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def launch_of(ex, kind: str, M: int, N: int, dtype: str = "bf16"):
    """(kernel, constexprs, compile options) of the layer's launch on M x N of ``dtype`` (input, weight, output)."""
    cpu = torch.device("cpu")
    elem = DTYPES[dtype].itemsize
    if kind == "ln":
        plan, absent = ex.ln_exact_plan(M, N, N, elem, cpu, 1e-5, N % 4 == 0), ("mean_ptr", "rstd_ptr")
    else:
        order = ex.ORDER_MEAN if kind == "mean" else ex.ORDER_FUSED
        plan = ex.rms_exact_plan(M, N, N, elem, cpu, 1e-6, 0.0, DTYPES[dtype] if kind == "mean" else None, order,
                                 N % 4 == 0)
        absent = ("b_ptr", "rstd_ptr", "res_ptr", "h_ptr")
    meta = dict(plan.meta, **dict.fromkeys(absent))
    kernel = plan.kernel
    options = {k: meta.pop(k) for k in OPTIONS if k in meta}
    return kernel, meta, options


def compile_for(kernel, consts: dict, options: dict, ints: dict, target: GPUTarget, scratch: Path,
                dtype: str = "bf16"):
    """Compiles for ``target`` (``ints``: the integer arguments' values, for their divisibility; ``dtype``: the
    tensors' element type but the fp32 statistics); (registers, stack bytes) on NVIDIA, else None."""
    names = kernel.arg_names
    sig = {n: "constexpr" if n in consts else "*fp32" if n in ("mean_ptr", "rstd_ptr") else
           f"*{dtype}" if n.endswith("_ptr") else "fp32" if n in ("eps", "weight_offset", "factor") else "i32"
           for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or sig[n] == "i32" and ints[n] % 16 == 0}
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    compiled = triton.compile(src, target=target, options=options)
    if target.backend != "cuda":
        return None
    cubin = scratch / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    res = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    return int(res.split("REG:")[1].split()[0]), int(res.split("STACK:")[1].split()[0])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pkg")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--kinds", default="mean,fused,ln")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--max-regs", default=None)
    ap.add_argument("--scratch", default="/tmp")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("norms_exact_registers.py compiles for GPU targets: unset TRITON_INTERPRET")
    kinds = args.kinds.split(",")
    bound = dict.fromkeys(kinds)
    for item in (args.max_regs.split(",") if args.max_regs else []):
        kind, _, value = item.rpartition("=")
        bound.update({kind: int(value)} if kind else dict.fromkeys(kinds, int(value)))
    ex = sys.modules[kernels.get_local_kernel(Path(args.pkg)).__name__ + "._exact"]
    bad = 0
    for arch in args.arch.split(","):
        target = GPUTarget("cuda", int(arch), 32) if arch.isdigit() else GPUTarget("hip", arch, 64)
        for kind in kinds:
            for shape in args.shapes.split(","):
                M, N = (int(v) for v in shape.split("x"))
                kernel, consts, options = launch_of(ex, kind, M, N, args.dtype)
                ints = {"M": M, "N": N, "stride_x_row": N, "stride_res_row": 0}
                usage = compile_for(kernel, consts, options, ints, target, Path(args.scratch), args.dtype)
                if usage is not None:
                    regs, stack = usage
                    over = bound[kind] is not None and (regs > bound[kind] or stack > 0)
                    bad += over
                    sched = {k: consts[k] for k in ("ROWS", "BLOCK_N", "UNROLL") if k in consts}
                    print(f"REGS {kind:5} {shape:12} regs {regs:3d} stack {stack:4d} warps {options.get('num_warps')}"
                          f" {sched}{' OVER' if over else ''}", flush=True)
                print(f"COMPILED {arch} {kind} {shape}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
