"""Energy per training sample of the Transformer at sequence 256, engine vs PyTorch (seed note 004's table).

The note integrated power over a run at sequence 256 and found the engine
spent 23% less energy per sample than PyTorch. The MLP's protocol
(energy_protocol.py: an idle reading first, then windows of the same number
of samples per runner, alternating) at TF32, batch 16, 8 steps per graph
launch; the per-window ratio reference J/sample over engine J/sample is gated
by thresholds.json (the target: engine <= 0.77x torch_graph's J/sample, the
note's 23% less; a ratio >= 1.3). Nightly tier only.
Total and above-idle joules, average power and samples/s of every runner go
to the run's extra_info["energy"].
"""
from __future__ import annotations

import pytest

from gpuengine.bench.energy import measure_idle
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.workloads import transformer

from gpuengine.gate.energy_protocol import IDLE_S, compare_energy, power_probe  # noqa: F401  (power_probe: a fixture)
from gpuengine.gate.harness import record_and_gate, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_transformer  # noqa: E402  (needs torch)
pytestmark = [pytest.mark.gpu, pytest.mark.nightly]   # the quick tier leaves energy to ./gate perf --full

GRAPH_STEPS = 8
REFERENCES = ("torch_graph",)   # what the claim reads; three windows of two sides stay within 30 s


@pytest.mark.parametrize("precision", ["tf32"])
def test_transformer_train_energy(precision, power_probe, benchmark, request, run_settings,
                                  gate_targets):  # noqa: F811
    skip_unless_selected(run_settings, precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True)
    idle = measure_idle(power_probe, IDLE_S)   # first, before anything here has run on the device
    shape = transformer.SEED_SHAPE.with_length(transformer.ENERGY_LENGTH)
    x, t = transformer.transformer_data(transformer.SAMPLES, shape)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True, device="cuda")
    engine = EngineTrainRunner(transformer.build_transformer(shape), x, t, transformer.TRAIN_BATCH, config,
                               epochs_per_round=1, lr=transformer.LEARNING_RATE)
    weights = engine.trainer.params.state_dict()
    refs = [torch_transformer.transformer_train_runner(mode, x, t, transformer.TRAIN_BATCH, precision,
                                                       lr=transformer.LEARNING_RATE, device="cuda", shape=shape,
                                                       weights=weights) for mode in REFERENCES]
    comparison, figures = compare_energy(benchmark, power_probe, idle, engine, refs)
    benchmark.extra_info["energy"] = {"batch": transformer.TRAIN_BATCH, "sequence_length": shape.length} | figures
    record_and_gate(benchmark, comparison, request.node.name, precision, run_settings.tier,
                    targets=gate_targets)
