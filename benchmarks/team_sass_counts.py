"""SASS of the team forwards for sm_90 on a machine without a GPU (issues 4, 7): registers, spills, instructions.

    PYTHONPATH=src python benchmarks/team_sass_counts.py BUILD_DIR [--fp-fusion]

``BUILD_DIR``: ``triton-collection build --out BUILD_DIR`` (triton-norms and triton-softmax at least). Each kernel
is compiled as a 1-warp tier launches it for bf16 rows of 65536 (2048 elements per program, 168 registers,
pointers and N divisible by 16 as the launcher specialises them), then ptxas -v and cuobjdump from Triton's own
NVIDIA backend. Session 29 (Triton 3.6): rms_norm 952 instructions, layer_norm 1312 (20.5 per element against 15:
the extra subtractions, the masked deviations' FSELs, the bias' conversions), 888 / 1184 with ``--fp-fusion``.
Session 30: softmax FTZ 0 / 1 and cross-entropy FTZ 0 / 1 (the exp's ``ex2.approx`` with or without ``.ftz``): 1552 /
1360 and 1800 / 1600; the layer_norm backward's 4 KiB tier (4 warps, 16 elements per thread): 760, 712 contracted.
Session 31 (Triton 3.9): that backward on one pair word (both sums in one reduction) 736, on two words 760.
Session 33 (Triton 3.9): softmax FTZ 1 1064, and with EVEN (the chunks tile the row: no masks, no -inf padding) 928.
"""
import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import kernels
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--fp-fusion", action="store_true", help="contract a * b + c (the tiers' fp_fusion)")
ap.add_argument("--only", default="", help="compile only the cases whose name contains this")
args = ap.parse_args()


def module(package, name):
    return sys.modules[kernels.get_local_kernel(Path(args.build) / package / "build/torch-cuda").__name__ + name]


W = module("triton-norms", "._wide")
S = module("triton-softmax", ".softmax")
CE = module("triton-softmax", ".cross_entropy")
BIN = Path(triton.__file__).parent / "backends/nvidia/bin"
FP32_PTRS = ("rstd_ptr", "mean_ptr", "loss_ptr", "lse_ptr", "applied_ptr", "dw_ptr", "db_ptr")


def sig(k, consts):
    return {n: "constexpr" if n in consts else "*i64" if n in ("ws_ptr", "t_ptr", "count_ptr") else
            "*fp32" if n in FP32_PTRS else "*bf16" if n.endswith("_ptr") else
            "fp32" if n in ("eps", "weight_offset", "scale", "smoothing", "z_loss") else "i32" for n in k.arg_names}


NONE = dict(res_ptr=None, h_ptr=None, rstd_ptr=None, HOLD=0)
# R1 = R2 = 1: a 2-d launch, where Triton specialises those arguments (equal to 1) and the row address needs no division
SOFTMAX = dict(m_ptr=None, sxc=1, syc=1, R1=1, R2=1, CAUSAL=0, LOG=0, SCALED=0, ALONE=0, EVEN=0)
CE_NONE = dict(lse_ptr=None, count_ptr=None, sxc=1, sgc=1, R1=1, R2=1, SMOOTH=0)
NORMS, TEAMS = dict(maxnreg=168), dict(maxnreg=128)  # the tiers' register caps (the cross-entropy's: fp_fusion)
LN_BWD, LN_BWD_NONE = dict(maxnreg=128, num_warps=4), dict(dh_ptr=None, dres_ptr=None, stride_dy_col=1, PAIR_WORD=0)
RMS_BWD = dict(maxnreg=168, num_warps=4)
RMS_BWD_NONE = dict(dh_ptr=None, dres_ptr=None, db_ptr=None, stride_dy_col=1, CAST_DTYPE=None, BLOCK_N=4096)
CASES = {
    "rms_norm AFFINE 1": (W._rms_team_fwd_kernel, dict(NONE, b_ptr=None, CAST_DTYPE=None, AFFINE=1, DEPTH=1), NORMS),
    "rms_norm DEPTH 2": (W._rms_team_fwd_kernel, dict(NONE, b_ptr=None, CAST_DTYPE=None, AFFINE=1, DEPTH=2), NORMS),
    "rms_norm 8K HOLD": (W._rms_team_fwd_kernel, dict(NONE, b_ptr=None, CAST_DTYPE=None, AFFINE=2, HOLD=1, BLOCK_N=4096,
                                                      DEPTH=1),
                         dict(NORMS, num_warps=2)),
    "rms_norm 8K HOLD D2": (W._rms_team_fwd_kernel, dict(NONE, b_ptr=None, CAST_DTYPE=None, AFFINE=2, HOLD=1,
                                                         BLOCK_N=4096, DEPTH=2), dict(NORMS, num_warps=2)),
    "layer_norm pair word": (W._ln_team_fwd_kernel, dict(NONE, mean_ptr=None, AFFINE=0, EVEN=0, PAIR_WORD=1), NORMS),
    "layer_norm two words": (W._ln_team_fwd_kernel, dict(NONE, mean_ptr=None, AFFINE=0, EVEN=0, PAIR_WORD=0), NORMS),
    "layer_norm no bias": (W._ln_team_fwd_kernel, dict(NONE, mean_ptr=None, b_ptr=None, AFFINE=0, EVEN=0, PAIR_WORD=1),
                           NORMS),
    "softmax FTZ 0": (S._softmax_team_fwd_kernel, dict(SOFTMAX, FTZ=0), TEAMS),
    "softmax FTZ 1": (S._softmax_team_fwd_kernel, dict(SOFTMAX, FTZ=1), TEAMS),
    "softmax EVEN": (S._softmax_team_fwd_kernel, dict(SOFTMAX, FTZ=1, EVEN=1), TEAMS),
    "cross_entropy FTZ 0": (CE._cross_entropy_team_fwd_kernel, dict(CE_NONE, FTZ=0), dict(TEAMS, fp_fusion=1)),
    "cross_entropy FTZ 1": (CE._cross_entropy_team_fwd_kernel, dict(CE_NONE, FTZ=1), dict(TEAMS, fp_fusion=1)),
    # the layer_norm backward's 4 KiB / 4-warp teams (16 elements per thread): on two words (the last tier's teams
    # of more than 64) and on one pair word (the first tier's, up to 16: both sums in one reduction)
    "layer_norm bwd": (W._ln_team_bwd_kernel, LN_BWD_NONE, LN_BWD),
    "layer_norm bwd fused": (W._ln_team_bwd_kernel, LN_BWD_NONE, dict(LN_BWD, fp_fusion=1)),
    "layer_norm bwd pair word": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1), LN_BWD),
    # the team backwards with dy, x, w held in bf16 across the meeting (HOLD, session 45): the rms_norm tier (8 KiB,
    # 4 warps: 32 elements per thread, 168 registers) and the layer_norm 4 KiB tier, without and with it
    "rms_norm bwd 8K": (W._rms_team_bwd_kernel, dict(RMS_BWD_NONE, HOLD=0), RMS_BWD),
    "rms_norm bwd 8K HOLD": (W._rms_team_bwd_kernel, dict(RMS_BWD_NONE, HOLD=1), RMS_BWD),
    "rms_norm bwd 8K HOLD r128": (W._rms_team_bwd_kernel, dict(RMS_BWD_NONE, HOLD=1), dict(RMS_BWD, maxnreg=128)),
    "layer_norm bwd pair HOLD": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=1), LN_BWD),
    # the layer_norm backward's 8 KiB / 8-warp tier (rows of 64-256 KiB; 16 elements per thread), unheld and held
    "layer_norm bwd 8K w8": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=0, BLOCK_N=4096),
                             dict(LN_BWD, num_warps=8)),
    "layer_norm bwd 8K w8 HOLD": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=1, BLOCK_N=4096),
                                  dict(LN_BWD, num_warps=8)),
    "layer_norm bwd 8K w4 HOLD": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=1, BLOCK_N=4096),
                                  dict(LN_BWD, num_warps=4, maxnreg=168)),
    "layer_norm bwd 8K w4": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=0, BLOCK_N=4096),
                             dict(LN_BWD, num_warps=4, maxnreg=168)),
    "layer_norm bwd 8K w4 HOLD r255": (W._ln_team_bwd_kernel, dict(LN_BWD_NONE, PAIR_WORD=1, HOLD=1, BLOCK_N=4096),
                                       dict(LN_BWD, num_warps=4, maxnreg=255)),
}
CASES = {k: v for k, v in CASES.items() if args.only in k}
tmp = Path(tempfile.mkdtemp())
for name, (k, consts, tier) in CASES.items():
    consts = dict(dict(BLOCK_N=2048, TEAM_P2=32, PHASE=0), **consts)
    sg = sig(k, consts)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
             if sg[n] != "constexpr" and (sg[n].startswith("*") or re.fullmatch(r"s[a-z]+[0-2]", n)
                                          or n in ("N", "V", "stride_x_row", "stride_res_row", "stride_dy_row"))}
    src = ASTSource(k, sg, constexprs={(k.arg_names.index(m),): v for m, v in consts.items()}, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": tier.get("num_warps", 1), "maxnreg": tier["maxnreg"],
                                "enable_fp_fusion": bool(args.fp_fusion or tier.get("fp_fusion", False))})
    (tmp / "k.ptx").write_text(c.asm["ptx"])
    (tmp / "k.cubin").write_bytes(c.asm["cubin"])
    for ptxas in ("ptxas", "ptxas-blackwell"):  # Triton 3.9 emits a PTX version only its newer ptxas reads
        v = subprocess.run([str(BIN / ptxas), "-arch=sm_90a", "-v", "--maxrregcount", str(tier["maxnreg"]),
                            str(tmp / "k.ptx"), "-o", str(tmp / "o.cubin")], capture_output=True, text=True).stderr
        if "Unsupported .version" not in v:
            break
    sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", str(tmp / "k.cubin")], capture_output=True,
                          text=True).stdout
    ops = {}
    for line in sass.splitlines():
        if re.match(r"\s+/\*[0-9a-f]{4}\*/", line):
            words = line.split("*/")[1].strip().split()
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0].rstrip(";")
            ops[op] = ops.get(op, 0) + 1
    top = " ".join(f"{a}:{b}" for a, b in sorted(ops.items(), key=lambda kv: -kv[1])[:12])
    regs = " ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", v))
    print(f"{name:22s} {regs}; {sum(ops.values())} instructions: {top}")
