"""Gradient checks of the Transformer's ops on the NumPy backend in float64 (see gradient_check.py).

Token embedding (scatter-add weight gradient, repeated ids included),
positional encoding (the table and its pass-through gradient), LayerNorm,
the position-wise Linear, multi-head attention as self-attention with and
without the causal mask and as cross-attention (queries and memory of
different lengths), token cross-entropy with and without a padding id, one
whole encoder layer, one whole decoder layer and a tiny whole model.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.layers import LayerNorm, Linear, MultiHeadAttention, SinusoidalPositionalEncoding, TokenEmbedding
from gpuengine.layers import layernorm
from gpuengine.layers.positional import sinusoid_table
from gpuengine.losses import TokenCrossEntropy
from gpuengine.ops.attention import causal_mask
from gpuengine.workloads import transformer

from ..gradient_check import assert_not_trivial, check_backward, check_network_backward, random_weights
from ..layer_harness import run_layer, run_loss

BATCH = 3


def activations(seed: int, positions: int = 5, d: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, positions, d))


def test_embedding_weight_gradient_is_a_scatter_add_of_scaled_output_gradients():
    ids = np.array([[0, 3, 3, 9, 1, 2, 4], [5, 5, 5, 0, 7, 8, 6], [2, 2, 1, 3, 3, 0, 9]], np.float64)
    layer = TokenEmbedding(vocab=10, d_model=4, start=2, length=5, name="embed")
    assert_not_trivial(check_backward(layer, ids, needs_input_grad=False, seed=1))
    weights = random_weights(layer.param_specs((7,)), np.random.default_rng(2))
    dy = np.random.default_rng(3).standard_normal((3, 5, 4))
    out = run_layer(layer, ids, dy, weights=weights, needs_input_grad=False)
    w = weights["embed.weight"]
    np.testing.assert_allclose(out["y"], 2.0 * w[ids[:, 2:].astype(int)], rtol=1e-12)
    expected = np.zeros_like(w)
    for b, row in enumerate(ids[:, 2:].astype(int)):
        for t, token in enumerate(row):
            expected[token] += 2.0 * dy[b, t]
    np.testing.assert_allclose(out["grad:embed.weight"], expected, rtol=1e-12)


def test_embedding_gives_no_input_gradient_and_refuses_a_row_too_short():
    layer = TokenEmbedding(vocab=10, d_model=4, start=2, length=5, name="embed")
    assert "dx" not in run_layer(layer, np.zeros((2, 7)), np.zeros((2, 5, 4)), needs_input_grad=True)
    with pytest.raises(ValueError, match="ids 2..6"):
        layer.output_shape((6,))


def test_positional_encoding_adds_the_sinusoid_table_and_passes_the_gradient_through():
    x = activations(4, positions=6, d=8)
    assert_not_trivial(check_backward(SinusoidalPositionalEncoding(name="pe"), x, seed=4))
    y = run_layer(SinusoidalPositionalEncoding(name="pe"), x, x)["y"]
    table = sinusoid_table(6, 8)
    np.testing.assert_allclose(y - x, np.broadcast_to(table, x.shape), atol=1e-12)
    np.testing.assert_allclose(table[3, 2:4], [np.sin(3 / 10000 ** (2 / 8)), np.cos(3 / 10000 ** (2 / 8))])


def test_layernorm_gradients_and_output_statistics():
    x = activations(5) * 2 + 1
    weights = {"ln.weight": 1 + 0.3 * np.random.default_rng(6).standard_normal(8),
               "ln.bias": 0.2 * np.random.default_rng(7).standard_normal(8)}
    assert_not_trivial(check_backward(LayerNorm(name="ln"), x, weights, seed=8))
    y = run_layer(LayerNorm(name="ln"), x, x, weights={"ln.weight": np.ones(8), "ln.bias": np.zeros(8)})["y"]
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1 / (1 + 1e-5 / x.var(axis=-1)), rtol=1e-9)


@pytest.mark.parametrize("rows, dim, sums, blocks", [(6144, 256, 3, 132), (1024, 256, 2, 132), (999, 300, 2, 132),
                                                     (363, 30, 3, 132), (100_000, 512, 3, 78), (5, 8, 2, 132)])
def test_the_one_launch_backward_grid_covers_the_rows_in_the_blocks_and_shared_memory_given(rows, dim, sums, blocks):
    warps, rows_per_block, grid = layernorm.fused_grid(rows, dim, sums, blocks)
    stride = layernorm.partial_stride(dim, sums)
    assert stride % 4 == 0 and sums * dim <= stride < sums * dim + 4   # float4 rows of partials
    assert warps * stride * 4 <= layernorm._SHARED_BYTES   # the warps' column sums, then the last block's runs
    assert rows_per_block % warps == 0 and grid <= blocks
    assert (grid - 1) * rows_per_block < rows <= grid * rows_per_block   # every row, no block without one
    fewest = min(w * max(1, -(-rows // (w * blocks))) for w in (16, 8, 4)
                 if w * stride * 4 <= layernorm._SHARED_BYTES)
    assert rows_per_block == fewest   # no width that fits gives its blocks fewer rows


@pytest.mark.parametrize("rows, expected", [(1024, (8, 8, 128)), (2048, (16, 16, 128)), (6144, (16, 48, 128))])
def test_the_transformers_layernorm_backward_spreads_its_rows_over_the_sms(rows, expected):
    # seq 64, 128 and 384 at batch 16 on an H200's 132 SMs: at seq 64, 16-warp blocks would fill 64 SMs of 132
    assert layernorm.fused_grid(rows, 256, 2, 132) == expected


def test_positionwise_linear_gradients():
    assert_not_trivial(check_backward(Linear(6, name="fc"), activations(9), seed=9))


@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
def test_self_attention_gradients(causal):
    layer = MultiHeadAttention(heads=2, causal=causal, name="attn")
    assert_not_trivial(check_backward(layer, activations(10), seed=10))


def test_cross_attention_gradients_reach_queries_and_memory():
    layer = MultiHeadAttention(heads=2, cross=True, name="attn")
    pairs = check_backward(layer, (activations(11, positions=4), activations(12, positions=6)), seed=11)
    assert_not_trivial(pairs)


def numpy_attention(q, k, v, causal):
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(causal_mask(*scores.shape[-2:]), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
def test_self_attention_output_is_the_formula(causal):
    x = activations(13)
    layer = MultiHeadAttention(heads=2, causal=causal, name="attn")
    weights = random_weights(layer.param_specs((5, 8)), np.random.default_rng(14))
    y = run_layer(layer, x, x, weights=weights)["y"]
    qkv = x @ weights["attn.in_proj_weight"].T + weights["attn.in_proj_bias"]
    heads = [h.reshape(BATCH, 5, 2, 4).transpose(0, 2, 1, 3) for h in np.split(qkv, 3, axis=-1)]
    context = numpy_attention(*heads, causal).transpose(0, 2, 1, 3).reshape(BATCH, 5, 8)
    expected = context @ weights["attn.out_proj.weight"].T + weights["attn.out_proj.bias"]
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)
    if causal:   # the first position sees only itself
        first = run_layer(layer, np.concatenate([x[:, :1], x[:, 1:] + 5], axis=1), x, weights=weights)["y"]
        np.testing.assert_allclose(first[:, 0], y[:, 0], rtol=1e-12)


@pytest.mark.parametrize("pad_id", [None, 0], ids=["no-padding", "padding-id-0"])
def test_token_cross_entropy_gradient(pad_id):
    rng = np.random.default_rng(15)
    z = rng.standard_normal((BATCH, 4, 7)) * 2
    t = rng.integers(0, 7, (BATCH, 4)).astype(np.float32)
    t[0, :2] = 0
    assert_not_trivial(check_backward(TokenCrossEntropy(pad_id), z, t, seed=16))
    result = run_loss(TokenCrossEntropy(pad_id), z, t)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, t.astype(int)[..., None], -1)[..., 0]
    counted = np.ones_like(picked, bool) if pad_id is None else t != pad_id
    assert result["loss"] == pytest.approx(-picked[counted].mean(), rel=1e-10)
    if pad_id is not None:
        assert not result["dy"][~counted].any()


def test_token_cross_entropy_pad_id_is_checked():
    with pytest.raises(ValueError, match="pad_id"):
        TokenCrossEntropy(pad_id=-1)


TINY = transformer.TransformerShape(vocab=11, d_model=8, heads=2, feed_forward=12, encoder_layers=1,
                                    decoder_layers=1, length=4)


@pytest.mark.parametrize("part", ["encoder_layer", "decoder_layer"])
def test_whole_layer_gradients(part):
    """Embedded tokens through one layer (the decoder's memory: the embedded source), MSE on its output."""
    net = transformer.single_layer_network(TINY, part)
    x, _ = transformer.transformer_data(BATCH, TINY, seed=17)
    rng = np.random.default_rng(18)
    weights = random_weights(net.param_specs(), rng)
    t = rng.standard_normal((BATCH,) + net.output_shape)
    assert_not_trivial(check_network_backward(net, x, t, weights, seed=19))


def test_whole_model_gradients():
    net = transformer.build_transformer(TINY)
    x, t = transformer.transformer_data(BATCH, TINY, seed=21)
    weights = random_weights(net.param_specs(), np.random.default_rng(22), scale=0.3)
    assert_not_trivial(check_network_backward(net, x, t, weights, seed=23))
