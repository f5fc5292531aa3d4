"""On a GPU: which of cuDNN's candidate plans get built. Every precompiled one; of those cuDNN compiles at
run time (the batch norms' knob variants), the first RUNTIME_COMPILED_CANDIDATES in the heuristics' order."""
from __future__ import annotations

import pytest

from gpuengine.config import EngineConfig
from gpuengine.ops import autotune, cudnn
from gpuengine.runtime.backend import gpu_visible
from gpuengine.trainer import Trainer
from gpuengine.workloads import resnet

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]


def test_every_precompiled_candidate_and_the_first_runtime_compiled_ones_are_built(monkeypatch):
    monkeypatch.setattr(autotune, "PLAN_CHOICES", autotune.PlanChoices())
    monkeypatch.setattr(cudnn, "_GRAPHS", {})   # graphs an earlier test of this process built would be reused
    net, x, t = resnet.build_resnet(resnet.SMOKE_SHAPE), *resnet.resnet_data(64, resnet.SMOKE_SHAPE, seed=5)
    Trainer(net, x, t, 16, EngineConfig(precision="tf32", cuda_graph=0)).train(1)
    graphs = list(cudnn.built_graphs().values())
    norms = [graph for graph in graphs if graph.key[0].startswith("batchnorm")]
    assert norms and all(graph.runtime_compiled for graph in norms), "cuDNN's batch norms compile at run time"
    for graph in graphs:
        tried = list(graph.build_ms)
        compiled = [index for index in graph.offered if index in graph.runtime_compiled]
        assert [i for i in tried if i in graph.runtime_compiled] == compiled[:cudnn.RUNTIME_COMPILED_CANDIDATES]
        assert [i for i in tried if i not in graph.runtime_compiled] == \
            [i for i in graph.offered if i not in graph.runtime_compiled]
        assert graph.plan in graph.plans
