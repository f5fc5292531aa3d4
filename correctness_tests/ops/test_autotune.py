"""Autotuning times kernels in captured replays and keeps the heuristic's order where timings cannot tell.

Runs on a stand-in device (stand_in_device.py): each way has a set time per execution, and only what a
replayed graph holds moves the device clock, as on a GPU.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from gpuengine.ops import autotune

from .stand_in_device import StandInDevice


def timings(**ms):
    return {name: autotune.Timing(value, 0.0, 1) for name, value in ms.items()}


def test_the_heuristic_first_stays_unless_another_is_clearly_faster():
    assert autotune.choose(["a", "b"], timings(a=1.00, b=0.99)) == "a"       # 1% apart: inside the margin
    assert autotune.choose(["a", "b"], timings(a=1.00, b=0.97)) == "b"       # 3%: clearly faster
    assert autotune.choose(["a", "b", "c"], timings(a=1.5, b=1.01, c=1.0)) == "b"   # the first close to the best


def test_the_margin_does_not_move_with_the_passes_spread():
    # the spread of five passes changes from process to process where the median does not
    noisy = {"a": autotune.Timing(1.00, 0.08, 8), "b": autotune.Timing(0.97, 0.05, 8)}
    steady = {"a": autotune.Timing(1.00, 0.002, 8), "b": autotune.Timing(0.97, 0.001, 8)}
    assert autotune.choose(["a", "b"], noisy) == autotune.choose(["a", "b"], steady) == "b"


def test_the_engine_is_chosen_first_then_its_knob_variants_at_their_wider_margin():
    # two variants of eng0 3% apart swap places from process to process: the heuristic's first variant stays
    assert autotune.choose(["eng0_k1=0", "eng0_k1=1", "eng7_k2=0"],
                           timings(**{"eng0_k1=0": 1.03, "eng0_k1=1": 1.00, "eng7_k2=0": 1.10})) == "eng0_k1=0"
    # an engine 3% faster than every variant of the first wins, and its own first close variant is taken
    assert autotune.choose(["eng0_k1=0", "eng7_k2=0", "eng7_k2=1"],
                           timings(**{"eng0_k1=0": 1.03, "eng7_k2=0": 1.01, "eng7_k2=1": 1.00})) == "eng7_k2=0"
    # a variant clearly faster than the engine's first (6%) still replaces it
    assert autotune.choose(["eng0_k1=0", "eng0_k1=1"], timings(**{"eng0_k1=0": 1.06, "eng0_k1=1": 1.00})) == \
        "eng0_k1=1"
    # knob_margin None: one margin between all ways, engines or not
    assert autotune.choose(["eng0_k1=0", "eng0_k1=1"], timings(**{"eng0_k1=0": 1.03, "eng0_k1=1": 1.00}),
                           knob_margin=None) == "eng0_k1=1"


def test_a_gemm_algorithm_is_an_engine_its_tiles_and_splits_knobs_and_other_ways_their_own():
    assert autotune.engine_of("eng12_k2=4_k3=0") == "eng12"
    assert autotune.engine_of("eng70") == "eng70"
    first = "algorithm_id=21,tile=(128, 64),stages=(32, 6),split_k=8,reduction_scheme=2"
    second = "algorithm_id=21,tile=(64, 128),stages=(32, 6),split_k=8,reduction_scheme=2"
    other = "algorithm_id=23,tile=(64, 64),stages=(16, 6),split_k=16,reduction_scheme=2"
    assert autotune.engine_of(first) == autotune.engine_of(second) == "algorithm_id=21"
    assert autotune.choose([first, second], timings(**{first: 1.03, second: 1.0})) == first   # knobs: 5%
    assert autotune.choose([first, other], timings(**{first: 1.03, other: 1.0})) == other     # engines: 2%
    assert autotune.engine_of("cudnn") == "cudnn"   # a depthwise way


def test_tune_groups_cudnn_plans_by_the_engine_their_names_give(monkeypatch):
    # cuDNN's ways are plan indices: tune reads each one's engine from its name
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    device = StandInDevice({"p0": 0.0103, "p1": 0.0100, "p2": 0.0200})
    ways = {0: device.way("p0"), 1: device.way("p1"), 2: device.way("p2")}
    names = {0: "eng3_k1=0", 1: "eng3_k1=1", 2: "eng9_k4=2"}
    chosen, _ = autotune.tune(device.xp, device.stream, ("conv_fprop", 1), ways, names)
    assert chosen == 0   # 3% apart: variants of one engine, so the heuristic's first stays
    assert autotune.PLAN_CHOICES.chosen_for(("conv_fprop", 1)) == "eng3_k1=0"


def test_untimed_ways_are_skipped_and_nothing_timed_is_an_error():
    assert autotune.choose(["pruned", "a"], timings(a=1.0)) == "a"
    with pytest.raises(ValueError, match="no way was timed"):
        autotune.choose(["a"], {})


def test_a_timing_is_the_median_pass_and_its_relative_spread():
    timing = autotune.Timing.of([1.0, 1.2, 0.9, 1.1, 1.0], repeats=4)
    assert timing.ms == 1.0 and timing.spread == pytest.approx(0.3) and timing.repeats == 4


def test_replays_time_the_kernels_and_capture_enough_executions_to_fill_a_replay():
    device = StandInDevice({"slow": 0.050, "fast": 0.002})
    ways = {name: device.way(name) for name in device.ms}
    result = autotune.time_captured(device.xp, device.stream, ways)
    assert "slow" not in result   # estimated 25x slower than the fastest: pruned before the careful timing
    assert result["fast"].ms == pytest.approx(0.002)
    assert result["fast"].repeats == round(autotune.TARGET_REPLAY_MS / 0.002) == 100
    assert device.captured_sizes["fast"] == [1, 100] and device.eager_runs == {}   # nothing timed from the host
    assert device.replays["fast"] == 3 + 1 + autotune.PASSES   # estimates, upload, timed passes


def test_executions_per_replay_are_capped_for_the_tiniest_kernels():
    device = StandInDevice({"tiny": 1e-5})
    result = autotune.time_captured(device.xp, device.stream, {"tiny": device.way("tiny")})
    assert result["tiny"].repeats == autotune.MAX_REPEATS and result["tiny"].ms == pytest.approx(1e-5)


def test_a_noisy_way_reports_its_spread():
    device = StandInDevice({"steady": 0.1, "noisy": 0.1}, jitter={"noisy": 0.02})
    result = autotune.time_captured(device.xp, device.stream, {n: device.way(n) for n in device.ms})
    assert result["steady"].spread == pytest.approx(0, abs=1e-9) and result["noisy"].spread > 0.05


def test_faster_of_times_each_way_once_then_runs_its_choice(monkeypatch):
    choices = autotune.PlanChoices()
    monkeypatch.setattr(autotune, "PLAN_CHOICES", choices)
    device = StandInDevice({"cudnn": 0.010, "direct": 0.006})
    backend = SimpleNamespace(xp=device.xp, stream=device.stream)
    chooser = autotune.FasterOf(backend, ("conv_fwd_choice", 1), {"cudnn": device.way("cudnn"),
                                                                   "direct": device.way("direct")})
    chooser.run()
    assert chooser.chosen == "direct" and set(chooser.timings) == {"cudnn", "direct"}
    assert choices.tuned == {autotune.key_text(("conv_fwd_choice", 1)): {"plan": "direct", "ms": 0.006}}
    assert choices.chosen_for(("conv_fwd_choice", 1)) == "direct"   # a repeated shape is not timed again
    chooser.run()
    assert device.eager_runs == {"cudnn": 1, "direct": 3}   # first runs, then the choice twice


def test_faster_of_takes_a_preset_without_timing(monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices({autotune.key_text(("k",)): "cudnn"}))
    device = StandInDevice({"cudnn": 0.010, "direct": 0.006})
    backend = SimpleNamespace(xp=device.xp, stream=device.stream)
    chooser = autotune.FasterOf(backend, ("k",), {"cudnn": device.way("cudnn"), "direct": device.way("direct")})
    chooser.run()
    assert chooser.chosen == "cudnn" and chooser.timings == {} and device.replays == {}


def test_choices_in_force_are_the_presets_and_what_was_timed_and_adopted_ones_count_as_timed():
    choices = autotune.PlanChoices({"a": "eng0", "b": "eng1"})
    choices.record(("c",), "eng2", 0.5)
    assert choices.in_force() == {"a": "eng0", "b": "eng1", autotune.key_text(("c",)): "eng2"}
    choices.adopt({"a": {"plan": "eng0", "ms": 1.0}, "d": {"plan": "eng4", "ms": 2.0}})   # 'a' as preset: nothing new
    assert choices.tuned == {autotune.key_text(("c",)): {"plan": "eng2", "ms": 0.5}, "d": {"plan": "eng4", "ms": 2.0}}


def test_a_single_way_needs_no_choice_and_no_way_is_an_error():
    device = StandInDevice({"cudnn": 1.0})
    backend = SimpleNamespace(xp=device.xp, stream=device.stream)
    assert autotune.FasterOf(backend, ("k",), {"cudnn": device.way("cudnn"), "direct": None}).chosen == "cudnn"
    with pytest.raises(ValueError, match="no way to run it"):
        autotune.FasterOf(backend, ("k",), {"cudnn": None, "direct": None})


def test_faster_of_refuses_to_choose_inside_capture():
    device = StandInDevice({"a": 1.0, "b": 1.0})
    backend = SimpleNamespace(xp=device.xp, stream=device.stream)
    chooser = autotune.FasterOf(backend, ("op",), {"a": device.way("a"), "b": device.way("b")})
    device.stream.begin_capture()
    with pytest.raises(RuntimeError, match="first ran inside CUDA-graph capture"):
        chooser.run()


def test_progress_is_said_every_few_seconds_and_when_nothing_is_left(monkeypatch, caplog):
    now = [100.0]
    monkeypatch.setattr(autotune.time, "perf_counter", lambda: now[0])
    progress = autotune.Progress("cuDNN graphs autotuned")
    caplog.set_level(logging.INFO, logger="gpuengine.autotune")
    for pending in (3, 2, 1):
        now[0] += 1.0
        progress.step(pending)
    now[0] += autotune.PROGRESS_EVERY_S
    progress.step(0)
    said = [record.getMessage() for record in caplog.records]
    assert said == ["cuDNN graphs autotuned: 4, 0 to go, 7 s"]
    now[0] += autotune.BURST_GAP_S + 1   # a later model's burst counts afresh
    progress.step(None)
    now[0] += autotune.PROGRESS_EVERY_S
    progress.step(None)
    assert caplog.records[-1].getMessage() == "cuDNN graphs autotuned: 2, 5 s"


def test_runtime_compiled_candidates_are_built_only_among_the_first_few(monkeypatch):
    from gpuengine.ops import cudnn
    monkeypatch.setattr(cudnn, "RUNTIME_COMPILED_CANDIDATES", 2)
    names = {0: "eng0_k1", 1: "eng9", 3: "eng0_k2", 4: "eng0_k3", 6: "eng12", 7: "eng0_k4"}
    assert cudnn._worth_building(names, compiled={0, 3, 4, 7}) == [0, 1, 3, 6]   # precompiled ones all
    assert cudnn._worth_building(names, compiled=set()) == [0, 1, 3, 4, 6, 7]
