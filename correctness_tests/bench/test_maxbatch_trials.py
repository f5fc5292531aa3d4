"""The max-batch search's trial processes on the CPU: the subprocess plumbing, the real trial module, OOM vs error.

The plumbing is tested against small scripts that fit, run out of memory,
crash or hang; the real trial module runs on the NumPy backend (where nothing
is capped, so every batch fits); what counts as a device out-of-memory is
checked on stand-in exceptions of each library's type.
"""
from __future__ import annotations

import json
import sys
import time

import pytest

from gpuengine.bench.gpu_memory import is_out_of_memory
from gpuengine.bench.maxbatch import trial as trial_module
from gpuengine.bench.maxbatch.search import Status, SubprocessTrial, TrialResult, last_json_record
from gpuengine.bench.maxbatch.trial import TrialSpec, parse_args

# -- trial processes -------------------------------------------------------------------

def script_trial(code: str, timeout_s: float = 60) -> SubprocessTrial:
    return SubprocessTrial(TrialSpec(), timeout_s, command=lambda batch: [sys.executable, "-c", code, str(batch)])


def test_a_trial_reads_the_last_json_line_after_library_noise():
    code = ("import json, sys; print('{not json'); print('warming up'); "
            "print(json.dumps({'status': 'fits', 'peak_bytes': 123, 'measured_by': 'nvml_process', "
            "'error': None, 'plan': {'total': 100}}))")
    result = script_trial(code)(64)
    assert (result.status, result.peak_bytes, result.measured_by) == (Status.FITS, 123, "nvml_process")
    assert result.details["plan"] == {"total": 100} and result.seconds > 0


def test_an_oom_record_is_oom():
    code = "import json; print(json.dumps({'status': 'oom', 'error': 'OutOfMemoryError: 2 GiB'}))"
    result = script_trial(code)(64)
    assert result.status is Status.OOM and "2 GiB" in result.error


def test_a_crashed_trial_process_is_an_error_with_its_stderr():
    code = "import sys; print('CUDA error: an illegal memory access', file=sys.stderr); sys.exit(3)"
    result = script_trial(code)(64)
    assert result.status is Status.ERROR
    assert "exited with status 3" in result.error and "illegal memory access" in result.error


def test_a_trial_killed_by_a_signal_is_an_error_naming_it():
    result = script_trial("import os; os.abort()")(64)
    assert result.status is Status.ERROR and "SIGABRT" in result.error


def test_a_hung_trial_times_out_as_an_error():
    result = script_trial("import time; time.sleep(30)", timeout_s=0.5)(64)
    assert result.status is Status.ERROR and "timed out" in result.error


def test_helpers_left_behind_by_a_trial_neither_hang_the_search_nor_survive_it():
    """torch.compile leaves worker processes holding the trial's stdout; the trial must still end."""
    code = ("import json, subprocess, sys; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(json.dumps({'status': 'fits'}), flush=True)")
    start = time.perf_counter()
    result = script_trial(code, timeout_s=30)(64)
    assert result.status is Status.FITS and time.perf_counter() - start < 20


def test_an_unreadable_status_is_an_error():
    result = TrialResult.from_record(8, {"status": "maybe"})
    assert result.status is Status.ERROR and "unreadable" in result.error


def test_last_json_record_ignores_everything_else():
    assert last_json_record("a\n[1, 2]\n{\"status\": \"fits\"}\nbye\n") == {"status": "fits"}
    assert last_json_record("no json here") is None


# -- the real trial module on the NumPy backend ----------------------------------------

@pytest.mark.parametrize("mode", ["train", "infer"])
def test_real_engine_trial_process_fits_and_reports_its_plan(mode):
    spec = TrialSpec(mode=mode, shape="smoke", device="cpu", data="resident")
    result = SubprocessTrial(spec, timeout_s=120)(96)
    assert result.status is Status.FITS, result.error
    plan = result.details["plan"]
    assert plan["total"] == sum(v for k, v in plan.items() if k != "total") > 0
    # inputs (and targets) held once; TF32 training (the spec's default) also holds the inputs batch-innermost
    per_sample = 32 + 1 + 32 if mode == "train" else 32
    assert plan["batch"] == 96 * per_sample * 4


def test_real_torch_trial_process_fits():
    pytest.importorskip("torch", reason="PyTorch is not installed: no reference trial")
    result = SubprocessTrial(TrialSpec(engine="torch_eager", shape="smoke", device="cpu"), timeout_s=120)(64)
    assert result.status is Status.FITS, result.error


def test_a_failing_trial_prints_a_classified_line(monkeypatch):
    def unknown_failure(spec, batch):
        raise RuntimeError("cudnn frontend: graph is not supported")
    monkeypatch.setattr(trial_module, "run_trial", unknown_failure)
    record = trial_module.main(["--batch", "8"])
    assert record["status"] == "error" and "not supported" in record["error"] and record["batch"] == 8
    assert json.loads(json.dumps(record)) == record


def test_an_out_of_memory_failure_prints_oom(monkeypatch):
    class OutOfMemoryError(Exception):
        pass
    OutOfMemoryError.__module__ = "cupy.cuda.memory"

    def oom(spec, batch):
        raise OutOfMemoryError("Out of memory allocating 2,147,483,648 bytes")
    monkeypatch.setattr(trial_module, "run_trial", oom)
    assert trial_module.main(["--batch", "8"])["status"] == "oom"


def test_an_unknown_workload_is_an_error_not_a_crash():
    record = trial_module.main(["--workload", "nope", "--device", "cpu", "--batch", "4"])
    assert record["status"] == "error" and "unknown workload" in record["error"]


def test_trial_spec_round_trips_through_its_command_line():
    spec = TrialSpec("mlp", "infer", "torch_graph", "bf16", None, 1, "streamed", "smoke", "cpu")
    assert parse_args(spec.to_argv(777)) == (spec, 777)


# -- what counts as out of memory ------------------------------------------------------

def fake_exception(module: str, name: str, message: str = "", base=Exception):
    cls = type(name, (base,), {})
    cls.__module__ = module
    return cls(message)


@pytest.mark.parametrize("exc,expected", [
    (fake_exception("cupy.cuda.memory", "OutOfMemoryError", "Out of memory allocating 512 bytes"), True),
    # CuPy's real class derives from the host MemoryError (seen on an H200 run): still a device OOM.
    (fake_exception("cupy.cuda.memory", "OutOfMemoryError", "Out of memory allocating 4,194,304,000 bytes",
                    MemoryError), True),
    (fake_exception("torch", "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("cuBLAS error: CUBLAS_STATUS_ALLOC_FAILED"), True),
    (fake_exception("cuda.core", "CUDAError", "CUDA_ERROR_OUT_OF_MEMORY: out of memory"), True),
    (MemoryError("Unable to allocate 2.79 GiB for an array"), False),     # host RAM, not the device
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("batch size must be >= 1"), False),
])
def test_what_counts_as_a_device_oom(exc, expected):
    assert is_out_of_memory(exc) is expected


def test_a_wrapped_oom_is_still_an_oom():
    try:
        try:
            raise fake_exception("torch", "OutOfMemoryError", "CUDA out of memory")
        except Exception as inner:
            raise RuntimeError("BackendCompilerFailed: inductor raised") from inner
    except RuntimeError as outer:
        assert is_out_of_memory(outer)
