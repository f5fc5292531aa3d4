"""The README's headline: per GPU and workload, the claims the newest measurement of each case holds, and the
targets not met yet.

Every rule of `baselines_store/thresholds.json` with a floor is a claim or a
target (its `kind`): a claim has held in the stored runs and fails the gate
when missed; a target is a goal not met yet, listed and not failed (only
`./gate perf --claims` and the nightly tier fail on it). Per workload the
table counts the claims the newest measurement of each case holds, under the
rules as they are now (claims.py), names the case closest to
its claim, says for each target its floor and the lowest measured ratio, and
names the runs those measurements come from, a failed run said to be one. The
same table opens each GPU tier in the report and in `docs/results.md`.
"""
from __future__ import annotations

from gpuengine.bench.thresholds import CLAIM, TARGET, ThresholdRule, measured_text
from .ab_runs import ab_runs_table
from .claims import Measured, newest_checks
from .sections import run_text, workload_name
from .store import TierRuns
from .tables import NONE, Table, speedup, to_markdown

CAPTION = ("Claims held: the rules of baselines_store/thresholds.json that have held (a floor under the engine's "
           "measured lead, or the target itself where it is met); a missed claim fails the gate. Targets: goals "
           "not met yet, each with its floor, the lowest ratio measured (its case, and the engine's fraction "
           "of the GPU's measured GEMM peak there) and whether every case met it; a missed target fails only "
           "./gate perf --claims and the nightly tier. Both against the newest measurement of each case and "
           "today's rules. Runs: the run, its commit and date, and whether it passed the gate.")


def _margin(measured: Measured) -> float:
    return measured.check.ratio / measured.check.min_ratio


def _times(ratio: float, floor: float) -> str:
    return measured_text(ratio, floor).replace("x", "×")


def claims_cell(claims: list[Measured]) -> str:
    if not claims:
        return "none yet"
    held = sum(m.check.passed for m in claims)
    return f"{held} of {len(claims)}" + ("" if held == len(claims) else f" ({len(claims) - held} missed)")


def closest_cell(claims: list[Measured]) -> str:
    if not claims:
        return NONE
    worst = min(claims, key=_margin)
    check = worst.check
    return f"{worst.bench.case}: {speedup(check.ratio)} {check.against}, claim {speedup(check.min_ratio)}"


def _peak(measured: Measured) -> str:
    """', the engine at 41% of peak': its achieved FLOP/s over the GPU's measured GEMM peak, where recorded."""
    fraction = (measured.bench.info.get("fraction_of_peak") or {}).get(measured.bench.engine)
    if not isinstance(fraction, (int, float)):
        return ""
    percent = 100 * fraction
    return f", the engine at {percent:.2g}% of peak" if percent < 10 else f", the engine at {percent:.0f}% of peak"


def targets_cell(targets: list[Measured]) -> str:
    """'1.25× torch_graph_best: 1.10× (cifar100-..., torch_compile_graph in 5 of 5 rounds, the engine at 41% of
    peak), not met, 0 of 2 cases met' per target floor and reference, with the runner the lowest ratio was over
    where the rule's reference is derived (torch_graph_best, torch_best) and the engine's fraction of the GPU's
    measured GEMM peak where the case records one."""
    groups: dict[tuple[str, float], list[Measured]] = {}
    for measured in targets:
        groups.setdefault((measured.check.reference, measured.check.min_ratio), []).append(measured)
    cells = []
    for (reference, floor), found in groups.items():
        lowest = min(found, key=lambda m: m.check.ratio)
        met = sum(m.check.passed for m in found)
        over = "" if lowest.check.compared_with == reference else f", {lowest.check.compared_with}"
        cell = (f"{floor:g}× {reference}: {_times(lowest.check.ratio, floor)} ({lowest.bench.case}{over}"
                f"{_peak(lowest)}), "
                + ("met" if met == len(found) else "not met"))
        cells.append(cell + (f", {met} of {len(found)} cases met" if len(found) > 1 else ""))
    return "\n".join(cells) or NONE   # one target a line


def headline_table(tier: TierRuns, rules: list[ThresholdRule]) -> Table:
    table = Table(f"Claims and targets by workload, {tier.title}: the newest measurement of each case",
                  ["Workload", "Claims held", "Closest case (ratio, claim)", "Targets (floor: lowest measured)",
                   "Runs"])
    by_workload: dict[str, list[Measured]] = {}
    for measured in newest_checks(tier, rules):
        by_workload.setdefault(measured.bench.function, []).append(measured)
    for function, found in sorted(by_workload.items(), key=lambda kv: workload_name(kv[0])):
        claims = [m for m in found if m.check.kind == CLAIM]
        targets = [m for m in found if m.check.kind == TARGET]
        runs = sorted({m.run.path: m.run for m in found}.values(), key=lambda r: r.when)
        table.add(workload_name(function), claims_cell(claims), closest_cell(claims), targets_cell(targets),
                  "\n".join(run_text(r) for r in runs))
    table.caption = CAPTION
    return table


def headline_markdown(tiers: list[TierRuns], rules: list[ThresholdRule]) -> str:
    """The README's generated block: per GPU tier, the headline table and the gate's newest A/B runs."""
    blocks = [to_markdown(table) for tier in tiers if tier.on_gpu and tier.runs
              for table in (headline_table(tier, rules), ab_runs_table(tier)) if table is not None]
    return "\n\n".join(blocks) if blocks else "No GPU tier has a stored run yet."
