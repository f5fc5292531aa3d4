"""`./gate gatepower`: every option is checked before the first session starts.

Each bad value is argparse's usage error (status 2, no traceback) naming the
option, the value and what is allowed; `run_sessions` is replaced by a stub
that fails the test if a session would start. Before these checks `--sessions 0`
ran 2 sessions, `--trials 0` ran 10 and `--trials 11` was taken, and a bad
`--trial-budget`, `--rounds` or `--session-timeout` failed inside every session.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpuengine.gate.commands import main as cli_main
from gpuengine.gate.gatepower import cli as gatepower_cli

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


def test_kept_trials_are_analysed_only_with_the_tier_folder_they_were_measured_for(capsys, no_session, tmp_path):
    (tmp_path / "kept" / "session-1").mkdir(parents=True)
    line = refused(capsys, "gatepower", "--from-trials", str(tmp_path / "kept"))
    assert "argument --from-trials: analyses a study's kept trials; give the GPU tier folder" in line
    line = refused(capsys, "gatepower", "--from-trials", str(tmp_path), "--store", str(tmp_path / "tier"))
    assert f"argument --from-trials: '{tmp_path}' holds no session-N folder of trials" in line


def kept_trial_file(folder, rng, test="perf_tests/test_mlp.py::test_mlp_train[tf32-graph8-resident-bpe1]"):
    """One session's trials of one A/B test as the study keeps them: the head slower by each trial's level."""
    trials = []
    for number, level in enumerate([0.0, 0.1] * 3):
        base = 10 * np.exp(rng.normal(0, 0.002, 11))
        head = 10 * (1 + level) * np.exp(rng.normal(0, 0.002, 11))
        trials.append({"trial": number, "level": level, "delay_us": 100.0 * level, "extra_info": {"ab": {
            "head_round_ms": list(head), "base_round_ms": list(base), "head_samples_per_round": 100,
            "base_samples_per_round": 100}}})
    folder.mkdir(parents=True)
    (folder / "trials.json").write_text(json.dumps({
        "fullname": test, "workload": "mlp_train", "rounds": 11, "levels": [0.0, 0.1], "mode": "A/B",
        "base_round_ms": 10.0, "probe_us": 100.0, "ms_per_us": 0.01, "trials": trials}))


def test_kept_trials_of_a_study_cut_short_are_analysed_without_a_session(no_session, tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(5)
    for session in (1, 2):
        kept_trial_file(tmp_path / "kept" / f"session-{session}", rng)
    store = tmp_path / "nvidia-h100-80gb-hbm3"
    monkeypatch.setenv("GATE_COMMIT_ID", "0123456789abcdef")
    assert cli_main(["gatepower", "--from-trials", str(tmp_path / "kept"), "--store", str(store), "--levels", "0,10",
                     "--against", "base"]) == 0
    (written,) = (store / "gatepower").glob("*_0123456789.json")
    record = json.loads(written.read_text())
    assert record["tier"] == store.name and record["sessions"] == 2 and record["session_status"] is None
    assert record["from_trials"] == str(tmp_path / "kept") and record["rule"]["mode"] == "A/B"
    (entry,) = record["tests"].values()
    assert entry["pairs"] == {"0pct": 6, "10pct": 6} and entry["false_alarm_rate"] == 0.0
    assert entry["detection_rate_10pct"] == 1.0
