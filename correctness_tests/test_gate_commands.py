"""`./gate` with a command it does not know names it, then prints the usage, and exits 2.

Nothing is installed first: the check comes before any set-up (GATE_NO_INSTALL
keeps it so even if it did not).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def logging_machine(tmp_path: Path, pytest_status: int = 0) -> tuple[dict, Path]:
    """A machine without a GPU whose python3 (and venv Python) only log what they are asked to run; its pytest
    exits with `pytest_status`."""
    log, bin_dir = tmp_path / "python.log", tmp_path / "bin"
    bin_dir.mkdir()
    for path in (bin_dir / "python3", tmp_path / "venv" / "bin" / "python"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\n[ "$1 $2" != "-m pytest" ] || exit {pytest_status}\n')
        path.chmod(0o755)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_VENV", "GATE_LOCK_TIER", "CUDA_VISIBLE_DEVICES")}
    return dict(env, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GATE_NO_INSTALL="1",
                GATE_VENV=str(tmp_path / "venv")), log


@pytest.mark.parametrize("args", [["--against-stack", "build/old.txt"], ["--against-stack=HEAD~3:locks/cpu.txt"]])
def test_perf_passes_against_stack_to_pytest_instead_of_the_default_base(tmp_path, args):
    env, log = logging_machine(tmp_path)
    subprocess.run([str(ROOT / "gate"), "perf", *args], env=env, check=True, capture_output=True, timeout=60)
    (pytest_run,) = [line for line in log.read_text().splitlines() if line.startswith("-m pytest")]
    assert pytest_run.endswith(" ".join(args)) and "--against auto" not in pytest_run


@pytest.mark.parametrize("status,says", [
    (2, "gate: perf was interrupted: no verdict, nothing was saved; the report was not rebuilt"),
    (4, "gate: no test ran (a usage error, above): nothing was saved; the report was not rebuilt"),
    (5, "gate: no test ran (none selected): nothing was saved; the report was not rebuilt"),
    (3, "gate: perf ended without a verdict (exit status 3); the report was not rebuilt")])
def test_perf_builds_no_report_without_a_verdict(tmp_path, status, says):
    env, log = logging_machine(tmp_path, pytest_status=status)
    done = subprocess.run([str(ROOT / "gate"), "perf"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == status and done.stderr.strip().splitlines()[-1] == says
    assert [line for line in log.read_text().splitlines() if "gpuengine.gate.commands report" in line] == []


@pytest.mark.parametrize("status", [0, 1])
def test_perf_builds_the_report_after_a_verdict(tmp_path, status):
    env, log = logging_machine(tmp_path, pytest_status=status)
    done = subprocess.run([str(ROOT / "gate"), "perf"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == status and "the report of this run and every stored one" in done.stdout
    assert [line for line in log.read_text().splitlines() if "gpuengine.gate.commands report" in line] == [
        "-m gpuengine.gate.commands report --out build/report"]


def test_a_venv_that_is_a_file_is_named_and_not_given_to_python_m_venv(tmp_path):
    """tox 4 can leave a file named .venv where the gate keeps its environment: say what it is and what to do."""
    (tmp_path / "machine").mkdir()
    env, log = logging_machine(tmp_path / "machine")
    env = {k: v for k, v in env.items() if k not in ("GATE_VENV", "GATE_NO_INSTALL")}
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy2(ROOT / "gate", clone / "gate")
    (clone / ".venv").write_text("a tox redirect\n")
    done = subprocess.run([str(clone / "gate"), "test"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == ("gate: .venv is a file, not a virtual environment (a tool such as tox 4 leaves one there); "
                           "remove it (rm .venv), or set GATE_VENV=DIR to keep the gate's environment in another "
                           "folder\n")
    assert not [line for line in log.read_text().splitlines() if "venv" in line]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_a_venv_file_is_ignored_by_git_like_the_folder():
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", ".venv"], timeout=60)
    assert ignored.returncode == 0


def test_runs_lists_this_tiers_stored_runs_with_pytest_benchmarks_own_command():
    """`pytest-benchmark list` in the root reads ./.benchmarks, which the gate never writes; `./gate runs` names
    the tier's folder for it."""
    env = dict(os.environ, GATE_NO_INSTALL="1", GPUENGINE_DEVICE="cpu",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    done = subprocess.run([str(ROOT / "gate"), "runs"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stored = {str(p) for p in (ROOT / "baselines_store" / "cpu-tier").glob("*/[0-9][0-9][0-9][0-9]_*.json")}
    assert stored and set(done.stdout.split()) == stored


def test_wheels_fetches_another_lock_of_the_tier_where_named(tmp_path):
    env, log = logging_machine(tmp_path)
    for extra in ([], ["--lock", "HEAD~3:locks/cuda13.txt"]):
        subprocess.run([str(ROOT / "gate"), "wheels", "DIR", "--have", "FREEZE", *extra], env=env, check=True,
                       capture_output=True, timeout=60)
    runs = [line for line in log.read_text().splitlines() if "gpuengine.gate.stack.cli" in line]
    assert runs == [f"-m gpuengine.gate.stack.cli wheels --lock {lock} --tier cuda13 --python-version 3.12 "
                    "DIR --have FREEZE" for lock in ("locks/cuda13.txt", "HEAD~3:locks/cuda13.txt")]
