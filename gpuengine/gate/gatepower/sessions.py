"""The pytest sessions of a gatepower study or calibration: one process each, as separate gate runs are.

Each session runs the selected perf tests of this checkout with the study's
variables set (trials.py reads them): the guard, which is also the session's
output folder, the injected delay (0 to start), the levels, trials and rounds.
Separate processes matter: run-to-run noise (allocation, clocks, placement)
is larger than the noise between trials of one process, and the gate compares
runs of separate processes. A time budget stops starting sessions once the
next one, as long as the last, would overrun it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuengine.bench import injected_delay
from .trials import BUDGET_ENV, LEVELS_ENV, ROUNDS_ENV, TRIALS_ENV

REPO = Path(__file__).resolve().parents[3]   # the package is installed editable (./gate, tox): the checkout


@dataclass(frozen=True)
class SessionPlan:
    """What every session of one study or calibration runs."""

    marker: str                 # pytest -m expression
    keyword: str | None         # pytest -k expression
    levels_pct: str             # "0,5,10"
    trials: int                 # at most, per test and session
    trial_budget_s: float       # seconds of trials per test and session (at least two trials run)
    rounds: int | None          # None: the gate's own rounds (noise.json, budget)
    full: bool                  # the nightly tier's cases and rounds
    noise_file: Path
    timeout_s: float | None
    against: str = "none"       # A/B: the base each session checks out (gate/ab/checkout.py); none: stored-run

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "pytest", "perf_tests", "-p", "no:cacheprovider", "-q", "-rfEs",
                "--benchmark-disable", "-m", self.marker, "--noise-file", str(self.noise_file)]
        if self.keyword:
            args += ["-k", self.keyword]
        return args + (["--full"] if self.full else []) + ["--against", self.against]

    def environment(self, out_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ROUNDS_ENV}
        env.update({injected_delay.GUARD_ENV: str(out_dir), injected_delay.DELAY_ENV: "0",
                    LEVELS_ENV: self.levels_pct, TRIALS_ENV: str(self.trials), BUDGET_ENV: str(self.trial_budget_s)})
        if self.rounds is not None:
            env[ROUNDS_ENV] = str(self.rounds)
        return env


@dataclass(frozen=True)
class SessionResult:
    index: int
    out_dir: Path
    returncode: int | None   # None: a kept session read back (--from-trials), how it ended is in its log
    seconds: float
    log: Path


def _session_dir(work_dir: Path, index: int) -> Path:
    return work_dir / f"session-{index}"


def kept_sessions(work_dir: Path) -> list[SessionResult]:
    """The sessions run_sessions left in `work_dir` (their session-N folders, in order), read back as results
    whose returncode is unknown (None)."""
    indices = sorted(int(p.name[len("session-"):]) for p in Path(work_dir).glob("session-*")
                     if p.is_dir() and p.name[len("session-"):].isdigit())
    return [SessionResult(i, _session_dir(work_dir, i), None, 0.0, _session_dir(work_dir, i).with_suffix(".log"))
            for i in indices]


def run_sessions(plan: SessionPlan, sessions: int, work_dir: Path, budget_s: float | None = None,
                 log: Callable[[str], None] = lambda line: None) -> list[SessionResult]:
    """Up to `sessions` sessions, one after another, each writing its trials to work_dir/session-N/."""
    if not (REPO / "perf_tests").is_dir():
        raise FileNotFoundError(f"{REPO} has no perf_tests/: gatepower runs from a checkout of the repository")
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {sessions}")
    results: list[SessionResult] = []
    started = time.monotonic()
    for index in range(1, sessions + 1):
        elapsed = time.monotonic() - started
        if results and budget_s is not None and elapsed + results[-1].seconds > budget_s:
            log(f"gatepower: time budget {budget_s:.0f} s reached after {len(results)} sessions ({elapsed:.0f} s)")
            break
        out_dir = _session_dir(work_dir, index)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = out_dir.with_suffix(".log")
        log(f"gatepower: session {index}/{sessions}: {' '.join(plan.command()[1:])}")
        begin = time.monotonic()
        with open(log_path, "w") as out:
            try:
                code = subprocess.run(plan.command(), cwd=REPO, env=plan.environment(out_dir), stdout=out,
                                      stderr=subprocess.STDOUT, timeout=plan.timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = -1
                out.write(f"\ngatepower: session stopped after {plan.timeout_s} s (--session-timeout)\n")
        results.append(SessionResult(index, out_dir, code, time.monotonic() - begin, log_path))
        log(f"gatepower: session {index} finished with status {code} in {results[-1].seconds:.0f} s "
            f"({len(list(out_dir.glob('*.json')))} tests), log {log_path}")
    return results
