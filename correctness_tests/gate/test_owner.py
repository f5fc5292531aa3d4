"""Folders of live A/B sessions (gpuengine/gate/ab/owner.py): two sessions in one clone keep their own log folders,
what an ended session left is removed by the next, and a session counts the others running beside it."""
from __future__ import annotations

import os
import subprocess
import sys

from gpuengine.gate.ab import owner


def test_each_session_gets_its_own_folder_and_an_ended_ones_is_removed_by_the_next(tmp_path):
    parent = tmp_path / "ab"
    parent.mkdir()
    (parent / "head.log").write_text("a log of a gate before per-session folders")
    ended, ended_lock = owner.session_folder(parent)
    (ended / "head.log").write_text("the last session's log")
    os.close(ended_lock)                                  # that session ended
    first, first_lock = owner.session_folder(parent)      # its logs stay until a session starts after it ends
    assert not ended.exists() and not (parent / "head.log").exists()
    (first / "head.log").write_text("running")
    second, second_lock = owner.session_folder(parent)    # a second session beside the first
    try:
        assert second != first and (first / "head.log").read_text() == "running"
        assert owner.alive(first) and owner.alive(second)
        assert owner.others_alive(parent, first) == 1 and owner.others_alive(parent, second) == 1
    finally:
        os.close(first_lock)
        os.close(second_lock)
    assert not owner.alive(first) and owner.others_alive(parent, second) == 0


def test_a_killed_owner_lets_go(tmp_path):
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from pathlib import Path; "
                             "from gpuengine.gate.ab import owner; owner.hold(Path(sys.argv[1])); "
                             "os.kill(os.getpid(), 9)", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    assert (tmp_path / owner.LOCK).exists() and not owner.alive(tmp_path)
    assert not owner.alive(tmp_path / "no such folder")
