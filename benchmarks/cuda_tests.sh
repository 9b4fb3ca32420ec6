#!/bin/bash
# The CUDA half of the tests most sessions need, in one device call (`run`, carry .whl and .gpu), then an optional A/B.
#   bash benchmarks/cuda_tests.sh            # TEST_T (s, default 400) for the tests; FILES to override the list
#                                            # tests (not whole files) spread over the 14 processes: the whole list
#                                            # took 291 s on an H100 (session 55); DIST=loadfile for one process a file
#   AB_BASE=.gpu/base AB_CASES=cross_entropy,rms_norm TOTAL=500 bash benchmarks/cuda_tests.sh
# Wheels (the device has no network): `make device-wheels` (.whl), diffusers 0.42.1 into .gpu/whl, transformers
# 5.22.2 / tokenizers 0.23.3 / safetensors 0.8.0 (Python 3.12 manylinux wheels) into .gpu/tf; for
# tests/test_bench.py's `kernels.cli` import (kernels.verify needs cryptography and sigstore, which the GPU image
# lacks), sigstore 4.5.1 / cryptography 51.0.1 and their wheels the image lacks into .gpu/sig (pip download with
# deps for cp312 manylinux, minus certifi, charset-normalizer, idna, markdown-it-py, mdurl, pygments, requests, rich,
# typing-extensions, urllib3). Output under $OUT: gpu.txt, tests.log, junit.xml, ab/ab.jsonl.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .gpu/whl/*.whl .gpu/tf/*.whl $(ls .gpu/sig/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
  | tee -a $OUT/gpu.txt
F=${FILES:-"tests/test_softmax_cross_entropy.py tests/test_cross_entropy_torch_order.py tests/test_softmax.py
 tests/test_softmax_torch_order.py tests/test_norms_functional.py tests/test_norms_wide.py tests/test_torch_order.py
 tests/test_modulate.py tests/test_gated_residual.py tests/test_norms_layers.py tests/test_activations.py
 tests/test_activations_layers.py tests/test_matmul.py tests/test_matmul_layers.py tests/test_attention.py
 tests/test_attention_diffusers.py tests/test_transformers_shim.py tests/test_reliability_bad_inputs.py
 tests/test_reliability_ops.py"}
# -v: one line per test as it ends ("[gw3] [ 42%] FAILED tests/...::name"), so a run cut by the time limit still
# names its failures (session 56's -q run reached 100% with two F and lost the summary that names them)
TEST_DEVICE=cuda timeout ${TEST_T:-400} python3 -m pytest -v -p no:cacheprovider -rfE --tb=short --maxfail=40 -n 14 \
  --dist ${DIST:-load} -m "not slow" --junitxml $OUT/junit.xml $F > $OUT/tests.log 2>&1
echo "tests rc=$? after $(( $(date +%s) - T0 )) s"; grep -E "^(FAILED|ERROR)| (FAILED|ERROR) |passed|failed" \
  $OUT/tests.log | tail -40
if [ -n "${AB_BASE:-}" ]; then
  LEFT=$(( ${TOTAL:-500} - ($(date +%s) - T0) ))
  [ $LEFT -gt 60 ] && python3 benchmarks/ab_sweep.py --base $AB_BASE --out $OUT/ab --budget $(( LEFT - 30 )) \
    --rounds 3 --cases $AB_CASES 2>&1 | tail -30
fi
echo "total $(( $(date +%s) - T0 )) s"
