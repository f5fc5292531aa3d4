"""How long a workload's engine takes to set up on a fresh process, autotuning included: the cold start's lever
(plan_workers: runtime-compiled cuDNN plans built in worker processes, ops/plan_pool.py) measured.

    python3 scripts/setup_time.py resnet --precision tf32 [--toggle plan_workers=4]

Builds the engine as a profile builds it (the perf tests' network, batch and data, resident), with no kept
plans (every graph autotuned afresh), then warms it up (its first steps time every candidate). Prints one JSON
object: the toggles, the seconds building took (the trainer's construction: the cuDNN graphs are built there),
the seconds warming up took (the workers' plans brought in and every graph timed), and cuDNN's own count.
Run it once per setting, each in a process of its own: a process keeps the graphs it built.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from gpuengine.bench.cli_args import UsageError, parse_toggle
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.bench.profile.workloads import get_workload
    from gpuengine.config import PRECISIONS
    from gpuengine.ops import autotune, cudnn
    from gpuengine.runtime.backend import gpu_visible
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload")
    parser.add_argument("--precision", choices=PRECISIONS, default="tf32")
    parser.add_argument("--toggle", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    try:
        toggles = dict(parse_toggle(text, "--toggle") for text in args.toggle)
    except UsageError as exc:
        parser.error(str(exc))
    if not gpu_visible():
        print("setup_time: needs a GPU with CuPy and the cuDNN frontend; none is visible here", file=sys.stderr)
        return 2
    autotune.PLAN_CHOICES = autotune.PlanChoices()   # no kept plans: a new machine's set-up
    workload = get_workload(args.workload)
    case = ProfileCase(workload.name, args.precision, workload.batch, 1, tuple(toggles.items()))
    started = time.perf_counter()
    runner = workload.engine_runner(case)
    built = time.perf_counter()
    runner.prepare()
    warmed = time.perf_counter()
    graphs = list(cudnn.built_graphs().values())
    print(json.dumps({"workload": args.workload, "precision": args.precision, "toggles": toggles,
                      "build_s": round(built - started, 2), "warm_up_s": round(warmed - built, 2),
                      "graphs": len(graphs), "plans_brought": sum(len(g.brought) for g in graphs),
                      "plans_built_here": sum(len(g.plans) - len(g.brought) for g in graphs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
