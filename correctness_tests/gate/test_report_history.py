"""gpuengine.gate.report.history: one row of panels per case, thinned run ticks, and each change point marked on
its panel with its size and commit range; the history part lists them, or says why there are none."""
from __future__ import annotations

import pytest

from gpuengine.gate import changepoints
from gpuengine.gate.report import build_report, load_store
from gpuengine.gate.report import history
from gpuengine.gate.report.figures import _figure

from .test_changepoints import STEADY, STEPPED, make_store
from .test_report import NEEDS_MATPLOTLIB, png_size

pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
pytest.importorskip(changepoints.LIBRARY, reason=f"{changepoints.MISSING} (the cpu lock installs it)")


@pytest.fixture
def store(tmp_path):
    make_store(tmp_path / "store")
    return load_store(tmp_path / "store")


def texts(axis) -> list[str]:
    return [text.get_text() for text in axis.texts]


def test_each_change_point_is_marked_on_its_own_panel_with_size_and_commits(store):
    (tier,) = store.tiers
    found = history.History.of(tier, tier.runs)
    left, right = _figure(3.0, columns=2, rows=1)[1][0]
    history._case_row(left, right, STEPPED, "test_mlp_train", found, store, "#000")
    assert any(t.startswith("5.") and t.endswith("% slower\n7777777..8888888") for t in texts(left)), texts(left)
    assert any(t.endswith("% slower\n7777777..8888888") for t in texts(right)), texts(right)
    assert left.get_title(loc="left") == "tf32-b1: time per sample (µs)"
    assert right.get_title(loc="left") == "speed-up over torch_graph (×)"
    steady, other = _figure(3.0, columns=2, rows=1)[1][0]
    history._case_row(steady, other, STEADY, "test_cnn_train", found, store, "#000")
    assert not [t for t in texts(steady) + texts(other) if "slower" in t or "faster" in t]


def test_run_ticks_are_thinned_keep_the_newest_and_name_a_failed_run(store):
    (tier,) = store.tiers
    axis = _figure(2.0)[1][0][0]
    history._run_ticks(axis, tier.runs)   # 25 runs, the failed one fifth
    labels = [label.get_text() for label in axis.get_xticklabels()]
    assert list(axis.get_xticks()) == [0, 4, 8, 12, 16, 20, 24] and len(labels) <= history.MAX_TICKS
    assert labels[1] == "h0001\n11-20" and labels[-1] == f"{tier.runs[-1].number}\n{tier.runs[-1].when:%m-%d}"


def test_the_history_part_lists_the_change_points_and_draws_one_row_per_case(store, tmp_path):
    report = build_report(store, tmp_path / "report")
    page = report.index.read_text(encoding="utf-8")
    assert "Change points in the stored history" in page and "7777777..8888888" in page
    drawn = {path.name: png_size(path) for path in report.figures if path.name.startswith("history-")}
    assert drawn == {"history-speed-runs-test-mlp-train.png": (1000, 250),   # one case: one row
                     "history-speed-runs-test-cnn-train.png": (1000, 250)}


def test_without_the_library_the_history_says_change_points_are_not_computed(store, tmp_path, monkeypatch):
    monkeypatch.setattr(changepoints, "_ruptures", lambda: None)
    page = build_report(store, tmp_path / "report").index.read_text(encoding="utf-8")
    assert "Change points not computed: the ruptures package is not installed here" in page
    assert "Change points in the stored history" not in page


def test_a_history_without_a_step_says_how_many_series_it_looked_at(tmp_path):
    make_store(tmp_path / "store", step_at=20)
    page = build_report(tmp_path / "store", tmp_path / "report").index.read_text(encoding="utf-8")
    assert "No change point in 6 series of its baselines (0 too short to tell)." in page
    assert "1 of them failed the gate (kept under history/, red crosses)." in page
    assert "Change points in the stored history" not in page
