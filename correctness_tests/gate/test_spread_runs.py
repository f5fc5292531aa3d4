"""A perf run spread over GPUs: the split of the tests, the plan of the workers, the merge and save (fake runs)."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuengine.bench import cudnn_plans
from gpuengine.bench.machine_info import run_tag
from gpuengine.gate.store.spread_runs import benchmark_seconds, merge_runs, split_tests
from gpuengine.gate.store.stored_runs import read_run
from gpuengine.bench.timing_cores import TimingCore
from gpuengine.gate import spread
from gpuengine.gate.spread import (HELD_BACK, HOST_BANDWIDTH_MODULES, NIGHTLY_HOST_BANDWIDTH, Worker, keep_plans,
                                   merged_run_naming, plan_workers, save_merged, shares_host_bandwidth, take_option,
                                   visible_devices, write_summary)


def fake_run(gpu: str, tests: dict[str, float], when: str = "2026-11-23T10:00:00+00:00") -> dict:
    return {"machine_info": {"gpu": gpu, "tier": gpu.lower().replace(" ", "-"), "series": ""},
            "commit_info": {"id": "abc"},
            "datetime": when, "version": "5.1.0",
            "benchmarks": [{"fullname": name, "name": name.split("::")[-1], "stats": {"total": s, "median": s / 3},
                            "extra_info": {"ratios": {}}} for name, s in tests.items()]}


def test_the_split_balances_stored_times_and_keeps_collection_order():
    ids = [f"t{i}" for i in range(6)]
    seconds = {"t0": 10, "t1": 1, "t2": 9, "t3": 2, "t4": 3, "t5": 5}
    parts = split_tests(ids, 2, seconds)
    assert sorted(sum(parts, [])) == ids and len(parts) == 2
    assert sorted(sum(seconds[t] for t in part) for part in parts) == [15, 15]
    for part in parts:
        assert part == sorted(part, key=ids.index)
    assert split_tests(ids, 1) == [ids]
    assert split_tests(["a", "b"], 3) == [["a"], ["b"], []]
    assert [len(p) for p in split_tests(ids, 4, {"t0": 4})] == [2, 2, 1, 1]   # unknown tests: the median (4)


def test_bad_splits_are_refused():
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        split_tests(["a"], 0)
    with pytest.raises(ValueError, match="test ids repeat: a"):
        split_tests(["a", "b", "a"], 2)


def test_one_worker_per_gpu_then_the_all_gpu_tests():
    ids = ["perf_tests/test_mlp.py::a", "perf_tests/test_cnn.py::b", "perf_tests/test_data_parallel.py::c[x]",
           "perf_tests/test_resnet.py::d"]
    workers = plan_workers(ids, 4, {}, tmp := Path("/tmp/x"))
    assert [(w.name, w.devices, w.tests) for w in workers] == [
        ("gpu0", "0", [ids[0]]), ("gpu1", "1", [ids[1]]), ("gpu2", "2", [ids[3]]),
        ("all-gpus", None, [ids[2]])]
    command = workers[0].command(["--full"])
    assert command[3] == ids[0] and "--benchmark-compare" in command and f"--benchmark-json={tmp}/gpu0.json" in command
    assert not set(HELD_BACK) & set(command), "workers never save on their own: only the merged run is stored"


def test_workers_are_pinned_inside_the_callers_own_cuda_visible_devices(tmp_path):
    # nvidia-smi lists every GPU of the host; a caller restricted to GPUs 2 and 5 must get workers on 2 and 5.
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2, 5"}, listed=8) == ["2", "5"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}, listed=8) == []
    assert visible_devices({}, listed=3) == ["0", "1", "2"]
    ids = ["perf_tests/test_mlp.py::a", "perf_tests/test_cnn.py::b", "perf_tests/test_data_parallel.py::c"]
    workers = plan_workers(ids, ["2", "5"], {}, tmp_path)
    assert [(w.name, w.devices, w.tests) for w in workers] == [
        ("gpu2", "2", [ids[0]]), ("gpu5", "5", [ids[1]]), ("all-gpus", None, [ids[2]])]


def test_runs_merge_into_one_per_gpu_kind_and_a_test_in_two_runs_is_refused():
    runs = [fake_run("NVIDIA H200", {"a": 1.0, "b": 2.0}, "2026-11-23T10:00:00+00:00"),
            fake_run("NVIDIA H200", {"c": 3.0}, "2026-11-23T10:05:00+00:00"),
            fake_run("NVIDIA H100", {"d": 4.0})]
    merged = merge_runs(runs, ["gpu0", "gpu1", "gpu2"])
    assert set(merged) == {"NVIDIA H200", "NVIDIA H100"}
    h200 = merged["NVIDIA H200"]
    assert [b["fullname"] for b in h200["benchmarks"]] == ["a", "b", "c"]
    assert [b["extra_info"]["spread_worker"] for b in h200["benchmarks"]] == ["gpu0", "gpu0", "gpu1"]
    assert h200["datetime"] == "2026-11-23T10:05:00+00:00" and h200["commit_info"] == {"id": "abc"}
    assert h200["machine_info"]["spread"] == {"workers": ["gpu0", "gpu1"], "tests_per_worker": {"gpu0": 2, "gpu1": 1}}
    assert benchmark_seconds(h200) == {"a": 1.0, "b": 2.0, "c": 3.0}
    with pytest.raises(ValueError, match="b is in the runs of worker gpu0 and worker gpu1"):
        merge_runs([runs[0], fake_run("NVIDIA H200", {"b": 1.0})], ["gpu0", "gpu1"])
    with pytest.raises(ValueError, match="worker gpu1's run is not a pytest-benchmark run"):
        merge_runs([runs[0], {"benchmarks": []}], ["gpu0", "gpu1"])


def gate_outcome(on_targets=(), otherwise=()) -> dict:
    """A worker run's gpuengine_gate record (gpuengine/gate/plugin.py): which tests failed, and why."""
    return {"targets_fail": True, "targets_not_met": len(on_targets), "failed_on_targets_only": list(on_targets),
            "failed_otherwise": list(otherwise), "failures": {t: f"why {t}" for t in (*on_targets, *otherwise)}}


ON_TARGETS = {"gpu1": gate_outcome(["perf_tests/t.py::t1"])}    # --claims: gpu1's test missed a target only


@pytest.mark.parametrize("codes,save_baseline,where,outcomes", [
    ({"gpu0": 0, "gpu1": 0}, False, "baseline", {}), ({"gpu0": 0, "gpu1": 1}, False, "history", {}),
    ({"gpu0": 0, "gpu1": 1}, True, "baseline", {}),
    ({"gpu0": 0, "gpu1": 1}, False, "baseline", ON_TARGETS),
    ({"gpu0": 0, "gpu1": 1}, False, "history", {"gpu1": gate_outcome(["perf_tests/t.py::t1"], ["x"])})])
def test_the_merged_run_is_stored_where_a_single_run_would_be(tmp_path, codes, save_baseline, where, outcomes):
    workers = [Worker(name, str(i), [], tmp_path / f"{name}.json") for i, name in enumerate(codes)]
    for i, worker in enumerate(workers):
        run = fake_run("NVIDIA H200", {f"perf_tests/t.py::t{i}": 1.0})
        run.update({"gpuengine_gate": outcomes[worker.name]} if worker.name in outcomes else {})
        worker.json_path.write_text(json.dumps(run))
    store = tmp_path / "store"
    (paths,) = [save_merged(workers, codes, store, "Linux-CPython-3.12-64bit", "tag", save_baseline)]
    folder = store / "nvidia-h200" / ("history" if where == "history" else "") / "Linux-CPython-3.12-64bit"
    assert paths == [folder / "0001_tag.json"]
    run = read_run(paths[0], store / "nvidia-h200")   # readable by the gate plugin like any stored run
    assert sorted(run.benchmarks) == ["perf_tests/t.py::t0", "perf_tests/t.py::t1"]
    if outcomes:
        assert json.loads(paths[0].read_text())["gpuengine_gate"] == outcomes["gpu1"]   # kept in the stored run


@pytest.mark.parametrize("series,named,folder", [
    ("slow", None, "store/nvidia-h200/slow"),
    ("config-precision-bf16/slow", None, "store/nvidia-h200/config-precision-bf16/slow"), (None, "mine", "mine")])
def test_a_series_run_is_merged_into_its_series_not_the_tiers_speed_runs(tmp_path, series, named, folder):
    """`./gate perf -m slow` on two GPUs: the max-batch searches' run goes to <tier>/slow/, where each session would
    have stored it; a folder --benchmark-storage named (the sessions' series then None) takes it as it is."""
    workers = [Worker(name, str(i), [], tmp_path / f"{name}.json") for i, name in enumerate(("gpu0", "gpu1"))]
    for i, worker in enumerate(workers):
        run = fake_run("NVIDIA H200", {f"perf_tests/t.py::t{i}": 1.0})
        run["machine_info"]["series"] = series
        worker.json_path.write_text(json.dumps(run))
    named = named and tmp_path / named
    (path,) = save_merged(workers, {"gpu0": 0, "gpu1": 0}, tmp_path / "store", "m", "tag", False, named=named)
    assert path == tmp_path / folder / "m" / "0001_tag.json"


def test_a_merged_run_with_no_series_and_no_named_storage_is_refused(tmp_path):
    worker = Worker("gpu0", "0", [], tmp_path / "gpu0.json")
    run = fake_run("NVIDIA H200", {"perf_tests/t.py::t0": 1.0})
    run["machine_info"]["series"] = None
    worker.json_path.write_text(json.dumps(run))
    with pytest.raises(ValueError, match="no series and no --benchmark-storage"):
        save_merged([worker], {"gpu0": 0}, tmp_path / "store", "m", "tag", False)
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("codes,outcome", [({"gpu0": 0, "gpu1": 2}, gate_outcome()),
                                           ({"gpu0": 0, "gpu1": 0}, {**gate_outcome(), "interrupted": True})])
@pytest.mark.parametrize("save_baseline", [False, True])
def test_an_interrupted_worker_leaves_the_merged_run_unsaved(tmp_path, codes, outcome, save_baseline, capsys):
    """Ctrl-C in one GPU's session (its exit status 2, or its run marked so): no verdict, so nothing is stored."""
    workers = [Worker(name, str(i), [], tmp_path / f"{name}.json") for i, name in enumerate(codes)]
    for i, worker in enumerate(workers):
        worker.json_path.write_text(json.dumps(dict(fake_run("NVIDIA H200", {f"perf_tests/t.py::t{i}": 1.0}),
                                                    gpuengine_gate=outcome if i else gate_outcome())))
    assert save_merged(workers, codes, tmp_path / "store", "Linux-CPython-3.12-64bit", "tag", save_baseline) == []
    assert not (tmp_path / "store").exists()
    assert "interrupted (gpu1): no verdict, nothing was saved" in capsys.readouterr().err


def test_a_spread_that_runs_nothing_exits_as_pytest_does_so_the_gate_builds_no_report(monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(SystemExit) as stopped:
        spread.main([])
    assert stopped.value.code == pytest.ExitCode.USAGE_ERROR and "1 GPU(s) visible" in capsys.readouterr().err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setattr(spread, "collect", lambda args: [])
    with pytest.raises(SystemExit) as stopped:
        spread.main(["-k", "no_such_test"])
    assert stopped.value.code == pytest.ExitCode.NO_TESTS_COLLECTED
    assert "no perf test selected" in capsys.readouterr().err


def test_the_merged_run_keeps_every_workers_gate_verdict():
    runs = [dict(fake_run("NVIDIA H200", {"a": 1.0}), gpuengine_gate=gate_outcome(["a"])),
            dict(fake_run("NVIDIA H200", {"b": 1.0}), gpuengine_gate=gate_outcome([], ["b"]))]
    (merged,) = merge_runs(runs, ["gpu0", "gpu1"]).values()
    assert merged["gpuengine_gate"] == {"targets_fail": True, "targets_not_met": 1, "failed_on_targets_only": ["a"],
                                        "failed_otherwise": ["b"], "failures": {"a": "why a", "b": "why b"}}


def test_run_tags_read_like_pytest_benchmarks_autosave():
    when = datetime(2026, 11, 27, 11, 16, 55, tzinfo=timezone(timedelta(hours=1)))
    assert run_tag("0cfdca4", False, when) == "0cfdca4_20261127_101655"   # UTC, as pytest-benchmark writes it
    assert run_tag("0cfdca4", True, when) == "0cfdca4_20261127_101655_uncommited-changes"
    assert run_tag("unversioned", None, when) == "unversioned_20261127_101655"


def test_the_merged_run_is_named_after_gate_commit_id_without_git(tmp_path, monkeypatch):
    # A lent GPU machine's copy of the tree has no .git: its workers' runs say "unversioned" where no hook named
    # the commit, and the merged run must name it anyway, in its file name and its commit_info alike.
    monkeypatch.setenv("GATE_COMMIT_ID", "0cfdca4")
    monkeypatch.setenv("GATE_COMMIT_DIRTY", "1")
    monkeypatch.setenv("GATE_COMMIT_BRANCH", "spread-fix")
    tag, commit_info = merged_run_naming()
    assert tag.startswith("0cfdca4_") and tag.endswith("_uncommited-changes")
    workers = [Worker(f"gpu{i}", str(i), [], tmp_path / f"gpu{i}.json") for i in range(2)]
    for i, worker in enumerate(workers):
        run = fake_run("NVIDIA H100", {f"perf_tests/t.py::t{i}": 1.0})
        run["commit_info"] = {"id": "unversioned", "dirty": False, "project": "gpuengine", "branch": "(unknown)"}
        worker.json_path.write_text(json.dumps(run))
    (path,) = save_merged(workers, {"gpu0": 0, "gpu1": 0}, tmp_path / "store", "m", tag, False, commit_info)
    assert path.name == f"0001_{tag}.json" and "unversioned" not in path.name
    assert json.loads(path.read_text())["commit_info"] == {"id": "0cfdca4", "dirty": True, "project": "gpuengine",
                                                           "branch": "spread-fix", "error": None}
    monkeypatch.delenv("GATE_COMMIT_ID")
    assert merged_run_naming()[1] is None   # git's answer then, the workers' commit_info as pytest-benchmark wrote it


# The quick tier's tests on an H100 (run 0033) with each one's wall time: the split's weights.
QUICK_TIER = {
    "perf_tests/test_cnn.py::test_cnn_train[tf32-graph8-resident-b128]": 9.3,
    "perf_tests/test_cnn.py::test_cnn_train[tf32-graph8-streamed-b128]": 1.2,
    "perf_tests/test_loader.py::test_loader_bandwidth[tf32-4kB-b8000-pool2]": 4.5,
    "perf_tests/test_loader.py::test_loader_bandwidth[tf32-150kB-b64-pool2]": 1.3,
    "perf_tests/test_loader.py::test_mlp_streamed[tf32-graph1-pool2-b8000]": 9.4,
    "perf_tests/test_loader.py::test_cnn_streamed[tf32-graph8-pool2-b1024]": 0.6,
    "perf_tests/test_mlp.py::test_mlp_train[tf32-graph8-resident-bpe1]": 9.5,
    "perf_tests/test_mlp.py::test_mlp_train[tf32-graph8-streamed-bpe12]": 1.2,
    "perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b512]": 0.7,
    "perf_tests/test_resnet.py::test_resnet_train[cifar10-tf32-graph8-resident-b128]": 30.1,
    "perf_tests/test_resnet.py::test_resnet_train[cifar10-bf16-graph8-resident-b128]": 30.4,
    "perf_tests/test_transformer.py::test_transformer_train[seq384-tf32-graph8-b16]": 6.7,
    "perf_tests/test_zoo.py::test_zoo_train[alexnet-tf32-streamed-b16]": 10.8,
    "perf_tests/test_zoo.py::test_zoo_train[resnet50-tf32-streamed-b16]": 18.2,
    "perf_tests/test_zoo.py::test_zoo_train[mobilenet_v2-tf32-streamed-b16]": 34.5,
    "perf_tests/test_data_parallel.py::test_data_parallel[mlp-tf32]": 20.0,
}
HOST = {t for t in QUICK_TIER if "streamed" in t or "test_loader.py" in t}


def test_the_tests_that_share_host_bandwidth_are_the_loaders_and_every_streamed_case():
    assert {t for t in QUICK_TIER if shares_host_bandwidth(t)} == HOST
    assert not shares_host_bandwidth("perf_tests/test_resnet.py::test_resnet_train[cifar10-tf32-graph8-resident-b128]")
    assert shares_host_bandwidth("perf_tests/test_resnet.py::test_resnet_train[cifar10-tf32-graph8-streamed-b128]")
    assert not shares_host_bandwidth("perf_tests/test_zoo.py::test_zoo_train[streamedish-tf32-resident-b16]")
    # Nightly, MLP inference times gpuengine_oneshot (host arrays in and out) and the CNN Keras' fit.
    infer = "perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b512]"
    assert not shares_host_bandwidth(infer) and shares_host_bandwidth(infer, full=True)
    assert shares_host_bandwidth("perf_tests/test_cnn.py::test_cnn_train_vs_keras[tf32-graph8-resident-b128]", True)


@pytest.mark.parametrize("gpus", [2, 3, 8])
def test_the_host_bandwidth_tests_run_on_one_gpu_one_after_another_and_the_all_gpu_tests_last(tmp_path, gpus):
    workers = plan_workers(list(QUICK_TIER), gpus, QUICK_TIER, tmp_path)
    single, last = workers[:-1], workers[-1]
    assert (last.name, last.devices, last.tests) == ("all-gpus", None, ["perf_tests/test_data_parallel.py::"
                                                                         "test_data_parallel[mlp-tf32]"])
    (host_worker,) = [w for w in single if HOST & set(w.tests)]   # one process: its tests never overlap
    assert HOST <= set(host_worker.tests)
    assert host_worker.tests == [t for t in QUICK_TIER if t in host_worker.tests]   # in collection order
    loads = [sum(QUICK_TIER[t] for t in w.tests) for w in single]
    compute = sum(QUICK_TIER.values()) - 20.0   # the single-GPU tests' time
    host = sum(QUICK_TIER[t] for t in HOST)
    # No schedule beats max(host time, an even share): within one test of it, and below the wall time of a phase
    # of their own after the parallel one.
    largest = max(QUICK_TIER[t] for t in QUICK_TIER if t not in HOST)
    assert max(host, compute / gpus) - 1e-9 <= max(loads) <= max(host, compute / gpus) + largest
    assert max(loads) < host + (compute - host) / gpus


def test_the_nightly_tier_keeps_its_host_fed_references_with_the_others(tmp_path):
    ids = ["perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b512]", "perf_tests/test_loader.py::t[a]",
           "perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b8000]", "perf_tests/test_cnn.py::c[x-resident-y]"]
    quick = plan_workers(ids, 2, {}, tmp_path)
    nightly = plan_workers(ids, 2, {}, tmp_path, full=True)
    assert [w.tests for w in quick] == [[ids[0], ids[2]], [ids[1], ids[3]]]
    assert [w.tests for w in nightly] == [ids[:3], ids[3:]]


def test_a_block_kept_together_is_weighed_whole_and_strangers_are_refused():
    ids = ["a", "b", "c", "d", "e"]
    parts = split_tests(ids, 2, {"a": 1, "b": 5, "c": 1, "d": 4, "e": 2}, together=["a", "c", "e"])
    assert parts == [["b"], ["a", "c", "d", "e"]] or parts == [["a", "c", "d", "e"], ["b"]]
    assert split_tests(ids, 3, {}, together=ids) == [ids, [], []]
    with pytest.raises(ValueError, match="tests to keep together are not among the tests to split: z"):
        split_tests(ids, 2, together=["a", "z"])


def test_the_split_weighs_each_test_by_its_wall_time_where_the_run_kept_it():
    run = fake_run("NVIDIA H100", {"a": 0.3, "b": 0.2})
    run["benchmarks"][0]["extra_info"]["test_seconds"] = 34.5   # building and compiling dwarf the timed rounds
    assert benchmark_seconds(run) == {"a": 34.5, "b": 0.2}


# What feeds a timed runner from host memory: the loader and pinned copies, torch's host batches and DataLoader,
# the engine's one-shot inference, Keras' fit, and an engine whose data is not always resident.
HOST_FED = re.compile(r"LoaderRunner|PinnedCopyRunner|PinnedHostBatchRunner|EngineOneShotRunner|dataloader"
                      r"|fit_runner|resident_data=(?!True\b)")


def test_every_perf_module_that_feeds_from_host_arrays_is_known_to_the_spread():
    # A tripwire: a new module timing a host-fed runner must be placed by shares_host_bandwidth (its module, a
    # nightly reference, or case ids that say "streamed"); someone has to decide which of its cases stream.
    perf = Path(__file__).resolve().parents[2] / "perf_tests"
    unplaced = []
    for module in sorted(perf.glob("test_*.py")):
        source, path = module.read_text(), f"perf_tests/{module.name}"
        fed = sorted(set(HOST_FED.findall(source)))
        placed = (path in HOST_BANDWIDTH_MODULES or any(entry.startswith(path) for entry in NIGHTLY_HOST_BANDWIDTH)
                  or "'streamed'" in source)
        if fed and not placed:
            unplaced.append(f"{path} ({', '.join(fed)})")
    assert not unplaced, f"host-fed perf modules spread.shares_host_bandwidth does not place: {unplaced}"


def test_the_merged_run_says_which_core_timed_each_test_and_why_it_was_chosen(tmp_path):
    cores = {"0": TimingCore(47, "NUMA-local to GPU 0 (its local cores: 0-15,32-47)"),
             "1": TimingCore(63, "NUMA-local to GPU 1 (its local cores: 16-31,48-63)")}
    workers = plan_workers(["perf_tests/a.py::a", "perf_tests/b.py::b"], ["0", "1"], {}, tmp_path, cores=cores)
    for worker, cpu in zip(workers, (47, 63)):
        run = fake_run("NVIDIA H100", {worker.tests[0]: 1.0})
        run["machine_info"]["timing_cpu"] = {"cpu": cpu, "set_by": "GATE_TIMING_CPU"}
        worker.json_path.write_text(json.dumps(run))
    (path,) = save_merged(workers, {"gpu0": 0, "gpu1": 0}, tmp_path / "store", "m", "tag", False)
    run = json.loads(path.read_text())
    assert {b["fullname"]: b["extra_info"]["timing_cpu"]["cpu"] for b in run["benchmarks"]} == {
        "perf_tests/a.py::a": 47, "perf_tests/b.py::b": 63}
    assert run["machine_info"]["spread"]["timing_cores_chosen"] == {
        "gpu0": {"cpu": 47, "why": cores["0"].why}, "gpu1": {"cpu": 63, "why": cores["1"].why}}
    assert "timing_cpu" not in run["machine_info"]   # one worker's core would read as every test's


def test_every_gpus_new_plan_choices_are_kept_by_the_spread_alone(tmp_path):
    # Two sessions writing one cudnn_plans.json would each save what it loaded plus its own: the later drops the
    # earlier's. Each worker hands its choices over (GATE_PLANS_OUT) and the spread merges them all.
    stack = {"cudnn": "91900", "cudnn_frontend": "1.22.1", "gpu": "NVIDIA H100 80GB HBM3"}
    store = tmp_path / "nvidia-h100-80gb-hbm3" / cudnn_plans.PLAN_FILE
    cudnn_plans.load(store, stack).save({"old": {"plan": "eng0", "ms": 1.0}})
    workers = plan_workers(["perf_tests/test_mlp.py::a", "perf_tests/test_cnn.py::b",
                            "perf_tests/test_data_parallel.py::c"], 2, {}, tmp_path)
    assert len({w.environment({})[cudnn_plans.HAND_OFF_ENV] for w in workers}) == 3
    for i, worker in enumerate(workers[:2]):   # the all-GPU worker ended without a finish: nothing handed
        handed_to = worker.environment({})[cudnn_plans.HAND_OFF_ENV]
        choice = {f"g{i}": {"plan": "eng3", "ms": 0.5}}
        assert cudnn_plans.hand_off(handed_to, cudnn_plans.load(store, stack), choice) == 1
    shown = []
    assert keep_plans(workers, show=lambda line, **_: shown.append(line)) == 2
    assert sorted(json.loads(store.read_text())["plans"]) == ["g0", "g1", "old"]
    assert len(shown) == 2 and all("1 new cuDNN plan choices kept" in line for line in shown)


def test_a_hand_off_that_is_not_one_is_reported_and_keeps_nothing(tmp_path):
    worker = Worker("gpu0", "0", [], tmp_path / "gpu0.json")
    worker.plans_path.write_text(json.dumps({"format": 1, "plans": "eng0"}))
    shown = []
    assert keep_plans([worker], show=lambda line, **_: shown.append(line)) == 0
    assert "gpu0's cuDNN plan choices not kept" in shown[0] and "not a hand-off" in shown[0]


def tier_time(seconds: float, **workloads: tuple[int, float]) -> dict:
    """A worker run's gpuengine_tier_time (gpuengine/gate/tier_time.py): workload -> (tests, seconds)."""
    return {"tier": "quick", "on_gpu": True, "session_seconds": seconds, "quick_tier_target_s": 600.0,
            "per_workload": {name: {"tests": tests, "seconds": s, "timed_rounds_budget_s": 60}
                             for name, (tests, s) in workloads.items()}}


def test_the_merged_run_takes_every_workers_time_and_the_spreads_own_length(tmp_path):
    runs = [dict(fake_run("NVIDIA H100", {"a": 1.0}),
                 gpuengine_tier_time=tier_time(180.0, mlp=(2, 30.0), cnn=(1, 9.0))),
            dict(fake_run("NVIDIA H100", {"b": 1.0}), gpuengine_tier_time=tier_time(200.0, mlp=(1, 20.0)))]
    (merged,) = merge_runs(runs, ["gpu0", "gpu1"]).values()
    record = merged["gpuengine_tier_time"]   # the first worker's alone, before
    assert record["per_workload"] == {"cnn": {"tests": 1, "seconds": 9.0, "timed_rounds_budget_s": 60},
                                      "mlp": {"tests": 3, "seconds": 50.0, "timed_rounds_budget_s": 60}}
    assert record["sessions_seconds"] == {"gpu0": 180.0, "gpu1": 200.0} and record["session_seconds"] == 200.0
    workers = [Worker(f"gpu{i}", str(i), [], tmp_path / f"gpu{i}.json") for i in range(2)]
    for worker, run in zip(workers, runs):
        worker.json_path.write_text(json.dumps(run))
    (path,) = save_merged(workers, {"gpu0": 0, "gpu1": 0}, tmp_path / "store", "m", "tag", False, wall_seconds=251.04)
    assert json.loads(path.read_text())["gpuengine_tier_time"]["session_seconds"] == 251.0


def test_the_spread_writes_one_markdown_summary_of_the_merged_run(tmp_path, monkeypatch):
    assert take_option(["-k", "x", "--gate-summary", "a.md", "--gate-summary=b.md", "--full"], "--gate-summary") == \
        ("b.md", ["-k", "x", "--full"])
    with pytest.raises(SystemExit, match="--gate-summary needs a value"):
        take_option(["--gate-summary"], "--gate-summary")
    workers = [Worker(f"gpu{i}", str(i), [], tmp_path / f"gpu{i}.json") for i in range(3)]
    for i, worker in enumerate(workers[:2]):   # gpu2's session died before it wrote its run
        run = fake_run("NVIDIA H100", {f"perf_tests/t.py::t{i}": 1.0})
        run["benchmarks"][0]["extra_info"]["stored_run_check"] = {"verdict": "not significant", "primary": {}}
        run["gpuengine_tier_time"] = tier_time(100.0 + i, w=(1, 50.0))
        worker.json_path.write_text(json.dumps(run))
    status = {"gpu0": 0, "gpu1": 0, "gpu2": 3}
    saved = save_merged(workers, status, tmp_path / "store", "m", "tag", False, wall_seconds=420.0)
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    assert write_summary(tmp_path / "summary.md", saved, status, workers, tmp_path) == [tmp_path / "summary.md", step]
    markdown = (tmp_path / "summary.md").read_text()
    assert markdown.count("## gpuengine perf gate: FAILED (exit status 3)") == 1 and step.read_text() == markdown
    assert "2 tests measured: 2 not significant" in markdown and "Tier time: 7.0 min" in markdown
    assert "- worker gpu2 wrote no run (exit status 3): its tests are missing here" in markdown
    assert f"- saved: `{saved[0]}`" in markdown and "| w | 2 | 100.0 | 60 |" in markdown
