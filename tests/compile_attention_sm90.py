"""Compile triton-attention's Gluon kernels (flash_sm90.py, flash_sm90_bwd.py) for sm_90 on a machine without a GPU.

    python tests/compile_attention_sm90.py <build variant folder>

Compiles the shipped configurations of the forward (d = 128 and 64) and of the backward's dQ and dK/dV kernels
(d = 128), causal and not, bf16, and prints one line per kernel,
``sm90 kernel=<fwd|dq|dkdv> d=<D> causal=<0|1> hgmma=<n> setmaxnreg=<n> shared=<bytes>``, then ``COMPILED <n>``;
prints ``SKIPPED <why>`` where this Triton's Gluon lacks what the kernel uses. ``hgmma`` counts HGMMA in the SASS
(the cuobjdump Triton ships), or wgmma in the PTX where there is none. Must run without ``TRITON_INTERPRET=1``.
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


def _report(kind: str, D: int, causal: bool, compiled) -> None:
    print(f"sm90 kernel={kind} d={D} causal={int(causal)} hgmma={_hgmma(compiled)} "
          f"setmaxnreg={len(re.findall(r'setmaxnreg', compiled.asm['ptx']))} shared={compiled.metadata.shared}")


def _backward(bwd, sm90, gl, GluonASTSource) -> int:
    """The shipped dQ and dK/dV kernels of flash_sm90_bwd.py (each head dim of their configs), causal and not."""
    count = 0
    for D in sorted(bwd.DQ_CONFIGS):
        for causal in (False, True):
            for kind, fn, cfg in (("dq", bwd._attn_bwd_dq_sm90_kernel, bwd.DQ_CONFIGS[D]),
                                  ("dkdv", bwd._attn_bwd_dkdv_sm90_kernel, bwd.DKDV_CONFIGS[D])):
                def desc(rows):
                    layout = gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)
                    return f"tensordesc<bf16[1,1,{rows},{D}],{layout!r}>"
                q, kv = desc(bwd.BLOCK_M), desc(cfg.block_n)
                sig = {"desc_q": q, "desc_k": kv, "desc_v": kv, "desc_do": q, "LSE": "*fp32", "DELTA": "*fp32",
                       "GROUP": "i32", "qk_scale": "fp32", "scale": "fp32", "Sq": "i32", "Sk": "i32", "H": "i32"}
                consts = {"D": D, "CAUSAL": causal, "STAGES": cfg.stages, "CONSUMER_REGS": cfg.consumer_regs,
                          "HEAD_GROUP": sm90.CAUSAL_HEAD_GROUP}
                if kind == "dq":
                    sig["desc_dq"] = q
                    consts.update(BM=bwd.BLOCK_M, BLOCK_N=cfg.block_n)
                else:
                    sig.update(desc_dk=kv, desc_dv=kv)
                    consts.update(BM=bwd.BLOCK_M, BK=cfg.block_n)
                sig = {name: sig[name] for name in fn.arg_names if name not in consts}
                sig.update({name: "constexpr" for name in consts})
                src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
                c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": 4, "maxnreg": cfg.maxnreg, "enable_fp_fusion": True})
                _report(kind, D, causal, c)
                count += 1
    return count


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
                      "PINGPONG": cfg.pingpong, "CONSUMER_REGS": cfg.consumer_regs,
                      "HEAD_GROUP": sm90.CAUSAL_HEAD_GROUP}
            sig.update({name: "constexpr" for name in consts})
            src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": 4, "maxnreg": cfg.maxnreg, "enable_fp_fusion": True})
            _report("fwd", D, causal, c)
            count += 1
    count += _backward(sys.modules[sm90.__name__ + "_bwd"], sm90, gl, GluonASTSource)
    print(f"COMPILED {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
