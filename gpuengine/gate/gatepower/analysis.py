"""The gate's power per test, from study trials: false-alarm rate, detection rates, smallest slowdown caught.

Every unchanged trial (level 0) serves as a stored baseline; every trial of
another session serves as the run under test, exactly as the gate would judge
it (regression.decide with the test's noise.json entry). With one session
only, trials of the same process are paired instead, which understates
run-to-run noise; the result says so. Pairs share trials, so they are not
independent: the rates are descriptive, with the number of pairs and sessions
stated next to them. The smallest slowdown caught 95% of the time is read two
ways: the smallest injected level detected in >= 95% of its pairs, and the
rule's own model (regression.detectable_slowdown) at the noise of the
unchanged trials measured here (noise.signal_noise).
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from gpuengine.gate.rules import paired
from gpuengine.gate.rules.aa_noise import ProcessNoise
from gpuengine.gate.rules.noise import NoiseTable, signal_noise
from gpuengine.gate.rules.regression import ALPHA, GOAL_POWER, GOAL_SLOWDOWN, decide, detectable_slowdown
from gpuengine.gate.rules.verdicts import REGRESSED
from .trials import Trial, TrialSet

ACROSS, WITHIN = "across sessions", "within one session (understates run-to-run noise)"
UNREACHED = 0.5   # a level whose injected delay slowed the head by less than half of it was not reached
PAIRED = "A/B: each trial judged alone, head against base in its session (trials of a session share its processes)"


def level_key(level: float) -> str:
    return f"{round(level * 100, 3):g}pct"


def _pairs(baselines: list[Trial], currents: list[Trial], across: bool) -> list[tuple[Trial, Trial]]:
    return [(b, c) for b in baselines for c in currents
            if (b.session != c.session if across else b is not c)]


def _signal(trial: Trial) -> np.ndarray:
    return trial.samples.ratio_cost if trial.samples.ratio_cost is not None else trial.samples.time_cost


def _achieved(test: TrialSet, level: float) -> float | None:
    """Median over sessions of the engine's time at `level` over its time unchanged, in the same session."""
    shifts = []
    if any(t.samples.time_cost is None for t in test.trials):
        return None
    for session in sorted({t.session for t in test.trials}):
        base = [float(np.median(t.samples.time_cost)) for t in test.at(0.0) if t.session == session]
        slow = [float(np.median(t.samples.time_cost)) for t in test.at(level) if t.session == session]
        if base and slow:
            shifts.append(math.expm1(statistics.median(slow) - statistics.median(base)))
    return round(statistics.median(shifts), 4) if shifts else None


def analyse_paired_test(test: TrialSet, process: ProcessNoise | None) -> dict:
    """The figures of an A/B study's test: every trial judged alone, head against base in its own session, with
    the bar the gate would use (`process`: learned from the stored A/A runs)."""
    levels = sorted({t.level for t in test.trials})
    entry: dict = {"workload": test.workload, "rounds": test.rounds, "sessions": len({t.session for t in test.trials}),
                   "pairing": PAIRED, "noise": process.source() if process else "A/A not calibrated: the prior"}
    detection: dict[float, float] = {}
    for level in levels:
        decisions = [paired.decide_paired(t.ab["head_round_ms"], t.ab["base_round_ms"],
                                          head_samples=t.ab["head_samples_per_round"],
                                          base_samples=t.ab["base_samples_per_round"],
                                          process_sd=process.sd if process else None,
                                          source=process.source() if process else None) for t in test.at(level)]
        rate = sum(d.verdict == REGRESSED for d in decisions) / len(decisions)
        entry.setdefault("pairs", {})[level_key(level)] = len(decisions)
        entry.setdefault("median_slowdown", {})[level_key(level)] = round(statistics.median(
            d.slowdown for d in decisions), 4)
        if level == 0:
            entry["false_alarm_rate"] = round(rate, 4)
        else:
            detection[level] = rate
            entry[f"detection_rate_{level_key(level)}"] = round(rate, 4)
    caught = [level for level, rate in sorted(detection.items()) if rate >= GOAL_POWER]
    entry["smallest_detected_95pct"] = caught[0] if caught else None
    entry["smallest_detectable_95pct_model"] = None
    entry["meets_targets"] = (None if GOAL_SLOWDOWN not in detection or "false_alarm_rate" not in entry
                              else entry["false_alarm_rate"] <= paired.ALPHA
                              and detection[GOAL_SLOWDOWN] >= GOAL_POWER)
    achieved = entry["median_slowdown"].get(level_key(GOAL_SLOWDOWN))
    if entry["meets_targets"] is False and achieved is not None and achieved < UNREACHED * GOAL_SLOWDOWN:
        entry["meets_targets"] = None   # the study could not make the engine that much slower: no verdict
        entry["not_reached"] = (f"the injected delay made the head {achieved:.1%} slower at the "
                                f"{GOAL_SLOWDOWN:.0%} level: the step's compute hides behind what bounds the "
                                "case (a copy), so this injection cannot test the gate's power here")
    return entry


def analyse_test(test: TrialSet, noise: NoiseTable, process: ProcessNoise | None = None) -> dict:
    """The study's figures for one test (the JSON entry under "tests")."""
    if test.trials and all(t.ab is not None for t in test.trials):
        return analyse_paired_test(test, process)
    levels = sorted({t.level for t in test.trials})
    across = len({t.session for t in test.trials}) > 1
    baselines = test.at(0.0)
    if not baselines:
        raise ValueError(f"{test.fullname}: no unchanged (level 0) trial to serve as a baseline")
    noise_levels = noise.levels(test.fullname)
    entry: dict = {"workload": test.workload, "rounds": test.rounds, "pairing": ACROSS if across else WITHIN,
                   "noise": noise_levels.source}
    detection: dict[float, float] = {}
    for level in levels:
        pairs = _pairs(baselines, test.at(level), across)
        if not pairs:
            raise ValueError(f"{test.fullname}: no pair of trials at {level_key(level)} (one trial per level and "
                             "one session: run more trials or sessions)")
        flagged = sum(decide(c.samples, b.samples, noise_levels).verdict == REGRESSED for b, c in pairs)
        rate = flagged / len(pairs)
        if level == 0:
            entry["false_alarm_rate"] = round(rate, 4)
        else:
            detection[level] = rate
            entry[f"detection_rate_{level_key(level)}"] = round(rate, 4)
            entry.setdefault("achieved_slowdown", {})[level_key(level)] = _achieved(test, level)
        entry.setdefault("pairs", {})[level_key(level)] = len(pairs)
    caught = [level for level, rate in sorted(detection.items()) if rate >= GOAL_POWER]
    entry["smallest_detected_95pct"] = caught[0] if caught else None
    sessions = sorted({t.session for t in baselines})
    measured = signal_noise([[_signal(t) for t in baselines if t.session == s] for s in sessions], test.rounds)
    entry["observed_run_to_run_sd"] = round(measured.observed_run_sd, 5)
    model = detectable_slowdown(measured.between_run_sd, measured.round_sd, test.rounds)
    entry["smallest_detectable_95pct_model"] = None if math.isinf(model) else round(model, 4)   # None: never
    entry["meets_targets"] = (None if GOAL_SLOWDOWN not in detection   # None: the 5% level was not run
                              else entry["false_alarm_rate"] <= ALPHA and detection[GOAL_SLOWDOWN] >= GOAL_POWER)
    return entry


def summarise_families(tests: dict[str, dict]) -> dict[str, dict]:
    """Per workload: the worst false-alarm rate and the lowest detection rates of its tests."""
    families: dict[str, dict] = {}
    for entry in tests.values():
        family = families.setdefault(entry["workload"], {"tests": 0})
        family["tests"] += 1
        for key, value in entry.items():
            if key == "false_alarm_rate":
                family[key] = max(family.get(key, 0.0), value)
            elif key.startswith("detection_rate_"):
                family[key] = min(family.get(key, 1.0), value)
        if entry["meets_targets"] is not None:
            family["meets_targets"] = family.get("meets_targets", True) and entry["meets_targets"]
    return families


def _percent(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def format_table(tests: dict[str, dict]) -> str:
    """A plain-text table: one line per test, its false-alarm and detection rates."""
    keys = sorted({k for e in tests.values() for k in e if k.startswith("detection_rate_")},
                  key=lambda k: float(k[len("detection_rate_"):-3]))
    header = ["test", "false alarms"] + [k[len("detection_rate_"):].replace("pct", "%") + " caught" for k in keys] + [
        "smallest @95% (tested / model)", "targets"]
    rows = [header]
    for name, e in sorted(tests.items()):
        smallest = e["smallest_detected_95pct"]
        rows.append([name.split("::")[-1], f"{e['false_alarm_rate']:.1%} of {e['pairs'].get('0pct', 0)}"]
                    + [f"{e[k]:.0%}" for k in keys]
                    + [f"{_percent(smallest, 0)} / {_percent(e['smallest_detectable_95pct_model'], 1)}",
                       "not reached" if e.get("not_reached") else
                       {True: "met", False: "missed", None: "5% not run"}[e["meets_targets"]]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
