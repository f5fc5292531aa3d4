"""Each GPU's perf session times on a core of its own: the choice (fake sysfs), GATE_TIMING_CPU, the pin per round."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuengine.bench.timing_cores import (TimingCore, choose_timing_cores, cpu_text, gpu_bus_ids, local_cpus,
                                          parse_cpu_list, smt_siblings, sysfs_bus_id, timing_cores)
from gpuengine.gate.ab.sides import Interpreter, SideError, Worker as SideWorker
from gpuengine.gate.ab.worker import TIMING_CPU_ENV, cpu_list_text, on_cpu, timing_cpu
from gpuengine.gate.harness import round_ms
from gpuengine.gate.spread import Worker, plan_workers

REPO = Path(__file__).resolve().parents[2]
pinning = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this OS cannot pin a thread to a core")


def test_cpulists_read_and_write_as_linux_writes_them():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpu_text({0, 1, 2, 3, 8, 10, 11}) == cpu_list_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    with pytest.raises(ValueError, match="'0-x' is not a cpulist"):
        parse_cpu_list("0-x")
    with pytest.raises(ValueError, match="'4-2' runs backwards"):
        parse_cpu_list("4-2")


def test_nvidia_smi_bus_ids_map_to_sysfs_by_index_and_uuid():
    assert sysfs_bus_id("00000000:19:00.0") == "0000:19:00.0"
    assert sysfs_bus_id("00000001:AB:00.0") == "0001:ab:00.0"
    listing = "0, GPU-aaa, 00000000:19:00.0\n1, GPU-bbb, 00000000:3B:00.0\nnot a gpu line\n"
    fake = lambda *args, **kwargs: SimpleNamespace(stdout=listing)
    assert gpu_bus_ids(fake) == {"0": "0000:19:00.0", "GPU-aaa": "0000:19:00.0",
                                 "1": "0000:3b:00.0", "GPU-bbb": "0000:3b:00.0"}

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    assert gpu_bus_ids(missing) == {}


def fake_host(tmp_path: Path, gpus: dict[str, str], siblings: dict[int, str]) -> tuple[Path, Path]:
    """A sysfs of PCI devices (bus id -> local_cpulist) and of cores (core -> thread_siblings_list)."""
    pci, cpu = tmp_path / "pci", tmp_path / "cpu"
    for bus, cpus in gpus.items():
        (pci / bus).mkdir(parents=True)
        (pci / bus / "local_cpulist").write_text(cpus + "\n")
    for core, sibs in siblings.items():
        (cpu / f"cpu{core}" / "topology").mkdir(parents=True)
        (cpu / f"cpu{core}" / "topology" / "thread_siblings_list").write_text(sibs + "\n")
    return pci, cpu


def test_sysfs_says_which_cores_are_local_and_which_are_siblings(tmp_path):
    pci, cpu = fake_host(tmp_path, {"0000:19:00.0": "0-15,32-47"}, {47: "15,47"})
    assert local_cpus("0000:19:00.0", pci) == set(range(16)) | set(range(32, 48))
    assert local_cpus("0000:99:00.0", pci) is None
    assert smt_siblings(47, cpu) == {15, 47} and smt_siblings(3, cpu) == {3}


def test_two_gpus_on_two_numa_nodes_time_on_a_local_core_each():
    allowed = set(range(64))
    local = {"0": set(range(0, 16)) | set(range(32, 48)), "1": set(range(16, 32)) | set(range(48, 64))}
    cores = choose_timing_cores(["0", "1"], allowed, local)
    assert [cores[g].cpu for g in "01"] == [47, 63]
    assert cores["0"].why == "NUMA-local to GPU 0 (its local cores: 0-15,32-47)"


def test_gpus_of_one_numa_node_get_whole_cores_apart():
    allowed = set(range(8))
    local = {g: set(range(8)) for g in "01234"}
    siblings = lambda cpu: {cpu % 4, cpu % 4 + 4}   # physical cores 0-3, their hyper-threads 4-7
    cores = choose_timing_cores(list("01234"), allowed, local, siblings)
    assert [cores[g].cpu for g in "01234"] == [7, 6, 5, 4, 3]   # a whole core each while there is one
    assert all(cores[g].why.startswith("NUMA-local") for g in "0123")
    assert cores["4"].why == "a hyper-thread sibling of another GPU's timing core: no whole core left"


def test_without_numa_information_the_cores_are_distinct_and_core_0_comes_last():
    cores = choose_timing_cores(["0", "1"], {0, 1, 2}, {})
    assert (cores["0"].cpu, cores["1"].cpu) == (2, 1)
    assert cores["0"].why == "a core of its own: no NUMA information for GPU 0"
    small = choose_timing_cores(["0", "1", "2"], {0, 1}, {})
    assert [small[g].cpu for g in "012"] == [1, 0, 1]
    assert small["1"].why == "core 0: no other core left" and "fewer cores than GPUs" in small["2"].why
    taken = choose_timing_cores(["0", "1"], set(range(8)), {"0": {6, 7}, "1": {7}})
    assert taken["1"] == TimingCore(6, "a core of its own: GPU 1's local cores (7) are taken")
    with pytest.raises(ValueError, match="affinity set is empty"):
        choose_timing_cores(["0"], set(), {})


@pinning
def test_the_host_is_read_for_each_gpu_its_bus_id_names(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    pci, cpu = fake_host(tmp_path, {"0000:19:00.0": str(allowed[-1])}, {})
    cores = timing_cores(["0", "1"], {"0": "0000:19:00.0"}, pci, cpu)
    assert cores["0"].cpu == allowed[-1] and cores["0"].why.startswith("NUMA-local to GPU 0")
    assert cores["1"].cpu != cores["0"].cpu or len(allowed) == 1


def test_each_gpus_pytest_gets_its_core_and_its_gpu_in_its_environment(tmp_path):
    cores = {"0": TimingCore(47, "NUMA-local"), "1": TimingCore(63, "NUMA-local")}
    ids = ["perf_tests/test_mlp.py::a", "perf_tests/test_cnn.py::b", "perf_tests/test_data_parallel.py::c"]
    gpu0, gpu1, whole = plan_workers(ids, ["0", "1"], {}, tmp_path, cores=cores)
    env = gpu1.environment({"PATH": "/bin", TIMING_CPU_ENV: "5"})
    assert (env["CUDA_VISIBLE_DEVICES"], env[TIMING_CPU_ENV], env["CUDA_DEVICE_ORDER"]) == ("1", "63", "PCI_BUS_ID")
    assert gpu0.environment({})[TIMING_CPU_ENV] == "47"
    assert env["GATE_PROGRESS_FILE"] == str(tmp_path / "gpu1.progress")   # shown live; its other output at its end
    assert whole.timing is None and whole.environment({"PATH": "/bin"}) == {   # every GPU, no core, plans handed on
        "PATH": "/bin", "GATE_PLANS_OUT": str(tmp_path / "all-gpus.plans.json")}
    assert Worker("x", "0", [], tmp_path).environment({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] \
        == "FASTEST_FIRST"   # the caller's order stands


@pinning
def test_gate_timing_cpu_names_a_core_of_the_process_or_is_refused():
    allowed = os.sched_getaffinity(0)
    assert timing_cpu({}) == max(allowed)
    assert timing_cpu({TIMING_CPU_ENV: f" {min(allowed)} "}) == min(allowed)
    with pytest.raises(ValueError, match=r"GATE_TIMING_CPU='two' is not a core number; this process may run on "
                                         rf"cores {cpu_list_text(allowed)}"):
        timing_cpu({TIMING_CPU_ENV: "two"})
    with pytest.raises(ValueError, match=r"GATE_TIMING_CPU=9999 is not a core this process may run on"):
        timing_cpu({TIMING_CPU_ENV: "9999"})


@pinning
def test_a_round_runs_on_the_timing_core_and_the_thread_gets_its_cores_back():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    seen = []
    runner = SimpleNamespace(synchronize=lambda: None, run_round=lambda: seen.append(os.sched_getaffinity(0)))
    assert round_ms(runner, cpu) >= 0 and seen == [{cpu}]
    assert os.sched_getaffinity(0) == before   # threads started between rounds are not narrowed to one core
    with pytest.raises(RuntimeError):
        with on_cpu(cpu):
            raise RuntimeError("a round that fails")
    assert os.sched_getaffinity(0) == before
    round_ms(runner, None)
    assert seen[-1] == before   # no timing core: left where it is


@pinning
def test_a_worker_times_on_the_sessions_core_and_refuses_a_bad_one(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    worker = SideWorker("head", REPO, tmp_path, env={TIMING_CPU_ENV: str(cpu)})
    try:
        worker.start()
        assert worker.info["timing_cpu"] == cpu
    finally:
        worker.stop()
    bad = SideWorker("base", REPO, tmp_path, env={TIMING_CPU_ENV: "-1"})
    with pytest.raises(SideError, match=r"base \(.*\): start: cannot time rounds: GATE_TIMING_CPU=-1 is not a core"):
        bad.start()
    bad.stop()


@pinning
def test_a_worker_runs_the_python_and_environment_its_side_was_given(tmp_path):
    """A stack A/B's base runs another lock's Python in an environment of its own (gpuengine/gate/ab/stack.py)."""
    ran = tmp_path / "ran"
    python = tmp_path / "python"   # a stand-in interpreter: says it ran, then is this Python
    python.write_text(f'#!/bin/sh\necho "$@" > "{ran}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    cpu = min(os.sched_getaffinity(0))
    worker = SideWorker("base", REPO, tmp_path, interpreter=Interpreter(str(python),
                                                                         {**os.environ, TIMING_CPU_ENV: str(cpu)}))
    try:
        worker.start()
        assert worker.info["timing_cpu"] == cpu and ran.read_text().split()[0].endswith("ab/worker.py")
    finally:
        worker.stop()


@pinning
def test_a_perf_session_with_a_bad_timing_core_stops_before_anything_runs():
    result = subprocess.run([sys.executable, "-m", "pytest", "perf_tests/test_mlp.py", "--collect-only", "-q",
                             "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, TIMING_CPU_ENV: "core seven"})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout[-2000:] + result.stderr[-2000:]
    assert "gpuengine: GATE_TIMING_CPU='core seven' is not a core number" in result.stderr
