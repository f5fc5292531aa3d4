"""On a GPU: cuDNN's runtime-compiled plans built in worker processes (ops/plan_pool.py, plan_workers) come back
as plans that compute, bit for bit, what the same plans built in this process compute."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.ops import autotune, cudnn
from gpuengine.ops.cudnn_batchnorm import batchnorm_forward
from gpuengine.runtime.backend import Backend, gpu_visible

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]


def bound_norm(backend, runtime, shape=(32, 8, 8, 64)):
    """A training batch norm of `shape` on fresh buffers, and its output buffer."""
    xp, channels = backend.xp, shape[-1]
    with backend.activate():
        x = xp.asarray(np.random.default_rng(1).standard_normal(shape, np.float32))
        y = xp.zeros(shape, np.float32)
        vectors = [xp.ones(channels, np.float32), xp.zeros(channels, np.float32), xp.zeros(channels, np.float32),
                   xp.ones(channels, np.float32)]
        stats = [xp.zeros(channels, np.float32), xp.zeros(channels, np.float32)]
        return batchnorm_forward(runtime, "tf32", x, *vectors, y, *stats, 1e-5, 0.1), y


def test_plans_built_by_workers_compute_what_the_same_plans_built_here_do(monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    monkeypatch.setattr(cudnn, "_GRAPHS", {})
    monkeypatch.setattr(cudnn, "PLAN_WORKERS", 2)
    backend = Backend("cuda")
    runtime = cudnn.CudnnRuntime(backend)
    bound, y = bound_norm(backend, runtime)
    graph = bound.graph
    assert graph._coming is not None, "a batch norm's runtime-compiled candidates go to the workers"
    bound.run()   # autotuning brings the workers' plans in first
    backend.synchronize()
    assert graph.brought and set(graph.brought) <= set(graph.plans) and graph.plan in graph.plans
    for index in graph.brought:
        brought = output_of(backend, y, lambda: graph.execute(bound.pointers, runtime.workspace.data.ptr, index,
                                                              runtime.handle))
        graph.graph.build_plan_at_index(index)   # the same plan, built here
        runtime.reserve(int(graph.graph.get_workspace_size_plan_at_index(index)))
        here = output_of(backend, y, lambda: graph.graph.execute_plan_at_index(
            bound.pointers, runtime.workspace.data.ptr, index, handle=runtime.handle))
        np.testing.assert_array_equal(brought, here, err_msg=graph.plan_names[index])


def output_of(backend, y, run) -> np.ndarray:
    """`y` on the host after `run()`."""
    with backend.activate():
        run()
        backend.synchronize()
        return backend.to_host(y).copy()
