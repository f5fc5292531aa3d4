"""The base's environment of a stack A/B: the other lock's packages, where the base's worker imports them from.

`./gate perf --against-stack LOCK` (gpuengine/gate/stack/change.py) runs the
working tree's engine twice, the head in the gate's own Python and the base
in one that holds LOCK's packages. The worker puts the checkout first on
sys.path, so neither environment installs gpuengine. Two ways, by whether
this machine reaches a package registry:

- **A registry** (the default): a virtual environment at
  build/stacks/<lock id>/ (the lock id is stack_lock's sha256 of its pins),
  made with `python -m venv` and `pip install -r LOCK`, PYTHONPATH cleared
  for the worker so the head's packages cannot leak in. It is reused while
  its stamp (the lock id and this Python's version and prefix) matches.
- **No registry** (GATE_NO_INSTALL=1: a lent GPU machine, wheels brought by
  hand): the base runs this same Python with build/stacks/<lock id>/site
  first on PYTHONPATH, into which only the packages whose version in LOCK
  this Python does not meet (stack_lock's comparison: a local label such as
  +cu130 the pin lacks is no difference) are installed from a folder of
  wheels (`--stack-wheels DIR`, or GATE_STACK_WHEELS): `pip install
  --no-index --no-deps --find-links DIR --target ...`. A package the folder
  lacks is one error naming it and the `./gate wheels` command that fetches
  it; nothing to install (the lock is this Python's) runs the base as it is.

Either is built aside (a folder named `.<name>.building-<pid>`) and renamed
into place with its stamp inside, so a build that failed or was killed is
never reused; its leftovers are removed by the next build. A failure is one
StackEnvError naming LOCK and the last lines of what failed (pip's log
beside the environment). After the rename a venv is used only as
`bin/python`, whose prefix follows its folder; its scripts' first lines
still name the folder it was built in, and nothing here runs them.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from packaging.specifiers import SpecifierSet
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from .change import OtherLock
from gpuengine.bench.stack_lock import Difference, differences, installed_versions

STACKS = Path("build") / "stacks"   # under the checkout: git-ignored (/build/)
STAMP_FILE = "gate-stack.json"      # inside the built folder: present only once the build succeeded
LOCK_COPY = "lock.txt"              # the venv's own copy of the lock it was installed from
NO_INSTALL_ENV = "GATE_NO_INSTALL"  # ./gate's switch for a machine without a registry
WHEELS_ENV = "GATE_STACK_WHEELS"    # --stack-wheels' default
LOG_LINES = 15                      # of a failed command's log, in its error

Run = Callable[[list, Path], int]   # runs a command with its output appended to a log; returns the exit status
Say = Callable[[str], None]


class StackEnvError(Exception):
    """The base's environment cannot be built or used; the message names the lock and the cause."""


@dataclass(frozen=True)
class StackEnv:
    """How the base's worker runs: its Python, its whole environment, and what was built for it."""

    python: str
    environ: dict[str, str]
    how: str                      # "venv", "site" or "as is"
    where: Path | None            # the venv or the site folder; None as is
    packages: tuple[str, ...]     # name==version installed for it (a venv: the whole lock)
    reused: bool = False

    def describe(self) -> str:
        built = "reused" if self.reused else "built now"
        if self.how == "venv":
            return f"a venv at {self.where} ({len(self.packages)} packages, {built})"
        if self.how == "site":
            return (f"this Python with {self.where} first on PYTHONPATH ({', '.join(self.packages)}; {built})")
        return "this Python as it is (it has every package of the lock at its version)"


def run_logged(command: list, log: Path) -> int:
    with open(log, "ab") as out:
        return subprocess.run([str(part) for part in command], stdout=out, stderr=subprocess.STDOUT).returncode


def say_on_stderr(text: str) -> None:
    print(f"gate: {text}", file=sys.stderr, flush=True)


def python_identity() -> str:
    """What a built environment depends on of this Python: a venv links to it, --target wheels fit its version."""
    return f"{platform.python_implementation()} {platform.python_version()} {sys.base_prefix}"


def read_stamp(folder: Path) -> dict | None:
    try:
        stamp = json.loads((folder / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _clear_leftovers(parent: Path, prefix: str) -> None:
    """Folders a killed build left aside (`prefix` + its pid), whose process is gone."""
    if not parent.is_dir():
        return
    for folder in parent.glob(prefix + "*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue   # that build is still running
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(folder, ignore_errors=True)


def _put_in_place(built: Path, target: Path) -> None:
    """Rename the finished folder to `target`, the one there before (stale, or half-made) removed after."""
    stale = None
    if target.exists() or target.is_symlink():
        stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
        os.rename(target, stale)
    os.rename(built, target)
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


def _log_tail(log: Path) -> str:
    try:
        with open(log, errors="replace") as text:
            return "".join(deque(text, maxlen=LOG_LINES)).rstrip() or "(no output)"
    except OSError:
        return "(no log)"


def _build(other: OtherLock, target: Path, stamp: dict, log: Path, steps, run: Run) -> None:
    """Run `steps(aside)` -> [(what, command)] in a folder beside `target`, stamp it, rename it into place; on a
    failure remove it and raise StackEnvError with the end of the log."""
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.building-"
    for leftover in (prefix, f".{target.name}.stale-"):
        _clear_leftovers(target.parent, leftover)
    aside = target.parent / f"{prefix}{os.getpid()}"
    shutil.rmtree(aside, ignore_errors=True)
    log.write_text("")
    try:
        for what, command in steps(aside):
            status = run(command, log)
            if status != 0:
                raise StackEnvError(f"--against-stack {other.spec}: {what} failed (exit status {status}); nothing "
                                    f"was kept. The end of its log {log}:\n{_log_tail(log)}")
        aside.mkdir(parents=True, exist_ok=True)
        (aside / STAMP_FILE).write_text(json.dumps(stamp, indent=1) + "\n")
        if read_stamp(target) == stamp:   # another session finished the same meanwhile: its workers may run it
            shutil.rmtree(aside, ignore_errors=True)
            return
        _put_in_place(aside, target)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise


def venv_env(other: OtherLock, root: Path, environ: Mapping[str, str], say: Say, run: Run = run_logged) -> StackEnv:
    """The registry way: build/stacks/<lock id>/, a venv holding the lock, reused while its stamp matches."""
    target = Path(root) / STACKS / other.sha256
    stamp = {"how": "venv", "lock": other.sha256, "python": python_identity()}
    packages = tuple(f"{name}=={version}" for name, version in sorted(other.lock.pins.items()))
    env = {key: value for key, value in environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env["VIRTUAL_ENV"] = str(target)
    env["PATH"] = os.pathsep.join(filter(None, [str(target / "bin"), environ.get("PATH", "")]))
    built = StackEnv(str(target / "bin" / "python"), env, "venv", target, packages)
    if read_stamp(target) == stamp and (target / "bin" / "python").exists():
        say(f"the base's stack {other.spec}: reusing the venv at {target} (its stamp matches)")
        return replace(built, reused=True)
    log = target.parent / f"{other.sha256}.log"
    say(f"the base's stack {other.spec}: building a venv at {target}: python -m venv, then pip install -r the "
        f"lock ({len(packages)} packages; minutes the first time; pip's output in {log})")

    def steps(aside: Path):
        yield "python -m venv", [sys.executable, "-m", "venv", aside]
        (aside / LOCK_COPY).write_text(other.text)   # a REV:PATH lock has no file of its own
        yield "pip install -r", [aside / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
                                 "-r", aside / LOCK_COPY]

    _build(other, target, stamp, log, steps, run)
    say(f"the base's stack {other.spec}: the venv at {target} is ready")
    return built


def _meets(locked: str, version) -> bool:
    try:
        return SpecifierSet(f"=={locked}").contains(version, prereleases=True)
    except InvalidVersion:
        return False


def wheels_lacking(needed: list[Difference], wheels: Path) -> list[Difference]:
    """The pins of `needed` with no wheel in `wheels` that this Python takes at the pinned version."""
    tags = set(sys_tags())
    found: dict[str, list] = {}
    for path in wheels.glob("*.whl"):
        try:
            name, version, _, wheel_tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if wheel_tags & tags:
            found.setdefault(name, []).append(version)
    return [d for d in needed if not any(_meets(d.locked, version) for version in found.get(d.name, []))]


def fetch_command(other: OtherLock, wheels: Path | None) -> str:
    return (f"./gate wheels {wheels or 'DIR'} --have FREEZE --tier {other.lock.tier} --lock {other.spec} "
            "where a registry is (FREEZE: `python3 -m pip freeze` run here with this session's PYTHONPATH, or the "
            "head's lock where this Python meets it)")


def _needed_lines(needed: list[Difference]) -> str:
    return "\n".join(f"  {d.name}=={d.locked}   (this Python has {d.installed or 'none'})" for d in needed)


def site_env(other: OtherLock, root: Path, wheels: Path | None, environ: Mapping[str, str], say: Say,
             run: Run = run_logged, installed: Mapping[str, str | None] | None = None) -> StackEnv:
    """The no-registry way: this Python, with build/stacks/<lock id>/site first on PYTHONPATH holding the pins
    it does not meet, installed from the wheels in `wheels`."""
    installed = installed_versions() if installed is None else installed
    needed = differences(other.lock, installed)
    if not needed:
        say(f"the base's stack {other.spec}: this Python has every package of it at its version; nothing to "
            "install, the base runs this Python as it is")
        return StackEnv(sys.executable, dict(environ), "as is", None, ())
    target = Path(root) / STACKS / other.sha256 / "site"
    packages = tuple(f"{d.name}=={d.locked}" for d in needed)
    stamp = {"how": "site", "lock": other.sha256, "python": python_identity(), "packages": list(packages)}
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), environ.get("PYTHONPATH", "")]))
    built = StackEnv(sys.executable, env, "site", target, packages)
    if read_stamp(target) == stamp:
        say(f"the base's stack {other.spec}: reusing {target} ({len(packages)} packages, its stamp matches)")
        return replace(built, reused=True)
    if wheels is None:
        raise StackEnvError(f"--against-stack {other.spec}: the base needs {len(needed)} package(s) this Python "
                            f"lacks or has at another version, and no wheels were given (--stack-wheels DIR or "
                            f"{WHEELS_ENV}):\n{_needed_lines(needed)}\nfetch them with "
                            f"{fetch_command(other, None)}")
    wheels = Path(wheels).resolve()
    if not wheels.is_dir():
        raise StackEnvError(f"--stack-wheels {wheels}: no such folder (the wheels {fetch_command(other, wheels)} "
                            "downloads)")
    lacking = wheels_lacking(needed, wheels)
    if lacking:
        raise StackEnvError(f"--against-stack {other.spec}: {wheels} has no wheel for this Python of "
                            f"{len(lacking)} package(s) the base needs:\n{_needed_lines(lacking)}\nfetch them with "
                            f"{fetch_command(other, wheels)}")
    log = target.parent / "site.log"
    say(f"the base's stack {other.spec}: installing the {len(packages)} package(s) this Python does not meet into "
        f"{target} from {wheels}: {', '.join(packages)}")

    def steps(aside: Path):
        yield "pip install --target", [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                                       "--no-index", "--no-deps", "--find-links", wheels, "--target", aside,
                                       *packages]

    _build(other, target, stamp, log, steps, run)
    return built


def prepare(other: OtherLock, root: Path, *, no_install: bool, wheels: Path | str | None = None,
            environ: Mapping[str, str] | None = None, say: Say = say_on_stderr, run: Run = run_logged,
            installed: Mapping[str, str | None] | None = None) -> StackEnv:
    """The base's environment for `other`: a venv where a registry is, else this Python with the wheels it
    lacks (`no_install`, GATE_NO_INSTALL=1); StackEnvError naming the lock and the cause where it cannot be."""
    environ = dict(os.environ if environ is None else environ)
    if not no_install:
        if wheels is not None:
            raise StackEnvError(f"--stack-wheels {wheels} is for a machine without a registry ({NO_INSTALL_ENV}=1); "
                                "with one, the base's venv installs the lock from it")
        return venv_env(other, root, environ, say, run)
    return site_env(other, root, Path(wheels) if wheels else None, environ, say, run, installed)
