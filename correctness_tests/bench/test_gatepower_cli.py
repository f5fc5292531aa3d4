"""`python -m gpuengine gatepower`: every option is checked before the first session starts.

Each bad value is argparse's usage error (status 2, no traceback) naming the
option, the value and what is allowed; `run_sessions` is replaced by a stub
that fails the test if a session would start. Before these checks `--sessions 0`
ran 2 sessions, `--trials 0` ran 10 and `--trials 11` was taken, and a bad
`--trial-budget`, `--rounds` or `--session-timeout` failed inside every session.
"""
from __future__ import annotations

import pytest

from gpuengine.__main__ import main as cli_main
from gpuengine.bench.gatepower import cli as gatepower_cli

from ..command_line import refused


@pytest.fixture
def no_session(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a session started before the arguments were checked")
    monkeypatch.setattr(gatepower_cli, "run_sessions", refuse)


@pytest.mark.parametrize("option,value,allowed", [
    ("--sessions", "0", "a whole number >= 1"), ("--sessions", "two", "a whole number >= 1"),
    ("--trials", "0", "a whole number from 1 to 10"), ("--trials", "11", "a whole number from 1 to 10"),
    ("--trial-budget", "-5", "a number > 0"), ("--trial-budget", "0", "a number > 0"),
    ("--rounds", "0", "a whole number >= 1"), ("--session-timeout", "0", "a number > 0"),
    ("--session-timeout", "inf", "a number > 0"), ("--budget-min", "-1", "a number > 0"),
    ("--budget-min", "nan", "a number > 0")])
def test_a_bad_number_names_the_option_the_value_and_the_range(capsys, no_session, tmp_path, option, value, allowed):
    line = refused(capsys, "gatepower", option, value, "--store", str(tmp_path))
    assert line == f"argument {option}: '{value}' is not accepted; use {allowed}"


@pytest.mark.parametrize("levels", ["0,-5", "5,10", "0,5,5", "0,x", "0,1000", ""])
def test_bad_levels_are_refused_before_any_session(capsys, no_session, tmp_path, levels):
    line = refused(capsys, "gatepower", "--levels", levels, "--store", str(tmp_path))
    assert f"argument --levels: levels {levels!r}: use distinct percentages from 0 to under 1000" in line


def test_one_session_of_one_trial_is_refused(capsys, no_session, tmp_path):
    line = refused(capsys, "gatepower", "--sessions", "1", "--trials", "1", "--store", str(tmp_path))
    assert "arguments --sessions 1 and --trials 1: sessions x trials must be >= 2" in line


def test_a_kept_trials_folder_that_holds_files_is_refused(capsys, no_session, tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "old.json").write_text("{}")
    line = refused(capsys, "gatepower", "--keep-trials", str(keep), "--store", str(tmp_path))
    assert f"argument --keep-trials: '{keep}' is not empty; old trials would mix in" in line


def test_a_store_that_cannot_be_written_is_refused_before_the_sessions(capsys, no_session, tmp_path):
    (tmp_path / "file").write_text("")
    line = refused(capsys, "gatepower", "--store", str(tmp_path / "file" / "tier"))
    assert f"argument --store: '{tmp_path}/file/tier' cannot be written: {tmp_path}/file is not a folder" in line


def test_a_bad_engine_toggle_is_refused_before_the_sessions(capsys, no_session, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUENGINE_BATCH_POOL", "0")
    line = refused(capsys, "gatepower", "--store", str(tmp_path))
    assert line == "GPUENGINE_BATCH_POOL='0' is not accepted; use a whole number from 1 to 2"


def test_good_options_reach_the_sessions(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(gatepower_cli, "run_sessions", lambda plan, sessions, *rest: started.append(
        (plan.trials, plan.levels_pct, plan.trial_budget_s, plan.rounds, plan.timeout_s, sessions)) or [])
    assert cli_main(["gatepower", "--sessions", "3", "--trials", "10", "--levels", "0,2.5", "--trial-budget",
                     "0.5", "--rounds", "4", "--session-timeout", "30", "--store", str(tmp_path)]) == 1
    assert started == [(10, "0,2.5", 0.5, 4, 30.0, 3)]
    assert "no test wrote trials" in capsys.readouterr().err   # the stub ran none
