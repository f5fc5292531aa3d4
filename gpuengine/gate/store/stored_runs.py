"""The one reader of the store: its layout, a run's content, a tier's files, the newest result of each test.

Layout (pytest-benchmark's own file format and names, so every stored run
stays readable by its tools):

    <folder>/<machine id>/NNNN_<name>.json      baselines: runs that passed the gate, or saved on purpose
    <folder>/history/<machine id>/NNNN_*.json   every other saved run (failed): kept, never compared
    <tier>/<series>/...                         a series (`slow`, `config-<toggles>`): runs with a history of their own
    <tier>/maxbatch/*.json, <tier>/profiles/    max-batch tables, kernel profiles
    <tier>/gatepower|plan_stability|toggle_cost|logs/, noise.json, cudnn_plans.json   records: no results

The gate (plugin.py), the A/A noise (aa_noise.py), the spread and the
change points read a folder's baselines through `scan`; the report reads
every file of a tier through `read_tier`; both parse a run with `parse_run`.
(gpuengine/gate/store/run_storage.py is the one writer.)

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

from gpuengine.bench.cudnn_plans import PLAN_FILE
from gpuengine.bench.json_files import JsonFileError, load_json
from gpuengine.bench.profile.record import PROFILES, StoredProfile, read_profile

HISTORY = "history"
GATEPOWER = "gatepower"            # ./gate gatepower's studies
PLAN_STABILITY = "plan_stability"  # ./gate plans' records
TOGGLE_COST = "toggle_cost"        # ./gate toggle-cost's records
LOGS = "logs"                      # GPU sessions' logs, and records of scripts/ such as bn_layers.py's
NOISE_FILE = "noise.json"          # ./gate gatepower calibrate's noise levels (gate/rules/noise.py)
RECORD_FOLDERS = frozenset({GATEPOWER, PLAN_STABILITY, TOGGLE_COST, LOGS})   # records, not results
MAXBATCH_KEYS = {"workload", "mode", "engine", "reference", "ratio", "engine_search", "reference_search"}
# Folders inside a tier folder that hold something other than its baselines.
RESERVED = (HISTORY, "slow", "maxbatch", PROFILES, *sorted(RECORD_FOLDERS))
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


@dataclass(frozen=True)
class MaxBatchTable:
    """A `python -m gpuengine maxbatch --json` file: one row per (mode, engine variant, reference)."""

    path: Path   # relative to the store
    rows: list[dict]


@dataclass
class TierFiles:
    """Every result a tier folder holds, read: its runs (baselines and history/, every series; each run's label
    its path relative to the store), kernel profiles and max-batch tables; and each file left out, with why."""

    runs: list[StoredRun]
    profiles: list[StoredProfile]
    maxbatch_tables: list[MaxBatchTable]
    skipped: list[str]


def tier_folders(store: Path | str) -> list[Path]:
    """The tier folders of a store (one per GPU kind, and the CPU tier's), by name; none where it is missing."""
    store = Path(store)
    return sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")) if store.is_dir() else []


def read_tier(folder: Path | str, store: Path | str) -> TierFiles:
    """Every file of the tier `folder` of `store`, leniently: a file that does not parse, or is none of a run, a
    profile and a max-batch table, is left out with its reason; a run's unreadable benchmarks are left out (its
    `left_out`), the rest kept."""
    folder, store = Path(folder), Path(store)
    tier = TierFiles([], [], [], [])
    for file in sorted(folder.rglob("*.json")):
        rel = file.relative_to(store)
        if rel.name in (NOISE_FILE, PLAN_FILE) or RECORD_FOLDERS & set(rel.parts):
            continue
        try:
            data = load_json(file, str(rel))
            if PROFILES in rel.parts[1:-1]:
                tier.profiles.append(read_profile(data, rel))
            elif isinstance(data, list) and data and all(isinstance(r, dict) and MAXBATCH_KEYS <= set(r)
                                                         for r in data):
                tier.maxbatch_tables.append(MaxBatchTable(rel, data))
            elif isinstance(data, dict):
                tier.runs.append(parse_run(data, file, str(rel), str(rel), strict=False))
            else:
                tier.skipped.append(f"{rel}: neither a pytest-benchmark run nor a maxbatch table; skipped")
        except JsonFileError as exc:
            tier.skipped.append(f"{exc}; skipped")
    tier.profiles.sort(key=lambda profile: (profile.recorded_at, str(profile.path)))
    return tier


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
