"""gpuengine.bench.benchmarking: interleaved rounds, per-round ratios, throughput and fraction of peak.

Runners here are recording fakes with scripted round times, so every number
the comparison reports can be checked exactly.
"""
from __future__ import annotations

import pytest

from gpuengine.bench.benchmarking import Comparison, interleave, ratio, samples_per_second, time_round


class RecordingRunner:
    """A runner that logs every call into a shared list; it does no work."""

    def __init__(self, name: str, log: list, samples_per_round: int = 100):
        self.name, self.log, self.samples_per_round = name, log, samples_per_round

    def prepare(self):
        self.log.append(("prepare", self.name))

    def run_round(self):
        self.log.append(("round", self.name))

    def synchronize(self):
        self.log.append(("sync", self.name))


def rounds_in_order(log):
    return [name for event, name in log if event == "round"]


def test_interleave_alternates_runners_round_by_round():
    log = []
    runners = [RecordingRunner("A", log), RecordingRunner("B", log)]
    times = interleave(runners, rounds=3, warmup_rounds=1)
    assert log[:2] == [("prepare", "A"), ("prepare", "B")]
    assert rounds_in_order(log) == ["A", "B"] * 4  # one warm-up round, then three timed
    assert {name: len(ms) for name, ms in times.items()} == {"A": 3, "B": 3}


def test_interleave_prepares_everything_before_any_round():
    log = []
    interleave([RecordingRunner(n, log) for n in "ABC"], rounds=1, warmup_rounds=0)
    assert [event for event, _ in log[:3]] == ["prepare"] * 3
    assert "prepare" not in [event for event, _ in log[3:]]


def test_interleave_refuses_duplicate_names_and_no_rounds():
    log = []
    with pytest.raises(ValueError, match="unique"):
        interleave([RecordingRunner("A", log), RecordingRunner("A", log)], rounds=1)
    with pytest.raises(ValueError, match="at least one"):
        interleave([RecordingRunner("A", log)], rounds=0)


def test_time_round_drains_the_device_before_each_clock_read():
    log = []
    ticks = iter([1.0, 1.25])
    ms = time_round(RecordingRunner("A", log), clock=lambda: next(ticks))
    assert ms == pytest.approx(250.0)
    assert [event for event, _ in log] == ["sync", "round", "sync"]


def test_ratio_is_the_median_of_per_round_speedups():
    summary = ratio([1.0, 2.0, 4.0], [3.0, 4.0, 4.0], "torch_graph")
    assert summary.per_round == [3.0, 2.0, 1.0]
    assert summary.median == 2.0
    assert (summary.low, summary.high) == (1.0, 3.0)
    assert summary.spread == pytest.approx(1.0)
    assert summary.as_dict()["median"] == 2.0


def test_ratio_above_one_means_the_engine_is_faster():
    assert ratio([1.0], [1.5], "torch_eager").median == pytest.approx(1.5)
    assert ratio([2.0], [1.0], "torch_eager").median == pytest.approx(0.5)


@pytest.mark.parametrize("engine, reference", [([1.0, 0.0], [1.0, 1.0]), ([1.0, 1.0], [0.0, 1.0])])
def test_ratio_refuses_rounds_that_took_no_time(engine, reference):
    with pytest.raises(ValueError, match="no measurable time"):
        ratio(engine, reference, "torch_eager")


@pytest.mark.parametrize("engine, reference", [([1.0, 2.0], [1.0]), ([], [])])
def test_ratio_refuses_unpaired_or_empty_rounds(engine, reference):
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        ratio(engine, reference, "torch_eager")


def test_samples_per_second_uses_the_median_round():
    assert samples_per_second([10.0, 20.0, 1000.0], 1000) == pytest.approx(50_000.0)


def comparison(**kwargs) -> Comparison:
    times = {"gpuengine": [1.0, 1.0, 1.0], "torch_eager": [3.0, 3.0, 3.0], "torch_graph": [1.5, 1.5, 1.5]}
    samples = {"gpuengine": 1000, "torch_eager": 1000, "torch_graph": 1000}
    return Comparison.from_times("gpuengine", times, samples, **kwargs)


def test_comparison_ratios_every_reference_and_finds_the_fastest():
    result = comparison()
    assert set(result.ratios) == {"torch_eager", "torch_graph"}
    assert result.ratios["torch_eager"].median == pytest.approx(3.0)
    assert result.ratios["torch_graph"].median == pytest.approx(1.5)
    assert result.best_reference() == "torch_graph"


def test_comparison_normalises_references_with_other_round_sizes():
    # The reference does half the samples in the same time: the engine is twice as fast.
    result = Comparison.from_times("gpuengine", {"gpuengine": [2.0], "ref": [2.0]}, {"gpuengine": 1000, "ref": 500})
    assert result.ratios["ref"].median == pytest.approx(2.0)


def test_comparison_throughput_flops_and_fraction_of_peak():
    result = comparison(flops_per_sample=1e6, peak_tflops=2.0)
    assert result.throughput("gpuengine") == pytest.approx(1e6)  # 1000 samples in 1 ms; 1e6 flops each: 1 TFLOP/s
    assert result.achieved_tflops("gpuengine") == pytest.approx(1.0)
    assert result.fraction_of_peak("gpuengine") == pytest.approx(0.5)


def test_comparison_without_flops_reports_no_peak_fraction():
    result = comparison()
    assert result.achieved_tflops("gpuengine") is None
    assert result.fraction_of_peak("gpuengine") is None
    info = result.extra_info()
    assert "achieved_tflops" not in info and "fraction_of_peak" not in info


def test_extra_info_is_what_a_stored_run_needs():
    info = comparison(flops_per_sample=1e6, peak_tflops=2.0).extra_info()
    assert info["samples_per_s"]["gpuengine"] == pytest.approx(1e6)
    assert info["median_round_ms"] == {"gpuengine": 1.0, "torch_eager": 3.0, "torch_graph": 1.5}
    assert info["ratios"]["torch_eager"]["median"] == pytest.approx(3.0)
    assert info["fraction_of_peak"]["gpuengine"] == pytest.approx(0.5)
    assert info["peak_tflops_measured"] == 2.0
    # the engine's own rounds travel with the run: the stored-run check's second signal
    assert info["engine_round_ms"] == [1.0] * 3 and info["engine_samples_per_round"] == 1000


def test_comparison_refuses_mismatched_rounds():
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        Comparison.from_times("gpuengine", {"gpuengine": [1.0, 1.0], "ref": [1.0]}, {"gpuengine": 1, "ref": 1})
