"""Kept cuDNN plan choices: the engine builds a preset plan alone, records what it autotunes, and the gate's
file of choices round-trips, refuses corrupt content by name, and is set aside on another stack (another lock
included).

The engine side runs against a stand-in of the cuDNN frontend's graph object (the real one needs a GPU):
it has plans named by index, some of which fail to build, and counts what was built.
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

STACK = {"cudnn": "91900", "cudnn_frontend": "1.22.1", "gpu": "NVIDIA H100 80GB HBM3"}
KEY = ("conv_fprop", "tf32", None, ("x", "spec"))


class StandInGraph:
    """The parts of cudnn.pygraph that CudnnGraph calls: plans 'eng0'..'eng11', 'eng1' fails to build."""

    def __init__(self, **_):
        self.built = []

    def validate(self): pass
    def build_operation_graph(self): pass
    def create_execution_plans(self, modes): pass
    def deselect_numeric_notes(self, notes): pass
    def check_support(self): pass
    def get_execution_plan_count(self): return 12
    def get_plan_name_at_index(self, i): return f"eng{i}"
    def get_workspace_size_plan_at_index(self, i): return 1024 * i

    def build_plan_at_index(self, i):
        if i == 1:
            raise RuntimeError("this engine does not build here")
        self.built.append(i)


@pytest.fixture
def stand_in_cudnn(monkeypatch):
    data_type = SimpleNamespace(FLOAT="float", BFLOAT16="bf16")
    fake = SimpleNamespace(pygraph=StandInGraph, data_type=data_type, heur_mode=SimpleNamespace(A=0, FALLBACK=1),
                           numerical_note=SimpleNamespace(NONDETERMINISTIC=0, DOWN_CONVERT_INPUTS=1, TENSOR_CORE=2))
    monkeypatch.setattr(cudnn_graphs, "_cudnn", lambda: fake)
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())


def build(key=KEY):
    return cudnn_graphs.CudnnGraph(key, handle=0, io_dtype=np.float32, precision="tf32", define=lambda g: {})


def test_without_a_preset_every_candidate_that_builds_is_kept_up_to_the_limit(stand_in_cudnn):
    graph = build()
    assert graph.plans == [0, 2, 3, 4, 5, 6, 7, 8] and len(graph.plans) == cudnn_graphs.MAX_PLANS
    assert not graph.preset and graph.plan is None and graph.plan_names[8] == "eng8"


def test_a_preset_plan_is_built_alone_and_a_stale_one_falls_back_to_autotuning(stand_in_cudnn):
    autotune.use_plan_choices({autotune.key_text(KEY): "eng5"})
    graph = build()
    assert graph.plans == [5] and graph.graph.built == [5] and graph.preset
    assert graph.workspace_bytes == {5: 5 * 1024}
    for stale in ("eng1", "eng-gone"):   # fails to build here / no longer offered by this cuDNN
        autotune.use_plan_choices({autotune.key_text(KEY): stale})
        graph = build()
        assert not graph.preset and len(graph.plans) == cudnn_graphs.MAX_PLANS


def test_autotuning_records_its_choice_unless_it_is_the_preset(stand_in_cudnn, monkeypatch):
    choices = autotune.use_plan_choices({autotune.key_text(("other",)): "eng3"})
    graph = build()
    timing = {0: 0.30, 2: 0.10, 3: 0.20, 4: 0.5, 5: 0.5, 6: 0.5, 7: 0.5, 8: 0.5}   # ms per plan: eng2 is fastest
    runtime = stand_in_runtime(graph, timing, monkeypatch)
    runtime.autotune(graph, {})
    assert graph.plan == 2
    assert choices.tuned == {autotune.key_text(KEY): {"plan": "eng2", "ms": 0.1}}
    choices = autotune.use_plan_choices({autotune.key_text(KEY): "eng2"})
    graph = build()
    stand_in_runtime(graph, timing, monkeypatch).autotune(graph, {})
    assert graph.plans == [2] and graph.plan == 2 and choices.tuned == {}   # timed once, nothing new to keep


def stand_in_runtime(graph, timing: dict, monkeypatch):
    """A CudnnRuntime whose events report `timing[plan]` ms per execution of the last plan run."""
    last = {}
    monkeypatch.setattr(graph, "execute", lambda pointers, ws, plan, handle: last.update(plan=plan))

    class Event:
        def record(self, stream): pass
        def synchronize(self): pass

    cuda = SimpleNamespace(Event=Event, get_elapsed_time=lambda a, b: timing[last["plan"]] * autotune.TIMING_REPEATS)
    runtime = object.__new__(cudnn_graphs.CudnnRuntime)
    runtime.backend = SimpleNamespace(xp=SimpleNamespace(cuda=cuda))
    runtime.stream = SimpleNamespace(synchronize=lambda: None)
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
