"""Development probe: the Transformer's training step, engine vs torch_graph, and where the engine's time goes.

Not a gate (perf_tests/test_transformer.py is). For each sequence length given, times 3 interleaved rounds
(one epoch each) of the engine (TF32, 8 steps per graph launch) and torch_graph, and prints samples/s and their
ratio; for the longest length it also traces one graph launch of each side with torch.profiler and prints the
kernel families that take the time. Run on a GPU machine:
    python scripts/probe_transformer.py OUT.json [lengths...]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from profile_resnet import trace


def rate(runner) -> float:
    runner.synchronize()
    start = time.perf_counter()
    runner.run_round()
    runner.synchronize()
    return runner.samples_per_round / (time.perf_counter() - start)


def main(out: str, *lengths: str):
    from gpuengine.bench.runners import EngineTrainRunner
    from gpuengine.config import EngineConfig
    from gpuengine.reference import torch_transformer
    from gpuengine.workloads import transformer

    result = {}
    lengths = [int(n) for n in lengths] or [64, 384]
    for length in lengths:
        shape = transformer.SEED_SHAPE.with_length(length)
        x, t = transformer.transformer_data(transformer.SAMPLES, shape)
        config = EngineConfig(precision="tf32", cuda_graph=8, resident_data=True, device="cuda")
        engine = EngineTrainRunner(transformer.build_transformer(shape), x, t, transformer.TRAIN_BATCH, config,
                                   lr=transformer.LEARNING_RATE)
        ref = torch_transformer.transformer_train_runner("torch_graph", x, t, transformer.TRAIN_BATCH, "tf32",
                                                         shape=shape, weights=engine.trainer.params.state_dict())
        for r in (engine, ref):
            r.prepare()
            r.run_round()
        rates = {"engine": [], "torch_graph": []}
        for _ in range(3):
            rates["engine"].append(rate(engine))
            rates["torch_graph"].append(rate(ref))
        entry = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        entry["ratio"] = round(entry["engine"] / entry["torch_graph"], 3)
        if length == max(lengths):
            trainer = engine.trainer

            def engine_launch():
                with trainer.backend.activate():
                    trainer._run_graphs(8)

            def reference_steps():
                for _ in range(8):
                    ref._offset.zero_()
                    ref._graph.replay()

            entry["engine_profile"] = trace(engine_launch, 1, steps_per_call=8)
            entry["torch_graph_profile"] = trace(reference_steps, 1, steps_per_call=8)
        result[length] = entry
        print(length, json.dumps(entry, indent=1), flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
