"""The gate's end-of-session summaries: on the terminal, and in markdown for a pull request.

On the terminal, after a session that saved its run, also the change points of the stored history that the
newest runs started (gpuengine/gate/changepoints.py).

Sections of pytest's terminal summary (targets not met, references
unavailable, the regression check, A/B power), from what
gpuengine/gate/plugin.py gathered during the session (its GateState), called
by gpuengine/gate/hooks.py after the other parts. A perf test that fails is also named, with why, as
it fails: a session stopped before its summary (a GPU lease running out)
still says which tests failed.

With `--gate-summary PATH` (./gate perf passes build/summary.md) the run is
also written there in markdown (gpuengine/gate/pr_summary.py), and appended
to $GITHUB_STEP_SUMMARY where set, after the run was saved; other plugins add
sections of their own with `add_section`. A spread run's per-GPU sessions
are not given the option: the spread writes one summary of the merged run.
"""
from __future__ import annotations

import pytest

from gpuengine.gate import changepoints

from gpuengine.gate.rules import paired
from gpuengine.bench.machine_info import checkout_commit
from gpuengine.bench.stack_lock import current_record
from gpuengine.gate.rules.verdicts import NOT_COMPARABLE, REGRESSED

from . import pr_summary
from .plugin import GATE, GateState, failure_line
from .tier_time import tier_record

EXTRA_SECTIONS = pytest.StashKey[list]()   # pr_summary.Section's other plugins add to the markdown summary
WRITTEN = pytest.StashKey[str]()           # what became of the markdown summary, for the terminal
CHANGE_POINTS = pytest.StashKey[list]()    # the lines on the change points the newest stored runs started


def add_options(parser):
    parser.getgroup("gpuengine gate").addoption(
        "--gate-summary", metavar="PATH", default=None,
        help="write the run's summary in markdown for a pull request to PATH (./gate perf: build/summary.md), "
             f"and append it to ${pr_summary.STEP_SUMMARY_ENV} where that is set")


def add_section(config, section: pr_summary.Section):
    """A section of the markdown summary from another plugin (added before the summary is written, at the end of
    pytest_sessionfinish)."""
    config.stash.setdefault(EXTRA_SECTIONS, []).append(section)


def announce_failure(item, report):
    """A perf test that failed, named with why as it fails: a session cut short still said so."""
    if report.failed and report.when == "call" and "compare" in getattr(item, "fixturenames", ()):
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"\nFAILED {item.nodeid}: {failure_line(report, 300)}", red=True)


def session_run(config, state: GateState) -> dict:
    """The run as pytest-benchmark stored it, or, where it made none (nothing was benchmarked, or nothing saved),
    what the session knows in the same shape."""
    if state.run is not None:
        return state.run
    commit, dirty = checkout_commit()
    return {"machine_info": {"tier": state.tier.name, "gpu": state.tier.gpu_label, "stack_lock": current_record()},
            "commit_info": {"id": commit, "dirty": dirty}, "benchmarks": [], "gpuengine_gate": state.outcome(),
            "gpuengine_tier_time": tier_record(config) or {}}


def saving_notes(session, state: GateState) -> list[str]:
    """Where the run went: a baseline, history/, or nowhere and why."""
    if state.save_failed:
        return [f"this run was NOT saved: {state.save_failed}"]
    storage = getattr(getattr(session.config, "_benchmarksession", None), "storage", None)
    saved = getattr(storage, "saved", None)
    if saved is None:
        return []
    where = saved.relative_to(session.config.rootpath) if saved.is_relative_to(session.config.rootpath) else saved
    if state.saved_to_history:
        return [f"saved under history/, not as a baseline: `{where}`"]
    return [f"saved as a baseline: `{where}`" + (" (it failed on targets not met only)"
                                                 if state.saved_despite_targets else "")]


def finish(session, exitstatus):
    """After pytest-benchmark saved the run and the other parts added their sections: change points, markdown."""
    config = session.config
    state = config.stash.get(GATE, None)
    if state is None:
        return
    if state.saving and state.storage is not None:   # pytest-benchmark saved the run: it is in the store
        config.stash[CHANGE_POINTS] = changepoints.recent_lines(state.storage, state.tier.name)
    path = config.getoption("gate_summary", None)
    if path is None or state.study is not None:
        return
    status = int(exitstatus) or (int(pytest.ExitCode.TESTS_FAILED) if state.save_failed else 0)
    facts = pr_summary.RunFacts(session_run(config, state), status, saving_notes(session, state))
    sections = list(config.stash.get(EXTRA_SECTIONS, []))
    if CHANGE_POINTS in config.stash:
        sections.append(pr_summary.change_points(config.stash[CHANGE_POINTS]))
    markdown = pr_summary.render(facts, sections)
    try:
        written = pr_summary.write(markdown, config.invocation_params.dir / path)
        config.stash[WRITTEN] = "the run's summary for a pull request: " + ", ".join(map(str, written))
    except OSError as exc:
        config.stash[WRITTEN] = f"the run's summary for a pull request was NOT written: {exc}"


def terminal_summary(terminalreporter):
    state = terminalreporter.config.stash.get(GATE, None)
    if state is None:
        return
    _verdicts(terminalreporter, state)
    if CHANGE_POINTS in terminalreporter.config.stash:
        terminalreporter.section(f"gpuengine change points (newest {changepoints.RECENT_RUNS} stored runs)")
        for line in terminalreporter.config.stash[CHANGE_POINTS]:
            terminalreporter.write_line(line)
    written = terminalreporter.config.stash.get(WRITTEN, None)
    if written:
        terminalreporter.write_line(f"gpuengine: {written}")


def _verdicts(terminalreporter, state: GateState):
    """Targets not met, references unavailable, a run not saved, and the regression check."""
    if state.targets.missed:
        terminalreporter.section("gpuengine targets not met")
        for missed in state.targets.missed:
            terminalreporter.write_line(missed.describe())
        count = len(state.targets.missed)
        if state.targets.fail:
            terminalreporter.write_line(f"{count} target(s) not met: their tests failed ("
                                        f"{'--claims' if not state.full else 'the nightly tier, --full'}); "
                                        "a run whose only failures these are is still saved as a baseline")
        else:
            terminalreporter.write_line(f"{count} target(s) not met: goals, not failures (./gate perf --claims, and "
                                        "the nightly tier, fail on them); kept in the run's ratio_checks")
    if state.unavailable:
        terminalreporter.section("gpuengine references unavailable")
        for line in state.unavailable + ["left out of their tests; kept in the run's references_unavailable"]:
            terminalreporter.write_line(line)
    if state.interrupted:
        terminalreporter.section("gpuengine: this run was interrupted", red=True)
        terminalreporter.write_line("interrupted before its tests ended: no verdict, so nothing was saved (neither as "
                                    "a baseline nor under history/) and no noise is learned from it")
    if state.save_failed:
        terminalreporter.section("gpuengine: this run was NOT saved", red=True)
        terminalreporter.write_line(f"{state.save_failed}; nothing half-written was left, the results above are "
                                    "all there is of this run (the session fails for it)")
    if not (state.checked or state.saved_to_history or state.saved_despite_targets):
        return
    terminalreporter.section("gpuengine regression check (A/B against a base, or the stored run)")
    for _, _, line in sorted(state.checked):
        terminalreporter.write_line(line)
    regressed = [line for _, verdict, line in sorted(state.checked) if verdict == REGRESSED]
    if regressed:
        gated = "" if state.tier.on_gpu else " (CPU tier: recorded, not gated)"
        terminalreporter.write_line(f"Performance has regressed{gated}:")
        for line in regressed:
            terminalreporter.write_line(f"\t{line}")
    not_comparable = [line for _, verdict, line in sorted(state.checked) if verdict == NOT_COMPARABLE]
    if not_comparable:
        terminalreporter.write_line(f"{len(not_comparable)} test(s) not comparable: their stored runs ran on another "
                                    f"stack (this run: {state.stack}), so no verdict, not a regression; this run, "
                                    "saved as a baseline when it passes, is what the next run on this stack compares "
                                    "with")
    power = paired.power_summary(state.ab_catches)
    if power:
        terminalreporter.write_line("A/B power (the rule's model at each test's noise in this session):")
        for line in power:
            terminalreporter.write_line(f"  {line}")
    if state.saved_to_history and not state.save_failed:
        terminalreporter.write_line(f"this run did not pass: saved under {state.saved_to_history}, not as a baseline "
                                    "(./gate perf --save-baseline stores a run as a baseline on purpose)")
    if state.saved_despite_targets:
        terminalreporter.write_line(f"this run failed only on targets not met ({len(state.failed_on_targets)} "
                                    "test(s)): saved as a baseline all the same, since nothing regressed and every "
                                    "claim held")
