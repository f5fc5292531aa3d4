"""A perf run in markdown for a pull request or a CI job: `build/summary.md`, appended to $GITHUB_STEP_SUMMARY.

Read from the run as stored (pytest-benchmark's JSON with the gate's keys:
each test's `stored_run_check`, its `ratio_checks`, `gpuengine_gate` and
`gpuengine_tier_time`), so one pytest session and a run spread over several
GPUs (gpuengine/gate/spread.py, merged by gpuengine/gate/store/spread_runs.py) are
summarised by the same code, once per run. In order:

- the headline: passed or failed, the GPU, the tier, the commit, the verdicts counted, the tier's time;
- every failure in full: why (a regression's slowdown, 95% interval, bar and what the test could catch) and
  the exact `./gate perf` command that runs that test again the same way;
- the other verdicts worth a look (regressed off a GPU, improved, not comparable, no baseline), then the
  not-significant tests grouped in a collapsed table, so an all-green run fits one screen;
- claims and targets not met, what the A/B tests could catch, the stack, each workload's time (collapsed).

Each section is a function of `RunFacts` in SECTIONS; a caller adds its own as `Section`s (the profiles of
regressed tests, gpuengine/gate/regression_profiles.py). The file is written aside and renamed.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuengine.gate.rules import paired
from gpuengine.gate.changepoints import RECENT_RUNS
from gpuengine.bench.json_files import write_text
from gpuengine.bench.machine_info import CPU_TIER
from gpuengine.bench.stack_lock import stack_of
from gpuengine.gate.rules.verdicts import IMPROVED, NO_BASELINE, NOT_COMPARABLE, NOT_SIGNIFICANT, REGRESSED

SUMMARY_PATH = Path("build") / "summary.md"
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"   # GitHub Actions shows what a step appends to this file
QUICK_TIER_GOAL_S = 600.0   # tier_time.QUICK_TIER_GOAL_S, for runs that did not store their goal
STORED_RUN = re.compile(r"(?P<number>\d{4})_(?P<commit>[^_/]+)_[^/]*\.json$")   # pytest-benchmark's file names
VERSIONS = (("gpu_driver", "driver"), ("cuda_runtime", "CUDA"), ("cudnn", "cuDNN"), ("cupy", "CuPy"),
            ("torch", "torch"), ("nvmath", "nvmath"), ("python_version", "Python"))


@dataclass(frozen=True)
class Section:
    title: str
    lines: list[str]


@dataclass(frozen=True)
class VerdictRow:
    """One test's verdict as the summary shows it, from either rule's record (its `stored_run_check`)."""

    test: str
    verdict: str
    slowdown: float | None = None
    interval: tuple[float, float] | None = None
    bar: float | None = None          # the slowdown the median had to exceed (stored-run rule: its min effect)
    catches: float | None = None      # the slowdown its noise let the rule catch 95% of the time (A/B only)
    against: str = ""                 # the base, or the stored run it was compared with
    reason: str = ""
    rerun_against: str | None = None  # what `./gate perf` takes to compare it so again: --against's value, or
                                      # "--against-stack SPEC"; None where the run does not say

    @classmethod
    def from_record(cls, test: str, record: dict, ab: dict | None = None) -> "VerdictRow":
        verdict = str(record.get("verdict", "?"))
        if record.get("mode") == "A/B":
            ab = ab or {}
            why = str(ab.get("base_why", ""))
            rerun = ab["base_commit"][:12] if ab.get("base_commit") else (why if why.startswith("--against-") else None)
            return cls(test, verdict, record.get("slowdown"), _pair(record.get("interval")), record.get("bar"),
                       record.get("catches_95pct"), f"A/B against {record.get('base', '?')}", rerun_against=rerun)
        primary = record.get("primary") or {}
        return cls(test, verdict, primary.get("slowdown"), _pair(primary.get("ci95")), primary.get("min_effect"),
                   None, run_label(str(record.get("baseline_run") or record.get("stored_run") or "")),
                   "" if primary else str(record.get("reason", "")), rerun_against="none")


def run_label(label: str) -> str:
    """A stored run's label made short: 'Linux-CPython-3.12-64bit/0038_66b85b0d85..._20261127_211900.json' ->
    'stored run 0038 (66b85b0)'; anything else as it is."""
    match = STORED_RUN.search(label)
    if match is None:
        return label
    commit = match["commit"]
    return f"stored run {match['number']} ({commit[:7] if re.fullmatch('[0-9a-f]{8,40}', commit) else commit})"


def _pair(values) -> tuple[float, float] | None:
    return (float(values[0]), float(values[1])) if isinstance(values, list) and len(values) == 2 else None


class RunFacts:
    """What the summary says of one run, read once from its JSON; its exit status, and `notes` (where it was saved,
    workers that wrote nothing, ...)."""

    def __init__(self, run: dict, exit_status: int, notes: list[str] = ()):
        self.run, self.exit_status, self.notes = run, exit_status, list(notes)
        machine = self.run.get("machine_info") or {}
        self.machine = machine
        self.tier_time = self.run.get("gpuengine_tier_time") or {}
        self.gate = self.run.get("gpuengine_gate") or {}
        self.on_gpu = bool(self.tier_time.get("on_gpu", machine.get("tier", CPU_TIER) != CPU_TIER))
        self.full = self.tier_time.get("tier") == "full"
        self.benchmarks = {b["fullname"]: b for b in self.run.get("benchmarks", []) if "fullname" in b}
        self.verdicts = sorted((VerdictRow.from_record(name, info["stored_run_check"], info.get("ab"))
                                for name, b in self.benchmarks.items()
                                if isinstance((info := b.get("extra_info") or {}).get("stored_run_check"), dict)),
                               key=lambda v: v.test)
        reasons = self.gate.get("failures") or {}
        failed = set(self.gate.get("failed_otherwise", [])) | set(self.gate.get("failed_on_targets_only", []))
        self.failures = {test: str(reasons.get(test, "failed (the session's log says why)")) for test in sorted(failed)}

    def ratio_checks(self, kind: str) -> list[tuple[str, dict]]:
        """(test, check) of every `kind` ("claim", "target") the run measured and missed."""
        return [(name, check) for name, b in self.benchmarks.items()
                for check in (b.get("extra_info") or {}).get("ratio_checks") or []
                if check.get("kind") == kind and check.get("passed") is False]

    def reproduce(self, test: str) -> str:
        """The `./gate perf` command that runs `test` again as this run did: its base, tier and policy. A test that
        failed before its verdict takes the session's A/B base where any test had one, else ./gate perf's default."""
        verdict = next((v for v in self.verdicts if v.test == test), None)
        against = verdict.rerun_against if verdict else next(
            (v.rerun_against for v in self.verdicts if v.against.startswith("A/B") and v.rerun_against), None)
        words = ["./gate", "perf"]
        if against is not None:
            words += shlex.split(against) if against.startswith("--against-") else ["--against", against]
        words += ["--full"] if self.full else (["--claims"] if self.gate.get("targets_fail") else [])
        module, _, name = test.partition("::")
        return shlex.join([*words, "-k", f"{Path(module).name} and {name}" if name else test])


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1%}"


def interval(values: tuple[float, float] | None) -> str:
    return "—" if values is None else f"{values[0]:+.1%}..{values[1]:+.1%}"


def level(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def verdict_table(verdicts: list[VerdictRow]) -> list[str]:
    rows = ["| test | verdict | slowdown | 95% interval | bar | catches | compared with |",
            "|---|---|---|---|---|---|---|"]
    return rows + [f"| `{cell(v.test)}` | {v.verdict} | {percent(v.slowdown)} | {interval(v.interval)} | "
                   f"{level(v.bar)} | {level(v.catches)} | {cell(v.against)} |" for v in verdicts]


def collapsed(summary: str, lines: list[str]) -> list[str]:
    """A <details> block: GitHub shows its summary line and opens it on a click."""
    return [f"<details><summary>{summary}</summary>", "", *lines, "", "</details>"]


def headline(facts: RunFacts) -> list[str]:
    status = ("passed" if facts.exit_status == 0 else "interrupted: no verdict, nothing saved"
              if facts.exit_status == pytest.ExitCode.INTERRUPTED else f"FAILED (exit status {facts.exit_status})")
    commit = (facts.run.get("commit_info") or {})
    commit_text = f"commit `{str(commit.get('id', '?'))[:12]}`" + (" (uncommitted changes)" if commit.get("dirty")
                                                                    else "")
    tier = "nightly tier" if facts.full else "quick tier"
    where = facts.machine.get("gpu") if facts.on_gpu else "CPU tier (timings are smoke: nothing about timing gates)"
    counts: dict[str, int] = {}
    for v in facts.verdicts:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    order = [REGRESSED, IMPROVED, NOT_COMPARABLE, NO_BASELINE, NOT_SIGNIFICANT]
    counted = ", ".join(f"{counts[w]} {w}" for w in [*order, *sorted(set(counts) - set(order))] if w in counts)
    uncompared = len(facts.benchmarks) - len(facts.verdicts)   # no base and no stored run: the first baseline
    counted += (", " if counted else "") + f"{uncompared} compared with nothing" if uncompared else ""
    lines = [f"## gpuengine perf gate: {status}", "",
             f"**{where}**, {tier}, {commit_text}; {len(facts.benchmarks)} tests measured"
             + (f": {counted}" if counted else "") + (f"; {len(facts.failures)} failed" if facts.failures else "")]
    seconds = facts.tier_time.get("session_seconds")
    if isinstance(seconds, (int, float)):
        goal = facts.tier_time.get("quick_tier_target_s") or QUICK_TIER_GOAL_S
        judged = ""
        if facts.on_gpu and not facts.full:
            judged = f", {'within' if seconds <= goal else 'OVER'} the {goal / 60:.0f}-minute goal"
        lines += ["", f"Tier time: {seconds / 60:.1f} min{judged}" + ("" if facts.on_gpu else " (this machine's)")]
    return lines + ([""] + [f"- {note}" for note in facts.notes] if facts.notes else [])


def failures(facts: RunFacts) -> list[str]:
    if not facts.failures:
        return []
    by_test = {v.test: v for v in facts.verdicts}
    lines = [f"### Failures ({len(facts.failures)})", ""]
    for test, why in facts.failures.items():
        verdict = by_test.get(test)
        if verdict is not None and verdict.verdict == REGRESSED:
            catches = "" if verdict.catches is None else f", catches {level(verdict.catches)}"
            why = (f"regressed: {percent(verdict.slowdown)} (95% CI {interval(verdict.interval)}), bar "
                   f"{level(verdict.bar)}{catches}; {verdict.against}")
        lines += [f"**`{test}`**: {why}", "", "```", facts.reproduce(test), "```", ""]
    return lines


def other_verdicts(facts: RunFacts) -> list[str]:
    """Regressions that did not fail (off a GPU) and improvements in a table; no verdict, with why, as a list."""
    moved = [v for v in facts.verdicts if v.verdict in (REGRESSED, IMPROVED) and v.test not in facts.failures]
    lines = []
    if moved:
        gated = "" if facts.on_gpu else " (CPU tier: recorded, not gated)"
        lines += [f"### Regressed or improved{gated}", "", *verdict_table(moved), ""]
    silent = [v for v in facts.verdicts if v.verdict in (NOT_COMPARABLE, NO_BASELINE)]
    if silent:
        lines += [f"### No verdict ({len(silent)})", ""]
        lines += [f"- `{v.test}`: {v.verdict}" + (f": {v.reason}" if v.reason else "") for v in silent] + [""]
    return lines


def not_significant(facts: RunFacts) -> list[str]:
    calm = [v for v in facts.verdicts if v.verdict == NOT_SIGNIFICANT]
    if not calm:
        return []
    return collapsed(f"{len(calm)} tests not significant (slowdown, interval, bar, what each could catch)",
                     verdict_table(calm))


def claims_and_targets(facts: RunFacts) -> list[str]:
    if not facts.on_gpu:
        return []
    lines = []
    claims = facts.ratio_checks("claim")
    if claims:
        lines += [f"### Claims not held ({len(claims)})", ""]
        lines += [f"- `{test}` vs {check.get('compared_with')}: {check.get('ratio', 0):.3f}x, claim "
                  f"{check.get('min_ratio')}x ({check.get('why', '')})" for test, check in claims] + [""]
    targets = facts.ratio_checks("target")
    if targets:
        fail = "fail their tests" if facts.gate.get("targets_fail") else "goals, not failures (--claims fails them)"
        lines += collapsed(f"{len(targets)} target(s) not met: {fail}",
                           [f"- `{test}` vs {check.get('compared_with')}: target {check.get('min_ratio')}x, measured "
                            f"{check.get('ratio', 0):.3f}x" for test, check in targets])
    return lines


def power(facts: RunFacts) -> list[str]:
    """What slowdown the A/B tests could catch at this run's noise (the paired rule's model), as the terminal says."""
    catches = {v.test: v.catches for v in facts.verdicts if v.catches is not None}
    said = paired.power_summary(catches)
    if not said:
        return []
    levels = [line for line in said if not line.startswith(" ")]
    missed = [line.strip() for line in said if line.startswith(" ")]
    lines = ["**What the A/B tests could catch** (95% of the time, at this run's noise):", ""]
    lines += [f"- {line}" for line in levels]
    return lines + ([""] + collapsed(f"{len(missed)} test(s) would not catch 10%", [f"- {m}" for m in missed])
                    if missed else [])


def stack(facts: RunFacts) -> list[str]:
    record = facts.machine.get("stack_lock") or {}
    lock = str(stack_of(facts.machine))
    lock += "" if not record else (", as locked" if record.get("matches") else ", differing from the lock")
    versions = [f"{label} {facts.machine[key]}" for key, label in VERSIONS if facts.machine.get(key)]
    config = facts.machine.get("gpuengine_config")
    return [f"**Stack**: {lock}; " + ", ".join(versions) + (f"; engine {config}" if config else "")]


def tier_time(facts: RunFacts) -> list[str]:
    workloads = facts.tier_time.get("per_workload") or {}
    if not workloads:
        return []
    rows = ["| workload | tests | seconds | timed rounds budget |", "|---|---|---|---|"]
    rows += [f"| {name} | {entry.get('tests', '?')} | {entry.get('seconds', 0):.1f} | "
             f"{entry.get('timed_rounds_budget_s') or '—'} |" for name, entry in workloads.items()]
    return collapsed("Time per workload (set-up included)", rows)


SECTIONS = (headline, failures, other_verdicts, claims_and_targets, not_significant, power, stack, tier_time)


def change_points(lines: list[str]) -> Section:
    """The change points the newest stored runs started (gpuengine/gate/changepoints.py's lines)."""
    return Section(f"Change points (newest {RECENT_RUNS} stored runs)", [f"- {line}" for line in lines])


def render(facts: RunFacts, extra: list[Section] = ()) -> str:
    """The summary's markdown: SECTIONS in order, then the callers' own sections, a blank line between blocks."""
    blocks = [section(facts) for section in SECTIONS] + [[f"### {s.title}", "", *s.lines] for s in extra]
    return "\n\n".join("\n".join(block).strip("\n") for block in blocks if block) + "\n"


def write(markdown: str, path: Path | str, environ=None) -> list[Path]:
    """`markdown` into `path` (aside, then renamed), and appended to $GITHUB_STEP_SUMMARY where that is set
    (other steps' summaries stay); the files written."""
    env = os.environ if environ is None else environ
    written = [write_text(path, markdown)]
    step_summary = env.get(STEP_SUMMARY_ENV)
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(("\n" if handle.tell() else "") + markdown)
        written.append(Path(step_summary))
    return written
