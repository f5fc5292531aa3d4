"""ops/plan_pool.py on the CPU tier: which graph definitions can travel to a worker, and the batch norms'
definitions, now module functions over buffer specs, define the tensors in the order their uids follow."""
from __future__ import annotations

import functools
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from gpuengine.ops import cudnn, cudnn_batchnorm, plan_pool
from gpuengine.layers.geometry import Window
from gpuengine.ops.cudnn import TensorSpec

FRONTEND = SimpleNamespace(data_type=SimpleNamespace(FLOAT="float", BFLOAT16="bf16", BOOLEAN="bool"))


@pytest.fixture
def no_frontend(monkeypatch):
    """The frontend's data types without the frontend (the CPU tier has none)."""
    for module in (cudnn, cudnn_batchnorm):
        monkeypatch.setattr(module, "_cudnn", lambda: FRONTEND)


class Recorder:
    """A stand-in frontend graph: every tensor and op it is asked for, in order."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        def make(*args, **kwargs):
            self.calls.append((op, kwargs.get("name")))
            count = {"batchnorm": 5, "batchnorm_backward": 3}.get(op, 1)
            outs = [Tensor() for _ in range(count)]
            return outs[0] if count == 1 else outs
        return make


class Tensor:
    def __getattr__(self, name):
        return lambda *args, **kwargs: self


def specs(shape=(2, 4, 4, 16), dtype=np.float32, **extra) -> dict:
    act, vec = np.zeros(shape, dtype), np.zeros(shape[-1], np.float32)
    found = {name: act for name in ("x", "y")} | {name: vec for name in ("scale", "bias", "running_mean",
                                                                        "running_var", "saved_mean", "saved_inv_std")}
    return {name: TensorSpec.of(a) for name, a in (found | extra).items()}


def test_a_batch_norm_definition_travels_and_a_closure_does_not():
    define = functools.partial(cudnn_batchnorm._forward_graph, specs=specs(), scalars=("epsilon", "momentum"),
                               relu=True)
    assert plan_pool.picklable(define) and pickle.loads(pickle.dumps(define)).keywords["relu"] is True
    local = 3
    assert not plan_pool.picklable(lambda g: local)


def test_the_forward_defines_its_tensors_in_the_order_of_its_buffers(no_frontend):
    mask = np.zeros((2, 4, 4, 2), np.uint8)
    g = Recorder()
    cudnn_batchnorm._forward_graph(g, specs(residual=np.zeros((2, 4, 4, 16), np.float32), mask=mask),
                                   ("epsilon", "momentum", "zero"), relu=True)
    tensors = [name for op, name in g.calls if op == "tensor"]
    assert tensors == ["x", "scale", "bias", "running_mean", "running_var", "residual", "epsilon", "momentum", "zero"]
    assert [op for op, _ in g.calls if op != "tensor"] == ["batchnorm", "add", "relu", "cmp_gt"]


def test_the_backward_defines_its_tensors_in_the_order_of_its_buffers(no_frontend):
    g = Recorder()
    cudnn_batchnorm._backward_graph(g, specs(dy=np.zeros((2, 4, 4, 16), np.float32),
                                             dx=np.zeros((2, 4, 4, 16), np.float32),
                                             dscale=np.zeros(16, np.float32), dbias=np.zeros(16, np.float32)))
    assert [name for op, name in g.calls if op == "tensor"] == ["dy", "x", "scale", "saved_mean", "saved_inv_std",
                                                                 "y"]
    assert [op for op, _ in g.calls if op != "tensor"] == ["relu_backward", "batchnorm_backward"]


def test_the_convolutions_define_their_tensors_in_the_order_of_their_buffers_and_travel(no_frontend):
    window = Window((8, 8), (3, 3), (1, 1), (1, 1, 1, 1))
    act, w = np.zeros((2, 8, 8, 16), np.float32), np.zeros((32, 3, 3, 16), np.float32)
    fprop = functools.partial(cudnn._conv_graph, specs={name: TensorSpec.of(a) for name, a in
                                                        {"x": act, "w": w, "y": act, "bias": act[0, 0, 0]}.items()},
                              window=window, relu=True)
    wgrad = functools.partial(cudnn._op_graph, specs={name: TensorSpec.of(a) for name, a in
                                                      {"x": act, "dy": act, "dw": w}.items()},
                              window=window, op="conv_wgrad", args=(("image", "x"), ("loss", "dy")), out="dw")
    for define, tensors, ops in ((fprop, ["x", "w", "bias"], ["conv_fprop", "bias", "relu"]),
                                 (wgrad, ["x", "dy"], ["conv_wgrad"])):
        assert plan_pool.picklable(define)
        g = Recorder()
        pickle.loads(pickle.dumps(define))(g)
        assert [name for op, name in g.calls if op == "tensor"] == tensors
        assert [op for op, _ in g.calls if op != "tensor"] == ops
