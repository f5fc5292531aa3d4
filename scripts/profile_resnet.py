"""Development probe: where ResNet-50's training step spends device time, kernel by kernel, engine vs torch_graph.

Not a gate (perf_tests/test_resnet.py is). Traces a few graph replays of each side with torch.profiler (CUPTI
sees every kernel of the process, CuPy's and cuDNN's included, and the kernels inside CUDA graph replays) and
prints, per side, kernels per step, summed kernel time per step, wall time per step (the gap between them is
launch and dependency latency) and the kernel families that take the time. Run on a GPU machine:
    python scripts/profile_resnet.py [OUT.json] [precision]
"""
from __future__ import annotations

import json
import re
import sys
import time
from collections import defaultdict

import numpy as np

BATCH, STEPS = 128, 8


def family(name: str) -> str:
    """A short kernel family: cuDNN/cutlass/cuBLAS kernel names carry tile sizes that split one family apart."""
    name = re.sub(r"<.*", "", name)            # template arguments
    name = re.sub(r"\(.*", "", name)           # signatures
    name = re.sub(r"_\d+x\d+(x\d+)?", "", name)  # tile shapes
    return name[:90]


def trace(run_step, steps: int, steps_per_call: int = 1) -> dict:
    """Per-step kernel count, kernel time, wall time and top kernel families of `steps` calls of `run_step`
    (each `steps_per_call` training steps: a multi-step graph launch), after one untraced call."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    run_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run_step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    per_family, count, total = defaultdict(float), 0, 0.0
    for event in prof.events():
        if event.device_type.name != "CUDA" or not event.name or "Memcpy" in event.name or "Memset" in event.name:
            continue
        us = event.device_time if hasattr(event, "device_time") else event.cuda_time
        per_family[family(event.name)] += us
        count += 1
        total += us
    top = sorted(per_family.items(), key=lambda kv: -kv[1])[:25]
    steps *= steps_per_call
    return {"kernels_per_step": count / steps, "kernel_ms_per_step": total / steps / 1e3,
            "wall_ms_per_step": wall / steps * 1e3,
            "families_ms_per_step": {k: round(v / steps / 1e3, 4) for k, v in top}}


def main(out: str | None = None, precision: str = "tf32"):
    import torch
    from gpuengine.config import EngineConfig
    from gpuengine.reference.torch_resnet import resnet_train_runner
    from gpuengine.trainer import Trainer
    from gpuengine.workloads import resnet

    x, t = resnet.resnet_data(BATCH * 50, resnet.SEED_SHAPE)
    trainer = Trainer(resnet.build_resnet(), x, t, BATCH, EngineConfig(precision=precision, cuda_graph=1))
    trainer.warm_up()

    def engine_step():
        with trainer.backend.activate():
            trainer._run_graphs(1)   # one replay of the 1-step graph, with the data's epoch bookkeeping

    engine = trace(engine_step, STEPS)
    runner = resnet_train_runner("torch_graph", x, t, BATCH, precision)
    runner.prepare()
    runner.run_round()
    torch.cuda.synchronize()

    def reference_step():
        runner._offset.zero_()   # the captured step reads the permutation at this offset; keep it in range
        runner._graph.replay()

    reference = trace(reference_step, STEPS)
    bns = [layer for layer in trainer.program.layers.values() if type(layer).__name__ == "BatchNorm2D"]
    fallbacks = {"bn_layers": len(bns), "forward_tail_kernel": sum(b._tail is not None for b in bns),
                 "backward_relu_kernel": sum(bool(getattr(b, "_drelu_here", False)) for b in bns)}
    result = {"precision": precision, "bn_fallbacks": fallbacks, "engine": engine, "torch_graph": reference}
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main(*sys.argv[1:])
