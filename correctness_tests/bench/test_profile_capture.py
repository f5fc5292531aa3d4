"""gpuengine/bench/profile: the per-step medians of a side (capture.summarise), the profiler's cycles kept apart
(record_replays, with CPU events standing in for the device's), the device-event filter, every workload's engine
and reference runners built and run at smoke size, and a session's order and its unavailable references."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuengine.bench.profile import capture, session
from gpuengine.bench.profile.capture import DeviceEvent, ProfileError, device_events, record_replays, summarise
from gpuengine.bench.profile.record import ENGINE, FAILED, UNAVAILABLE, ProfileCase
from gpuengine.bench.profile.workloads import get_workload
from gpuengine.workloads.registry import ENTRIES, WORKLOADS

torch = pytest.importorskip("torch", reason="the profiler is torch's")


def test_summarise_takes_per_step_medians_over_replays():
    # Three replays of two steps: GEMM 10, 12, 40 us per replay (one outlier), a gather in two replays only.
    replays = [[DeviceEvent("nvjet_tst_128x256", 0, 10), DeviceEvent("gather", 10, 14), DeviceEvent("adam", 20, 22)],
               [DeviceEvent("nvjet_tst_128x256", 100, 106), DeviceEvent("nvjet_tst_128x256", 106, 112),
                DeviceEvent("adam", 115, 117)],
               [DeviceEvent("nvjet_tst_128x256", 200, 240), DeviceEvent("gather", 240, 244),
                DeviceEvent("adam", 250, 252)]]
    side = summarise(replays, steps=2)
    kernels = {k["name"]: k for k in side["kernels"]}
    assert kernels["nvjet_tst_128x256"] == {"name": "nvjet_tst_128x256", "family": "gemm", "us": 6.0, "count": 0.5,
                                            "idle_before_us": 0.0}   # launched 1, 2, 1 times: no launch_us
    assert kernels["gather"]["us"] == 2.0 and kernels["gather"]["count"] == 0.5   # median of 4, 0, 4 us over 2 steps
    assert side["families"] == {"gemm": 6.0, "data": 2.0, "optimizer": 1.0}
    assert side["replay_step_us"] == [11.0, 8.5, 26.0] and side["step_us"] == 11.0
    assert side["kernel_us"] == 9.0 and side["gaps_us"] == 2.0
    assert [k["name"] for k in side["kernels"]] == ["nvjet_tst_128x256", "gather", "adam"]   # costliest first
    # the device waited 6, 3 and 6 us before adam's launch, each replay: a median of 6 over 2 steps
    assert kernels["adam"]["idle_before_us"] == 3.0 and side["idle_before"] == {"optimizer": 3.0}


def test_idle_before_a_kernel_is_measured_from_the_latest_end_before_it():
    # Two streams: a long GEMM from 0 to 20 overlaps a copy (2-4); the memset starts at 25, 5 us after the GEMM's end,
    # not 21 us after the copy's. The first event of a replay waits on nothing.
    replays = [[DeviceEvent("nvjet_tst_128x256", 0, 20), DeviceEvent("gather", 2, 4),
                DeviceEvent("Memset (Device)", 25, 26)]]
    side = summarise(replays, steps=1)
    kernels = {k["name"]: k for k in side["kernels"]}
    assert [kernels[n]["idle_before_us"] for n in ("nvjet_tst_128x256", "gather", "Memset (Device)")] == [0, 0, 5]
    assert side["gaps_us"] == 26 - 23 and sum(side["idle_before"].values()) == 5   # gaps: net of the 2 us overlap


def test_a_replay_without_events_is_an_error_not_a_zero_profile():
    with pytest.raises(ProfileError, match="1 of 2 replays recorded no kernel"):
        summarise([[DeviceEvent("adam", 0, 1)], []], steps=1)
    with pytest.raises(ProfileError, match="all of 0 replays"):
        summarise([], steps=1)


def test_only_kernels_copies_and_memsets_on_a_cuda_device_count():
    from torch.autograd import DeviceType

    def event(name, device, kind, start=0.0, end=1.0):
        return SimpleNamespace(name=name, trace_name=name, device_type=device, activity_type=kind,
                               time_range=SimpleNamespace(start=start, end=end))
    events = [event("nvjet", DeviceType.CUDA, "kernel", 1, 3), event("Memcpy DtoD", DeviceType.CUDA, "gpu_memcpy"),
              event("Memset (Device)", DeviceType.CUDA, "gpu_memset"),
              event("forward_pass", DeviceType.CUDA, "gpu_user_annotation"),   # spans kernels: double counting
              event("aten::mm", DeviceType.CPU, "cpu_op"), event("cudaGraphLaunch", DeviceType.CPU, "cuda_runtime")]
    kept = device_events(events)
    assert [e.name for e in kept] == ["nvjet", "Memcpy DtoD", "Memset (Device)"]
    assert kept[0] == DeviceEvent("nvjet", 1.0, 3.0)


def test_each_replay_gets_its_own_cycle_of_events():
    from torch.profiler import ProfilerActivity
    a = torch.ones(8, 8)
    calls = []

    def run_once():   # call k multiplies k times: each cycle's count says which call it recorded
        calls.append(1)
        for _ in range(len(calls)):
            torch.mm(a, a)
    replays = record_replays(run_once, 3, [ProfilerActivity.CPU], keep=lambda e: e.name == "aten::mm")
    assert len(calls) == 6                                  # a warm-up call before each recorded one
    assert [len(events) for events in replays] == [2, 4, 6]


class Stub:
    """A built side: its name and the weights a reference would start from (profile_runner is stubbed)."""

    def __init__(self, name):
        self.name = name

    def state_dict(self):
        return {"w": self.name}

    def buffers_dict(self):
        return None


def test_a_session_profiles_the_engine_first_and_records_references_it_cannot_run(monkeypatch):
    from gpuengine.reference.torch_common import ReferenceUnavailable
    built, profiled = [], []

    class Workload:
        name = "mlp"

        def engine_runner(self, case, device, smoke):
            built.append(ENGINE)
            return Stub(ENGINE)

        def reference_runner(self, mode, case, weights, buffers, device, smoke):
            built.append((mode, weights))
            if mode == "torch_graph":
                return Stub(mode)
            if mode == "no_torchvision":
                raise ReferenceUnavailable("torchvision is not installed")
            raise RuntimeError("compile failed")

    def profile_runner(runner, replays, steps, activities, keep):
        profiled.append((runner.name, replays, steps))
        return {"step_us": 1.0}
    monkeypatch.setattr(session, "profile_runner", profile_runner)
    case = ProfileCase("mlp", "tf32", 8, 4)
    runners = session.measure(case, Workload(), ["torch_graph", "no_torchvision", "broken"], 3, log=lambda line: None,
                            device="cpu")
    assert list(runners) == [ENGINE, "torch_graph", "no_torchvision", "broken"]
    assert built[1:] == [(m, {"w": ENGINE}) for m in ("torch_graph", "no_torchvision", "broken")]
    assert profiled == [(ENGINE, 3, 4), ("torch_graph", 3, 4)]
    assert runners["no_torchvision"] == {UNAVAILABLE: "torchvision is not installed", FAILED: False}
    assert runners["broken"] == {UNAVAILABLE: "RuntimeError: compile failed", FAILED: True}


def test_profile_runner_prepares_warms_then_profiles(monkeypatch):
    steps = []

    class Runner:
        def prepare(self):
            steps.append("prepare")

        def run_round(self):
            steps.append("round")

        def synchronize(self):
            steps.append("sync")
    monkeypatch.setattr(capture, "record_replays",
                        lambda run_once, replays, activities, keep: [run_once() or [DeviceEvent("adam", 0, 2)]])
    side = capture.profile_runner(Runner(), replays=1, steps=2)
    burst = ["sync", *["round"] * capture.BURST_ROUNDS, "sync"]
    assert steps == ["prepare", "round", "sync", *burst * capture.BURSTS, "round", "sync"]
    assert side["step_us"] == 1.0 and side["timed_step_us"] >= 0


def test_the_unprofiled_step_is_the_median_burst_per_step():
    class Runner:
        def run_round(self):
            pass

        def synchronize(self):
            pass
    ticks = iter([0.0, 0.004, 1.0, 1.002, 2.0, 2.1])   # bursts of 4 ms, 2 ms and 100 ms
    us = capture.unprofiled_step_us(Runner(), steps=2, bursts=3, rounds=10, clock=lambda: next(ticks))
    assert us == 200.0   # the 4 ms burst: 20 steps of 200 us


@pytest.mark.parametrize("workload", [*WORKLOADS, *(f"{entry.name}:{entry.members[0]}"
                                                    for entry in ENTRIES.values() if entry.members)])
def test_every_workload_builds_its_engine_and_reference_over_one_small_epoch(workload):
    entry = get_workload(workload)
    case = ProfileCase(entry.name, "fp32", entry.default_batch(smoke=True), cuda_graph=1)
    engine = entry.engine_runner(case, "cpu", smoke=True)
    reference = entry.reference_runner("torch_eager", case, engine.state_dict(), engine.buffers_dict(), "cpu",
                                       smoke=True)
    assert engine.parameter_count() == reference.parameter_count()
    for runner in (engine, reference):
        runner.prepare()
        runner.run_round()
        runner.synchronize()
        assert runner.samples_per_round == case.batch * case.steps_per_replay   # one epoch of the replay's steps


def test_each_launch_of_a_step_keeps_its_own_median_time():
    # Two replays of two steps, a kernel launched twice a step (a layer of 3 us, then one of 10 or so).
    replays = [[DeviceEvent("bn_forward", 0, 3), DeviceEvent("bn_forward", 5, 15), DeviceEvent("bn_forward", 20, 23),
                DeviceEvent("bn_forward", 25, 36), DeviceEvent("adam", 40, 41)],
               [DeviceEvent("bn_forward", 100, 104), DeviceEvent("bn_forward", 105, 114),
                DeviceEvent("bn_forward", 120, 123), DeviceEvent("bn_forward", 125, 135),
                DeviceEvent("adam", 140, 141)]]
    kernels = {k["name"]: k for k in summarise(replays, steps=2)["kernels"]}
    assert kernels["bn_forward"]["launch_us"] == [3.0, 10.0]   # medians of 3, 3, 4, 3 and of 10, 11, 9, 10
    assert "launch_us" not in kernels["adam"]                 # once a replay of two steps: no launch of its own
