"""A seed workload trained data parallel, one rank of it: what `python -m gpuengine.parallel.launch --gpus N mlp` runs.

Every rank builds the same network and data, trains `--epochs` epochs at the
global `--batch`, and rank 0 prints the epoch losses averaged over ranks.
`--out DIR` has every rank write DIR/rank<r>.npz (its losses, the averaged
losses and its final weights): the parity test compares them with one process.
`--check` only checks the arguments and the GPUENGINE_* settings and exits:
the launcher runs it once before any rank, so a bad one is said once.

No wait on a peer is endless: from the process group's set-up to the last
epoch, each stage (set-up, then each epoch: the first with its warm-up,
autotuning and capture; then the end: the mean over ranks and the teardown)
has `--stall-limit` seconds. A rank past it (on a collective a peer never
joined, or a device that never finishes) says which stage, where each rank
last announced it was (parallel/watchdog.py), prints every thread's stack and
exits with status 1; the launcher then stops the other ranks and names it.
"""
from __future__ import annotations

import argparse
import faulthandler
from pathlib import Path

import numpy as np

import dataclasses

from ..config import ConfigError, EngineConfig
from ..parallel.sync import data_parallel
from ..parallel.watchdog import StallWatch
from ..trainer import Trainer
from .registry import WORKLOADS, get_workload

STALL_LIMIT_S = 900.0   # a stage this long is a hang: a ResNet-50 first epoch autotunes for minutes on a fresh GPU


def build(name: str, samples: int, inputs: int, hidden: int):
    """(network, x, t) of workload `name` at its CPU-tier shape (the MLP's inputs and hidden units as told)."""
    workload = get_workload(name)
    shape = workload.smoke_shape
    if name == "mlp":
        shape = dataclasses.replace(shape, inputs=inputs, hidden=hidden)
    return (workload.build(shape),) + tuple(workload.data(samples, shape))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuengine.workloads.data_parallel")
    parser.add_argument("workload", choices=tuple(WORKLOADS))
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=32, help="mlp: input features")
    parser.add_argument("--hidden", type=int, default=48, help="mlp: hidden units")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bucket-bytes", type=int, default=None, help="gradient bucket size (DDP's 25 MiB)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--stall-limit", type=float, default=STALL_LIMIT_S, metavar="S",
                        help=f"seconds a stage may take before the rank says where every rank is, prints its stacks "
                             f"and fails (default {STALL_LIMIT_S:g}: set-up, each epoch, the end)")
    parser.add_argument("--check", action="store_true", help="check the arguments and GPUENGINE_* and exit")
    args = parser.parse_args(argv)
    try:
        config = EngineConfig.from_env()
    except ConfigError as exc:
        parser.error(str(exc))
    if not args.stall_limit > 0:
        parser.error(f"argument --stall-limit: must be > 0 seconds, got {args.stall_limit:g}")
    if args.check:
        return 0
    faulthandler.dump_traceback_later(args.stall_limit, exit=True)   # the store and NCCL: no store to announce in yet
    extra = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}
    sync = data_parallel(config, **extra)
    watch = StallWatch(sync.group, args.stall_limit)
    watch.stage("set-up: the network, the data, rank 0's weights")
    net, x, t = build(args.workload, args.samples, args.inputs, args.hidden)
    trainer = Trainer(net, x, t, args.batch, config, seed=args.seed, sync=sync)
    losses = []
    for epoch in range(1, args.epochs + 1):   # one epoch at a time: each has the limit afresh
        first = " with its warm-up, autotuning and capture" if epoch == 1 else ""
        watch.stage(f"epoch {epoch} of {args.epochs}{first}: its steps' all-reduces")
        losses += trainer.train(1)
    watch.stage("the end: the mean over ranks, the teardown")
    mean = sync.mean_over_ranks(losses)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez(args.out / f"rank{sync.group.rank}.npz", losses=np.array(losses), mean_losses=np.array(mean),
                 buckets=np.array(len(sync.buckets)), **trainer.params.state_dict())
    if sync.group.is_root:
        print(f"{args.workload}: {sync.group.world_size} ranks, global batch {args.batch}, "
              f"epoch losses {' '.join(f'{v:.6g}' for v in mean)}", flush=True)
    trainer.release_graphs()   # before the communicator whose kernels they hold
    sync.close()
    watch.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
