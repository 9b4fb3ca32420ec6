"""The GPU half of the test suite (``make gpu-test``), run as parallel pytest processes on one CUDA machine.

* ``gpu``: every test marked ``gpu`` (torch.compile inference + training, CUDA-graph replay on new data,
  streams, > 2^31 elements, GPU-only cases);
* ``catalog-<file>``: the bad-input catalog, opcheck of every op, the shared cases and two versions in one
  process (one per file), with CUDA tensors (``TEST_DEVICE=cuda``);
* ``layers-<group>``: the CPU suite's attention and diffusers-shim, norm-layer, torch-order, modulate and
  gated-residual, softmax and torch-order softmax / cross-entropy tests with CUDA tensors (bit-exactness of the layers and ops
  in bf16, which the interpreter cannot check);
* ``properties-<k>``: the hypothesis generators of ``tests/test_reliability_properties.py``, one process per
  seed ``k`` (``HYPOTHESIS_SEED=k``), each scaled by ``--scale``; their case counts are summed.

Triton's compile cache is shared, so the processes mostly wait on their own kernels' first compiles. Each
process writes JUnit XML into ``--out``; ``summary.md`` / ``summary.json`` there tally the outcomes and the
generated cases. Exit status: 0 only if every process passed.

Usage: ``python3 tests/run_gpu_half.py --out DIR [--procs 8] [--scale 0.25] [--timeout 1500]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
CATALOG_FILES = ["tests/test_reliability_bad_inputs.py", "tests/test_reliability_ops.py",
                 "tests/test_reliability_versions.py"]
# test files of the CPU suite whose tests also hold on a GPU (device-aware bounds), in three processes
LAYER_FILES = {
    "attention": ["tests/test_attention.py", "tests/test_attention_diffusers.py"],
    "norms": ["tests/test_norms_layers.py", "tests/test_torch_order.py", "tests/test_modulate.py",
              "tests/test_gated_residual.py"],
    "softmax": ["tests/test_softmax.py", "tests/test_softmax_torch_order.py", "tests/test_cross_entropy_torch_order.py"],
}


def _jobs(out: Path, procs: int, scale: float) -> dict:
    jobs = {
        "gpu": (PYTEST + ["-m", "gpu", "--junitxml", str(out / "junit_gpu.xml"), "tests"], {}),
    }
    for path in CATALOG_FILES:  # one process a file: together they took ~190 s on an H200 host, alone ~100 s
        name = "catalog-" + Path(path).stem.removeprefix("test_reliability_")
        jobs[name] = (PYTEST + ["-m", "not gpu", "--junitxml", str(out / f"junit_{name}.xml"), path], {})
    for group, files in LAYER_FILES.items():
        jobs["layers-" + group] = (PYTEST + ["-m", "not gpu and not slow", "--junitxml",
                                             str(out / f"junit_layers_{group}.xml"), *files], {})
    for k in range(procs):
        jobs[f"properties-{k}"] = (
            PYTEST + ["--junitxml", str(out / f"junit_properties_{k}.xml"), "tests/test_reliability_properties.py"],
            {"HYPOTHESIS_SEED": str(k), "HYPOTHESIS_SCALE": str(scale),
             "RELIABILITY_COUNTS": str(out / f"hypothesis_counts_{k}.json")})
    return jobs


def _tally(out: Path) -> tuple:
    tally, failed = {}, []
    for path in sorted(out.glob("junit_*.xml")):
        for tc in ET.parse(path).getroot().iter("testcase"):
            outcome = "passed"
            for child in tc:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                    failed.append(f"{path.name}: {tc.get('classname')}::{tc.get('name')}: "
                                  f"{(child.get('message') or '').splitlines()[0][:300] if child.get('message') else ''}")
                elif child.tag == "skipped":
                    outcome = "skipped"
            tally[outcome] = tally.get(outcome, 0) + 1
    cases, per_test = 0, {}
    for path in sorted(out.glob("hypothesis_counts_*.json")):
        counts = json.loads(path.read_text())
        cases += counts["total"]
        for name, n in counts["per_test"].items():
            per_test[name] = per_test.get(name, 0) + n
    return tally, failed, cases, per_test


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu-test-results"))
    p.add_argument("--procs", type=int, default=8, help="property-generator processes (one seed each)")
    p.add_argument("--scale", type=float, default=0.25, help="HYPOTHESIS_SCALE of each generator process")
    p.add_argument("--timeout", type=float, default=1500, help="seconds before every process still running is stopped")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TEST_DEVICE="cuda", PYTHONUNBUFFERED="1")
    start = time.time()
    running = {}
    for name, (cmd, extra) in _jobs(args.out, args.procs, args.scale).items():
        log = open(args.out / f"{name}.log", "w")
        running[name] = (subprocess.Popen(cmd, cwd=ROOT, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT), log)
    codes = {}
    while running:
        for name, (proc, log) in list(running.items()):
            if proc.poll() is not None or time.time() - start > args.timeout:
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait(30)
                codes[name] = proc.returncode
                log.close()
                del running[name]
                print(f"[{time.time() - start:6.0f} s] {name}: exit {codes[name]}", flush=True)
        time.sleep(1)
    tally, failed, cases, per_test = _tally(args.out)
    wall = time.time() - start
    summary = {"tally": tally, "exit_codes": codes, "generated_cases": cases, "per_test": per_test,
               "procs": args.procs, "scale": args.scale, "wall_s": round(wall, 1), "failed": failed}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"GPU half: {tally} in {wall:.0f} s; {cases} generated cases on the GPU "
             f"({args.procs} seeds x scale {args.scale}): {per_test}"] + [f"FAILED {f}" for f in failed]
    lines += [f"EXIT {name}: {code}" + (" (stopped at --timeout)" if code is not None and code < 0 else "")
              for name, code in codes.items() if code != 0]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
