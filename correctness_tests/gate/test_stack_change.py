"""A stack A/B's description (gpuengine/gate/stack/change.py): the other lock named by a path or REV:PATH, its change
against the head's lock, the base's label, and whether the sides may share cuDNN plans."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuengine.gate.stack import change as stack_ab
from gpuengine.bench.stack_lock import Lock, LockError

HEADER = "# The cuda13 tier's locked stack: Python 3.12, x86_64-manylinux_2_28, extras cuda13,torch,test,report.\n"
OLD = HEADER + "nvidia-cudnn-frontend==1.22.1\n    # via gpuengine\nnumpy==2.4.6\ntorch==2.11.0\nsix==1.17.0\n"
NEW = HEADER + "nvidia-cudnn-frontend==1.32.0\nnumpy==2.4.6\ntorch==2.11.0\napache-tvm-ffi==0.1.9\n"


def lock(pins: dict[str, str], tier: str = "cuda13") -> Lock:
    return Lock(tier, Path(f"{tier}.txt"), pins)


def test_a_lock_file_is_read_relative_to_the_checkout_or_absolute(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "old.txt").write_text(OLD)
    other = stack_ab.read_other_lock("build/old.txt", "cuda13", tmp_path)
    assert other.spec == "build/old.txt" and other.text == OLD
    assert other.lock.pins == {"nvidia-cudnn-frontend": "1.22.1", "numpy": "2.4.6", "torch": "2.11.0", "six": "1.17.0"}
    absolute = stack_ab.read_other_lock(str(tmp_path / "build" / "old.txt"), "cuda13", Path("/"))
    assert absolute.sha256 == other.sha256 == other.lock.sha256


@pytest.mark.parametrize("spec, text, message", [
    ("build/none.txt", None, "--against-stack build/none.txt: no such file (a lock file, or REV:PATH such as "
                             "HEAD~3:locks/cuda13.txt)"),
    ("", None, "--against-stack needs a lock"),
    ("cpu.txt", "# The cpu tier's locked stack: Python 3.11\nnumpy==2.4.6\n",
     "--against-stack cpu.txt: the cpu tier's lock, where the cuda13 tier's is wanted"),
    ("loose.txt", "numpy>=2\n", "loose.txt:1: a lock pins exact versions (name==version), not 'numpy>=2'"),
    ("empty.txt", HEADER, "--against-stack empty.txt: pins no package"),
])
def test_a_lock_that_cannot_be_the_base_is_one_error_naming_it(tmp_path, spec, text, message):
    if text is not None:
        (tmp_path / spec).write_text(text)
    with pytest.raises(LockError) as raised:
        stack_ab.read_other_lock(spec, "cuda13", tmp_path)
    assert message in str(raised.value)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_rev_path_reads_the_lock_as_committed_there(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=gate", "-c", "user.email=gate@example.org",
                        *args], check=True, capture_output=True)

    (tmp_path / "locks").mkdir()
    git("init", "-q")
    (tmp_path / "locks" / "cuda13.txt").write_text(OLD)
    git("add", "locks")
    git("commit", "-q", "-m", "old lock")
    (tmp_path / "locks" / "cuda13.txt").write_text(NEW)
    git("commit", "-q", "-am", "refreshed lock")
    other = stack_ab.read_other_lock("HEAD~1:locks/cuda13.txt", "cuda13", tmp_path)
    assert other.text == OLD and other.lock.pins["nvidia-cudnn-frontend"] == "1.22.1"
    assert other.spec == "HEAD~1:locks/cuda13.txt"
    with pytest.raises(LockError, match=r"--against-stack HEAD~7:locks/cuda13.txt: not a lock committed at HEAD~7 \("):
        stack_ab.read_other_lock("HEAD~7:locks/cuda13.txt", "cuda13", tmp_path)
    with pytest.raises(LockError, match="--against-stack HEAD:locks/cuda12.txt: not a lock committed at HEAD"):
        stack_ab.read_other_lock("HEAD:locks/cuda12.txt", "cuda13", tmp_path)
    with pytest.raises(LockError, match="REV:PATH needs both"):
        stack_ab.read_other_lock(":locks/cuda13.txt", "cuda13", tmp_path)


def test_the_change_is_packages_changed_added_and_removed_by_pips_equality():
    base = lock({"nvidia-cudnn-frontend": "1.22.1", "numpy": "2.4.6", "torch": "2.11.0", "six": "1.17.0"})
    head = lock({"nvidia-cudnn-frontend": "1.32.0", "numpy": "2.4.6", "torch": "2.11.0+cu130",
                 "apache-tvm-ffi": "0.1.9"})
    change = stack_ab.stack_change(base, head)
    # torch 2.11.0 -> 2.11.0+cu130: a local label the base's pin lacks is no change, as stack_lock compares
    assert change.changed == (("nvidia-cudnn-frontend", "1.22.1", "1.32.0"),)
    assert change.added == (("apache-tvm-ffi", "0.1.9"),) and change.removed == (("six", "1.17.0"),)
    assert change.items() == ["nvidia-cudnn-frontend 1.22.1 -> 1.32.0", "apache-tvm-ffi 0.1.9 added",
                              "six 1.17.0 removed"]
    assert change.lines()[0] == "1 changed, 1 added, 1 removed (base -> head)" and len(change.lines()) == 4
    assert change.as_dict() == {"changed": [{"name": "nvidia-cudnn-frontend", "base": "1.22.1", "head": "1.32.0"}],
                                "added": [{"name": "apache-tvm-ffi", "head": "0.1.9"}],
                                "removed": [{"name": "six", "base": "1.17.0"}]}
    same = stack_ab.stack_change(base, base)
    assert same.empty and same.summary() == "the same pins" and same.as_dict() == {"changed": [], "added": [],
                                                                                   "removed": []}


def test_the_label_names_the_stack_and_what_the_head_changed():
    base = Lock("cuda13", Path("old.txt"), {"nvidia-cudnn-frontend": "1.22.1", "numpy": "2.4.6"})
    other = stack_ab.OtherLock("build/old.txt", base, "")
    change = stack_ab.stack_change(base, lock({"nvidia-cudnn-frontend": "1.32.0", "numpy": "2.4.6"}))
    assert stack_ab.base_label(other, change) == (f"stack cuda13 lock {base.sha256} (nvidia-cudnn-frontend 1.22.1 "
                                                  "-> 1.32.0 on the head)")
    many = stack_ab.stack_change(lock({f"p{i}": "1" for i in range(5)}), lock({f"p{i}": "2" for i in range(5)}))
    assert many.summary() == "p0 1 -> 2, p1 1 -> 2, p2 1 -> 2 and 2 more"
    assert stack_ab.base_label(other, stack_ab.stack_change(base, base)).endswith("(the same pins as the head's)")


@pytest.mark.parametrize("head, shared", [
    ({"nvidia-cudnn-frontend": "1.22.1", "nvidia-cudnn-cu13": "9.19.0.56", "numpy": "2.5.0"}, True),
    ({"nvidia-cudnn-frontend": "1.32.0", "nvidia-cudnn-cu13": "9.19.0.56", "numpy": "2.4.6"}, False),
    ({"nvidia-cudnn-frontend": "1.22.1", "nvidia-cudnn-cu13": "9.20.0.48", "numpy": "2.4.6"}, False),
    ({"nvidia-cudnn-frontend": "1.22.1", "numpy": "2.4.6"}, False),   # the head's cuDNN from elsewhere
])
def test_plans_are_shared_only_where_both_locks_pin_the_same_cudnn(head, shared):
    base = lock({"nvidia-cudnn-frontend": "1.22.1", "nvidia-cudnn-cu13": "9.19.0.56", "numpy": "2.4.6"})
    change = stack_ab.stack_change(base, lock(head))
    assert stack_ab.shares_plans(change) is shared
    assert bool(stack_ab.cudnn_packages(change)) is not shared
