"""Benchmark support, above the engine and the references: what the perf suite measures with.

- `benchmarking`: runners timed in interleaved rounds, per-round ratios, fraction of peak;
- `runners`: the engine as runners (training epochs, resident and one-shot inference);
- `thresholds`: the same-run ratio rules of `baselines_store/thresholds.json`, each a claim, a target or exempt;
- `machine_info`: the run's tier and the GPU stack stored with every run;
- `cudnn_plans`: the engine's autotuned cuDNN plans, kept with a GPU kind's baselines;
- `stack_lock`: the tier's locked stack a run measures, and how this Python differs from it (the gate's
  check of it and the wheels a machine without a registry lacks: gpuengine/gate/stack/cli.py);
- `energy`, `gpu_memory`, `nvml`: energy per sample and device memory, read through NVML;
- `maxbatch/`: the largest batch under a memory cap, one fresh process per trial;
- `profile/`: one training step's kernels by op family, the engine beside PyTorch (CUPTI via torch.profiler);
- `report/`: the HTML report, figures and README tables built from the stored runs, and what their newest
  measurements say of each threshold rule (`report/claims.py`: a claim must have held).
"""
