"""The locked stack: reading a lock, comparing this Python with it as pip's `==` would, the record every stored run
keeps (machine_info's stack_lock), the stack stored runs are compared by, and the gate's lock commands."""
from __future__ import annotations

import os
import re

import pytest

from gpuengine.bench import stack_lock
from gpuengine.gate.stack import cli as stack_lock_cli
from gpuengine.bench.machine_info import CPU_TIER, Tier, collect_machine_info
from gpuengine.bench.stack_lock import NO_LOCK, Difference, LockError, StackId
from gpuengine.config import EngineConfig

UV_LOCK = """\
# The cuda13 tier's locked stack: a header
ml-dtypes==0.6.0
    # via gpuengine (pyproject.toml)
nvidia-cudnn-frontend==1.22.1
    # via
    #   -c locks/constraints/cuda13.txt
    #   gpuengine (pyproject.toml)
torch==2.11.0
"""


def write_lock(folder, tier="cuda13", text=UV_LOCK):
    path = folder / f"{tier}.txt"
    path.write_text(text)
    return path


def test_a_lock_is_its_exact_pins_by_canonical_name(tmp_path):
    lock = stack_lock.read_lock(write_lock(tmp_path), "cuda13")
    assert lock.pins == {"ml-dtypes": "0.6.0", "nvidia-cudnn-frontend": "1.22.1", "torch": "2.11.0"}
    assert len(lock.sha256) == stack_lock.SHA_DIGITS and int(lock.sha256, 16) >= 0


def test_the_identity_is_the_pins_not_the_comments(tmp_path):
    for folder in "abc":
        (tmp_path / folder).mkdir()
    base = stack_lock.read_lock(write_lock(tmp_path / "a"), "cuda13").sha256
    reworded = UV_LOCK.replace("a header", "another header, refreshed with a newer uv") + "# trailing note\n"
    assert stack_lock.read_lock(write_lock(tmp_path / "b", text=reworded), "cuda13").sha256 == base
    moved = UV_LOCK.replace("nvidia-cudnn-frontend==1.22.1", "nvidia-cudnn-frontend==1.32.0")
    assert stack_lock.read_lock(write_lock(tmp_path / "c", text=moved), "cuda13").sha256 != base


@pytest.mark.parametrize("line, message", [
    ("numpy>=2", "a lock pins exact versions (name==version), not 'numpy>=2'"),
    ("numpy==2.*", "a lock pins exact versions"),
    ("numpy @ https://example.org/numpy.whl", "a lock pins exact versions"),
    ("numpy==2.5.2 ==2.5.3", "not a requirement"),
    ("torch==2.11.0", "torch is pinned twice"),
])
def test_a_line_that_is_no_exact_pin_is_an_error_naming_file_and_line(tmp_path, line, message):
    path = write_lock(tmp_path, text=UV_LOCK + line + "\n")
    with pytest.raises(LockError, match=re.escape(f"cuda13.txt:9: {message}")):
        stack_lock.read_lock(path, "cuda13")


def test_a_missing_lock_file_is_named_with_the_command_that_writes_it(tmp_path):
    with pytest.raises(LockError, match=r"cpu.txt: no such file \(./gate lock cpu writes it\)"):
        stack_lock.read_lock(tmp_path / "cpu.txt", "cpu")


def test_differences_follow_pips_equality_local_labels_included(tmp_path):
    lock = stack_lock.read_lock(write_lock(tmp_path, "cpu", "torch==2.13.0+cpu\nnumpy==2.4.6\nml_dtypes==0.6.0\n"
                                           "pytest==9.1.1\n"), "cpu")
    installed = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "ml-dtypes": "0.6.0", "pytest": "9.1.1"}
    assert stack_lock.differences(lock, installed) == []
    assert stack_lock.differences(lock, {**installed, "torch": "2.13.0"}) == [Difference("torch", "2.13.0+cpu",
                                                                                        "2.13.0")]
    gpu = stack_lock.read_lock(write_lock(tmp_path), "cuda13")
    assert stack_lock.differences(gpu, {"torch": "2.11.0+cu130", "nvidia-cudnn-frontend": "1.32.0",
                                        "ml-dtypes": "0.6.0"}) == [Difference("nvidia-cudnn-frontend", "1.22.1",
                                                                              "1.32.0")]
    missing = stack_lock.differences(gpu, {"torch": "2.11.0", "ml-dtypes": None})
    assert [d.describe() for d in missing] == ["ml-dtypes 0.6.0 -> unknown version",
                                              "nvidia-cudnn-frontend 1.22.1 -> not installed"]


def test_the_record_names_tier_file_identity_and_each_difference(tmp_path):
    path = write_lock(tmp_path)
    record = stack_lock.record_for("cuda13", {"torch": "2.11.0+cu130", "ml-dtypes": "0.6.0",
                                              "nvidia-cudnn-frontend": "1.32.0"}, locks=tmp_path)
    assert record == {"tier": "cuda13", "file": str(path), "sha256": stack_lock.read_lock(path, "cuda13").sha256,
                      "matches": False, "differs": ["nvidia-cudnn-frontend 1.22.1 -> 1.32.0"]}
    assert stack_lock.record_for("cuda13", {"torch": "2.11.0", "ml-dtypes": "0.6.0",
                                            "nvidia-cudnn-frontend": "1.22.1"}, locks=tmp_path)["matches"] is True


def test_a_missing_lock_file_is_recorded_not_raised(tmp_path):
    record = stack_lock.record_for("cuda12", {}, locks=tmp_path)
    assert record["sha256"] is None and record["matches"] is False and "cuda12.txt: no such file" in record["problem"]
    assert str(stack_lock.stack_of({"stack_lock": record})) == "cuda12 (no lock file)"
    with pytest.raises(LockError, match="no tier 'rocm'"):
        stack_lock.record_for("rocm", {}, locks=tmp_path)


def test_the_tier_is_the_gates_choice_else_the_cupy_installed():
    assert stack_lock.applicable_tier({"cupy-cuda13x": "14.2.0"}, {}) == "cuda13"
    assert stack_lock.applicable_tier({"cupy-cuda12x": "14.2.0"}, {}) == "cuda12"
    assert stack_lock.applicable_tier({"numpy": "2.4.6"}, {}) == "cpu"
    assert stack_lock.applicable_tier({"cupy-cuda13x": "14.2.0"}, {"GATE_LOCK_TIER": "cpu"}) == "cpu"
    with pytest.raises(LockError, match="GATE_LOCK_TIER='cuda11' is no tier"):
        stack_lock.applicable_tier({}, {"GATE_LOCK_TIER": "cuda11"})


def test_stacks_compare_by_tier_identity_and_differences_and_read_as_text():
    record = {"tier": "cuda13", "sha256": "1a2b3c4d5e6f", "matches": False,
              "differs": ["nvmath-python 1.0.0 -> not installed", "nvidia-cudnn-frontend 1.22.1 -> 1.32.0"]}
    stack = stack_lock.stack_of({"stack_lock": record})
    assert stack == stack_lock.stack_of({"stack_lock": {**record, "differs": record["differs"][::-1]}})
    assert str(stack) == ("cuda13 lock 1a2b3c4d5e6f with nvidia-cudnn-frontend 1.22.1 -> 1.32.0, "
                          "nvmath-python 1.0.0 -> not installed")
    assert stack != stack_lock.stack_of({"stack_lock": {**record, "differs": []}})
    assert stack_lock.stack_of({}) == NO_LOCK == stack_lock.stack_of({"stack_lock": None}) and str(NO_LOCK) == "no lock"
    many = StackId("cpu", "abc", tuple(f"p{i} 1 -> 2" for i in range(5)))
    assert str(many) == "cpu lock abc with p0 1 -> 2, p1 1 -> 2, p2 1 -> 2 and 2 more"
    assert stack_lock.lock_identity(record) == "cuda13 lock 1a2b3c4d5e6f"
    assert stack_lock.lock_identity({}) == "no lock"


def test_every_run_records_the_lock_it_ran_on():
    info = collect_machine_info(Tier(CPU_TIER, None), EngineConfig(device="cpu"))
    record = info["stack_lock"]
    assert set(record) >= {"tier", "file", "sha256", "matches", "differs"}
    if os.environ.get("GATE_LOCK_TIER") and os.environ.get("GATE_NO_INSTALL", "0") != "1":
        # ./gate installed this Python from the lock: it holds every package at the lock's version
        assert record["tier"] == os.environ["GATE_LOCK_TIER"] and record["matches"], record["differs"]


def test_check_prints_each_difference_once_with_both_versions(tmp_path, monkeypatch, capsys):
    path = write_lock(tmp_path)
    monkeypatch.setattr(stack_lock_cli, "installed_versions",
                        lambda: {"torch": "2.11.0+cu130", "ml-dtypes": "0.6.0", "nvidia-cudnn-frontend": "1.32.0"})
    assert stack_lock_cli.main(["check", "--lock", str(path), "--tier", "cuda13"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"gate: this Python differs from {path} (cuda13 lock ") and "1 of its 3" in lines[0]
    assert lines[1] == "  nvidia-cudnn-frontend: lock 1.22.1, installed 1.32.0"
    assert "./gate wheels DIR --have FREEZE --tier cuda13" in lines[2] and len(lines) == 3
    assert stack_lock_cli.main(["check", "--lock", str(tmp_path / "cpu.txt"), "--tier", "cpu"]) == 0
    assert "cpu.txt: no such file" in capsys.readouterr().err   # said, and the run goes on


def test_the_wheels_to_bring_are_the_locks_pins_the_freeze_lacks(tmp_path, monkeypatch, capsys):
    lock = write_lock(tmp_path)
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# the image\n-e git+https://example.org/x#egg=x\ntorch==2.11.0\n"
                      "ml_dtypes @ file:///wheels/ml_dtypes.whl\n")
    assert stack_lock_cli.read_have(freeze) == {"torch": "2.11.0", "ml-dtypes": None}
    listed = tmp_path / "list.json"
    listed.write_text('[{"name": "torch", "version": "2.11.0"}, {"name": "ml_dtypes", "version": "0.6.0"}]')
    monkeypatch.setattr(stack_lock_cli.subprocess, "run", lambda *a, **k: pytest.fail("--list downloads nothing"))
    args = ["wheels", str(tmp_path / "w"), "--lock", str(lock), "--tier", "cuda13", "--python-version", "3.12"]
    assert stack_lock_cli.main(args + ["--have", str(listed), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 of the 3 packages of") and out[1:] == ["  nvidia-cudnn-frontend==1.22.1"]
    calls = []
    monkeypatch.setattr(stack_lock_cli.subprocess, "run", lambda command: calls.append(command) or
                        type("Done", (), {"returncode": 0}))
    assert stack_lock_cli.main(args + ["--have", str(freeze)]) == 0
    (command,) = calls
    assert command[-2:] == ["ml-dtypes==0.6.0", "nvidia-cudnn-frontend==1.22.1"]
    assert command[3:6] == ["download", "--no-deps", "--only-binary=:all:"]
    for flag in ("--python-version 3.12", "--implementation cp", "--platform manylinux_2_28_x86_64",
                 "--platform manylinux2014_x86_64", f"--dest {tmp_path / 'w'}"):
        assert flag in " ".join(command)


def test_a_freeze_it_cannot_read_is_one_error_naming_the_line(tmp_path, capsys):
    bad = tmp_path / "freeze.txt"
    bad.write_text("torch==2.11.0\nnumpy>=2\n")
    status = stack_lock_cli.main(["wheels", str(tmp_path), "--have", str(bad), "--lock", str(write_lock(tmp_path)),
                                  "--tier", "cuda13", "--python-version", "3.12"])
    assert status == 2
    assert capsys.readouterr().err == f"gate wheels: {bad}:2: `pip freeze` names an exact version, not 'numpy>=2'\n"


def test_wheels_reads_another_lock_as_a_stack_ab_names_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("torch==2.11.0\n")
    args = ["wheels", str(tmp_path / "w"), "--have", str(freeze), "--tier", "cuda13", "--python-version", "3.12",
            "--list"]
    assert stack_lock_cli.main(args + ["--lock", "old.txt"]) == 2
    assert capsys.readouterr().err.startswith("gate wheels: --lock old.txt: no such file (a lock file, or REV:PATH")
    (tmp_path / "build").mkdir()
    write_lock(tmp_path / "build")   # build/cuda13.txt, named relative to where ./gate runs
    assert stack_lock_cli.main(args + ["--lock", "build/cuda13.txt"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["  ml-dtypes==0.6.0", "  nvidia-cudnn-frontend==1.22.1"]


def test_a_lock_reads_as_a_freeze_so_the_new_lock_is_the_old_ones_have():
    """docs/gate.md: without a registry the base runs the Python that meets the new lock, so the old lock's wheels
    are fetched with `--have locks/<tier>.txt`."""
    for tier in stack_lock.TIERS:
        path = stack_lock.lock_path(tier)
        assert stack_lock_cli.read_have(path) == stack_lock.read_lock(path, tier).pins
