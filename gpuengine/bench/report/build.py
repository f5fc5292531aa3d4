"""Building the report: the parts of each tier's section, the figures, the page, and the README's Markdown.

`build_report` writes `<out>/index.html` and `<out>/figures/<tier>/*.png` from a store into a scratch
folder beside `<out>`, which replaces the whole of `<out>` only once everything is drawn, so a failure
leaves the previous report whole and a reader never meets half of one. What it left out, and why, is in
`Report.notices` (and on the page); a store that does not exist, or an `<out>` that holds other files
than a report's, stops it (`ReportError`). A store with no run at all leaves an existing report alone.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import figures, html, sections
from .headline import headline_table
from .parts import FigureRef, Part, TierSection
from .seeds import seed_tables
from .store import ReportError, Store, TierRuns, load_store
from .tables import FAILED_RUN, to_markdown

INDEX = "index.html"
FIGURES = "figures"


@dataclass(frozen=True)
class Report:
    index: Path
    figures: list[Path]
    notices: list[str]
    kept: bool = False   # the store held no run: the report already in place was left as it was


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
                    + (f"; {failed} of them failed the gate (kept under history/, shaded)." if failed else "."))
        if len(runs) < 2:
            notices.append(f"{tier.name}/{series}: one stored run ({runs[0].label}), no history yet")
            part.intro = f"One stored run ({runs[0].label}, {runs[0].date}): no history yet."
            parts.append(part)
            continue
        functions = dict.fromkeys(b.function for run in runs for b in run.benchmarks.values() if b.samples_per_s)
        for function in functions:
            draw(part, f"history-{name}-{function}", f"history of {function} in {name}", figures.history_figure,
                 function, runs, store, tier.gpu)
        if functions:
            part.tables.append(sections.history_table(runs, store, tier.gpu))
        if any(b.info.get("max_batch") for run in runs for b in run.benchmarks.values()):
            part.tables.append(sections.max_batch_history(runs))
        parts.append(part)
    return parts


def tier_section(store: Store, tier: TierRuns, root: Path, notices: list[str]) -> tuple[TierSection, list[Path]]:
    draw = _Drawer(root, tier)
    stand = Part(f"{tier.name}-summary", "Where the engine stands",
                 "The claims that have held and the targets not met yet (baselines_store/thresholds.json), then "
                 "the speed-up over each PyTorch reference measured in the same run: the engine and the references "
                 "alternate round by round; bars are the median of per-round ratios, whiskers the lowest and "
                 "highest round.")
    if tier.on_gpu:
        stand.tables += [headline_table(tier, store.rules), sections.summary_table(tier)]
        draw(stand, "speedup", f"engine speed-up over PyTorch on {tier.title}", figures.speedup_figure, tier)
    else:
        stand.intro = ("The CPU tier times smoke shapes on NumPy, not the notes' workloads: see each workload "
                       "below; these timings never gate.")
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
             function, records)
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
    machines = Part(f"{tier.name}-machines", "Machine facts of each run", tables=[sections.machine_table(tier)])
    parts = [stand, seeds, workloads, peak, memory, *_history_parts(store, tier, draw, notices), machines]
    return TierSection(tier, parts), draw.drawn


def check_replaceable(out: Path) -> None:
    """ReportError unless `out` is missing, empty, or holds only a report (index.html, figures/): the
    build replaces the whole folder, so `--out` pointed at anything else must not cost its files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ReportError(f"{out}: not a folder; the report needs a folder of its own (--out)")
    foreign = sorted(p.name for p in out.iterdir() if p.name not in (INDEX, FIGURES))
    if foreign:
        raise ReportError(f"{out}: holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''} besides a "
                          f"report; the report replaces the whole folder, so give it a folder of its own (--out)")


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _swap_in(scratch: Path, out: Path) -> None:
    """Put the finished `scratch` folder in the place of `out`, whole: the old report is renamed aside,
    the new one renamed in, and the old one deleted. If the second rename fails, the old one goes back."""
    os.chmod(scratch, _umask_mode())   # mkdtemp made it private; the report is an ordinary folder
    if not out.exists():
        os.replace(scratch, out)
        return
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-old-"))
    os.replace(out, old)   # onto the empty folder mkdtemp reserved
    try:
        os.replace(scratch, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def build_report(store: Store | Path | str, out: Path | str) -> Report:
    """The page and figures of `store` (a loaded Store or its folder) as the folder `out`.

    Drawn into a scratch folder beside `out` and swapped in whole once finished: a failure part way
    leaves the previous report as it was. A store without a single run leaves an existing report alone
    (`Report.kept`): an emptied or mistyped store must not wipe the published numbers."""
    store = store if isinstance(store, Store) else load_store(store)
    out = Path(out)
    check_replaceable(out)
    notices = list(store.skipped)
    if not store.tiers and (out / INDEX).exists():
        return Report(out / INDEX, [], notices, kept=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-new-"))
    try:
        tier_sections, drawn = [], []
        for tier in store.tiers:
            section, figure_files = tier_section(store, tier, scratch, notices)
            tier_sections.append(section)
            drawn += figure_files
        (scratch / INDEX).write_text(html.render_page(store, tier_sections, notices), encoding="utf-8")
        _swap_in(scratch, out)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return Report(out / INDEX, [out / p.relative_to(scratch) for p in drawn], notices)


def markdown_report(store: Store) -> str:
    """docs/results.md: per GPU tier, the claims and targets, the speed-up summary, the seed tables and the energy
    readings, each figure the newest measurement of its test, a failed run's said to be one."""
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
        tables = [headline_table(tier, store.rules), sections.summary_table(tier), *seed_tables(tier)]
        energy = sections.energy_records(tier)
        if energy:
            tables.append(sections.energy_table(energy, tier))
        blocks += [to_markdown(table) for table in tables]
    return "\n\n".join(blocks) if blocks else "No GPU tier has a stored run yet."
