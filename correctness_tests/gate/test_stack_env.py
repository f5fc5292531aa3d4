"""The base's environment of a stack A/B (gpuengine/gate/stack/env.py), pip stood in: what it installs and how,
the error for a wheel folder lacking a package, the stamp that lets it be reused, and that nothing half-made is."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuengine.gate.stack import env as stack_env
from gpuengine.gate.stack.change import OtherLock
from gpuengine.gate.stack.env import STACKS, StackEnvError
from gpuengine.bench.stack_lock import Lock

PINS = {"nvidia-cudnn-frontend": "1.22.1", "numpy": "2.4.6", "torch": "2.11.0", "nvmath-python": "1.0.0"}
# This Python, as a lent H100 with the new lock's wheels has it: torch with its local label, the new frontend.
INSTALLED = {"nvidia-cudnn-frontend": "1.32.0", "numpy": "2.4.6", "torch": "2.11.0+cu130", "pytest": "9.1.1"}
NEEDED = ["nvidia-cudnn-frontend==1.22.1", "nvmath-python==1.0.0"]


def other_lock(pins=None) -> OtherLock:
    pins = PINS if pins is None else pins
    text = "".join(f"{name}=={version}\n" for name, version in pins.items())
    return OtherLock("build/old.txt", Lock("cuda13", Path("build/old.txt"), pins), text)


class FakePip:
    """Stands in for `python -m venv` and pip: records each command and makes what it would have made."""

    def __init__(self, fail: str | None = None):
        self.commands: list[list[str]] = []
        self.fail = fail   # a word of the command that fails, e.g. "pip"

    def __call__(self, command, log: Path) -> int:
        command = [str(part) for part in command]
        self.commands.append(command)
        if self.fail and self.fail in command:
            with open(log, "a") as out:
                out.write("Collecting torch==2.11.0\nERROR: No matching distribution found for torch==2.11.0\n")
            return 1
        if command[1:3] == ["-m", "venv"]:
            bin_dir = Path(command[3]) / "bin"
            bin_dir.mkdir(parents=True)
            (bin_dir / "python").symlink_to(sys.executable)
        elif "--target" in command:
            target = Path(command[command.index("--target") + 1])
            for pin in command[command.index("--target") + 2:]:
                (target / f"{pin.replace('==', '-')}.dist-info").mkdir(parents=True)
        return 0


def lines(said: list[str]) -> str:
    return "\n".join(said)


def test_a_venv_holds_the_lock_without_the_heads_pythonpath_and_is_reused_while_its_stamp_matches(tmp_path):
    pip, said = FakePip(), []
    environ = {"PYTHONPATH": "/head/wheels", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0"}
    env = stack_env.prepare(other_lock(), tmp_path, no_install=False, environ=environ, say=said.append, run=pip)
    target = tmp_path / STACKS / other_lock().sha256
    (create, install) = pip.commands
    venv = create[3]
    assert create == [sys.executable, "-m", "venv", venv]
    assert install == [f"{venv}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "-r",
                       f"{venv}/lock.txt"] and venv != str(target)   # built aside, then renamed
    assert (target / "lock.txt").read_text() == other_lock().text   # a REV:PATH lock has no file of its own
    assert env.how == "venv" and env.python == str(target / "bin" / "python") and not env.reused
    assert "PYTHONPATH" not in env.environ and env.environ["VIRTUAL_ENV"] == str(target)
    assert env.environ["PATH"] == f"{target / 'bin'}{os.pathsep}/usr/bin" and env.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, f"{target.name}.log"]   # nothing aside
    assert "building a venv at" in lines(said) and "pip install -r" in lines(said)
    again = stack_env.prepare(other_lock(), tmp_path, no_install=False, environ=environ, say=said.append, run=pip)
    assert len(pip.commands) == 2 and again.reused and again.python == env.python
    assert "reusing the venv" in said[-1]


def test_a_venv_of_another_python_or_lock_is_built_again(tmp_path, monkeypatch):
    pip = FakePip()
    stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None, run=pip)
    monkeypatch.setattr(stack_env, "python_identity", lambda: "CPython 3.12.9 /usr")
    stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None, run=pip)
    assert len(pip.commands) == 4
    moved = other_lock({**PINS, "numpy": "2.5.0"})
    stack_env.prepare(moved, tmp_path, no_install=False, environ={}, say=lambda _: None, run=pip)
    assert len(pip.commands) == 6 and (tmp_path / STACKS / moved.sha256 / stack_env.STAMP_FILE).is_file()


def test_a_failed_install_is_one_error_with_pips_last_lines_and_leaves_nothing(tmp_path):
    with pytest.raises(StackEnvError) as raised:
        stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None,
                          run=FakePip(fail="pip"))
    message = str(raised.value)
    assert message.startswith("--against-stack build/old.txt: pip install -r failed (exit status 1); nothing was kept")
    assert message.endswith("ERROR: No matching distribution found for torch==2.11.0")
    folder = tmp_path / STACKS
    assert [p.name for p in folder.iterdir()] == [f"{other_lock().sha256}.log"]


def test_a_half_made_folder_is_never_reused_and_a_killed_builds_leftovers_go(tmp_path):
    target = tmp_path / STACKS / other_lock().sha256
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").symlink_to(sys.executable)   # a venv whose install never finished: no stamp
    leftover = target.parent / f".{target.name}.building-999999999"   # a pid no process has
    leftover.mkdir()
    pip = FakePip()
    env = stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None, run=pip)
    assert len(pip.commands) == 2 and not env.reused and stack_env.read_stamp(target)["lock"] == other_lock().sha256
    assert not leftover.exists() and not list(target.parent.glob(".*"))


def test_a_venv_another_session_finished_meanwhile_is_left_to_it(tmp_path):
    target = tmp_path / STACKS / other_lock().sha256
    pip = FakePip()

    def racing(command, log):   # while this build installs, another session's build of the same lock lands
        if "pip" in map(str, command):
            target.mkdir(parents=True)
            (target / "theirs").write_text("")
            (target / stack_env.STAMP_FILE).write_text(json.dumps(
                {"how": "venv", "lock": other_lock().sha256, "python": stack_env.python_identity()}))
        return pip(command, log)

    stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None, run=racing)
    assert (target / "theirs").exists() and not list(target.parent.glob(".*"))   # theirs kept, ours dropped


def test_a_renamed_venv_still_runs_as_its_own_prefix(tmp_path):
    def venv_without_pip(command, log):
        command = [str(part) for part in command]
        if command[1:3] == ["-m", "venv"]:
            return subprocess.run(command[:3] + ["--without-pip", command[3]]).returncode
        return 0   # pip stood in

    env = stack_env.prepare(other_lock(), tmp_path, no_install=False, environ={}, say=lambda _: None,
                            run=venv_without_pip)
    prefix = subprocess.run([env.python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                            env={}).stdout.strip()
    assert Path(prefix) == tmp_path / STACKS / other_lock().sha256


def wheel_folder(tmp_path, *names) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_without_a_registry_only_the_pins_this_python_does_not_meet_are_installed_from_the_wheels(tmp_path):
    wheels = wheel_folder(tmp_path, "nvidia_cudnn_frontend-1.22.1-py3-none-any.whl",
                          "nvidia_cudnn_frontend-1.32.0-py3-none-any.whl", "nvmath_python-1.0.0-py3-none-any.whl")
    pip, said = FakePip(), []
    environ = {"PYTHONPATH": "/work/.whl/site", "GATE_NO_INSTALL": "1"}
    env = stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=wheels, environ=environ,
                            say=said.append, run=pip, installed=INSTALLED)
    target = tmp_path / STACKS / other_lock().sha256 / "site"
    (command,) = pip.commands
    aside = command[command.index("--target") + 1]
    assert command == [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
                       "--no-deps", "--find-links", str(wheels), "--target", aside, *NEEDED] and aside != str(target)
    assert env.how == "site" and env.python == sys.executable and env.packages == tuple(NEEDED)
    assert env.environ["PYTHONPATH"] == f"{target}{os.pathsep}/work/.whl/site"   # the base's wheels come first
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [stack_env.STAMP_FILE, "nvidia-cudnn-frontend-1.22.1.dist-info", "nvmath-python-1.0.0.dist-info"])
    assert "nvidia-cudnn-frontend==1.22.1, nvmath-python==1.0.0" in said[-1]
    again = stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=wheels, environ=environ,
                              say=said.append, run=pip, installed=INSTALLED)
    assert again.reused and len(pip.commands) == 1
    moved = {**INSTALLED, "nvmath-python": "1.0.0"}   # this Python changed: another set to install, built again
    stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=wheels, environ=environ, say=said.append,
                      run=pip, installed=moved)
    assert pip.commands[-1][-1] == "nvidia-cudnn-frontend==1.22.1" and len(pip.commands) == 2


def test_a_wheel_folder_lacking_a_package_is_one_error_naming_it_and_the_command_that_fetches_it(tmp_path):
    wheels = wheel_folder(tmp_path, "nvidia_cudnn_frontend-1.22.1-py3-none-any.whl",
                          "nvmath_python-1.0.1-py3-none-any.whl",           # another version
                          "nvmath_python-1.0.0-cp27-cp27m-win32.whl")     # not for this Python
    pip = FakePip()
    with pytest.raises(StackEnvError) as raised:
        stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=wheels, environ={}, say=lambda _: None,
                          run=pip, installed=INSTALLED)
    message = str(raised.value)
    assert f"{wheels} has no wheel for this Python of 1 package(s) the base needs" in message
    assert "  nvmath-python==1.0.0   (this Python has none)" in message and "frontend" not in message
    assert f"./gate wheels {wheels} --have FREEZE --tier cuda13 --lock build/old.txt" in message
    assert pip.commands == [] and not (tmp_path / STACKS).exists()


def test_without_wheels_or_with_a_missing_folder_the_error_names_what_is_needed(tmp_path):
    with pytest.raises(StackEnvError) as raised:
        stack_env.prepare(other_lock(), tmp_path, no_install=True, environ={}, say=lambda _: None, run=FakePip(),
                          installed=INSTALLED)
    message = str(raised.value)
    assert "the base needs 2 package(s) this Python lacks or has at another version" in message
    assert "(--stack-wheels DIR or GATE_STACK_WHEELS)" in message
    assert "  nvidia-cudnn-frontend==1.22.1   (this Python has 1.32.0)" in message
    assert "./gate wheels DIR --have FREEZE --tier cuda13 --lock build/old.txt" in message
    with pytest.raises(StackEnvError, match="--stack-wheels .*/nowhere: no such folder"):
        stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=tmp_path / "nowhere", environ={},
                          say=lambda _: None, run=FakePip(), installed=INSTALLED)


def test_a_lock_this_python_meets_runs_the_base_as_it_is(tmp_path):
    pip, said = FakePip(), []
    environ = {"PYTHONPATH": "/work/.whl/site"}
    met = {**INSTALLED, "nvidia-cudnn-frontend": "1.22.1", "nvmath-python": "1.0.0"}
    env = stack_env.prepare(other_lock(), tmp_path, no_install=True, environ=environ, say=said.append, run=pip,
                            installed=met)
    assert env.how == "as is" and env.environ == environ and env.python == sys.executable and env.packages == ()
    assert pip.commands == [] and not (tmp_path / STACKS).exists() and "nothing to install" in said[-1]


def test_a_failed_target_install_keeps_nothing_and_wheels_need_no_install_mode(tmp_path):
    wheels = wheel_folder(tmp_path, "nvidia_cudnn_frontend-1.22.1-py3-none-any.whl",
                          "nvmath_python-1.0.0-py3-none-any.whl")
    with pytest.raises(StackEnvError, match="pip install --target failed"):
        stack_env.prepare(other_lock(), tmp_path, no_install=True, wheels=wheels, environ={}, say=lambda _: None,
                          run=FakePip(fail="--target"), installed=INSTALLED)
    assert [p.name for p in (tmp_path / STACKS / other_lock().sha256).iterdir()] == ["site.log"]
    with pytest.raises(StackEnvError, match="--stack-wheels .* is for a machine without a registry"):
        stack_env.prepare(other_lock(), tmp_path, no_install=False, wheels=wheels, environ={}, say=lambda _: None,
                          run=FakePip())
