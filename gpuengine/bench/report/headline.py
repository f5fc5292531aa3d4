"""The README's headline: per GPU and workload, whether the newest measurement of every case holds its claims.

A claim is a rule of `baselines_store/thresholds.json` that a case's ratio was
checked against in its run (the benchmark's `ratio_checks`): the engine at
least k times a reference's speed. Per workload the table counts the claims the
newest measurement of each case held, names the case furthest below (or
closest above) its claim, and the runs those measurements come from, a failed
run said to be one. The full tables are the report's (`report/index.html`)
and `docs/results.md`'s.
"""
from __future__ import annotations

from .sections import run_text, workload_name
from .store import Benchmark, Run, TierRuns
from .tables import Table, speedup, to_markdown


def _checks(bench: Benchmark) -> list[dict]:
    return [c for c in bench.info.get("ratio_checks") or []
            if isinstance(c, dict) and c.get("min_ratio") and c.get("ratio") is not None]


def _margin(check: dict) -> float:
    return check["ratio"] / check["min_ratio"]


def headline_table(tier: TierRuns) -> Table:
    table = Table(f"Claims by workload, {tier.title}: the newest measurement of each case",
                  ["Workload", "Claims held", "Closest case (ratio, claim)", "Runs"])
    by_workload: dict[str, list[tuple[Run, Benchmark]]] = {}
    for run, bench in tier.newest(lambda b: bool(_checks(b))):
        by_workload.setdefault(bench.function, []).append((run, bench))
    for function, records in sorted(by_workload.items(), key=lambda kv: workload_name(kv[0])):
        checks = [(run, bench, check) for run, bench in records for check in _checks(bench)]
        held = sum(bool(check.get("passed")) for _, _, check in checks)
        run, bench, worst = min(checks, key=lambda rbc: _margin(rbc[2]))
        closest = (f"{bench.case}: {speedup(worst['ratio'])} {worst.get('compared_with') or worst['reference']}, "
                   f"claim {speedup(worst['min_ratio'])}")
        verdict = f"{held} of {len(checks)}" + ("" if held == len(checks) else f" ({len(checks) - held} missed)")
        runs = sorted({r.path: r for r, _ in records}.values(), key=lambda r: r.when)
        table.add(workload_name(function), verdict, closest, "; ".join(run_text(r) for r in runs))
    table.caption = ("A claim: the engine at least k times a reference's speed in the same run "
                     "(baselines_store/thresholds.json). A missed claim of a target not met yet is reported here "
                     "and in the report. Runs: the run, its commit and date, and whether it passed the gate.")
    return table


def headline_markdown(tiers: list[TierRuns]) -> str:
    """The README's generated block: one headline table per GPU tier."""
    blocks = [to_markdown(headline_table(tier)) for tier in tiers if tier.on_gpu and tier.runs]
    return "\n\n".join(blocks) if blocks else "No GPU tier has a stored run yet."
