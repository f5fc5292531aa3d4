"""The reduced zoo networks on the CPU against their hand-written PyTorch twins, float32, same weights.

reference/torch_zoo.py writes AlexNet, VGG-16 and MobileNetV2 out with
torchvision's structure and names (the ResNets come from torch_resnet.py);
the engine's graphs use the same names, so the weights load by name (filters
KRSC <-> OIHW, the flattened dense layer's columns (h, w, c) <-> (c, h, w)).
Same weights give the same logits in inference (BN on running statistics,
dropout off), and one training step with dropout left out gives the same loss,
gradients (to float64 rounding in float64) and running statistics. On a GPU the
full-size networks are checked against torchvision itself (test_gpu_zoo.py).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.inference import Predictor  # noqa: E402
from gpuengine.reference import torch_resnet, torch_zoo  # noqa: E402
from gpuengine.reference.torch_common import to_nchw  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads import zoo  # noqa: E402

from ..layer_harness import run_network  # noqa: E402
from ..torch_compare import assert_matches_torch, first_step, fixed_torch_threads  # noqa: E402,F401

SAMPLES, BATCH = 16, 8
RTOL, ATOL = 2e-4, 2e-5   # up to 53 layers of float32 sums in different orders


def config() -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0)


def data(name: str, seed: int):
    shape = zoo.zoo_net(name).reduced
    return zoo.zoo_data(SAMPLES, shape.size, shape.classes, seed)


def twin(name: str, net, weights, buffers):
    model = torch_zoo.twin_model(name, zoo.zoo_net(name).reduced)
    return torch_zoo.disable_dropout(torch_zoo.load_engine_state(model, net, weights, buffers))


@pytest.mark.parametrize("name", zoo.NAMES)
def test_logits_match_torch_eval_mode(name):
    net = zoo.zoo_net(name).network(reduced=True)
    predictor = Predictor(net, config(), seed=2)
    rng = np.random.default_rng(1)
    buffers = {k: (rng.random(v.shape) + 0.5 if k.endswith("var") else rng.standard_normal(v.shape) * 0.1)
               for k, v in predictor.params.buffers_dict().items()}
    if buffers:
        predictor.params.load_buffers(buffers)
    x, _ = data(name, 3)
    model = twin(name, net, predictor.params.state_dict(), predictor.params.buffers_dict()).eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(to_nchw(x[:4])))
    assert_matches_torch({"logits": predictor.predict(x[:4])}, {"logits": expected}, rtol=RTOL, atol=ATOL,
                         what=f"{name} predict")


@pytest.mark.parametrize("name", zoo.NAMES)
def test_one_step_gradients_match_torch_in_float64(name):
    """Dropout left out on both sides: loss, every gradient and the running statistics, to float64 rounding.

    (In float32 MobileNetV2's stem gradient differs from torch's by 4e-4 relative: batch norm over the 2x2
    and 1x1 maps of a 32x32 input magnifies rounding, and float64 on both sides agrees to 1e-13.)"""
    net = zoo.zoo_net(name).network(reduced=True, dropout=False)
    x, t = data(name, 4)
    x, t = x[:BATCH], t[:BATCH]
    weights = Predictor(net, config(), seed=5).params.state_dict()
    engine = run_network(net, x, t, precision="fp64", weights=weights)
    model = twin(name, net, weights, None).double().train()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(to_nchw(x)).double()),
                                             torch.from_numpy(t).double())
    loss.backward()
    grads = torch_zoo.torch_to_engine({n: p.grad for n, p in model.named_parameters()}, net)
    running = {k.removeprefix("buffer:"): engine.pop(k) for k in list(engine) if k.startswith("buffer:")}
    engine.pop("fused")
    expected = {"loss": loss} | {f"grad:{k}": v for k, v in grads.items()}
    assert_matches_torch(engine, expected, rtol=1e-9, atol=1e-12, what=name)
    # the engine keeps running statistics in float32 whatever the compute precision
    assert_matches_torch(running, torch_resnet.buffers_of(model), rtol=1e-6, atol=1e-7, what=f"{name} running")


@pytest.mark.parametrize("name", zoo.NAMES)
def test_one_float32_step_matches_torch(name):
    """The trainer's float32 step (dropout left out): loss, running statistics, the gradient as a whole.

    Not the parameters after Adam: its first step moves each by lr * sign(gradient), and gradients that are
    zero in exact arithmetic (a BN shift followed by another BN) take either sign in float32."""
    net = zoo.zoo_net(name).network(reduced=True, dropout=False)
    x, t = data(name, 4)
    trainer = Trainer(net, x, t, BATCH, config(), lr=zoo.LEARNING_RATE, seed=5)
    model = twin(name, net, trainer.params.state_dict(), trainer.params.buffers_dict() or None).train()
    first_step(trainer)
    rows = trainer.data.rows_of_step(0)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(to_nchw(x[rows]))), torch.from_numpy(t[rows]))
    loss.backward()
    engine_loss = trainer.backend.to_host(trainer.state.history)[0]
    assert_matches_torch({"loss": engine_loss}, {"loss": loss}, rtol=1e-4, what=f"{name} loss")
    if trainer.params.buffer_specs:
        assert_matches_torch(trainer.params.buffers_dict(), torch_resnet.buffers_of(model), rtol=RTOL, atol=ATOL,
                             what=f"{name} running statistics")
    grads = torch_zoo.torch_to_engine({n: p.grad for n, p in model.named_parameters()}, net)
    ours, theirs = (np.concatenate([g[k].ravel() for k in sorted(grads)]).astype(np.float64)
                    for g in (trainer.params.grads_dict(), grads))
    cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
    # The reduced MobileNetV2's float32 gradient is itself this far from its float64 one (cosine 0.99942 for
    # the engine alone; 0.99931 engine vs torch; 1 - 1e-7 for the other networks); float64 above is exact.
    assert cosine > 0.999 and abs(np.linalg.norm(ours) / np.linalg.norm(theirs) - 1) < 1e-2, cosine


@pytest.mark.parametrize("name", ["alexnet", "vgg16"])
def test_flattened_dense_columns_move_between_layouts(name):
    net = zoo.zoo_net(name).network(reduced=True)
    (layer, (h, w, c)), = torch_zoo.flattened_dense_layers(net).items()
    assert layer == {"alexnet": "classifier.1", "vgg16": "classifier.0"}[name]
    weights = Predictor(net, config(), seed=6).params.state_dict()
    there = torch_zoo.engine_to_torch(weights, net)
    back = torch_zoo.torch_to_engine(there, net)
    for key in weights:
        np.testing.assert_array_equal(back[key], weights[key], err_msg=key)
    units = weights[f"{layer}.weight"].shape[0]
    # torch's column (k, i, j) is the engine's column (i, j, k) of the same unit
    np.testing.assert_array_equal(there[f"{layer}.weight"].reshape(units, c, h, w)[:, 1, 0, 1],
                                  weights[f"{layer}.weight"].reshape(units, h, w, c)[:, 0, 1, 1])


def test_torchvision_reference_states_why_it_is_missing():
    reason = torch_zoo.torchvision_unavailable()
    if reason is None:
        pytest.skip("torchvision imports here: its models are checked in test_gpu_zoo.py")
    assert "torchvision" in reason
    with pytest.raises(torch_zoo.ReferenceUnavailable, match="torchvision"):
        torch_zoo.torchvision_model("alexnet")


def test_pinned_host_batch_runner_trains_like_the_resident_runner():
    """reference/torch_host_batches.py copies each batch from the host; the batches and losses are the same."""
    from gpuengine.reference.torch_host_batches import PinnedHostBatchRunner
    net = zoo.zoo_net("resnet18").network(reduced=True)
    x, t = data("resnet18", 7)
    state = Predictor(net, config(), seed=8).params
    losses = []
    for runner in (torch_zoo.TorchTrainRunner, PinnedHostBatchRunner):
        reference = torch_zoo.zoo_train_runner("torch_eager", "resnet18", x, t, BATCH, "fp32", state.state_dict(),
                                               state.buffers_dict(), reduced=True, torchvision=False, device="cpu",
                                               runner=runner)
        reference.prepare()
        losses.append([])
        for _ in range(3):
            reference.run_round()
            losses[-1].append(reference.last_epoch_loss())
    assert losses[0] == losses[1]
