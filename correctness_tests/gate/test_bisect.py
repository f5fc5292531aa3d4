"""`./gate bisect` (gpuengine/gate/bisect.py): the search on made-up steps, then end to end on a synthetic history.

The end-to-end tests build a throwaway git repository whose commits are
copies of this project in which every engine step waits a planted time, as
the power study's injected delay does when armed: 1 ms at GOOD, none at the
next commit, 3 ms from the one after (the regression to find); a later commit
breaks the MLP workload's module and the next mends it. Each step of the
bisect is a real A/B session of the CPU tier's MLP training case. Its 1 ms
rounds are noisy on a shared CPU (a round's sd near 30%, so an unchanged
commit's interval often straddles the bar and reruns): the planted waits make
every step 3x slower or 4x faster than GOOD, so each is decided at once.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from correctness_tests.inner_sessions import outside_xdist
from gpuengine.gate import bisect
from gpuengine.gate.bisect import NOT_SLOWER, SLOWER, UNKNOWN, UNTESTABLE, Commit, Step

REPO = Path(__file__).resolve().parents[2]
TEST = "test_mlp_train and fp32-graph1-resident-bpe1"   # the cheapest A/B case of the CPU tier
COPIED = ("gpuengine", "perf_tests", "conftest.py", "pyproject.toml", ".gitignore", "locks",
          "baselines_store/thresholds.json")
PLANT = '''

PLANTED_US = 1000   # planted by correctness_tests/gate/test_bisect.py: every engine step waits, armed or not


def step_hook(config):
    return StepDelay(get_backend(config), PLANTED_US).wait
'''   # a CPU-tier step of the MLP case takes about 0.2 ms


def commits(n: int) -> list[Commit]:
    return [Commit(f"{i:040x}", f"commit {i}") for i in range(1, n + 1)]


def fake_steps(outcomes: dict[int, str], log: list):
    """step_of for `search`: commit i's outcome from `outcomes`, each measured commit's number logged."""
    def step_of(commit: Commit) -> Step:
        number = int(commit.sha, 16)
        log.append(number)
        outcome = outcomes[number]
        measured = outcome != UNTESTABLE
        return Step(commit, outcome, (11,), "regressed" if outcome == SLOWER else "not significant",
                    0.1 if measured else None, (0.08, 0.12) if measured else None, 0.03 if measured else None)
    return step_of


def test_the_search_names_the_first_slower_commit_in_few_steps():
    log = []
    result = bisect.search(commits(16), fake_steps({i: SLOWER if i >= 11 else NOT_SLOWER for i in range(1, 17)}, log))
    assert [c.sha for c in result.first_bad] == [f"{11:040x}"] and result.culprit.commit.subject == "commit 11"
    assert log[0] == 16 and len(log) <= 1 + 4   # BAD first, then log2(16) steps


def test_the_search_steps_around_untestable_commits_and_says_the_range_they_leave_open():
    log = []
    outcomes = {1: NOT_SLOWER, 2: NOT_SLOWER, 3: UNTESTABLE, 4: UNTESTABLE, 5: SLOWER, 6: SLOWER}
    result = bisect.search(commits(6), fake_steps(outcomes, log))
    assert 3 in log and 4 in log   # tried, stepped around
    assert [c.subject for c in result.first_bad] == ["commit 3", "commit 4", "commit 5"]
    assert result.culprit.commit.subject == "commit 5"
    text = bisect.report(Commit("0" * 40, "good"), commits(6)[-1], result, Path("build/bisect"))
    assert "the first bad commit is one of these 3" in text and "untestable" in text


def test_a_bad_commit_that_is_not_slower_stops_the_search_at_once():
    for outcome, words in [(NOT_SLOWER, "BAD is not slower"), (UNKNOWN, "not clearly slower"),
                           (UNTESTABLE, "cannot be measured")]:
        log = []
        result = bisect.search(commits(4), fake_steps({4: outcome}, log))
        assert log == [4] and result.first_bad == [] and words in result.stopped


def test_an_unknown_step_runs_again_with_more_rounds_up_to_the_cap():
    assert bisect.round_schedule(11, 41) == [11, 21, 41] and bisect.round_schedule(11, 11) == [11]
    assert bisect.round_schedule(11, 30) == [11, 21, 30]
    tried = []

    def attempt(commit, rounds):
        tried.append(rounds)
        return Step(commit, SLOWER if rounds >= 21 else UNKNOWN)

    step = bisect.measure(commits(1)[0], attempt, [11, 21, 41])
    assert tried == [11, 21] and step.outcome == SLOWER and step.rounds == (11, 21)
    tried.clear()
    step = bisect.measure(commits(1)[0], lambda c, r: tried.append(r) or Step(c, UNKNOWN), [11, 21, 41])
    assert tried == [11, 21, 41] and step.outcome == UNKNOWN and step.rounds == (11, 21, 41)


@pytest.mark.parametrize("check, outcome", [
    ({"verdict": "regressed", "interval": [0.05, 0.09], "bar": 0.03}, SLOWER),
    ({"verdict": "regressed", "interval": [0.02, 0.09], "bar": 0.03}, UNKNOWN),       # the interval straddles
    ({"verdict": "not significant", "interval": [0.01, 0.05], "bar": 0.03}, UNKNOWN),
    ({"verdict": "not significant", "interval": [-0.02, 0.03], "bar": 0.03}, NOT_SLOWER),
    ({"verdict": "improved", "interval": [-0.09, -0.05], "bar": 0.03}, NOT_SLOWER),
])
def test_a_step_is_slower_not_slower_or_unknown_by_its_interval_against_the_bar(check, outcome):
    assert bisect.classify(check) == outcome


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=bisect test", "-c", "user.email=test@localhost", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, list[str]]:
    """c0 (GOOD) steps wait 1 ms, c1 none, c2 3 ms (the regression), c3 breaks the MLP workload, c4 mends it,
    c5 and c6 (BAD) notes."""
    repo = tmp_path_factory.mktemp("history")
    for part in COPIED:
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy2
        (repo / part).parent.mkdir(parents=True, exist_ok=True)
        copy(REPO / part, repo / part, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree
                                          else {}))
    notes, delay = repo / "NOTES.md", repo / "gpuengine/bench/injected_delay.py"
    workload = repo / "gpuengine/workloads/mlp.py"
    delay.write_text(delay.read_text() + PLANT)
    git(repo, "init", "-q", "-b", "main")
    shas = [commit_all(repo, "a copy of the project, its steps waiting 1 ms")]
    for us, message in [(0, "engine steps wait no more"), (3000, "every engine step waits 3 ms")]:
        delay.write_text(re.sub(r"^PLANTED_US = \d+", f"PLANTED_US = {us}", delay.read_text(), flags=re.M))
        shas.append(commit_all(repo, message))
    sound = workload.read_text()
    workload.write_text(sound + "\ndef broken(:\n")
    shas.append(commit_all(repo, "break the MLP workload's module"))
    workload.write_text(sound)
    shas.append(commit_all(repo, "mend the MLP workload's module"))
    for line in ("one", "two"):
        notes.write_text((notes.read_text() if notes.exists() else "") + line + "\n")
        shas.append(commit_all(repo, f"notes: {line}"))
    return repo, shas


def run_bisect(repo: Path, good: str, bad: str, *args: str) -> subprocess.CompletedProcess:
    env = {**outside_xdist(), "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-m", "gpuengine.gate.bisect", good, bad, "-k", TEST, *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.timing
def test_bisect_names_the_planted_commit_and_steps_around_the_broken_one(history):
    repo, shas = history
    result = run_bisect(repo, shas[0], shas[6])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert f"first bad commit: {shas[2][:7]} every engine step waits 3 ms: head +" in result.stdout
    table = result.stdout.split("first bad commit:", 1)[1]
    assert f"{shas[3][:7]}  break the MLP" in table
    assert f"{shas[3][:7]}, untestable: the head {shas[3][:7]}'s tests differ" in table
    assert "import failed: SyntaxError" in table   # the broken commit's reason
    assert re.search(rf"{shas[1][:7]}  engine steps wait no more +not slower", table)   # before the regression
    assert (repo / "build/bisect/bisect.txt").read_text() in result.stdout
    (bench,) = json.loads(next((repo / "build/bisect").glob("01-*.json")).read_text())["benchmarks"]
    assert bench["extra_info"]["ab"]["head_commit"] == shas[6] and bench["extra_info"]["ab"]["base_commit"] == shas[0]
    assert bench["extra_info"]["rounds_choice"] == {"rounds": 11, "why": "--ab-rounds"}
    assert list((repo / "baselines_store").rglob("[0-9][0-9][0-9][0-9]_*.json")) == []   # no step was stored
    assert git(repo, "worktree", "list").count("\n") == 0   # every step's worktrees are gone


@pytest.mark.timing
def test_bisect_stops_when_bad_is_not_slower_than_good(history):
    repo, shas = history
    result = run_bisect(repo, shas[0], shas[1])
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-3000:]
    assert "BAD is not slower than GOOD: nothing to bisect: not slower: head -" in result.stdout
    assert "first bad commit" not in result.stdout
    assert result.stdout.count(f"  {shas[1][:7]} engine steps wait no more: ") == 1   # BAD's step, then it stopped


def test_bisect_refuses_bad_input_before_any_step(history):
    repo, shas = history
    for good, bad, words in [(shas[2], shas[1], "is not an ancestor"), ("no-such-rev", shas[1], "not a commit here"),
                             (shas[1], shas[1], "the same commit")]:
        result = run_bisect(repo, good, bad)
        assert result.returncode == 2 and words in result.stderr, result.stderr[-2000:]
