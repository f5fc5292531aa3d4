"""The engine against PyTorch at its strongest, and the report's first screen: per GPU, is the newest run green,
how fast is the engine, and against what.

Each headline case (sections.SUMMARY_CASES) is put against the strongest
PyTorch reference it was measured beside, the same measurement the tables
read: `torch_graph_best` (the faster of torch_graph and torch_compile_graph in
each round, stronger_reference.py) from the newest run that timed it, which
for a quick-tier run of a slow-compiling workload is an older nightly run;
where no run timed it, the PyTorch reference the engine led least in the
newest run. The headline figure draws these bars, and the first screen sums
them up beside the newest run's verdict and the claims and targets of
baselines_store/thresholds.json (claims.py). `strongest_table` lists every
case that ran beside torch_graph_best, per precision: what docs/seeds.md's
issue-21 section reads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import median

from gpuengine.bench.stronger_reference import STRONGER
from gpuengine.bench.thresholds import CLAIM, TARGET, ThresholdRule
from .claims import Measured, newest_checks
from .sections import PYTORCH_REFERENCES, beside_strongest, source, summary_rows, workload_name
from .store import Benchmark, Run, TierRuns
from .tables import NONE, Cell, Table, plural, speedup


@dataclass(frozen=True)
class Strongest:
    """One headline case's speed-up over the strongest PyTorch reference it was measured against."""

    case: str         # "MLP train, 1 batch/epoch · tf32"
    run: Run
    bench: Benchmark
    reference: str    # torch_graph_best, or the PyTorch runner the engine led least where none timed it

    @property
    def ratio(self) -> dict:
        """{"median", "low", "high", ...}: the engine's same-run speed-up over `reference`."""
        return self.bench.ratio(self.reference)

    @property
    def label(self) -> str:
        """'torch_compile_graph in 14 of 14 rounds' for torch_graph_best, '' otherwise."""
        return self.ratio.get("label") or ""


def strongest_reference(bench: Benchmark) -> str | None:
    """torch_graph_best where `bench` timed it, else the PyTorch reference whose speed-up is the lowest."""
    if bench.ratio(STRONGER) is not None:
        return STRONGER
    timed = [ref for ref in PYTORCH_REFERENCES if bench.ratio(ref) is not None]
    return min(timed, key=lambda ref: bench.ratio(ref)["median"]) if timed else None


def headline_speedups(tier: TierRuns) -> list[Strongest]:
    """Each stored headline case against the strongest reference it was measured beside (this module's doc)."""
    found = []
    for label, precision, record in summary_rows(tier):
        if record is None:
            continue
        run, bench = record
        if bench.ratio(STRONGER) is None:
            run, bench = beside_strongest(tier, bench) or (run, bench)
        reference = strongest_reference(bench)
        if reference is not None:
            found.append(Strongest(f"{label} · {precision}", run, bench, reference))
    return found


@dataclass(frozen=True)
class TierGlance:
    """What the first screen says of one tier."""

    tier: TierRuns
    claims: list[Measured]
    targets: list[Measured]
    speedups: list[Strongest]

    @property
    def newest(self) -> Run | None:
        return self.tier.runs[-1] if self.tier.runs else None   # a tier may hold profiles alone

    def newest_text(self) -> str:
        """'0039 66b85b0 on main, 2026-11-27 21:27'; a run of a series of its own says which ('slow')."""
        run = self.newest
        if run is None:
            return "no pytest-benchmark run"
        series = f" ({run.series} series)" if run.series else ""
        return f"{run.label}{series}{f' on {run.branch}' if run.branch else ''}, {run.date}"

    def stack_text(self) -> str:
        """'driver 580.95, CUDA 13.0, torch 2.9.1' of the newest run, the facts it recorded."""
        machine = self.newest.machine if self.newest else {}
        facts = (("driver", "gpu_driver"), ("CUDA", "cuda_runtime"), ("cuDNN", "cudnn"), ("torch", "torch"))
        return ", ".join(f"{name} {machine[key]}" for name, key in facts if machine.get(key))

    def claims_text(self) -> str:
        """'35 of 35 held' or '33 of 35 held, 2 missed'."""
        if not self.claims:
            return "none yet"
        held = sum(m.check.passed for m in self.claims)
        return f"{held} of {len(self.claims)} held" + ("" if held == len(self.claims) else
                                                        f", {len(self.claims) - held} missed")

    def targets_text(self) -> str:
        """'3 of 14 met': a target rule is met where every case it decides meets it."""
        rules: dict[int, list[Measured]] = {}
        for measured in self.targets:
            rules.setdefault(id(measured.check.rule), []).append(measured)
        if not rules:
            return "none"
        met = sum(all(m.check.passed for m in found) for found in rules.values())
        return f"{met} of {plural(len(rules), 'target')} met"

    def speedup_text(self) -> str:
        """'0.85–2.69× (median 1.52×) over 18 headline cases; PyTorch faster in 3 (ResNet-50 train, CIFAR-10:
        tf32, fp32, bf16)'."""
        if not self.speedups:
            return "no headline case measured"
        medians = sorted(s.ratio["median"] for s in self.speedups)
        slower: dict[str, list[str]] = {}   # workload -> its precisions
        for found in self.speedups:
            if found.ratio["median"] < 1.0:
                workload, _, precision = found.case.partition(" · ")
                slower.setdefault(workload, []).append(precision)
        text = (f"{speedup(medians[0])[:-1]}–{speedup(medians[-1])} (median {speedup(median(medians))}) over "
                f"{plural(len(medians), 'headline case')}")
        if slower:
            count = sum(len(precisions) for precisions in slower.values())
            text += f"; PyTorch faster in {count} (" + "; ".join(
                f"{workload}: {', '.join(precisions)}" for workload, precisions in slower.items()) + ")"
        return text

    def references_text(self) -> str:
        """'torch_graph_best in 15 cases, torch_graph in 3 (no run timed torch_graph_best)'."""
        counts: dict[str, int] = {}
        for found in self.speedups:
            counts[found.reference] = counts.get(found.reference, 0) + 1
        return ", ".join(f"{ref} in {plural(n, 'case')}" + ("" if ref == STRONGER else f" (no run timed {STRONGER})")
                         for ref, n in counts.items())


def tier_glance(tier: TierRuns, rules: list[ThresholdRule]) -> TierGlance:
    checks = newest_checks(tier, rules) if tier.on_gpu else []
    return TierGlance(tier, [m for m in checks if m.check.kind == CLAIM], [m for m in checks if m.check.kind == TARGET],
                      headline_speedups(tier) if tier.on_gpu else [])


def _without_precision(case: str, precision: str | None) -> str:
    """'tf32-graph8-resident-bpe1' -> 'graph8-resident-bpe1': the case's other parameters, its row."""
    parts = case.split("-")
    return "-".join(part for part in parts if part != precision) if precision in parts else case


def _natural(text: str) -> list:
    """'b512' before 'b2000': numbers compared as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def strongest_table(tier: TierRuns, precisions: tuple[str, ...] = ("tf32", "bf16", "fp32")) -> Table | None:
    """Every case that ran beside torch_graph_best (the nightly tier's), the engine's speed-up over it per
    precision: the newest measurement that timed it, and its run. None where no run of `tier` timed it."""
    cells: dict[tuple[str, str], dict[str, Strongest]] = {}
    for run, bench in tier.newest(lambda bench: bench.ratio(STRONGER) is not None and bool(bench.samples_per_s)):
        row = (bench.function, _without_precision(bench.case, bench.precision))
        cells.setdefault(row, {})[bench.precision or "?"] = Strongest(bench.name, run, bench, STRONGER)
    if not cells:
        return None
    shown = [p for p in precisions if any(p in found for found in cells.values())]
    table = Table(f"Against PyTorch at its strongest, {tier.title}: the engine's speed-up over {STRONGER} per case "
                  "and precision", ["Workload", "Case", *shown])
    for (function, case), found in sorted(cells.items(), key=lambda kv: (workload_name(kv[0][0]), _natural(kv[0][1]))):
        table.add(workload_name(function), case,
                  *(Cell(f"{speedup(found[p].ratio['median'])} ({found[p].run.label.split()[0]})",
                         source(found[p].run, found[p].bench), failed=not found[p].run.passed)
                    if p in found else Cell(NONE) for p in shown))
    table.caption = (f"{STRONGER}: the faster of torch_graph and torch_compile_graph in each round of the same run "
                     "(the nightly tier times it; the quick tier leaves torch_compile_graph out for most cases). "
                     "Each figure is the newest measurement that timed it, its run in brackets (in the report, hover "
                     "for the test and date); the rules over it are in the claims and targets table.")
    return table
