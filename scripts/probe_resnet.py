"""Development probe: ResNet-50 (CIFAR, batch 128) engine step time against torchvision's model in PyTorch.

Not a gate (perf_tests/test_resnet.py is): it prints, for a few engine toggles, samples/s over timed epochs
and the eager step's per-phase device times, next to torchvision's resnet50 trained as a whole-step CUDA
graph in channels-last (torch_graph) on the same random data. Run on a GPU machine:
    python scripts/probe_resnet.py [samples]
"""
from __future__ import annotations

import sys
import time

import numpy as np

from gpuengine.bench.benchmarking import interleave, samples_per_second
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet


def layer_times(trainer, steps: int = 20) -> dict[str, float]:
    """Median device ms per (layer type, pass) of an eager step, summed over the network's nodes."""
    import statistics
    from collections import defaultdict
    program, timer = trainer.program, trainer.backend.timer()
    samples = defaultdict(list)
    with trainer.backend.activate():
        for _ in range(steps):
            per = defaultdict(float)
            for node in program.nodes:
                timer.start()
                program.layers[node.name].forward()
                per[(type(program.layers[node.name]).__name__, "fwd")] += timer.stop()
            timer.start()
            program.loss.forward_backward()
            per[("loss", "fwd+bwd")] += timer.stop()
            for summed, layer, _ in program._backward:
                timer.start()
                if summed is not None:
                    summed.run()
                layer.backward()
                per[(type(layer).__name__, "bwd")] += timer.stop()
                timer.start()
                layer.backward_params()
                per[(type(layer).__name__, "bwd params")] += timer.stop()
            for key, value in per.items():
                samples[key].append(value)
    return {f"{k[0]} {k[1]}": statistics.median(v) for k, v in samples.items()}


def main(samples: int = 128 * 40):
    import torch
    import torchvision
    from gpuengine.reference.torch_common import TorchTrainRunner

    rng = np.random.default_rng(0)
    x = rng.random((samples, 32, 32, 3), dtype=np.float32)
    t = np.eye(10, dtype=np.float32)[rng.integers(0, 10, samples)]
    nchw = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    net = resnet.build_resnet()
    print(f"ResNet-50: {net.parameter_count():,} parameters, {len(net.nodes)} nodes, "
          f"{net.train_flops_per_sample() / 1e6:.1f} MFLOP per training sample")
    from gpuengine.ops import cudnn as cudnn_graphs
    for precision, plans in (("tf32", 8), ("bf16", 8), ("tf32", 24)):
        if plans != cudnn_graphs.MAX_PLANS:   # rebuild every graph with more candidate plans to time
            cudnn_graphs.MAX_PLANS = plans
            cudnn_graphs._GRAPHS.clear()
        start = time.perf_counter()
        trainer = Trainer(net, x, t, 128, EngineConfig(precision=precision, cuda_graph=0, profile=1))
        trainer.train(1)
        print(f"{precision} plans {plans}: build + first epoch {time.perf_counter() - start:.1f} s;"
              " eager phases (ms) " + ", ".join(f"{k} {v:.3f}" for k, v in trainer.last_profile.items()))
        if plans == 8:
            print("  per layer type (ms, eager, each launch timed): " + ", ".join(
                f"{k} {v:.3f}" for k, v in sorted(layer_times(trainer).items(), key=lambda kv: -kv[1])))
        runners = []
        for graph in (1, 8):
            runner = EngineTrainRunner(net, x, t, 128, EngineConfig(precision=precision, cuda_graph=graph))
            runner.name = f"gpuengine-graph{graph}"
            runners.append(runner)
        model = torchvision.models.resnet50(num_classes=10)
        runners.append(TorchTrainRunner("torch_graph", model, torch.nn.functional.cross_entropy, nchw, t, 128,
                                        precision, device="cuda", channels_last=True))
        times = interleave(runners, rounds=5)
        for r in runners:
            print(f"  {r.name:18s} {samples_per_second(times[r.name], r.samples_per_round):10.0f} samples/s")

if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
