"""The gate's end-of-session summary: targets not met, references unavailable, the regression check, A/B power.

Sections of pytest's terminal summary, from what gpuengine/gate/plugin.py
gathered during the session (its GateState); root conftest.py registers it.
A perf test that fails is also named, with the last line of why, as it
fails: a session stopped before its summary (a GPU lease running out) still
says which tests failed.
"""
from __future__ import annotations

import pytest

from gpuengine.bench import paired
from gpuengine.bench.verdicts import NOT_COMPARABLE, REGRESSED

from .plugin import GATE


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed and report.when == "call" and "compare" in getattr(item, "fixturenames", ()):
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        crash = getattr(report.longrepr, "reprcrash", None)
        why = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines() or ["?"]
        if reporter is not None:
            reporter.write_line(f"\nFAILED {item.nodeid}: {why[0][:300]}", red=True)
    return report


def pytest_terminal_summary(terminalreporter):
    state = terminalreporter.config.stash.get(GATE, None)
    if state is None:
        return
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
