"""The network graph: what the builder refuses (by name), the summary, and backward through branches.

A diamond (one output read by two branches that an Add joins again) is the
shape of every residual block: its backward must sum the two gradients of the
shared output, checked here against finite differences on the NumPy backend,
together with the order-independence of how the nodes were listed.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from gpuengine.layers import Add, Conv2D, Dense, Flatten, ReLU, Tanh
from gpuengine.losses import MSELoss, SoftmaxCrossEntropy
from gpuengine.model.network import INPUT, Network, NetworkBuilder, NetworkError, Node, Sequential

from ..gradient_check import assert_not_trivial, check_backward, random_weights
from ..layer_harness import run_network


def diamond(order=None) -> Network:
    """x -> a (Dense) -> [b (tanh), c (Dense)] -> add(b, c) -> out (Dense 1), MSE."""
    nodes = [Node("a", Dense(6), (INPUT,)), Node("b", Tanh(), ("a",)), Node("c", Dense(6), ("a",)),
             Node("join", Add(), ("b", "c")), Node("out", Dense(1), ("join",))]
    listed = nodes if order is None else [nodes[i] for i in order]
    return Network(listed, MSELoss(), (4,), output="out")


def diamond_batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 4)), rng.standard_normal((5, 1))


def test_diamond_backward_sums_the_gradients_of_a_shared_output():
    net = diamond()
    x, t = diamond_batch()
    assert_not_trivial(check_backward(net, x, t, random_weights(net.param_specs(), np.random.default_rng(1))))


def test_listing_order_does_not_change_the_network():
    x, t = diamond_batch(2)
    weights = random_weights(diamond().param_specs(), np.random.default_rng(3))
    first = run_network(diamond(), x, t, weights=weights)
    shuffled = run_network(diamond(order=[4, 3, 2, 1, 0]), x, t, weights=weights)
    assert first.keys() == shuffled.keys()
    for key in first:
        np.testing.assert_array_equal(first[key], shuffled[key])


def test_an_input_read_twice_gets_both_gradients():
    """x + x: both addends are the network input's consumer, twice."""
    b = NetworkBuilder((3,))
    h = b.add(Dense(3), INPUT, name="h")
    s = b.add(Add(), h, h, name="double")
    b.add(Dense(1), s, name="out")
    net = b.network(MSELoss())
    x, t = diamond_batch(4)
    x = x[:, :3]
    assert_not_trivial(check_backward(net, x, t, random_weights(net.param_specs(), np.random.default_rng(5))))


@pytest.mark.parametrize("nodes, message", [
    ([Node("a", Dense(2), ("ghost",))], "node 'a' reads 'ghost', which no node produces"),
    ([Node("a", Dense(2), ("b",)), Node("b", Dense(2), ("a",))], "cycle through a, b"),
    ([Node("a", Dense(2), (INPUT,)), Node("a", Dense(2), ("a",))], "two nodes are named 'a'"),
    ([Node("a", Add(), (INPUT,))], "node 'a': Add takes 2 input"),
    ([Node("a", Dense(2), (INPUT,)), Node("unused", Dense(3), (INPUT,)), Node("out", Dense(1), ("a",))],
     "the output of unused never reaches the network output 'out'"),
    ([Node(INPUT, Dense(2), (INPUT,))], "may not be named 'input'"),
])
def test_bad_graphs_are_refused_by_name(nodes, message):
    with pytest.raises(NetworkError, match=message):
        Network(nodes, MSELoss(), (4,))


def test_a_shape_mismatch_names_the_node_and_its_inputs():
    nodes = [Node("a", Dense(3), (INPUT,)), Node("b", Dense(5), (INPUT,)), Node("join", Add(), ("a", "b"))]
    with pytest.raises(NetworkError, match=r"node 'join' \(Add\) cannot take inputs a \(3,\), b \(5,\): "
                                         r"Add needs inputs of one shape"):
        Network(nodes, MSELoss(), (4,))


def test_output_must_be_a_node():
    with pytest.raises(NetworkError, match="output 'nowhere' is not a node"):
        Network([Node("a", Dense(1), (INPUT,))], MSELoss(), (4,), output="nowhere")


@pytest.mark.parametrize("shape", [(-4,), (0,), (), (2.5,), (True,), 8, "8", None])
def test_an_input_shape_that_is_not_whole_numbers_is_refused_by_name(shape):
    """(-4,) was accepted and the summary showed -9 parameters."""
    message = rf"^input_shape={re.escape(repr(shape))} is not accepted; use a tuple of whole numbers >= 1$"
    with pytest.raises(NetworkError, match=message):
        Sequential([Dense(3)], MSELoss(), shape)
    with pytest.raises(NetworkError, match=message):
        NetworkBuilder(shape)


def test_numpy_whole_numbers_and_lists_make_an_input_shape():
    assert Sequential([Dense(3)], MSELoss(), [np.int64(4)]).input_shape == (4,)


@pytest.mark.parametrize("loss", [None, MSELoss, "mse"])
def test_a_loss_that_is_not_one_is_refused_by_name(loss):
    """loss=None was an AttributeError when the trainer built its program."""
    with pytest.raises(NetworkError, match=rf"^loss={re.escape(repr(loss))} is not accepted; use a loss such as "):
        Sequential([Dense(1)], loss, (4,))


def test_a_layer_that_is_not_one_is_refused_by_name():
    with pytest.raises(NetworkError, match=r"^layers\[1\]=<function Tanh at .*> is not accepted; use a Layer instance"):
        Sequential([Dense(3), Tanh], MSELoss(), (4,))
    with pytest.raises(NetworkError, match=r"^node 'a': layer=None is not accepted; use a Layer instance"):
        Network([Node("a", None, (INPUT,))], MSELoss(), (4,))


def test_sequential_is_the_chain_special_case_with_generated_names():
    net = Sequential([Dense(5), ReLU(), Dense(2)], SoftmaxCrossEntropy(), (3,))
    assert [n.name for n in net.nodes] == ["dense1", "activation1", "dense2"]
    assert [n.inputs for n in net.nodes] == [(INPUT,), ("dense1",), ("activation1",)]
    assert net.output_shape == (2,) and net.parameter_count() == 3 * 5 + 5 + 5 * 2 + 2


def test_summary_lists_every_node_with_shapes_and_parameter_counts():
    b = NetworkBuilder((6, 6, 2))
    c = b.add(Conv2D(4, 3, name=""), INPUT, name="conv")
    f = b.add(Flatten(), c, name="flat")
    b.add(Dense(3), f, name="fc")
    text = b.network(SoftmaxCrossEntropy()).summary()
    lines = text.splitlines()
    assert lines[0].split() == ["node", "layer", "inputs", "output", "shape", "params"]
    assert lines[2].split()[:3] == ["conv", "Conv2D", "input"] and lines[2].endswith(f"{4 * 9 * 2 + 4:,}")
    assert "(6, 6, 4)" in lines[2] and "(144,)" in lines[3] and lines[4].endswith(f"{144 * 3 + 3:,}")
    assert lines[-1] == f"parameters: {4 * 9 * 2 + 4 + 144 * 3 + 3:,}"


def test_train_flops_skip_the_input_gradient_of_layers_that_read_only_the_data():
    net = diamond()
    forward = 2 * 4 * 6 + 2 * 6 * 6 + 2 * 6 * 1
    assert net.forward_flops_per_sample() == forward
    assert net.train_flops_per_sample() == 3 * forward - 2 * 4 * 6
