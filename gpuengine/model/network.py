"""A network as a directed acyclic graph of layers; `Sequential` is its one-line chain.

A node applies one layer to the outputs of earlier nodes, or to the network's
input (named `INPUT`): a residual add reads two, an encoder-decoder's cross
attention reads both stacks. The network's output is one node's output, fed to
the loss. Everything here is description: shapes, parameters and FLOPs per
sample, checked when the network is made, so a wrong graph fails before any
buffer exists; `program.py` wires it onto buffers for one batch size.

Checks, each an error naming the nodes: unknown (dangling) inputs, cycles,
duplicate names, a layer given the wrong number of inputs, nodes whose output
never reaches the network's output, and shapes a layer cannot take (a residual
add of two different shapes); and, naming the argument, an input shape that is
not whole numbers >= 1, a loss that is not one, a layer that is not a Layer. `summary()` prints the graph like Keras'
`Model.summary()` / torchinfo: each node, its inputs, output shape, parameters.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from .. import checks
from ..layers.base import Layer
from ..runtime.params import ParamSpec

INPUT = "input"


class NetworkError(ValueError):
    """The layers do not form a valid network; the message names the nodes (or the argument)."""


LOSS_METHODS = ("build", "forward_backward")   # what a training program calls on a loss


@dataclass(frozen=True)
class Node:
    name: str
    layer: Layer
    inputs: tuple   # names of earlier nodes, or INPUT


class Network:
    """Nodes in any order (sorted here), a loss, the per-sample input shape, and the output node."""

    def __init__(self, nodes: list[Node], loss, input_shape: tuple, output: str | None = None):
        if not nodes:
            raise NetworkError("a network needs at least one layer")
        self.loss = checks.has_methods("loss", loss, LOSS_METHODS, "a loss such as gpuengine.losses.MSELoss() "
                                       "(an object with build() and forward_backward())", NetworkError)
        self.input_shape = checks.shape("input_shape", input_shape, error=NetworkError)
        self._by_name = by_name = self._index(nodes)
        self.output = nodes[-1].name if output is None else output
        if self.output not in by_name:
            raise NetworkError(f"output {self.output!r} is not a node of the network")
        self.nodes = self._sorted(nodes, by_name)
        self._check_all_reach_output()
        self.shapes = {INPUT: self.input_shape}
        for node in self.nodes:
            shapes = [self.shapes[i] for i in node.inputs]
            try:
                self.shapes[node.name] = node.layer.output_shape(*shapes)
            except ValueError as exc:
                raise NetworkError(f"node {node.name!r} ({type(node.layer).__name__}) cannot take inputs "
                                 f"{', '.join(f'{i} {s}' for i, s in zip(node.inputs, shapes))}: {exc}") from exc

    @staticmethod
    def _index(nodes: list[Node]) -> dict[str, Node]:
        by_name: dict[str, Node] = {}
        for node in nodes:
            if not isinstance(node.name, str) or node.name == INPUT or not node.name:
                raise NetworkError(f"a node may not be named {node.name!r}")
            if not isinstance(node.layer, Layer):
                checks.refuse(f"node {node.name!r}: layer", node.layer, "a Layer instance, e.g. Dense(10)",
                              NetworkError)
            if node.name in by_name:
                raise NetworkError(f"two nodes are named {node.name!r}")
            if len(node.inputs) != node.layer.arity:
                raise NetworkError(f"node {node.name!r}: {type(node.layer).__name__} takes {node.layer.arity} "
                                 f"input(s), {len(node.inputs)} given ({', '.join(node.inputs) or 'none'})")
            node.layer.name = node.name   # parameter names derive from the node's name
            by_name[node.name] = node
        for node in nodes:
            dangling = [i for i in node.inputs if i != INPUT and i not in by_name]
            if dangling:
                raise NetworkError(f"node {node.name!r} reads {', '.join(map(repr, dangling))}, which no node produces")
        return by_name

    @staticmethod
    def _sorted(nodes: list[Node], by_name: dict[str, Node]) -> list[Node]:
        """Topological order (Kahn, the earliest-given ready node first: an order that is already
        topological is kept); a cycle is an error naming its nodes."""
        position = {n.name: k for k, n in enumerate(nodes)}
        waiting = {n.name: sum(1 for i in n.inputs if i != INPUT) for n in nodes}
        readers: dict[str, list[str]] = {n.name: [] for n in nodes}
        for node in nodes:
            for i in node.inputs:
                if i != INPUT:
                    readers[i].append(node.name)
        ready = [position[n.name] for n in nodes if waiting[n.name] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            node = nodes[heapq.heappop(ready)]
            order.append(node)
            for reader in readers[node.name]:
                waiting[reader] -= 1
                if waiting[reader] == 0:
                    heapq.heappush(ready, position[reader])
        if len(order) != len(nodes):
            stuck = [n.name for n in nodes if waiting[n.name] > 0]
            raise NetworkError(f"the graph has a cycle through {', '.join(stuck)}")
        return order

    def _check_all_reach_output(self):
        needed, stack = set(), [self.output]
        by_name = {n.name: n for n in self.nodes}
        while stack:
            name = stack.pop()
            if name in needed or name == INPUT:
                continue
            needed.add(name)
            stack.extend(by_name[name].inputs)
        unused = [n.name for n in self.nodes if n.name not in needed]
        if unused:
            raise NetworkError(f"the output of {', '.join(unused)} never reaches the network output {self.output!r}")

    @property
    def output_shape(self) -> tuple:
        return self.shapes[self.output]

    @property
    def target_shape(self) -> tuple:
        """Per-sample target shape: the output's, unless the loss says otherwise (token ids for (T, V) logits)."""
        shape_of = getattr(self.loss, "target_shape", None)
        return self.output_shape if shape_of is None else tuple(shape_of(self.output_shape))

    def check_data(self, x=None, t=None):
        """Host checks of what the layers reading the input, and the loss, read from the data (token ids,
        probability rows); shapes are data/checks.py's. Once at entry, never per step."""
        if x is not None:
            for node in self.nodes:
                if INPUT in node.inputs:
                    node.layer.check_data(x)
        check_targets = getattr(self.loss, "check_targets", None)
        if t is not None and check_targets is not None:
            check_targets(t, self.output_shape)

    def input_shapes(self, node: Node) -> list[tuple]:
        return [self.shapes[i] for i in node.inputs]

    def node(self, name: str) -> Node:
        return self._by_name[name]

    def readers(self, name: str) -> list[Node]:
        """The nodes that read `name`'s output (once per input slot)."""
        return [n for n in self.nodes for i in n.inputs if i == name]

    def param_specs(self) -> list[ParamSpec]:
        return [s for n in self.nodes for s in n.layer.param_specs(*self.input_shapes(n))]

    def buffer_specs(self) -> list[ParamSpec]:
        return [s for n in self.nodes for s in n.layer.buffer_specs(*self.input_shapes(n))]

    def parameter_count(self) -> int:
        return sum(s.size for s in self.param_specs())

    def _flops(self) -> dict[str, int]:
        return {n.name: n.layer.forward_flops(*self.input_shapes(n)) for n in self.nodes}

    def forward_flops_per_sample(self) -> int:
        return sum(self._flops().values())

    def train_flops_per_sample(self) -> int:
        """Forward + weight gradients + input gradients, except where a layer reads only the data (x needs none)."""
        flops = self._flops()
        data_only = sum(flops[n.name] for n in self.nodes if set(n.inputs) == {INPUT})
        return 3 * sum(flops.values()) - data_only

    def chain_tail(self, length: int) -> list[Node] | None:
        """The last `length` nodes when they form a chain ending at the output, each read only by the next."""
        tail = [n for n in self.nodes if n.name == self.output]
        while len(tail) < length:
            (source,) = tail[0].inputs if len(tail[0].inputs) == 1 else (None,)
            if source in (None, INPUT) or len(self.readers(source)) != 1:
                return None
            tail.insert(0, self.node(source))
        return tail

    def summary(self) -> str:
        """One row per node: name, layer, inputs, output shape, parameters; totals last."""
        rows = [("node", "layer", "inputs", "output shape", "params")]
        for n in self.nodes:
            count = sum(s.size for s in n.layer.param_specs(*self.input_shapes(n)))
            rows.append((n.name, type(n.layer).__name__, ", ".join(n.inputs), str(self.shapes[n.name]), f"{count:,}"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                 for r in rows]
        rule = "-" * len(lines[0])
        loss = getattr(self.loss, "name", type(self.loss).__name__)
        return "\n".join([lines[0], rule, *lines[1:], rule,
                          f"input {self.input_shape}, output {self.output!r} {self.output_shape}, loss {loss}",
                          f"parameters: {self.parameter_count():,}"])


def checked_network(net) -> Network:
    """`net` if it is a Network: the first check of the trainer and the predictor."""
    if not isinstance(net, Network):
        checks.refuse("net", net, "a Network: Sequential([...], loss, input_shape) or NetworkBuilder(...).network(loss)")
    return net


class Sequential(Network):
    """A chain: each layer reads the one before it. Unnamed layers are named after their type and position."""

    def __init__(self, layers: list[Layer], loss, input_shape: tuple):
        if not layers:
            raise NetworkError("a network needs at least one layer")
        counts: dict[str, int] = {}
        nodes, previous = [], INPUT
        for k, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                checks.refuse(f"layers[{k}]", layer, "a Layer instance, e.g. Dense(10)", NetworkError)
            if not layer.name:
                prefix = type(layer).__name__.lower()
                counts[prefix] = counts.get(prefix, 0) + 1
                layer.name = f"{prefix}{counts[prefix]}"
            nodes.append(Node(layer.name, layer, (previous,)))
            previous = layer.name
        super().__init__(nodes, loss, input_shape)


class NetworkBuilder:
    """Adds layers one at a time: `x = b.add(Conv2D(...), x, name="conv1")`; `b.network(loss)` finishes."""

    def __init__(self, input_shape: tuple):
        self.input_shape, self.nodes = checks.shape("input_shape", input_shape, error=NetworkError), []

    def add(self, layer: Layer, *inputs: str, name: str) -> str:
        self.nodes.append(Node(name, layer, tuple(inputs)))
        return name

    def network(self, loss, output: str | None = None) -> Network:
        return Network(self.nodes, loss, self.input_shape, output)
