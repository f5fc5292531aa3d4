"""Faults inside a perf session, tried for real: the session goes on, and the failure says what happened.

Each trial runs a pytest session of the repository's perf tests in a subprocess, with the fault plugin
(plugin.py) injecting the fault, and nothing stored (--benchmark-disable):
- a device out-of-memory in one test fails that test with the allocation's size and the device's memory,
  and the next test runs and passes (GPU only);
- a nan loss in the middle of the timed rounds fails the test naming the step (both tiers).
Ctrl-C during an A/B session is correctness_tests/gate/test_ab_smoke.py's (it runs on a GPU too).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from correctness_tests.inner_sessions import outside_xdist
from gpuengine.runtime.backend import gpu_visible

REPO = Path(__file__).resolve().parents[2]
ON_GPU = gpu_visible()
# A small training case of each tier, its steps per round (perf_tests/test_mlp.py), and an inference case.
TRAIN = ("perf_tests/test_mlp.py::test_mlp_train[fp32-graph8-resident-bpe1]" if ON_GPU
         else "perf_tests/test_mlp.py::test_mlp_train[fp32-graph1-resident-bpe1]")
STEPS_PER_ROUND = 60 if ON_GPU else 4
INFER = "perf_tests/test_mlp.py::test_mlp_infer[fp32-resident-b8000]"


def session(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-rA",
                           "--benchmark-disable", "--against=none", "-p", "correctness_tests.faults.plugin"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=outside_xdist())


@pytest.mark.gpu   # root conftest.py skips it, saying why, where no GPU is visible
def test_an_out_of_memory_fails_its_test_with_the_sizes_and_the_next_test_runs():
    result = session(TRAIN, INFER, "--fault=oom:test_mlp_train")
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-2000:]
    assert re.search(r"FAILED .*test_mlp_train\[fp32-graph8-resident-bpe1\]", out), out[-3000:]
    # pytest's short summary cuts the message to the terminal's width: the failure's own section has it whole
    # CuPy's message, or torch's when other processes on the GPU took the margin and a torch allocation failed
    # first, or a CUDA call of torch's outside its allocator (AcceleratorError) that found no memory left
    assert re.search(r"device out of memory: (OutOfMemoryError: (Out of memory allocating [\d,]+ bytes|CUDA out of "
                     r"memory\. Tried to allocate [\d.]+ [KMG]iB)|AcceleratorError: CUDA error: out of memory)",
                     out), out[-3000:]
    assert re.search(r"free of [\d.]+ GiB on the device", out) and "the session goes on" in out
    assert re.search(r"PASSED .*test_mlp_infer\[fp32-resident-b8000\]", out), out[-3000:]


def test_a_loss_that_turns_nan_mid_run_fails_the_test_naming_the_step():
    # the warm-up epoch, the loss read before timing and the warm-up round come first: 2 rounds + 1 step
    step = 2 * STEPS_PER_ROUND + 1 + STEPS_PER_ROUND // 2
    result = session(TRAIN, f"--fault=nan:{step}")
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-2000:]
    assert re.search(rf"training diverged: the loss of step {step + 1} \(epoch \d+, batch \d+ of \d+\) is inf or "
                     "nan", out), out[-3000:]
