"""Compile the triton-matmul kernels for GPU targets on a machine without a GPU; report warpgroup MMA.

    python tests/compile_matmul_targets.py <build variant folder> <arch>

``arch``: ``90`` (Hopper: the TMA, stream-K and GEMV kernels (NVIDIA fast-math activation: inline PTX)
in their main configurations, 192-wide ``SUB_N`` tiles included, + the pointer kernel, with
integer arguments equal to 1 specialized to constants as the launcher does; the
SASS, disassembled with the ``cuobjdump`` Triton ships, must hold ``HGMMA``; and the Gluon kernel of
``matmul_sm90`` in ``GLUON_VARIANTS``: ``gluon`` lines), or an AMD target
such as ``gfx942`` (the pointer kernel). Must run without ``TRITON_INTERPRET=1``. Prints one
line per kernel (``<name> hgmma=<n> shared=<bytes>``) and ``COMPILED <n>``.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import kernels
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def _sass(cubin: bytes) -> str:
    """The SASS of ``cubin`` ("" where this Triton ships no cuobjdump)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, timeout=120).stdout


def _sass_hgmma(cubin: bytes) -> int:
    sass = _sass(cubin)
    return len(re.findall(r"\bHGMMA\b", sass)) if sass else -1


def _compile(kernel, sig: dict, consts: dict, target, warps: int, stages: int):
    sig = dict(sig)
    for name in consts:
        sig[name] = "constexpr"
    src = ASTSource(kernel, sig, constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    return triton.compile(src, target=target,
                          options={"num_warps": warps, "num_stages": stages, "enable_fp_fusion": True})


# (gluon, BLOCK_M, BLOCK_N, BLOCK_K, stages): cooperative 128 x 128 and 128 x 256 tiles, ping-pong 64 x 128,
# 128 x 64 and 64 x 64 x 128 with deep rings (the last three: the tiles of the shipped H200 entries)
GLUON_VARIANTS = [(1, 128, 128, 64, 4), (1, 128, 256, 64, 3), (2, 64, 128, 64, 8), (2, 128, 64, 64, 8),
                  (2, 64, 64, 128, 6)]


def _gluon(sm90, target) -> int:
    """The sm_90 Gluon kernel (matmul_sm90) in GLUON_VARIANTS, bf16 with bias and GELU; ``gluon`` lines report
    HGMMA, local-memory (spill) instructions and shared bytes. 0 kernels where this Triton's Gluon lacks a piece."""
    if not sm90.AVAILABLE:
        print(f"gluon SKIPPED: Triton {triton.__version__} has no usable Gluon")
        return 0
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = sm90._matmul_sm90_kernel
    count = 0
    for gluon, bm, bn, bk, stages in GLUON_VARIANTS:
        rows = bm // 2 if gluon == 1 else bm

        def desc(r, c):
            return f"tensordesc<bf16[{r},{c}],{gl.NVMMASharedLayout.get_default_for([r, c], gl.bfloat16)!r}>"
        sig = {"a_desc": desc(bm, bk), "b_desc": desc(bn, bk), "c_desc": desc(rows, bn), "bias": "*bf16",
               "M": "i32", "N": "i32", "K": "i32", "group_m": "i32"}
        consts = {"ACT": 1, "HAS_BIAS": True, "STAGES": stages, "CONSUMER_REGS": sm90.CONSUMER_REGS}
        sig.update({name: "constexpr" for name in consts})
        src = GluonASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        c = triton.compile(src, target=target, options={"num_warps": 4, "maxnreg": sm90.MAXNREG,
                                                        "enable_fp_fusion": True})
        sass = _sass(c.asm["cubin"])
        hgmma = len(re.findall(r"\bHGMMA\b", sass)) if sass else c.asm["ptx"].count("wgmma.mma_async")
        local = len(re.findall(r"\b(?:STL|LDL)\b", sass)) if sass else -1  # -1: no SASS to count in
        print(f"gluon {gluon} {bm}x{bn}x{bk} s{stages} hgmma={hgmma} local={local} shared={c.metadata.shared}")
        count += 1
    return count


def main(variant: Path, arch: str) -> int:
    mm = sys.modules[kernels.get_local_kernel(variant).__name__ + ".matmul"]
    target = GPUTarget("cuda", int(arch), 32) if arch.isdigit() else GPUTarget("hip", arch, 64)
    count = 0
    # the pointer kernel: bf16 plain with bias, gated with h saved
    for gated in (False, True):
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16", "y_ptr": "*bf16", "h_ptr": "*bf16",
               "M": "i32", "N": "i32", "K": "i32", "stride_am": "i64", "stride_ak": "i64", "stride_bk": "i64",
               "stride_bn": "i64", "stride_ym": "i64", "stride_hm": "i64"}
        consts = {"GATED": gated, "ACT": 1, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "UPCAST": False,
                  "FAST_MATH": arch.isdigit()}
        if gated:  # the launcher specializes integer arguments equal to 1 into constants: N == 1 must compile
            consts["N"] = 1
        c = _compile(mm._matmul_fwd_kernel, sig, consts, target, 4, 3)
        print(f"pointer gated={gated} hgmma={_sass_hgmma(c.asm['cubin']) if 'cubin' in c.asm else 'n/a'} "
              f"shared={c.metadata.shared}")
        count += 1
    # the GEMV kernel (few rows, CUDA cores): one token (M == 1 specialized), plain with bias and gated
    for gated, bn, bk in ((False, 4, 512), (True, 8, 256)):
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "bias_ptr": "*bf16", "y_ptr": "*bf16", "h_ptr": "*bf16",
               "N": "i32", "K": "i32", "stride_am": "i64", "stride_ak": "i64", "stride_bk": "i64",
               "stride_bn": "i64", "stride_ym": "i64", "stride_hm": "i64"}
        consts = {"M": 1, "GATED": gated, "ACT": 2, "BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "EVEN_K": not gated,
                  "stride_bk": 1, "FAST_MATH": arch.isdigit()}
        sig.pop("stride_bk")
        c = _compile(mm._gemv_kernel, sig, consts, target, 4, 1)
        print(f"gemv gated={gated} {bn}x{bk} shared={c.metadata.shared} regs={getattr(c.metadata, 'num_regs', '?')}")
        count += 1
    if arch.isdigit():
        # stream-K (persistent grid sharing k iterations; cut tiles summed through an fp32 workspace)
        for bm, bn, bk, warps, stages, sub, gated in ((128, 256, 64, 8, 4, True, False), (128, 128, 64, 8, 3, False, True)):
            sig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                   "bias_ptr": "*bf16", "y_desc": f"tensordesc<bf16[{bm}, {bn // 2 if sub else bn}]>",
                   "ws_ptr": "*fp32", "cnt_ptr": "*i32",
                   "M": "i32", "N": "i32", "K": "i32", "stride_hm": "i32", "NUM_PROGS": "i32"}
            consts = {"GATED": gated, "ACT": 1, "B_NK": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                      "GROUP_M": 8, "EPILOGUE_SUBTILE": sub, "UPCAST": False, "h_ptr": None,
                      "FAST_MATH": True}
            c = _compile(mm._matmul_streamk_kernel, sig, consts, target, warps, stages)
            print(f"streamk {bm}x{bn}x{bk} w{warps} s{stages} subtile={sub} gated={gated} "
                  f"hgmma={_sass_hgmma(c.asm['cubin'])} wgmma_ptx={c.asm['ptx'].count('wgmma.mma_async')} "
                  f"shared={c.metadata.shared}")
            count += 1
        # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, warp_specialize, subtile, split_k, gated, b as W.T, SUB_N); the
        # last two: 192-wide tiles as three 64-column accumulators (persistent 128 x 192, split-K 64 x 192)
        variants = [(128, 256, 64, 8, 3, False, True, 1, False, True, 1),
                    (128, 256, 64, 8, 3, True, True, 1, False, True, 1),
                    (128, 128, 64, 8, 4, False, False, 1, True, False, 1),
                    (16, 64, 256, 4, 4, False, False, 4, False, True, 1),
                    (128, 64, 64, 8, 4, False, False, 1, False, True, 3),
                    (64, 64, 64, 4, 4, False, False, 2, False, True, 3)]
        for bm, bn, bk, warps, stages, ws, sub, split, gated, b_nk, sub_n in variants:
            b_block = f"[{bn}, {bk}]" if b_nk else f"[{bk}, {bn}]"
            sig = {"a_desc": f"tensordesc<bf16[{bm}, {bk}]>", "b_desc": f"tensordesc<bf16{b_block}>",
                   "bias_ptr": "*bf16", "y_desc": f"tensordesc<bf16[{bm}, {bn // 2 if sub else bn}]>",
                   "M": "i32", "N": "i32", "K": "i32", "stride_hm": "i32", "NUM_PROGS": "i32"}
            consts = {"GATED": gated, "ACT": 1, "B_NK": b_nk, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                      "GROUP_M": 8, "WARP_SPECIALIZE": ws, "FLATTEN": not ws and split == 1,
                      "EPILOGUE_SUBTILE": sub, "SPLIT_K": split, "UPCAST": False, "h_ptr": None,
                      "FAST_MATH": True, "SUB_N": sub_n}
            if split > 1:  # one token (M == 1, specialized to a constant by the launcher) through split-K
                sig.update({"ws_ptr": "*fp32", "cnt_ptr": "*i32"})
                consts["M"] = 1
            else:
                consts.update({"ws_ptr": None, "cnt_ptr": None})
            c = _compile(mm._matmul_tma_kernel, sig, consts, target, warps, stages)
            print(f"tma {bm}x{sub_n * bn}x{bk} w{warps} s{stages} ws={ws} subtile={sub} split_k={split} sub_n={sub_n} "
                  f"gated={gated} b_nk={b_nk} hgmma={_sass_hgmma(c.asm['cubin'])} wgmma_ptx={c.asm['ptx'].count('wgmma.mma_async')} "
                  f"shared={c.metadata.shared}")
            count += 1
        count += _gluon(sys.modules[kernels.get_local_kernel(variant).__name__ + ".matmul_sm90"], target)
    print("COMPILED", count)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
