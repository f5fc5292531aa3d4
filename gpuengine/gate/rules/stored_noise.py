"""The stored-run rule's run-to-run noise, learned from stored runs of the same code.

Stored-run mode compares this run's rounds with a baseline run's: two
processes, often two machines. Rounds of one process agree far better than
runs of two, so the rule needs each test's run-to-run sd
(regression.py's `between_run_sd`). `./gate gatepower
calibrate` measures it on one machine (noise.json); without it the rule used
a 1% prior, and on H100 that prior flagged 10 of 198 comparisons of stored
runs whose engine code was the same (5%, against the rule's 1%).

Every stored run already is such a measurement: runs of the same code (the
head's code hash an A/B record keeps, else a clean commit) on the same lock
differ only by process and machine. Per test and signal, the medians of
each group's runs give the one-way analysis of variance's within-group
variance (noise.py's model), less what the rounds' own spread puts in a
median, shrunk towards the prior with PRIOR_RUNS runs' weight. Failed runs
(history/) count too: leaving them out would hide exactly the alarms.
On the H100 store at df9dab9, learning from every other group, the false
"regressed" fell from 10 to 1 of 198 same-code comparisons.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from gpuengine.bench.stack_lock import StackId, stack_of
from gpuengine.gate.store.stored_runs import StoredRun, history_folder, scan

from .noise import PRIOR_RUNS
from .regression import DEFAULT_BETWEEN_RUN_SD, NoiseLevels, RunSamples
from .significance import MEDIAN_VARIANCE_FACTOR, robust_sd


def same_code_groups(runs: list[StoredRun]) -> list[list[StoredRun]]:
    """The runs grouped by the engine code they timed: an A/B run's head code hash, carried over to every run of
    its commit; else the commit where the tree was clean. A dirty run without a hash is in no group."""
    code_of_commit = {}
    for run in runs:
        for bench in run.benchmarks.values():
            ab = (bench.get("extra_info") or {}).get("ab")
            if isinstance(ab, dict) and ab.get("head_code") and run.commit:
                code_of_commit[run.commit] = ab["head_code"]
    groups: dict[str, list[StoredRun]] = defaultdict(list)
    for run in runs:
        if run.commit in code_of_commit:
            groups["code " + code_of_commit[run.commit]].append(run)
        elif run.commit and not run.dirty:
            groups["commit " + run.commit].append(run)
    return [group for group in groups.values() if len(group) >= 2]


def _medians(group: list[StoredRun], test: str, signal: str, reference: str | None) -> list[tuple[float, float]]:
    """(median, its variance from the rounds' spread) of each run of the group that timed `test`'s `signal`."""
    found = []
    for run in group:
        bench = run.benchmarks.get(test)
        if bench is None:
            continue
        samples = RunSamples.from_extra_info(bench.get("extra_info") or {}, reference)
        cost = samples.ratio_cost if signal == "ratio" else samples.time_cost
        if cost is not None and len(cost) >= 2:
            found.append((float(np.median(cost)), MEDIAN_VARIANCE_FACTOR * robust_sd(cost) ** 2 / len(cost)))
    return found


def between_run_sd(groups: list[list[StoredRun]], test: str, signal: str,
                   reference: str | None = None) -> tuple[float, int]:
    """One signal's run-to-run sd (log units) of `test` from its same-code groups, shrunk towards the prior, and
    the degrees of freedom it rests on (0: the prior alone)."""
    squares, dof, median_var = 0.0, 0, []
    for group in groups:
        found = _medians(group, test, signal, reference)
        if len(found) < 2:
            continue
        medians = np.array([median for median, _ in found])
        squares += float(np.sum((medians - medians.mean()) ** 2))
        dof += len(found) - 1
        median_var += [var for _, var in found]
    if not dof:
        return DEFAULT_BETWEEN_RUN_SD, 0
    between = max(0.0, squares / dof - float(np.mean(median_var)))
    return math.sqrt((dof * between + PRIOR_RUNS * DEFAULT_BETWEEN_RUN_SD ** 2) / (dof + PRIOR_RUNS)), dof


class StoredNoise:
    """Per test, the run-to-run noise its stored runs of one lock show; the prior where they show none."""

    def __init__(self, runs: list[StoredRun]):
        self.groups = same_code_groups(runs)
        self.runs = sum(len(group) for group in self.groups)
        self._levels: dict[tuple[str, str | None], NoiseLevels] = {}

    @classmethod
    def of_tier(cls, tier_folder: Path | str, stack: StackId) -> "StoredNoise":
        """From the tier folder's baselines and history/ of the lock `stack` (unreadable files are left out here:
        the gate names them where it reads baselines)."""
        runs = scan(tier_folder)[0] + scan(history_folder(tier_folder))[0]
        return cls([run for run in runs if stack_of(run.machine_info) == stack])

    def levels(self, test: str, reference: str | None = None) -> NoiseLevels:
        key = (test, reference)
        if key not in self._levels:
            ratio, ratio_dof = between_run_sd(self.groups, test, "ratio", reference)
            time, time_dof = between_run_sd(self.groups, test, "time")
            dof = max(ratio_dof, time_dof)
            if not dof:
                self._levels[key] = NoiseLevels.uncalibrated()
            else:
                shown = ratio if ratio_dof else time
                self._levels[key] = NoiseLevels(
                    ratio, time, f"stored runs: run-to-run {shown:.1%} from {dof} degree(s) of freedom in runs of "
                                 f"the same code on this lock and the {DEFAULT_BETWEEN_RUN_SD:.1%} prior")
        return self._levels[key]
