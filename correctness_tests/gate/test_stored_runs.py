"""gpuengine.gate.store.stored_runs: each test's newest baseline, unreadable runs named, history kept apart."""
from __future__ import annotations

import json
from pathlib import Path

from gpuengine.gate.store.stored_runs import history_folder, newest_per_test, read_tier, run_files, scan

MACHINE = "Linux-CPython-3.12-64bit"
A, B = "perf_tests/test_x.py::test_a", "perf_tests/test_x.py::test_b"


def write_run(folder: Path, name: str, when: str, tests: list[str], machine: str = MACHINE) -> Path:
    path = folder / machine / name
    path.parent.mkdir(parents=True, exist_ok=True)
    benchmarks = [{"fullname": t, "name": t.split("::")[1], "stats": {"median": 0.001}, "extra_info": {}}
                  for t in tests]
    path.write_text(json.dumps({"machine_info": {"tier": "x"}, "datetime": when, "benchmarks": benchmarks}))
    return path


def test_a_partial_run_is_the_baseline_of_its_own_tests_only(tmp_path):
    write_run(tmp_path, "0001_full.json", "2026-11-21T06:00:00+00:00", [A, B])
    write_run(tmp_path, "0002_only_a.json", "2026-11-22T06:00:00+00:00", [A])
    runs, unreadable = scan(tmp_path)
    newest = newest_per_test(runs)
    assert unreadable == []
    assert newest[A].label == f"{MACHINE}/0002_only_a.json"
    assert newest[B].label == f"{MACHINE}/0001_full.json"


def test_an_unreadable_run_is_named_and_the_older_result_is_used(tmp_path):
    write_run(tmp_path, "0001_full.json", "2026-11-21T06:00:00+00:00", [A, B])
    broken = tmp_path / MACHINE / "0002_broken.json"
    broken.write_text('{"benchmarks": [\n  {"fullname": ')
    not_a_run = tmp_path / MACHINE / "0003_other.json"
    not_a_run.write_text('{"something": "else"}')
    runs, unreadable = scan(tmp_path)
    assert [bad.label for bad in unreadable] == [f"{MACHINE}/0002_broken.json", f"{MACHINE}/0003_other.json"]
    assert "not valid JSON at line 2, column 16" in unreadable[0].reason
    assert "not a pytest-benchmark run" in unreadable[1].reason
    assert newest_per_test(runs)[A].label == f"{MACHINE}/0001_full.json"


def test_history_and_other_folders_are_never_baselines(tmp_path):
    write_run(tmp_path, "0001_pass.json", "2026-11-21T06:00:00+00:00", [A])
    for folder in ("history", "slow", "gatepower", "maxbatch", "config-precision-bf16"):
        write_run(tmp_path / folder, "0001_elsewhere.json", "2026-11-25T06:00:00+00:00", [A, B])
    assert [p.name for p in run_files(tmp_path)] == ["0001_pass.json"]
    assert history_folder(tmp_path) == tmp_path / "history"
    assert set(newest_per_test(scan(tmp_path)[0])) == {A}


def test_the_report_reads_no_record_folder_as_a_result(tmp_path):
    tier = tmp_path / "nvidia-x"
    write_run(tier, "0001_pass.json", "2026-11-21T06:00:00+00:00", [A])
    for folder in ("logs", "toggle_cost", "plan_stability", "gatepower"):   # a session's or a command's records
        (tier / folder).mkdir()
        (tier / folder / "record.json").write_text('{"layers": []}')
    read = read_tier(tier, tmp_path)
    assert [run.label for run in read.runs] == [f"nvidia-x/{MACHINE}/0001_pass.json"] and read.skipped == []


def test_newest_is_by_date_across_python_versions(tmp_path):
    write_run(tmp_path, "0009_old.json", "2026-11-20T06:00:00+00:00", [A], machine="Linux-CPython-3.12-64bit")
    write_run(tmp_path, "0001_new.json", "2026-11-23T06:00:00", [A], machine="Linux-CPython-3.13-64bit")
    assert newest_per_test(scan(tmp_path)[0])[A].label == "Linux-CPython-3.13-64bit/0001_new.json"


def test_no_folder_no_runs(tmp_path):
    assert scan(tmp_path / "absent") == ([], [])
