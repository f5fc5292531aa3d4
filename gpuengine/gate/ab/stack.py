"""`./gate perf --against-stack LOCK`: an A/B session whose base is another lock's stack, the code the same.

Judging a lock refresh is an A/B run like judging a commit: two workers,
rounds alternating with the references, the rule of gpuengine/gate/rules/paired.py.
Here both workers import the working tree (gpuengine/gate/ab/worker.py puts it
first on sys.path); the head runs in the gate's Python, whose lock is the
tier's `locks/<tier>.txt`, and the base in an environment holding LOCK's
packages (gpuengine/gate/stack/env.py: a venv where a registry is; with
GATE_NO_INSTALL=1 this Python with the packages it does not meet installed
from `--stack-wheels DIR` first on PYTHONPATH). LOCK is a file or REV:PATH
(gpuengine/gate/stack/change.py).

What the session says and keeps: the change between the two locks, printed
once before the base's environment is built and kept in each test's
extra_info["ab"]["stack_change"]; the base's label, "stack cuda13 lock
3f1a2b3c4d5e (nvidia-cudnn-frontend 1.22.1 -> 1.32.0 on the head)", in the
header, the failure lines and extra_info["ab"]["base"]; both locks' ids, so an
A/A-noise estimate never takes a stack change for process noise
(gpuengine/gate/rules/aa_noise.py). The run is stored as any A/B run, under the
head's lock. Where the locks pin different cuDNN or cuDNN frontend versions
the sides share no plans: each autotunes its own (docs/gate.md, "The locked
stack"). gpuengine/gate/ab/session.py calls `resolve` from its configure hook;
gpuengine/gate/spread.py calls `prepare_from_args` once before its per-GPU
sessions, which then reuse the environment.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuengine.gate.stack.change import (OtherLock, StackChange, base_label, cudnn_packages, read_other_lock,
                                      shares_plans, stack_change)
from gpuengine.gate.stack.env import NO_INSTALL_ENV, WHEELS_ENV, Say, StackEnv, StackEnvError, prepare, say_on_stderr
from gpuengine.bench.stack_lock import REPO, Lock, LockError, current_record, lock_path, read_lock

AGAINST_STACK, STACK_WHEELS = "--against-stack", "--stack-wheels"


class StackBaseError(Exception):
    """The other stack cannot be the base; the message names LOCK (or the option) and the cause."""


@dataclass(frozen=True)
class StackBase:
    """The base of a stack A/B: the other lock, how the head's differs, and the environment built for it."""

    other: OtherLock
    head: Lock
    head_differs: tuple[str, ...]   # how the gate's Python differs from the head's lock (GATE_NO_INSTALL=1)
    change: StackChange
    env: StackEnv

    @property
    def label(self) -> str:
        return base_label(self.other, self.change)

    @property
    def head_file(self) -> str:
        return shown(self.head.path)

    @property
    def shares_plans(self) -> bool:
        return shares_plans(self.change)

    def plans_line(self) -> str:
        if self.shares_plans:
            return "cuDNN plans: both sides run the same (the base's choices are handed to the head)"
        return (f"cuDNN plans: not shared ({', '.join(cudnn_packages(self.change))} changed): each side autotunes "
                "its own, the kept plans set aside")

    def notice(self) -> str:
        """The header's line: which stack each side runs, and where."""
        head = f"{self.head_file} lock {self.head.sha256}"
        if self.head_differs:
            head += f", this Python differing in {', '.join(self.head_differs)}"
        return (f"A/B against {self.label}: {AGAINST_STACK} {self.other.spec}; the working tree's engine on both "
                f"sides, each in its own process: the base in {self.env.describe()}, the head in this Python "
                f"({head}); {self.plans_line()}")

    def record(self) -> dict:
        """What each test's extra_info["ab"] keeps of the stacks."""
        installed = list(self.env.packages) if self.env.how == "site" else []   # a venv holds the whole lock
        return {"stack_change": self.change.as_dict(),
                "base_lock": {"spec": self.other.spec, "tier": self.other.lock.tier, "sha256": self.other.sha256,
                              "environment": self.env.how, "installed": installed},
                "head_lock": {"file": self.head_file, "tier": self.head.tier, "sha256": self.head.sha256,
                              "differs": list(self.head_differs)},
                "plans_shared": self.shares_plans}


def shown(path: Path) -> str:
    """A lock file as the user would name it: relative to the checkout where it lies in it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def head_lock() -> tuple[Lock, tuple[str, ...]]:
    """The lock of the environment the gate runs in (the tier's), and how this Python differs from it."""
    record = current_record()
    if not record.get("tier") or not record.get("sha256"):
        raise StackBaseError(f"{AGAINST_STACK}: the head's lock is unknown ({record.get('problem') or 'no tier'}); "
                             "a stack A/B compares it with LOCK")
    try:
        lock = read_lock(lock_path(record["tier"]), record["tier"])
    except LockError as exc:
        raise StackBaseError(f"{AGAINST_STACK}: the head's lock: {exc}") from None
    return lock, tuple(record.get("differs") or ())


def resolve(spec: str, root: Path, *, no_install: bool, wheels: str | None, say: Say = say_on_stderr) -> StackBase:
    """The base of `--against-stack spec`: the lock read, its change against the head's said, its environment
    built or reused. StackBaseError naming the problem otherwise."""
    head, head_differs = head_lock()
    try:
        other = read_other_lock(spec, head.tier, Path(root))
    except LockError as exc:
        raise StackBaseError(str(exc)) from None
    change = stack_change(other.lock, head)
    say(f"stack A/B: base {spec} ({other.lock.tier} lock {other.sha256}), head {shown(head.path)} ({head.tier} lock "
        f"{head.sha256}); the change: " + "\n".join(change.lines()))
    try:
        env = prepare(other, Path(root), no_install=no_install, wheels=wheels, say=say)
    except StackEnvError as exc:
        raise StackBaseError(str(exc)) from None
    if env.how != "venv":   # this Python's packages stay importable on the base: say which the base's lock lacks
        kept = [f"{name} {version}" for name, version in change.added]
        if kept:
            say(f"the base's lock lacks {', '.join(kept)}: this Python has them, and the base imports them too "
                "(a venv, where a registry is, leaves them out)")
    return StackBase(other, head, head_differs, change, env)


def wheels_setting(option: str | None, environ=None) -> str | None:
    """--stack-wheels, else GATE_STACK_WHEELS where nothing is installed (GATE_NO_INSTALL=1)."""
    environ = os.environ if environ is None else environ
    if option is not None:
        return option
    if environ.get(NO_INSTALL_ENV, "0") == "1":
        return environ.get(WHEELS_ENV) or None
    return None


def no_install(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(NO_INSTALL_ENV, "0") == "1"


def _option(args: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in a pytest command line (the last one wins, as argparse's)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def prepare_from_args(args: list[str], root: Path, say: Say = say_on_stderr) -> StackBase | None:
    """For gpuengine/gate/spread.py: the base's environment built once, before the per-GPU sessions that reuse it;
    None where the command line names no --against-stack."""
    spec = _option(args, AGAINST_STACK)
    if spec is None:
        return None
    return resolve(spec, root, no_install=no_install(), wheels=wheels_setting(_option(args, STACK_WHEELS)), say=say)
