"""Honest same-run comparisons: interleaved rounds, median ratios, fraction of peak.

Every engine or reference under comparison is a `Runner`. A round is timed with
a synchronize before reading the clock on both sides, after the runner's own
warm-up (compilation, graph capture, autotuning) and never on zeros. Runners
alternate round by round (A B C A B C ...) in one process so that clock and
thermal drift hit all of them; what is reported is the median of per-round
ratios and its spread (docs/architecture.md, "Measuring honestly"). Where a run
settled both of PyTorch's captured references, the ratios also hold the
stronger one round by round (stronger_reference.py, `torch_graph_best`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Collection, Protocol, Sequence

from .stronger_reference import STRONGER, faster_per_round, label


class Runner(Protocol):
    """What the suite needs from the engine and from each reference."""

    name: str                # "gpuengine", "torch_eager", "torch_compile", "torch_graph", "torch_compile_graph", ...
    samples_per_round: int   # samples one run_round() processes

    def prepare(self) -> None:
        """Warm-up: compile, capture, autotune, fill allocator caches. Not timed."""

    def run_round(self) -> None:
        """Enqueue one round of work (an epoch, or a fixed number of batches)."""

    def synchronize(self) -> None:
        """Block until the runner's device work is done."""


def time_round(runner: Runner, clock: Callable[[], float] = time.perf_counter) -> float:
    """Milliseconds of one round, with the device drained before both clock reads."""
    runner.synchronize()
    start = clock()
    runner.run_round()
    runner.synchronize()
    return (clock() - start) * 1e3


def interleave(runners: Sequence[Runner], rounds: int, warmup_rounds: int = 1,
               timer: Callable[[Runner], float] = time_round) -> dict[str, list[float]]:
    """Per-runner round times, the runners alternating round by round, each round timed by `timer`."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: at least one timed round is needed")
    names = [r.name for r in runners]
    if len(set(names)) != len(names):
        raise ValueError(f"runner names must be unique, got {names}")
    for runner in runners:
        runner.prepare()
    for _ in range(warmup_rounds):
        for runner in runners:
            timer(runner)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for runner in runners:
            times[runner.name].append(timer(runner))
    return times


@dataclass
class RatioSummary:
    """Engine speed-up over one reference: >1 means the engine is faster."""

    reference: str
    median: float
    low: float    # smallest per-round ratio
    high: float   # largest per-round ratio
    per_round: list[float] = field(default_factory=list)
    winners: list[str] = field(default_factory=list)   # a derived reference's runner of each round
    label: str = ""   # a derived reference's "torch_compile_graph in 7 of 9 rounds"

    @property
    def spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else float("inf")

    def as_dict(self) -> dict:
        record = {"median": round(self.median, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                  "spread": round(self.spread, 4), "per_round": [round(r, 4) for r in self.per_round]}
        if self.label:
            record.update(winners=list(self.winners), label=self.label)
        return record


def ratio(engine_ms: Sequence[float], reference_ms: Sequence[float], reference: str) -> RatioSummary:
    """Median of per-round speed-ups reference_time / engine_time (rounds paired in order)."""
    if len(engine_ms) != len(reference_ms) or not engine_ms:
        raise ValueError("ratio needs the same, non-zero number of rounds on both sides")
    if min(engine_ms) <= 0 or min(reference_ms) <= 0:
        raise ValueError("a round took no measurable time; make rounds longer")
    per_round = [r / e for e, r in zip(engine_ms, reference_ms)]
    return RatioSummary(reference, statistics.median(per_round), min(per_round), max(per_round), per_round)


def samples_per_second(round_ms: Sequence[float], samples_per_round: int) -> float:
    return samples_per_round / (statistics.median(round_ms) / 1e3)


@dataclass
class Comparison:
    """Everything one perf test records: throughputs, ratios, fraction of peak, losses."""

    engine: str
    times_ms: dict[str, list[float]]
    samples_per_round: dict[str, int]
    ratios: dict[str, RatioSummary]
    flops_per_sample: float | None = None
    peak_tflops: float | None = None

    @classmethod
    def from_times(cls, engine: str, times_ms: dict[str, list[float]], samples_per_round: dict[str, int],
                   flops_per_sample: float | None = None, peak_tflops: float | None = None,
                   unavailable: Collection[str] = ()) -> "Comparison":
        """`unavailable`: references that could not run here (ReferenceUnavailable), which settles them for
        the stronger reference."""
        ratios, scaled = {}, {}
        for name, ms in times_ms.items():
            if name == engine:
                continue
            # Normalise by samples so references may use a different round size.
            scale = samples_per_round[engine] / samples_per_round[name]
            scaled[name] = [m * scale for m in ms]
            ratios[name] = ratio(times_ms[engine], scaled[name], name)
        stronger = faster_per_round(scaled, unavailable)
        if stronger is not None:
            rounds, winners = stronger
            summary = ratio(times_ms[engine], rounds, STRONGER)
            summary.winners, summary.label = winners, label(winners, unavailable)
            ratios[STRONGER] = summary
        return cls(engine, times_ms, samples_per_round, ratios, flops_per_sample, peak_tflops)

    def throughput(self, name: str) -> float:
        return samples_per_second(self.times_ms[name], self.samples_per_round[name])

    def achieved_tflops(self, name: str) -> float | None:
        if self.flops_per_sample is None:
            return None
        return self.throughput(name) * self.flops_per_sample / 1e12

    def fraction_of_peak(self, name: str) -> float | None:
        achieved = self.achieved_tflops(name)
        if achieved is None or not self.peak_tflops:
            return None
        return achieved / self.peak_tflops

    def best_reference(self) -> str | None:
        """The fastest reference: the one whose ratio is smallest (torch_graph_best is two of them, not one)."""
        runners = [name for name in self.ratios if name != STRONGER]
        return min(runners, key=lambda n: self.ratios[n].median) if runners else None

    def extra_info(self) -> dict:
        """The JSON-ready record stored with the pytest-benchmark run."""
        info = {
            "samples_per_s": {n: round(self.throughput(n), 1) for n in self.times_ms},
            "median_round_ms": {n: round(statistics.median(ms), 4) for n, ms in self.times_ms.items()},
            "ratios": {n: r.as_dict() for n, r in self.ratios.items()},
        }
        if self.engine in self.times_ms:   # the engine's own rounds: the stored-run check's second signal
            info["engine_round_ms"] = [round(ms, 6) for ms in self.times_ms[self.engine]]
            info["engine_samples_per_round"] = self.samples_per_round[self.engine]
        if self.flops_per_sample is not None:
            info["flops_per_sample"] = self.flops_per_sample
            info["achieved_tflops"] = {n: round(self.achieved_tflops(n), 2) for n in self.times_ms}
        if self.peak_tflops:
            info["peak_tflops_measured"] = round(self.peak_tflops, 1)
            info["fraction_of_peak"] = {n: round(self.fraction_of_peak(n), 4) for n in self.times_ms}
        return info
