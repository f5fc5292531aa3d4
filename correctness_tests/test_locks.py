"""The committed locks (locks/<tier>.txt, made by `./gate lock`): each says what it is, holds the whole stack of
its tier at exact versions, and the cuda13 lock is the lent GPU image's stack plus the wheels brought to it.

The image's `pip freeze` is locks/constraints/h100-image.txt; what the cuda13 lock
has beyond it is what a GPU session brings (README). A refresh that moves a
package away from the image, or adds one the image lacks, fails here until
this file names it.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from gpuengine.bench import stack_lock
from gpuengine.gate.stack.cli import read_have

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "locks" / "constraints" / "h100-image.txt"
# What every tier installs: the engine's needs, torch, the gate's plugins and the report's plots.
EVERY_TIER = {"numpy", "ml-dtypes", "torch", "pytest", "pytest-benchmark", "pytest-xdist", "nvidia-ml-py", "matplotlib"}
ON_GPU = {"nvidia-cudnn-frontend", "nvmath-python"}
# ruptures (change points) is the CPU lock's only until the GPU locks' next refresh (pyproject.toml says why).
TIER_PACKAGES = {"cpu": EVERY_TIER | {"tensorflow-cpu", "nvidia-cuda-nvrtc", "ruptures"},
                 "cuda13": EVERY_TIER | ON_GPU | {"cupy-cuda13x"},
                 "cuda12": EVERY_TIER | ON_GPU | {"cupy-cuda12x"}}
# The image's registry-less gap: what a GPU session brings as wheels.
BROUGHT_TO_THE_IMAGE = {"nvidia-cudnn-frontend": "1.22.1", "nvmath-python": "1.0.0"}


def lock(tier: str) -> stack_lock.Lock:
    return stack_lock.read_lock(stack_lock.lock_path(tier), tier)


def header(tier: str) -> str:
    """The gate's header: the lock's lines that start with '#' (uv's annotations are indented)."""
    return "".join(line for line in (ROOT / "locks" / f"{tier}.txt").read_text().splitlines(keepends=True)
                   if line.startswith("#"))


@pytest.mark.parametrize("tier, python", [("cpu", "3.11"), ("cuda13", "3.12"), ("cuda12", "3.12")])
def test_each_lock_names_its_tier_python_platform_and_refresh_command(tier, python):
    text = header(tier)
    assert text.startswith(f"# The {tier} tier's locked stack: Python {python}, x86_64-manylinux_2_28, extras ")
    assert f"Made by `./gate lock {tier}" in text
    assert ("uv pip compile pyproject.toml" in text and f"--python-version {python}" in text
            and f"-c locks/constraints/{tier}.txt" in text and f"-o locks/{tier}.txt" in text)


@pytest.mark.parametrize("tier", sorted(TIER_PACKAGES))
def test_each_lock_holds_its_tiers_whole_stack(tier):
    pins = lock(tier).pins   # read_lock holds every line to an exact pin
    assert TIER_PACKAGES[tier] <= set(pins), f"locks/{tier}.txt lacks {TIER_PACKAGES[tier] - set(pins)}"


def test_the_cpu_lock_takes_cpu_torch_and_no_cuda_libraries():
    pins = lock("cpu").pins
    assert Version(pins["torch"]).local == "cpu"
    assert {name for name in pins if name.startswith(("nvidia-", "cuda-", "cupy"))} == {"nvidia-cuda-nvrtc",
                                                                                        "nvidia-ml-py"}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (tf,) = map(Requirement, extras["tf"])
    assert str(tf.specifier) == f"=={pins['tensorflow-cpu']}"   # the tf extra's fixed release


def test_the_cuda13_lock_is_the_gpu_image_plus_the_wheels_brought_to_it():
    pins, image = lock("cuda13").pins, read_have(IMAGE)
    lacking = {name: version for name, version in pins.items() if name not in image}
    assert lacking == BROUGHT_TO_THE_IMAGE
    moved = {name: (version, image[name]) for name, version in pins.items()
             if name in image and Version(version) != Version(image[name])}
    assert moved == {}, f"packages of the cuda13 lock at another version than the image's (lock, image): {moved}"


def test_the_cpu_lock_runs_the_gates_plugins_at_the_gpu_images_releases():
    pins, image = lock("cpu").pins, read_have(IMAGE)
    for name in ("pytest", "pytest-benchmark", "pytest-xdist"):
        assert pins[name] == image[name], name


def test_the_cuda12_lock_takes_cuda_12_builds_only():
    pins = lock("cuda12").pins
    assert "cupy-cuda13x" not in pins and Version(pins["cuda-bindings"]).major == 12
    cuda_libraries = [name for name in pins if name.startswith("nvidia-cu") and name != "nvidia-cudnn-frontend"]
    assert cuda_libraries and all(name.endswith("-cu12") for name in cuda_libraries), cuda_libraries
    assert pins["nvidia-cudnn-frontend"] == lock("cuda13").pins["nvidia-cudnn-frontend"]
