"""The one reader of stored pytest-benchmark runs: their layout, their content, the newest result of each test.

Layout (pytest-benchmark's own file format and names, so every stored run
stays readable by its tools):

    <folder>/<machine id>/NNNN_<name>.json      baselines: runs that passed the gate, or saved on purpose
    <folder>/history/<machine id>/NNNN_*.json   every other saved run (failed): kept, never compared
    <tier>/<series>/...                         a series (`slow`, `config-<toggles>`): runs with a history of their own

The gate (plugin.py), the A/A noise (aa_noise.py), the spread and the report
(report/store.py) all read runs through `parse_run`.

A test is compared with the newest baseline run that contains it, in any
machine-id folder (the machine id names the Python version, which does not
move a same-run ratio), so a run of a few tests (`-k`) never hides the
others' baselines. A run that cannot be read is returned with the reason,
so the caller can name it instead of silently skipping it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gpuengine.bench.json_files import JsonFileError, load_json
from gpuengine.bench.profile.record import PROFILES

HISTORY = "history"
GATEPOWER = "gatepower"   # ./gate gatepower's studies
# Folders inside a tier folder that hold something other than its baselines.
RESERVED = (HISTORY, "slow", GATEPOWER, "maxbatch", PROFILES)
RUN_GLOB = "[0-9][0-9][0-9][0-9]_*.json"
MACHINE_ID = re.compile(r"^[A-Za-z]+-[A-Za-z]+-\d+\.\d+-\d+bit$")  # pytest-benchmark's folder per OS/Python


@dataclass(frozen=True)
class StoredRun:
    path: Path
    label: str                    # machine id / file name: how messages name the run
    saved_at: datetime            # UTC, naive
    benchmarks: dict[str, dict]   # fullname (pytest node id) -> the stored benchmark
    machine_info: dict
    commit: str | None = None     # the commit the run measured (pytest-benchmark's commit_info), where it says
    dirty: bool = False           # commit_info's dirty: the tree had changes the commit lacks
    tier_time: dict | None = None   # the gate's gpuengine_tier_time: how long the run took, per workload
    left_out: tuple[str, ...] = ()  # benchmarks a lenient read could not take, each with why
    gate_outcome: dict | None = None   # the gate's verdict in the run (plugin.py's `gpuengine_gate`), where it has one
    branch: str | None = None     # commit_info's branch, where it says: the report's first screen names it

    def stopped_early(self, in_history: bool) -> bool:
        """Whether the run's session stopped before its tests ended (Ctrl-C), so that it is no verdict: marked so,
        or, under history/ (`in_history`), one that did not pass while none of its tests failed (the gate stored
        interrupted runs there until it stopped storing them at all)."""
        outcome = self.gate_outcome
        if outcome is None:
            return False
        return bool(outcome.get("interrupted")) or (in_history and not outcome.get("failed_otherwise")
                                                    and not outcome.get("failed_on_targets_only"))


@dataclass(frozen=True)
class UnreadableRun:
    path: Path
    label: str
    reason: str


def history_folder(folder: Path | str) -> Path:
    return Path(folder) / HISTORY


def run_files(folder: Path | str) -> list[Path]:
    """Every baseline run file of `folder`: directly in it or in a machine-id folder, not in reserved ones."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    files = list(folder.glob(RUN_GLOB))
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub.name not in RESERVED and not sub.name.startswith("config-"):
            files += sub.glob(RUN_GLOB)
    return sorted(files)


def _label(path: Path, folder: Path) -> str:
    return str(path.relative_to(folder))


def parse_run(content, path: Path, label: str, name: str | None = None, strict: bool = True) -> StoredRun:
    """A run from its file's parsed `content`, or JsonFileError naming it (as `name`, else its path) and what is
    wrong. `strict`: a benchmark that cannot be read makes the run unreadable (the gate compares every test it
    holds); else it is left out, saying why in `left_out` (the report shows the rest)."""
    name = name or str(path)
    if not isinstance(content, dict) or not isinstance(content.get("benchmarks"), list):
        raise JsonFileError(f"{name}: not a pytest-benchmark run (no \"benchmarks\" list)")
    try:
        saved_at = datetime.fromisoformat(str(content.get("datetime")))
    except ValueError:
        raise JsonFileError(f"{name}: \"datetime\" is {content.get('datetime')!r}, not an ISO date") from None
    benchmarks, left_out = {}, []
    for i, bench in enumerate(content["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("fullname"), str) \
                or not isinstance(bench.get("stats"), dict) or not isinstance(bench.get("extra_info", {}), dict):
            problem = f"{name}: benchmarks[{i}] lacks a fullname, its stats or a valid extra_info"
            if strict:
                raise JsonFileError(problem)
            left_out.append(problem)
            continue
        benchmarks[bench["fullname"]] = bench
    if saved_at.tzinfo is not None:   # pytest-benchmark writes UTC with an offset; older files may be naive UTC
        saved_at = saved_at.astimezone(timezone.utc).replace(tzinfo=None)
    commit_info = content.get("commit_info") if isinstance(content.get("commit_info"), dict) else {}
    commit, branch = commit_info.get("id"), commit_info.get("branch")
    tier_time, outcome = content.get("gpuengine_tier_time"), content.get("gpuengine_gate")
    return StoredRun(path, label, saved_at, benchmarks, content.get("machine_info") or {},
                     commit if isinstance(commit, str) and commit else None, bool(commit_info.get("dirty")),
                     tier_time if isinstance(tier_time, dict) else None, tuple(left_out),
                     gate_outcome=outcome if isinstance(outcome, dict) else None,
                     branch=branch if isinstance(branch, str) and branch else None)


def read_run(path: Path, folder: Path) -> StoredRun:
    """One stored run, or JsonFileError naming the file and what is wrong with it."""
    return parse_run(load_json(path), path, _label(path, folder))


def placement(parts: tuple[str, ...]) -> tuple[str, bool]:
    """(series, passed) of a run from the folders between its tier folder and its file: the series those
    folders name less the machine-id folder and history/ ("" for the speed runs), and whether it is a baseline."""
    series = "/".join(part for part in parts if not MACHINE_ID.match(part) and part != HISTORY)
    return series, HISTORY not in parts


def scan(folder: Path | str) -> tuple[list[StoredRun], list[UnreadableRun]]:
    """The readable baseline runs of `folder`, oldest first, and the unreadable ones with their reasons."""
    folder = Path(folder)
    runs, unreadable = [], []
    for path in run_files(folder):
        try:
            runs.append(read_run(path, folder))
        except JsonFileError as exc:
            unreadable.append(UnreadableRun(path, _label(path, folder), str(exc)))
    runs.sort(key=lambda run: (run.saved_at, run.path.name))
    return runs, unreadable


def newest_per_test(runs: list[StoredRun], usable=lambda bench: True) -> dict[str, StoredRun]:
    """For each test any run contains, the newest run containing it (`runs` oldest first, as scan returns)
    whose benchmark of it `usable` accepts (the gate: one that carries timings to compare with)."""
    newest: dict[str, StoredRun] = {}
    for run in runs:
        for fullname, bench in run.benchmarks.items():
            if usable(bench):
                newest[fullname] = run
    return newest


def runners_of(bench: dict) -> frozenset:
    """The runners a benchmark timed round by round beside each other (its median_round_ms keys): the engine
    and its references. Empty where it recorded none."""
    times = (bench.get("extra_info") or {}).get("median_round_ms")
    return frozenset(times) if isinstance(times, dict) else frozenset()


def newest_with_runners(runs: list[StoredRun], fullname: str, runners: frozenset,
                        usable=lambda bench: True) -> StoredRun | None:
    """The newest run (`runs` oldest first) whose benchmark of `fullname` `usable` accepts and that timed the
    same runners: what ran between the engine's rounds changes them, so only like is compared with like."""
    for run in reversed(runs):
        bench = run.benchmarks.get(fullname)
        if bench is not None and usable(bench) and runners_of(bench) == runners:
            return run
    return None
