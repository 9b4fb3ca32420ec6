"""SASS instruction counts of triton-matmul's TMA kernel per epilogue activation, compiled for sm_90 on any machine
(no GPU needed): what each activation adds to the epilogue, which runs while the tensor cores wait.

    python3 benchmarks/matmul_epilogue_sass_counts.py <triton-matmul build variant folder> [ACT,...]

The H200 bucket of 4096 x 12288 x 3072 (128 x 256 x 64 tiles, 8 warps, 4 stages, persistent, split epilogue,
bf16 with a bias); ACT ids as ``_epilogue_math.ACTIVATIONS`` (0 none, 1 gelu, 2 gelu_tanh, 3 silu, 4 relu). Prints
the total and the most frequent opcodes; needs the cuobjdump that Triton ships. Must run without TRITON_INTERPRET.
"""

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import kernels
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", re.M)


def sass(cubin: bytes) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout


def main(variant: Path, acts) -> None:
    mm = sys.modules[kernels.get_local_kernel(variant).__name__ + ".matmul"]
    kernel, (bm, bn, bk) = mm._matmul_tma_kernel, (128, 256, 64)
    for act in acts:
        sig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
               "bias_ptr": "*bf16", "y_desc": f"tensordesc<bf16[{bm}, {bn // 2}]>",
               "M": "i32", "N": "i32", "K": "i32", "stride_hm": "i32", "NUM_PROGS": "i32"}
        consts = {"GATED": False, "ACT": act, "B_NK": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                  "GROUP_M": 8, "WARP_SPECIALIZE": False, "FLATTEN": True, "EPILOGUE_SUBTILE": True, "SPLIT_K": 1,
                  "UPCAST": False, "h_ptr": None, "FAST_MATH": True, "SUB_N": 1, "ws_ptr": None, "cnt_ptr": None}
        sig.update({name: "constexpr" for name in consts})
        # as the launcher specializes them for these shapes: the bias 16-byte aligned, M, N, K multiples of 16
        attrs = {(kernel.arg_names.index(k),): [["tt.divisibility", 16]] for k in ("bias_ptr", "M", "N", "K")}
        src = ASTSource(kernel, sig, constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()},
                        attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 8, "num_stages": 4, "enable_fp_fusion": True})
        ops = collections.Counter(OPCODE.findall(sass(compiled.asm["cubin"])))
        top = " ".join(f"{op}={n}" for op, n in ops.most_common(12))
        print(f"ACT={act} total={sum(ops.values())} {top}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(a) for a in (sys.argv[2] if len(sys.argv) > 2 else "0,1,2,3").split(",")])
