"""Change points over the stored history: where a test's speed stepped, and between which two runs.

The gate's two rules compare one run with one base; a creep of 1% a run passes every one of them. This
module watches the whole history instead. Per GPU kind (the caller's runs are one tier's folder), per
stack (the lock, `stack_lock.stack_of`: another lock times unchanged code differently) and per test, the
baselines that timed the same runners (as the stored-run rule compares like with like:
`stored_runs.runners_of`) form two series, one point per run, oldest first:

- `TIME`: the engine's time per sample (1 / its samples per second);
- the engine's time over the strongest reference's (`torch_graph_best` where every run of the series
  settled it, else the reference the stored-run rule reads, `regression.choose_reference`).

Both are "larger = engine slower". The detector (`detect`) works on the log of a series: ruptures' kernel
change-point search with a linear kernel (a change in mean, found by PELT) proposes the splits, at a
penalty of PENALTY x log(n) in units of the series' noise (robust sd of successive differences, so a step
does not inflate it); then, as Apache Otava confirms its E-divisive candidates, each split must pass a
Welch t-test of the segments either side at ALPHA (each segment clipped to its median +- CLIP_SD noise sds),
the weakest dropped until all do; each is then placed at the best single split near it (`_refined`). A change
point names the last run before and the first run after it and its size, the relative change of the medians
of the segments either side. Measured on synthetic series (correctness_tests/gate/test_changepoints.py,
docs/gate.md "Change points"): a 3% step in 1% noise, 8 runs a side, found in 92% of 200 seeds; pure
noise flagged in 2%.

ruptures (the `changepoints` extra, in the CPU tier's lock only until the GPU locks' next refresh) may be
missing on a GPU machine: `analyse` then says so in `Analysis.unavailable` and computes nothing, and its
callers print that instead.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from gpuengine.bench.stack_lock import stack_of
from gpuengine.gate.store.stored_runs import HISTORY, MACHINE_ID, StoredRun, scan
from gpuengine.bench.stronger_reference import STRONGER

from .rules.regression import choose_reference
from .rules.significance import robust_sd

MIN_SEGMENT = 3    # runs a side at the least: one stray run is an outlier, not a new level
PENALTY = 3.0      # x log(n) per split, in units of the noise variance (BIC's log n, made stricter)
ALPHA = 0.001      # Welch's t-test of the segments either side: with the penalty, <= 5% of noise series flagged
CLIP_SD = 4.0      # a run further than this many noise sds from its segment's median counts as that far, no further
RECENT_RUNS = 5    # ./gate perf's summary lists change points whose first run after is one of the newest 5
TIME = "time per sample"
LIBRARY = "ruptures"
MISSING = (f"change points not computed: the {LIBRARY} package is not installed here (the changepoints extra, in "
           "the CPU tier's lock: pip install -e '.[changepoints]'; a GPU machine without a registry may bring its "
           "wheel, docs/gate.md)")


@dataclass(frozen=True)
class RunPoint:
    """One stored run as the detector reads it."""

    label: str                    # '0039 66b85b0': how a change point names it
    commit: str
    when: datetime
    stack: str                    # stack_lock.StackId as text: runs of one stack only form a series
    tests: Mapping[str, dict]     # test name (with its parameter id) -> the test's extra_info
    passed: bool = True           # False: a run kept under history/, left out (the gate never compares with it)

    @property
    def short_commit(self) -> str:
        return self.commit[:7] or "no commit"


def point_of(run: StoredRun) -> RunPoint:
    """The detector's view of a run read by stored_runs (the gate's reader)."""
    number = run.path.name.split("_", 1)[0]
    tests = {name.split("::")[-1]: bench.get("extra_info") or {} for name, bench in run.benchmarks.items()}
    return RunPoint(f"{number} {(run.commit or '')[:7] or 'no commit'}", run.commit or "", run.saved_at,
                    str(stack_of(run.machine_info)), tests, HISTORY not in Path(run.label).parts)


@dataclass(frozen=True)
class Series:
    tier: str
    test: str
    signal: str                   # TIME, or 'time ratio to <reference>'
    stack: str
    points: tuple[tuple[RunPoint, float], ...]   # oldest first


@dataclass(frozen=True)
class ChangePoint:
    series: Series
    before: RunPoint              # the last run of the level before
    after: RunPoint               # the first run of the level after
    size: float                   # median after / median before - 1: > 0, the engine got slower
    p: float                      # Welch's t-test that confirmed it (at the split before _refined placed it)

    @property
    def commits(self) -> str:
        """The commits that may have done it, in git's notation: after `before`, up to `after`."""
        return f"{self.before.short_commit}..{self.after.short_commit}"

    def describe(self) -> str:
        s = self.series
        return (f"{s.test}: {s.signal} {self.size:+.1%} ({'slower' if self.size > 0 else 'faster'}) between "
                f"runs {self.before.label} and {self.after.label} ({self.commits}), p={self.p:.1g}; {s.tier}, "
                f"{s.stack}")


@dataclass
class Analysis:
    tier: str
    series: list[Series] = field(default_factory=list)
    change_points: list[ChangePoint] = field(default_factory=list)
    too_short: int = 0            # series with fewer than 2 x MIN_SEGMENT runs: no change point can be told
    unavailable: str | None = None   # why nothing was computed (the library missing)

    def recent(self, runs: Sequence[RunPoint], last: int = RECENT_RUNS) -> list[ChangePoint]:
        """The change points whose first run after is one of the newest `last` of `runs` (oldest first)."""
        newest = {id(run) for run in list(runs)[-last:]}
        return [cp for cp in self.change_points if id(cp.after) in newest]


def _ruptures():
    try:
        import ruptures
    except ImportError:
        return None
    return ruptures


def available() -> bool:
    return _ruptures() is not None


def noise_scale(log_values: np.ndarray) -> float:
    """The series' noise sd from successive differences (a step moves one of them), robustly."""
    diffs = np.diff(log_values)
    scale = robust_sd(diffs) / math.sqrt(2)
    return scale if scale > 0 else float(np.std(diffs)) / math.sqrt(2)


def _welch_p(before: np.ndarray, after: np.ndarray, scale: float) -> float:
    """Welch's t-test of two segments of a log series, each clipped to its median +- CLIP_SD x `scale`: two
    stray runs (a machine 10x off) must not hide a step beside them by inflating a segment's variance."""
    from scipy.stats import ttest_ind   # ruptures' own dependency: there wherever ruptures is
    before, after = (np.clip(part, np.median(part) - CLIP_SD * scale, np.median(part) + CLIP_SD * scale)
                     for part in (before, after))
    if np.ptp(before) == 0 and np.ptp(after) == 0:
        return 0.0 if before[0] != after[0] else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(ttest_ind(before, after, equal_var=False).pvalue)
    return 1.0 if math.isnan(p) else p


def _confirmed(logs: np.ndarray, splits: list[int], scale: float) -> list[tuple[int, float]]:
    """(split, p) of the splits whose segments either side differ at ALPHA, the weakest dropped one at a time."""
    splits = list(splits)
    while splits:
        edges = [0, *splits, len(logs)]
        ps = [_welch_p(logs[edges[i]:edges[i + 1]], logs[edges[i + 1]:edges[i + 2]], scale)
              for i in range(len(splits))]
        weakest = int(np.argmax(ps))
        if ps[weakest] < ALPHA:
            return list(zip(splits, ps))
        del splits[weakest]
    return []


def _refined(logs: np.ndarray, splits: list[int]) -> list[int]:
    """Each split moved to the best single split between its neighbours within MIN_SEGMENT - 1 runs of where it
    was, segments of one run allowed: MIN_SEGMENT keeps stray runs from making a change point, not a step two runs
    from the start from being placed there."""
    splits = list(splits)
    for i, split in enumerate(splits):
        low, high = [0, *splits][i], [*splits, len(logs)][i + 1]
        candidates = range(max(low + 1, split - MIN_SEGMENT + 1), min(high, split + MIN_SEGMENT))
        cost = [np.var(logs[low:at]) * (at - low) + np.var(logs[at:high]) * (high - at) for at in candidates]
        splits[i] = candidates[int(np.argmin(cost))]
    return splits


def detect(values: Sequence[float]) -> list[tuple[int, float, float]]:
    """(index of the first point after, size, p) of each change point of a series of positive values."""
    ruptures = _ruptures()
    if ruptures is None:
        raise ImportError(MISSING)
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"change points need a 1-d series of positive finite values, not {values!r}")
    n = len(values)
    logs = np.log(values)
    scale = noise_scale(logs) if n >= 2 * MIN_SEGMENT else 0.0
    if scale == 0.0:   # too short, or every point equal
        return []
    z = ((logs - np.median(logs)) / scale).reshape(-1, 1)
    splits = ruptures.KernelCPD(kernel="linear", min_size=MIN_SEGMENT).fit(z).predict(pen=PENALTY * math.log(n))
    confirmed = _confirmed(logs, splits[:-1], scale)   # predict's last split is the series' end
    splits = _refined(logs, [split for split, _ in confirmed])
    edges = [0, *splits, n]
    return [(split, float(np.median(values[split:edges[i + 2]]) / np.median(values[edges[i]:split]) - 1), p)
            for i, (split, (_, p)) in enumerate(zip(splits, confirmed))]


def _engine(info: dict) -> str | None:
    """The runner whose rounds are the test's: the one of its throughputs every ratio is taken against."""
    throughputs, ratios = info.get("samples_per_s") or {}, info.get("ratios") or {}
    others = [name for name in throughputs if name not in ratios]
    return others[0] if len(others) == 1 else None


def _runners(info: dict) -> tuple[str, ...]:
    times = info.get("median_round_ms")
    return tuple(sorted(times)) if isinstance(times, dict) else ()


def _ratio(info: dict, reference: str) -> float | None:
    speedup = ((info.get("ratios") or {}).get(reference) or {}).get("median")
    return 1.0 / speedup if isinstance(speedup, (int, float)) and speedup > 0 else None


def _time(info: dict) -> float | None:
    engine = _engine(info)
    throughput = (info.get("samples_per_s") or {}).get(engine) if engine else None
    return 1.0 / throughput if isinstance(throughput, (int, float)) and throughput > 0 else None


def _reference(infos: list[dict]) -> str | None:
    """The strongest reference every point of a series measured: torch_graph_best, else the rule's."""
    if all(_ratio(info, STRONGER) is not None for info in infos):
        return STRONGER
    medians = infos[-1].get("median_round_ms") or {}
    return choose_reference({name: ms for name, ms in medians.items() if name != _engine(infos[-1])})


def series_of(runs: Sequence[RunPoint], tier: str) -> list[Series]:
    """The two series of every (stack, test, runners) of the baselines among `runs` (oldest first)."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[tuple[RunPoint, dict]]] = {}
    for run in runs:
        if run.passed:
            for test, info in run.tests.items():
                groups.setdefault((run.stack, test, _runners(info)), []).append((run, info))
    found = []
    for (stack, test, _), members in sorted(groups.items()):
        reference = _reference([info for _, info in members])
        signals = [(TIME, _time)] + ([(f"time ratio to {reference}", lambda info: _ratio(info, reference))]
                                     if reference else [])
        for signal, value_of in signals:
            points = tuple((run, value) for run, info in members if (value := value_of(info)) is not None)
            if len(points) >= 2:
                found.append(Series(tier, test, signal, stack, points))
    return found


def analyse(runs: Sequence[RunPoint], tier: str) -> Analysis:
    """Every series of `runs` (one tier's stored runs, oldest first) and its change points."""
    analysis = Analysis(tier)
    if not available():
        analysis.unavailable = MISSING
        return analysis
    analysis.series = series_of(runs, tier)
    for series in analysis.series:
        if len(series.points) < 2 * MIN_SEGMENT:
            analysis.too_short += 1
            continue
        for index, size, p in detect([value for _, value in series.points]):
            analysis.change_points.append(ChangePoint(series, series.points[index - 1][0], series.points[index][0],
                                                      size, p))
    return analysis


def folder_of(run_file: Path) -> Path:
    """The folder of baselines a stored run file belongs to (its tier's, or a series' such as config-...)."""
    folder = run_file.parent
    folder = folder.parent if MACHINE_ID.match(folder.name) else folder
    return folder.parent if folder.name == HISTORY else folder


def recent_lines(folder: Path, tier: str, last: int = RECENT_RUNS) -> list[str]:
    """./gate perf's summary: the change points among the newest `last` baselines of `folder`, and how many in all;
    or why none was computed."""
    points = [point_of(run) for run in scan(folder)[0]]
    analysis = analyse(points, tier)
    if analysis.unavailable:
        return [analysis.unavailable]
    recent, total = analysis.recent(points, last), len(analysis.change_points)
    return [cp.describe() for cp in recent] + [
        f"{len(recent) or 'no'} change point{'' if len(recent) == 1 else 's'} started in the newest "
        f"{min(last, len(points))} of the {len(points)} baselines of {folder.name}; {total} in the whole history "
        f"({len(analysis.series)} series, {analysis.too_short} shorter than {2 * MIN_SEGMENT} runs)"
        + (": ./gate report marks them in the history figures" if total else "")]
