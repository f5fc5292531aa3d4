"""scripts/round_gaps.py on stand-ins: a round split into its graph launches (each replay's device time, the idle
time before it, the launch call's host time) and the plain launches put back after."""
from __future__ import annotations

from types import SimpleNamespace

from .script_module import load_script


def stand_ins():
    """A trainer whose replays take 100 us a step on a stand-in device clock, and a round of graph8, graph8,
    graph1 whose host leaves the device 7 us idle before each launch but the first."""
    clock = SimpleNamespace(us=0.0)

    class Event:
        def record(self, stream=None):
            self.us = clock.us

    def graph(steps):
        def launch():
            clock.us += 100.0 * steps
        return SimpleNamespace(launch=launch)
    trainer = SimpleNamespace(backend=SimpleNamespace(xp=SimpleNamespace(cuda=SimpleNamespace(Event=Event)),
                                                      stream=None),
                              graphs={8: graph(8), 1: graph(1)})

    def run_round():
        for k, steps in enumerate((8, 8, 1)):
            clock.us += 7.0 if k else 0.0
            trainer.graphs[steps].launch()
    return trainer, SimpleNamespace(synchronize=lambda: None, run_round=run_round)


def test_a_round_splits_into_replays_and_the_idle_time_before_each(monkeypatch):
    script = load_script("round_gaps")
    monkeypatch.setattr(script, "elapsed_us", lambda first, second: second.us - first.us)
    trainer, runner = stand_ins()
    plain = {n: g.launch for n, g in trainer.graphs.items()}
    events: list = []
    restore = script.instrument(trainer, events)
    split = script.split_round(runner, events, clock=lambda: 1980)
    assert [launch["steps"] for launch in split["launches"]] == [8, 8, 1]
    assert [launch["replay_us"] for launch in split["launches"]] == [800.0, 800.0, 100.0]
    assert [launch["idle_before_us"] for launch in split["launches"]] == [None, 7.0, 7.0]
    assert split["device_ms"] == 1.714 and all(launch["call_us"] >= 0 for launch in split["launches"])
    assert split["sm_mhz"] == 1980
    restore()
    assert {n: g.launch for n, g in trainer.graphs.items()} == plain


def test_the_summary_line_reads_per_step_medians(monkeypatch):
    script = load_script("round_gaps")
    launches = [{"steps": 8, "replay_us": 800.0, "idle_before_us": None, "call_us": 30.0},
                {"steps": 8, "replay_us": 800.0, "idle_before_us": 160.0, "call_us": 50.0}]
    record = {"epoch_steps": 16, "timing_cpu": 15, "single_before_torch_ms": [1.7], "single_ms": [1.8, 2.0, 1.9], "burst_step_us": 100.0, "reference_ms": [3.2],
              "reference_mhz": [1830], "split": [{"host_ms": 1.92, "sm_mhz": 1980, "device_ms": 1.76,
                                                  "launches": launches}]}
    line = script.summary(record)
    assert line.startswith("epoch  16 (core 15): ") and "single    118.8" in line and "burst    100.0" in line and "instrumented    120.0" in line
    assert "replays    100.0" in line and "idle between   10.0" in line and "launch call    40.0 us" in line
    assert "single before torch    106.2" in line and "SM 1980 MHz" in line and "torch_graph    200.0 (SM 1830 MHz)" in line
