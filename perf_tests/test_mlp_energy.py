"""Energy per training sample on the dense Rosenbrock MLP, engine vs PyTorch (seed note 004's method).

Seed note 004 integrated 20 Hz power over a run and divided by the samples;
here the shared protocol (energy_protocol.py: NVML's energy counter around
synchronised windows, an idle reading first, runners alternating window by
window with equal samples) compares the engine with torch_graph training
TF32, batch 8000, 4 batches per epoch; nightly tier only. The energy
figures go to the run's extra_info["energy"]; the per-window ratio reference
J/sample over engine J/sample is gated by thresholds.json.
"""
from __future__ import annotations

import pytest

from gpuengine.bench.energy import measure_idle
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.workloads import mlp

from gpuengine.gate.energy_protocol import IDLE_S, compare_energy, power_probe  # noqa: F401  (power_probe: a fixture)
from gpuengine.gate.harness import record_and_gate, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_mlp  # noqa: E402  (needs torch)
pytestmark = [pytest.mark.gpu, pytest.mark.nightly]   # the quick tier leaves energy to ./gate perf --full

PRECISION = "tf32"
BATCH = mlp.TRAIN_BATCH
BATCHES_PER_EPOCH = 4
GRAPH_STEPS = 1        # the engine's default toggles: what the stored H200 run measured
REFERENCES = ("torch_graph",)   # what the claim reads; three windows of two sides stay within 30 s


@pytest.mark.parametrize("precision", [PRECISION])
def test_mlp_train_energy(precision, power_probe, benchmark, request, run_settings,
                           gate_targets):  # noqa: F811
    skip_unless_selected(run_settings, precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True)
    idle = measure_idle(power_probe, IDLE_S)   # first, before anything here has run on the device
    net = mlp.build_mlp()
    x, t = mlp.mlp_data(BATCH * BATCHES_PER_EPOCH)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH_STEPS, resident_data=True, device="cuda")
    engine = EngineTrainRunner(net, x, t, BATCH, config, epochs_per_round=1, lr=mlp.LEARNING_RATE)
    weights = engine.trainer.params.state_dict()
    refs = [torch_mlp.mlp_train_runner(mode, x, t, BATCH, precision, lr=mlp.LEARNING_RATE, device="cuda",
                                       weights=weights) for mode in REFERENCES]
    comparison, figures = compare_energy(benchmark, power_probe, idle, engine, refs)
    benchmark.extra_info["energy"] = {"batch": BATCH, "batches_per_epoch": BATCHES_PER_EPOCH} | figures
    record_and_gate(benchmark, comparison, request.node.name, precision, run_settings.tier,
                    targets=gate_targets)
