"""The A/B rule's process noise, learned from the A/A runs among a GPU's stored runs.

An A/A run is an A/B run whose two sides ran the same code: the head's
and the base's `gpuengine/` and `perf_tests/`, less the gate and its
report (no round runs them), hash alike (`code_hash`, kept
in each test's `extra_info["ab"]`), whatever commits they were, on the same
stack (a stack A/B, `--against-stack`, runs one code on two locks: an A/A
run only where both locks pin the same). Every such
run, passed or failed (history/ included: leaving out the failed ones
would hide exactly the alarms), but never one whose session stopped before
its tests ended (Ctrl-C: `StoredRun.stopped_early`) or that ran beside
another A/B session of the clone, gives per test one median d = median of
log(head/base) per sample whose true value is 0, so

    E[d^2] = 2 sd_process^2 + pi/2 sd_round^2 / n

and sd_process follows from the runs' d and their rounds' spread
(gpuengine/gate/rules/paired.py uses it for the bar). With few runs the estimate
is pulled towards the prior with the weight of PRIOR_RUNS runs, as
noise.json's is (noise.py), so two runs that happen to agree cannot make a
test look steadier than it is. A GPU kind's first A/A runs start from what
the other GPU kinds' runs learned for the test (`learned_noise`), not from
the bare prior. `./gate perf --against HEAD` on a clean tree is an A/A run:
every one the gate saves sharpens the bar.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuengine.bench.machine_info import CPU_TIER
from gpuengine.gate.store.stored_runs import history_folder, scan, tier_folders

from .noise import PRIOR_RUNS
from .paired import DEFAULT_PROCESS_SD
from .significance import MEDIAN_VARIANCE_FACTOR, robust_sd

CODE_FOLDERS = ("gpuengine", "perf_tests")
# No timed round runs these (the worker script both sides run is the head's): a base that differs only there is A/A.
# gpuengine/bench/report is where the report lived in bases older than gpuengine/gate/report.
NOT_TIMED = ("gpuengine/gate", "gpuengine/bench/report")


def code_hash(root: Path) -> str:
    """sha256 of the Python sources under the checkout's gpuengine/ and perf_tests/ but NOT_TIMED (paths and
    contents)."""
    digest = hashlib.sha256()
    root = Path(root)
    untimed = tuple(f"{folder}/" for folder in NOT_TIMED)
    for folder in CODE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if "__pycache__" in path.parts or name.startswith(untimed):
                continue
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class AaRun:
    """One A/A run of one test."""

    median: float      # median log(head/base) per sample
    round_sd: float    # robust sd of the per-round log ratios
    rounds: int

    @classmethod
    def from_record(cls, ab: dict) -> "AaRun | None":
        """From a test's extra_info["ab"]; None unless both sides ran the same code on the same stack, with no
        other A/B session of the clone running beside them (its rounds would be in this run's offset)."""
        if not ab.get("head_code") or ab.get("head_code") != ab.get("base_code") or ab.get("other_sessions"):
            return None
        if _lock_id(ab.get("head_lock")) != _lock_id(ab.get("base_lock")):   # a stack A/B: the stack changed
            return None
        head, base = np.asarray(ab["head_round_ms"], float), np.asarray(ab["base_round_ms"], float)
        if len(head) != len(base) or len(head) < 2 or min(head.min(), base.min()) <= 0:
            return None
        d = np.log(head / ab["head_samples_per_round"]) - np.log(base / ab["base_samples_per_round"])
        return cls(float(np.median(d)), robust_sd(d), len(d))


def _lock_id(record) -> str | None:
    """The lock a side of a stack A/B ran on (extra_info["ab"]'s base_lock, head_lock); None in a code A/B."""
    return record.get("sha256") if isinstance(record, dict) else None


@dataclass(frozen=True)
class ProcessNoise:
    sd: float
    runs: int
    prior: str   # where the prior came from: the bare one, or the other GPU kinds' A/A runs

    def source(self) -> str:
        return f"A/A: process offset {self.sd:.2%} from {self.runs} run(s) and {self.prior}"


def learn(runs: list[AaRun], prior: float = DEFAULT_PROCESS_SD, prior_runs: int = PRIOR_RUNS,
          prior_source: str | None = None) -> ProcessNoise:
    """sd_process of one test from its A/A runs, shrunk towards `prior`. Each run's excess over its rounds' own
    spread counts from 0 up: one run of noisy rounds would otherwise cancel the offsets the quiet runs showed
    (H100: the eager CNN's runs of +3.8% and -10.4% learned as 0.18% beside one such run), so the estimate
    leans high, towards fewer false alarms."""
    said = prior_source or f"the {prior:.1%} prior"
    if not runs:
        return ProcessNoise(prior, 0, said)
    excess = [max(0.0, run.median ** 2 - MEDIAN_VARIANCE_FACTOR * run.round_sd ** 2 / run.rounds) for run in runs]
    estimate = float(np.mean(excess)) / 2
    return ProcessNoise(math.sqrt((len(runs) * estimate + prior_runs * prior ** 2) / (len(runs) + prior_runs)),
                        len(runs), said)


def learned_noise(tier_folder: Path) -> dict[str, ProcessNoise]:
    """Each test's process offset on this GPU kind, from its A/A runs here, shrunk towards what the other GPU
    kinds' A/A runs learned for the test (their sd as the prior), else towards DEFAULT_PROCESS_SD. A launch-bound
    test's offset between two processes is the host's as much as the GPU's: on four H200s with no A/A run yet,
    MLP inference fp32 b512 was called +2.5% slower against the 0.5% prior (80df8bc), the test whose H100 A/A
    runs show offsets of 3.6-3.8%."""
    tier_folder = Path(tier_folder).resolve()
    elsewhere: dict[str, list[AaRun]] = {}
    kinds: dict[str, set[str]] = {}
    for other in tier_folders(tier_folder.parent):
        if other == tier_folder or other.name == CPU_TIER:
            continue
        for test, runs in stored_aa_runs(other).items():
            elsewhere.setdefault(test, []).extend(runs)
            kinds.setdefault(test, set()).add(other.name)
    own = stored_aa_runs(tier_folder)
    learned = {}
    for test in sorted(set(own) | set(elsewhere)):
        prior, said = DEFAULT_PROCESS_SD, None
        if test in elsewhere:
            prior = learn(elsewhere[test]).sd
            said = (f"a {prior:.2%} prior from {len(elsewhere[test])} A/A run(s) on "
                    f"{', '.join(sorted(kinds[test]))}")
        learned[test] = learn(own.get(test, []), prior, prior_source=said)
    return learned


def stored_aa_runs(tier_folder: Path) -> dict[str, list[AaRun]]:
    """Per test name (with its case id), the A/A runs among every stored run of the tier, history included, less
    those whose session was interrupted. An unreadable file is left out here: the gate names it where it reads
    baselines."""
    found: dict[str, list[AaRun]] = {}
    for in_history, folder in ((False, tier_folder), (True, history_folder(tier_folder))):
        for stored in scan(folder)[0]:
            if stored.stopped_early(in_history):
                continue
            for fullname, bench in stored.benchmarks.items():
                ab = (bench.get("extra_info") or {}).get("ab")
                run = AaRun.from_record(ab) if isinstance(ab, dict) else None
                if run is not None:
                    found.setdefault(fullname, []).append(run)
    return found
