"""Building the report: the parts of each tier's section, the figures, the page, and the README's Markdown.

`build_report` writes `<out>/index.html` and `<out>/figures/<tier>/*.png` from a store into a scratch
folder beside `<out>`, which replaces the whole of `<out>` only once everything is drawn, so a failure
leaves the previous report whole and a reader never meets half of one. What it left out, and why, is in
`Report.notices` (and on the page). A store that does not exist or holds no run at all, or an `<out>` that
holds other files than a report's, stops it before anything is written (`ReportError`); a failure to
write the new report stops it with `PublishError`, naming `<out>` and the cause, the previous report
as it was and no scratch folder left.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import figures, history, html, sections
from .ab_runs import ab_runs_table
from .glance import strongest_table, tier_glance
from .headline import headline_table
from .parts import FigureRef, Part, TierSection
from .publish import FIGURES, INDEX, check_replaceable, swap_in
from .seeds import seed_tables
from .store import ReportError, Store, TierRuns, load_store
from .tables import FAILED_RUN, to_markdown

class PublishError(ReportError):
    """The new report could not be written or swapped in; the previous one is as it was."""


@dataclass(frozen=True)
class Report:
    index: Path
    figures: list[Path]
    notices: list[str]
    leftover: str | None = None   # the previous report, replaced but not deleted: why, and where it is


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


class _Drawer:
    """Draws a tier's figures into the scratch folder and names them relative to the page."""

    def __init__(self, root: Path, tier: TierRuns):
        self.root, self.tier, self.drawn = root, tier, []

    def __call__(self, part: Part, name: str, alt: str, draw, *args) -> None:
        rel = f"{FIGURES}/{self.tier.name}/{_slug(name)}.png"
        if draw(*args, self.root / rel) is not None:
            self.drawn.append(self.root / rel)
            part.figures.append(FigureRef(rel, alt))


def _history_parts(store: Store, tier: TierRuns, draw: _Drawer, notices: list[str]) -> list[Part]:
    parts = []
    for series, runs in tier.series().items():
        name = series or "speed runs"
        failed = sum(not run.passed for run in runs)
        part = Part(f"{tier.name}-history-{_slug(name)}", f"History: {name}",
                    f"{len(runs)} stored runs of {tier.name}/{series}, oldest first; one point per run"
                    + (f"; {failed} of them failed the gate (kept under history/, red crosses)." if failed else "."))
        if len(runs) < 2:
            notices.append(f"{tier.name}/{series}: one stored run ({runs[0].label}), no history yet")
            part.intro = f"One stored run ({runs[0].label}, {runs[0].date}): no history yet."
            parts.append(part)
            continue
        functions = dict.fromkeys(b.function for run in runs for b in run.benchmarks.values() if b.samples_per_s)
        found = history.History.of(tier, runs)
        for function in functions:
            draw(part, f"history-{name}-{function}", f"history of {function} in {name}", history.history_figure,
                 function, found, store)
        if found.analysis.unavailable:
            why = found.analysis.unavailable
            part.intro += f" {why[0].upper()}{why[1:]}."
        elif found.analysis.change_points:
            part.tables.append(history.change_point_table(found))
        elif found.analysis.series:
            part.intro += (f" No change point in {len(found.analysis.series)} series of its baselines "
                           f"({found.analysis.too_short} too short to tell).")
        if functions:
            part.tables.append(sections.history_table(runs, store, tier.gpu))
        if any(b.info.get("max_batch") for run in runs for b in run.benchmarks.values()):
            part.tables.append(sections.max_batch_history(runs))
        parts.append(part)
    return parts


def tier_section(store: Store, tier: TierRuns, root: Path, notices: list[str]) -> tuple[TierSection, list[Path]]:
    draw = _Drawer(root, tier)
    stand = Part(f"{tier.name}-summary", "Where the engine stands",
                 "Each headline case's speed-up over the strongest PyTorch reference it was measured against "
                 "(torch_graph_best from the newest run that timed it, as the tables below read it), then the "
                 "claims that have held and the targets not met yet (baselines_store/thresholds.json), then the "
                 "speed-up over each PyTorch reference: the engine and the references alternate round by round in "
                 "one run; bars are the median of per-round ratios, whiskers the lowest and highest round.")
    if tier.on_gpu:
        draw(stand, "speedup", f"engine speed-up over the strongest PyTorch reference each headline case was "
                               f"measured against, {tier.title}", figures.speedup_figure, tier)
        stand.tables += [headline_table(tier, store.rules), sections.summary_table(tier),
                         *filter(None, [strongest_table(tier)])]
    else:
        stand.intro = ("The CPU tier times smoke shapes on NumPy, not the notes' workloads: see each workload "
                       "below; these timings never gate.")
    gate_runs = ab_runs_table(tier)
    gate = Part(f"{tier.name}-gate", "The gate's A/B runs",
                "Whether the gate stays green on unchanged code (A/A) and what slowdown each test could catch, "
                "from what each A/B run stored of its verdicts.", tables=[gate_runs] if gate_runs else [])
    seeds = Part(f"{tier.name}-seeds", "The seed notes' headline tables",
                 "Each note's table in its own layout: the note's numbers (RTX 3060 Laptop), then this GPU's. "
                 "Hover a number for the test and run it comes from.")
    if tier.on_gpu:
        seeds.tables = seed_tables(tier)
    else:
        seeds.intro = "The CPU tier runs smoke shapes, not the notes' workloads: the seed tables are for GPU tiers."
    workloads = Part(f"{tier.name}-workloads", "Per workload: the engine and every reference")
    for function, records in sections.timed_workloads(tier).items():
        draw(workloads, f"workload-{function}", f"{function}: samples/s and speed-ups", figures.workload_figure,
             function, records, tier)
        workloads.tables.append(sections.workload_table(function, records, tier))
    peak = Part(f"{tier.name}-peak", "Fraction of the measured peak", tables=[sections.peak_table(tier)])
    draw(peak, "peak", "fraction of the measured GEMM peak per workload and precision", figures.peak_figure, tier)
    if not peak.tables[0].rows:
        peak.intro, peak.tables = "No stored run of this tier measured a peak (the CPU tier does not).", []
    memory = Part(f"{tier.name}-memory", "Max batch and energy per sample",
                  tables=sections.maxbatch_file_tables(tier))
    found = sections.max_batch_records(tier)
    if found:
        memory.tables.insert(0, sections.max_batch_table(found, tier))
        draw(memory, "max-batch", "largest batch under the memory cap", figures.max_batch_figure, found)
    energy = sections.energy_records(tier)
    if energy:
        memory.tables.append(sections.energy_table(energy, tier))
        draw(memory, "energy", "energy per training sample", figures.energy_figure, energy)
    if not memory.tables:
        memory.intro = "No stored run of this tier holds max-batch searches or energy readings."
    profiles = Part(f"{tier.name}-profiles", "Kernel profiles by op family",
                    "python -m gpuengine profile WORKLOAD: one training step of the engine and of each PyTorch "
                    "reference, every kernel timed by CUPTI through torch.profiler and grouped by op family, in "
                    "microseconds per step; the newest profile of each workload and toggle set.",
                    tables=sections.profile_tables(tier))
    if not profiles.tables:
        profiles.intro = ("No kernel profile was recorded on this tier (python -m gpuengine profile WORKLOAD "
                          "records one, on a GPU).")
    machines = Part(f"{tier.name}-machines", "Machine facts of each run", tables=[sections.machine_table(tier)])
    parts = [stand, *([gate] if gate_runs else []), seeds, workloads, peak, memory, profiles,
             *_history_parts(store, tier, draw, notices), machines]
    return TierSection(tier, parts, tier_glance(tier, store.rules)), draw.drawn


def build_report(store: Store | Path | str, out: Path | str) -> Report:
    """The page and figures of `store` (a loaded Store or its folder) as the folder `out`.

    Drawn into a scratch folder beside `out` and swapped in whole once finished: a failure part way
    (PublishError) leaves the previous report as it was. A store without a single run is a ReportError:
    an emptied or mistyped store must not wipe the published numbers."""
    store = store if isinstance(store, Store) else load_store(store)
    out = Path(out)
    check_replaceable(out)
    if not store.tiers:
        raise ReportError(f"{store.path}: no stored run, nothing to report; {out} is left as it was")
    notices = list(store.skipped)
    scratch = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-new-"))
        tier_sections, drawn = [], []
        for tier in store.tiers:
            section, figure_files = tier_section(store, tier, scratch, notices)
            tier_sections.append(section)
            drawn += figure_files
        (scratch / INDEX).write_text(html.render_page(store, tier_sections, notices), encoding="utf-8")
        left = swap_in(scratch, out)
        published, scratch = scratch, None   # swapped in: what is left at that name is swap_in's to delete
    except OSError as exc:
        raise PublishError(f"{out}: the report could not be written ({exc}); "
                           + ("the previous report is left as it was" if (out / INDEX).exists() else
                              "nothing was published")) from exc
    finally:
        if scratch is not None and scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return Report(out / INDEX, [out / p.relative_to(published) for p in drawn], notices, left)


def markdown_report(store: Store) -> str:
    """docs/results.md: per GPU tier, the claims and targets, the gate's A/B runs, the speed-up summary, every case
    against torch_graph_best, the seed tables and the energy readings, each figure the newest measurement of its
    test, a failed run's said to be one."""
    blocks = []
    for tier in store.tiers:
        if not tier.on_gpu:
            continue
        blocks.append(f"### {tier.gpu} (`baselines_store/{tier.name}/`)")
        failed = tier.failed_runs
        blocks.append(f"Each figure is the newest measurement of its test on this GPU, from {len(tier.runs)} stored "
                      "runs" + (f"; {len(failed)} of them failed the gate and are kept under `history/` "
                                f"({sections.runs_text(failed)}): their figures say \"{FAILED_RUN}\", beside the "
                                "baseline in force (the newest passing run of that test)." if failed else
                                ", all of which passed the gate."))
        tables = [headline_table(tier, store.rules), *filter(None, [ab_runs_table(tier)]), sections.summary_table(tier),
                  *filter(None, [strongest_table(tier)]), *seed_tables(tier)]
        energy = sections.energy_records(tier)
        if energy:
            tables.append(sections.energy_table(energy, tier))
        blocks += [to_markdown(table) for table in tables]
    return "\n\n".join(blocks) if blocks else "No GPU tier has a stored run yet."
