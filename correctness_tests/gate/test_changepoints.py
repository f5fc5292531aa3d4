"""gpuengine.gate.changepoints: a step is found where it is, noise is left alone, and a store's runs become the
series the docs describe (baselines of one stack and one set of runners, oldest first)."""
from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from gpuengine.gate import changepoints
from gpuengine.gate.store.stored_runs import scan

pytest.importorskip(changepoints.LIBRARY, reason=f"{changepoints.MISSING} (the cpu lock installs it)")

SEEDS = 200
RUNS_A_SIDE = 8   # about the history a test has on one stack today (the H100's quick cases: 13-18 runs)


def noisy(seed: int, runs: int, step: float = 0.0, noise: float = 0.01) -> np.ndarray:
    """`runs` times of 1 ms with `noise` lognormal noise, the second half `step` slower."""
    values = np.exp(np.random.default_rng(seed).normal(0.0, noise, runs))
    values[runs // 2:] *= 1 + step
    return values


def test_a_3_percent_step_in_1_percent_noise_is_found_where_it_is_with_its_size():
    found, sizes = 0, []
    for seed in range(SEEDS):
        points = changepoints.detect(noisy(seed, 2 * RUNS_A_SIDE, step=0.03))
        near = [(index, size) for index, size, _ in points if abs(index - RUNS_A_SIDE) <= 2 and size > 0]
        found += bool(near)
        sizes += [size for _, size in near]
    assert found / SEEDS >= 0.85, f"a 3% step found in {found} of {SEEDS} series (measured 92%)"
    assert abs(np.median(sizes) - 0.03) < 0.005, f"median size {np.median(sizes):.4f} of a 3% step"


def test_pure_noise_gives_no_change_point_in_95_percent_of_series():
    for runs in (2 * RUNS_A_SIDE, 40):
        flagged = sum(bool(changepoints.detect(noisy(seed, runs))) for seed in range(SEEDS))
        assert flagged <= 0.05 * SEEDS, f"{flagged} of {SEEDS} noise series of {runs} runs flagged (measured 2-3%)"


def test_a_faster_step_is_negative_and_the_result_is_deterministic():
    series = noisy(7, 20, step=-0.05)
    first = changepoints.detect(series)
    assert first == changepoints.detect(series.copy())
    (index, size, p), = first
    assert index == 10 and -0.06 < size < -0.04 and p < changepoints.ALPHA


def test_a_step_two_runs_from_the_start_is_placed_there_not_at_the_shortest_segment_allowed():
    series = noisy(5, 14)
    series[:2] *= 10   # two runs before a 10x speed-up (the H100's streamed cases, runs 0004-0005)
    (index, size, _), = changepoints.detect(series)
    assert index == 2 and -0.92 < size < -0.88


def test_short_flat_and_bad_series():
    assert changepoints.detect([1.0, 1.1, 1.0, 1.1, 1.0]) == []        # fewer than 2 x MIN_SEGMENT runs
    assert changepoints.detect([2.0] * 12) == []                        # no noise, no step
    with pytest.raises(ValueError, match="positive finite"):
        changepoints.detect([1.0, 2.0, -1.0, 1.0, 1.0, 1.0])


LOCK = {"tier": "cuda13", "file": "locks/cuda13.txt", "sha256": "aaaaaaaaaaaa", "matches": True, "differs": []}
OTHER_LOCK = dict(LOCK, sha256="bbbbbbbbbbbb")
STEPPED, STEADY = "test_mlp_train[tf32-b1]", "test_cnn_train[tf32-b128]"


def bench(name: str, engine_ms: float, reference_ms: float) -> dict:
    """A stored test as the suite writes it: 1000 samples a round, the engine and torch_graph."""
    return {"fullname": f"perf_tests/test_x.py::{name}", "name": name, "stats": {"median": engine_ms / 1e3},
            "extra_info": {"samples_per_s": {"gpuengine": 1e6 / engine_ms, "torch_graph": 1e6 / reference_ms},
                           "median_round_ms": {"gpuengine": engine_ms, "torch_graph": reference_ms},
                           "ratios": {"torch_graph": {"median": reference_ms / engine_ms, "low": 0.99 * reference_ms
                                                      / engine_ms, "high": 1.01 * reference_ms / engine_ms}}}}


def write_run(folder: Path, number: int, commit: str, when: datetime, lock: dict, benches: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    run = {"machine_info": {"stack_lock": lock}, "commit_info": {"id": commit * 40}, "datetime": when.isoformat(),
           "benchmarks": benches}
    (folder / f"{number:04d}_{commit * 40}_{when:%Y%m%d_%H%M%S}.json").write_text(json.dumps(run))


def make_store(root: Path, tier: str = "nvidia-h100", step_at: int = 8, other_lock: bool = True) -> Path:
    """16 baselines on one lock: STEPPED's engine 5% slower from run `step_at` + 1 on (torch_graph unchanged),
    STEADY unchanged; a failed run (history/) and (`other_lock`) 8 runs of another lock, all 20% faster, which
    must not join them. Returns the tier's folder."""
    tier = root / tier
    rng = np.random.default_rng(3)
    start = datetime(2026, 11, 20)
    for i in range(16):
        step = 1.05 if i >= step_at else 1.0
        write_run(tier / "Linux-CPython-3.12-64bit", i + 1, "0123456789abcdef"[i], start + timedelta(hours=i), LOCK,
                  [bench(STEPPED, 2.0 * step * rng.lognormal(0, 0.005), 3.0 * rng.lognormal(0, 0.005)),
                   bench(STEADY, 5.0 * rng.lognormal(0, 0.005), 6.0 * rng.lognormal(0, 0.005))])
    write_run(tier / "history" / "Linux-CPython-3.12-64bit", 1, "f", start + timedelta(hours=3, minutes=30), LOCK,
              [bench(STEADY, 9.0, 6.0)])
    for i in range(8 if other_lock else 0):
        write_run(tier / "Linux-CPython-3.12-64bit", 17 + i, "e", start + timedelta(days=1, hours=i), OTHER_LOCK,
                  [bench(STEADY, 4.0 * rng.lognormal(0, 0.005), 6.0 * rng.lognormal(0, 0.005))])
    return tier


@pytest.fixture
def store(tmp_path) -> Path:
    return make_store(tmp_path)


def test_a_store_of_runs_gives_the_step_between_the_runs_that_bound_it(store):
    runs, unreadable = scan(store)
    assert not unreadable and len(runs) == 24   # scan reads the baselines only
    points = [changepoints.point_of(run) for run in runs]
    analysis = changepoints.analyse(points, store.name)
    signals = {(s.test, s.signal, s.stack, len(s.points)) for s in analysis.series}
    assert signals == {(STEPPED, changepoints.TIME, "cuda13 lock aaaaaaaaaaaa", 16),
                       (STEPPED, "time ratio to torch_graph", "cuda13 lock aaaaaaaaaaaa", 16),
                       (STEADY, changepoints.TIME, "cuda13 lock aaaaaaaaaaaa", 16),
                       (STEADY, "time ratio to torch_graph", "cuda13 lock aaaaaaaaaaaa", 16),
                       (STEADY, changepoints.TIME, "cuda13 lock bbbbbbbbbbbb", 8),
                       (STEADY, "time ratio to torch_graph", "cuda13 lock bbbbbbbbbbbb", 8)}
    assert [(cp.series.test, cp.series.signal) for cp in analysis.change_points] == \
        [(STEPPED, changepoints.TIME), (STEPPED, "time ratio to torch_graph")]
    for cp in analysis.change_points:
        assert (cp.before.label, cp.after.label, cp.commits) == ("0008 7777777", "0009 8888888", "7777777..8888888")
        assert 0.04 < cp.size < 0.06 and cp.p < changepoints.ALPHA
        assert cp.describe().startswith(f"{STEPPED}: {cp.series.signal} +") and "0008 7777777 and 0009 8888888" \
            in cp.describe() and store.name in cp.describe()
    assert analysis.recent(points) == [], "the step is 16 runs old, the other lock's 8 runs came after it"
    assert analysis.recent(points, last=16) == analysis.change_points


def test_without_the_library_nothing_is_computed_and_it_says_why(store, monkeypatch):
    monkeypatch.setattr(changepoints, "_ruptures", lambda: None)
    analysis = changepoints.analyse([changepoints.point_of(run) for run in scan(store)[0]], store.name)
    assert analysis.unavailable == changepoints.MISSING and not analysis.series and not analysis.change_points
    assert "not computed" in analysis.unavailable and changepoints.LIBRARY in analysis.unavailable
    with pytest.raises(ImportError, match="not computed"):
        changepoints.detect([1.0] * 8)


def test_the_summary_lines_name_the_recent_change_points_and_count_the_rest(tmp_path):
    tier = make_store(tmp_path, step_at=20)   # no step: STEPPED steady too
    assert changepoints.recent_lines(tier, tier.name) == [
        "no change points started in the newest 5 of the 24 baselines of nvidia-h100; 0 in the whole history (6 "
        "series, 0 shorter than 6 runs)"]
    tier = make_store(tmp_path / "late", step_at=12)   # the step's first run after, 0013, is the 12th newest
    lines = changepoints.recent_lines(tier, tier.name, last=12)
    assert len(lines) == 3 and all("between runs 0012 bbbbbbb and 0013 ccccccc" in line for line in lines[:2])
    assert lines[-1] == ("2 change points started in the newest 12 of the 24 baselines of nvidia-h100; 2 in the "
                         "whole history (6 series, 0 shorter than 6 runs): ./gate report marks them in the history "
                         "figures")
    assert changepoints.recent_lines(tier, tier.name)[0].startswith("no change points started in the newest 5")
    run_file = next((tier / "history").rglob("*.json"))
    assert changepoints.folder_of(run_file) == tier == changepoints.folder_of(next(tier.rglob("0001_*.json")))
