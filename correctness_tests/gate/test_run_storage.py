"""Saving a run (gpuengine/gate/store/run_storage.py): aside and renamed, and never over a run stored under its name."""
from __future__ import annotations

import json
from types import SimpleNamespace

from gpuengine.gate.store.run_storage import AtomicFileStorage


def test_a_run_never_overwrites_one_another_session_stored_under_its_name_meanwhile(tmp_path, monkeypatch):
    storage = AtomicFileStorage(tmp_path, logger=SimpleNamespace(info=print, warning=print))
    (tmp_path / "0001_tag.json").write_text('{"other": "session"}')
    numbers = iter(["0001", "0002"])   # the number both sessions counted before either saved, then the next
    monkeypatch.setattr(AtomicFileStorage, "_next_num", property(lambda self: next(numbers)))
    storage.save({"benchmarks": []}, "tag")
    assert storage.failure is None
    assert json.loads((tmp_path / "0001_tag.json").read_text()) == {"other": "session"}
    assert json.loads((tmp_path / "0002_tag.json").read_text()) == {"benchmarks": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0001_tag.json", "0002_tag.json"]   # no scratch left
