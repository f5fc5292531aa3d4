"""One case profiled at two checkouts, base and head, each in a process of its own, and the two profiles diffed.

`python -m gpuengine profile WORKLOAD --against REV` (cli.py) and the gate,
for an A/B test that regressed (gpuengine/gate/regression_profiles.py), both
come here with the base's checkout on disk (the gate's A/B checkout,
gpuengine/gate/ab/checkout.py, makes it) and the head's, the working tree.

Each side runs its own checkout's profile command, the engine alone (no
PyTorch reference), in a fresh process whose working folder and first path
entry are that checkout, so its `gpuengine` is that checkout's: the same
case, one warmed and captured round of `steps_per_replay` steps per replay,
its medians per step. Each writes into a scratch store of its own,
`build/profile-against/<side>/`, which first receives a copy of this GPU
kind's kept cuDNN plans, so both sides start from the same plans and the
stored profiles are left alone. A side's output goes to
`build/profile-against/<side>.log`; a side that fails is one error naming
it, its exit status and the log's last lines.

The injected slowdown of the power study (bench/injected_delay.py), where
the environment arms it, reaches the head alone, as in the A/B power study:
an A/A pair with a known slowdown, to see the diff name its kernel.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..cudnn_plans import PLAN_FILE
from ..injected_delay import DELAY_ENV
from .diff import ProfileDiff, diff_profiles, load_profile
from .record import ProfileCase, case_words, profile_path

SCRATCH = Path("build") / "profile-against"   # relative to the working folder, like the gate's build/ab
SIDE_TIMEOUT_S = 1800   # building, autotuning what the kept plans lack, and profiling: minutes for ResNet-50
COMMIT_ENV = ("GATE_COMMIT_ID", "GATE_COMMIT_DIRTY", "GATE_COMMIT_BRANCH")   # machine_info.named_commit's


class SideFailed(RuntimeError):
    """One side's profile command failed; the message names the side, its checkout and why."""


@dataclass(frozen=True)
class Checkout:
    root: Path
    commit: str | None   # the commit its profile is to name where git cannot say (a copy with a COMMIT file)
    label: str           # what messages call it: "base 66b85b0", "head"


def side_command(case: ProfileCase, replays: int, store: Path) -> list[str]:
    """The profile command of one side: the engine alone, into `store`."""
    return [sys.executable, "-m", "gpuengine", "profile", *case_words(case), "--replays", str(replays),
            "--references", "--store", str(store)]


def side_environment(checkout: Checkout, head: bool, environ=None) -> dict[str, str]:
    """This process's environment with the checkout first on the path. The base neither takes the commit the
    head was named by (GATE_COMMIT_ID names the working tree) nor the injected delay."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout.root), env.get("PYTHONPATH", "")) if p)
    if not head:
        for name in (*COMMIT_ENV, DELAY_ENV):
            env.pop(name, None)
        if checkout.commit:
            env["GATE_COMMIT_ID"] = checkout.commit
    return env


def run_logged(command: list[str], cwd: Path, env: dict, log: Path, timeout_s: float) -> int:
    """Run `command`, its output into `log`; its exit status (SideFailed when it outlives `timeout_s`)."""
    with open(log, "wb") as out:
        try:
            return subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            raise SideFailed(f"{' '.join(command[2:5])} ran past {timeout_s:.0f} s and was stopped; see {log}") \
                from None


def _tail(log: Path, lines: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def profile_side(name: str, checkout: Checkout, case: ProfileCase, replays: int, tier_name: str, plans: Path | None,
                 scratch: Path = SCRATCH, run: Callable | None = None, timeout_s: float = SIDE_TIMEOUT_S):
    """One side's profile (record.StoredProfile), made by `checkout`'s profile command in a store of its own;
    `run(command, cwd, env, log, timeout_s) -> status` runs it (run_logged; a CPU test's stand-in)."""
    run = run or run_logged
    store = Path(scratch).resolve() / name   # absolute: the side's process works in its own checkout
    shutil.rmtree(store, ignore_errors=True)
    (store / tier_name).mkdir(parents=True)
    if plans is not None and plans.is_file():
        shutil.copy2(plans, store / tier_name / PLAN_FILE)
    log = Path(scratch) / f"{name}.log"
    status = run(side_command(case, replays, store), checkout.root, side_environment(checkout, name == "head"), log,
                 timeout_s)
    if status != 0:
        raise SideFailed(f"the {name}'s profile ({checkout.label}, {checkout.root}) exited with status {status}; "
                         f"the end of {log}:\n{_tail(log)}")
    path = profile_path(store, tier_name, case)
    if not path.is_file():
        raise SideFailed(f"the {name}'s profile ({checkout.label}) wrote no {path}; the end of {log}:\n{_tail(log)}")
    return load_profile(path)


def profile_base_and_head(case: ProfileCase, base: Checkout, head: Checkout, replays: int, tier_name: str,
                          plans: Path | None, scratch: Path = SCRATCH, log: Callable[[str], None] = print,
                          run: Callable | None = None) -> ProfileDiff:
    """The base profiled, then the head, then the diff of their engines (diff.diff_profiles)."""
    profiles = {}
    for name, checkout in (("base", base), ("head", head)):
        log(f"profile: {name} ({checkout.label}): {case.describe()}, log in {Path(scratch) / f'{name}.log'}")
        profiles[name] = profile_side(name, checkout, case, replays, tier_name, plans, scratch, run)
    return diff_profiles(profiles["base"], profiles["head"])


def head_checkout(root: Path) -> Checkout:
    """The working tree (its commit as git or GATE_COMMIT_ID says, in its own process)."""
    return Checkout(Path(root), None, "head, the working tree")
