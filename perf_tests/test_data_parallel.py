"""Data-parallel training on every visible GPU (weak scaling), engine vs itself on one GPU and PyTorch DDP.

One worker rank per GPU (gpuengine/bench/dp_group.py, dp_worker.py), driven
from this process: the engine data parallel (`gpuengine`: NCCL all-reduce in
buckets inside the captured step), the engine alone on GPU 0 at the per-GPU
batch (`gpuengine_1gpu`) and PyTorch DDP over NCCL (`torch_ddp`, fused Adam,
whole step captured where DDP allows it) alternate round by round like every
perf test's runners. The per-GPU batch is fixed (MLP 8000, CNN 1024,
ResNet-50 128), so N GPUs do N times the work of one in a step:
`scaling_vs_1gpu` is the engine's N-GPU throughput over its 1-GPU throughput
in the same run (the ratio against `gpuengine_1gpu`), stored in extra_info
beside the ratios against `torch_ddp`. Every side's loss must descend.
The ranks start from the gate's kept plan choices (the single-GPU tests'
graphs of the same per-GPU batch among them) and hand back what they timed.
It needs >= 2 GPUs and skips saying so on one; without a GPU, a smoke case
runs 2 ranks on the NumPy backend over the store all-reduce, DDP over gloo.
"""
from __future__ import annotations

import pytest

from gpuengine.runtime.backend import gpu_visible

from gpuengine.gate import tiers
from gpuengine.gate.harness import assert_losses_descend, skip_unless_selected

pytest.importorskip("torch.distributed", reason="PyTorch (torch.distributed) is not installed: no torch_ddp")
from gpuengine.bench.dp_group import WorkerGroup  # noqa: E402


def visible_gpus() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:   # no cupy or no driver: no GPUs
        return 0


ON_GPU = gpu_visible()
GPUS = visible_gpus()
WORLD = GPUS if ON_GPU else 2
ROUNDS = 5 if ON_GPU else 2
# workload -> (per-GPU batch, steps per global epoch, epochs per round) on GPUs; the CPU smoke is the MLP.
SIZES = {"mlp": (8000, 10, 6), "cnn": (1024, 8, 8), "resnet": (128, 25, 2)} if ON_GPU else {"mlp": (16, 4, 1)}

# (workload, precision): tf32 at 8 steps per graph launch, the engine's best toggles; data resident.
ALL_CASES = [(w, "tf32") for w in ("mlp", "cnn", "resnet")] if ON_GPU else [("mlp", "fp32")]
QUICK = ALL_CASES


def case_id(case):
    workload, precision = case
    return f"{workload}-{precision}-b{SIZES[workload][0]}-{WORLD}gpus"


CASES = tiers.cases("data_parallel_train", ALL_CASES, quick=QUICK, ids=case_id, budget_s=240)


def spec_for(workload: str, precision: str) -> dict:
    batch, steps, epochs = SIZES[workload]
    return dict(workload=workload, shape="seed" if ON_GPU else "smoke", per_gpu_batch=batch, steps_per_epoch=steps,
                epochs_per_round=epochs, precision=precision, cuda_graph=8 if ON_GPU else 0,
                device="cuda" if ON_GPU else "cpu", runners=["gpuengine", "gpuengine_1gpu", "torch_ddp"],
                torch_graph=ON_GPU)


@pytest.mark.parametrize("case", CASES)
def test_data_parallel_train(case, benchmark, compare, run_settings, kept_plan_choices):
    if ON_GPU and GPUS < 2:
        pytest.skip(f"data-parallel training needs >= 2 GPUs; {GPUS} visible (CUDA_VISIBLE_DEVICES="
                    "a list of several, or a machine with several)")
    workload, precision = case
    skip_unless_selected(run_settings, precision=precision, cuda_graph=8 if ON_GPU else 0, resident_data=True)
    env = {"GPUENGINE_DEVICE": "cuda" if ON_GPU else "cpu"}
    plans = kept_plan_choices.in_force() if kept_plan_choices is not None else {}
    with WorkerGroup(WORLD, env) as group:
        runners = group.build({**spec_for(workload, precision), "plans": plans})
        engine, alone, ddp = runners["gpuengine"], runners["gpuengine_1gpu"], runners["torch_ddp"]
        for runner in runners.values():
            runner.prepare()
        first = {r.name: r.epoch_loss() for r in runners.values()}
        comparison = compare(benchmark, engine, [alone, ddp], rounds=ROUNDS, precision=precision)
        last = {r.name: r.epoch_loss() for r in runners.values()}
        if kept_plan_choices is not None:
            kept_plan_choices.adopt(group.tuned_plans())
    benchmark.extra_info.update({
        "world_size": WORLD, "per_gpu_batch": SIZES[workload][0],
        "scaling_vs_1gpu": round(comparison.ratios[alone.name].median, 4),
        "torch_ddp_mode": ddp.notes.get("mode")})
    assert_losses_descend(benchmark, first, last)
