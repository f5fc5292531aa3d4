"""The gate's pytest plugin: each hook once, calling the gate's parts in the order written here.

The parts are modules of plain functions, none a plugin of its own:
plugin.py (the session's GateState: baselines, saving, tiers, the stored-run
check), ab/session.py (A/B against a base), kept_plans.py (cuDNN plan
choices), progress.py (autotuning progress on the terminal), tier_time.py
(how long each test and workload took), regression_profiles.py (why an A/B
test regressed) and summary.py (the end-of-session summaries). Priorities
(tryfirst, trylast, wrappers) place a hook against other plugins only: the
root conftest, pytest-benchmark and the terminal reporter. Root conftest.py
registers this module and calls `plugin.configure` with the tier.
"""
from __future__ import annotations

import time

import pytest

from . import kept_plans, plugin, progress, regression_profiles, summary, tier_time
from .ab import session as ab_session

# The fixtures the gate gives the perf tests, provided here since this module is the plugin pytest knows.
from .ab.session import engine_for
from .kept_plans import kept_plan_choices
from .plugin import gate_targets, gate_test

FIXTURES = (engine_for, kept_plan_choices, gate_targets, gate_test)


def pytest_addoption(parser):
    plugin.add_options(parser)   # first: it names the option group the others join
    ab_session.add_options(parser)
    kept_plans.add_options(parser)
    regression_profiles.add_options(parser)
    summary.add_options(parser)


@pytest.hookimpl(trylast=True)   # after the root conftest configured the gate's state (plugin.configure)
def pytest_configure(config):
    progress.start(config)
    kept_plans.configure(config)
    ab_session.configure(config)   # hands the workers kept_plans' choices and progress's terminal


def pytest_unconfigure(config):
    progress.stop(config)


def pytest_sessionstart(session):
    tier_time.start_clock(session)
    plugin.pick_baselines(session)


def pytest_report_header(config) -> list[str]:
    return plugin.header_lines(config)


def pytest_collection_modifyitems(config, items):
    plugin.deselect_nightly(config, items)


@pytest.hookimpl(tryfirst=True)   # before the terminal reporter's, which prints what the base said (mode lines)
def pytest_collection_finish(session):
    ab_session.ask_base(session)


def pytest_report_collectionfinish(config, items) -> list[str]:
    return ab_session.mode_lines(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.monotonic()
    try:
        return (yield)
    finally:
        tier_time.add_test_time(item, started)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    plugin.sort_failure(item, call, report)
    summary.announce_failure(item, report)
    return report


@pytest.hookimpl(optionalhook=True)   # a pytest-benchmark hook: absent when that plugin is disabled
def pytest_benchmark_update_json(config, benchmarks, output_json):
    tier_time.record(config, output_json)
    plugin.record_outcome(config, output_json)


# A second sessionfinish impl of this plugin (specname); pytest reads only names that start with pytest_.
@pytest.hookimpl(hookwrapper=True, tryfirst=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_around_saving(session, exitstatus):
    """Around pytest-benchmark's saving (its own sessionfinish wrapper): where the run goes, and whether it went."""
    saving = plugin.route_saving(session, exitstatus)
    yield
    plugin.fail_unsaved(session, saving)


@pytest.hookimpl(trylast=True)   # the run is saved (..._around_saving); the terminal summary comes after
def pytest_sessionfinish(session, exitstatus):
    ab_session.finish(session)                       # the workers stopped, the head's plan choices joined
    regression_profiles.finish(session, exitstatus)  # on a GPU, with the workers gone: base and head profiled
    kept_plans.finish(session)                       # the session's plan choices, the head's included
    summary.finish(session, exitstatus)              # change points and markdown, every part's section in


def pytest_terminal_summary(terminalreporter):
    regression_profiles.terminal_summary(terminalreporter)
    kept_plans.terminal_summary(terminalreporter)
    tier_time.terminal_summary(terminalreporter)
    summary.terminal_summary(terminalreporter)
