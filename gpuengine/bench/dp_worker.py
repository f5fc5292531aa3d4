"""One rank of a data-parallel benchmark (started by dp_group.WorkerGroup): builds runners, answers commands.

A build spec names a workload (mlp, cnn, resnet), its shape ("seed": the
GPU sizes; "smoke": the CPU tier's), the per-rank batch, steps per global
epoch, engine toggles and which runners to build:

- `gpuengine`: the engine data parallel over every rank (Trainer(sync=...),
  global batch = per-rank batch x world size): the benchmark;
- `gpuengine_1gpu`: the engine alone on rank 0 at the per-rank batch, the
  same data (weak scaling: the same work per GPU): its throughput over this
  one's is `scaling_vs_1gpu`;
- `torch_ddp`: PyTorch DDP (reference/torch_ddp.py) on every rank, the model
  the workload's twin builds (`twin_ddp_model`) from the engine's initial
  weights.

Each rank builds the same data from the same seed, and starts its engine
from the spec's `plans` (autotuned choices by key text, the gate's kept ones)
so that it does not time again what was timed before. Commands: prepare,
round (run, drain the device, reply), sync, loss (one more round; this
rank's last epoch loss), plans (the choices this rank timed itself), exit,
each a dict over the worker channel (channel.py). An exception is sent back
as the reply, then the rank exits with status 1.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback

from ..config import EngineConfig
from ..ops import autotune
from ..parallel.sync import data_parallel
from ..workloads.registry import get_workload
from .channel import Channel, ChannelClosed
from .runners import EngineTrainRunner

RUNNERS = ("gpuengine", "gpuengine_1gpu", "torch_ddp")


def workload_parts(name: str, shape_kind: str):
    """(shape, build_network(shape), data(samples, shape), learning rate) of a workload."""
    workload = get_workload(name)
    return workload.shape(shape_kind), workload.build, workload.data, workload.lr


def torch_ddp_runner(spec: dict, shape, x, t, engine_params, device: str, epochs_per_round: int, sync):
    from ..reference.torch_ddp import DDPTrainRunner, init_process_group
    entry = get_workload(spec["workload"])
    twin = importlib.import_module(entry.twin)
    if not hasattr(twin, "twin_ddp_model"):
        raise ValueError(f"workload {entry.name!r} has no torch DDP reference: its twin {entry.twin} offers no "
                         "twin_ddp_model")
    graph = bool(spec.get("torch_graph", True))
    init_process_group(sync.rendezvous.store, sync.group.rank, sync.group.world_size, device, graph)
    model, loss, channels_last, x = twin.twin_ddp_model(shape, x, t, engine_params.state_dict(),
                                                        engine_params.buffers_dict())
    return DDPTrainRunner(model, loss, x, t, spec["per_gpu_batch"], spec["precision"], entry.lr, device,
                          spec.get("seed", 0), graph, channels_last=channels_last, epochs_per_round=epochs_per_round)


def build_runners(spec: dict) -> tuple[dict, dict]:
    """(runners held by this rank by name, {name: {samples_per_round, ranks, notes}} as every rank agrees)."""
    unknown = set(spec["runners"]) - set(RUNNERS)
    if unknown or "gpuengine" not in spec["runners"]:
        raise ValueError(f"runners must include 'gpuengine' and be among {RUNNERS}, got {spec['runners']}")
    autotune.use_plan_choices(spec.get("plans") or {})
    config = EngineConfig(precision=spec["precision"], cuda_graph=spec["cuda_graph"], resident_data=True,
                          device=spec["device"])
    sync = data_parallel(config)   # first: the engine's stream must be made on this rank's GPU
    rank, world = sync.group.rank, sync.group.world_size
    shape, build, data, lr = workload_parts(spec["workload"], spec["shape"])
    per_gpu, steps = spec["per_gpu_batch"], spec["steps_per_epoch"]
    x, t = data(per_gpu * world * steps, shape)
    rounds = spec["epochs_per_round"]
    held, info = {}, {}
    engine = EngineTrainRunner(build(shape), x, t, per_gpu * world, config, rounds, lr=lr, sync=sync)
    held["gpuengine"] = engine
    info["gpuengine"] = {"samples_per_round": engine.samples_per_round, "ranks": list(range(world))}
    if "gpuengine_1gpu" in spec["runners"]:
        # The same steps per round as the data-parallel runner: world x the epochs of a world x longer batch count
        alone_rounds = max(1, rounds // world) if world > 1 else rounds
        alone = EngineTrainRunner(build(shape), x, t, per_gpu, config, alone_rounds, lr=lr) if rank == 0 else None
        held["gpuengine_1gpu"] = alone
        info["gpuengine_1gpu"] = {"samples_per_round": per_gpu * (len(x) // per_gpu) * alone_rounds, "ranks": [0]}
    if "torch_ddp" in spec["runners"]:
        device = "cuda" if engine.trainer.backend.is_gpu else "cpu"
        ddp = torch_ddp_runner(spec, shape, x, t, engine.trainer.params, device, rounds, sync)
        held["torch_ddp"] = ddp
        info["torch_ddp"] = {"samples_per_round": ddp.samples_per_round, "ranks": list(range(world)),
                             "notes": {"mode": ddp.mode_note}}
    return held, info


def epoch_loss(runner) -> float:
    """One more round and this rank's last epoch loss (a host read: outside timing)."""
    if hasattr(runner, "trainer"):
        return runner.train(runner.epochs_per_round)[-1]
    runner.run_round()
    runner.synchronize()
    return runner.last_epoch_loss()


def answer(runners: dict, message: dict) -> dict:
    op = message["op"]
    if op == "plans":
        return {"preset": len(autotune.PLAN_CHOICES.preset), "tuned": dict(autotune.PLAN_CHOICES.tuned)}
    runner = runners.get(message.get("runner"))
    if op in ("prepare", "round", "sync", "loss") and runner is None:
        raise KeyError(f"this rank holds no runner {message.get('runner')!r} (it holds {sorted(runners)})")
    if op == "prepare":
        runner.prepare()
        runner.synchronize()
    elif op == "round":
        runner.run_round()
        runner.synchronize()
    elif op == "sync":
        runner.synchronize()
    elif op == "loss":
        return {"loss": float(epoch_loss(runner))}
    else:
        raise ValueError(f"unknown command {op!r}")
    return {}


def main() -> int:
    channel = Channel(int(os.environ["GPUENGINE_DP_CMD_FD"]), int(os.environ["GPUENGINE_DP_REPLY_FD"]))
    runners: dict = {}
    sync = None
    while True:
        try:
            message = channel.receive()
        except ChannelClosed:   # the coordinator went away: so does this rank
            break
        if message["op"] == "exit":
            break
        try:
            if message["op"] == "build":
                held, info = build_runners(message["spec"])
                runners = {name: r for name, r in held.items() if r is not None}
                sync = held["gpuengine"].trainer.sync
                reply = {"runners": info}
            else:
                reply = answer(runners, message)
        except Exception:   # handed to the coordinator, which names this rank
            channel.send({"error": traceback.format_exc()})
            return 1
        channel.send(reply)
    if "torch_ddp" in runners:
        runners["torch_ddp"].close()
    if sync is not None:
        runners["gpuengine"].trainer.release_graphs()   # before the communicator whose kernels they hold
        sync.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
