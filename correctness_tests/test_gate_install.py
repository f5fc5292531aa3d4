"""What the gate installs on which machine, and tox.ini's environments against it.

`./gate extras` prints the extras of this machine's tier (the same choice as
`./gate test` makes); with a stand-in `nvidia-smi` first on PATH the choice
is checked for a machine without a GPU and for CUDA 12 and 13 drivers, and so
is the install itself, through a stand-in Python that logs what it is asked:
the tier's lock, then the package without its dependencies, once. tox's envs
must install the same locks, and the perf envs must leave the stack to the gate.
"""
from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpuengine.reference import tf_common

ROOT = Path(__file__).resolve().parents[1]
CPU_TIER = {"torch", "test", "report", "kernelcheck", "tf", "stats", "changepoints"}

NO_GPU = "#!/bin/sh\nexit 9\n"   # as where no driver answers
GPU = """#!/bin/sh
if [ "$1" = -L ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; exit 0; fi
echo "| NVIDIA-SMI 580.00    Driver Version: 580.00    CUDA Version: {cuda}     |"
"""


LOGGING_PYTHON = '#!/bin/sh\necho "$* [$GATE_LOCK_TIER]" >> "{log}"\n'   # a Python that only says what it ran


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def machine_env(tmp_path: Path, nvidia_smi: str, **extra: str) -> dict:
    """The environment of a machine whose `nvidia-smi` is `nvidia_smi`, outside any gate run."""
    executable(tmp_path / "bin" / "nvidia-smi", nvidia_smi)
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_NO_INSTALL", "GATE_VENV", "GATE_LOCK_TIER")}
    return dict(env, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", **extra)


def gate_extras(tmp_path: Path, nvidia_smi: str) -> set[str]:
    out = subprocess.run([str(ROOT / "gate"), "extras"], env=machine_env(tmp_path, nvidia_smi), capture_output=True,
                         text=True, check=True)
    return set(out.stdout.strip().split(","))


def lock_extras(tier: str) -> set[str]:
    """The extras a lock's header says it was resolved from."""
    header = (ROOT / "locks" / f"{tier}.txt").read_text().splitlines()[0]
    found = re.search(r"extras ([\w,]+)\.$", header)
    assert found, f"locks/{tier}.txt's first line names no extras: {header!r}"
    return set(found.group(1).split(","))


def optional_dependencies() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def tox_ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def listed(value: str) -> set[str]:
    return {part.strip() for line in value.splitlines() for part in line.split(",") if part.strip()}


MACHINES = [(NO_GPU, "cpu", CPU_TIER), (GPU.format(cuda="12.8"), "cuda12", {"cuda12", "torch", "test", "report"}),
            (GPU.format(cuda="13.0"), "cuda13", {"cuda13", "torch", "test", "report"})]


@pytest.mark.parametrize("nvidia_smi, tier, expected", MACHINES, ids=["no_gpu", "cuda12", "cuda13"])
def test_each_tiers_lock_is_made_from_the_extras_of_its_machines(tmp_path, nvidia_smi, tier, expected):
    extras = gate_extras(tmp_path, nvidia_smi)
    assert extras == expected == lock_extras(tier)
    assert extras <= set(optional_dependencies())


@pytest.mark.parametrize("nvidia_smi, tier, expected", MACHINES, ids=["no_gpu", "cuda12", "cuda13"])
def test_the_gate_installs_the_lock_of_the_machines_tier_once(tmp_path, nvidia_smi, tier, expected):
    log = tmp_path / "python.log"
    venv = tmp_path / "venv"
    executable(venv / "bin" / "python", LOGGING_PYTHON.format(log=log))
    env = machine_env(tmp_path, nvidia_smi, GATE_VENV=str(venv))
    for _ in range(2):   # the second run finds the stamp of the same lock and pyproject.toml: nothing installed
        subprocess.run([str(ROOT / "gate"), "test", "--co"], env=env, check=True, capture_output=True, timeout=60)
    pytest_run = f"-m pytest correctness_tests perf_tests -q --co [{tier}]"
    assert log.read_text().splitlines() == [
        f"-m pip install --quiet -r locks/{tier}.txt [{tier}]", f"-m pip install --quiet --no-deps -e . [{tier}]",
        pytest_run, pytest_run]


def test_without_installing_the_gate_checks_this_python_against_the_tiers_lock_first(tmp_path):
    log = tmp_path / "python.log"
    executable(tmp_path / "bin" / "python3", LOGGING_PYTHON.format(log=log))   # the GPU image's Python
    env = machine_env(tmp_path, GPU.format(cuda="13.0"), GATE_NO_INSTALL="1")
    subprocess.run([str(ROOT / "gate"), "test", "--co"], env=env, check=True, capture_output=True, timeout=60)
    assert log.read_text().splitlines() == [
        "-m gpuengine.gate.stack.cli check --lock locks/cuda13.txt --tier cuda13 [cuda13]",
        "-m pytest correctness_tests perf_tests -q --co [cuda13]"]


def test_the_tf_extra_is_tensorflows_cpu_build_at_a_fixed_release():
    (requirement,) = [Requirement(r) for r in optional_dependencies()["tf"]]
    assert requirement.name == "tensorflow-cpu"
    assert str(requirement.specifier).startswith("==")


@pytest.mark.parametrize("env, tier", [("cpu", "cpu"), ("tf", "cpu"), ("cuda12", "cuda12"), ("cuda13", "cuda13")])
def test_tox_envs_install_the_lock_the_gate_installs(env, tier):
    section = tox_ini()[f"testenv:{env}"]
    assert listed(section["deps"]) == {f"-r locks/{tier}.txt"}   # the cpu env's lock: the gate's without a GPU
    assert "extras" not in section, f"{env}: an extra would resolve outside the lock"


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
    for name in tox.sections():   # nothing else in tox.ini names a CUDA lock or extra except the GPU envs
        if name not in ("testenv:cuda12", "testenv:cuda13"):
            assert "cuda" not in tox[name].get("extras", "") + tox[name].get("deps", ""), name


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
