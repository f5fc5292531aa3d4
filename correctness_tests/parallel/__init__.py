"""Tests of gpuengine.parallel and gpuengine.launch: data-parallel logic on the CPU tier, NCCL on GPUs."""
