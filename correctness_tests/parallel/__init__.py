"""Tests of gpuengine.parallel and gpuengine.parallel.launch: data-parallel logic on the CPU tier, NCCL on GPUs."""
