"""What the gate installs on which machine, and tox.ini's environments against it.

`./gate extras` prints the extras the gate installs here (the same choice as
`./gate test` makes); with a stand-in `nvidia-smi` first on PATH the choice
is checked for a machine without a GPU and for CUDA 12 and 13 drivers. tox's
`cpu` env must install what the gate's CPU tier does, and the perf envs must
leave the stack to the gate (no CUDA extra named for a machine that has no GPU).
"""
from __future__ import annotations

import configparser
import importlib.metadata
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpuengine.reference import tf_common

ROOT = Path(__file__).resolve().parents[1]
CPU_TIER = {"torch", "test", "report", "kernelcheck", "tf"}

NO_GPU = "#!/bin/sh\nexit 9\n"   # as where no driver answers
GPU = """#!/bin/sh
if [ "$1" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; exit 0; fi
echo "| NVIDIA-SMI 580.00    Driver Version: 580.00    CUDA Version: {cuda}     |"
"""


def gate_extras(tmp_path: Path, nvidia_smi: str) -> set[str]:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(nvidia_smi)
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run([str(ROOT / "gate"), "extras"], env=env, capture_output=True, text=True, check=True)
    return set(out.stdout.strip().split(","))


def optional_dependencies() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def tox_ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def listed(value: str) -> set[str]:
    return {part.strip() for line in value.splitlines() for part in line.split(",") if part.strip()}


@pytest.mark.parametrize("nvidia_smi, expected", [
    (NO_GPU, CPU_TIER),
    (GPU.format(cuda="12.8"), {"cuda12", "torch", "test", "report"}),
    (GPU.format(cuda="13.0"), {"cuda13", "torch", "test", "report"}),
], ids=["no_gpu", "cuda12", "cuda13"])
def test_the_gate_installs_the_stack_of_the_machine(tmp_path, nvidia_smi, expected):
    extras = gate_extras(tmp_path, nvidia_smi)
    assert extras == expected
    assert extras <= set(optional_dependencies())


def test_the_tf_extra_is_tensorflows_cpu_build_at_a_fixed_release():
    (requirement,) = [Requirement(r) for r in optional_dependencies()["tf"]]
    assert requirement.name == "tensorflow-cpu"
    assert str(requirement.specifier).startswith("==")


def test_tox_cpu_env_installs_what_the_gate_installs_without_a_gpu():
    tox = tox_ini()
    assert listed(tox["testenv:cpu"]["extras"]) == CPU_TIER
    assert listed(tox["testenv:cpu"]["deps"]) == {"torch==2.13.0"}   # the gate's CPU_TORCH, before the package
    gate = (ROOT / "gate").read_text()
    assert 'CPU_TORCH="torch==2.13.0"' in gate


def test_tox_perf_envs_leave_the_stack_to_the_gate():
    tox = tox_ini()
    perf = [name for name in tox.sections() if name == "testenv:perf" or name.startswith("testenv:perf-")]
    assert len(perf) == 2
    for name in perf:
        env = tox[name]
        assert env.get("skip_install") == "true", name
        assert "extras" not in env and "deps" not in env, f"{name} installs through tox: {dict(env)}"
        assert env["commands"].strip() == "{toxinidir}/gate perf {posargs}", name
    setenv = tox["testenv"]["setenv"]
    assert "perf: GATE_VENV = " in setenv    # one install of the machine's stack, outside the checkout's .venv
    assert "GATE_NO_INSTALL" not in setenv   # which would run the gate on tox's bare interpreter
    for name in tox.sections():   # nothing else in tox.ini names a CUDA extra except the GPU envs
        if name not in ("testenv:cuda12", "testenv:cuda13"):
            assert "cuda" not in tox[name].get("extras", ""), name


@pytest.mark.tf   # imports TensorFlow: runs after every other test (conftest.py)
def test_where_the_gate_installed_tf_it_imports():
    """Under ./gate, on a machine whose extras include tf and a platform the tf extra has a wheel for,
    TensorFlow must import: the tf_keras tests must not fall back to skipping there."""
    extras = os.environ.get("GATE_EXTRAS")
    if extras is None:
        pytest.skip("not run by ./gate (GATE_EXTRAS unset)")
    if "tf" not in extras.split(","):
        pytest.skip(f"the gate installs no tf on this machine ({extras})")
    applies = [r for r in map(Requirement, importlib.metadata.requires("gpuengine") or [])
               if r.marker is not None and "extra" in str(r.marker) and r.marker.evaluate({"extra": "tf"})]
    if not applies:
        pytest.skip("the tf extra has no TensorFlow wheel for this platform or Python")
    assert tf_common.tensorflow_unavailable() is None
