"""Compile the triton-activations kernels for GPU targets on a machine without a GPU.

    python tests/compile_gpu_targets.py <build variant folder> <arch> [--all]

``arch``: an NVIDIA compute capability (``90``) or an AMD target (``gfx942``). Triton ships
ptxas and the ROCm linker, so this lowers every kernel through TTIR/TTGIR/LLVM to a binary:
it catches errors the interpreter never sees (constexpr branches, libdevice calls, types).
Must run without ``TRITON_INTERPRET=1``. Prints ``COMPILED <n>``.

Default variants: every activation x (plain, gated) x (forward, backward), once as bf16 with
the eager rounding points and libdevice math (the CUDA/ROCm path), once as fp32 fused with
the portable math (the XPU path); ``--all`` compiles every combination. On NVIDIA targets the bf16
eager forwards take the fast math (``FAST``, inline PTX) and the one-axis grid, as the launcher may; the
fp32 gated forwards load u first (``U_FIRST``) and the plain forwards take flat tiles (``FLAT``), as in
one-wave launches.
"""

import itertools
import sys
from pathlib import Path

import kernels
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_TL = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": None}


def _signature(kernel, dtype: str, consts: dict) -> dict:
    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*" + dtype
        else:
            sig[name] = "fp32" if name == "threshold" else ("i64" if name.startswith("stride") else "i32")
    return sig


def main(variant: Path, arch: str, everything: bool) -> int:
    act = sys.modules[kernels.get_local_kernel(variant).__name__ + ".activation"]
    target = GPUTarget("cuda", int(arch), 32) if arch.isdigit() else GPUTarget("hip", arch, 64)
    if everything:
        combos = list(itertools.product(["bf16", "fp16", "fp32"], [False, True], [False, True]))
    else:
        combos = [("bf16", True, True), ("fp32", False, False)]  # (dtype, eager rounding, libdevice)
    count = 0
    # _libm.use_libdevice: 2 on NVIDIA with torch on CUDA 13, 1 on other NVIDIA toolkits and ROCm, 0 none
    vendors = ((2, 1) if everything else (2,)) if arch.isdigit() else (1,)
    for (dtype, eager, libdevice), act_id, gated in itertools.product(combos, range(7), [False, True]):
        for kernel, vendor in itertools.product((act._act_fwd_kernel, act._act_bwd_kernel),
                                                vendors if libdevice else (0,)):
            consts = {"ACT": act_id, "R": _TL[dtype] if eager else None, "LIBDEVICE": vendor, "ROWS": 2, "BLOCK_N": 1024}
            if kernel is act._act_fwd_kernel:
                # NVIDIA's fast math (inline PTX) and its one-axis grid where the launcher can choose them; u loaded
                # first for gelu_tanh, and for every gated op in the fp32 variants (as in one-wave launches)
                fast = arch.isdigit() and dtype == "bf16" and eager
                consts.update(FAST=fast, GRID_1D=fast, U_FIRST=gated and (act_id == 2 or dtype == "fp32"),
                              FLAT=not gated)
            if not gated:
                consts.update({n: None for n in ("u_ptr", "du_ptr") if n in kernel.arg_names})
            src = ASTSource(kernel, _signature(kernel, dtype, consts),
                            constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
            triton.compile(src, target=target, options={"num_warps": 4, "enable_fp_fusion": False})
            count += 1
    print("COMPILED", count)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], "--all" in sys.argv[3:]))
