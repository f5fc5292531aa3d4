"""The report's view of `baselines_store/`: every tier's runs, tables and profiles, and what was left out, with why.

`gpuengine.gate.store.stored_runs` reads the files (`read_tier`: the one reader
of the store and its layout); this module makes the report's view of them.
A table shows the newest measurement of each test, whichever run it came
from, and a measurement of a failed run (`Run.passed` false, kept under
history/) says so next to the baseline in force, the newest passing run of
that test (`TierRuns.baseline_of`). A run's benchmarks carry pytest-benchmark's
`stats` and the suite's `extra_info` (`gpuengine.bench.benchmarking.Comparison.extra_info`
plus what a test adds); one without `extra_info` is left out with its reason.
Only a missing store is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gpuengine.bench.machine_info import CPU_TIER
from gpuengine.bench.profile.record import StoredProfile
from gpuengine.bench.thresholds import ThresholdRule, load_rules, wildcard_match
from gpuengine.gate.store.stored_runs import HISTORY, MaxBatchTable, StoredRun, placement, read_tier, tier_folders

ENGINE = "gpuengine"
THRESHOLDS_FILE = "thresholds.json"
HARNESS_SELF_TEST = "perf_tests/test_harness_smoke.py::"   # stand-in runners, stored by older runs: no workload


class ReportError(Exception):
    """Input the report cannot be built from at all; the message names it."""


@dataclass(frozen=True)
class Benchmark:
    """One test of one run: pytest-benchmark's engine median and the suite's extra_info."""

    name: str                # test name with its parameter id, e.g. test_mlp_train[tf32-graph8-resident-bpe1]
    median_s: float | None   # the engine's median round, what --benchmark-compare gates
    info: dict

    @property
    def function(self) -> str:
        return self.name.split("[", 1)[0]

    @property
    def case(self) -> str:
        """The parameter id alone ('' for an unparametrised test)."""
        return self.name[len(self.function) + 1:-1] if "[" in self.name else ""

    @property
    def precision(self) -> str | None:
        return self.info.get("precision")

    @property
    def samples_per_s(self) -> dict:
        return self.info.get("samples_per_s") or {}

    @property
    def ratios(self) -> dict:
        return self.info.get("ratios") or {}

    @property
    def engine(self) -> str:
        """The runner whose rounds are the benchmark: the one every ratio is taken against."""
        others = [name for name in self.samples_per_s if name not in self.ratios]
        return others[0] if len(others) == 1 else ENGINE

    def throughput(self, runner: str) -> float | None:
        return self.samples_per_s.get(runner)

    def ratio(self, reference: str) -> dict | None:
        """{"median", "low", "high", "spread", ...} of the engine's speed-up over `reference`."""
        return self.ratios.get(reference)


@dataclass(frozen=True)
class Run:
    """One stored pytest-benchmark run."""

    path: Path          # relative to the store
    tier: str
    series: str         # "" for the speed runs; "slow", "config-..." for folders with a history of their own
    number: str         # pytest-benchmark's NNNN counter
    commit: str
    dirty: bool
    when: datetime
    machine: dict
    benchmarks: dict[str, Benchmark]
    tier_time: dict | None = None   # the gate's gpuengine_tier_time: how long the run took, per workload
    passed: bool = True   # False: the run failed the gate and was kept under history/, not as a baseline
    branch: str | None = None   # the branch the run measured, where its commit_info says

    @property
    def short_commit(self) -> str:
        return self.commit[:7] or "no commit"

    @property
    def label(self) -> str:
        """'0004 2bc2b0d' for a baseline, 'history/0001 3e3eb3d' for a failed run (numbered apart)."""
        folder = "" if self.passed else f"{HISTORY}/"
        return f"{folder}{self.number} {self.short_commit}{'+dirty' if self.dirty else ''}"

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed run"

    def check(self, name: str) -> str | None:
        """What the gate's stored-run check said of test `name` in this run ('regressed', ...), if it ran."""
        check = self.benchmarks[name].info.get("stored_run_check") if name in self.benchmarks else None
        return check.get("verdict") if isinstance(check, dict) else None

    @property
    def date(self) -> str:
        return self.when.strftime("%Y-%m-%d %H:%M")


@dataclass
class TierRuns:
    """Every run of one tier, oldest first."""

    name: str
    runs: list[Run] = field(default_factory=list)
    maxbatch_tables: list[MaxBatchTable] = field(default_factory=list)
    profiles: list[StoredProfile] = field(default_factory=list)   # oldest first

    @property
    def on_gpu(self) -> bool:
        """As the runs recorded it (machine_info's tier), else by the folder's name."""
        recorded = next((run.machine["tier"] for run in reversed(self.runs) if run.machine.get("tier")), None)
        return (recorded or self.name) != CPU_TIER

    @property
    def title(self) -> str:
        return self.gpu if self.on_gpu else "CPU tier (NumPy backend)"

    @property
    def gpu(self) -> str:
        """The GPU's name as its newest run recorded it (the tier's folder name if none did)."""
        for run in reversed(self.runs):
            if run.machine.get("gpu"):
                return run.machine["gpu"]
        return self.profiles[-1].gpu if self.profiles else self.name

    def series(self) -> dict[str, list[Run]]:
        grouped: dict[str, list[Run]] = {}
        for run in self.runs:
            grouped.setdefault(run.series, []).append(run)
        return grouped

    @property
    def failed_runs(self) -> list[Run]:
        return [run for run in self.runs if not run.passed]

    def find(self, pattern: str, precision: str | None = None,
             keep=lambda bench: True) -> tuple[Run, Benchmark] | None:
        """The newest run, passed or failed, holding a test that matches `pattern` (`*`, `?`) and that `keep`
        accepts; of its matches, the fastest engine."""
        for run in reversed(self.runs):
            matches = [b for b in run.benchmarks.values() if wildcard_match(pattern, b.name)
                       and (precision is None or b.precision == precision) and keep(b)]
            if matches:
                return run, max(matches, key=lambda b: b.throughput(b.engine) or 0.0)
        return None

    def newest(self, keep=lambda bench: True) -> list[tuple[Run, Benchmark]]:
        """The newest measurement of every test that `keep` accepts, whichever run (passed or failed) holds it:
        the newest run's tests in its order, then tests only older runs hold."""
        found: dict[str, tuple[Run, Benchmark]] = {}
        for run in reversed(self.runs):
            for bench in run.benchmarks.values():
                if bench.name not in found and keep(bench):
                    found[bench.name] = (run, bench)
        return list(found.values())

    def baseline_of(self, run: Run, bench: Benchmark) -> tuple[Run, Benchmark] | None:
        """The baseline in force for `bench` as `run` measured it: the newest passing run of the same series
        holding that test, as the gate compares with (`run` itself when it passed); None if there is none."""
        if run.passed:
            return run, bench
        for other in reversed(self.runs):
            if other.passed and other.series == run.series and bench.name in other.benchmarks:
                return other, other.benchmarks[bench.name]
        return None


@dataclass
class Store:
    path: Path
    tiers: list[TierRuns]   # GPU tiers by name, then the CPU tier
    rules: list[ThresholdRule]
    skipped: list[str]      # "<file>: <why>" for everything read and left out

    @property
    def run_count(self) -> int:
        return sum(len(tier.runs) for tier in self.tiers)

    @property
    def failed_count(self) -> int:
        return sum(len(tier.failed_runs) for tier in self.tiers)


def _benchmarks(entries, where: str, skipped: list[str]) -> dict[str, Benchmark]:
    benchmarks = {}
    for entry in entries:
        name = entry.get("name")
        if not isinstance(name, str):
            skipped.append(f"{where}: {entry['fullname']} has no 'name'; left out")
            continue
        if str(entry.get("fullname", "")).startswith(HARNESS_SELF_TEST):
            skipped.append(f"{where}: {name} is the harness's self-test with stand-in runners, not a workload; "
                           "left out")
            continue
        info = entry.get("extra_info")
        if not isinstance(info, dict) or not info:
            skipped.append(f"{where}: {name} has no extra_info; left out")
            continue
        median = (entry.get("stats") or {}).get("median")
        benchmarks[name] = Benchmark(name, median if isinstance(median, (int, float)) else None, info)
    return benchmarks


def _run(stored: StoredRun, rel: Path, tier: str, skipped: list[str]) -> Run | None:
    """The report's view of a run read by stored_runs.parse_run."""
    where = str(rel)
    skipped.extend(f"{problem}; left out" for problem in stored.left_out)
    benchmarks = _benchmarks(stored.benchmarks.values(), where, skipped)
    if not benchmarks:
        skipped.append(f"{where}: no benchmark carries extra_info (another tool's pytest-benchmark file?); skipped")
        return None
    series, passed = placement(rel.parts[1:-1])
    return Run(rel, tier, series, rel.name.split("_", 1)[0], stored.commit or "", stored.dirty, stored.saved_at,
               stored.machine_info, benchmarks, stored.tier_time, passed=passed, branch=stored.branch)


def _read_tier(store: Path, folder: Path, skipped: list[str]) -> TierRuns:
    files = read_tier(folder, store)
    skipped.extend(files.skipped)
    tier = TierRuns(folder.name, maxbatch_tables=files.maxbatch_tables, profiles=files.profiles)
    for stored in files.runs:
        run = _run(stored, stored.path.relative_to(store), tier.name, skipped)
        if run is not None:
            tier.runs.append(run)
    tier.runs.sort(key=lambda run: (run.when, str(run.path)))
    return tier


def _rules(store: Path, skipped: list[str]) -> list[ThresholdRule]:
    path = store / THRESHOLDS_FILE
    if not path.exists():
        skipped.append(f"{THRESHOLDS_FILE}: not in the store; no thresholds drawn")
        return []
    try:
        return load_rules(path)
    except (ValueError, TypeError) as exc:   # json.JSONDecodeError is a ValueError
        skipped.append(f"{THRESHOLDS_FILE}: {exc}; no thresholds drawn")
        return []


def load_store(path: Path | str) -> Store:
    """Every tier of the store at `path`; raises ReportError when `path` is not a folder."""
    store = Path(path)
    if not store.is_dir():
        raise ReportError(f"{store}: no such store folder" if not store.exists() else f"{store}: not a folder")
    skipped: list[str] = []
    tiers = []
    for folder in tier_folders(store):
        tier = _read_tier(store, folder, skipped)
        if tier.runs or tier.maxbatch_tables or tier.profiles:
            tiers.append(tier)
        else:
            skipped.append(f"{folder.name}/: no stored runs; no section for this tier")
    if not tiers:
        skipped.append(f"{store}: no stored runs at all")
    tiers.sort(key=lambda tier: (not tier.on_gpu, tier.name))
    return Store(store, tiers, _rules(store, skipped), skipped)
