"""Folders owned by a live A/B session: the base's worktree folder, and each session's own log folder.

A session holds an exclusive flock on a lock file inside each folder it owns
for as long as it lives; the kernel lets go when the process dies, SIGKILL
included, so another session tells a live owner from a dead one by trying
the lock, with no pid that could have been reused. Two sessions in one clone
then never remove or write into each other's folders, and a session can
count the others running beside it (their rounds share the machine).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

LOCK = "owner.lock"


def hold(folder: Path) -> int:
    """Create `folder`'s lock file and hold it; returns the descriptor, whose closing lets go."""
    fd = os.open(Path(folder) / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def alive(folder: Path) -> bool:
    """Whether a live process holds `folder`'s lock (a folder without one has no owner left)."""
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # and with it the lock just taken, where it was free
    return False


def session_folder(parent: Path) -> tuple[Path, int]:
    """A new folder of this session's own under `parent`, held; what ended sessions left there is removed first
    (a live session's folder is kept). Returns the folder and the descriptor to close when the session ends."""
    parent.mkdir(parents=True, exist_ok=True)
    for entry in parent.iterdir():
        if entry.is_dir() and not alive(entry):
            shutil.rmtree(entry, ignore_errors=True)
        elif not entry.is_dir():
            entry.unlink(missing_ok=True)   # the logs of a gate before per-session folders
    folder = Path(tempfile.mkdtemp(prefix=f"{datetime.now():%Y%m%d-%H%M%S}-", dir=parent))
    return folder, hold(folder)


def others_alive(parent: Path, mine: Path) -> int:
    """How many other sessions' folders under `parent` are held now."""
    if not parent.is_dir():
        return 0
    return sum(entry.is_dir() and entry != mine and alive(entry) for entry in parent.iterdir())
