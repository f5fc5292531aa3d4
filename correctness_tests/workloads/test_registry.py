"""workloads/registry.py: every workload's smoke network takes its own data, and bad names are named."""
from __future__ import annotations

import pytest

from gpuengine.bench import dp_worker
from gpuengine.bench.maxbatch.workloads import MAX_BATCH_WORKLOADS
from gpuengine.workloads.registry import WORKLOADS, get_workload


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workloads_smoke_network_takes_its_own_data(name):
    workload = get_workload(name)
    shape = workload.shape("smoke")
    net = workload.build(shape)
    x, t = workload.data(8, shape)
    assert x.shape == (8,) + net.input_shape and t.shape[0] == 8
    assert workload.lr > 0 and workload.shape("seed") is workload.seed_shape


def test_unknown_names_and_shape_kinds_are_named():
    with pytest.raises(ValueError, match="unknown workload 'nope': one of mlp, cnn, resnet, transformer"):
        get_workload("nope")
    with pytest.raises(ValueError, match="shape must be one of seed, smoke, got 'huge'"):
        get_workload("mlp").shape("huge")


def test_the_tools_read_the_registry():
    assert all(w.workload is WORKLOADS[name] for name, w in MAX_BATCH_WORKLOADS.items())
    shape, build, data, lr = dp_worker.workload_parts("cnn", "smoke")
    assert (shape, build, data, lr) == (WORKLOADS["cnn"].smoke_shape, WORKLOADS["cnn"].build, WORKLOADS["cnn"].data,
                                        WORKLOADS["cnn"].lr)
