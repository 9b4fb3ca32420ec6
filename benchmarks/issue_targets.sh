#!/bin/bash
# One device call (run's carry: .whl and .gpu; ~9 minutes on an H200) measuring the rows of the open issues'
# targets, most wanted first, each under what is left of TOTAL seconds (default 570):
#   1. issue 7: e2e greedy decode, batch 1 twice and batch 64 once (SmolLM2 and Llama-3-8B shapes);
#   2. issue 5: triton-matmul's fused epilogues (bias+GELU, GEGLU) and square GEMMs against cuBLAS
#      (benchmarks/matmul_sweep.py without the 49-shape sweep);
#   3. issue 4: triton-softmax's full sweep (softmax N = 1024 ... 262144, log_softmax, fwd+bwd, cross-entropy);
#   4. issue 6: triton-attention's full sweep; 5. issue 7: triton-norms' full sweep.
# Wheels as benchmarks/cuda_tests.sh says (.whl, .gpu/whl, .gpu/tf). Results under $OUT (JSON, Markdown, PNG).
# SKIP="matmul-fused softmax" leaves those steps out. Everything comes back as $OUT/issue_targets.tgz.
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .gpu/whl/*.whl .gpu/tf/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee $OUT/gpu.txt
left() { echo $(( ${TOTAL:-570} - ($(date +%s) - T0) )); }
step() {  # step NAME SECONDS COMMAND...: runs COMMAND under min(SECONDS, what is left - 5) when 30 s or more are left
  local name=$1 want=$2; shift 2; local t=$(( $(left) - 5 )); [ $t -gt $want ] && t=$want
  case " ${SKIP:-} " in *" $name "*) echo "skipped $name: in SKIP"; return;; esac
  if [ $t -lt 30 ]; then echo "skipped $name: $(left) s left"; return; fi
  echo "== $name (up to $t s)"; timeout $t "$@" 2>&1 | grep -v "trust check" | tail -${TAIL:-25}
}
# a command, not a shell function: timeout runs programs only (session 59's first call lost five steps to that)
bench="python3 -m triton_collection.cli bench --no-progress --out $OUT/bench"
mkdir -p $OUT/bench $OUT/mm
step e2e-1 120 $bench --e2e smollm2-135m llama3-8b --batch 1 64 --name e2e_run1
step e2e-2 90 $bench --e2e smollm2-135m llama3-8b --batch 1 --name e2e_run2
step matmul-fused 170 python3 benchmarks/matmul_sweep.py --out $OUT/mm --tag matmul_fused --skip checks,sass,sweep \
  --budget-s 140
step softmax 150 $bench softmax --shapes full --name softmax_full
step attention 150 $bench attention --shapes full --name attention_full
step norms 150 $bench norms --shapes full --name norms_full
echo "all $(( $(date +%s) - T0 )) s"
# run hands back at most 8 files per call (session 59 lost the softmax and norms results to that): one archive
(cd $OUT && tar czf issue_targets.tgz gpu.txt bench mm && rm -rf gpu.txt bench mm)
