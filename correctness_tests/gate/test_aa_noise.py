"""Process noise learned from stored A/A runs (gpuengine/gate/rules/aa_noise.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gpuengine.gate.rules.aa_noise import AaRun, code_hash, learn, learned_noise, stored_aa_runs
from gpuengine.gate.rules.paired import DEFAULT_PROCESS_SD


def record(rng, process_sd, rounds=9, round_sd=0.002, same_code=True) -> dict:
    offsets = rng.normal(0, process_sd, 2)
    base = 50 * np.exp(offsets[0] + rng.normal(0, round_sd, rounds))
    head = 50 * np.exp(offsets[1] + rng.normal(0, round_sd, rounds))
    return {"head_round_ms": head.tolist(), "base_round_ms": base.tolist(), "head_samples_per_round": 100,
            "base_samples_per_round": 100, "head_code": "abc", "base_code": "abc" if same_code else "def"}


def test_many_aa_runs_recover_the_process_offset_and_few_lean_on_the_prior():
    rng = np.random.default_rng(5)
    runs = [AaRun.from_record(record(rng, 0.02)) for _ in range(400)]
    assert learn(runs).sd == pytest.approx(0.02, rel=0.15)
    steady = [AaRun.from_record(record(rng, 0.0)) for _ in range(2)]
    assert DEFAULT_PROCESS_SD / 2 < learn(steady).sd < DEFAULT_PROCESS_SD   # two quiet runs cannot zero it
    assert learn([]).sd == DEFAULT_PROCESS_SD and learn([]).runs == 0
    assert "2 run(s)" in learn(steady).source()


def test_a_run_of_noisy_rounds_does_not_cancel_the_offsets_of_quiet_ones():
    rng = np.random.default_rng(7)
    quiet = [AaRun.from_record(record(rng, 0.03)) for _ in range(12)]
    noisy = AaRun(0.0, 0.5, 9)   # no offset seen, rounds 50% apart: its excess alone is hugely negative
    assert learn(quiet + [noisy]).sd > 0.8 * learn(quiet).sd


def test_only_runs_of_the_same_code_on_both_sides_count():
    rng = np.random.default_rng(6)
    assert AaRun.from_record(record(rng, 0.01, same_code=False)) is None
    assert AaRun.from_record({**record(rng, 0.01), "head_code": ""}) is None
    assert AaRun.from_record(record(rng, 0.01)) is not None
    assert AaRun.from_record({**record(rng, 0.01), "other_sessions": 0}) is not None
    assert AaRun.from_record({**record(rng, 0.01), "other_sessions": 1}) is None   # rounds beside another session


def test_a_stack_ab_is_an_aa_run_only_where_both_locks_pin_the_same():
    rng = np.random.default_rng(8)
    stacks = {"base_lock": {"spec": "build/old.txt", "sha256": "3f1a2b3c4d5e"},
              "head_lock": {"file": "locks/cuda13.txt", "sha256": "52ff223d84e6"}}
    assert AaRun.from_record({**record(rng, 0.01), **stacks}) is None   # one code, two stacks: the stack changed
    same = {**stacks, "base_lock": {**stacks["base_lock"], "sha256": "52ff223d84e6"}}
    assert AaRun.from_record({**record(rng, 0.01), **same}) is not None


def test_stored_aa_runs_come_from_baselines_and_history_alike(tmp_path):
    rng = np.random.default_rng(7)

    def write(folder, name, ab):
        folder.mkdir(parents=True, exist_ok=True)
        bench = {"name": "t[a]", "fullname": "perf_tests/x.py::t[a]", "stats": {}, "extra_info": {"ab": ab}}
        (folder / name).write_text(json.dumps({"benchmarks": [bench], "datetime": "2026-11-24T10:00:00"}))

    write(tmp_path / "Linux", "0001_a_x.json", record(rng, 0.01))
    write(tmp_path / "history" / "Linux", "0002_b_x.json", record(rng, 0.01))
    write(tmp_path / "Linux", "0003_c_x.json", record(rng, 0.01, same_code=False))   # a real A/B run
    (tmp_path / "Linux" / "0004_d_x.json").write_text("{not json")                   # unreadable: left out
    assert len(stored_aa_runs(tmp_path)["perf_tests/x.py::t[a]"]) == 2


def test_a_gpu_kind_without_aa_runs_starts_from_what_the_other_kinds_learned(tmp_path):
    """The other GPU kinds' A/A runs are the prior of a test (the CPU tier's never); this kind's own runs then
    pull the estimate their way with the usual weights."""
    rng = np.random.default_rng(11)

    def write(tier, name, tests):
        folder = tmp_path / tier / "Linux"
        folder.mkdir(parents=True, exist_ok=True)
        benches = [{"name": t, "fullname": f"perf_tests/x.py::{t}", "stats": {}, "extra_info": {"ab": ab}}
                   for t, ab in tests.items()]
        (folder / name).write_text(json.dumps({"benchmarks": benches, "datetime": "2026-11-24T10:00:00"}))

    for i in range(40):   # the H100's runs: t[a] moves 3% between processes, t[b] is steady
        write("nvidia-h100", f"{i + 1:04d}_a_x.json", {"t[a]": record(rng, 0.03), "t[b]": record(rng, 0.0)})
    for i in range(40):   # the CPU tier's runs never count
        write("cpu-tier", f"{i + 1:04d}_a_x.json", {"t[c]": record(rng, 0.2)})
    write("nvidia-h200", "0001_a_x.json", {"t[b]": record(rng, 0.0)})
    learned = learned_noise(tmp_path / "nvidia-h200")
    assert set(learned) == {"perf_tests/x.py::t[a]", "perf_tests/x.py::t[b]"}
    borrowed = learned["perf_tests/x.py::t[a]"]
    assert borrowed.runs == 0 and borrowed.sd == pytest.approx(0.03, rel=0.3)
    assert "prior from 40 A/A run(s) on nvidia-h100" in borrowed.source()
    own = learned["perf_tests/x.py::t[b]"]
    assert own.runs == 1 and own.sd < DEFAULT_PROCESS_SD
    assert learned_noise(tmp_path / "nvidia-h100")["perf_tests/x.py::t[a]"].source().endswith("the 0.5% prior")


def test_an_interrupted_run_never_teaches_the_noise(tmp_path):
    """A run marked interrupted, or one under history/ whose session failed while none of its tests did (how an
    interrupted run was stored before the gate stopped storing them), is left out; a failed run is not."""
    rng = np.random.default_rng(9)

    def write(folder, name, outcome):
        folder.mkdir(parents=True, exist_ok=True)
        bench = {"name": "t[a]", "fullname": "perf_tests/x.py::t[a]", "stats": {},
                 "extra_info": {"ab": record(rng, 0.05)}}
        (folder / name).write_text(json.dumps({"benchmarks": [bench], "datetime": "2026-11-24T10:00:00",
                                               "gpuengine_gate": outcome}))

    quiet = {"failed_on_targets_only": [], "failed_otherwise": []}
    write(tmp_path / "Linux", "0001_a_x.json", quiet)                                        # passed: counts
    write(tmp_path / "history" / "Linux", "0002_b_x.json", {**quiet, "failed_otherwise": ["t[a]"]})   # counts
    write(tmp_path / "history" / "Linux", "0003_c_x.json", quiet)                            # stopped early
    write(tmp_path / "Linux", "0004_d_x.json", {**quiet, "interrupted": True})               # marked
    assert len(stored_aa_runs(tmp_path)["perf_tests/x.py::t[a]"]) == 2


def test_the_code_hash_sees_a_changed_source_and_nothing_else(tmp_path):
    for folder in ("gpuengine", "perf_tests"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    before = code_hash(tmp_path)
    (tmp_path / "README.md").write_text("words")
    (tmp_path / "gpuengine" / "__pycache__").mkdir()
    (tmp_path / "gpuengine" / "__pycache__" / "a.py").write_text("stale")
    for untimed in ("gate", "bench/report"):   # the gate and its report: no round runs them
        (tmp_path / "gpuengine" / untimed).mkdir(parents=True)
        (tmp_path / "gpuengine" / untimed / "b.py").write_text("y = 1\n")
    assert code_hash(tmp_path) == before
    (tmp_path / "gpuengine" / "bench" / "runners.py").write_text("z = 1\n")   # an instrument is timed code
    assert code_hash(tmp_path) != before
    (tmp_path / "gpuengine" / "bench" / "runners.py").unlink()
    (tmp_path / "gpuengine" / "a.py").write_text("x = 2\n")
    assert code_hash(tmp_path) != before
