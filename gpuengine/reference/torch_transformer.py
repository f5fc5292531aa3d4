"""PyTorch twin of the Transformer workload (workloads/transformer.py; seed note 004, docs/seeds.md).

`nn.Transformer` (d_model 256, 8 heads, feed-forward 1024, 2 + 2 layers,
post-LN, ReLU, batch-first) between the engine's own front and back: two
`nn.Embedding`s scaled by sqrt(d_model) plus the same sinusoidal table
(layers/positional.py), and an `nn.Linear` projection to the vocabulary. Its
dropout is 0 everywhere: the note's engine had no dropout, so neither side
drops anything and both compute the same function. The decoder's
self-attention gets the causal mask (`tgt_is_causal`), the encoder and the
cross-attention none; token cross-entropy ignores the padding id.

Initialisation is the engine's policy, drawn from a seeded generator: Xavier
uniform for every matrix (what nn.Transformer's own reset does, extended to
the embeddings and the projection), every bias zero, LayerNorm scale one.
Module paths are the engine's node names, and every parameter has the same
layout on both sides, so weights and gradients map by name one to one and the
parameter counts are equal by construction (checked in the tests).
The model takes the engine's input rows [source | BOS, target[:-1]] as float ids.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..data.formats.token_corpus import PAD_ID
from ..layers.positional import sinusoid_table
from ..workloads.transformer import LEARNING_RATE, SEED_SHAPE, TransformerShape
from .torch_common import TorchTrainRunner, host_array


class TorchTransformer(nn.Module):
    def __init__(self, shape: TransformerShape = SEED_SHAPE, seed: int = 0):
        super().__init__()
        self.shape = shape
        with torch.device("meta"):   # no default initialisation: it would draw from the global RNG
            self.src_embed = nn.Embedding(shape.vocab, shape.d_model)
            self.tgt_embed = nn.Embedding(shape.vocab, shape.d_model)
            self.transformer = nn.Transformer(d_model=shape.d_model, nhead=shape.heads,
                                              num_encoder_layers=shape.encoder_layers,
                                              num_decoder_layers=shape.decoder_layers,
                                              dim_feedforward=shape.feed_forward, dropout=0.0, activation="relu",
                                              batch_first=True, norm_first=False)
            self.generator = nn.Linear(shape.d_model, shape.vocab)
        self.to_empty(device="cpu")
        self._initialise(torch.Generator().manual_seed(seed))
        table = torch.from_numpy(sinusoid_table(shape.length, shape.d_model)).float()
        self.register_buffer("positions", table, persistent=False)
        mask = nn.Transformer.generate_square_subsequent_mask(shape.length)
        self.register_buffer("causal_mask", mask, persistent=False)

    @torch.no_grad()
    def _initialise(self, generator: torch.Generator) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p, generator=generator)
            else:
                nn.init.zeros_(p)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)

    def _embedded(self, embed: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return embed(ids) * math.sqrt(self.shape.d_model) + self.positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x (B, 2L) float ids -> logits (B, L, vocab)
        ids = x.long()
        length = self.shape.length
        source = self._embedded(self.src_embed, ids[:, :length])
        target = self._embedded(self.tgt_embed, ids[:, length:])
        out = self.transformer(source, target, tgt_mask=self.causal_mask, tgt_is_causal=True)
        return self.generator(out)


def token_cross_entropy(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Mean over non-padding tokens of the cross-entropy of (B, L, V) logits against (B, L) float ids."""
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t.long().reshape(-1),
                                       ignore_index=PAD_ID)


def load_weights(model: TorchTransformer, weights: Mapping) -> None:
    """Copy engine parameters (same names and layouts) into the model: all names and shapes checked first."""
    params = dict(model.named_parameters())
    missing, unknown = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
    if missing or unknown:
        raise KeyError(f"weights must name exactly the model's {len(params)} parameters; missing: "
                       f"{', '.join(missing[:4]) or 'none'}; unknown: {', '.join(unknown[:4]) or 'none'}")
    values = {name: host_array(value) for name, value in weights.items()}
    for name, value in values.items():
        if tuple(value.shape) != tuple(params[name].shape):
            raise ValueError(f"{name}: expected shape {tuple(params[name].shape)}, got {tuple(value.shape)}")
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))


def build_model(shape: TransformerShape = SEED_SHAPE, weights: Mapping | None = None, seed: int = 0):
    model = TorchTransformer(shape, seed)
    if weights is not None:
        load_weights(model, weights)
    return model


def transformer_train_runner(mode: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                             lr: float = LEARNING_RATE, device: str = "cuda", seed: int = 0,
                             shape: TransformerShape = SEED_SHAPE, weights: Mapping | None = None,
                             **runner_options) -> TorchTrainRunner:
    """Train on the engine's teacher-forcing arrays x (n, 2L) and t (n, L), resident on `device`.

    `runner_options` go to TorchTrainRunner (compile_backend, compile_mode, warmup_steps, name, epochs_per_round).
    """
    if x.ndim != 2 or x.shape[1] != 2 * shape.length or t.shape != (len(x), shape.length):
        raise ValueError(f"x must be (n, {2 * shape.length}) and t (n, {shape.length}); got {x.shape}, {t.shape}")
    return TorchTrainRunner(mode, build_model(shape, weights, seed), token_cross_entropy,
                            x.astype(np.float32, copy=False), t.astype(np.float32, copy=False), batch_size,
                            precision, lr, device, seed, **runner_options)


def twin_train_runner(mode, x, t, batch, precision, *, lr, device, shape, weights, buffers):
    """The workload table's one signature of a twin's training runner (gpuengine/workloads/workload.py)."""
    return transformer_train_runner(mode, x, t, batch, precision, lr=lr, device=device, shape=shape,
                                    weights=weights)
