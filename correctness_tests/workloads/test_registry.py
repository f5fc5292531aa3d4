"""workloads/registry.py: the table is found in the workload modules, each smoke network takes its own data, every
tool reads the table, and bad names are named."""
from __future__ import annotations

import importlib
import sys

import pytest

from gpuengine.bench import dp_worker
from gpuengine.bench.maxbatch.workloads import MAX_BATCH_WORKLOADS
from gpuengine.gate.regression_profiles import PROFILED
from gpuengine.gate.report.sections import WORKLOAD_NAMES
from gpuengine.workloads.registry import ENTRIES, WORKLOADS, discover, get_workload


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


def test_the_table_is_every_workload_module_in_its_order_and_the_family_builds_by_name_elsewhere():
    assert list(ENTRIES) == ["mlp", "cnn", "resnet", "transformer", "zoo"]
    assert list(WORKLOADS) == ["mlp", "cnn", "resnet", "transformer"]   # the zoo's networks go by their own names
    assert ENTRIES["zoo"].members == ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")


def test_the_report_and_the_regression_profiles_read_the_table():
    assert WORKLOAD_NAMES["test_resnet_train"] == "ResNet-50 training (seed 002)"
    assert WORKLOAD_NAMES["test_cnn_train_vs_keras"] == "CNN training vs Keras (seed 001)"
    assert all(WORKLOAD_NAMES[test] == entry.test_title(test) for entry in ENTRIES.values() for test in entry.tests)
    assert {test: entry.name for test, entry in PROFILED.items()} == {
        "test_mlp_train": "mlp", "test_mlp_streamed": "mlp", "test_cnn_train": "cnn", "test_cnn_streamed": "cnn",
        "test_resnet_train": "resnet", "test_transformer_train": "transformer", "test_zoo_train": "zoo"}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_twin_offers_the_tables_training_runner(name):
    pytest.importorskip("torch", reason="the twins are PyTorch's")
    assert callable(importlib.import_module(WORKLOADS[name].twin).twin_train_runner)


TOY = """
from gpuengine.workloads import mlp
from gpuengine.workloads.workload import Workload

WORKLOAD = Workload("{name}", "Toy", None, order={order}, tests={{"test_toy_train": "training"}},
                    profiled=("test_toy_train",), batch=64, smoke_batch=8, twin="gpuengine.reference.torch_mlp",
                    lr=1e-3, build=mlp.build_mlp, data=mlp.mlp_data, seed_shape=mlp.SMOKE_SHAPE,
                    smoke_shape=mlp.SMOKE_SHAPE)
"""


def test_a_new_workload_module_is_an_entry_as_it_is(tmp_path, monkeypatch):
    """A new workload is its module (with its WORKLOAD), its twin, its perf test and its thresholds: the table
    needs no line of its own. Shown on a throwaway package beside this one."""
    package = tmp_path / "toy_workloads"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "toy.py").write_text(TOY.format(name="toy", order=1))
    (package / "helper.py").write_text("VALUE = 1\n")   # no WORKLOAD: not an entry
    (package / "first.py").write_text(TOY.format(name="first", order=0))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        table = discover("toy_workloads")
        assert list(table) == ["first", "toy"]
        assert table["toy"].test_title("test_toy_train") == "Toy training"
        (package / "again.py").write_text(TOY.format(name="toy", order=2))
        with pytest.raises(RuntimeError, match="two workload modules of toy_workloads declare one name"):
            discover("toy_workloads")
    finally:
        for module in [m for m in sys.modules if m.startswith("toy_workloads")]:
            del sys.modules[module]


def test_an_entry_is_a_builder_or_a_family_and_profiles_only_its_own_tests():
    from gpuengine.workloads.workload import Workload
    common = dict(title="T", seed_note=None, tests={"test_t": "training"}, batch=1, smoke_batch=1, twin="m", lr=1.0,
                  order=0)
    with pytest.raises(ValueError, match="a network builder or a family's members, one of the two"):
        Workload("t", profiled=(), **common)
    with pytest.raises(ValueError, match=r"profiled tests \['test_u'\] are not among its tests"):
        Workload("t", profiled=("test_u",), members=("a",), **common)


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet"])
def test_the_twins_of_the_data_parallel_workloads_build_ddps_model_from_the_engines_weights(name):
    torch = pytest.importorskip("torch", reason="the twins are PyTorch's")
    from gpuengine.config import EngineConfig
    from gpuengine.trainer import Trainer
    entry = WORKLOADS[name]
    shape = entry.shape("smoke")
    x, t = entry.data(8, shape)
    params = Trainer(entry.build(shape), x, t, 8, EngineConfig(device="cpu", precision="fp32")).params
    model, loss, channels_last, x_torch = importlib.import_module(entry.twin).twin_ddp_model(
        shape, x, t, params.state_dict(), params.buffers_dict())
    out = model(torch.as_tensor(x_torch[:4], dtype=torch.float32))
    assert tuple(out.shape) == (4, t.shape[1]) and channels_last == (name != "mlp")
    assert torch.isfinite(loss(out, torch.as_tensor(t[:4], dtype=torch.float32)))
