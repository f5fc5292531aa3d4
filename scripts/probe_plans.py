"""Development probe: how much ResNet-50's step time depends on the cuDNN plans autotuning keeps.

Runs of the same ResNet-50 (TF32, batch 128, 8 steps per graph launch) measured 34.5k to 45k samples/s on
H100s while torch_graph stayed at 34k. Each trial here is a fresh process: it builds the trainer (autotuning
every cuDNN graph), times 3 epochs of graph replays, and writes every graph's candidate plan times and the
plan it kept. The summary lists the trials' throughputs and the graphs whose kept plan differed between
trials, with the time each plan measured, so the plans that matter can be pinned down. Run on a GPU machine:
    python scripts/probe_plans.py OUTDIR [trials]
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def trial(out: Path):
    from gpuengine.config import EngineConfig
    from gpuengine.ops import cudnn as cudnn_graphs
    from gpuengine.trainer import Trainer
    from gpuengine.workloads import resnet

    x, t = resnet.resnet_data(128 * 50, resnet.SEED_SHAPE)
    trainer = Trainer(resnet.build_resnet(), x, t, 128, EngineConfig(precision="tf32", cuda_graph=8))
    trainer.warm_up()
    trainer.run_epochs(1)
    trainer.synchronize()
    start = time.perf_counter()
    trainer.run_epochs(3)
    trainer.synchronize()
    rate = 3 * trainer.steps_per_epoch * 128 / (time.perf_counter() - start)
    graphs = {repr(g.key): {"plan": g.plan, "times_ms": g.plan_times_ms} for g in cudnn_graphs._GRAPHS.values()}
    out.write_text(json.dumps({"samples_per_s": rate, "graphs": graphs}))


def main(outdir: str, trials: int = 3):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for k in range(trials):
        path = out / f"plans_{k}.json"
        subprocess.run([sys.executable, __file__, "--trial", str(path)], check=True)
        results.append(json.loads(path.read_text()))
        print(f"trial {k}: {results[-1]['samples_per_s']:.0f} samples/s", flush=True)
    keys = results[0]["graphs"].keys()
    differing = [key for key in keys if len({r["graphs"][key]["plan"] for r in results}) > 1]
    print(f"{len(differing)} of {len(keys)} graphs kept different plans across trials")
    costs = []
    for key in differing:
        kept = [r["graphs"][key]["plan"] for r in results]
        times = [r["graphs"][key]["times_ms"] for r in results]
        spread = max(times[0].values()) / min(times[0].values())
        costs.append((spread, key, kept, times[0]))
    for spread, key, kept, times in sorted(costs, reverse=True)[:25]:
        print(f"{spread:5.2f}x  kept {kept}  {key[:150]}  {np.round(sorted(times.values()), 4).tolist()}")


if __name__ == "__main__":
    if sys.argv[1] == "--trial":
        trial(Path(sys.argv[2]))
    else:
        main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
