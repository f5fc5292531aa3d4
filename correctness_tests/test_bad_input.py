"""Bad input gets a clear error of a specific type, and leaves nothing half-written.

Each case asserts the error type (DataError for data and batch sizes,
ConfigError for toggles, ArgumentError for the trainer's and predictor's other
arguments, ValueError otherwise; all are ValueErrors, and ArgumentError is a
TypeError too), that the message names the argument and the value, and that what existed before
is intact: the caller's arrays, a predictor or workspace that refused an input,
weights that refused a load. Trainer checks that can run before allocation do:
a stub allocator that fails on use proves nothing was allocated first.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from gpuengine.checks import ArgumentError
from gpuengine.config import ConfigError, EngineConfig
from gpuengine.data.checks import DataError
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.optim import Adam
from gpuengine.runtime.backend import GIB, Backend, gpu_visible
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.params import FlatParameters
from gpuengine.runtime.precision import policy_for
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data

SHAPE = MLPShape(inputs=8, hidden=16)
SAMPLES = 200
CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)


@pytest.fixture
def data():
    return mlp_data(SAMPLES, SHAPE, seed=0)


@pytest.fixture
def no_allocation(monkeypatch):
    """Any device allocation fails loudly: a check that raised its own error ran before allocating."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("allocated before validating")
    monkeypatch.setattr(Allocator, "zeros", refuse)


def test_error_types_are_value_errors():
    assert issubclass(DataError, ValueError) and issubclass(ConfigError, ValueError)


def refused_trainer(x, t, batch, config=CPU, error=DataError, match=""):
    """Trainer construction fails with `error`; the caller's arrays are untouched."""
    x_before, t_before = x.copy(), t.copy()
    with pytest.raises(error, match=match):
        Trainer(build_mlp(SHAPE), x, t, batch, config)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(t, t_before)


# -- training data and batch sizes -----------------------------------------------------

def test_wrong_input_width(data, no_allocation):
    x, t = data
    refused_trainer(x[:, :7], t, 10, match=r"inputs have per-sample shape \(7,\), the network expects \(8,\)")


def test_wrong_target_width(data, no_allocation):
    x, t = data
    refused_trainer(x, np.hstack([t, t]), 10, match=r"targets have per-sample shape \(2,\), the network expects \(1,\)")


def test_targets_count_mismatch(data, no_allocation):
    x, t = data
    refused_trainer(x, t[:-1], 10, match=f"{SAMPLES} input samples but {SAMPLES - 1} targets")


@pytest.mark.parametrize("batch,match", [(0, "batch size must be >= 1, got 0"),
                                         (-5, "batch size must be >= 1, got -5"),
                                         (True, "batch size must be a whole number, got True"),
                                         (16.0, "batch size must be a whole number, got 16.0"),
                                         ("16", "batch size must be a whole number, got '16'"),
                                         (SAMPLES + 1, f"batch size {SAMPLES + 1} is larger than the data set "
                                                       f"\\({SAMPLES} samples\\)")])
def test_bad_batch_size(data, no_allocation, batch, match):
    x, t = data
    refused_trainer(x, t, batch, match=match)


def test_numpy_integer_batch_and_whole_data_set_batch_are_accepted(data):
    x, t = data
    assert Trainer(build_mlp(SHAPE), x, t, np.int64(SAMPLES), CPU).steps_per_epoch == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["inputs", "targets"])
def test_non_finite_data(data, no_allocation, bad, where):
    x, t = data
    x, t = x.copy(), t.copy()
    (x if where == "inputs" else t)[37, 0] = bad
    refused_trainer(x, t, 10, match=rf"{where} contain NaN or inf \(first at index \(37, 0\)\)")


def test_non_numeric_inputs(data, no_allocation):
    x, t = data
    refused_trainer(x.astype(str), t, 10, match="inputs must be numeric, got dtype <U")
    refused_trainer(x > 0, t, 10, match="inputs must be numeric, got dtype bool")


def test_inputs_without_a_sample_axis(no_allocation):
    refused_trainer(np.zeros(SHAPE.inputs), np.zeros(1), 1, match=r"per-sample shape \(\)")


# -- toggles ---------------------------------------------------------------------------

BAD_TOGGLES = [("precision", "fp16", "use one of fp32, tf32, bf16"),
               ("precision", "", "use one of fp32, tf32, bf16"),
               ("cuda_graph", "-1", "use a whole number from 0 to 1024"),
               ("cuda_graph", "two", "use a whole number from 0 to 1024"),
               ("cuda_graph", "1.5", "use a whole number from 0 to 1024"),
               ("cuda_graph", "1025", "use a whole number from 0 to 1024"),
               ("cuda_graph", "99999999999999999999", "use a whole number from 0 to 1024"),   # named a folder once
               ("resident_data", "maybe", "use one of 0, 1, true, false"),
               ("batch_pool", "0", "use a whole number from 1 to 2"),
               ("batch_pool", "3", "use a whole number from 1 to 2"),
               ("plan_workers", "-1", "use a whole number from 0 to 32"),
               ("plan_workers", "33", "use a whole number from 0 to 32"),
               ("profile", "2", "use one of 0, 1, true, false"),
               ("batchnorm", "apex", "use one of cudnn, engine, auto"),
               ("bias_grad", "atomic", "use one of auto, sum, epilogue"),
               ("device", "tpu", "use one of cuda, cpu"),
               ("vram_cap_gib", "0", "use a positive number of GiB, or 'full'"),
               ("vram_cap_gib", "-2", "use a positive number of GiB, or 'full'"),
               ("vram_cap_gib", "inf", "use a positive number of GiB, or 'full'"),
               ("vram_cap_gib", "nan", "use a positive number of GiB, or 'full'"),
               ("vram_cap_gib", "six", "use a positive number of GiB, or 'full'")]


@pytest.mark.parametrize("toggle,raw,accepted", BAD_TOGGLES)
def test_bad_toggle_value_in_code(toggle, raw, accepted):
    with pytest.raises(ConfigError, match=f"^{toggle}={raw!r} is not accepted; {accepted}$"):
        EngineConfig(**{toggle: raw})


@pytest.mark.parametrize("toggle,raw,accepted", [t for t in BAD_TOGGLES if t[1] != ""])   # "" in env = unset
def test_bad_toggle_value_in_the_environment_names_the_variable(toggle, raw, accepted):
    variable = f"GPUENGINE_{toggle.upper()}"
    with pytest.raises(ConfigError, match=f"^{variable}={raw!r} is not accepted; {accepted}$"):
        EngineConfig.from_env(environ={variable: raw})


def test_a_bad_variable_is_refused_even_where_an_override_replaces_it():
    with pytest.raises(ConfigError, match="^GPUENGINE_CUDA_GRAPH='5000' is not accepted"):
        EngineConfig.from_env(environ={"GPUENGINE_CUDA_GRAPH": "5000"}, cuda_graph=2)


@pytest.mark.parametrize("toggle,value", [("cuda_graph", 0), ("cuda_graph", 1024), ("batch_pool", 1),
                                          ("batch_pool", 2)])
def test_the_ends_of_the_whole_number_ranges_are_accepted(toggle, value):
    assert getattr(EngineConfig(**{toggle: value}), toggle) == value
    assert getattr(EngineConfig.from_env(environ={f"GPUENGINE_{toggle.upper()}": str(value)}), toggle) == value


@pytest.mark.parametrize("toggle,raw", [("cuda_graph", True), ("cuda_graph", 2.0), ("batch_pool", False),
                                        ("resident_data", 2), ("precision", None)])
def test_bad_toggle_types_in_code(toggle, raw):
    with pytest.raises(ConfigError, match=f"^{toggle}={raw!r} is not accepted"):
        EngineConfig(**{toggle: raw})


def test_bad_value_through_replace_leaves_the_original():
    with pytest.raises(ConfigError, match="precision='fp8' is not accepted"):
        CPU.replace(precision="fp8")
    assert CPU.precision == "fp32"


def test_unknown_toggle_name():
    with pytest.raises(ConfigError, match=r"unknown toggle 'presicion'; the toggles are batch_pool, batchnorm, "
                                          "bias_grad, cuda_graph, "):
        EngineConfig.from_env(environ={}, presicion="bf16")
    with pytest.raises(ConfigError, match=r"unknown toggle\(s\) \['graphs'\]; the toggles are precision, cuda_graph"):
        CPU.replace(graphs=2)

@pytest.mark.skipif(gpu_visible(), reason="a CUDA GPU is visible here")
def test_cuda_device_without_a_gpu(data, no_allocation):
    x, t = data
    refused_trainer(x, t, 10, CPU.replace(device="cuda"), ConfigError, match="device='cuda' but no CUDA GPU is visible")
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        Predictor(build_mlp(SHAPE), CPU.replace(device="cuda"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_vram_cap_smaller_than_the_model(data, no_allocation, precision):
    x, t = data
    # fp32 master, gradient and two moments: 16 bytes a (64-aligned) slot; bf16 adds its 2-byte compute copy.
    padded = FlatParameters.layout(build_mlp(SHAPE).param_specs())[1]
    needed = padded * (16 + (2 if precision == "bf16" else 0))
    cap = (needed - 1) / GIB   # one byte short
    config = CPU.replace(precision=precision, vram_cap_gib=cap)
    refused_trainer(x, t, 10, config, ConfigError,
                    match=rf"vram_cap_gib={cap} \({needed - 1} bytes\) is smaller than the model: .* {needed} bytes")


def test_vram_cap_that_holds_the_model_is_accepted(data):
    x, t = data
    needed = FlatParameters.planned_bytes(build_mlp(SHAPE).param_specs(), policy_for("bf16"))
    trainer = Trainer(build_mlp(SHAPE), x, t, 10, CPU.replace(precision="bf16", vram_cap_gib=needed / GIB))
    booked = trainer.memory_report()
    assert booked["parameters"] + booked["gradients"] + booked["optimizer"] == needed


def test_bad_epoch_count_changes_nothing(data):
    x, t = data
    trainer = Trainer(build_mlp(SHAPE), x, t, 10, CPU)
    before = trainer.params.state_dict()
    with pytest.raises(ValueError, match=r"^epochs=0 is not accepted; use a whole number >= 1$"):
        trainer.train(0)
    assert trainer.steps_done == 0 and trainer.state.read_step() == 0 and not trainer.warmed_up
    for name, value in trainer.params.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_non_positive_learning_rate(data):
    x, t = data
    with pytest.raises(ValueError, match=r"^lr=0.0 is not accepted; use a finite number > 0.0$"):
        Trainer(build_mlp(SHAPE), x, t, 10, CPU, lr=0.0)


# -- the trainer's other arguments -----------------------------------------------------

def refused_argument(data, match: str, **kwargs):
    x, t = data
    with pytest.raises(ArgumentError, match=match):
        Trainer(kwargs.pop("net", build_mlp(SHAPE)), x, t, 10, kwargs.pop("config", CPU), **kwargs)


@pytest.mark.parametrize("lr", [math.inf, -math.inf, math.nan, -1e-3, "1e-3", None])
def test_a_learning_rate_that_is_not_a_finite_positive_number(data, no_allocation, lr):
    """lr=inf was accepted and every loss came back NaN."""
    refused_argument(data, rf"^lr={re.escape(repr(lr))} is not accepted; use a finite number > 0.0$", lr=lr)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None])
def test_a_seed_that_is_not_a_whole_number_from_zero(data, no_allocation, seed):
    """seed=-1 gave NumPy's 'expected non-negative integer', naming no argument."""
    refused_argument(data, rf"^seed={re.escape(repr(seed))} is not accepted; use a whole number >= 0$", seed=seed)
    with pytest.raises(ArgumentError, match=rf"^seed={re.escape(repr(seed))} is not accepted"):
        Predictor(build_mlp(SHAPE), CPU, seed=seed)


@pytest.mark.parametrize("kwargs, match", [
    (dict(net=None), r"^net=None is not accepted; use a Network: Sequential\(\[...\], loss, input_shape\)"),
    (dict(config={"device": "cpu"}), r"^config=\{'device': 'cpu'\} is not accepted; use an EngineConfig, or None"),
    (dict(fuse="yes"), r"^fuse='yes' is not accepted; use True or False$"),
    (dict(step_hook=3), r"^step_hook=3 is not accepted; use a callable or None$"),
])
def test_a_network_config_or_switch_of_the_wrong_kind(data, no_allocation, kwargs, match):
    error = ConfigError if "config" in kwargs else ArgumentError
    x, t = data
    with pytest.raises(error, match=match):
        Trainer(kwargs.pop("net", build_mlp(SHAPE)), x, t, 10, kwargs.pop("config", CPU), **kwargs)


@pytest.mark.parametrize("epochs", [1.5, "2", None, -1, True])
def test_an_epoch_count_that_is_not_a_whole_number(data, epochs):
    """epochs=1.5 and '2' were raw TypeErrors from range() and '<'; both error types still catch the new one."""
    x, t = data
    trainer = Trainer(build_mlp(SHAPE), x, t, 10, CPU)
    given = re.escape(repr(epochs))
    for error in (ValueError, TypeError):
        with pytest.raises(error, match=rf"^epochs={given} is not accepted; use a whole number >= 1$"):
            trainer.train(epochs)
    with pytest.raises(ArgumentError, match=rf"^epochs={given} is not accepted"):
        trainer.run_epochs(epochs)
    assert trainer.steps_done == 0 and not trainer.warmed_up


@pytest.mark.parametrize("kwargs, match", [
    (dict(betas=(0.9, 1.0)), r"^betas\[1\]=1.0 is not accepted; use a finite number >= 0.0 and < 1.0$"),
    (dict(betas=0.9), r"^betas=0.9 is not accepted; use a pair \(b1, b2\)"),
    (dict(eps=0.0), r"^eps=0.0 is not accepted; use a finite number > 0.0$")])
def test_adam_betas_and_eps_are_checked(data, kwargs, match):
    x, t = data
    trainer = Trainer(build_mlp(SHAPE), x, t, 10, CPU)
    with pytest.raises(ArgumentError, match=match):
        Adam(trainer.backend, trainer.allocator, trainer.params, trainer.state, **kwargs)


# -- inference -------------------------------------------------------------------------

@pytest.fixture
def predictor():
    return Predictor(build_mlp(SHAPE), CPU, seed=1)


@pytest.mark.parametrize("bad,match", [(np.zeros((4, 7), np.float32), r"per-sample shape \(7,\), the network expects"),
                                       (np.full((4, 8), np.nan, np.float32), "inputs contain NaN or inf"),
                                       (np.zeros((0, 8), np.float32), "predict\\(\\) got 0 samples")])
def test_failed_predict_leaves_the_predictor_usable(predictor, bad, match):
    x = np.random.default_rng(2).uniform(-1, 1, (5, SHAPE.inputs)).astype(np.float32)
    expected = predictor.predict(x)
    with pytest.raises(DataError, match=match):
        predictor.predict(bad)
    np.testing.assert_array_equal(predictor.predict(x), expected)


@pytest.mark.parametrize("batch", [0, -1, True, 2.5])
def test_bad_workspace_batch(predictor, batch):
    with pytest.raises(DataError, match=f"batch size must be a whole number >= 1, got {batch!r}"):
        ResidentPredictor(predictor, batch)


def test_predictor_arguments_of_the_wrong_kind(predictor):
    with pytest.raises(ArgumentError, match=r"^net=None is not accepted; use a Network"):
        Predictor(None, CPU)
    with pytest.raises(ArgumentError, match=r"^params=\{\} is not accepted; use FlatParameters"):
        Predictor(build_mlp(SHAPE), CPU, params={})
    with pytest.raises(ArgumentError, match=r"^predictor=None is not accepted; use a Predictor$"):
        ResidentPredictor(None, 4)
    with pytest.raises(ArgumentError, match=r"^capture='no' is not accepted; use True or False$"):
        ResidentPredictor(predictor, 4, capture="no")


def test_failed_workspace_load_leaves_its_input_and_output(predictor):
    workspace = ResidentPredictor(predictor, 4)
    x = np.random.default_rng(3).uniform(-1, 1, (4, SHAPE.inputs)).astype(np.float32)
    workspace.load(x)
    expected = workspace.run().copy()
    for bad in (np.zeros((5, SHAPE.inputs), np.float32), np.zeros((4, SHAPE.inputs + 1), np.float32)):
        with pytest.raises(DataError, match=r"input batch has shape .*, this workspace takes \(4, 8\)"):
            workspace.load(bad)
    np.testing.assert_array_equal(workspace.input, x)
    np.testing.assert_array_equal(workspace.run(), expected)


def test_parameters_of_another_precision(predictor):
    with pytest.raises(ValueError, match="parameters were built for precision fp32, the predictor runs bf16"):
        Predictor(predictor.net, CPU.replace(precision="bf16"), params=predictor.params)


# -- parameter loads -------------------------------------------------------------------

@pytest.fixture
def bf16_params():
    """bf16 has a compute copy next to the masters: a load must leave both or write both."""
    backend = Backend("cpu")
    return FlatParameters(build_mlp(SHAPE).param_specs(), Allocator(backend), policy_for("bf16"), seed=4)


def new_values(params) -> dict:
    return {name: value + 1.0 for name, value in params.state_dict().items()}


def assert_untouched(params, masters: dict, compute: np.ndarray):
    for name, value in params.state_dict().items():
        np.testing.assert_array_equal(value, masters[name], err_msg=name)
    np.testing.assert_array_equal(params.compute, compute)


def test_load_with_a_wrong_shape_writes_nothing(bf16_params):
    masters, compute = bf16_params.state_dict(), bf16_params.compute.copy()
    values = new_values(bf16_params)
    last = bf16_params.specs[-1].name    # the earlier names are valid and would be written first
    values[last] = np.zeros((2,) + values[last].shape)
    with pytest.raises(ValueError, match=rf"{last}: shape \(2, 1\) given, \(1,\) expected"):
        bf16_params.load(values)
    assert_untouched(bf16_params, masters, compute)


@pytest.mark.parametrize("drop,add,match", [("dense1.bias", None, r"missing \['dense1.bias'\], unknown \[\]"),
                                            (None, "dense3.weight", r"missing \[\], unknown \['dense3.weight'\]")])
def test_load_with_wrong_names_writes_nothing(bf16_params, drop, add, match):
    masters, compute = bf16_params.state_dict(), bf16_params.compute.copy()
    values = new_values(bf16_params)
    values.pop(drop, None)
    if add:
        values[add] = np.zeros((1, 1))
    with pytest.raises(ValueError, match=f"parameter names differ: {match}"):
        bf16_params.load(values)
    assert_untouched(bf16_params, masters, compute)


def test_a_good_load_writes_masters_and_the_compute_copy(bf16_params):
    values = new_values(bf16_params)
    bf16_params.load(values)
    for name, value in values.items():
        np.testing.assert_array_equal(bf16_params.master_view(name), value.astype(np.float32))
        np.testing.assert_array_equal(bf16_params.compute_view(name), value.astype(bf16_params.compute.dtype))
