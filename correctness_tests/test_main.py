"""`python -m gpuengine`: the commands that run the engine refuse a bad GPUENGINE_* toggle before any work.

Each command's own arguments are probed beside it (bench/test_*_cli.py); here
what every command shares: a toggle the engine would refuse inside each trial
or session stops the command at once, naming the variable, value and range.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuengine.__main__ import ENGINE_COMMANDS, MOVED, main as cli_main
from gpuengine.gate import commands

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("variable,value,allowed", [
    ("GPUENGINE_CUDA_GRAPH", "99999999999999999999", "use a whole number from 0 to 1024"),
    ("GPUENGINE_BATCH_POOL", "0", "use a whole number from 1 to 2"),
    ("GPUENGINE_PRECISION", "fp64", "use one of fp32, tf32, bf16")])
def test_info_refuses_a_bad_toggle_naming_the_variable(capsys, monkeypatch, variable, value, allowed):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        cli_main(["info"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"python -m gpuengine info: error: {variable}={value!r} "
                                                         f"is not accepted; {allowed}")


def test_every_command_that_runs_the_engine_checks_the_toggles():
    assert set(ENGINE_COMMANDS) == {"maxbatch", "info", "profile"}
    assert set(commands.ENGINE_COMMANDS) == {"gatepower", "plans", "toggle-cost"}


@pytest.mark.parametrize("command", MOVED)
def test_the_gates_commands_are_the_gates_and_say_so(capsys, command):
    assert cli_main([command, "--help"]) == 2
    assert capsys.readouterr().err == (f"python -m gpuengine {command}: a command of the gate, run by ./gate "
                                       f"{command} (gpuengine/gate/commands.py)\n")
    assert command in commands.build_parser()._subparsers._group_actions[0].choices


def test_a_bad_toggle_is_one_line_without_a_traceback_from_the_shell():
    env = {"PATH": "/usr/bin:/bin", "GPUENGINE_CUDA_GRAPH": "1025"}
    done = subprocess.run([sys.executable, "-m", "gpuengine", "info"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "GPUENGINE_CUDA_GRAPH='1025' is not accepted; use a whole number from 0 to 1024" in done.stderr
