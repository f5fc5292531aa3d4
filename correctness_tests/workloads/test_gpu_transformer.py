"""On a GPU: the Transformer's kernels and cuDNN's fused attention agree with the NumPy backend.

The NumPy layers are checked against finite differences and PyTorch on the CPU
(test_transformer_gradients.py, test_transformer_torch_parity.py); these tests
carry that trust to the GPU: the fused SDPA forward and backward graphs
(unmasked, causal, cross-attention of unequal lengths) against the float64
formula within bf16 tolerance in every precision mode (fp32/tf32 run them
between casts, bf16 natively), the embedding, positional-encoding, LayerNorm
and token cross-entropy kernels against NumPy float32, LayerNorm's y, dx,
dgamma and dbeta against the float64 formula (a partial row chunk and column
tile; with and without an input gradient) and bit for bit when repeated, a
whole small model's training step, captured replay equal to eager, and no
allocation in the steady state.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import LayerNorm, MultiHeadAttention, SinusoidalPositionalEncoding, TokenEmbedding, layernorm
from gpuengine.losses import TokenCrossEntropy
from gpuengine.runtime.backend import gpu_visible
from gpuengine.workloads import transformer

from ..gpu_checks import TOLERANCE, assert_close, assert_steady_state_allocates_nothing, losses_by_graph_group
from ..layer_harness import run_layer, run_loss, run_network
from ..layers.test_gpu_conv import normal, representable

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

PRECISIONS = ["fp32", "tf32", "bf16"]
ATTENTION_TOLERANCE = 3e-2   # Q, K, V, O and dO round to bf16 in every mode: cuDNN's fused engines are bf16-only
# (heads, d_model, query positions, key positions, causal, cross)
ATTENTION_CASES = {"self": (4, 256, 64, 64, False, False), "causal": (8, 256, 128, 128, True, False),
                   "cross": (8, 256, 64, 96, False, True), "causal-384": (8, 256, 384, 384, True, False)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_fused_attention_matches_the_float64_formula(case, precision):
    """y, dx (and the memory's gradient) and every projection gradient, against NumPy in float64."""
    heads, d, queries, keys, causal, cross = ATTENTION_CASES[case]
    batch = 4
    layer = lambda: MultiHeadAttention(heads, causal=causal, cross=cross, name="attn")   # noqa: E731
    x = normal(1, (batch, queries, d), precision)
    inputs = (x, normal(2, (batch, keys, d), precision)) if cross else x
    dy = normal(3, (batch, queries, d), precision)
    rng = np.random.default_rng(4)
    weights = {s.name: representable(rng.standard_normal(s.shape) * np.sqrt(1.0 / d), precision)
               for s in layer().param_specs(*([(queries, d), (keys, d)] if cross else [(queries, d)]))}
    cpu = run_layer(layer(), inputs, dy, precision="fp64", weights=weights)
    gpu = run_layer(layer(), inputs, dy, device="cuda", precision=precision, weights=weights)
    assert_close(gpu, cpu, ATTENTION_TOLERANCE)


def test_forward_and_backward_attention_graphs_share_one_key_shape():
    """Seed note 004's cache-key bug: under fp32 the backward must find the bf16 graph family the forward built."""
    from gpuengine.ops.cudnn_attention import GRAPH_PRECISION, attention_graph_key
    forward = attention_graph_key("sdpa_fwd", True, 0.125)
    backward = attention_graph_key("sdpa_bwd", True, 0.125)
    assert forward[1:] == backward[1:] and forward[1] == GRAPH_PRECISION == "bf16"


@pytest.mark.parametrize("precision", PRECISIONS)
def test_embedding_positional_encoding_and_layernorm_match_numpy(precision):
    ids = np.random.default_rng(5).integers(0, 256, (16, 128)).astype(np.float32)
    dy = normal(6, (16, 64, 256), precision)
    weights = {"e.weight": representable(np.random.default_rng(7).standard_normal((256, 256)) * 0.06, precision)}
    embed = lambda: TokenEmbedding(256, 256, 64, 64, name="e")   # noqa: E731
    assert_close(run_layer(embed(), ids, dy, device="cuda", precision=precision, weights=weights),
                 run_layer(embed(), ids, dy, precision="fp32", weights=weights), TOLERANCE[precision])
    x = normal(8, (16, 64, 256), precision)
    assert_close(run_layer(SinusoidalPositionalEncoding(name="pe"), x, dy, device="cuda", precision=precision),
                 run_layer(SinusoidalPositionalEncoding(name="pe"), x, dy, precision="fp32"), TOLERANCE[precision])
    ln = {"ln.weight": representable(1 + 0.2 * np.random.default_rng(9).standard_normal(256), precision),
          "ln.bias": representable(0.2 * np.random.default_rng(10).standard_normal(256), precision)}
    assert_close(run_layer(LayerNorm(name="ln"), x * 2 + 1, dy, device="cuda", precision=precision, weights=ln),
                 run_layer(LayerNorm(name="ln"), x * 2 + 1, dy, precision="fp32", weights=ln), TOLERANCE[precision])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_embedding_gradient_spans_and_batches_change_no_bit(precision, monkeypatch):
    """A gradient thread checks GRAD_SPAN neighbouring tokens, spans crossing sample rows and a last partial chunk,
    and loads MATCH_BATCH matches' rows before adding them (a chunk's matches rarely a multiple of it); the matches
    are still added in token order, so dW is the bits of one token and one match at a time; y is NumPy's."""
    from gpuengine.layers import embedding
    ids = np.random.default_rng(33).integers(0, 7, (40, 150)).astype(np.float32)
    dy = normal(34, (40, 100, 300), precision)
    weights = {"e.weight": representable(np.random.default_rng(35).standard_normal((7, 300)) * 0.06, precision)}
    embed = lambda: TokenEmbedding(7, 300, 50, 100, name="e")   # noqa: E731
    spans = run_layer(embed(), ids, dy, device="cuda", precision=precision, weights=weights)
    assert_close(spans, run_layer(embed(), ids, dy, precision="fp32", weights=weights), TOLERANCE[precision])
    assert embedding.GRAD_SPAN > 1 and 40 * 100 % (embedding.GRAD_THREADS * embedding.GRAD_SPAN)
    assert embedding.MATCH_BATCH > 1
    monkeypatch.setattr(embedding, "GRAD_SPAN", 1)
    monkeypatch.setattr(embedding, "MATCH_BATCH", 1)
    one = run_layer(embed(), ids, dy, device="cuda", precision=precision, weights=weights)
    np.testing.assert_array_equal(spans["grad:e.weight"], one["grad:e.weight"])


def layernorm_float64(x, dy, gamma, beta, epsilon):
    """y, dx and the parameter gradients of LayerNorm by its formula, in float64."""
    d = x.shape[-1]
    x2, dy2 = x.reshape(-1, d), dy.reshape(-1, d)
    mean = x2.mean(axis=1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x2 - mean) ** 2).mean(axis=1, keepdims=True) + epsilon)
    xhat = (x2 - mean) * rstd
    g = dy2 * gamma
    dx = rstd * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return {"y": (xhat * gamma + beta).reshape(x.shape), "dx": dx.reshape(x.shape),
            "grad:ln.weight": (dy2 * xhat).sum(axis=0), "grad:ln.bias": dy2.sum(axis=0)}


# (batch, length, dim): 999 rows end in a partial row chunk (or block of the one-launch backward), and 300 columns
# in a partial tile of 32; 30 and 17 features give a lane pairs and single values to move; 512 features are the
# one-launch backward's widest (8 warps a block), 640 take its two-kernel form with dx.
LAYERNORM_SHAPES = {"999x300": (27, 37, 300), "2048x512": (16, 128, 512), "363x30": (11, 33, 30),
                    "999x17": (27, 37, 17), "333x640": (9, 37, 640)}


def row_blocks(layer) -> tuple[int, int]:
    """(rows a block or chunk, blocks or chunks) of the layer's parameter gradients, whichever form it took."""
    if layer.fused is not None:
        return layer.fused[1], layer.fused[2]
    return layer.plan.rows_per_chunk, layer.plan.chunks


@pytest.mark.parametrize("needs_input_grad", [True, False], ids=["dx", "first-layer"])
@pytest.mark.parametrize("shape", LAYERNORM_SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layernorm_parameter_gradients_match_the_float64_formula(precision, shape, needs_input_grad):
    """dgamma and dbeta with dx in one launch up to 512 features, from a second launch's column sums above that
    and where the LayerNorm is first (no dx kernel)."""
    dims = LAYERNORM_SHAPES[shape]
    x, dy = normal(17, dims, precision, scale=2.0) + 1, normal(18, dims, precision)
    rng = np.random.default_rng(19)
    gamma = representable(1 + 0.2 * rng.standard_normal(dims[-1]), precision)
    beta = representable(0.2 * rng.standard_normal(dims[-1]), precision)
    x = representable(x, precision)
    layer = LayerNorm(name="ln")
    gpu = run_layer(layer, x, dy, device="cuda", precision=precision, weights={"ln.weight": gamma, "ln.bias": beta},
                    needs_input_grad=needs_input_grad)
    expected = layernorm_float64(x, dy, gamma, beta, layer.epsilon)
    if not needs_input_grad:
        del expected["dx"]
        assert layer.dx is None
    assert (layer.fused is not None) == (needs_input_grad and dims[-1] <= 512)
    if shape == "999x300":
        assert layer.rows % row_blocks(layer)[0] != 0, row_blocks(layer)   # the last chunk or block is partial
    assert_close(gpu, expected, TOLERANCE[precision])


@pytest.mark.parametrize("shape", LAYERNORM_SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_layernorm_parameter_gradients_repeat_bit_for_bit(precision, shape):
    """Backward again and again: the column sums leave their tickets at zero and add the row chunks (or blocks) in a
    fixed order, so dgamma and dbeta come out identical, whichever block ends last."""
    dims = LAYERNORM_SHAPES[shape]
    x, dy = representable(normal(21, dims, precision, scale=2.0) + 1, precision), normal(22, dims, precision)
    weights = {"ln.weight": representable(1 + 0.2 * np.random.default_rng(23).standard_normal(dims[-1]), precision),
               "ln.bias": representable(0.2 * np.random.default_rng(24).standard_normal(dims[-1]), precision)}
    layer = LayerNorm(name="ln")
    first = run_layer(layer, x, dy, device="cuda", precision=precision, weights=weights)
    assert row_blocks(layer)[1] > 1, row_blocks(layer)   # the ticket path, not the one-block shortcut
    backend = layer.backend
    for _ in range(2):
        with backend.activate():
            layer.dgamma.fill(np.nan)
            layer.dbeta.fill(np.nan)
            layer.backward()
        backend.synchronize()
        assert not backend.to_host(layer.counters).any()
        np.testing.assert_array_equal(backend.to_host(layer.dgamma).astype(np.float64), first["grad:ln.weight"])
        np.testing.assert_array_equal(backend.to_host(layer.dbeta).astype(np.float64), first["grad:ln.bias"])


@pytest.mark.parametrize("shape", ["999x300", "363x30"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rows_held_in_registers_give_the_read_again_y_and_two_launch_dx_bit_for_bit(precision, shape, monkeypatch):
    """The forward adds a row held in registers in the order it reads x again, so y is the same bits; the one-launch
    backward's warps take dx's row sums in the order layernorm_bwd does, so dx is too; dgamma and dbeta add their
    rows in another order, so they agree to rounding."""
    dims = LAYERNORM_SHAPES[shape]
    x, dy = representable(normal(25, dims, precision, scale=2.0) + 1, precision), normal(26, dims, precision)
    weights = {"ln.weight": representable(1 + 0.2 * np.random.default_rng(27).standard_normal(dims[-1]), precision),
               "ln.bias": representable(0.2 * np.random.default_rng(28).standard_normal(dims[-1]), precision)}
    fused_layer, split_layer = LayerNorm(name="ln"), LayerNorm(name="ln")
    fused = run_layer(fused_layer, x, dy, device="cuda", precision=precision, weights=weights)
    monkeypatch.setattr(layernorm, "_HELD_MAX_DIM", 0)
    split = run_layer(split_layer, x, dy, device="cuda", precision=precision, weights=weights)
    assert fused_layer.fused is not None and split_layer.fused is None
    np.testing.assert_array_equal(fused["y"], split["y"])
    np.testing.assert_array_equal(fused["dx"], split["dx"])
    assert_close({k: fused[k] for k in ("grad:ln.weight", "grad:ln.bias")},
                 {k: split[k] for k in ("grad:ln.weight", "grad:ln.bias")}, TOLERANCE[precision])


@pytest.mark.parametrize("pad_id", [None, 0])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_token_cross_entropy_matches_numpy(precision, pad_id):
    rng = np.random.default_rng(11)
    z = normal(12, (16, 64, 256), precision) * 3
    t = rng.integers(0, 256, (16, 64)).astype(np.float32)
    t[:, :5] = 0
    gpu = run_loss(TokenCrossEntropy(pad_id), z, t, device="cuda", precision=precision)
    cpu = run_loss(TokenCrossEntropy(pad_id), z, t, precision="fp32")
    assert_close({"dy": gpu["dy"], "loss": np.array([gpu["loss"]])},
                 {"dy": cpu["dy"], "loss": np.array([cpu["loss"]])}, TOLERANCE[precision])


SHAPE = transformer.SMOKE_SHAPE.with_length(64)   # d_head 8: the smallest head width cuDNN's SDPA takes


@pytest.mark.parametrize("precision", PRECISIONS)
def test_whole_model_step_matches_numpy(precision):
    net = transformer.build_transformer(SHAPE)
    x, t = transformer.transformer_data(16, SHAPE, seed=13)
    rng = np.random.default_rng(14)
    weights = {s.name: representable(rng.uniform(-1, 1, s.shape) * np.sqrt(6 / (s.fan_in + s.fan_out))
                                     if s.init == "glorot" else np.full(s.shape, 1.0 if s.init == "ones" else 0.0),
                                     precision) for s in net.param_specs()}
    cpu = run_network(net, x, t, precision="fp32", weights=weights)
    gpu = run_network(net, x, t, device="cuda", precision=precision, weights=weights)
    grads = lambda r: {k: v for k, v in r.items() if k.startswith("grad:")}   # noqa: E731
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=ATTENTION_TOLERANCE)
    assert_close(grads(gpu), grads(cpu), 0.1 if precision == "bf16" else 5e-2)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_captured_replay_equals_eager(precision):
    """The same training run eagerly, one step per graph and eight per graph: the same epoch losses."""
    net = transformer.build_transformer(SHAPE)
    x, t = transformer.transformer_data(128, SHAPE, seed=15)
    losses = losses_by_graph_group(net, x, t, 16, precision, (0, 1, 8), epochs=3)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    np.testing.assert_allclose(losses[8], losses[0], rtol=1e-6)
    assert losses[0][-1] < losses[0][0]


def test_steady_state_allocates_nothing():
    net = transformer.build_transformer(SHAPE)
    x, t = transformer.transformer_data(64, SHAPE, seed=16)
    assert_steady_state_allocates_nothing(net, x, t, 16, [EngineConfig(precision=p, cuda_graph=g)
                                                          for p in PRECISIONS for g in (0, 8)])
