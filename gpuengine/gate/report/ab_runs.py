"""The gate's own record on a GPU: its newest A/B runs, their verdicts, and what each test's noise let it catch.

Every A/B run stores, per test, the gate's check (`extra_info["stored_run_check"]`, mode "A/B"): the
base it ran against, the verdict ("not significant", "regressed", "improved") and the slowdown the
session's noise let the rule catch 95% of the time (`catches_95pct`, gpuengine/gate/rules/paired.py). A run
whose base is its own commit is an A/A run: the same code on both sides, where every "regressed" is a
false alarm. This table is what the README's "Where the gate stands" reads, so its figures come from the
stored runs rather than from prose.
"""
from __future__ import annotations

from collections import Counter

from .sections import run_took, run_text
from .store import Run, TierRuns
from .tables import NONE, Table

AB = "A/B"
NEWEST = 6   # runs shown: a few sessions' worth


def ab_checks(run: Run) -> list[dict]:
    """The gate's A/B check of each test of `run` that ran A/B."""
    checks = (bench.info.get("stored_run_check") for bench in run.benchmarks.values())
    return [check for check in checks if isinstance(check, dict) and check.get("mode") == AB]


def _caught(checks: list[dict], slowdown: float) -> str:
    known = [check["catches_95pct"] for check in checks if isinstance(check.get("catches_95pct"), (int, float))]
    return f"{sum(c <= slowdown for c in known)} of {len(known)}" if known else NONE


def ab_runs_table(tier: TierRuns, newest: int = NEWEST) -> Table | None:
    """The `newest` runs of `tier` that ran A/B, newest first; None when none did."""
    runs = [run for run in reversed(tier.runs) if ab_checks(run)][:newest]
    if not runs:
        return None
    table = Table(f"The gate's newest A/B runs, {tier.title}: verdicts, and the slowdown each test could catch",
                  ["Run", "Head against base", "Tests run A/B", "Verdicts", "Would catch 5%", "Would catch 10%",
                   "Run took"])
    for run in runs:
        checks = ab_checks(run)
        bases = sorted({str(check.get("base")) for check in checks})
        same = bases == [run.short_commit]
        verdicts = Counter(str(check.get("verdict")) for check in checks)
        table.add(run_text(run), f"{run.short_commit} against {', '.join(bases)}" + (" (A/A)" if same else ""),
                  f"{len(checks)} of {len(run.benchmarks)}",
                  ", ".join(f"{n} {verdict}" for verdict, n in verdicts.most_common()),
                  _caught(checks, 0.05), _caught(checks, 0.10), run_took(run.tier_time))
    table.caption = ("A/A: the same commit on both sides, where a \"regressed\" is a false alarm. Would catch: the "
                     "tests whose session noise let the rule catch that slowdown 95% of the time (catches_95pct; "
                     "runs before the gate recorded it: —). Run took: the pytest session as the run recorded it; a "
                     "run spread over several GPUs keeps its first GPU's session (docs/gate.md, \"Several GPUs\", "
                     "has the whole).")
    return table
