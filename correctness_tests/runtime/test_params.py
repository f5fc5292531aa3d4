"""FlatParameters: aligned views, what the constructor books, padding that stays zero, host round trips."""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.runtime.backend import get_backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.params import ALIGN_ELEMENTS, FlatParameters
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)
SHAPE = MLPShape(inputs=7, hidden=13)   # odd sizes: every view but the first needs padding before it


def flat(precision: str = "fp32", training: bool = True) -> FlatParameters:
    backend = get_backend(CPU)
    return FlatParameters(build_mlp(SHAPE).param_specs(), Allocator(backend), policy_for(precision), seed=3,
                          training=training)


def test_every_view_starts_on_an_aligned_offset():
    params = flat()
    offsets = [offset for offset, _, _ in params.offsets.values()]
    assert offsets[0] == 0 and all(o % ALIGN_ELEMENTS == 0 for o in offsets), offsets
    assert params.size % ALIGN_ELEMENTS == 0
    assert params.count == build_mlp(SHAPE).parameter_count() < params.size   # padding exists here


@pytest.mark.parametrize("precision,training", [("fp32", True), ("bf16", True), ("bf16", False)])
def test_planned_bytes_is_what_the_constructor_books(precision, training):
    params = flat(precision, training)
    booked = params.master.nbytes + (params.compute.nbytes if params.compute is not params.master else 0)
    if training:
        booked += params.grad.nbytes + params.moment1.nbytes + params.moment2.nbytes
    assert FlatParameters.planned_bytes(params.specs, params.policy, training) == booked


def test_state_dict_round_trips_through_load():
    params = flat()
    values = {name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)
              for name, (_, _, shape) in params.offsets.items()}
    params.load(values)
    for name, value in params.state_dict().items():
        np.testing.assert_array_equal(value, values[name])


def test_padding_stays_zero_through_training():
    x, t = mlp_data(64, SHAPE)
    trainer = Trainer(build_mlp(SHAPE), x, t, 16, CPU)
    trainer.train(2)
    used = np.zeros(trainer.params.size, bool)
    for offset, size, _ in trainer.params.offsets.values():
        used[offset:offset + size] = True
    for buffer in (trainer.params.master, trainer.params.grad, trainer.params.moment1, trainer.params.moment2):
        assert not np.any(np.asarray(buffer)[~used])
    assert np.any(np.asarray(trainer.params.grad)[used])   # the gradients that matter are not zero


def test_a_wrong_shape_or_name_is_refused_and_changes_nothing():
    params = flat()
    before = params.state_dict()
    good = {name: np.zeros(shape, np.float32) for name, (_, _, shape) in params.offsets.items()}
    name = next(iter(good))
    with pytest.raises(ValueError, match=rf"{name}: shape \(1,\) given"):
        params.load(good | {name: np.zeros(1, np.float32)})
    with pytest.raises(ValueError, match="parameter names differ"):
        params.load(good | {"nope": np.zeros(1, np.float32)})
    for key, value in params.state_dict().items():
        np.testing.assert_array_equal(value, before[key])


def test_inference_parameters_have_no_gradient_views():
    """A layer that asks inference-only parameters for a gradient gets an error naming the parameter."""
    params = flat(training=False)
    with pytest.raises(ValueError, match=r"dense1.weight: these parameters were built for inference"):
        params.grad_view("dense1.weight")
