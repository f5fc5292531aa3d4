"""The gatepower study inside a perf test: repeated trials at injected slowdowns, and their files.

Active only in the pytest sessions `./gate gatepower` starts:
GATEPOWER_STUDY names the session's output folder and arms the injected
delay (gpuengine/bench/injected_delay.py); GATEPOWER_LEVELS_PCT, GATEPOWER_TRIALS,
GATEPOWER_TRIAL_BUDGET_S and GATEPOWER_ROUNDS say what to run. After a perf
test's own measurement, the per-step delay that makes the engine `level`
slower is found by timing the engine alone at a probe delay (the added time
is linear in the delay; the probe grows until it moves a round by >= 5%).
Each trial then times the test's rounds, the engine alternating round by
round with the one reference the rule reads (torch_graph where measured; the
other references only add time), the levels interleaved (0, 5%, 10%, then
rotated) so that drift within the process hits every level alike. Trials
stop at GATEPOWER_TRIALS or when the next would overrun the test's budget,
after at least MIN_TRIALS. One trial is one "run" to the decision rule; the
command pairs trials across sessions (analysis.py) or learns noise from them
(calibration.py).
"""
from __future__ import annotations

import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuengine.bench import injected_delay
from gpuengine.bench.benchmarking import Comparison, interleave, time_round
from gpuengine.bench.json_files import JsonFileError, load_json, write_json
from gpuengine.gate.rules.regression import RunSamples

LEVELS_ENV = "GATEPOWER_LEVELS_PCT"
TRIALS_ENV = "GATEPOWER_TRIALS"
ROUNDS_ENV = "GATEPOWER_ROUNDS"
BUDGET_ENV = "GATEPOWER_TRIAL_BUDGET_S"
MIN_TRIALS = 2        # a pair of unchanged trials at least, in every session
PROBE_START_US = 8.0
PROBE_MAX_US = 100_000.0
PROBE_ROUNDS = 3
PROBE_TARGET = 0.05   # a probe must slow a round by this much for its slope to stand above the noise
KEPT = ("ratios", "engine_round_ms", "engine_samples_per_round")   # the extra_info a trial keeps


@dataclass(frozen=True)
class StudySettings:
    out_dir: Path
    levels: tuple[float, ...]   # slowdowns as fractions, 0 first
    trials: int                 # at most, per level
    budget_s: float | None      # seconds of trials per test and session (after MIN_TRIALS)
    rounds: int | None          # forced rounds per trial (None: the gate's own choice)


def parse_levels(raw: str) -> tuple[float, ...]:
    """'0,5,10' (percent) -> (0.0, 0.05, 0.1); the unchanged engine (0) comes first."""
    try:
        values = tuple(float(v) / 100 for v in raw.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or values[0] != 0 or len(set(values)) != len(values) or any(not 0 <= v < 10 for v in values):
        raise ValueError(f"levels {raw!r}: use distinct percentages from 0 to under 1000, separated by commas, "
                         "0 first, e.g. 0,5,10")
    return values


def settings() -> StudySettings | None:
    """This session's study settings, or None in every session the study command did not start."""
    if not injected_delay.armed():
        return None
    try:
        trials = int(os.environ.get(TRIALS_ENV, str(MIN_TRIALS)))
        rounds = int(os.environ[ROUNDS_ENV]) if os.environ.get(ROUNDS_ENV) else None
        budget = float(os.environ[BUDGET_ENV]) if os.environ.get(BUDGET_ENV) else None
    except ValueError:
        raise ValueError(f"{TRIALS_ENV} and {ROUNDS_ENV} must be whole numbers, {BUDGET_ENV} seconds") from None
    if trials < 1 or (rounds is not None and rounds < 1) or (budget is not None and not budget > 0):
        raise ValueError(f"{TRIALS_ENV}={trials}, {ROUNDS_ENV}={rounds}, {BUDGET_ENV}={budget}: all must be > 0")
    return StudySettings(Path(os.environ[injected_delay.GUARD_ENV]), parse_levels(os.environ.get(LEVELS_ENV, "0")),
                         trials, budget, rounds)


def _engine_ms(engine, timer=time_round) -> float:
    return statistics.median(timer(engine) for _ in range(PROBE_ROUNDS))


class DelayUnreachable(RuntimeError):
    """The injected delay does not slow this test's engine: its steps hide behind what bounds it (a copy)."""


def delay_slope(measure_ms, set_delay_us=injected_delay.set_delay_us) -> tuple[float, float, float]:
    """(engine round ms undelayed, probe delay us, round ms added per us of delay): `measure_ms()` times the
    engine's round (median of a few), `set_delay_us` sets its per-step delay (this process's, or a worker's)."""
    set_delay_us(0)
    base = measure_ms()
    probe = PROBE_START_US
    while True:
        set_delay_us(probe)
        added = measure_ms() - base
        if added >= PROBE_TARGET * base:   # again: a burst of load during one measure would size the delay too small
            added = min(added, measure_ms() - base)
        if added >= PROBE_TARGET * base or probe >= PROBE_MAX_US:
            break
        probe *= 4
    set_delay_us(0)
    if added <= 0:
        raise DelayUnreachable(f"a {probe:.0f} us delay per step did not slow the engine's round of {base:.3f} ms: "
                               "its steps hide behind what bounds the round (a copy), or the delay never reaches them")
    return base, probe, added / probe


def schedule(study: StudySettings):
    """(trial, level) in the study's order: the levels rotated trial by trial, so drift within the process hits
    each alike; trials stop at the budget once MIN_TRIALS ran."""
    started = time.monotonic()
    for trial in range(study.trials):
        spent = time.monotonic() - started
        if trial >= MIN_TRIALS and study.budget_s and spent + spent / trial > study.budget_s:
            return
        shift = trial % len(study.levels)
        for level in study.levels[shift:] + study.levels[:shift]:
            yield trial, level


def file_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_") + ".json"


def run_trials(nodeid: str, workload: str, engine, references, rounds: int, study: StudySettings,
               timer: Callable = time_round) -> Path:
    """Trials of `rounds` rounds per level, written to the session's folder; the delay is 0 afterwards.

    `references`: the one the rule reads (or none, where the test measures no torch reference); `timer`: how
    the test times a round (on its session's timing core)."""
    # a calibration runs the unchanged engine only: no delay to size
    base_ms, probe_us, ms_per_us = (delay_slope(lambda: _engine_ms(engine, timer)) if any(study.levels)
                                    else (None, None, None))
    delays = {level: level * base_ms / ms_per_us if level else 0.0 for level in study.levels}
    runners = [*references, engine]    # the gate's order: references, then the engine, round by round
    samples = {runner.name: runner.samples_per_round for runner in runners}
    trials = []
    try:
        for trial, level in schedule(study):
            injected_delay.set_delay_us(delays[level])   # a device scalar: no warm-up round needed
            info = Comparison.from_times(engine.name, interleave(runners, rounds, 0, timer), samples).extra_info()
            trials.append({"trial": trial, "level": level, "delay_us": round(delays[level], 3),
                           "extra_info": {key: info[key] for key in KEPT}})
    finally:
        injected_delay.set_delay_us(0)
    record = {"fullname": nodeid, "workload": workload, "rounds": rounds, "levels": list(study.levels),
              "base_round_ms": base_ms, "probe_us": probe_us, "ms_per_us": ms_per_us, "trials": trials}
    return write_json(study.out_dir / file_name(nodeid), record)


def _paired_rounds(pair, references, rounds: int, timer: Callable) -> dict[str, list[float]]:
    """The gate's A/B order: base and references (swapping every other round), then the head; the references
    timed by `timer`, the sides in their workers."""
    runners = [pair.base, *references, pair.head]
    times: dict[str, list[float]] = {runner.name: [] for runner in runners}
    for i in range(rounds):
        order = [pair.base, *references] if i % 2 == 0 else [*references, pair.base]
        for runner in [*order, pair.head]:
            timed = getattr(runner, "timed_round", None)
            times[runner.name].append(timed() if timed is not None else timer(runner))
    return times


def run_paired_trials(nodeid: str, workload: str, pair, references, rounds: int, study: StudySettings,
                      timer: Callable = time_round) -> Path:
    """A/B trials: the head's engine slowed by each level (its worker's delay), the base's never; each trial keeps
    both sides' rounds for the A/B rule (analysis.py judges every trial alone). Both workers run the same code
    in an A/A study, so level 0 measures false alarms, the others detection."""
    head = pair.head
    base_ms, probe_us, ms_per_us = (delay_slope(lambda: statistics.median(head.timed_round() for _ in range(
        PROBE_ROUNDS)), head.set_delay_us) if any(study.levels) else (None, None, None))
    delays = {level: level * base_ms / ms_per_us if level else 0.0 for level in study.levels}
    trials = []
    try:
        for trial, level in schedule(study):
            head.set_delay_us(delays[level])
            times = _paired_rounds(pair, references, rounds, timer)
            ab = {"head_round_ms": times[head.name], "base_round_ms": times[pair.base.name],
                  "head_samples_per_round": head.samples_per_round, "base_samples_per_round": pair.base.samples_per_round}
            trials.append({"trial": trial, "level": level, "delay_us": round(delays[level], 3), "extra_info": {"ab": ab}})
    finally:
        head.set_delay_us(0)
    record = {"fullname": nodeid, "workload": workload, "rounds": rounds, "levels": list(study.levels), "mode": "A/B",
              "base_round_ms": base_ms, "probe_us": probe_us, "ms_per_us": ms_per_us, "trials": trials}
    return write_json(study.out_dir / file_name(nodeid), record)


@dataclass(frozen=True)
class Trial:
    session: int
    index: int
    level: float
    samples: RunSamples
    ab: dict | None = None   # an A/B trial's rounds, head and base (run_paired_trials)


@dataclass(frozen=True)
class TrialSet:
    """Every trial of one test across the sessions of a study or calibration."""

    fullname: str
    workload: str
    rounds: int
    trials: list[Trial]

    def at(self, level: float) -> list[Trial]:
        return [trial for trial in self.trials if trial.level == level]


def read_trials(session_dirs: list[Path]) -> dict[str, TrialSet]:
    """The trial files of each session folder, gathered per test; a malformed file names itself."""
    tests: dict[str, TrialSet] = {}
    for session, folder in enumerate(session_dirs):
        for path in sorted(Path(folder).glob("*.json")):
            record = load_json(path)
            try:
                fullname, workload, rounds = record["fullname"], record["workload"], int(record["rounds"])
                trials = [Trial(session, int(t["trial"]), float(t["level"]),
                                RunSamples.from_extra_info(t["extra_info"]), t["extra_info"].get("ab"))
                          for t in record["trials"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise JsonFileError(f"{path}: not a gatepower trial file ({exc!r})") from None
            entry = tests.setdefault(fullname, TrialSet(fullname, workload, rounds, []))
            entry.trials.extend(trials)
    return tests
