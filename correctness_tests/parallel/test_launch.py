"""The launcher end to end: N ranks train like one process at the same global batch; a failing rank is named.

The CPU tier runs the ranks as processes with the store all-reduce; the gpu-marked
test runs the same comparison over NCCL on two GPUs.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the rendezvous uses torch's TCPStore; torch is not installed")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.parallel.launch import child_env, device_notice, free_port  # noqa: E402
from gpuengine.runtime.backend import gpu_visible  # noqa: E402
from gpuengine.workloads.data_parallel import build  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402

from ..gpu_checks import TOLERANCE  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CPU = {"GPUENGINE_DEVICE": "cpu", "GPUENGINE_PRECISION": "fp32"}
SIZES = {"mlp": dict(samples=256, batch=32, epochs=3), "cnn": dict(samples=64, batch=16, epochs=2)}


def launch(args, env_extra, timeout=120):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-m", "gpuengine.parallel.launch", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def single_process(workload, env_extra, samples, batch, epochs):
    config = EngineConfig.from_env(dict(env_extra))
    net, x, t = build(workload, samples, 32, 48)
    trainer = Trainer(net, x, t, batch, config)
    return trainer.train(epochs), trainer.params.state_dict()


def assert_same_training(out: Path, world: int, losses, weights, tol: float = 1e-5):
    """The ranks hold the same weights bit for bit, and those of one process at the global batch within `tol`
    (TF32 rounds each GEMM by its shape, and a rank's batch is a slice of the process's)."""
    ranks = [np.load(out / f"rank{r}.npz") for r in range(world)]
    np.testing.assert_allclose(ranks[0]["mean_losses"], losses, rtol=tol)
    for name, value in weights.items():
        for r, saved in enumerate(ranks):
            np.testing.assert_array_equal(saved[name], ranks[0][name], err_msg=f"rank {r} drifted from rank 0")
        np.testing.assert_allclose(ranks[0][name], value, rtol=tol, atol=tol * np.abs(value).max(), err_msg=name)
    return ranks


@pytest.mark.parametrize("workload,world,env", [
    ("mlp", 2, {}), ("mlp", 2, {"GPUENGINE_CUDA_GRAPH": "2"}), ("mlp", 4, {"GPUENGINE_RESIDENT_DATA": "0"}),
    ("mlp", 2, {"GPUENGINE_PRECISION": "tf32"}),   # the batch-innermost path: each rank's gather writes x so too
    ("cnn", 2, {})])
def test_n_ranks_at_global_batch_b_train_like_one_process_at_b(tmp_path, workload, world, env):
    env = dict(CPU, **env)
    size = SIZES[workload]
    result = launch(["--gpus", world, workload, "--out", tmp_path, "--bucket-bytes", 600,
                     *[f"--{k}={v}" for k, v in size.items()]], env)
    assert result.returncode == 0, result.stderr
    assert f"GPUENGINE_DEVICE=cpu: the engine in each of the {world} rank(s) runs on the CPU" in result.stderr
    assert f"{workload}: {world} ranks, global batch {size['batch']}" in result.stdout
    ranks = assert_same_training(tmp_path, world, *single_process(workload, env, **size))
    assert int(ranks[0]["buckets"]) > 1, "the small bucket cap must split the gradients"


def torchrun_two_nodes(out: Path, env_extra: dict, size: dict, devices=(None, None), args=()) -> list[str]:
    """torchrun's contract across machines, on one host: two node ranks of one process each, static rendezvous
    at MASTER_ADDR:MASTER_PORT (the agent hosts the store; the engine's rank 0 finds the port taken and, as
    TORCHELASTIC_USE_AGENT_STORE says, uses the agent's); node i sees only devices[i] where one is given, as on
    a machine of its own. Each node's output, after both ended."""
    port, nodes = free_port(), []
    for node, device in enumerate(devices):
        env = dict(os.environ, **env_extra, **({"CUDA_VISIBLE_DEVICES": device} if device is not None else {}))
        nodes.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
             "-m", "gpuengine.workloads.data_parallel", "mlp", "--out", str(out), *map(str, args),
             *[f"--{k}={v}" for k, v in size.items()]],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [node.communicate(timeout=280)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert f"mlp: 2 ranks, global batch {size['batch']}" in outputs[0]
    return outputs


def test_torchrun_with_two_node_ranks_trains_like_one_process(tmp_path):
    size = SIZES["mlp"]
    torchrun_two_nodes(tmp_path, CPU, size)
    assert_same_training(tmp_path, 2, *single_process("mlp", CPU, **size))


FAILING = """
import os, signal, sys, time
from gpuengine.parallel import data_parallel
sync = data_parallel(timeout_s=120)        # rank 0 then waits on rank 1 far longer than the test allows
if os.environ["RANK"] == "1":
    {failure}
sync.rendezvous.all_gather("never", b"x")
"""


@pytest.mark.parametrize("failure,expected", [
    ('raise RuntimeError("rank 1 broke")', "rank 1 failed (exit status 1); stopped rank(s) 0"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "rank 1 failed (killed by signal 9); stopped rank(s) 0")])
def test_a_rank_that_raises_or_dies_stops_the_others_and_is_named(tmp_path, failure, expected):
    script = tmp_path / "fails.py"
    script.write_text(FAILING.format(failure=failure))
    started = time.monotonic()
    result = launch(["--gpus", 2, "--grace", 2, script], CPU, timeout=60)
    assert result.returncode != 0
    assert expected in result.stderr
    assert time.monotonic() - started < 30, "the surviving rank must not wait out its 120 s rendezvous timeout"


def test_a_rank_past_its_stall_limit_prints_where_it_waited_and_every_rank_stops():
    """No wait on a peer is endless: a rank whose stage outlasts --stall-limit says so, prints its stacks, fails."""
    started = time.monotonic()
    result = launch(["--gpus", 2, "--grace", 2, "mlp", "--stall-limit", 0.05], CPU, timeout=60)
    assert result.returncode != 0
    said = "spent more than 0.05 s in stage" in result.stderr or "Timeout (0:00:00.05" in result.stderr
    assert said and 'File "' in result.stderr, result.stderr   # the watch's words (or, in set-up, faulthandler's)
    assert "failed (exit status 1)" in result.stderr
    assert time.monotonic() - started < 30, "no rank may wait out its 120 s rendezvous timeout"


STALLING = """
import os, time
from gpuengine.parallel import data_parallel
from gpuengine.parallel.watchdog import StallWatch
sync = data_parallel(timeout_s=120)
watch = StallWatch(sync.group, 3.0)
watch.stage("set-up")
if os.environ["RANK"] == "1":
    time.sleep(100)   # rank 1 never leaves its set-up
time.sleep(1.0)       # rank 0's epoch 1 begins a second after rank 1's set-up: rank 1's limit comes first
watch.stage("epoch 1")
sync.rendezvous.all_gather("never", b"x")
"""


def test_a_stalled_rank_names_its_stage_and_where_every_rank_last_was(tmp_path):
    """Rank 1 stalls in its set-up: its watch fires and says rank 0 is ahead; the launcher stops rank 0."""
    script = tmp_path / "stalls.py"
    script.write_text(STALLING)
    started = time.monotonic()
    result = launch(["--gpus", 2, "--grace", 2, script], CPU, timeout=60)
    assert result.returncode == 1
    assert "rank 1 spent more than 3 s in stage 'set-up'" in result.stderr, result.stderr
    assert "rank 0: last announced stage 'epoch 1' (ahead)" in result.stderr, result.stderr
    assert "The rank's threads:" in result.stderr and 'in <module>' in result.stderr
    assert "rank 1 failed (exit status 1); stopped rank(s) 0" in result.stderr
    assert time.monotonic() - started < 30, "no rank may wait out its 120 s rendezvous timeout"


class _Store:
    """What the watch uses of the store: set, check and get."""

    def __init__(self, values: dict):
        self.values = values

    def set(self, key, value):
        self.values[key] = value

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]


def test_the_stall_report_says_who_is_behind_level_ahead_or_silent():
    from gpuengine.parallel.group import ProcessGroup
    from gpuengine.parallel.watchdog import StallWatch
    store = _Store({"stage/0": b'[1, "set-up"]', "stage/1": b'[2, "epoch 1"]', "stage/3": b'[3, "epoch 2"]'})
    watch = StallWatch(ProcessGroup(1, 4, 1, "127.0.0.1", 29500), 5.0, store=store)
    text = watch.report(2, "epoch 1")
    assert text.splitlines() == [
        "gpuengine data parallel: rank 1 spent more than 5 s in stage 'epoch 1': a wait on a peer (a collective) or "
        "on the device that never ended",
        "  rank 0: last announced stage 'set-up' (behind: not heard from in this stage)",
        "  rank 2: not heard from (no stage announced, or the store is gone)",
        "  rank 3: last announced stage 'epoch 2' (ahead)"]
    with pytest.raises(ValueError, match="stall limit must be > 0 seconds, got 0"):
        StallWatch(ProcessGroup(0, 1, 0, "127.0.0.1", 29500), 0, store=_Store({}))


def test_an_unknown_target_is_refused():
    result = launch(["--gpus", 2, "no_such_script.py"], CPU)
    assert result.returncode != 0 and "'no_such_script.py' is neither a script file nor a workload" in result.stderr


@pytest.mark.parametrize("args,env,error", [
    (["foo"], {}, "argument workload: invalid choice: 'foo'"),
    (["mlp", "--epochs", "x"], {}, "argument --epochs: invalid int value: 'x'"),
    (["mlp", "--stall-limit", "0"], {}, "argument --stall-limit: must be > 0 seconds, got 0"),
    (["mlp"], {"GPUENGINE_PRECISION": "fp64"}, "GPUENGINE_PRECISION='fp64' is not accepted")])
def test_a_workloads_bad_argument_is_said_once_and_no_rank_starts(args, env, error):
    result = launch(["--gpus", 2, *args], dict(CPU, **env), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count(error) == 1 and result.stderr.count("usage: ") == 1, result.stderr
    assert result.stderr.rstrip().endswith("gpuengine.parallel.launch: no rank started: "
                                           "gpuengine.workloads.data_parallel refused the arguments (above)")
    assert result.stdout == ""


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: the ranks' engine runs on it, nothing to say")
def test_without_a_gpu_the_launcher_says_the_ranks_run_on_numpy(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text("")
    unset = {k: v for k, v in os.environ.items() if not k.startswith("GPUENGINE_")}
    result = subprocess.run([sys.executable, "-m", "gpuengine.parallel.launch", "--gpus", "2", str(script)], cwd=REPO,
                            env=unset, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("gpuengine.parallel.launch: no CUDA GPU is visible: the engine in each of the 2 rank(s) "
                             "runs on the CPU (NumPy backend), all-reducing through the rendezvous store, not NCCL: "
                             "a check of data parallel training, not a speed-up\n")
    assert device_notice(4, {"GPUENGINE_DEVICE": "cpu"}).startswith(
        "gpuengine.parallel.launch: GPUENGINE_DEVICE=cpu: the engine in each of the 4 rank(s) runs on the CPU")


def test_children_get_the_launcher_variables_and_nvlink_multicast_off():
    env = child_env(1, 3, 29511, base={"NCCL_NVLS_ENABLE": "1", "PYTHONPATH": "elsewhere"})
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                "NCCL_NVLS_ENABLE")} == \
        {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511",
         "NCCL_NVLS_ENABLE": "0"}
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "elsewhere"]


def gpu_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:   # no cupy or no driver: no GPUs
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() < 2, reason="NCCL data parallel needs at least 2 visible GPUs")
@pytest.mark.parametrize("precision,graph", [("fp32", "0"), ("fp32", "4"), ("tf32", "4")])
def test_two_gpus_over_nccl_train_like_one_gpu(tmp_path, precision, graph):
    # tf32: the batch-innermost path, each rank's gather writing its rows of x so too
    env = {"GPUENGINE_DEVICE": "cuda", "GPUENGINE_PRECISION": precision, "GPUENGINE_CUDA_GRAPH": graph}
    size = dict(samples=512, batch=64, epochs=3)
    # --stall-limit under the test's timeout: a rank stuck on a collective prints where, in result.stderr
    result = launch(["--gpus", 2, "mlp", "--out", tmp_path, "--bucket-bytes", 600, "--stall-limit", 150,
                     *[f"--{k}={v}" for k, v in size.items()]], env, timeout=300)
    assert result.returncode == 0, result.stderr
    tol = 1e-5 if precision == "fp32" else TOLERANCE[precision]
    assert_same_training(tmp_path, 2, *single_process("mlp", env, **size), tol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() < 2, reason="NCCL data parallel needs at least 2 visible GPUs")
def test_torchrun_nodes_of_one_gpu_each_train_over_nccl_like_one_gpu(tmp_path):
    """Two torchrun node ranks, each seeing one GPU as a machine of its own would, steps in CUDA graphs: NCCL
    between them needs nothing of the engine beyond torchrun's variables."""
    env = {"GPUENGINE_DEVICE": "cuda", "GPUENGINE_PRECISION": "fp32", "GPUENGINE_CUDA_GRAPH": "4"}
    size = dict(samples=512, batch=64, epochs=3)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",")[:2] if visible else ["0", "1"]
    torchrun_two_nodes(tmp_path, env, size, devices, args=("--bucket-bytes", 600, "--stall-limit", 150))
    assert_same_training(tmp_path, 2, *single_process("mlp", env, **size))
