"""The PyTorch ResNet-50 v1.5 twin on the CPU: torchvision's names and shapes, the layout maps, weights, training.

Where torchvision imports (the GPU image has it; the CPU machines' torch build
cannot load it), the written-out model is checked against
`torchvision.models.resnet50` itself: the same parameter and buffer names and
shapes in the same order, and the same logits from the same weights.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch references cannot run")

from gpuengine.data.formats.cifar import make_images  # noqa: E402
from gpuengine.data.labels import training_arrays  # noqa: E402
from gpuengine.reference.torch_resnet import (Bottleneck, TorchResNet, buffers_of, build_model, engine_to_torch,
    load_buffers, load_weights, resnet_train_runner, torch_to_engine)
from gpuengine.workloads.resnet import CIFAR100_SHAPE, SEED_SHAPE, SMOKE_SHAPE, parameter_count  # noqa: E402


@pytest.fixture(scope="module")
def smoke_data():
    images, labels = make_images(256, SMOKE_SHAPE.classes, seed=1, size=SMOKE_SHAPE.size)
    return training_arrays(images, labels, SMOKE_SHAPE.classes)


def expected_parameter_names(shape) -> list[str]:
    """torchvision's resnet50 naming, spelled out from its module tree (stem, stages of bottlenecks, fc)."""
    bn = ["weight", "bias"]
    names = ["conv1.weight"] + [f"bn1.{p}" for p in bn]
    for stage, blocks in enumerate(shape.blocks):
        for block in range(blocks):
            unit = f"layer{stage + 1}.{block}"
            for i in (1, 2, 3):
                names += [f"{unit}.conv{i}.weight"] + [f"{unit}.bn{i}.{p}" for p in bn]
            if block == 0:
                names += [f"{unit}.downsample.0.weight"] + [f"{unit}.downsample.1.{p}" for p in bn]
    return names + ["fc.weight", "fc.bias"]


def random_engine_weights(model, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    torch_layout = {n: rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.1
                    for n, p in model.named_parameters()}
    return torch_to_engine(torch_layout)


# -- structure -------------------------------------------------------------------------

@pytest.mark.parametrize("shape, count", [(SEED_SHAPE, 23_528_522), (CIFAR100_SHAPE, 23_712_932),
                                          (SMOKE_SHAPE, parameter_count(SMOKE_SHAPE))],
                         ids=["cifar10", "cifar100", "smoke"])
def test_parameter_count_matches_the_workload(shape, count):
    model = TorchResNet(shape)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(shape) == count
    assert [n for n, _ in model.named_parameters()] == expected_parameter_names(shape)


def test_seed_shape_follows_resnet50_v1_5():
    model = TorchResNet(SEED_SHAPE)
    params = dict(model.named_parameters())
    assert params["conv1.weight"].shape == (64, 3, 7, 7) and params["fc.weight"].shape == (10, 2048)
    assert (model.conv1.stride, model.conv1.padding) == ((2, 2), (3, 3))
    assert (model.maxpool.kernel_size, model.maxpool.stride, model.maxpool.padding) == (3, 2, 1)
    assert [len(getattr(model, f"layer{i}")) for i in (1, 2, 3, 4)] == [3, 4, 6, 3]
    for stage, stride in zip((1, 2, 3, 4), (1, 2, 2, 2)):
        first = getattr(model, f"layer{stage}")[0]
        assert first.conv1.stride == (1, 1) and first.conv2.stride == (stride, stride)   # v1.5: stride on the 3x3
        assert first.downsample[0].stride == (stride, stride) and first.downsample[0].kernel_size == (1, 1)
        assert all(block.downsample is None for block in getattr(model, f"layer{stage}")[1:])
    assert params["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert params["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(convs) == len(norms) == 53 and all(c.bias is None for c in convs)
    assert all((n.eps, n.momentum) == (1e-5, 0.1) for n in norms)


def test_buffers_are_the_running_statistics_of_every_bn():
    model = TorchResNet(SMOKE_SHAPE)
    names = [n for n, _ in model.named_buffers()]
    bn_names = [n[:-len(".weight")] for n, _ in model.named_parameters() if n.endswith(".weight")
                and isinstance(model.get_submodule(n[:-len(".weight")]), torch.nn.BatchNorm2d)]
    assert names == [f"{bn}.{b}" for bn in bn_names for b in ("running_mean", "running_var", "num_batches_tracked")]
    assert list(buffers_of(model)) == [n for n in names if not n.endswith("num_batches_tracked")]


def test_init_is_torchvisions_seeded_and_leaves_the_global_rng_alone():
    before = torch.random.get_rng_state()
    model, same, other = TorchResNet(SMOKE_SHAPE, seed=3), TorchResNet(SMOKE_SHAPE, seed=3), TorchResNet(SMOKE_SHAPE, 4)
    assert torch.equal(before, torch.random.get_rng_state())
    for (name, p), q, r in zip(model.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q), name
        if name.endswith("conv1.weight") or name == "fc.weight":
            assert not torch.equal(p, r), name
    wide = TorchResNet(SEED_SHAPE)   # enough weights per conv to check He normal, fan-out, gain sqrt(2)
    for name in ("layer3.0.conv2.weight", "layer4.0.conv3.weight"):
        w = wide.get_parameter(name)
        fan_out = w.shape[0] * w.shape[2] * w.shape[3]
        assert abs(float(w.detach().std()) / np.sqrt(2.0 / fan_out) - 1) < 0.02, name
    bound = 1 / np.sqrt(2048)
    assert float(wide.fc.weight.abs().max()) <= bound and float(wide.fc.bias.abs().max()) <= bound
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        assert bool((bn.weight == 1).all() and (bn.bias == 0).all())
        assert bool((bn.running_mean == 0).all() and (bn.running_var == 1).all())


# -- the bottleneck block --------------------------------------------------------------

@pytest.mark.parametrize("in_channels, stride, projects", [(16, 1, False), (8, 1, True), (16, 2, True)])
def test_bottleneck_adds_the_shortcut_then_relu(in_channels, stride, projects):
    torch.manual_seed(0)
    block = Bottleneck(in_channels, width=4, stride=stride).eval()
    assert (block.downsample is not None) == projects
    x = torch.randn(2, in_channels, 8, 8)
    y = block(x)
    assert y.shape == (2, 16, 8 // stride, 8 // stride) and bool((y >= 0).all())
    with torch.no_grad():
        block.bn3.weight.zero_()   # the residual branch now adds exactly zero: the block is relu(shortcut)
        shortcut = x if block.downsample is None else block.downsample(x)
        torch.testing.assert_close(block(x), torch.relu(shortcut), rtol=0, atol=0)


def test_bottleneck_backward_reaches_every_parameter_and_the_input():
    torch.manual_seed(1)
    block = Bottleneck(8, width=4, stride=2).train()
    x = torch.randn(4, 8, 6, 6, requires_grad=True)
    (block(x) ** 2).mean().backward()
    for name, p in block.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().sum()) > 0, name
    assert x.grad.shape == x.shape and float(x.grad.abs().sum()) > 0


# -- layouts, weights and buffers ------------------------------------------------------

def test_layout_maps_round_trip_and_transpose_only_conv_filters():
    model = TorchResNet(SMOKE_SHAPE)
    engine = random_engine_weights(model)
    assert engine["conv1.weight"].shape == (8, 7, 7, 3)   # KRSC
    assert engine["fc.weight"].shape == (10, 64) and engine["bn1.weight"].shape == (8,)
    torch_layout = engine_to_torch(engine)
    k, r, s, c = 5, 1, 2, 2
    assert torch_layout["conv1.weight"][k, c, r, s] == engine["conv1.weight"][k, r, s, c]
    back = torch_to_engine({n: torch.from_numpy(v) for n, v in torch_layout.items()})   # tensors in
    for name, value in engine.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)
    back["fc.bias"][0] += 1   # the maps hand out copies, never views of their input
    assert back["fc.bias"][0] != engine["fc.bias"][0]


def test_load_weights_sets_every_parameter():
    model = TorchResNet(SMOKE_SHAPE)
    engine = random_engine_weights(model, seed=2)
    load_weights(model, engine)
    loaded = torch_to_engine(dict(model.named_parameters()))
    for name, value in engine.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    rebuilt = build_model(SMOKE_SHAPE, engine, seed=9)
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(rebuilt.eval()(x), model.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("spoil, error, message", [
    (lambda w: w.pop("layer2.0.downsample.1.bias"), KeyError, "missing: layer2.0.downsample.1.bias; unknown: none"),
    (lambda w: w.update({"layer3.0.conv1.weight": np.zeros((4, 1, 1, 32), np.float32)}), KeyError,
     "missing: none; unknown: layer3.0.conv1.weight"),
    (lambda w: w.update({"layer1.0.conv2.weight": w["layer1.0.conv2.weight"].transpose(0, 3, 1, 2)}), ValueError,
     r"layer1.0.conv2.weight: expected engine shape \(8, 3, 3, 8\), got \(8, 8, 3, 3\)"),
    (lambda w: w.update({"fc.weight": w["fc.weight"].T}), ValueError,
     r"fc.weight: expected engine shape \(10, 64\), got \(64, 10\)"),
])
def test_bad_weights_are_named_and_nothing_is_loaded(spoil, error, message):
    model = TorchResNet(SMOKE_SHAPE)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = random_engine_weights(model, seed=3)
    spoil(weights)
    with pytest.raises(error, match=message):
        load_weights(model, weights)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), f"{name} was written by a refused load"


def test_buffers_round_trip_and_num_batches_tracked_is_ignored():
    source = TorchResNet(SMOKE_SHAPE).train()
    source(torch.randn(8, 3, 16, 16))   # one training forward moves every running statistic
    stats = buffers_of(source)
    assert all(v.dtype == np.float32 for v in stats.values())
    assert not np.array_equal(stats["layer2.0.bn3.running_var"], np.ones(32, np.float32))
    target = TorchResNet(SMOKE_SHAPE)
    load_buffers(target, stats)
    for name, value in buffers_of(target).items():
        np.testing.assert_array_equal(value, stats[name], err_msg=name)
    load_buffers(target, dict(source.named_buffers()))   # torch's own, num_batches_tracked included
    load_buffers(target, {**stats, "bn1.num_batches_tracked": np.int64(7)})
    assert int(target.bn1.num_batches_tracked) == 0   # ignored, not loaded


def test_bad_buffers_are_named_and_nothing_is_loaded():
    model = TorchResNet(SMOKE_SHAPE)
    stats = {k: v + 1 for k, v in buffers_of(model).items()}
    with pytest.raises(KeyError, match="missing: bn1.running_var; unknown: none"):
        load_buffers(model, {k: v for k, v in stats.items() if k != "bn1.running_var"})
    with pytest.raises(ValueError, match=r"layer1.1.bn2.running_mean: expected engine shape \(8,\), got \(5,\)"):
        load_buffers(model, {**stats, "layer1.1.bn2.running_mean": np.zeros(5, np.float32)})
    assert all(bool((b == 0).all()) for n, b in model.named_buffers() if n.endswith("running_mean"))


# -- the training runner ---------------------------------------------------------------

def test_eager_runner_trains_the_smoke_resnet(smoke_data):
    x, t = smoke_data
    runner = resnet_train_runner("torch_eager", x, t, 32, "fp32", device="cpu", shape=SMOKE_SHAPE)
    assert runner.channels_last is False and runner.parameter_count() == parameter_count(SMOKE_SHAPE)
    assert runner.steps_per_epoch == 8
    runner.prepare()
    losses = []
    for _ in range(4):
        runner.run_round()
        losses.append(runner.last_epoch_loss())
    assert all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.1, losses


def test_runner_starts_from_the_weights_and_buffers_given(smoke_data):
    """Warm-up steps are undone: the first timed epoch starts from exactly what was loaded."""
    x, t = smoke_data
    source = TorchResNet(SMOKE_SHAPE).train()
    source(torch.randn(8, 3, 16, 16))
    weights, stats = random_engine_weights(source, seed=4), buffers_of(source)
    runner = resnet_train_runner("torch_eager", x, t, 32, "fp32", device="cpu", shape=SMOKE_SHAPE,
                                 weights=weights, buffers=stats)
    runner.prepare()
    for name, value in torch_to_engine(dict(runner.model.named_parameters())).items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    for name, value in buffers_of(runner.model).items():
        np.testing.assert_array_equal(value, stats[name], err_msg=name)


def test_channels_last_default_follows_the_mode(smoke_data):
    x, t = smoke_data
    def runner(mode, **options):
        return resnet_train_runner(mode, x, t, 32, "fp32", device="cpu", shape=SMOKE_SHAPE, **options)
    assert runner("torch_eager").channels_last is False
    compiled = runner("torch_compile", compile_backend="aot_eager")   # compiles lazily: nothing runs here
    assert compiled.channels_last is True
    assert compiled.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert runner("torch_compile", channels_last=False).channels_last is False
    assert runner("torch_eager", channels_last=True).channels_last is True


def test_runner_refuses_data_of_another_shape(smoke_data):
    x, t = smoke_data
    with pytest.raises(ValueError, match=r"x must be \(n,\) \+ \(16, 16, 3\) and t \(n, 10\)"):
        resnet_train_runner("torch_eager", x[:, :8], t, 32, "fp32", device="cpu", shape=SMOKE_SHAPE)
    with pytest.raises(ValueError, match="t \\(n, 100\\)"):
        resnet_train_runner("torch_eager", x, t, 32, "fp32", device="cpu", shape=SMOKE_SHAPE.with_classes(100))


# -- against torchvision itself --------------------------------------------------------

@pytest.fixture(scope="module")
def torchvision_models():
    try:
        import torchvision
    except Exception as exc:   # absent, or built for another torch (the CPU machines' case)
        pytest.skip(f"torchvision does not import here ({type(exc).__name__}: {exc}); "
                    "the architecture check runs where it does (the GPU image)")
    return torchvision.models


@pytest.mark.parametrize("shape", [SEED_SHAPE, CIFAR100_SHAPE], ids=["cifar10", "cifar100"])
def test_same_module_tree_and_logits_as_torchvision_resnet50(torchvision_models, shape):
    theirs = torchvision_models.resnet50(num_classes=shape.classes)
    ours = TorchResNet(shape, seed=5)
    for kind in ("named_parameters", "named_buffers"):
        assert [(n, tuple(v.shape)) for n, v in getattr(ours, kind)()] == \
               [(n, tuple(v.shape)) for n, v in getattr(theirs, kind)()], kind
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for train in (False, True):   # eval: running statistics; train: batch statistics
        ours.train(train)
        theirs.train(train)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    for name, value in theirs.state_dict().items():   # the train-mode pass moved both sides' statistics alike
        torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)


# -- on a GPU --------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
@pytest.mark.parametrize("mode", ["torch_graph", "torch_compile"])
def test_gpu_modes_track_eager(smoke_data, mode):
    """The captured whole step and the compiled loop (channels-last) train like the plain loop (NCHW)."""
    x, t = smoke_data
    runs = {}
    for m in (mode, "torch_eager"):
        runner = resnet_train_runner(m, x, t, 32, "fp32", device="cuda", shape=SMOKE_SHAPE, seed=2)
        runner.prepare()
        runs[m] = []
        for _ in range(3):
            runner.run_round()
            runs[m].append(runner.last_epoch_loss())
    assert runs[mode][-1] < runs[mode][0]
    np.testing.assert_allclose(runs[mode], runs["torch_eager"], rtol=1e-3)
