"""torch_compile_graph, PyTorch at its strongest: torch_graph's captured step with the model compiled by Inductor.

On the CPU (no CUDA graph can be captured there) the mode is refused like
torch_graph; Inductor's failures make only this mode unavailable; and the
compiled step itself (torch_compile's: the same compiled forward, loss and
backward, without the capture) gives the eager step's first loss and gradients.
On a GPU the captured compiled step does, workload by workload, within the
precision's tolerance, and torch_graph's captured step too: the two graph modes
differ only in whether the model is compiled.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch references cannot run")

from gpuengine.reference import ReferenceUnavailable  # noqa: E402
from gpuengine.reference.torch_cnn import cnn_train_runner  # noqa: E402
from gpuengine.reference.torch_common import GRAPH_MODES, unavailable_if_compiled_capture_fails  # noqa: E402
from gpuengine.reference.torch_mlp import mlp_infer_runner, mlp_train_runner  # noqa: E402
from gpuengine.reference.torch_resnet import resnet_train_runner  # noqa: E402
from gpuengine.reference.torch_transformer import transformer_train_runner  # noqa: E402
from gpuengine.workloads import cnn, mlp, resnet, transformer  # noqa: E402

# Relative error allowed in the first loss and in each parameter's gradient (norm of the difference over the norm).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2}
HAS_CXX = bool(os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++"))
# Inductor needs a C++ compiler on the CPU; without one, AOTAutograd's eager backend still checks the compiled step.
CPU_BACKEND = "inductor" if HAS_CXX else "aot_eager"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def mlp_runner(mode: str, precision: str, device: str, **options):
    x, t = mlp.mlp_data(256, mlp.SMOKE_SHAPE, seed=3)
    return mlp_train_runner(mode, x, t, 64, precision, device=device, hidden=mlp.SMOKE_SHAPE.hidden, seed=2,
                            **options)


def cnn_runner(mode: str, precision: str, device: str, **options):
    x, t = cnn.cnn_data(128, cnn.SMOKE_SHAPE, seed=1)
    return cnn_train_runner(mode, x, t, 32, precision, device=device, shape=cnn.SMOKE_SHAPE, seed=2, **options)


def resnet_runner(mode: str, precision: str, device: str, **options):
    x, t = resnet.resnet_data(64, resnet.SMOKE_SHAPE, seed=1)
    return resnet_train_runner(mode, x, t, 16, precision, device=device, shape=resnet.SMOKE_SHAPE, seed=2,
                               **options)


def transformer_runner(mode: str, precision: str, device: str, **options):
    x, t = transformer.transformer_data(32, transformer.SMOKE_SHAPE, seed=1)
    return transformer_train_runner(mode, x, t, 8, precision, device=device, shape=transformer.SMOKE_SHAPE, seed=2,
                                    **options)


def first_step(build, mode: str, precision: str, device: str, **options):
    runner = build(mode, precision, device, **options)
    runner.prepare()
    return runner, runner.first_step()


def assert_same_first_step(ours, eager, precision: str, what: str):
    (loss, grads), (eager_loss, eager_grads) = ours, eager
    tolerance = TOLERANCE[precision]
    assert np.isfinite(loss) and abs(loss - eager_loss) <= tolerance * abs(eager_loss), \
        f"{what}: first loss {loss} against eager's {eager_loss}"
    assert grads.keys() == eager_grads.keys(), what
    for name, expected in eager_grads.items():
        scale = np.linalg.norm(expected)
        assert scale > 0, f"{what}: eager's {name} gradient is zero, nothing is compared"
        error = np.linalg.norm(grads[name] - expected) / scale
        assert error < tolerance, f"{what}: {name} gradient off eager's by {error:.2e} (relative), over {tolerance:g}"


# -- on the CPU ------------------------------------------------------------------------

def test_compiled_graph_on_cpu_is_refused_clearly():
    x, t = mlp.mlp_data(128, mlp.SMOKE_SHAPE)
    with pytest.raises(ReferenceUnavailable, match="torch_compile_graph captures a torch.cuda.CUDAGraph and needs "
                                                   "device='cuda', not 'cpu'"):
        mlp_train_runner("torch_compile_graph", x, t, 64, "fp32", device="cpu", hidden=mlp.SMOKE_SHAPE.hidden)
    with pytest.raises(ReferenceUnavailable, match="torch_compile_graph captures"):
        mlp_infer_runner("torch_compile_graph", [x[:64]], "fp32", device="cpu", hidden=mlp.SMOKE_SHAPE.hidden)


def test_an_inductor_failure_makes_the_compiled_graph_unavailable_with_the_error():
    failure = RuntimeError("operation not permitted when stream is capturing\n(the rest of a long message)")
    with pytest.raises(ReferenceUnavailable) as caught:
        with unavailable_if_compiled_capture_fails("torch_compile_graph", "torch_compile_graph"):
            raise failure
    assert str(caught.value) == ("torch_compile_graph: Inductor's compiled step could not be warmed up and captured "
                                 "in a CUDA graph here: RuntimeError: operation not permitted when stream is "
                                 "capturing")
    assert caught.value.__cause__ is failure   # the whole error stays in the traceback


@pytest.mark.parametrize("mode", ["torch_graph", "torch_compile", "torch_eager"])
def test_a_failure_of_any_other_mode_stays_a_failure(mode):
    with pytest.raises(RuntimeError, match="capture failed") as caught:
        with unavailable_if_compiled_capture_fails(mode, mode):
            raise RuntimeError("capture failed")
    assert not isinstance(caught.value, ReferenceUnavailable)


@pytest.mark.parametrize("build, precision", [(mlp_runner, "fp32"), (mlp_runner, "bf16"), (cnn_runner, "fp32")],
                         ids=["mlp-fp32", "mlp-bf16", "cnn-fp32"])
def test_the_compiled_step_gives_the_eager_first_loss_and_gradients_on_cpu(build, precision):
    """What torch_compile_graph captures on a GPU, run here without the capture: the model compiled."""
    compiled, compiled_step = first_step(build, "torch_compile", precision, "cpu", compile_backend=CPU_BACKEND,
                                         warmup_steps=1)
    assert compiled.compiled and not compiled.captures
    _, eager_step = first_step(build, "torch_eager", precision, "cpu")
    assert_same_first_step(compiled_step, eager_step, precision, f"torch_compile ({CPU_BACKEND}), {precision}")


@pytest.mark.parametrize("trained", ["a round", "a first step"])
def test_first_step_is_the_first_step_only(trained):
    runner = mlp_runner("torch_eager", "fp32", "cpu")
    runner.prepare()
    if trained == "a round":
        runner.run_round()
    else:
        runner.first_step()
    with pytest.raises(RuntimeError, match="first_step\\(\\) reads the first step of a prepared runner that has "
                                           "trained none; this one has"):
        runner.first_step()


# -- on a GPU --------------------------------------------------------------------------

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_gpu_captured_first_step_matches_eager_mlp(mode, precision):
    """The MLP's step captures compiled: a ReferenceUnavailable here fails the test."""
    runner, step = first_step(mlp_runner, mode, precision, "cuda")
    assert runner.captures and runner.compiled == (mode == "torch_compile_graph")
    _, eager_step = first_step(mlp_runner, "torch_eager", precision, "cuda")
    assert_same_first_step(step, eager_step, precision, f"{mode}, {precision}")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("build, precision", [(cnn_runner, "tf32"), (resnet_runner, "fp32"),
                                              (transformer_runner, "fp32")], ids=["cnn", "resnet", "transformer"])
def test_gpu_captured_compiled_first_step_matches_eager(build, precision):
    """Where Inductor's step cannot be captured for a workload, the reference is unavailable, as the suite says."""
    try:
        _, step = first_step(build, "torch_compile_graph", precision, "cuda")
    except ReferenceUnavailable as exc:
        pytest.skip(f"torch_compile_graph is unavailable for this workload here: {exc}")
    _, eager_step = first_step(build, "torch_eager", precision, "cuda")
    assert_same_first_step(step, eager_step, precision, f"torch_compile_graph, {precision}")
