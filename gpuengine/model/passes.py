"""Fusion passes: patterns in a network that a program replaces with one fused kernel.

`tanh_linear_mse_head`: a network ending ... Dense(H) -> tanh -> Dense(1) with
an MSE loss (seed note 000's regression MLP) trains through
`losses/fused_head.py`'s TanhLinearMSEHead, which computes the last two layers,
the loss and their gradients in two passes instead of five kernels; inference
uses its forward pass alone. A pass only finds its pattern: the programs
(`program.py`) decide whether to apply it (`fuse=True`, the default).

`pools_over_direct_wgrad`: a max pool right after a network's first
convolution (seed note 001's CNN), where that convolution's weight gradient
takes the direct kernels (ops/direct_wgrad.py, a GPU only). The two run
forward as one kernel (ops/conv_pool.py) writing only the pooled output and
argmax, the weight-gradient kernel reads the pool's output gradient and
argmax itself, and the pool writes no input gradient: at batch 128 the
convolution's output and its gradient are 6.4 MB each in fp32, written
(cuDNN's convolution 13.6 us, maxpool_backward 8.2 us on an H100) and read
again.

`relus_after_gemms`: a ReLU right after a Dense or Linear layer that nothing
else reads (the Transformer's feed-forward, the zoo's classifiers) runs in
that layer's GEMM epilogue (cuBLASLt's RELU_BIAS): the pre-activation is
never written and the activation kernel never launched. The ReLU keeps its
backward, which reads only its output.

`biases_under_relus`: of those, a ReLU over a Linear layer (the feed-forward's
first) has the Linear's output gradient as its dx, so its backward sums the
Linear's bias gradient as it writes dx (activations.BackwardColumnSum) and
that weight gradient runs without cuBLASLt's bias-gradient kernel, which
reads dx again.

`adds_into_layernorms`: a residual Add that only a LayerNorm reads (the
post-LN Transformer's LayerNorm(x + sublayer(x))) is summed by that
LayerNorm's forward kernel, which writes the sum for its backward as it
starts the statistics: one launch and one read of the sum fewer.

`biases_under_layernorms`: below such an Add, a Linear layer or an attention
that only the Add reads (the feed-forward's second layer, each attention's
output projection) has the LayerNorm's dx as its output gradient, so the
gradient of its last bias is dx's column sum: the LayerNorm's one-launch
backward adds it beside dgamma and dbeta, and that weight gradient runs
without a bias epilogue (cuBLASLt's own bias-gradient kernel, 3 us a launch
on an H200) or column sum.

`positions_over_embeddings`: a positional encoding over a token embedding
that only it reads (each side of the Transformer) is added by the
embedding's forward kernel as it writes each token's row, rounded as the
encoding rounds it: one launch and one read and write of the rows fewer.
"""
from __future__ import annotations

from ..layers.activations import Activation
from ..layers.attention import MultiHeadAttention
from ..layers.conv import Conv2D
from ..layers.dense import Dense
from ..layers.embedding import TokenEmbedding
from ..layers.layernorm import LayerNorm
from ..layers.linear import Linear
from ..layers.merge import Add
from ..layers.pooling import MaxPool2D
from ..layers.positional import SinusoidalPositionalEncoding
from ..losses.fused_head import fits
from ..losses.mse import MSELoss
from ..ops.direct_wgrad import pool_fits
from .network import INPUT, Network, Node


def tanh_linear_mse_head(net: Network) -> list[Node] | None:
    """The nodes Dense(H) -> tanh -> Dense(1) ending `net` as a chain under an MSE loss, else None."""
    if not isinstance(net.loss, MSELoss):
        return None
    tail = net.chain_tail(3)
    if tail is None:
        return None
    prev, act, last = (n.layer for n in tail)
    fused = (isinstance(prev, Dense) and isinstance(act, Activation) and act.kind == "tanh"
             and isinstance(last, Dense) and last.units == 1 and fits(prev.units))
    return tail if fused else None


def pools_over_direct_wgrad(net: Network, layers: dict, is_gpu: bool) -> set[str]:
    """Names of the max pools whose input gradient only a first convolution's direct weight gradient would read,
    among `layers` (the program's, built forward), on a GPU; else none."""
    found = set()
    if not is_gpu:
        return found
    for node in net.nodes:
        pool = layers.get(node.name)
        if not isinstance(pool, MaxPool2D) or len(node.inputs) != 1 or node.inputs[0] == INPUT:
            continue
        below = node.inputs[0]
        conv = layers.get(below)
        if (isinstance(conv, Conv2D) and tuple(net.node(below).inputs) == (INPUT,) and net.readers(below) == [node]
                and conv.takes_direct_wgrad() and pool_fits(pool.window)):
            found.add(node.name)
    return found


def _over_sole_input(net: Network, upper, lower) -> dict[str, str]:
    """{node: the node below it} for every node whose layer passes `upper` and whose one input is a node whose
    layer passes `lower` and that only it reads."""
    found = {}
    for node in net.nodes:
        if not upper(node.layer) or len(node.inputs) != 1 or node.inputs[0] == INPUT:
            continue
        below = net.node(node.inputs[0])
        if lower(below.layer) and net.readers(below.name) == [node]:
            found[node.name] = below.name
    return found


def relus_after_gemms(net: Network) -> dict[str, str]:
    """{ReLU node: the Dense or Linear node below it} for every ReLU whose input layer only it reads."""
    return _over_sole_input(net, lambda layer: isinstance(layer, Activation) and layer.kind == "relu",
                            lambda layer: isinstance(layer, (Dense, Linear)))


def biases_under_relus(net: Network) -> dict[str, str]:
    """{ReLU node: the Linear node below it} of relus_after_gemms: the ReLU's backward sums the Linear's bias
    gradient as it writes dx. Dense layers are left to their own bias gradients (the MLP's and CNN's heads)."""
    return {relu: below for relu, below in relus_after_gemms(net).items() if isinstance(net.node(below).layer, Linear)}


def adds_into_layernorms(net: Network) -> dict[str, str]:
    """{LayerNorm node: the Add node below it} for every LayerNorm whose input is an Add that only it reads."""
    return _over_sole_input(net, lambda layer: isinstance(layer, LayerNorm), lambda layer: isinstance(layer, Add))


def biases_under_layernorms(net: Network) -> dict[str, str]:
    """{LayerNorm node: a Linear or MultiHeadAttention node} for every LayerNorm of adds_into_layernorms whose Add
    has, among its inputs, such a layer that only the Add reads (the first one)."""
    found = {}
    for norm, add in adds_into_layernorms(net).items():
        for below in net.node(add).inputs:
            if (below != INPUT and isinstance(net.node(below).layer, (Linear, MultiHeadAttention))
                    and net.readers(below) == [net.node(add)]):
                found[norm] = below
                break
    return found


def positions_over_embeddings(net: Network) -> dict[str, str]:
    """{positional-encoding node: the TokenEmbedding node below it} for every encoding whose input is an embedding
    that only it reads."""
    return _over_sole_input(net, lambda layer: isinstance(layer, SinusoidalPositionalEncoding),
                            lambda layer: isinstance(layer, TokenEmbedding))
