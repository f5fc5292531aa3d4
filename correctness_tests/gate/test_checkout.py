"""The A/B base's worktree (gpuengine/gate/ab/checkout.py) in a throwaway repository: a worktree whose session
was killed outright is removed by the next session, a live session's is kept, and nobody else's is touched."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuengine.gate.ab import checkout

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

KILLED_SESSION = """
import os, sys
from pathlib import Path
from gpuengine.gate.ab import checkout
base = checkout.checkout(Path(sys.argv[1]), "HEAD", "a session about to be killed", "HEAD")
print(base.root, flush=True)
os.kill(os.getpid(), 9)   # SIGKILL: no atexit, no pytest cleanup
"""


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}   # a hook's GIT_DIR must not leak in
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "commit.gpgsign=false",
                           "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


def worktrees(repo: Path) -> set[Path]:
    return {Path(line.removeprefix("worktree ")).resolve()
            for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")}


@pytest.fixture
def repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "one commit")
    return repo


def test_a_killed_sessions_worktree_is_removed_and_a_live_ones_kept(repo, tmp_path):
    killed = subprocess.run([sys.executable, "-c", KILLED_SESSION, str(repo)], capture_output=True, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert killed.returncode == -9, killed.stderr
    stale = Path(killed.stdout.strip()).resolve()
    older = tmp_path / f"{checkout.WORKTREE_PREFIX}older"   # a gate before the owner lock: the folder is the tree
    git(repo, "worktree", "add", "-q", "--detach", str(older), "HEAD")
    day_old = time.time() - checkout.UNLOCKED_STALE_S - 60
    os.utime(older, (day_old, day_old))
    recent = tmp_path / f"{checkout.WORKTREE_PREFIX}recent"  # as old a gate's, of a session that may still run
    git(repo, "worktree", "add", "-q", "--detach", str(recent), "HEAD")
    mine = tmp_path / "mine"                                # the user's own worktree: never the gate's to remove
    git(repo, "worktree", "add", "-q", "--detach", str(mine), "HEAD")
    live = checkout.checkout(repo, "HEAD", "this session", "HEAD")
    try:
        assert {stale, older.resolve(), live.root.resolve()} <= worktrees(repo) and stale.is_dir()
        removed = checkout.remove_stale_worktrees(repo)
        assert {Path(p).resolve() for p in removed} == {stale, older.resolve()}
        assert worktrees(repo) == {repo.resolve(), mine.resolve(), recent.resolve(), live.root.resolve()}
        assert not stale.parent.exists() and not older.exists() and (live.root / "a.txt").is_file()
    finally:
        live.cleanup()
    assert worktrees(repo) == {repo.resolve(), mine.resolve(), recent.resolve()} and not live.root.parent.exists()


def test_outside_a_git_checkout_there_is_nothing_to_remove(tmp_path):
    assert checkout.remove_stale_worktrees(tmp_path) == []
