"""Learned run-to-run noise per perf test: `baselines_store/<tier>/noise.json`, and the rounds it asks for.

Model (one-way random effects, e.g. Montgomery, "Design and Analysis of
Experiments", ch. 3.9): the log of a per-round value of run j is
mu + b_j + e_ij, where b_j is the run's own offset (process, clocks, memory
placement) and e_ij the round's noise. A run's median then varies between runs
with variance between_run_sd^2 + pi/2 round_sd^2 / rounds: more rounds shrink
only the second part. Calibration (`./gate gatepower calibrate`)
repeats each test in several processes ("sessions"), several trials each, and
estimates both parts; the session-to-session part comes from the analysis of
variance of the trial medians. With few runs the estimate is pulled towards
the prior (regression.DEFAULT_BETWEEN_RUN_SD) with the weight of PRIOR_RUNS
runs, the posterior mean of a variance under a conjugate prior, so three runs
that happen to agree cannot make a test look steadier than it is.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpuengine.bench.json_files import JsonFileError, load_json, require_number, write_json

from .regression import DEFAULT_BETWEEN_RUN_SD, MAX_ROUNDS, MIN_ROUNDS, NoiseLevels, RunSamples, recommend_rounds
from .significance import MEDIAN_VARIANCE_FACTOR, robust_sd

FORMAT = 1
PRIOR_RUNS = 2


@dataclass(frozen=True)
class SignalNoise:
    """The noise of one signal (ratio or engine time) of one test, in log units."""

    between_run_sd: float    # run-to-run sd beyond the rounds' spread, after the prior: what the gate uses
    round_sd: float          # spread of single rounds within a run
    observed_run_sd: float   # sd of the run medians measured, at the calibration's rounds


@dataclass(frozen=True)
class CalibratedNoise:
    """What calibration learned about one test."""

    calibrated: str          # when and at which commit, e.g. "2026-11-24 at 797e448"
    reference: str | None    # the reference of the ratio signal
    runs: int
    sessions: int
    rounds: int
    ratio: SignalNoise | None
    time: SignalNoise | None
    recommended_rounds: int
    detectable_slowdown: float   # smallest slowdown caught 95% of the time at the recommended rounds

    def levels(self) -> NoiseLevels:
        prior = DEFAULT_BETWEEN_RUN_SD
        ratio = self.ratio.between_run_sd if self.ratio else prior
        time = self.time.between_run_sd if self.time else prior
        return NoiseLevels(ratio, time, f"noise.json: run-to-run {(self.ratio or self.time).between_run_sd:.2%} "
                                        f"from {self.runs} runs in {self.sessions} sessions, {self.calibrated}")


def signal_noise(runs: list[list[np.ndarray]], rounds: int) -> SignalNoise:
    """Estimate from `runs[session][trial]` = per-round log samples of one signal."""
    medians = [[float(np.median(trial)) for trial in session] for session in runs]
    flat = [m for session in medians for m in session]
    if len(flat) < 2:
        raise ValueError("noise needs at least two runs of a test (sessions x trials >= 2)")
    round_sd = math.sqrt(float(np.mean([robust_sd(trial) ** 2 for session in runs for trial in session])))
    sizes = [len(session) for session in medians if session]
    within_dof = sum(k - 1 for k in sizes)
    within = (sum(float(np.var(s, ddof=1)) * (len(s) - 1) for s in medians if len(s) > 1) / within_dof
              if within_dof else 0.0)
    if len(sizes) >= 2 and within_dof:
        means = np.array([np.mean(s) for s in medians if s])
        grand = float(np.average(means, weights=sizes))
        between_sessions = float(np.sum(np.array(sizes) * (means - grand) ** 2)) / (len(sizes) - 1)
        run_var = within + max(0.0, (between_sessions - within) / float(np.mean(sizes)))
    else:
        run_var = float(np.var(flat, ddof=1))
    between = max(0.0, run_var - MEDIAN_VARIANCE_FACTOR * round_sd ** 2 / rounds)
    dof = len(flat) - 1
    shrunk = (dof * between + PRIOR_RUNS * DEFAULT_BETWEEN_RUN_SD ** 2) / (dof + PRIOR_RUNS)
    return SignalNoise(math.sqrt(shrunk), round_sd, math.sqrt(run_var))


def estimate(sessions: list[list[RunSamples]], rounds: int, calibrated: str) -> CalibratedNoise:
    """A test's noise from its runs, `sessions[s][t]` (separate processes s, trials t within one)."""
    runs = [run for session in sessions for run in session]
    references = {run.reference for run in runs}
    if len(references) != 1:
        raise ValueError(f"the runs of one test compare with different references: {sorted(map(str, references))}")
    reference = references.pop()
    ratio = time = None
    if all(run.ratio_cost is not None for run in runs):
        ratio = signal_noise([[run.ratio_cost for run in s] for s in sessions], rounds)
    if all(run.time_cost is not None for run in runs):
        time = signal_noise([[run.time_cost for run in s] for s in sessions], rounds)
    primary = ratio or time
    if primary is None:
        raise ValueError("the runs carry neither reference ratios nor engine round times")
    confirm = time.round_sd if ratio is not None and time is not None else None
    best, detectable = recommend_rounds(primary.between_run_sd, primary.round_sd, confirm, MIN_ROUNDS, MAX_ROUNDS)
    return CalibratedNoise(calibrated, reference, len(runs), sum(1 for s in sessions if s), rounds, ratio, time, best,
                     detectable)


def _signal_from(entry, where: str) -> SignalNoise | None:
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != {"between_run_sd", "round_sd", "observed_run_sd"}:
        raise JsonFileError(f"{where} must be null or an object with between_run_sd, round_sd, observed_run_sd")
    return SignalNoise(**{key: require_number(value, f"{where}.{key}", 0) for key, value in entry.items()})


def _test_from(entry, where: str) -> CalibratedNoise:
    keys = {"calibrated", "reference", "runs", "sessions", "rounds", "ratio", "time", "recommended_rounds",
            "detectable_slowdown"}
    if not isinstance(entry, dict) or set(entry) != keys:
        got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise JsonFileError(f"{where} must be an object with exactly the keys {sorted(keys)}, got {got}")
    if not isinstance(entry["calibrated"], str):
        raise JsonFileError(f"{where}.calibrated must be a string, got {entry['calibrated']!r}")
    if entry["reference"] is not None and not isinstance(entry["reference"], str):
        raise JsonFileError(f"{where}.reference must be a runner name or null, got {entry['reference']!r}")
    counts = {key: int(require_number(entry[key], f"{where}.{key}", 1))
              for key in ("runs", "sessions", "rounds", "recommended_rounds")}
    ratio, time = _signal_from(entry["ratio"], f"{where}.ratio"), _signal_from(entry["time"], f"{where}.time")
    if ratio is None and time is None:
        raise JsonFileError(f"{where}: ratio and time are both null; a calibrated test has at least one")
    return CalibratedNoise(entry["calibrated"], entry["reference"], ratio=ratio, time=time,
                     detectable_slowdown=require_number(entry["detectable_slowdown"], f"{where}.detectable_slowdown",
                                                        0), **counts)


class NoiseTable:
    """The noise.json of one tier: per test, what calibration learned; defaults for the rest."""

    def __init__(self, path: Path, tests: dict[str, CalibratedNoise], calibration: dict):
        self.path, self.tests, self.calibration = Path(path), tests, calibration

    @classmethod
    def load(cls, path: Path | str) -> "NoiseTable":
        """The table in `path`; an absent file is an empty table (every test uncalibrated)."""
        path = Path(path)
        if not path.exists():
            return cls(path, {}, {})
        content = load_json(path)
        if not isinstance(content, dict) or content.get("format") != FORMAT:
            raise JsonFileError(f"{path}: expected an object with \"format\": {FORMAT}")
        if not isinstance(content.get("tests"), dict) or not isinstance(content.get("calibration"), dict):
            raise JsonFileError(f"{path}: expected \"calibration\" and \"tests\" objects")
        tests = {name: _test_from(entry, f"{path}: tests[{name!r}]") for name, entry in content["tests"].items()}
        return cls(path, tests, content["calibration"])

    def levels(self, test: str) -> NoiseLevels:
        entry = self.tests.get(test)
        return entry.levels() if entry else NoiseLevels.uncalibrated()

    def updated(self, tests: dict[str, CalibratedNoise], calibration: dict) -> "NoiseTable":
        """This table with `tests` replaced by a new calibration (tests it did not run keep their entry)."""
        return NoiseTable(self.path, {**self.tests, **tests}, calibration)

    def save(self, tier: str) -> Path:
        content = {"format": FORMAT, "tier": tier, "calibration": self.calibration,
                   "tests": {name: asdict(entry) for name, entry in sorted(self.tests.items())}}
        return write_json(self.path, content)
