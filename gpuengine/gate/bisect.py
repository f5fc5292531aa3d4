"""`./gate bisect GOOD BAD -k TEST`: the first commit between GOOD and BAD that made TEST slower, by A/B sessions.

    python -m gpuengine.gate.bisect GOOD BAD -k TEST [--rounds 11] [--max-rounds 41] [pytest args...]

Every step is an A/B session of the gate's own (gpuengine/gate/ab/): the
working tree runs it (its tests, references, rule and worker script), GOOD's
engine is the base and the step's commit the head (`--against GOOD --head
COMMIT`, each checked out in a temporary worktree), and the paired rule
(gpuengine/gate/rules/paired.py) judges the head's rounds against the base's. So
every commit is judged by one rule with one bar (the store's A/A noise), the
way the gate would judge it, whatever the age of its own gate code (its perf
module needs an `ENGINES` recipe for the test, as A/B mode does). A step
reads its verdict from the session's `--benchmark-json` and the test's outcome
from `--junitxml`; nothing is saved to the store, so no step becomes a
baseline or an A/A run (gpuengine/gate/rules/aa_noise.py learns from stored runs
only). Each step's output, its two files and its workers' logs stay in
build/bisect/ (the last bisect's only), with the summary in bisect.txt.

A step is
- slower: the rule says regressed and the whole 95% interval of the slowdown
  lies above the bar;
- not slower: the interval's upper end is at or below the bar;
- unknown: neither (the interval straddles the bar). It runs again with about
  twice the paired rounds (11, 21, 41 by default) instead of guessing; still
  unknown at the cap, it is stepped around like an untestable commit, so the
  answer may be a range, never a guess;
- untestable: the commit cannot be checked out or imported, its tests differ
  (the session refuses such a head), or the test failed for another reason
  than the gate's timing verdicts (its loss did not descend, its engine did
  not build): stepped around, as `git bisect skip` does.

BAD is measured first and must be slower; otherwise the bisect stops and says
so. The search runs over BAD's first-parent history since GOOD (`git rev-list
--first-parent GOOD..BAD`), each step the open commit nearest the middle.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field, replace
from itertools import takewhile
from pathlib import Path
from typing import Callable

import pytest

from gpuengine.bench.json_files import JsonFileError, load_json, write_text
from gpuengine.gate.rules.paired import MIN_ROUNDS, PREFERRED_ROUNDS
from gpuengine.gate.rules.verdicts import REGRESSED

from .ab.checkout import BaseError, git
from .ab.session import LOG_DIR as AB_LOG_DIR
from .harness import TIMING_FAILURES

SLOWER, NOT_SLOWER, UNKNOWN, UNTESTABLE = "slower", "not slower", "unknown", "untestable"
LOG_DIR = Path("build") / "bisect"
FIRST_ROUNDS, MAX_ROUNDS = PREFERRED_ROUNDS[0], 41   # a step's paired rounds: 11, then 21 and 41 while unknown
USAGE_STATUSES = (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR,
                  pytest.ExitCode.NO_TESTS_COLLECTED)   # the session refused the head, or ran nothing
STOPPED = {NOT_SLOWER: "BAD is not slower than GOOD: nothing to bisect",
           UNKNOWN: "BAD is not clearly slower than GOOD at the most rounds: nothing to bisect (--max-rounds raises "
                    "the cap)",
           UNTESTABLE: "BAD cannot be measured against GOOD"}


class BisectError(Exception):
    """The bisect cannot run as asked; the message names the problem."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:7]


@dataclass(frozen=True)
class Step:
    """One commit against GOOD: its outcome and, where it was measured, the rule's verdict of its last attempt."""

    commit: Commit
    outcome: str                       # SLOWER, NOT_SLOWER, UNKNOWN or UNTESTABLE
    rounds: tuple[int, ...] = ()       # paired rounds of each attempt
    verdict: str | None = None         # the paired rule's word
    slowdown: float | None = None      # median head/base - 1
    interval: tuple[float, float] | None = None
    bar: float | None = None
    why: str = ""                      # what made it untestable
    test: str | None = None            # the test's node id, as the session named it

    def describe(self) -> str:
        if self.slowdown is None:
            return f"{self.outcome}: {self.why}"
        low, high = self.interval
        return (f"{self.outcome}: head {self.slowdown:+.1%} vs GOOD (95% CI {low:+.1%}..{high:+.1%}, bar "
                f"{self.bar:.1%}, {self.verdict}; {'+'.join(map(str, self.rounds))} paired rounds)")


def classify(check: dict) -> str:
    """SLOWER, NOT_SLOWER or UNKNOWN from the paired rule's record (paired.PairedDecision.as_dict)."""
    low, high = check["interval"]
    if check["verdict"] == REGRESSED and low > check["bar"]:
        return SLOWER
    return NOT_SLOWER if high <= check["bar"] else UNKNOWN


def round_schedule(first: int, cap: int) -> list[int]:
    """The paired rounds of a step's attempts: `first`, then 2n - 1 (odd, so the median is one round) up to `cap`."""
    rounds = [first]
    while rounds[-1] < cap:
        rounds.append(min(cap, 2 * rounds[-1] - 1))
    return rounds


def measure(commit: Commit, attempt: Callable[[Commit, int], Step], schedule: list[int]) -> Step:
    """The commit's step: attempts with more rounds while unknown, each a session of its own; the last attempt's
    verdict, carrying every attempt's rounds (two sessions' rounds are not pooled: each has its process offsets)."""
    done: list[int] = []
    for rounds in schedule:
        step = attempt(commit, rounds)
        done.append(rounds)
        if step.outcome != UNKNOWN:
            break
    return replace(step, rounds=tuple(done))


@dataclass
class Bisection:
    steps: list[Step] = field(default_factory=list)   # in the order they ran, BAD's first
    first_bad: list[Commit] = field(default_factory=list)   # the commit, or the range skipped steps leave open
    culprit: Step | None = None                       # the measured step of first_bad's last commit
    stopped: str | None = None                        # why there is no answer


def search(commits: list[Commit], step_of: Callable[[Commit], Step]) -> Bisection:
    """Binary search over `commits` (oldest first, BAD last; GOOD is before them) with `step_of` each."""
    result = Bisection()
    bad_step = step_of(commits[-1])
    result.steps.append(bad_step)
    if bad_step.outcome != SLOWER:
        result.stopped = STOPPED[bad_step.outcome]
        return result
    good, bad, culprit, skipped = -1, len(commits) - 1, bad_step, set()
    while True:
        open_ = [i for i in range(good + 1, bad) if i not in skipped]
        if not open_:
            break
        middle = (good + bad) // 2
        i = min(open_, key=lambda j: (abs(j - middle), j))
        step = step_of(commits[i])
        result.steps.append(step)
        if step.outcome == SLOWER:
            bad, culprit = i, step
        elif step.outcome == NOT_SLOWER:
            good = i
        else:
            skipped.add(i)
    result.first_bad, result.culprit = commits[good + 1:bad + 1], culprit
    return result


def first_parent_commits(root: Path, good: str, bad: str) -> tuple[Commit, list[Commit]]:
    """GOOD, and BAD's first-parent commits since GOOD, oldest first; a BisectError names what is wrong."""
    try:
        good_sha, bad_sha = (git(root, "rev-parse", "--verify", f"{rev}^{{commit}}") for rev in (good, bad))
    except BaseError as exc:
        raise BisectError(f"not a commit here: {exc}") from None
    if subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", good_sha, bad_sha]).returncode != 0:
        raise BisectError(f"GOOD {good} is not an ancestor of BAD {bad}: nothing between them to bisect")
    listed = git(root, "log", "--first-parent", "--reverse", "--format=%H %s", f"{good_sha}..{bad_sha}")
    commits = [Commit(*(line.split(" ", 1) + [""])[:2]) for line in listed.splitlines()]
    if not commits:
        raise BisectError(f"GOOD {good} and BAD {bad} are the same commit")
    return Commit(good_sha, git(root, "log", "-1", "--format=%s", good_sha)), commits


def junit_problem(path: Path) -> str | None:
    """The message of the test's failure, error or skip in a --junitxml file; None where it passed (or none ran)."""
    try:
        tree = ElementTree.parse(path)
    except (OSError, ElementTree.ParseError):
        return None
    for case in tree.iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                return f"{child.tag}: {child.get('message') or (child.text or '').strip()}"
    return None


def session_problem(log: Path, status: int) -> str:
    """Why a session ran no test: the gate's own message in its output (a refused head names itself, its indented
    lines the tests and why), else pytest's last line."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    for i, line in enumerate(lines):
        if "gpuengine: " in line:
            said = [line.split("gpuengine: ", 1)[1], *takewhile(lambda more: more.startswith("  "), lines[i + 1:])]
            return " ".join(part.strip() for part in said).rstrip(" !")
    tail = [line.strip() for line in lines if line.strip()][-1:]
    return f"pytest exit status {status}" + (f": {tail[0]}" if tail else "")


class Session:
    """One attempt: `pytest perf_tests --against GOOD --head COMMIT --ab-rounds N`, read back as a Step."""

    def __init__(self, root: Path, good: Commit, pytest_args: list[str], log_dir: Path):
        self.root, self.good, self.pytest_args, self.log_dir = root, good, pytest_args, log_dir
        self.count = 0

    def __call__(self, commit: Commit, rounds: int) -> Step:
        self.count += 1
        name = self.log_dir / f"{self.count:02d}-{commit.short}-r{rounds}"
        json_path, xml_path, log_path = (name.with_suffix(suffix) for suffix in (".json", ".xml", ".log"))
        command = [sys.executable, "-m", "pytest", "perf_tests", "-m", "not slow", "-p", "no:cacheprovider",
                   *self.pytest_args, "--against", self.good.sha, "--head", commit.sha, "--ab-rounds", str(rounds),
                   f"--benchmark-json={json_path}", f"--junitxml={xml_path}"]
        with open(log_path, "w") as log:
            log.write(" ".join(command) + "\n\n")
            log.flush()
            status = subprocess.run(command, cwd=self.root, stdout=log, stderr=subprocess.STDOUT).returncode
        workers = self.root / AB_LOG_DIR
        if workers.is_dir():   # the next session clears them
            shutil.copytree(workers, name.with_name(name.name + "-workers"), dirs_exist_ok=True)
        return self.read(commit, status, json_path, xml_path, log_path)

    def read(self, commit: Commit, status: int, json_path: Path, xml_path: Path, log_path: Path) -> Step:
        try:
            benchmarks = load_json(json_path)["benchmarks"] if json_path.stat().st_size else []
        except (OSError, JsonFileError, KeyError, TypeError):
            benchmarks = []
        problem = junit_problem(xml_path)
        if status in USAGE_STATUSES or not benchmarks:
            return Step(commit, UNTESTABLE, why=problem or session_problem(log_path, status))
        if len(benchmarks) != 1:
            names = ", ".join(bench["fullname"] for bench in benchmarks)
            raise BisectError(f"{' '.join(self.pytest_args)} selects {len(benchmarks)} tests ({names}): a bisect "
                              "follows one; name it with -k")
        bench = benchmarks[0]
        check = bench.get("extra_info", {}).get("stored_run_check") or {}
        if check.get("mode") != "A/B":
            raise BisectError(f"{bench['fullname']} did not run A/B (its module names no ENGINES recipe for it): "
                              "a bisect needs a test whose engine a base and a head can build")
        if problem and not any(words in problem for words in TIMING_FAILURES):
            return Step(commit, UNTESTABLE, why=problem, test=bench["fullname"])
        return Step(commit, classify(check), verdict=check["verdict"], slowdown=check["slowdown"],
                    interval=tuple(check["interval"]), bar=check["bar"], test=bench["fullname"])


def report(good: Commit, bad: Commit, result: Bisection, log_dir: Path) -> str:
    """The answer, then the table of steps, as printed and kept in bisect.txt."""
    test = next((step.test for step in result.steps if step.test), None) or "the test"
    lines = [f"gate bisect: {test}, GOOD {good.short} ({good.subject[:50]}) to BAD {bad.short}"]
    if result.stopped:
        lines.append(f"{result.stopped}: {result.steps[0].describe()}")
    elif len(result.first_bad) == 1:
        lines.append(f"first bad commit: {bad_line(result.first_bad[0], result.culprit)}")
    else:
        lines.append(f"the first bad commit is one of these {len(result.first_bad)}: the steps between could not "
                     "be measured or stayed unknown at the most rounds")
        lines += [f"  {commit.short} {commit.subject}" for commit in result.first_bad]
        lines.append(f"the last of them: {bad_line(result.first_bad[-1], result.culprit)}")
    rows = [("step", "commit", "subject", "outcome", "verdict", "slowdown", "95% CI", "bar", "rounds")]
    for number, step in enumerate(result.steps, 1):
        measured = step.slowdown is not None
        rows.append((str(number), step.commit.short, step.commit.subject[:40], step.outcome, step.verdict or "",
                     f"{step.slowdown:+.1%}" if measured else "",
                     f"{step.interval[0]:+.1%}..{step.interval[1]:+.1%}" if measured else "",
                     f"{step.bar:.1%}" if measured else "", "+".join(map(str, step.rounds))))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    right = {0, 5, 6, 7}   # the numbers
    lines.append("")
    lines += ["  ".join(cell.rjust(width) if column in right else cell.ljust(width)
                        for column, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines += [f"step {number}, {step.commit.short}, untestable: {step.why}"
              for number, step in enumerate(result.steps, 1) if step.outcome == UNTESTABLE]
    return "\n".join(lines + ["", f"each step's output, JSON, junit XML and worker logs: {log_dir}"]) + "\n"


def bad_line(commit: Commit, step: Step) -> str:
    low, high = step.interval
    return (f"{commit.short} {commit.subject}: head {step.slowdown:+.1%} vs GOOD (95% CI {low:+.1%}..{high:+.1%}, "
            f"bar {step.bar:.1%}, {'+'.join(map(str, step.rounds))} paired rounds)")


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="./gate bisect", description=__doc__.split("\n\n")[0],
                                     epilog="Other arguments go to each step's pytest (--full, --gpuengine-*).")
    parser.add_argument("good", metavar="GOOD", help="a commit whose engine ran at the speed wanted")
    parser.add_argument("bad", metavar="BAD", help="a later commit whose engine is slower (measured first)")
    parser.add_argument("-k", dest="test", required=True, metavar="TEST",
                        help="pytest's -k: selects the one perf test to bisect (it must run A/B)")
    parser.add_argument("--rounds", type=int, default=FIRST_ROUNDS,
                        help=f"paired rounds of a step's first attempt (default {FIRST_ROUNDS}, at least {MIN_ROUNDS})")
    parser.add_argument("--max-rounds", type=int, default=MAX_ROUNDS,
                        help=f"the most paired rounds an unknown step runs again with (default {MAX_ROUNDS})")
    args, pytest_args = parser.parse_known_args(argv)
    if args.rounds < MIN_ROUNDS or args.max_rounds < args.rounds:
        parser.error(f"--rounds {args.rounds} --max-rounds {args.max_rounds}: need {MIN_ROUNDS} <= --rounds <= "
                     "--max-rounds")
    return args, ["-k", args.test, *pytest_args]


def main(argv: list[str] | None = None, root: Path | None = None) -> int:
    args, pytest_args = parse_args(argv)
    root = Path(root or Path.cwd()).resolve()
    log_dir = root / LOG_DIR
    try:
        good, commits = first_parent_commits(root, args.good, args.bad)
        shutil.rmtree(log_dir, ignore_errors=True)   # the last bisect's logs: one bisect's at a time
        log_dir.mkdir(parents=True)
        schedule = round_schedule(args.rounds, args.max_rounds)
        print(f"gate bisect: {len(commits)} first-parent commits after GOOD {good.short}, BAD {commits[-1].short} "
              f"measured first; A/B sessions of {' '.join(pytest_args)}, {'/'.join(map(str, schedule))} paired "
              f"rounds; logs in {log_dir}", flush=True)
        attempt = Session(root, good, pytest_args, log_dir)

        def step_of(commit: Commit) -> Step:
            step = measure(commit, attempt, schedule)
            print(f"  {commit.short} {commit.subject[:50]}: {step.describe()}", flush=True)
            return step

        result = search(commits, step_of)
    except BisectError as exc:
        print(f"gate bisect: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:   # the step's session got it too, and removed its worktrees
        print(f"gate bisect: interrupted; the steps so far are in {log_dir}", file=sys.stderr)
        return 130
    text = report(good, commits[-1], result, log_dir)
    write_text(log_dir / "bisect.txt", text)
    print("\n" + text, end="")
    return 1 if result.stopped else 0


if __name__ == "__main__":
    sys.exit(main())
