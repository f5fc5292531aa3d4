"""The gate's session state: per-test baselines, where a run is saved, tiers; each test's check is check.py's.

- A test that ran A/B (gpuengine/gate/ab/session.py) is judged head against base
  by gpuengine/gate/rules/paired.py, its bar from the stored A/A runs
  (`process_noise`, which the A/B plugin fills in).
- Otherwise each test is compared with the newest stored baseline result *for
  that test* that carries timings (gpuengine/gate/store/stored_runs.py) in this
  tier's storage folder, so a partial run (`-k`) never hides the other tests'
  baselines; pytest-benchmark's compare table is fed the same per-test runs. An
  unreadable stored run is named in the header, and the summary says which run
  each test used.
- Only runs of this run's stack are compared with (gpuengine/bench/stack_lock.py:
  the tier's lock, and how the run's packages differed from it): a test whose
  stored runs all ran on another stack is "not comparable: stack changed (A -> B)",
  never "regressed", and this run, saved, is the next run's baseline.
- A store the run could not be saved into (not a folder, not writable, a
  symbolic link) stops the session before the first test.
- A saved run (`--benchmark-autosave`, `--benchmark-save`) becomes a baseline
  only when the session passed, or with `--save-baseline`; otherwise it is
  kept apart under `<storage>/history/`, never compared against. An
  interrupted session (Ctrl-C: pytest's INTERRUPTED) is no verdict and is not
  saved at all, `--save-baseline` or not. A session
  whose only failures are targets not met (`--claims`) counts as passed here:
  nothing regressed and every claim held, and the misses stay in the run.
- A target not met yet (thresholds.json's `kind`) is listed under `gpuengine
  targets not met`, one line per miss, and fails its test only with `--claims`
  or in the nightly tier (tiers.targets_fail); a reference a test left out as
  unavailable here, with why, under `gpuengine references unavailable`.
- `--full` runs the nightly tier; the quick tier deselects `nightly` cases
  (gpuengine/gate/tiers.py). Rounds per test come from noise.json and the budget.
- A broken thresholds.json or noise.json stops the session with one error
  naming the file and the position; so does an injected slowdown
  (gpuengine/bench/injected_delay.py) outside a gatepower study session, and any
  saving inside one.
The end-of-session summaries, on the terminal and in markdown (--gate-summary), are gpuengine/gate/summary.py's;
the run's JSON keeps why each failed test failed (`gpuengine_gate`'s "failures"), for the markdown summary of a
spread run. gpuengine/gate/hooks.py calls this module's parts of the hooks; root conftest.py calls `configure`
with the tier.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuengine.bench import injected_delay

from gpuengine.gate.rules import paired
from gpuengine.gate.gatepower import trials as study_trials
from gpuengine.bench.json_files import JsonFileError
from gpuengine.bench.machine_info import Tier
from gpuengine.gate.rules.noise import NoiseTable
from gpuengine.gate.rules.stored_noise import StoredNoise
from gpuengine.bench.stack_lock import NO_LOCK, StackId, current_record, stack_of
from gpuengine.gate.store.stored_runs import (NOISE_FILE, StoredRun, UnreadableRun, history_folder, newest_per_test,
                                              read_run, scan)
from gpuengine.bench.thresholds import load_rules

from . import tiers
from .check import GateTest, has_timings
from .store import run_storage
from .harness import Targets, TargetsMissed



@dataclass
class GateState:
    tier: Tier
    storage: Path | None      # the file storage folder of this run's baselines (None: not file storage)
    full: bool
    compare: bool             # --benchmark-compare: each test is checked against its stored baseline
    noise: NoiseTable
    study: study_trials.StudySettings | None
    runs: list[StoredRun] = field(default_factory=list)   # every readable stored run, oldest first
    stack: StackId = NO_LOCK   # this run's stack: only stored runs of the same one are compared with
    unreadable: list[UnreadableRun] = field(default_factory=list)
    checked: list[tuple[str, str, str]] = field(default_factory=list)   # (test, verdict, summary line)
    unavailable: list[str] = field(default_factory=list)   # "test: reference: why" (harness.ready_references)
    notices: list[str] = field(default_factory=list)
    saved_to_history: Path | None = None
    targets: Targets = field(default_factory=Targets)   # the targets missed, and whether they fail (--claims)
    failed_on_targets: set[str] = field(default_factory=set)   # tests that failed on missed targets only
    failed_otherwise: set[str] = field(default_factory=set)    # tests that failed for any other reason
    saved_despite_targets: bool = False   # failed on targets only (--claims), saved as a baseline all the same
    process_noise: dict = field(default_factory=dict)   # test -> aa_noise.ProcessNoise (A/B sessions fill it)
    save_failed: str | None = None   # why this run could not be stored (nothing half-written was left)
    saving: bool = False   # this session stores its run (a spread's workers do not: the merged run is stored)
    ab_catches: dict[str, float] = field(default_factory=dict)   # test -> slowdown its A/B check catches 95%
    failure_reasons: dict[str, str] = field(default_factory=dict)   # failed test -> why, in one line (failure_line)
    run: dict | None = None   # the run's JSON as pytest-benchmark made it (saved, or --benchmark-json): the summary's
    stored_noise: StoredNoise | None = None   # run-to-run noise of the stored runs of the same code (no noise.json)
    interrupted: bool = False   # the session stopped before its tests ended (Ctrl-C): no verdict, nothing saved
    ab_rounds: int | None = None   # --ab-rounds: the paired rounds every A/B test times

    @property
    def comparable_runs(self) -> list[StoredRun]:
        """The stored runs of this run's stack, oldest first: on another lock (a new cuDNN frontend re-autotuned
        every plan, 2026-11-27) unchanged code times differently, so such a run is no baseline."""
        return [run for run in self.runs if stack_of(run.machine_info) == self.stack]

    @property
    def baselines(self) -> dict[str, StoredRun]:
        """Each test's newest stored run of this stack that has timings, whatever runners it timed."""
        return newest_per_test(self.comparable_runs, usable=has_timings)

    def failed_on_targets_only(self, exitstatus) -> bool:
        """The session failed, and only because tests missed targets: a baseline still (nothing regressed)."""
        return (exitstatus == pytest.ExitCode.TESTS_FAILED and bool(self.failed_on_targets)
                and not self.failed_otherwise)

    def outcome(self) -> dict:
        """What the stored run keeps of the gate's verdict (`gpuengine_gate`): gpuengine/gate/spread.py reads it."""
        return {"targets_fail": self.targets.fail, "targets_not_met": len(self.targets.missed),
                "failed_on_targets_only": sorted(self.failed_on_targets - self.failed_otherwise),
                "failed_otherwise": sorted(self.failed_otherwise),
                "failures": dict(sorted(self.failure_reasons.items())),
                **({"interrupted": True} if self.interrupted else {})}   # a spread worker's JSON only: never stored


GATE = pytest.StashKey[GateState]()


def add_options(parser):
    group = parser.getgroup("gpuengine gate", "stored baselines, tiers and the stored-run check")
    group.addoption("--full", action="store_true", default=False,
                    help="nightly tier: every perf case, twice the rounds (default: the quick tier)")
    group.addoption("--save-baseline", action="store_true", default=False,
                    help="save this run as a baseline even if it fails (default: only a passing run is one)")
    group.addoption("--claims", action="store_true", default=False,
                    help="targets not met yet fail their tests too (default: only claims that have held, and "
                         "regressions, fail; targets are listed in the summary); on in the nightly tier (--full)")
    group.addoption("--noise-file", metavar="PATH", default=None,
                    help="learned per-test noise (default: baselines_store/<tier>/noise.json)")
    group.addoption("--ab-rounds", metavar="N", type=int, default=None,
                    help=f"every test run A/B times exactly N (>= {paired.MIN_ROUNDS}) paired rounds, whatever its "
                         "noise, budget or tier (./gate bisect's steps; default: the gate chooses)")


def _usage_error(exc: Exception):
    raise pytest.UsageError(f"gpuengine: {exc}") from exc


def configure(config: pytest.Config, tier: Tier):
    """Validate the files the gate reads, settle saving and the study; called by the root conftest."""
    option = config.option
    for marker in tiers.MARKERS:
        config.addinivalue_line("markers", marker)
    try:
        load_rules()
        noise = NoiseTable.load(config.getoption("noise_file")
                                or config.rootpath / "baselines_store" / tier.name / NOISE_FILE)
        study = study_trials.settings()
    except (JsonFileError, injected_delay.InjectionRefused, ValueError) as exc:
        _usage_error(exc)
    saving = getattr(option, "benchmark_save", None) or getattr(option, "benchmark_autosave", None)
    if study is not None and (saving or config.getoption("save_baseline")):
        raise pytest.UsageError("gpuengine: a gatepower study session injects slowdowns; its runs are never saved")
    if config.getoption("save_baseline") and not saving and hasattr(option, "benchmark_autosave"):
        from pytest_benchmark.utils import get_tag
        option.benchmark_autosave = get_tag()
        saving = option.benchmark_autosave
    ab_rounds = config.getoption("ab_rounds")
    if ab_rounds is not None and ab_rounds < paired.MIN_ROUNDS:
        raise pytest.UsageError(f"gpuengine: --ab-rounds {ab_rounds}: at least {paired.MIN_ROUNDS} paired rounds "
                                "(fewer cannot reach the rank test's significance)")
    uri = getattr(option, "benchmark_storage", None)
    why = run_storage.unwritable(uri) if saving else None
    if why is not None:
        raise pytest.UsageError(f"gpuengine: this run could not be saved, so nothing ran: {why}")
    state = GateState(tier, run_storage.storage_folder(uri), config.getoption("full"),
                      bool(getattr(option, "benchmark_compare", None)), noise, study,
                      stack=stack_of({"stack_lock": current_record()}), ab_rounds=ab_rounds)
    state.targets.fail = tiers.targets_fail(full=state.full, claims=config.getoption("claims"))
    if study is not None:
        state.notices.append(f"gatepower study session: injected slowdowns, trials written to {study.out_dir}")
    elif saving and state.storage is not None:
        state.notices.append(f"a passing run is saved as a baseline; a failing one under "
                             f"{history_folder(state.storage)} (--save-baseline: a baseline anyway)")
    config.stash[GATE] = state


def pick_baselines(session):
    """Pick each test's newest stored baseline; pytest-benchmark's compare table gets the same runs."""
    state = session.config.stash.get(GATE, None)
    bench_session = getattr(session.config, "_benchmarksession", None)
    if state is None or not state.compare or state.storage is None:
        return
    if bench_session is not None and bench_session.compare is not True:   # runs named on the command line
        runs = []
        for path in bench_session.compared_mapping:
            try:
                runs.append(read_run(state.storage / path, state.storage))
            except JsonFileError as exc:
                state.unreadable.append(UnreadableRun(state.storage / path, str(path), str(exc)))
        runs.sort(key=lambda run: run.saved_at)
    else:
        runs, state.unreadable = scan(state.storage)
    state.runs = runs
    history = scan(history_folder(state.storage))[0]
    state.stored_noise = StoredNoise([run for run in runs + history if stack_of(run.machine_info) == state.stack])
    baselines = state.baselines
    lacking = [name for name, run in newest_per_test(state.comparable_runs).items() if baselines.get(name) is not run]
    if lacking:
        state.notices.append(f"{len(lacking)} test(s) have a newer stored result without timings (no per-round "
                             "ratios or engine times): each compares with its newest result that has them, or none")
    elsewhere = {name: run for name, run in newest_per_test(runs, usable=has_timings).items() if name not in baselines}
    if elsewhere:
        stacks = "; ".join(sorted({str(stack_of(run.machine_info)) for run in elsewhere.values()}))
        state.notices.append(f"{len(elsewhere)} test(s) have stored runs of another stack only ({stacks}): not "
                             "comparable with this one; this run, saved, is their first baseline on it")
    for bad in state.unreadable:
        state.notices.append(f"stored run {bad.label} is unreadable and skipped: {bad.reason}; each test compares "
                             "with its newest readable result instead (named per test in the summary)")
    if bench_session is not None:
        mapping: dict = {}
        for fullname, run in baselines.items():
            mapping.setdefault(run.path.relative_to(state.storage), {})[fullname] = run.benchmarks[fullname]
        bench_session.compared_mapping = mapping


def targets_policy(state: GateState) -> str:
    if not state.tier.on_gpu:
        return "are recorded (CPU tier: nothing about timing gates)"
    if state.targets.fail:
        return "fail too (" + ("--claims" if not state.full else "the nightly tier, --full") + ")"
    return "are listed, not failed (--claims fails them)"


def header_lines(config) -> list[str]:
    state = config.stash.get(GATE, None)
    if state is None:
        return []
    tier = "nightly tier (--full): every case" if state.full else "quick tier: nightly cases deselected (--full)"
    learned = state.stored_noise.runs if state.stored_noise else 0
    noise = (state.noise.path.name if state.noise.tests
             else f"learned from {learned} stored runs of the same code" if learned else "not calibrated")
    lines = [f"gpuengine gate: {tier}; noise: {noise}",
             f"gpuengine gate: missed claims and regressions fail; targets not met yet {targets_policy(state)}"]
    baselines = state.baselines if state.compare else {}
    if state.compare:
        lines.append(f"gpuengine gate: stack {state.stack}: only stored runs of the same stack are compared with")
    if baselines:
        used = sorted({run.label for run in baselines.values()})
        lines.append(f"gpuengine gate: {len(baselines)} tests have a stored baseline, in {len(used)} runs "
                     f"(newest: {max(baselines.values(), key=lambda r: r.saved_at).label})")
    return lines + [f"gpuengine gate: {notice}" for notice in state.notices]


def deselect_nightly(config, items):
    state = config.stash.get(GATE, None)
    if state is None or state.full:
        return
    nightly = [item for item in items if item.get_closest_marker(tiers.NIGHTLY)]
    if nightly:
        items[:] = [item for item in items if not item.get_closest_marker(tiers.NIGHTLY)]
        config.hook.pytest_deselected(items=nightly)


def sort_failure(item, call, report):
    """Sort failed tests: those that failed on targets not met only (--claims), and the rest; keep why each failed."""
    state = item.config.stash.get(GATE, None)
    if state is not None and report.failed:
        state.failure_reasons.setdefault(item.nodeid, failure_line(report))
        if report.when == "call" and call.excinfo is not None and call.excinfo.errisinstance(TargetsMissed):
            state.failed_on_targets.add(item.nodeid)
        else:
            state.failed_otherwise.add(item.nodeid)


def route_saving(session, exitstatus) -> bool:
    """Before pytest-benchmark saves (in its own sessionfinish), whether it saves: a run that did not pass goes to
    history; one that failed on targets not met only (--claims) passed the gate's own verdict and is a baseline.
    Either is written aside and renamed (run_storage.py); a save that failed fails the session (`fail_unsaved`,
    afterwards), its summary printed all the same. An interrupted session is neither: pytest-benchmark is told not
    to save it (a spread worker's JSON, which the spread never stores then, says it was interrupted)."""
    state = session.config.stash.get(GATE, None)
    bench_session = getattr(session.config, "_benchmarksession", None)
    if state is not None and exitstatus == pytest.ExitCode.INTERRUPTED:
        state.interrupted = True
        if bench_session is not None:
            bench_session.save = bench_session.autosave = None
    saving = (state is not None and bench_session is not None and state.storage is not None
              and (bench_session.save or bench_session.autosave) and bench_session.benchmarks)
    if saving:
        state.saving = True

        def failed(why: str):
            state.save_failed = why

        folder = None
        if exitstatus != 0 and not session.config.getoption("save_baseline"):
            if state.failed_on_targets_only(exitstatus):
                state.saved_despite_targets = True
            else:
                folder = state.saved_to_history = history_folder(state.storage)
        bench_session.storage = run_storage.atomic(bench_session, folder, on_failure=failed)
    return bool(saving)


def fail_unsaved(session, saving: bool):
    """After pytest-benchmark saved: a save that failed fails the session."""
    state = session.config.stash.get(GATE, None)
    if saving and state is not None and state.save_failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def failure_line(report, limit: int = 400) -> str:
    """Why a test failed, in one line: pytest's crash message (else the whole report), its first line with the
    indented lines that continue it (the gate's own failures go on so; an assertion's explanation does not)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    first, *rest = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines() or ["?"]
    kept = [first]
    for line in rest:
        if not line[:1].isspace():
            break
        kept.append(line)
    text = " ".join(" ".join(kept).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def record_outcome(config, output_json):
    """The gate's verdict into the stored run (and a spread worker's JSON): which tests failed on targets only, and
    why each failed. The run is kept for the summaries (the other plugins' keys join the same object)."""
    state = config.stash.get(GATE, None)
    if state is not None:
        output_json["gpuengine_gate"] = state.outcome()
        state.run = output_json


@pytest.fixture
def gate_targets(request) -> Targets | None:
    """The session's targets not met yet and whether they fail (None where the plugin is not configured):
    hand it to record_and_gate."""
    state = request.config.stash.get(GATE, None)
    return None if state is None else state.targets


@pytest.fixture
def gate_test(request) -> GateTest | None:
    """This test's rounds and stored-run check (None where the plugin is not configured)."""
    state = request.config.stash.get(GATE, None)
    return None if state is None else GateTest(state, request.node)

