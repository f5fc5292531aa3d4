"""The Transformer on the CPU against its PyTorch twin (reference/torch_transformer.py), float32, same weights.

Parameter names, layouts and counts are equal at the seed shape; one encoder
layer and one decoder layer (embedded tokens through the layer, MSE on its
output) give the same loss and gradients; the whole model gives the same
logits, token loss and gradients after one training step and the same
parameters after one Adam step; the initial loss sits near ln(vocab) (Glorot
initialisation, seed note 004's second fix).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; parity with PyTorch cannot be checked")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.reference import torch_transformer  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads import transformer  # noqa: E402

from ..gradient_check import random_weights  # noqa: E402
from ..layer_harness import run_network  # noqa: E402
from ..torch_compare import assert_matches_torch, first_step, fixed_torch_threads, torch_adam  # noqa: E402,F401

SHAPE = transformer.SMOKE_SHAPE
SAMPLES, BATCH = 32, 8
RTOL, ATOL = 1e-4, 1e-5   # float32 sums in different orders through a dozen layers


def config(**changes) -> EngineConfig:
    return EngineConfig(device="cpu", precision="fp32", cuda_graph=0).replace(**changes)


def test_parameters_have_the_twins_names_shapes_and_count():
    net = transformer.build_transformer(transformer.SEED_SHAPE)
    model = torch_transformer.build_model(transformer.SEED_SHAPE)
    assert {s.name: s.shape for s in net.param_specs()} == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert net.parameter_count() == sum(p.numel() for p in model.parameters()) == transformer.parameter_count()
    assert transformer.parameter_count() == 3_884_288


class TorchLayer(torch.nn.Module):
    """The twin of transformer.single_layer_network: embedded tokens through one torch layer named `layer`."""

    def __init__(self, part: str):
        super().__init__()
        self.front = torch_transformer.TorchTransformer(SHAPE)
        del self.front.transformer, self.front.generator
        if part == "encoder_layer":
            del self.front.tgt_embed
        kind = torch.nn.TransformerEncoderLayer if part == "encoder_layer" else torch.nn.TransformerDecoderLayer
        self.layer = kind(SHAPE.d_model, SHAPE.heads, SHAPE.feed_forward, dropout=0.0, batch_first=True)
        self.part = part

    def forward(self, x):
        ids = x.long()
        source = self.front._embedded(self.front.src_embed, ids[:, :SHAPE.length])
        if self.part == "encoder_layer":
            return self.layer(source)
        target = self.front._embedded(self.front.tgt_embed, ids[:, SHAPE.length:])
        return self.layer(target, source, tgt_mask=self.front.causal_mask, tgt_is_causal=True)


@pytest.mark.parametrize("part", ["encoder_layer", "decoder_layer"])
def test_one_layer_matches_torch(part):
    net = transformer.single_layer_network(SHAPE, part)
    x, _ = transformer.transformer_data(6, SHAPE, seed=1)
    rng = np.random.default_rng(2)
    weights = {k: v.astype(np.float32) for k, v in random_weights(net.param_specs(), rng, scale=0.3).items()}
    target = rng.standard_normal((6,) + net.output_shape).astype(np.float32)
    engine = run_network(net, x, target, precision="fp32", weights=weights)
    model = TorchLayer(part)
    torch_weights = {("front." + k if k.endswith("_embed.weight") else k): v for k, v in weights.items()}
    assert set(torch_weights) == {n for n, _ in model.named_parameters()}
    model.load_state_dict({k: torch.from_numpy(v) for k, v in torch_weights.items()}, strict=False)
    loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(target))
    loss.backward()
    assert_matches_torch({"loss": engine["loss"]}, {"loss": loss}, rtol=1e-5, what=f"{part} loss")
    grads = {f"grad:{k.removeprefix('front.')}": p.grad for k, p in model.named_parameters()}
    assert_matches_torch({k: v for k, v in engine.items() if k.startswith("grad:")}, grads, rtol=RTOL, atol=ATOL,
                         what=f"{part} gradients")


def test_whole_model_logits_loss_gradients_and_one_adam_step_match_torch():
    x, t = transformer.transformer_data(SAMPLES, SHAPE, seed=3)
    trainer = Trainer(transformer.build_transformer(SHAPE), x, t, BATCH, config(), lr=transformer.LEARNING_RATE,
                      seed=4)
    model = torch_transformer.build_model(SHAPE, trainer.params.state_dict()).train()
    first_step(trainer)
    rows = trainer.data.rows_of_step(0)
    optimizer = torch_adam(model, transformer.LEARNING_RATE)
    logits = model(torch.from_numpy(x[rows]))
    loss = torch_transformer.token_cross_entropy(logits, torch.from_numpy(t[rows]))
    loss.backward()
    assert_matches_torch({"logits": trainer.program.layers["generator"].out}, {"logits": logits}, rtol=RTOL,
                         atol=ATOL, what="logits")
    assert_matches_torch({"loss": trainer.backend.to_host(trainer.state.history)[0]}, {"loss": loss}, rtol=1e-5,
                         what="loss")
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert_matches_torch(trainer.params.grads_dict(), grads, rtol=RTOL, atol=ATOL, what="gradient")
    optimizer.step()
    assert_matches_torch(without_key_bias(trainer.params.state_dict()), without_key_bias(dict(model.named_parameters())),
                         rtol=RTOL, atol=ATOL, what="after one Adam step")


def without_key_bias(params: dict) -> dict:
    """The key block of each in_proj_bias dropped: softmax ignores a shift shared by all keys, so its gradient
    is zero up to rounding (checked above, within ATOL) and Adam's first step turns that rounding into +-lr."""
    d = SHAPE.d_model
    return {name: (np.concatenate([np.asarray(v.detach() if torch.is_tensor(v) else v)[:d],
                                   np.asarray(v.detach() if torch.is_tensor(v) else v)[2 * d:]])
                   if name.endswith("in_proj_bias") else v)
            for name, v in params.items()}


def test_initial_loss_is_near_ln_vocab_with_glorot_initialisation():
    """Seed note 004: unscaled U(-0.1, 0.1) weights started far above ln(vocab); Glorot starts near it."""
    shape = transformer.SEED_SHAPE.with_length(16)
    x, t = transformer.transformer_data(BATCH, shape, seed=5)
    net = transformer.build_transformer(shape)
    weights = Trainer(net, x, t, BATCH, config(), seed=6).params.state_dict()
    loss = run_network(net, x, t, precision="fp32", weights=weights)["loss"]
    assert abs(loss - math.log(shape.vocab)) < 1.0, loss
    model = torch_transformer.build_model(shape, seed=6)
    with torch.no_grad():
        torch_loss = float(torch_transformer.token_cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(t)))
    assert abs(torch_loss - math.log(shape.vocab)) < 1.0, torch_loss
