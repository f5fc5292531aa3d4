"""The stack A/B's session side (gpuengine/gate/ab/stack.py, sides.py): the base resolved from the head's lock and
LOCK, what the header and extra_info["ab"] say of it, plans handed across only on one cuDNN, and spread.py's
reading of the command line."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuengine.gate.stack.env import StackEnv
from gpuengine.gate.ab import stack as ab_stack
from gpuengine.gate.ab.sides import BASE, HEAD, Interpreter, Sides

HEAD_LOCK = "nvidia-cudnn-frontend==1.32.0\nnvidia-cudnn-cu13==9.19.0.56\nnumpy==2.4.6\napache-tvm-ffi==0.1.9\n"
OLD_LOCK = "nvidia-cudnn-frontend==1.22.1\nnvidia-cudnn-cu13==9.19.0.56\nnumpy==2.4.6\n"


@pytest.fixture
def head_lock(tmp_path, monkeypatch):
    """This Python's lock: locks/cuda13.txt of a checkout at tmp_path, met but for one package."""
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / "cuda13.txt").write_text(HEAD_LOCK)
    monkeypatch.setattr(ab_stack, "lock_path", lambda tier: tmp_path / "locks" / f"{tier}.txt")
    monkeypatch.setattr(ab_stack, "current_record", lambda: {"tier": "cuda13", "sha256": "52ff223d84e6",
                                                             "differs": ["numpy 2.4.6 -> 2.5.0"]})
    return tmp_path


def resolved(root: Path, monkeypatch, text: str = OLD_LOCK) -> tuple[ab_stack.StackBase, list[str], list]:
    (root / "build").mkdir(exist_ok=True)
    (root / "build" / "old.txt").write_text(text)
    said, asked = [], []

    def prepare(other, at, **kwargs):
        asked.append((other.spec, at, kwargs["no_install"], kwargs["wheels"]))
        return StackEnv(sys.executable, {"PYTHONPATH": f"{at}/build/stacks/{other.sha256}/site"}, "site",
                        at / "build" / "stacks" / other.sha256 / "site", ("nvidia-cudnn-frontend==1.22.1",))

    monkeypatch.setattr(ab_stack, "prepare", prepare)
    stack = ab_stack.resolve("build/old.txt", root, no_install=True, wheels="/wheels", say=said.append)
    return stack, said, asked


def test_the_base_is_named_by_its_stack_and_the_change_is_said_before_it_is_built(head_lock, monkeypatch):
    stack, said, asked = resolved(head_lock, monkeypatch)
    assert asked == [("build/old.txt", head_lock, True, "/wheels")]
    assert said[0].startswith(f"stack A/B: base build/old.txt (cuda13 lock {stack.other.sha256}), head ")
    assert said[0].endswith("the change: 1 changed, 1 added, 0 removed (base -> head)\n"
                            "  nvidia-cudnn-frontend 1.22.1 -> 1.32.0\n  apache-tvm-ffi 0.1.9 added")
    assert "the base's lock lacks apache-tvm-ffi 0.1.9: this Python has them" in said[1]
    assert stack.label == (f"stack cuda13 lock {stack.other.sha256} (nvidia-cudnn-frontend 1.22.1 -> 1.32.0, "
                           "apache-tvm-ffi 0.1.9 added on the head)")
    notice = stack.notice()
    assert notice.startswith(f"A/B against {stack.label}: --against-stack build/old.txt; the working tree's engine")
    assert "this Python differing in numpy 2.4.6 -> 2.5.0" in notice
    assert "cuDNN plans: not shared (nvidia-cudnn-frontend changed): each side autotunes its own" in notice
    record = stack.record()
    assert record["base_lock"] == {"spec": "build/old.txt", "tier": "cuda13", "sha256": stack.other.sha256,
                                   "environment": "site", "installed": ["nvidia-cudnn-frontend==1.22.1"]}
    assert record["head_lock"]["sha256"] == stack.head.sha256 and record["plans_shared"] is False
    assert record["stack_change"]["added"] == [{"name": "apache-tvm-ffi", "head": "0.1.9"}]


def test_one_cudnn_on_both_sides_shares_the_plans(head_lock, monkeypatch):
    stack, _, _ = resolved(head_lock, monkeypatch, OLD_LOCK.replace("1.22.1", "1.32.0"))
    assert stack.shares_plans and stack.record()["plans_shared"] is True
    assert "cuDNN plans: both sides run the same" in stack.notice()


def test_a_head_without_a_lock_or_a_bad_lock_is_one_error(head_lock, monkeypatch):
    monkeypatch.setattr(ab_stack, "current_record", lambda: {"tier": None, "sha256": None, "problem": "no tier x"})
    with pytest.raises(ab_stack.StackBaseError, match=r"the head's lock is unknown \(no tier x\)"):
        ab_stack.resolve("build/old.txt", head_lock, no_install=False, wheels=None)
    monkeypatch.setattr(ab_stack, "current_record", lambda: {"tier": "cuda13", "sha256": "52ff223d84e6"})
    with pytest.raises(ab_stack.StackBaseError, match="--against-stack build/none.txt: no such file"):
        ab_stack.resolve("build/none.txt", head_lock, no_install=False, wheels=None)


def test_the_wheel_folder_comes_from_the_option_else_the_variable_where_nothing_is_installed():
    assert ab_stack.wheels_setting("/w", {}) == "/w"
    assert ab_stack.wheels_setting(None, {"GATE_NO_INSTALL": "1", "GATE_STACK_WHEELS": "/v"}) == "/v"
    assert ab_stack.wheels_setting(None, {"GATE_STACK_WHEELS": "/v"}) is None   # a registry: the venv's pip
    assert ab_stack.no_install({"GATE_NO_INSTALL": "1"}) and not ab_stack.no_install({})


@pytest.mark.parametrize("args, spec", [(["-k", "mlp", "--against-stack", "build/old.txt"], "build/old.txt"),
                                        (["--against-stack=HEAD~1:locks/cuda13.txt"], "HEAD~1:locks/cuda13.txt"),
                                        (["--against", "HEAD"], None)])
def test_spread_finds_the_other_stack_on_the_command_line(args, spec, monkeypatch):
    asked = []
    monkeypatch.setattr(ab_stack, "resolve", lambda spec, root, **kwargs: asked.append(spec) or "built")
    assert ab_stack.prepare_from_args(args, Path("/repo")) == ("built" if spec else None)
    assert asked == ([spec] if spec else [])


class FakeWorker:
    """A worker that builds nothing and answers what the base timed."""

    def __init__(self, side: str, tuned: dict):
        self.side, self.tuned, self.alive, self.asked = side, tuned, True, []

    def request(self, op: str, *args):
        self.asked.append(op)
        if op == "build":
            return {"name": "gpuengine", "samples_per_round": 8, "epochs_per_round": 1, "engine_file": "x"}
        return self.tuned if op == "tuned_plans" else None


@pytest.mark.parametrize("share", [True, False])
def test_the_bases_plan_choices_reach_the_head_only_on_one_cudnn(tmp_path, share):
    sides = Sides(tmp_path, tmp_path, tmp_path / "logs", {}, share_plans=share,
                  interpreters={BASE: Interpreter("/stacks/venv/bin/python", {})})
    assert sides.workers[BASE].interpreter.python == "/stacks/venv/bin/python"
    assert sides.workers[HEAD].interpreter == Interpreter()   # the head: this Python, this environment
    sides.workers = {BASE: FakeWorker(BASE, {"conv": {"plan": "eng0", "ms": 0.1}}), HEAD: FakeWorker(HEAD, {})}
    pair = sides.pair("perf_tests.test_cnn", "test_cnn_train", "tf32")
    assert ("add_plans" in sides.workers[HEAD].asked) is share
    assert ("tuned_plans" in sides.workers[BASE].asked) is share   # another cuDNN's choices: not even read
    assert pair.tuned == ({"conv": {"plan": "eng0", "ms": 0.1}} if share else {})
