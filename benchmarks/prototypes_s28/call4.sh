python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 150 python3 .gpu/s28/fused_tma_run2.py 2>&1 | grep -v Warning | tee $OUT/fused_tma5.txt
