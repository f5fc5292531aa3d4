"""The report's history: per test function, one row of small panels per case, and the change points marked.

Each case gets its own row (a dozen cases in one panel drew a smear): on the left the engine's time per
sample, on the right its speed-up over torch_graph (and over torch_graph_best where the runs measured it),
one point per stored run, the thresholds of `baselines_store/thresholds.json` dashed. The runs of a
tier's series share one x axis, oldest first, its ticks thinned to a few run numbers and dates; a run
that failed the gate is a red cross, outside the line. A change point (`gpuengine.gate.changepoints`,
baselines only) is a vertical dashed line between the last run before it and the first run after, labelled
with its size and commit range, on the panel of its series: red where the engine got slower, green where
faster. A dotted grey line marks where the runs' stack (lock) changed: series do not cross it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpuengine.gate import changepoints
from gpuengine.gate.changepoints import Analysis, ChangePoint, RunPoint
from gpuengine.bench.stack_lock import stack_of
from gpuengine.bench.stronger_reference import STRONGER
from .figures import CASE_COLOURS, RUNNER_COLOURS, _figure, _save
from .sections import HISTORY_REFERENCE, history_rule, workload_name
from .store import Benchmark, Run, Store, TierRuns
from .tables import Cell, Table

ROW_IN = 1.45          # inches per case
MAX_TICKS = 7          # run labels on the x axis
SLOWER, FASTER, FAILED, STACK = "#cf222e", "#1a7f37", "#b31d28", "#8c959f"
TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def run_point(run: Run) -> RunPoint:
    """The detector's view of a run of the report's store."""
    return RunPoint(run.label, run.commit, run.when, str(stack_of(run.machine)),
                    {name: bench.info for name, bench in run.benchmarks.items()}, run.passed)


@dataclass
class History:
    """A tier's series of runs (oldest first) and its change points."""

    tier: TierRuns
    runs: list[Run]
    points: list[RunPoint]
    analysis: Analysis

    @classmethod
    def of(cls, tier: TierRuns, runs: list[Run]) -> "History":
        points = [run_point(run) for run in runs]
        return cls(tier, runs, points, changepoints.analyse(points, tier.name))

    def x(self, point: RunPoint) -> int:
        return next(i for i, candidate in enumerate(self.points) if candidate is point)

    def marks(self, test: str) -> list[ChangePoint]:
        return [cp for cp in self.analysis.change_points if cp.series.test == test]


def _time_per_sample(bench: Benchmark) -> float | None:
    throughput = bench.throughput(bench.engine)
    return 1.0 / throughput if throughput else None


def _unit(values: list[float]) -> tuple[float, str]:
    smallest = min(values)
    return next(((scale, unit) for scale, unit in TIME_UNITS if smallest >= scale), TIME_UNITS[-1])


def _scale_axis(axis, values: list[float]) -> None:
    """Linear where the values stay within 4x of each other (a few % steps show), else log."""
    if values and max(values) > 4 * min(values):
        from matplotlib.ticker import FuncFormatter
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))   # 0.1, not 10^-1


def _headroom(axis) -> None:
    """A band above the data for the change points' labels, so that they hide no point."""
    low, high = axis.get_ylim()
    axis.set_ylim(low, high * (high / low) ** 0.45 if axis.get_yscale() == "log" else high + 0.45 * (high - low))


def _mark(axis, history: History, cp: ChangePoint, level: int, panel_reference: str | None) -> None:
    x = (history.x(cp.before) + history.x(cp.after)) / 2
    colour = SLOWER if cp.size > 0 else FASTER
    reference = cp.series.signal.removeprefix("time ratio to ")
    against = "" if cp.series.signal == changepoints.TIME or reference == panel_reference else f" vs {reference}"
    axis.axvline(x, color=colour, linestyle="--", linewidth=1.2, zorder=1)
    axis.annotate(f"{abs(cp.size):.1%} {'slower' if cp.size > 0 else 'faster'}{against}\n{cp.commits}",
                  (x, 1 - 0.12 * level), xycoords=("data", "axes fraction"), xytext=(3, -3),
                  textcoords="offset points", va="top", fontsize=6.5, color=colour,
                  bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})


def _draw_signal(axis, xs_values: list[tuple[int, float, bool]], colour: str, label: str | None = None,
                 dashed: bool = False) -> None:
    passed = [(x, v) for x, v, ok in xs_values if ok]
    failed = [(x, v) for x, v, ok in xs_values if not ok]
    if passed:
        axis.plot(*zip(*passed), marker="o", markersize=3, linewidth=1, color=colour, label=label,
                  linestyle="--" if dashed else "-")
    if failed:
        axis.plot(*zip(*failed), marker="x", markersize=5, linestyle="none", color=FAILED)


def _stack_changes(history: History) -> list[tuple[float, str]]:
    return [(i - 0.5, point.stack) for i, point in enumerate(history.points)
            if i and point.stack != history.points[i - 1].stack]


def _run_ticks(axis, runs: list[Run]) -> None:
    """At most MAX_TICKS run numbers with their dates, spread evenly, the newest run always among them."""
    step = max(1, -(-len(runs) // MAX_TICKS))
    ticks = sorted({*range(len(runs) - 1, -1, -step)})
    axis.set_xticks(ticks, [f"{'h' if not runs[i].passed else ''}{runs[i].number}\n{runs[i].when:%m-%d}"
                            for i in ticks], fontsize=7)


def _panel_reference(benches: list[Benchmark]) -> str | None:
    """torch_graph where the case measured it, else the reference most of its runs did (the loader's)."""
    if any(b.ratio(HISTORY_REFERENCE) for b in benches):
        return HISTORY_REFERENCE
    counts = Counter(name for b in benches for name in b.ratios if name != STRONGER)
    return max(counts, key=counts.get) if counts else None


def cases(function: str, runs: list[Run]) -> tuple[list[str], list[str]]:
    """(the cases of `function` with two runs or more, drawn; those with one, named under the figure)."""
    counts: dict[str, int] = {}
    for run in runs:
        for name, bench in run.benchmarks.items():
            if bench.function == function and _time_per_sample(bench):
                counts[name] = counts.get(name, 0) + 1
    return [n for n, c in counts.items() if c >= 2], [n for n, c in counts.items() if c < 2]


def _time_panel(axis, points: list[tuple[int, Benchmark, bool]], case: str, colour: str) -> None:
    times = [(x, t, ok) for x, b, ok in points if (t := _time_per_sample(b))]
    scale, unit = _unit([t for _, t, _ in times])
    _draw_signal(axis, [(x, t / scale, ok) for x, t, ok in times], colour)
    _scale_axis(axis, [t / scale for _, t, _ in times])
    axis.set_title(f"{case}: time per sample ({unit})", fontsize=8, loc="left")


def _speedup_panel(axis, points: list[tuple[int, Benchmark, bool]], colour: str) -> str | None:
    """The speed-up over the case's main reference, and over torch_graph_best dashed; returns the main one."""
    main = _panel_reference([b for _, b, _ in points])
    for reference, dashed in ((main, False), (STRONGER, True)):
        speedups = [(x, b.ratio(reference)["median"], ok) for x, b, ok in points if reference and b.ratio(reference)]
        _draw_signal(axis, speedups, RUNNER_COLOURS[STRONGER] if dashed else colour,
                     reference if dashed and speedups else None, dashed)
    _scale_axis(axis, [value for line in axis.lines for value in line.get_ydata()])
    best = any(line.get_label() == STRONGER for line in axis.lines)
    axis.set_title((f"speed-up over {main} (×)" + (f"; dashed: over {STRONGER}" if best else "")) if main
                   else "no reference timed beside the engine", fontsize=8, loc="left")
    if not main:
        axis.set_yticks([])
    return main


def _threshold(axis, rule, reference: str) -> None:
    """Today's threshold of the case, dotted, its label below the line in the panel's upper half."""
    _, fraction = (axis.transScale + axis.transLimits).transform((1, rule.min_ratio))
    axis.annotate(f"{rule.kind} ≥ {rule.min_ratio:g}× {reference}", (0.01, rule.min_ratio),
                  xycoords=("axes fraction", "data"), xytext=(0, -2 if fraction > 0.5 else 2),
                  textcoords="offset points", va="top" if fraction > 0.5 else "bottom", fontsize=6.5, color="#444444")


def _case_row(left, right, name: str, function: str, history: History, store: Store, colour: str) -> None:
    points = [(x, run.benchmarks[name], run.passed) for x, run in enumerate(history.runs) if name in run.benchmarks]
    _time_panel(left, points, name[len(function):].strip("[]") or name, colour)
    main = _speedup_panel(right, points, colour)
    rule, reference = history_rule(history.tier.gpu, name, store.rules)
    if rule is not None and rule.min_ratio is not None:
        right.axhline(rule.min_ratio, color="#444444", linestyle=":", linewidth=1)   # in the limits, then marks
    marks = {id(left): 0, id(right): 0}
    for cp in history.marks(name):
        axis = left if cp.series.signal == changepoints.TIME else right
        _mark(axis, history, cp, marks[id(axis)] % 3, main)
        marks[id(axis)] += 1
    for axis in (left, right):
        if marks[id(axis)]:
            _headroom(axis)
        axis.tick_params(axis="y", labelsize=7)
        axis.grid(alpha=0.3)
        for x, _ in _stack_changes(history):
            axis.axvline(x, color=STACK, linestyle=":", linewidth=1)
    if rule is not None and rule.min_ratio is not None:
        _threshold(right, rule, reference)


def history_figure(function: str, history: History, store: Store, path: Path) -> Path | None:
    """Per case of `function`: time per sample and speed-up per run, thresholds and change points marked."""
    drawn, single = cases(function, history.runs)
    if not drawn:
        return None
    figure, axes = _figure(ROW_IN * len(drawn) + 0.9, columns=2, rows=len(drawn), sharex=True)
    for row, name in enumerate(drawn):
        _case_row(*axes[row], name, function, history, store, CASE_COLOURS[row % len(CASE_COLOURS)])
    for x, stack in _stack_changes(history):
        axes[0][0].annotate(f"→ {stack}", (x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 10),
                            textcoords="offset points", fontsize=6.5, color=STACK, annotation_clip=False)
    for axis in axes[-1]:
        _run_ticks(axis, history.runs)
        axis.set_xlim(-0.5, len(history.runs) - 0.5)
        axis.set_xlabel("stored run (number, date; h: a run that failed the gate, ×)", fontsize=7)
    left_out = f"; one run only, not drawn: {', '.join(n[len(function):].strip('[]') for n in single)}"
    figure.suptitle(f"{workload_name(function)}: history on {history.tier.title}" + (left_out if single else ""),
                    fontsize=9, wrap=True)
    return _save(figure, path)


def change_point_table(history: History) -> Table:
    """The change points of a tier's series, newest first."""
    table = Table("Change points in the stored history (newest first)",
                  ["Test", "Series", "Size", "Last run before", "First run after", "Commits", "p", "Stack"])
    for cp in sorted(history.analysis.change_points, key=lambda cp: (-history.x(cp.after), cp.series.test,
                                                                      cp.series.signal)):
        table.add(cp.series.test, cp.series.signal,
                  Cell(f"{cp.size:+.1%}", "median after / median before - 1; > 0: the engine slower"),
                  f"{cp.before.label} ({cp.before.when:%Y-%m-%d})", f"{cp.after.label} ({cp.after.when:%Y-%m-%d})",
                  cp.commits, f"{cp.p:.1g}", cp.series.stack)
    table.caption = (f"{len(history.analysis.series)} series of the baselines (one per test, stack, set of "
                     f"runners and signal), {history.analysis.too_short} of them shorter than "
                     f"{2 * changepoints.MIN_SEGMENT} runs, too short to tell a change point; ruptures' kernel "
                     f"change-point search, each confirmed by Welch's t-test at p < {changepoints.ALPHA:g} "
                     "(docs/gate.md, \"Change points\").")
    return table
