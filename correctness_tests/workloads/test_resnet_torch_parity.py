"""The reduced ResNet-50 and one bottleneck block on the CPU against the PyTorch twin, float32, same weights.

reference/torch_resnet.py writes ResNet-50 v1.5 out by hand with torchvision's
names (checked against torchvision itself where it imports); the engine's
graph has the same names, so weights map one to one (conv filters KRSC <->
OIHW). Same weights give the same logits in inference (running statistics),
the same loss, gradients and running statistics after one training step, and
the same parameters after one Adam step; a bottleneck block alone (identity
and projection shortcut) gives the same output and input gradient.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.model.network import INPUT, NetworkBuilder  # noqa: E402
from gpuengine.inference import Predictor  # noqa: E402
from gpuengine.losses import MSELoss  # noqa: E402
from gpuengine.reference import torch_resnet  # noqa: E402
from gpuengine.reference.torch_common import to_nchw  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads import resnet  # noqa: E402

from ..layer_harness import run_network  # noqa: E402
from ..torch_compare import assert_matches_torch, first_step, fixed_torch_threads, torch_adam  # noqa: E402,F401

SHAPE = resnet.SMOKE_SHAPE
SAMPLES, BATCH = 48, 16
RTOL, ATOL = 1e-4, 1e-5   # 18 layers of float32 sums in different orders


def config(**changes) -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0).replace(**changes)


def data(seed: int):
    return resnet.resnet_data(SAMPLES, SHAPE, seed)


def test_logits_with_running_statistics_match_torch_eval_mode():
    rng = np.random.default_rng(1)
    predictor = Predictor(resnet.build_resnet(SHAPE), config(), seed=2)
    buffers = {k: (rng.random(v.shape) + 0.5 if k.endswith("var") else rng.standard_normal(v.shape) * 0.1)
               for k, v in predictor.params.buffers_dict().items()}
    predictor.params.load_buffers(buffers)
    x, _ = data(3)
    model = torch_resnet.build_model(SHAPE, predictor.params.state_dict(), predictor.params.buffers_dict()).eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(to_nchw(x[:8])))
    assert_matches_torch({"logits": predictor.predict(x[:8])}, {"logits": expected}, rtol=RTOL, atol=ATOL,
                         what="predict")


def test_one_step_loss_gradients_running_statistics_and_adam_update_match_torch():
    x, t = data(4)
    trainer = Trainer(resnet.build_resnet(SHAPE), x, t, BATCH, config(), lr=resnet.LEARNING_RATE, seed=5)
    model = torch_resnet.build_model(SHAPE, trainer.params.state_dict(), trainer.params.buffers_dict()).train()
    first_step(trainer)
    rows = trainer.data.rows_of_step(0)
    optimizer = torch_adam(model, resnet.LEARNING_RATE)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(to_nchw(x[rows]))), torch.from_numpy(t[rows]))
    loss.backward()
    engine_loss = trainer.backend.to_host(trainer.state.history)[0]
    assert_matches_torch({"loss": engine_loss}, {"loss": loss}, rtol=1e-5, what="loss")
    grads = torch_resnet.torch_to_engine({n: p.grad for n, p in model.named_parameters()})
    assert_matches_torch(trainer.params.grads_dict(), grads, rtol=RTOL, atol=ATOL, what="gradient")
    assert_matches_torch(trainer.params.buffers_dict(), torch_resnet.buffers_of(model), rtol=RTOL, atol=ATOL,
                         what="running statistics")
    optimizer.step()
    assert_matches_torch(trainer.params.state_dict(), torch_resnet.torch_to_engine(dict(model.named_parameters())),
                         rtol=RTOL, atol=ATOL, what="after one Adam step")


def single_block(project: bool):
    """One bottleneck (layer1.0 of a net whose stem is skipped), the block output regressed with MSE."""
    b = NetworkBuilder((4, 4, 16 if project else 32))
    out = resnet._bottleneck(b, INPUT, "layer1.0", 8, 32, 1, project, fused=True)
    return b.network(MSELoss(), output=out)


@pytest.mark.parametrize("project", [False, True], ids=["identity-shortcut", "projection-shortcut"])
def test_bottleneck_block_matches_torch(project):
    net = single_block(project)
    channels, out = (16, 32) if project else (32, 32)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((6, 4, 4, channels)).astype(np.float32)
    target = rng.standard_normal((6, 4, 4, out)).astype(np.float32)
    weights = Predictor(net, config(), seed=7).params.state_dict()
    engine = run_network(net, x, target, precision="fp32", weights=weights)

    block = torch_resnet.Bottleneck(channels, 8, 1, 4)
    torch_weights = {k.removeprefix("layer1.0."): v for k, v in torch_resnet.engine_to_torch(weights).items()}
    block.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in torch_weights.items()},
                          strict=False)
    y = block(torch.from_numpy(to_nchw(x)))
    loss = torch.nn.functional.mse_loss(y, torch.from_numpy(to_nchw(target)))
    loss.backward()
    assert_matches_torch({"loss": engine["loss"]}, {"loss": loss}, rtol=1e-5, what="block loss")
    grads = torch_resnet.torch_to_engine({f"layer1.0.{n}": p.grad for n, p in block.named_parameters()})
    assert_matches_torch({k: v for k, v in engine.items() if k.startswith("grad:")},
                         {f"grad:{k}": v for k, v in grads.items()}, rtol=RTOL, atol=ATOL, what="block gradients")
