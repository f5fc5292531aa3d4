"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al. 2017; seed note 004).

Source and target ids are embedded (scaled by sqrt(d_model)) and given
sinusoidal positions; N encoder layers (self-attention, then a position-wise
feed-forward of ReLU between two linear maps) and N decoder layers (causal
self-attention, cross-attention over the encoder's output, feed-forward) each
wrap every sub-layer as LayerNorm(x + sublayer(x)) (post-LN, as in the note and
the paper), the stacks end in a LayerNorm each (as torch's nn.Transformer
does), and a linear map projects the decoder's output to vocabulary logits.
Token cross-entropy, padding id ignored; Adam lr 1e-4; Glorot (Xavier uniform)
initialisation of every weight matrix (the note's second fix), biases zero,
LayerNorm scale one: the initial loss sits near ln(vocab). No dropout: the
note's engine had none, and its PyTorch twin runs with dropout 0.

The graph has one data input per sample, the row [source | BOS, target[:-1]]
(data/formats/token_corpus.py, teacher forcing); the two embedding nodes read their
halves, so the graph has two inputs in effect and cross-attention joins the
stacks. Node names are the module paths of reference/torch_transformer.py
(`transformer.encoder.layers.0.self_attn`, `generator`), so the parameter
names of both sides are the same and their layouts too.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..data.formats.token_corpus import PAD_ID, synthetic_corpus, teacher_forcing
from ..layers import (Activation, Add, LayerNorm, Linear, MultiHeadAttention, SinusoidalPositionalEncoding,
    TokenEmbedding)
from ..losses import MSELoss, TokenCrossEntropy
from ..model.network import INPUT, Network, NetworkBuilder
from .workload import Workload

LEARNING_RATE = 1e-4
TRAIN_BATCH = 16
SAMPLES = 1024
SEQUENCE_LENGTHS = (64, 128, 256, 384)
ENERGY_LENGTH = 256


@dataclass(frozen=True)
class TransformerShape:
    vocab: int = 256
    d_model: int = 256
    heads: int = 8
    feed_forward: int = 1024
    encoder_layers: int = 2
    decoder_layers: int = 2
    length: int = 128          # source and target positions per sample

    def with_length(self, length: int) -> "TransformerShape":
        return replace(self, length=length)

    @property
    def input_shape(self) -> tuple:
        return (2 * self.length,)   # [source | shifted target]


SEED_SHAPE = TransformerShape()
# CPU tier: every kind of node at toy sizes (two heads of 8, one layer per stack).
SMOKE_SHAPE = TransformerShape(vocab=32, d_model=16, heads=2, feed_forward=32, encoder_layers=1, decoder_layers=1,
                               length=8)


def transformer_data(samples: int = SAMPLES, shape: TransformerShape = SEED_SHAPE, seed: int = 0):
    """The learnable synthetic corpus as teacher-forcing arrays (x (n, 2L), t (n, L) float32 ids)."""
    return teacher_forcing(*synthetic_corpus(samples, shape.vocab, shape.length, seed))


def _sublayer_end(b: NetworkBuilder, x: str, sub: str, norm: str) -> str:
    """Post-LN: LayerNorm(x + sublayer(x))."""
    return b.add(LayerNorm(), b.add(Add(), x, sub, name=f"{norm}.residual"), name=norm)


def _feed_forward(b: NetworkBuilder, x: str, prefix: str, shape: TransformerShape, norm: str) -> str:
    h = b.add(Linear(shape.feed_forward), x, name=f"{prefix}.linear1")
    h = b.add(Activation("relu"), h, name=f"{prefix}.relu")
    h = b.add(Linear(shape.d_model), h, name=f"{prefix}.linear2")
    return _sublayer_end(b, x, h, f"{prefix}.{norm}")


def encoder_layer(b: NetworkBuilder, x: str, prefix: str, shape: TransformerShape) -> str:
    h = b.add(MultiHeadAttention(shape.heads), x, name=f"{prefix}.self_attn")
    x = _sublayer_end(b, x, h, f"{prefix}.norm1")
    return _feed_forward(b, x, prefix, shape, "norm2")


def decoder_layer(b: NetworkBuilder, x: str, memory: str, prefix: str, shape: TransformerShape) -> str:
    h = b.add(MultiHeadAttention(shape.heads, causal=True), x, name=f"{prefix}.self_attn")
    x = _sublayer_end(b, x, h, f"{prefix}.norm1")
    h = b.add(MultiHeadAttention(shape.heads, cross=True), x, memory, name=f"{prefix}.multihead_attn")
    x = _sublayer_end(b, x, h, f"{prefix}.norm2")
    return _feed_forward(b, x, prefix, shape, "norm3")


def _embedded(b: NetworkBuilder, shape: TransformerShape, side: str) -> str:
    start = 0 if side == "src" else shape.length
    x = b.add(TokenEmbedding(shape.vocab, shape.d_model, start, shape.length), INPUT, name=f"{side}_embed")
    return b.add(SinusoidalPositionalEncoding(), x, name=f"{side}_pe")


def build_transformer(shape: TransformerShape = SEED_SHAPE) -> Network:
    b = NetworkBuilder(shape.input_shape)
    memory = _embedded(b, shape, "src")
    for i in range(shape.encoder_layers):
        memory = encoder_layer(b, memory, f"transformer.encoder.layers.{i}", shape)
    memory = b.add(LayerNorm(), memory, name="transformer.encoder.norm")
    x = _embedded(b, shape, "tgt")
    for i in range(shape.decoder_layers):
        x = decoder_layer(b, x, memory, f"transformer.decoder.layers.{i}", shape)
    x = b.add(LayerNorm(), x, name="transformer.decoder.norm")
    b.add(Linear(shape.vocab), x, name="generator")
    return b.network(TokenCrossEntropy(pad_id=PAD_ID))


def single_layer_network(shape: TransformerShape, part: str) -> Network:
    """Embedded tokens through one `encoder_layer` or `decoder_layer` (memory: the embedded source), regressed
    with MSE on the layer's output: the parity and gradient tests of one layer."""
    b = NetworkBuilder(shape.input_shape)
    source = _embedded(b, shape, "src")
    if part == "encoder_layer":
        out = encoder_layer(b, source, "layer", shape)
    elif part == "decoder_layer":
        out = decoder_layer(b, _embedded(b, shape, "tgt"), source, "layer", shape)
    else:
        raise ValueError(f"part={part!r} is not accepted; use encoder_layer or decoder_layer")
    return b.network(MSELoss(), output=out)


def parameter_count(shape: TransformerShape = SEED_SHAPE) -> int:
    """Trainable parameters counted from the shape (torch's nn.Transformer + two embeddings + generator)."""
    d, f, v = shape.d_model, shape.feed_forward, shape.vocab
    attention = 4 * d * d + 4 * d
    feed_forward = 2 * d * f + f + d
    norm = 2 * d
    encoder = shape.encoder_layers * (attention + feed_forward + 2 * norm) + norm
    decoder = shape.decoder_layers * (2 * attention + feed_forward + 3 * norm) + norm
    return 2 * v * d + encoder + decoder + d * v + v


WORKLOAD = Workload(
    "transformer", "Transformer", "004", order=3,
    tests={"test_transformer_train": "training", "test_transformer_train_energy": "training energy"},
    profiled=("test_transformer_train",), batch=TRAIN_BATCH, smoke_batch=8,
    twin="gpuengine.reference.torch_transformer", lr=LEARNING_RATE, build=build_transformer, data=transformer_data,
    seed_shape=SEED_SHAPE, smoke_shape=SMOKE_SHAPE)
