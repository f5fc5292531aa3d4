"""Faults for the GPU fault trials (test_faults.py): a pytest plugin loaded into a perf-test session.

    python -m pytest perf_tests/... -p correctness_tests.faults.plugin --fault=oom:NAME
        before the call of each test whose node id contains NAME, hold all but FAULT_MARGIN of the device's
        free memory (CuPy), so the test's own allocations fail; let it go when that test ends
    python -m pytest perf_tests/... -p correctness_tests.faults.plugin --fault=nan:STEP
        every engine trainer the suite builds makes its first weight nan at the end of step STEP (a kernel in
        the step, captured with it), so the loss of step STEP + 1 is nan

Test support only: the engine and the suite know nothing of it.
"""
from __future__ import annotations

import numpy as np
import pytest

FAULT_MARGIN = 16 * 1024 ** 2   # what the out-of-memory fault leaves free: less than any perf test needs
_held = []


def pytest_addoption(parser):
    parser.addoption("--fault", metavar="oom:NAME|nan:STEP", default=None, help="the fault to inject (trials only)")


def _fault(config) -> tuple[str, str] | None:
    raw = config.getoption("fault")
    if raw is None:
        return None
    kind, _, value = raw.partition(":")
    if kind not in ("oom", "nan") or not value or (kind == "nan" and not value.isdigit()):
        raise pytest.UsageError(f"--fault={raw!r}: use oom:NAME or nan:STEP")
    return kind, value


def pytest_configure(config):
    fault = _fault(config)
    if fault and fault[0] == "nan":
        _poison_trainers(int(fault[1]))


def poison(trainer, step: int):
    """A step hook: after step `step` (0-based; the counter then reads step + 1) the first weight becomes nan,
    eager or captured (test_trainer.py uses it directly)."""
    if not trainer.backend.is_gpu:
        def hook():
            if int(trainer.state.step[0]) == step + 1:
                trainer.params.master[0] = np.nan
        return hook
    import cupy
    kernel = cupy.RawKernel(r'''extern "C" __global__ void poison(const long long* step, long long at, float* w) {
        if (step[0] == at) w[0] = __int_as_float(0x7fc00000); }''', "poison")
    return lambda: kernel((1,), (1,), (trainer.state.step, np.int64(step + 1), trainer.params.master))


def _poison_trainers(step: int):
    from gpuengine.bench import runners

    built = runners.EngineTrainRunner.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.trainer.step_hook = poison(self.trainer, step)

    runners.EngineTrainRunner.__init__ = init


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    fault = _fault(item.config)
    if fault and fault[0] == "oom" and fault[1] in item.nodeid:
        import cupy
        free, _ = cupy.cuda.runtime.memGetInfo()
        _held.append(cupy.empty(max(0, free - FAULT_MARGIN), dtype=np.uint8))
    try:
        return (yield)
    finally:
        if _held:
            import cupy
            _held.clear()
            cupy.get_default_memory_pool().free_all_blocks()
