"""scripts/carry_parts.sh: files cut into part folders of a size limit here come back whole there, or not at all."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "carry_parts.sh"
MIB = 1024 * 1024


def carry(*args, cwd):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def files(tmp_path):
    sizes = {"big.whl": 5 * MIB + 17, "mid.whl": MIB + 3, "tiny.whl": 10}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(os.urandom(size))
    return tmp_path, sorted(sizes)


def test_every_folder_keeps_to_the_limit_and_the_pieces_join_back_whole(files):
    where, names = files
    assert carry("split", "parts", 2, *names, cwd=where).returncode == 0
    folders = sorted((where / "parts").iterdir())
    assert len(folders) == 4   # 6 MiB + 30 bytes in folders of 2 MiB
    for folder in folders:
        pieces = sum(f.stat().st_size for f in folder.iterdir() if f.name != "SHA256SUMS")
        assert 0 < pieces <= 2 * MIB
        assert (folder / "SHA256SUMS").read_text().count(".whl") == 3
    done = carry("join", "out", *folders, cwd=where)
    assert done.returncode == 0, done.stderr
    for name in names:
        assert (where / "out" / name).read_bytes() == (where / name).read_bytes()
    assert sorted(p.name for p in (where / "out").iterdir()) == names   # nothing half-written left beside them


def test_a_file_still_missing_pieces_is_named_and_not_written(files):
    where, names = files
    carry("split", "parts", 2, *names, cwd=where)
    partial = carry("join", "out", "parts/01", cwd=where)
    assert partial.returncode == 1
    assert "big.whl: piece 2 of 3 not here yet" in partial.stdout
    assert not (where / "out" / "big.whl").exists()
    assert not any(p.name.startswith(".") for p in (where / "out").iterdir())


def test_a_damaged_piece_is_refused(files):
    where, names = files
    carry("split", "parts", 2, *names, cwd=where)
    piece = next((where / "parts" / "01").glob("big.whl.part1-of-*"))
    piece.write_bytes(b"x" + piece.read_bytes()[1:])
    bad = carry("join", "out", *sorted((where / "parts").iterdir()), cwd=where)
    assert bad.returncode == 1
    assert "big.whl: the joined pieces do not match its sha256" in bad.stderr
    assert not (where / "out" / "big.whl").exists()


def test_bad_arguments_say_what_is_wrong(files):
    where, names = files
    bad = carry("split", "parts", "half", *names, cwd=where)
    assert bad.returncode == 2 and "MIB must be a whole number of MiB, not 'half'" in bad.stderr
    assert carry("split", "parts", 2, "nowhere.whl", cwd=where).returncode == 2
    assert "split OUT MIB FILE" in carry("glue", cwd=where).stderr
