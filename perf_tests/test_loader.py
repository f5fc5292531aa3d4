"""The streamed data path: against the copy engine, and streamed training against its bounds.

- `test_loader_bandwidth`: the loader alone (the device gathering random rows
  of the pinned host data set into the step's buffers; no training) against
  `pinned_h2d`, pinned copies of the same batch size timed alike, for 4 KB rows
  (the MLP's) and 150 KB rows (a 224x224x3 uint8 image's bytes). Both rounds
  count bytes, so the ratio is the loader's fraction of the machine's pinned
  host-to-device bandwidth (target >= 0.8). The large-copy bandwidth from
  device events (`measure_pinned_h2d_gbps`) and each side's GB/s are stored.
- `test_mlp_streamed`: seed note 000's MLP at batch 8000 streamed from host
  memory, against `copy_bound` (pinned copies of the round's bytes: the
  bandwidth / bytes-per-sample bound, target >= 0.8), `torch_dataloader`
  (DataLoader with pinned memory and worker processes, target >= 3) and the
  engine on resident data (reported).
- `test_cnn_streamed`: seed note 001's CNN streamed against the engine on
  resident data (target >= 0.95: the copy hides under compute).
Every training side must also show its loss descending. On a machine without
a GPU the same tests run tiny shapes on the NumPy backend: a smoke test of the
harness, never a timing gate.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from gpuengine.bench.loader import GB, LoaderRunner, PinnedCopyRunner, measure_pinned_h2d_gbps
from gpuengine.bench.runners import EngineTrainRunner
from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import get_backend, gpu_visible
from gpuengine.workloads import cnn, mlp

from gpuengine.gate import tiers
from gpuengine.gate.harness import assert_losses_descend, epoch_loss, sides, skip_unless_selected

pytest.importorskip("torch", reason="PyTorch is not installed: no reference")
from gpuengine.reference import torch_mlp  # noqa: E402  (needs torch)

ON_GPU = gpu_visible()
DEVICE = "cuda" if ON_GPU else "cpu"
WORKERS = min(8, os.cpu_count() or 1) if ON_GPU else 2    # torch DataLoader's worker processes
ROUNDS = 7 if ON_GPU else 2
MLP_SHAPE = mlp.SEED_SHAPE if ON_GPU else mlp.SMOKE_SHAPE
MLP_BATCH = mlp.TRAIN_BATCH if ON_GPU else 256
MLP_BATCHES_PER_EPOCH = 12
STEPS_PER_ROUND = 48 if ON_GPU else 4


def streamed_config(precision: str, graph: int, pool: int = 2, resident: bool = False) -> EngineConfig:
    return EngineConfig(precision=precision, cuda_graph=graph, resident_data=resident, batch_pool=pool,
                        device=DEVICE)


def gbps(comparison, name: str, bytes_per_sample: float) -> float:
    return round(comparison.throughput(name) * bytes_per_sample / GB, 3)


IMAGE_FEATURES = 224 * 224 * 3 // 4    # float32 rows of a 224x224x3 uint8 image's 150,528 bytes
# (precision, features per row, batch, batch_pool)
if ON_GPU:
    LOADER = [("tf32", MLP_SHAPE.inputs, MLP_BATCH, 2), ("tf32", IMAGE_FEATURES, 64, 2),
              ("bf16", MLP_SHAPE.inputs, MLP_BATCH, 2), ("tf32", MLP_SHAPE.inputs, MLP_BATCH, 1)]
else:
    LOADER = [("fp32", MLP_SHAPE.inputs, MLP_BATCH, 2), ("fp32", 96, 16, 1)]
LOADER_CASES = tiers.cases("loader_bandwidth", LOADER, quick=LOADER[:2], budget_s=10,
                          ids=lambda c: f"{c[0]}-{c[1] * 4 // 1000}kB-b{c[2]}-pool{c[3]}")


def loader_data(case):
    precision, features, batch, pool = case
    return mlp.mlp_data(batch * MLP_BATCHES_PER_EPOCH, mlp.MLPShape(inputs=features, hidden=MLP_SHAPE.hidden))


def loader_runner(case) -> LoaderRunner:
    precision, features, batch, pool = case
    return LoaderRunner(*loader_data(case), batch, streamed_config(precision, 1, pool), STEPS_PER_ROUND)


@pytest.mark.parametrize("case", LOADER_CASES)
def test_loader_bandwidth(case, benchmark, compare, run_settings, engine_for):
    precision, features, batch, pool = case
    skip_unless_selected(run_settings, precision=precision, batch_pool=pool)
    x, t = loader_data(case)
    loader = engine_for(case)
    backend = get_backend(streamed_config(precision, 1, pool))
    pinned = PinnedCopyRunner(backend, loader.bytes_per_step(), STEPS_PER_ROUND)
    comparison = compare(benchmark, loader, [pinned], rounds=ROUNDS, precision=precision)
    large = measure_pinned_h2d_gbps(backend)
    benchmark.extra_info["loader"] = {
        "bytes_per_step": loader.bytes_per_step(), "row_bytes": loader.bytes_per_step() // batch,
        "batch_pool": pool,
        "loader_gbps": gbps(comparison, loader.name, 1), "pinned_h2d_gbps": gbps(comparison, pinned.name, 1),
        "pinned_h2d_gbps_device_events": pinned.last_round_gbps(), "pinned_h2d_gbps_1GiB": large}
    for side in sides(loader):
        bx, bt, rows = side.delivered()
        np.testing.assert_array_equal(bt, t[rows])       # the timed batches were the right ones
        np.testing.assert_array_equal(bx.astype(np.float32), x[rows].astype(bx.dtype).astype(np.float32))


# (precision, cuda_graph, batch_pool)
MLP = [("tf32", 1, 2), ("tf32", 8, 2), ("bf16", 8, 2), ("tf32", 8, 1)] if ON_GPU else [("fp32", 2, 2), ("fp32", 2, 1)]
# Quick tier: the default toggles (graph1); 8 steps per launch streamed is test_mlp_train's quick case too.
MLP_CASES = tiers.cases("mlp_streamed", MLP, quick=MLP[:1], ids=lambda c: f"{c[0]}-graph{c[1]}-pool{c[2]}-b{MLP_BATCH}",
                       budget_s=30)


def mlp_epochs() -> int:
    return max(1, STEPS_PER_ROUND // MLP_BATCHES_PER_EPOCH)


def mlp_engine(case) -> EngineTrainRunner:
    precision, graph, pool = case
    x, t = mlp.mlp_data(MLP_BATCH * MLP_BATCHES_PER_EPOCH, MLP_SHAPE)
    return EngineTrainRunner(mlp.build_mlp(MLP_SHAPE), x, t, MLP_BATCH, streamed_config(precision, graph, pool),
                             mlp_epochs(), lr=mlp.LEARNING_RATE)


@pytest.mark.parametrize("case", MLP_CASES)
def test_mlp_streamed(case, benchmark, compare, run_settings, engine_for, references):
    precision, graph, pool = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=graph, batch_pool=pool)
    net = mlp.build_mlp(MLP_SHAPE)
    x, t = mlp.mlp_data(MLP_BATCH * MLP_BATCHES_PER_EPOCH, MLP_SHAPE)
    engine = engine_for(case)
    weights, bytes_per_step = engine.state_dict(), engine.bytes_per_step()
    bound = PinnedCopyRunner(get_backend(streamed_config(precision, graph, pool)), bytes_per_step,
                             engine.samples_per_round // MLP_BATCH, name="copy_bound",
                             samples_per_round=engine.samples_per_round)
    dataloader = torch_mlp.mlp_dataloader_runner(x, t, MLP_BATCH, precision, lr=mlp.LEARNING_RATE, device=DEVICE,
                                                 weights=weights, workers=WORKERS, epochs_per_round=mlp_epochs())
    refs = [bound, dataloader]
    if references(["gpuengine_resident"]):   # same seed, so the same initial weights as the streamed engine
        resident = EngineTrainRunner(mlp.build_mlp(MLP_SHAPE), x, t, MLP_BATCH,
                                     streamed_config(precision, 8, resident=True), mlp_epochs(),
                                     lr=mlp.LEARNING_RATE)
        resident.name = "gpuengine_resident"
        refs.append(resident)
    trainers = [*sides(engine), *refs[1:]]
    for runner in [engine, *refs[1:]]:
        runner.prepare()
    first = {r.name: epoch_loss(r) for r in trainers}
    comparison = compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision,
                         flops_per_sample=net.train_flops_per_sample())
    last = {r.name: epoch_loss(r) for r in trainers}
    bytes_per_sample = bytes_per_step / MLP_BATCH
    benchmark.extra_info["loader"] = {
        "bytes_per_sample": bytes_per_sample, "dataloader_workers": WORKERS, "batch_pool": pool,
        "bound_samples_per_s": round(comparison.throughput(bound.name), 1),
        "copy_bound_gbps": gbps(comparison, bound.name, bytes_per_sample),
        "streamed_gbps": {r.name: gbps(comparison, r.name, bytes_per_sample) for r in (engine, dataloader)}}
    dataloader.close()
    assert_losses_descend(benchmark, first, last)


# (precision, cuda_graph, batch_pool, batch)
CNN = [("tf32", 8, 2, 1024), ("tf32", 1, 2, 128), ("bf16", 8, 2, 1024)] if ON_GPU else [("fp32", 1, 2, 128)]
CNN_SHAPE = cnn.SEED_SHAPE if ON_GPU else cnn.SMOKE_SHAPE
CNN_SAMPLES = cnn.SAMPLES if ON_GPU else 512
CNN_CASES = tiers.cases("cnn_streamed", CNN, quick=CNN[:1], ids=lambda c: f"{c[0]}-graph{c[1]}-pool{c[2]}-b{c[3]}",
                       budget_s=30)


def cnn_epochs(batch: int) -> int:
    return max(1, (75 if ON_GPU else 4) // (CNN_SAMPLES // batch))


def cnn_engine(case) -> EngineTrainRunner:
    precision, graph, pool, batch = case
    x, t = cnn.cnn_data(CNN_SAMPLES, CNN_SHAPE)
    return EngineTrainRunner(cnn.build_cnn(CNN_SHAPE), x, t, batch, streamed_config(precision, graph, pool),
                             cnn_epochs(batch), lr=cnn.LEARNING_RATE)


ENGINES = tiers.recipes(test_loader_bandwidth=(LOADER_CASES, loader_runner), test_mlp_streamed=(MLP_CASES, mlp_engine),
                       test_cnn_streamed=(CNN_CASES, cnn_engine))


@pytest.mark.parametrize("case", CNN_CASES)
def test_cnn_streamed(case, benchmark, compare, run_settings, engine_for, references):
    precision, graph, pool, batch = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=graph, batch_pool=pool)
    engine = engine_for(case)
    refs = []
    if references(["gpuengine_resident"]):   # same seed, so the same initial weights as the streamed engine
        x, t = cnn.cnn_data(CNN_SAMPLES, CNN_SHAPE)
        resident = EngineTrainRunner(cnn.build_cnn(CNN_SHAPE), x, t, batch,
                                     streamed_config(precision, graph, resident=True), cnn_epochs(batch),
                                     lr=cnn.LEARNING_RATE)
        resident.name = "gpuengine_resident"
        refs.append(resident)
    for runner in [engine, *refs]:
        runner.prepare()
    trainers = [*sides(engine), *refs]
    first = {r.name: epoch_loss(r) for r in trainers}
    comparison = compare(benchmark, engine, refs, rounds=ROUNDS, precision=precision,
                         flops_per_sample=cnn.build_cnn(CNN_SHAPE).train_flops_per_sample())
    last = {r.name: epoch_loss(r) for r in trainers}
    bytes_per_sample = engine.bytes_per_step() / batch
    benchmark.extra_info["loader"] = {"bytes_per_sample": bytes_per_sample, "batch_pool": pool,
                                      "streamed_gbps": gbps(comparison, engine.name, bytes_per_sample)}
    assert_losses_descend(benchmark, first, last)
