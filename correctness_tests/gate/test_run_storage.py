"""Saving a run (gpuengine/gate/store/run_storage.py): aside and renamed, and never over a run stored under its name."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpuengine.gate.store import run_storage
from gpuengine.gate.store.run_storage import AtomicFileStorage, next_run_path, store_run


def test_run_numbers_follow_the_stored_ones(tmp_path):
    assert next_run_path(tmp_path / "none", "tag").name == "0001_tag.json"
    (tmp_path / "0007_old.json").write_text("{}")
    (tmp_path / "notes.json").write_text("{}")
    assert next_run_path(tmp_path, "tag") == tmp_path / "0008_tag.json"


def test_a_run_never_overwrites_one_another_session_stored_under_its_name_meanwhile(tmp_path, monkeypatch):
    storage = AtomicFileStorage(tmp_path, logger=SimpleNamespace(info=print, warning=print))
    (tmp_path / "0001_tag.json").write_text('{"other": "session"}')
    counted = iter([tmp_path / "0001_tag.json"])   # the number both sessions counted before either saved
    real = run_storage.next_run_path
    monkeypatch.setattr(run_storage, "next_run_path", lambda folder, tag: next(counted, None) or real(folder, tag))
    storage.save({"benchmarks": []}, "tag")
    assert storage.failure is None and storage.saved == tmp_path / "0002_tag.json"
    assert json.loads((tmp_path / "0001_tag.json").read_text()) == {"other": "session"}
    assert json.loads((tmp_path / "0002_tag.json").read_text()) == {"benchmarks": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0001_tag.json", "0002_tag.json"]   # no scratch left


def test_a_save_that_cannot_find_a_free_number_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    (tmp_path / "0001_tag.json").write_text("{}")
    monkeypatch.setattr(run_storage, "next_run_path", lambda folder, tag: folder / "0001_tag.json")
    with pytest.raises(OSError, match=f"{run_storage.NAME_TRIES} run numbers for tag were taken meanwhile"):
        store_run(tmp_path, "tag", "{}")
    failures = []
    storage = AtomicFileStorage(tmp_path, logger=SimpleNamespace(info=print, warning=print))
    storage.on_failure = failures.append
    storage.save({"benchmarks": []}, "tag")
    assert storage.saved is None and failures == [storage.failure] and "were taken meanwhile" in storage.failure
    assert [p.name for p in tmp_path.iterdir()] == ["0001_tag.json"]
