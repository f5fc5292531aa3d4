"""`./gate` with a command it does not know names it, then prints the usage, and exits 2.

Nothing is installed first: the check comes before any set-up (GATE_NO_INSTALL
keeps it so even if it did not).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", ["bogus", "perf-test", "Test"])
def test_an_unknown_command_is_named_before_the_usage(command):
    done = subprocess.run([str(ROOT / "gate"), command], env=dict(os.environ, GATE_NO_INSTALL="1"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"gate: unknown command '{command}'\n"
    assert "./gate perf [pytest args...]" in done.stdout and "./gate extras" in done.stdout


def test_no_command_prints_the_usage_alone():
    done = subprocess.run([str(ROOT / "gate")], env=dict(os.environ, GATE_NO_INSTALL="1"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr == "" and "./gate test [pytest args...]" in done.stdout
