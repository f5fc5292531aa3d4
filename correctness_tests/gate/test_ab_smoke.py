"""A/B mode end to end on the CPU tier: real perf tests, real workers, a real base checkout or another stack.

Each test runs a pytest session of the repository's own perf modules in a
subprocess (gpuengine/gate/ab/session.py needs a fresh session per base), with
the run stored into a temporary folder so nothing here touches
baselines_store/. They check what a user relies on: both engines ran and the
rounds were recorded, a base whose tests differ stops the session before
anything runs or is saved, and the base's worktree goes when the session
ends.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from correctness_tests.inner_sessions import outside_xdist

REPO = Path(__file__).resolve().parents[2]
CASE = "perf_tests/test_mlp.py::test_mlp_train[fp32-graph1-resident-bpe1]"


def gate_session(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    storage = tmp_path / "store"
    return subprocess.run([sys.executable, "-m", "pytest", CASE, "-p", "no:cacheprovider", "-rA",
                           f"--benchmark-storage=file://{storage}", "--benchmark-autosave", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=outside_xdist({**os.environ, **(env or {})}))


def saved_runs(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (tmp_path / "store").rglob("[0-9][0-9][0-9][0-9]_*.json")]


def copy_of(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    for part in ("gpuengine", "perf_tests"):
        shutil.copytree(REPO / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_a_base_folder_runs_beside_the_head_and_both_rounds_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")   # as under `pytest -n 2`: the inner session must not inherit it
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    base = copy_of(tmp_path, "base")
    (base / "COMMIT").write_text("0123456789abcdef\n")
    core = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    result = gate_session(tmp_path, f"--against={base}", env=None if core is None else {"GATE_TIMING_CPU": str(core)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "A/B against 0123456 (the same code: an A/A run)" in result.stdout
    (run,) = saved_runs(tmp_path)
    (bench,) = run["benchmarks"]
    ab = bench["extra_info"]["ab"]
    if core is not None:   # both workers and the references timed on the session's core, and the run says which
        assert ab["timing_cpu"] == {"base": core, "head": core}
        assert run["machine_info"]["timing_cpu"] == {"cpu": core, "set_by": "GATE_TIMING_CPU"}
    assert ab["base_commit"] == "0123456789abcdef" and ab["base_code"] == ab["head_code"]
    assert len(ab["base_round_ms"]) == len(ab["head_round_ms"]) >= 1 and min(ab["base_round_ms"]) > 0
    assert bench["extra_info"]["stored_run_check"]["mode"] == "A/B"
    assert {"gpuengine", "gpuengine_base"} <= set(bench["extra_info"]["loss_before"])   # both sides trained


def test_a_base_without_the_tests_stops_the_session_before_anything_runs(tmp_path):
    base = copy_of(tmp_path, "old")
    module = base / "perf_tests" / "test_mlp.py"
    source = module.read_text()
    assert "ENGINES = tiers.recipes(" in source   # the base's recipes, renamed away below
    module.write_text(source.replace("ENGINES = tiers.recipes(", "OLD_ENGINES = tiers.recipes("))
    result = gate_session(tmp_path, f"--against={base}")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout[-3000:]
    assert "tests differ from this tree's, nothing was run or saved" in result.stdout + result.stderr
    assert "no ENGINES recipes" in result.stdout + result.stderr
    assert saved_runs(tmp_path) == []


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                    reason="needs git and a git checkout of the repository")
def test_an_auto_base_without_recipes_is_stored_run_mode_and_said_so_before_the_tests(tmp_path):
    """`./gate perf`'s default base (auto: the merge base with main) whose perf module has no recipes: every
    test runs in stored-run mode, and what is printed before the first test says so, never "A/B against"."""
    from correctness_tests.gate.test_gate_smoke import git_env, working_tree_copy
    repo = working_tree_copy(tmp_path / "repo")
    module = repo / "perf_tests" / "test_mlp.py"
    source = module.read_text()
    git = ["git", "-c", "user.name=ab smoke", "-c", "user.email=ab-smoke@localhost", "-c", "commit.gpgsign=false"]
    module.write_text(source.replace("ENGINES = tiers.recipes(", "OLD_ENGINES = tiers.recipes("))
    for args in (["branch", "-M", "main"], ["commit", "-qam", "a base without recipes"], ["checkout", "-qb", "work"]):
        subprocess.run(git + args, cwd=repo, check=True, env=git_env())
    module.write_text(source)
    subprocess.run(git + ["commit", "-qam", "the recipes back"], cwd=repo, check=True, env=git_env())
    base = subprocess.run(["git", "rev-parse", "--short=7", "main"], cwd=repo, capture_output=True, text=True,
                          check=True, env=git_env()).stdout.strip()
    result = subprocess.run([sys.executable, "-m", "pytest", CASE, "-p", "no:cacheprovider", "--against=auto",
                             f"--benchmark-storage=file://{tmp_path / 'store'}", "--benchmark-autosave"],
                            cwd=repo, capture_output=True, text=True, timeout=600,
                            env=dict(git_env(), GPUENGINE_DEVICE="cpu"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    before_tests = result.stdout.split(CASE.split("::")[0] + " ")[0]
    assert f"gpuengine gate: A/B base {base}: the merge base of work with main" in before_tests
    assert (f"gpuengine gate: stored-run mode for 1 test(s) the base {base} cannot build (1: the base's "
            "perf_tests.test_mlp defines no ENGINES recipes): each compares with its stored baseline") in before_tests
    assert "A/B against" not in result.stdout
    (run,) = saved_runs(tmp_path)
    assert "ab" not in run["benchmarks"][0]["extra_info"]   # no base rounds: it did not run A/B


def test_a_folder_that_is_no_checkout_and_a_commit_that_is_none_are_one_error(tmp_path):
    result = gate_session(tmp_path, f"--against={tmp_path}")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and "not a gpuengine checkout" in result.stderr
    result = gate_session(tmp_path, "--against=no-such-commit-anywhere")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR and "--against no-such-commit-anywhere" in result.stderr
    assert saved_runs(tmp_path) == []


def test_a_head_without_a_named_base_and_too_few_ab_rounds_stop_the_session_at_once(tmp_path):
    """--head and --ab-rounds are ./gate bisect's (which runs them end to end, a head whose tests differ included:
    correctness_tests/gate/test_bisect.py); what cannot work is one usage error before anything runs."""
    for args, message in [(["--head=HEAD"], "--head HEAD goes with --against REV|DIR"),
                          (["--against=HEAD", "--head=HEAD", "--ab-rounds=3"],
                           "--ab-rounds 3: at least 7 paired rounds")]:
        result = gate_session(tmp_path, *args)
        assert result.returncode == pytest.ExitCode.USAGE_ERROR, (args, result.stdout[-2000:])
        assert message in result.stderr, (args, result.stdout[-2000:], result.stderr[-2000:])
    assert saved_runs(tmp_path) == []


def lock_of_this_python(tmp_path: Path) -> tuple[Path, str]:
    """A lock of the tier's packages at the versions this Python has (the tier's lock itself where ./gate
    installed it), and the tier: the other stack of an A/B across stacks that installs nothing."""
    from gpuengine.bench import stack_lock
    tier = stack_lock.current_record()["tier"]
    installed = stack_lock.installed_versions()
    pins = stack_lock.read_lock(stack_lock.lock_path(tier), tier).pins
    path = tmp_path / "old.txt"
    path.write_text(f"# The {tier} tier's locked stack: this Python's versions of its packages.\n"
                    + "".join(f"{name}=={installed[name]}\n" for name in sorted(pins) if name in installed))
    return path, tier


def test_a_stack_ab_runs_the_same_code_in_each_stacks_environment(tmp_path):
    """An A/A across stacks without a registry: the other lock is met by this Python, nothing is installed, both
    workers run the working tree, and the run names the base by its stack."""
    lock, tier = lock_of_this_python(tmp_path)
    result = gate_session(tmp_path, f"--against-stack={lock}", env={"GATE_NO_INSTALL": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "nothing to install, the base runs this Python as it is" in result.stderr
    assert f"A/B against stack {tier} lock " in result.stdout and f"--against-stack {lock}" in result.stdout
    assert "(the same code on both stacks)" in result.stdout and "an A/A run" not in result.stdout   # stacks differ
    (run,) = saved_runs(tmp_path)
    (bench,) = run["benchmarks"]
    ab = bench["extra_info"]["ab"]
    assert ab["base"].startswith(f"stack {tier} lock ") and ab["base_why"] == f"--against-stack {lock}"
    assert set(ab["stack_change"]) == {"changed", "added", "removed"} and ab["base_lock"]["environment"] == "as is"
    assert ab["head_lock"]["sha256"] == run["machine_info"]["stack_lock"]["sha256"]   # the run's lock is the head's
    assert set(ab["timing_cpu"]) == {"base", "head"} and len(ab["base_round_ms"]) == len(ab["head_round_ms"]) >= 1
    assert ab["python"]["base"] == ab["python"]["head"]   # nothing to install: the base runs this Python as it is
    assert {"gpuengine", "gpuengine_base"} <= set(bench["extra_info"]["loss_before"])   # both sides trained
    check = bench["extra_info"]["stored_run_check"]
    assert check["mode"] == "A/B" and check["verdict"] == "not significant" and check["base"] == ab["base"]


def test_a_stack_ab_that_cannot_start_is_one_usage_error_before_anything_runs(tmp_path):
    lock, tier = lock_of_this_python(tmp_path)
    wanting = tmp_path / "wanting.txt"
    wanting.write_text(re.sub(r"^numpy==.*$", "numpy==0.0.1", lock.read_text(), flags=re.M))   # no wheel has it
    (tmp_path / "wheels").mkdir()
    for args, env, message in [
        (["--against=HEAD", f"--against-stack={lock}"], {}, "--against HEAD and --against-stack"),
        ([f"--stack-wheels={tmp_path}"], {}, "--stack-wheels goes with --against-stack LOCK"),
        (["--against-stack=build/no-such-lock.txt"], {}, "--against-stack build/no-such-lock.txt: no such file"),
        ([f"--against-stack={lock}", f"--stack-wheels={tmp_path}"], {"GATE_NO_INSTALL": "0"},
         "is for a machine without a registry"),
        ([f"--against-stack={wanting}", f"--stack-wheels={tmp_path / 'wheels'}"], {"GATE_NO_INSTALL": "1"},
         f"./gate wheels {tmp_path / 'wheels'} --have FREEZE --tier {tier} --lock {wanting}"),
    ]:
        result = gate_session(tmp_path, *args, env=env)
        assert result.returncode == pytest.ExitCode.USAGE_ERROR, (args, result.stdout[-2000:], result.stderr[-2000:])
        assert message in result.stderr, (args, result.stderr[-2000:])
    assert "  numpy==0.0.1   (this Python has" in result.stderr
    assert saved_runs(tmp_path) == []


def worktrees() -> set[str]:
    if not (REPO / ".git").exists():
        return set()
    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list", "--porcelain"], capture_output=True,
                            text=True, check=True).stdout
    return {line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")}


def left_behind(before: set[str]) -> set[str]:
    """Base worktrees that appeared since `before` and whose session is gone: what an ended session leaked (the
    worktree list is the repository's, so other clones' live sessions may add theirs meanwhile)."""
    from gpuengine.gate.ab import owner
    return {tree for tree in worktrees() - before if not owner.alive(Path(tree).parent)
            and Path(tree).parent.name.startswith("gpuengine-base-")}


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="no git history in this copy of the tree")
def test_a_commit_is_checked_out_beside_the_tree_and_removed_after(tmp_path):
    before = worktrees()
    result = gate_session(tmp_path, "--against=HEAD")
    if "no ENGINES recipes" in result.stdout + result.stderr:
        pytest.skip("HEAD predates the A/B recipes (a commit of the change that adds them)")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "A/B against HEAD" in result.stdout
    assert left_behind(before) == set()


def test_the_power_study_runs_a_b_with_the_delay_on_the_head_only(tmp_path):
    base = copy_of(tmp_path, "base")
    store, kept = tmp_path / "study-store", tmp_path / "trials"
    store.mkdir()
    result = subprocess.run([sys.executable, "-m", "gpuengine.gate.commands", "gatepower", f"--against={base}", "--sessions", "2",
                             "--trials", "2", "--levels", "0,10", "-k", "test_mlp_train", "--store", str(store),
                             "--keep-trials", str(kept)], cwd=REPO, capture_output=True, text=True, timeout=900,
                            env=outside_xdist())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (study,) = [json.loads(p.read_text()) for p in (store / "gatepower").glob("*.json")]
    assert study["rule"]["mode"] == "A/B" and study["against"] == str(base)
    (entry,) = study["tests"].values()
    assert entry["pairing"].startswith("A/B") and entry["pairs"] == {"0pct": 4, "10pct": 4}
    trials = [t for path in kept.rglob("*test_mlp_train*.json") for t in json.loads(path.read_text())["trials"]]
    assert {t["level"] for t in trials} == {0.0, 0.1}
    assert all((t["delay_us"] > 0) == (t["level"] > 0) and "ab" in t["extra_info"] for t in trials)


def worker_processes() -> list[str]:
    """A/B workers of this checkout's sessions (another clone's sessions may run beside them)."""
    listed = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    script = str(REPO / "gpuengine" / "gate" / "ab" / "worker.py")
    return [line for line in listed.splitlines() if script in line]


@pytest.mark.parametrize("base", ["HEAD", "a folder"])
def test_ctrl_c_leaves_no_worker_and_no_worktree_behind(tmp_path, base):
    if base == "HEAD" and not (REPO / ".git").exists():
        pytest.skip("no git history in this copy of the tree (a GPU machine's copy): the folder case runs")
    against = "HEAD" if base == "HEAD" else str(copy_of(tmp_path, "base"))
    before, logs = worktrees(), REPO / "build" / "ab"   # each session's worker logs in a folder of its own there
    assert worker_processes() == [], "A/B workers of another session are running"
    earlier = set(logs.glob("*/head.log"))
    session = subprocess.Popen([sys.executable, "-m", "pytest", "perf_tests/test_zoo.py", "-p", "no:cacheprovider",
                                "--benchmark-disable", f"--against={against}"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=outside_xdist(),
                               # a background job's shell ignores SIGINT, and the child would inherit that
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not set(logs.glob("*/head.log")) - earlier and session.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session.poll() is None, "the session ended before its workers started: " + session.stdout.read()[-2000:]
    time.sleep(1)   # the workers are building the first engine now
    session.send_signal(signal.SIGINT)
    output, _ = session.communicate(timeout=120)
    assert "KeyboardInterrupt" in output
    assert worker_processes() == []
    assert left_behind(before) == set()
