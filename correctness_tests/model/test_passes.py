"""The fusion passes' patterns (model/passes.py), found on networks built on the CPU."""
from __future__ import annotations

import copy

import numpy as np

import pytest

from gpuengine.config import EngineConfig
from gpuengine.layers import (Add, Conv2D, Dense, Dropout, Flatten, LayerNorm, Linear, MaxPool2D, ReLU,
                              SinusoidalPositionalEncoding, Tanh, TokenEmbedding)
from gpuengine.losses import MSELoss, SoftmaxCrossEntropy
from gpuengine.model.network import INPUT, NetworkBuilder, Sequential
from gpuengine.model.passes import (adds_into_layernorms, biases_under_layernorms, biases_under_relus,
                                   pools_over_direct_wgrad, positions_over_embeddings, relus_after_gemms)
from gpuengine.trainer import Trainer
from gpuengine.workloads import transformer
from gpuengine.workloads.cnn import build_cnn

from ..layer_harness import make_context


def _built_layers(net, batch: int = 2) -> dict:
    """Copies of the network's layers, each built forward on the CPU, as a program holds them."""
    ctx = make_context("cpu", "fp32", batch, net.param_specs(), None, net.buffer_specs())
    outputs, layers = {INPUT: np.zeros((batch,) + net.input_shape, np.float32)}, {}
    for node in net.nodes:
        layers[node.name] = copy.copy(node.layer)
        outputs[node.name] = layers[node.name].build_forward(ctx, *(outputs[i] for i in node.inputs))
    return layers


def _net(*layers):
    return Sequential([*layers, Flatten(name="flatten"), Dense(10, name="dense")], SoftmaxCrossEntropy(),
                      (28, 28, 1))


def test_the_seed_cnn_pool_is_read_by_the_direct_weight_gradient_on_a_gpu_only():
    net = build_cnn()
    layers = _built_layers(net)
    assert pools_over_direct_wgrad(net, layers, is_gpu=True) == {"pool"}
    assert pools_over_direct_wgrad(net, layers, is_gpu=False) == set()


def test_a_pool_over_a_relu_layer_is_left_alone():
    net = build_cnn(fused_relu=False)
    assert pools_over_direct_wgrad(net, _built_layers(net), is_gpu=True) == set()


def test_overlapping_or_padded_windows_are_left_alone():
    for pool in (MaxPool2D(3, stride=2, name="pool"), MaxPool2D(2, stride=1, name="pool"),
                 MaxPool2D(3, stride=3, padding="same", name="pool")):
        net = _net(Conv2D(8, 3, padding="same", activation="relu", name="conv"), pool)
        assert pools_over_direct_wgrad(net, _built_layers(net), is_gpu=True) == set(), pool.__dict__


def test_a_pool_over_a_convolution_that_needs_its_input_gradient_is_left_alone():
    net = _net(Conv2D(4, 3, padding="same", name="first"), Conv2D(8, 3, padding="same", activation="relu",
                                                                  name="conv"), MaxPool2D(2, name="pool"))
    assert pools_over_direct_wgrad(net, _built_layers(net), is_gpu=True) == set()


def test_a_convolution_with_many_taps_is_left_alone():
    net = Sequential([Conv2D(8, 5, padding="same", activation="relu", name="conv"), MaxPool2D(2, name="pool"),
                      Flatten(name="flatten"), Dense(10, name="dense")], SoftmaxCrossEntropy(), (28, 28, 3))
    assert pools_over_direct_wgrad(net, _built_layers(net), is_gpu=True) == set()   # 75 taps: cuDNN's wgrad


def test_the_transformers_feed_forward_relus_run_in_their_first_linear_layer():
    found = relus_after_gemms(transformer.build_transformer(transformer.SMOKE_SHAPE))
    assert found == {f"transformer.{side}.layers.0.relu": f"transformer.{side}.layers.0.linear1"
                     for side in ("encoder", "decoder")}


def test_a_relu_over_a_layer_read_elsewhere_or_over_another_activation_is_left_alone():
    shared = Sequential([Dense(8, name="dense"), ReLU(name="relu"), Tanh(name="tanh"), Dense(1, name="out")],
                        MSELoss(), (4,))
    assert relus_after_gemms(shared) == {"relu": "dense"}
    dropped = Sequential([Dense(8, name="dense"), Dropout(0.5, name="drop"), ReLU(name="relu"),
                          Dense(1, name="out")], MSELoss(), (4,))
    assert relus_after_gemms(dropped) == {}


def test_the_feed_forward_relus_sum_their_first_linear_layers_bias_gradient_and_dense_ones_keep_theirs():
    found = biases_under_relus(transformer.build_transformer(transformer.SMOKE_SHAPE))
    assert found == {f"transformer.{side}.layers.0.relu": f"transformer.{side}.layers.0.linear1"
                     for side in ("encoder", "decoder")}
    b = NetworkBuilder((8,))
    relu = b.add(ReLU(), b.add(Dense(8), INPUT, name="dense"), name="relu")
    net = b.network(MSELoss(), b.add(Dense(1), relu, name="out"))
    assert relus_after_gemms(net) == {"relu": "dense"} and biases_under_relus(net) == {}


def test_the_transformers_residual_sums_are_summed_by_their_layernorms():
    found = adds_into_layernorms(transformer.build_transformer(transformer.SMOKE_SHAPE))
    norms = [f"transformer.encoder.layers.0.norm{i}" for i in (1, 2)] + \
        [f"transformer.decoder.layers.0.norm{i}" for i in (1, 2, 3)]
    assert found == {norm: f"{norm}.residual" for norm in norms}   # not the stacks' final norms: no Add below


def test_every_sublayer_of_the_transformer_gets_its_last_bias_gradient_from_the_layernorm_above():
    found = biases_under_layernorms(transformer.build_transformer(transformer.SMOKE_SHAPE))
    encoder, decoder = "transformer.encoder.layers.0", "transformer.decoder.layers.0"
    assert found == {f"{encoder}.norm1": f"{encoder}.self_attn", f"{encoder}.norm2": f"{encoder}.linear2",
                     f"{decoder}.norm1": f"{decoder}.self_attn", f"{decoder}.norm2": f"{decoder}.multihead_attn",
                     f"{decoder}.norm3": f"{decoder}.linear2"}


def test_a_linear_layer_read_beside_the_residual_add_keeps_its_bias_gradient():
    b = NetworkBuilder((4, 8))
    h = b.add(Linear(8), INPUT, name="linear")
    elsewhere = b.add(Tanh(), h, name="elsewhere")   # a second reader: dy is not the LayerNorm's dx alone
    norm = b.add(LayerNorm(), b.add(Add(), INPUT, h, name="residual"), name="norm")
    net = b.network(MSELoss(), b.add(Add(), norm, elsewhere, name="out"))
    assert adds_into_layernorms(net) == {"norm": "residual"} and biases_under_layernorms(net) == {}


def test_each_side_of_the_transformer_adds_its_positions_in_its_embedding():
    found = positions_over_embeddings(transformer.build_transformer(transformer.SMOKE_SHAPE))
    assert found == {"src_pe": "src_embed", "tgt_pe": "tgt_embed"}


def test_an_embedding_read_beside_its_positional_encoding_is_left_alone():
    shape = transformer.SMOKE_SHAPE
    b = NetworkBuilder(shape.input_shape)
    embedded = b.add(TokenEmbedding(shape.vocab, shape.d_model, 0, shape.length), INPUT, name="embed")
    positions = b.add(SinusoidalPositionalEncoding(), embedded, name="pe")
    net = b.network(MSELoss(), b.add(Add(), positions, embedded, name="out"))
    assert positions_over_embeddings(net) == {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_fused_transformer_trains_as_the_unfused_one(precision):
    runs = {}
    for fuse in (True, False):
        net = transformer.build_transformer(transformer.SMOKE_SHAPE)
        x, t = transformer.transformer_data(32, transformer.SMOKE_SHAPE, seed=5)
        trainer = Trainer(net, x, t, 16, EngineConfig(device="cpu", precision=precision), fuse=fuse)
        layers = trainer.program.layers.values()
        relus = [layer for layer in layers if getattr(layer, "applied_by_input", False)]
        sums = [layer for layer in layers if getattr(layer, "summed_by_reader", False)]
        biases = [layer for layer in layers if getattr(layer, "bias_grad_by_reader", False)]
        positions = [layer for layer in layers if getattr(layer, "adds_positions", False)]
        summing = [layer for layer in layers if getattr(layer, "bias_of", None) is not None]   # ReLUs, LayerNorms
        assert (len(relus), len(sums), len(biases), len(positions), len(summing)) == \
            ((2, 5, 7, 2, 7) if fuse else (0, 0, 0, 0, 0))
        runs[fuse] = trainer.train(3)
    assert runs[True] == runs[False]   # the same sums in the same order, on the CPU


def test_an_activation_asked_for_a_bias_gradient_without_its_dx_names_the_problem():
    relu = ReLU(name="relu")
    relu.bias_of = "linear.bias"
    ctx = make_context("cpu", "fp32", 4, [], None)
    relu.build_forward(ctx, ctx.allocator.zeros((4, 8), np.float32, "activations"))
    with pytest.raises(ValueError, match="relu: the gradient of 'linear.bias' is dx's column sum"):
        relu.build_backward(ctx, ctx.allocator.zeros((4, 8), np.float32, "activations"), False)
