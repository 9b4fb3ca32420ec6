"""Compile triton-attention's Gluon forward (flash_sm90.py) for sm_90 on a machine without a GPU.

    python tests/compile_attention_sm90.py <build variant folder>

Compiles the shipped configurations (d = 128 and 64, causal and not, bf16) and prints one line per kernel,
``sm90 d=<D> causal=<0|1> hgmma=<n> setmaxnreg=<n> shared=<bytes>``, then ``COMPILED <n>``; prints ``SKIPPED <why>``
where this Triton's Gluon lacks what the kernel uses. ``hgmma`` counts HGMMA in the SASS (the cuobjdump Triton
ships), or wgmma in the PTX where there is none. Must run without ``TRITON_INTERPRET=1``.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import kernels
import triton
from triton.backends.compiler import GPUTarget


def _hgmma(compiled) -> int:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        return len(re.findall(r"wgmma\.mma_async", compiled.asm["ptx"]))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, timeout=120).stdout
    return len(re.findall(r"\bHGMMA\b", sass))


def main(variant: Path) -> int:
    sm90 = sys.modules[kernels.get_local_kernel(variant).__name__ + ".flash_sm90"]
    if not sm90.AVAILABLE:
        print("SKIPPED: this Triton has no usable Gluon")
        return 0
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = sm90._attn_fwd_sm90_kernel
    count = 0
    for D, cfg in sorted(sm90.CONFIGS.items()):
        for causal in (False, True):
            bm, bn = sm90.BLOCK_M, cfg.block_n
            q_layout = gl.NVMMASharedLayout.get_default_for([1, 1, bm, D], gl.bfloat16)
            kv_layout = gl.NVMMASharedLayout.get_default_for([1, 1, bn, D], gl.bfloat16)
            q_desc = f"tensordesc<bf16[1,1,{bm},{D}],{q_layout!r}>"
            kv_desc = f"tensordesc<bf16[1,1,{bn},{D}],{kv_layout!r}>"
            sig = {"desc_q": q_desc, "desc_k": kv_desc, "desc_v": kv_desc, "desc_o": q_desc, "LSE": "*fp32",
                   "Sq": "i32", "Sk": "i32", "GROUP": "i32", "qk_scale": "fp32"}
            consts = {"D": D, "BM": bm, "BLOCK_N": bn, "STAGES": cfg.stages, "CAUSAL": causal,
                      "PINGPONG": cfg.pingpong, "CONSUMER_REGS": cfg.consumer_regs}
            sig.update({name: "constexpr" for name in consts})
            src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4, "maxnreg": cfg.maxnreg})
            print(f"sm90 d={D} causal={int(causal)} hgmma={_hgmma(c)} "
                  f"setmaxnreg={len(re.findall(r'setmaxnreg', c.asm['ptx']))} shared={c.metadata.shared}")
            count += 1
    print(f"COMPILED {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
