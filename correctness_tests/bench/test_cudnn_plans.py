"""Kept cuDNN plan choices: the engine builds a preset plan alone, records what it autotunes, and the gate's
file of choices round-trips, refuses corrupt content by name, and is set aside on another stack (another lock
included).

The engine side runs against a stand-in of the cuDNN frontend's graph object (the real one needs a GPU):
it has plans named by index, some of which fail to build or repeat a name, and counts what was built; the
plans' timings come from a stand-in device (correctness_tests/ops/stand_in_device.py).
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.bench import cudnn_plans, stack_lock
from gpuengine.bench.json_files import JsonFileError
from gpuengine.ops import autotune, cudnn as cudnn_graphs

from ..ops.stand_in_device import StandInDevice

STACK = {"cudnn": "91900", "cudnn_frontend": "1.22.1", "gpu": "NVIDIA H100 80GB HBM3"}
KEY = ("conv_fprop", "tf32", None, ("x", "spec"))


class StandInGraph:
    """The parts of cudnn.pygraph that CudnnGraph calls: plans 'eng0'..'eng11' and 'eng3' again (the FALLBACK
    heuristic repeating one of A's), 'eng1' fails to build, 'eng6' on are compiled at run time."""

    def __init__(self, **_):
        self.built = []

    def validate(self): pass
    def build_operation_graph(self): pass
    def create_execution_plans(self, modes): pass
    def deselect_numeric_notes(self, notes): pass
    def check_support(self): pass
    def get_execution_plan_count(self): return 13
    def get_plan_name_at_index(self, i): return f"eng{i}" if i < 12 else "eng3"
    def get_workspace_size_plan_at_index(self, i): return 1024 * i
    def get_behavior_notes_for_plan_at_index(self, i): return ["rtc"] if 6 <= i < 12 else []

    def build_plan_at_index(self, i):
        if i == 1:
            raise RuntimeError("this engine does not build here")
        self.built.append(i)


@pytest.fixture
def stand_in_cudnn(monkeypatch):
    data_type = SimpleNamespace(FLOAT="float", BFLOAT16="bf16")
    fake = SimpleNamespace(pygraph=StandInGraph, data_type=data_type, heur_mode=SimpleNamespace(A=0, FALLBACK=1),
                           numerical_note=SimpleNamespace(NONDETERMINISTIC=0, DOWN_CONVERT_INPUTS=1, TENSOR_CORE=2),
                           behavior_note=SimpleNamespace(RUNTIME_COMPILATION="rtc"))
    monkeypatch.setattr(cudnn_graphs, "_cudnn", lambda: fake)
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    # every one of the stand-in's 6 runtime-compiled plans is built: the cap has a test of its own
    monkeypatch.setattr(cudnn_graphs, "RUNTIME_COMPILED_CANDIDATES", 8)


def build(key=KEY):
    return cudnn_graphs.CudnnGraph(key, handle=0, io_dtype=np.float32, precision="tf32", define=lambda g: {})


def test_without_a_preset_every_candidate_that_builds_is_kept_once(stand_in_cudnn):
    graph = build()
    assert graph.plans == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]   # not 1 (fails to build), not 12 (eng3 again)
    assert not graph.preset and graph.plan is None and graph.plan_names[11] == "eng11"
    assert graph.runtime_compiled == {6, 7, 8, 9, 10, 11} and set(graph.build_ms) == {0, 1, *graph.plans}


def test_only_the_first_runtime_compiled_candidates_are_built(stand_in_cudnn, monkeypatch):
    monkeypatch.setattr(cudnn_graphs, "RUNTIME_COMPILED_CANDIDATES", 2)
    assert build().plans == [0, 2, 3, 4, 5, 6, 7]   # every precompiled one, eng6 and eng7 of the compiled ones


def test_a_preset_plan_is_built_alone_and_a_stale_one_falls_back_to_autotuning(stand_in_cudnn):
    autotune.use_plan_choices({autotune.key_text(KEY): "eng5"})
    graph = build()
    assert graph.plans == [5] and graph.graph.built == [5] and graph.preset
    assert graph.workspace_bytes == {5: 5 * 1024}
    for stale in ("eng1", "eng-gone"):   # fails to build here / no longer offered by this cuDNN
        autotune.use_plan_choices({autotune.key_text(KEY): stale})
        graph = build()
        assert not graph.preset and len(graph.plans) == 11


PLAN_MS = {0: 0.30, 2: 0.10, 3: 0.20, 4: 0.5, 5: 0.5, 6: 0.5, 7: 0.5, 8: 0.5, 9: 0.5, 10: 0.102, 11: 0.5}


def test_autotuning_records_its_choice_unless_it_is_the_preset(stand_in_cudnn, monkeypatch):
    choices = autotune.use_plan_choices({autotune.key_text(("other",)): "eng3"})
    graph = build()
    device = StandInDevice(PLAN_MS)   # eng2 is clearly the fastest; eng10, later, is within 2% of it
    stand_in_runtime(graph, device, monkeypatch).autotune(graph, {})
    assert graph.plan == 2 and set(graph.timings) == {2, 3, 10}   # the rest estimated over 2x eng2's time
    assert choices.tuned == {autotune.key_text(KEY): {"plan": "eng2", "ms": 0.1}}
    assert device.eager_runs == {plan: 1 for plan in graph.plans}   # each run once to surface failures, no more
    choices = autotune.use_plan_choices({autotune.key_text(KEY): "eng2"})
    graph = build()
    device = StandInDevice(PLAN_MS)
    stand_in_runtime(graph, device, monkeypatch).autotune(graph, {})
    assert graph.plans == [2] and graph.plan == 2 and choices.tuned == {}   # the preset: nothing timed or new
    assert device.replays == {}


def test_a_plan_close_to_the_fastest_loses_to_an_earlier_one(stand_in_cudnn, monkeypatch):
    autotune.use_plan_choices({})
    graph = build()
    stand_in_runtime(graph, StandInDevice({**PLAN_MS, 0: 0.101}), monkeypatch).autotune(graph, {})
    assert graph.plan == 0   # 1% slower than eng2 in the timings: the heuristic's first stays


def stand_in_runtime(graph, device: StandInDevice, monkeypatch):
    """A CudnnRuntime whose plan executions run on `device`, each plan taking its set time."""
    monkeypatch.setattr(graph, "execute", lambda pointers, ws, plan, handle: device.run(plan))
    runtime = object.__new__(cudnn_graphs.CudnnRuntime)
    runtime.backend = SimpleNamespace(xp=device.xp)
    runtime.stream = device.stream
    runtime.workspace = SimpleNamespace(nbytes=1 << 30, data=SimpleNamespace(ptr=0))
    runtime.handle = 0
    runtime._last_tuned = float("inf")   # no clock warm-up
    return runtime


def test_the_plan_file_round_trips_and_merges_new_choices(tmp_path):
    path = tmp_path / cudnn_plans.PLAN_FILE
    empty = cudnn_plans.load(path, STACK)
    assert empty.plans == {} and empty.set_aside is None and not path.exists()
    assert empty.save({}) == 0 and not path.exists()   # nothing tuned: nothing written
    assert empty.save({"k1": {"plan": "eng2", "ms": 0.1}}) == 1
    again = cudnn_plans.load(path, STACK)
    assert again.presets() == {"k1": "eng2"}
    again.save({"k2": {"plan": "eng0", "ms": 0.2}, "k1": {"plan": "eng4", "ms": 0.05}})
    assert cudnn_plans.load(path, STACK).presets() == {"k1": "eng4", "k2": "eng0"}


def test_choices_made_on_another_stack_are_set_aside_saying_what_changed(tmp_path):
    path = tmp_path / cudnn_plans.PLAN_FILE
    cudnn_plans.load(path, STACK).save({"k1": {"plan": "eng2", "ms": 0.1}})
    newer = cudnn_plans.load(path, {**STACK, "cudnn": "92000"})
    assert newer.plans == {} and newer.set_aside.startswith("made on another stack (cudnn 91900 -> 92000)")
    newer.save({"k9": {"plan": "eng1", "ms": 0.3}})   # the new stack's choices replace the old ones
    assert cudnn_plans.load(path, {**STACK, "cudnn": "92000"}).presets() == {"k9": "eng1"}


def test_choices_kept_under_another_lock_are_set_aside_naming_the_lock_change(tmp_path):
    path = tmp_path / cudnn_plans.PLAN_FILE
    locked = {**STACK, "stack_lock": "cuda13 lock 1a2b3c4d5e6f"}
    cudnn_plans.load(path, locked).save({"k1": {"plan": "eng2", "ms": 0.1}})
    assert cudnn_plans.load(path, locked).presets() == {"k1": "eng2"}
    refreshed = {**STACK, "stack_lock": "cuda13 lock 0f0f0f0f0f0f"}
    moved = cudnn_plans.load(path, refreshed)
    assert moved.plans == {} and moved.set_aside.startswith(
        "made on another stack (lock: cuda13 lock 1a2b3c4d5e6f -> cuda13 lock 0f0f0f0f0f0f): every graph is autotuned")
    path.write_text(json.dumps({"format": 1, "stack": STACK, "plans": {"k1": {"plan": "eng2"}}}))   # before locks
    assert cudnn_plans.load(path, refreshed).set_aside.startswith(
        "made on another stack (lock: no lock -> cuda13 lock 0f0f0f0f0f0f)")


def test_the_plans_stack_names_the_lock_this_python_was_installed_from(monkeypatch):
    device = SimpleNamespace(id=0)
    runtime = SimpleNamespace(getDeviceProperties=lambda i: {"name": b"NVIDIA H100 80GB HBM3"})
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime,
                                                                                  Device=lambda: device)))
    monkeypatch.setitem(sys.modules, "cudnn", SimpleNamespace(backend_version=lambda: 91900, __version__="1.22.1"))
    assert cudnn_plans.current_stack() == {**STACK, "stack_lock": stack_lock.lock_identity(
        stack_lock.current_record())}


@pytest.mark.parametrize("text, message", [
    ('{"format": 1, "stack": {}, "plans": {', "not valid JSON at line 1"),
    ('{"format": 7, "stack": {}, "plans": {}}', "not a cuDNN plan file of format 1"),
    ('{"format": 1, "stack": [], "plans": {}}', "'stack' and 'plans' must be objects"),
    ('{"format": 1, "stack": {}, "plans": {"k": {"ms": 1}}}', "plans['k'] must be an object with a 'plan' name"),
])
def test_a_corrupt_plan_file_is_one_error_naming_it(tmp_path, text, message):
    path = tmp_path / cudnn_plans.PLAN_FILE
    path.write_text(text)
    with pytest.raises(JsonFileError, match=str(path).replace("\\", "\\\\")) as error:
        cudnn_plans.load(path, STACK)
    assert message in str(error.value)
