"""cuDNN frontend graphs of batch normalization (training), with the fusions seed note 002 used.

Forward: y = [relu]( BN(x) [+ residual] ), the running mean and variance
updated in place (the graph's in- and out-running statistics are one buffer)
and the batch mean and inverse standard deviation saved for backward.
Backward: dz = [relu'](dy), then BN's data, scale and shift gradients; dz
itself is a graph output when a residual input needs it (the gradient of an
add reaches both addends). cuDNN fuses the ReLU's gradient into the BN
backward only in the form its fused engines know (the frontend's
DRELU_DBN / DRELU_DADD_DBN cases): the forward writes a bit mask of y > 0
(one bit per channel, C/8 bytes per pixel) and the backward multiplies dy by
it; a backward that reads y instead finds no engine (measured on an H100:
every ResNet-50 layer fell back to a separate ReLU-gradient kernel). cuDNN
docs, "Normalizations: Batchnorm Forward/Backward", and the frontend's
samples. Where cuDNN has no fused engine for a variant, `CudnnUnsupported`
tells the layer to run the unfused graph and do the add/ReLU in its own kernel.

Epsilon and momentum are pass-by-value scalars: the graph reads them from host
memory that lives as long as the bound graph.
"""
from __future__ import annotations

import functools

import numpy as np

from .cudnn import BoundGraph, TensorSpec, _cudnn, _data_type, graph_key


_SCALAR = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1])


def mask_shape(x_shape) -> tuple:
    """The ReLU bit mask's buffer for an NHWC map: one bit per channel, 8 channels a byte."""
    n, h, w, c = x_shape
    if c % 8:
        raise ValueError(f"a ReLU bit mask packs 8 channels a byte; {c} channels is not a multiple of 8")
    return (n, h, w, c // 8)


def _mask_layout(spec: TensorSpec) -> tuple[list, list]:
    """(dim, stride) of cuDNN's view of the bit mask (its uint8 buffer's (N, C/8, H, W) spec): the logical
    (N, C, H, W) map of booleans, NHWC-packed."""
    n, c8, h, w = spec.dims
    c = 8 * c8
    return [n, c, h, w], [h * w * c, 1, w * c, c]


def _mask_tensor(g, spec: TensorSpec):
    dim, stride = _mask_layout(spec)
    return g.tensor(name="mask", dim=dim, stride=stride, data_type=_cudnn().data_type.BOOLEAN)


def _zero_of(dtype) -> np.ndarray:
    """A host zero of the output's type for the mask's comparison (all bits zero in float32 and bfloat16)."""
    return np.zeros(1, np.float32 if np.dtype(dtype) == np.float32 else np.uint16)


def _host_scalars(**values: float) -> dict:
    """Pass-by-value float32 scalars (epsilon, momentum) as host arrays the bound graph keeps alive."""
    return {name: np.array([value], np.float32) for name, value in values.items()}


def batchnorm_forward(runtime, precision: str, x, scale, bias, running_mean, running_var, y, saved_mean,
                      saved_inv_std, epsilon: float, momentum: float, residual=None, relu: bool = False,
                      mask=None, allocator=None) -> BoundGraph:
    """One graph: BN training forward [+ residual] [+ ReLU] into y; running statistics updated in place.

    `mask` (with `relu`): a uint8 buffer of `mask_shape(x.shape)` that gets the bits of y > 0.
    """
    if mask is not None and not relu:
        raise ValueError("a ReLU bit mask needs relu=True")
    inputs = {"x": x, "scale": scale, "bias": bias, "running_mean": running_mean, "running_var": running_var}
    if residual is not None:
        inputs["residual"] = residual
    outputs = {"y": y, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std}
    scalars = _host_scalars(epsilon=epsilon, momentum=momentum)
    if mask is not None:
        outputs["mask"] = mask
        scalars["zero"] = _zero_of(y.dtype)

    specs = {name: TensorSpec.of(a) for name, a in (inputs | outputs).items()}
    define = functools.partial(_forward_graph, specs=specs, scalars=tuple(scalars), relu=relu)
    buffers = inputs | outputs | {"next_running_mean": running_mean, "next_running_var": running_var}
    scalar_key = tuple((name, float(a[0])) for name, a in sorted(scalars.items()) if name != "zero")
    key = graph_key("batchnorm_fwd", precision, None, **inputs, **outputs) + (("relu", relu),) + scalar_key
    graph = runtime.graph(key, x.dtype, precision, define)
    return BoundGraph(runtime, graph, buffers, allocator, host_scalars=scalars, preserve=(running_mean, running_var))


def batchnorm_backward(runtime, precision: str, dy, x, scale, saved_mean, saved_inv_std, dx, dscale, dbias,
                       y=None, mask=None, dz=None, allocator=None) -> BoundGraph:
    """One graph: [dz = relu'(dy)] -> BN backward into dx, dscale, dbias.

    The forward ended in an activation when `mask` (its bits of where the activation passes the gradient:
    dz = dy * mask) or, for ReLU, `y` (dz = relu'(dy) at y) is given; `dz` given: dz is written out too.
    """
    if y is not None and mask is not None:
        raise ValueError("the ReLU's gradient comes from the mask or from y, not both")
    inputs = {"dy": dy, "x": x, "scale": scale, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std}
    if y is not None:
        inputs["y"] = y
    if mask is not None:
        inputs["mask"] = mask
    outputs = {"dx": dx, "dscale": dscale, "dbias": dbias} | ({"dz": dz} if dz is not None else {})

    buffers = inputs | outputs
    define = functools.partial(_backward_graph, specs={name: TensorSpec.of(a) for name, a in buffers.items()})
    graph = runtime.graph(graph_key("batchnorm_bwd", precision, None, **buffers), dy.dtype, precision, define)
    return BoundGraph(runtime, graph, buffers, allocator)


def _forward_graph(g, specs: dict, scalars: tuple, relu: bool) -> dict:
    """batchnorm_forward's graph from its buffers' specs alone (picklable: a worker process can define it too)."""
    io_type = _data_type(specs["y"].dtype)
    inputs = ("x", "scale", "bias", "running_mean", "running_var") + (("residual",) if "residual" in specs else ())
    t = {name: specs[name].make(g, name) for name in inputs}
    t.update({name: g.tensor(name=name, data_type=io_type if name == "zero" else _cudnn().data_type.FLOAT,
                             is_pass_by_value=True, **_SCALAR) for name in scalars})
    out, mean, inv_std, next_mean, next_var = g.batchnorm(
        name="bn", input=t["x"], scale=t["scale"], bias=t["bias"], in_running_mean=t["running_mean"],
        in_running_var=t["running_var"], epsilon=t["epsilon"], momentum=t["momentum"])
    if "residual" in specs:
        out = g.add(name="residual_add", a=out, b=t["residual"])
    if relu:
        out = g.relu(name="relu", input=out)
    specs["y"].mark_output(out)
    bits = None
    if "mask" in specs:
        bits = g.cmp_gt(name="mask", input=out, comparison=t["zero"])
        dim, stride = _mask_layout(specs["mask"])
        bits.set_output(True).set_data_type(_cudnn().data_type.BOOLEAN)
        bits.set_dim(dim).set_stride(stride)
    for name, tensor in (("saved_mean", mean), ("saved_inv_std", inv_std)):
        specs[name].mark_output(tensor)
    # The next running statistics overwrite the previous ones: both names point at one buffer.
    specs["running_mean"].mark_output(next_mean)
    specs["running_var"].mark_output(next_var)
    return t | {"y": out, "saved_mean": mean, "saved_inv_std": inv_std, "next_running_mean": next_mean,
                "next_running_var": next_var} | ({"mask": bits} if bits is not None else {})


def _backward_graph(g, specs: dict) -> dict:
    """batchnorm_backward's graph from its buffers' specs alone (picklable, as _forward_graph)."""
    inputs = [name for name in ("dy", "x", "scale", "saved_mean", "saved_inv_std", "y", "mask") if name in specs]
    t = {name: (_mask_tensor(g, specs[name]) if name == "mask" else specs[name].make(g, name)) for name in inputs}
    grad = t["dy"]
    if "mask" in specs:
        grad = g.mul(name="drelu", a=t["dy"], b=t["mask"])
        grad.set_data_type(_data_type(specs["dy"].dtype))
    if "y" in specs:
        grad = g.relu_backward(name="drelu", loss=t["dy"], input=t["y"])
        grad.set_data_type(_data_type(specs["dy"].dtype))
    if "dz" in specs:
        specs["dz"].mark_output(grad)
    d_x, d_scale, d_bias = g.batchnorm_backward(name="dbn", grad=grad, input=t["x"], scale=t["scale"],
                                                mean=t["saved_mean"], inv_variance=t["saved_inv_std"])
    for name, tensor in (("dx", d_x), ("dscale", d_scale), ("dbias", d_bias)):
        specs[name].mark_output(tensor)
    return t | {"dx": d_x, "dscale": d_scale, "dbias": d_bias} | ({"dz": grad} if "dz" in specs else {})
