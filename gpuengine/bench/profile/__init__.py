"""`python -m gpuengine profile WORKLOAD`: one captured training step per kernel, by op family, engine vs PyTorch.

- `families`: kernel names to op families (conv fprop/dgrad/wgrad, norm, GEMM, attention, ...), one table;
- `capture`: torch.profiler's device events over a few replays of a round, and their per-step medians;
- `workloads`: the engine's and the references' runners per workload, as the perf tests build them;
- `session`: the runners profiled one after another, from the engine's weights and the gate's cuDNN plans;
- `record`: the JSON under baselines_store/<gpu>/profiles/, reading it back, the family table;
- `cli`: the command, its checks and exit status.
"""
