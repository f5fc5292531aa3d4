"""Which engine `./gate perf --against` compares with, checked out where a worker can import it.

    --against REV    a commit, checked out with `git worktree` in a temporary folder outside the tree
    --against DIR    a checkout already on disk (a machine whose copy has no usable git history); its commit
                     is git's there, else the first word of a file named COMMIT at its top
    --against auto   what `./gate perf` passes: in a branch, the merge base with main; on main, the commit of
                     the newest stored baseline of this GPU; no git history or no such commit: stored-run mode
    --against none   (the plugin's default, as `pytest perf_tests --benchmark-compare`): stored-run mode
    --head REV|DIR   with --against REV|DIR: another checkout as the head instead of the working tree, found
                     the same way (`./gate bisect`'s steps, gpuengine/gate/bisect.py)
A base that cannot be checked out is one error naming REV and git's words.
The worktree is removed when the session ends (Ctrl-C included: pytest's
cleanup, and atexit behind it). A session killed outright (SIGKILL, a lease
running out) cannot remove it, and `git worktree prune` drops only entries
whose folder is gone, so each worktree lives in a folder beside a lock file
its session holds (owner.py: the kernel lets go when the session dies), and
`remove_stale_worktrees`, which every A/B session calls first, removes the
gate's worktrees whose lock nobody holds (one made before the lock, which has
none, once a day old); a live session's is kept.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import owner

AUTO, NONE = "auto", "none"
MAIN = "main"
WORKTREE_PREFIX = "gpuengine-base-"   # the temporary folder holding a session's worktree and its owner lock
TREE = "tree"                         # the worktree inside that folder
UNLOCKED_STALE_S = 24 * 3600          # an unlocked (older layout) worktree this old has outlived its session


class BaseError(Exception):
    """The base cannot be used; the message names it and the cause."""


@dataclass
class Base:
    """A base checkout on disk, what it is, and how to let go of it."""

    root: Path
    commit: str | None      # full id where known
    label: str              # what the summary and the failure lines call it
    why: str                # how it was chosen
    cleanup: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def short(self) -> str:
        return self.commit[:7] if self.commit else self.label


def git(root: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise BaseError((result.stderr or result.stdout).strip().splitlines()[-1] if (result.stderr or result.stdout)
                        else f"git {' '.join(args)} failed")
    return result.stdout.strip()


def in_git_checkout(root: Path) -> bool:
    try:
        return git(root, "rev-parse", "--is-inside-work-tree") == "true"
    except (BaseError, OSError):
        return False


def auto_commit(root: Path, newest_baseline_commit: str | None) -> tuple[str | None, str]:
    """(commit, why) of the default base; None with the reason where there is none."""
    if not in_git_checkout(root):
        return None, "no git history in this checkout"
    branch = git(root, "rev-parse", "--abbrev-ref", "HEAD")
    if branch != MAIN:
        try:
            return git(root, "merge-base", "HEAD", MAIN), f"the merge base of {branch} with {MAIN}"
        except BaseError:
            pass   # no main here: fall through to the stored baseline
    if newest_baseline_commit is None:
        return None, "no stored baseline run names a commit for this GPU"
    try:
        commit = git(root, "rev-parse", "--verify", f"{newest_baseline_commit}^{{commit}}")
    except BaseError:
        return None, f"the newest stored baseline's commit {newest_baseline_commit} is not in this history"
    return commit, f"the commit of the newest stored baseline on this GPU ({newest_baseline_commit[:7]})"


def _gate_folder(worktree: Path) -> Path | None:
    """The WORKTREE_PREFIX folder a worktree lives in (or is, in the older layout); None for anyone else's."""
    for folder in (worktree.parent, worktree):
        if folder.name.startswith(WORKTREE_PREFIX):
            return folder
    return None


def _stale(folder: Path, worktree: Path) -> bool:
    """Whether the session that made a gate worktree is gone: its owner lock is free. A gate before the lock made
    the folder itself the worktree, with no lock to ask (a session of that code may run in another worktree of
    the repository): stale once older than any session."""
    if worktree != folder:
        return not owner.alive(folder)
    try:
        return time.time() - folder.stat().st_mtime > UNLOCKED_STALE_S
    except OSError:
        return True   # its folder is gone: only the prune is left to do


def remove_stale_worktrees(root: Path) -> list[Path]:
    """Remove the gate's worktrees of `root` whose session is gone (its owner lock free), folder and git entry
    alike, then prune entries whose folder vanished; returns the worktrees removed (none outside a git checkout)."""
    if not in_git_checkout(root):
        return []
    listed = git(root, "worktree", "list", "--porcelain").splitlines()
    removed = []
    for worktree in (Path(line.removeprefix("worktree ")) for line in listed if line.startswith("worktree ")):
        folder = _gate_folder(worktree)
        if folder is None or not _stale(folder, worktree):
            continue
        try:
            git(root, "worktree", "remove", "--force", str(worktree))
        except BaseError:
            pass   # a folder already gone: the prune below drops its entry
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(worktree)
    git(root, "worktree", "prune")
    return removed


def checkout(root: Path, commit: str, why: str, label: str) -> Base:
    """`commit` checked out in a temporary worktree outside the tree, beside the lock this process holds while it
    lives; removed by Base.cleanup."""
    folder = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
    lock = owner.hold(folder)   # before git knows the worktree: another session never sees it unowned
    try:
        git(root, "worktree", "add", "--detach", "--force", str(folder / TREE), commit)
    except BaseError as exc:
        os.close(lock)
        shutil.rmtree(folder, ignore_errors=True)
        raise BaseError(f"cannot check out {label}: {exc}") from None
    removed = []

    def cleanup():
        if removed:
            return
        removed.append(True)
        try:
            git(root, "worktree", "remove", "--force", str(folder / TREE))
        except (BaseError, OSError):
            pass
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)
        try:
            git(root, "worktree", "prune")
        except (BaseError, OSError):
            pass

    atexit.register(cleanup)
    return Base(folder / TREE, commit, label, why, cleanup)


def from_folder(folder: Path, option: str = "--against") -> Base:
    folder = Path(folder).resolve()
    # the engine's package, and the perf tests' folder (a package in checkouts before it held only tests)
    found = {"gpuengine package": (folder / "gpuengine" / "__init__.py").is_file(),
             "perf_tests folder": any((folder / "perf_tests" / name).is_file()
                                      for name in ("conftest.py", "__init__.py"))}
    missing = [what for what, there in found.items() if not there]
    if missing:
        raise BaseError(f"{option} {folder}: not a gpuengine checkout (no {' or '.join(missing)} there)")
    commit = None
    if in_git_checkout(folder) and Path(git(folder, "rev-parse", "--show-toplevel")).resolve() == folder:
        commit = git(folder, "rev-parse", "HEAD")   # its own checkout, not a folder inside another one
    elif (folder / "COMMIT").is_file():
        words = (folder / "COMMIT").read_text().split()
        commit = words[0] if words else None
    return Base(folder, commit, commit[:7] if commit else str(folder), f"the checkout at {folder}")


def for_command(against: str, root: Path) -> Base:
    """REV or DIR as a base for a command outside a perf session (`python -m gpuengine profile --against`), checked
    out; auto and none choose no base there, so they are refused, as is what resolve refuses."""
    if against in (AUTO, NONE):
        raise BaseError(f"--against {against}: name a commit (REV) or a checkout on disk (DIR) to compare with")
    return named(against, root)


def named(spec: str, root: Path, option: str = "--against") -> Base:
    """The checkout a user named, a folder on disk or a commit (checked out); errors name `option` and `spec`."""
    if Path(spec).is_dir():
        return from_folder(Path(spec), option)
    if not in_git_checkout(root):
        raise BaseError(f"{option} {spec}: no git history here to find it in, and no such folder "
                        f"({option} DIR takes a checkout on disk)")
    try:
        commit = git(root, "rev-parse", "--verify", f"{spec}^{{commit}}")
    except BaseError as exc:
        raise BaseError(f"{option} {spec}: not a commit here ({exc})") from None
    label = commit[:7] if commit.startswith(spec) else f"{spec} ({commit[:7]})"   # a commit id needs no second
    return checkout(root, commit, f"{option} {spec}", label)


def resolve(against: str, root: Path, newest_baseline_commit: str | None = None) -> tuple[Base | None, str]:
    """The base of `--against`, checked out; None in stored-run mode, with the reason either way."""
    root = Path(root)
    if against == NONE:
        return None, "--against none"
    if against == AUTO:
        commit, why = auto_commit(root, newest_baseline_commit)
        if commit is None:
            return None, why
        return checkout(root, commit, why, commit[:7]), why
    base = named(against, root)
    return base, base.why
