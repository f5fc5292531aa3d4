"""Tools around the engine that are not part of a training step.

- `maxbatch`: the largest batch that fits under a memory cap, engine and
  PyTorch references, one fresh process per trial (`trial`), per workload
  (`workloads`); `python -m gpuengine maxbatch mlp --cap-gib 6` prints the table.
"""
