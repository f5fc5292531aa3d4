"""The report's figures: PNGs drawn with matplotlib's Agg backend, no display and no pyplot state.

Speed-ups are same-run medians of per-round ratios with the lowest and highest round as error bars
(`gpuengine.bench.benchmarking.RatioSummary`), on a log axis so that 2x faster and 2x slower look
alike (the history's figures are history.py's). Every figure shows the newest measurement of each test;
one from a run that failed the gate is labelled "[failed run]". matplotlib is the `report` extra.
"""
from __future__ import annotations

import math
from pathlib import Path

from .glance import headline_speedups
from .sections import PYTORCH_REFERENCES, Record, beside_strongest, references, summary_rows, workload_name
from .store import Benchmark, Run, TierRuns
from .tables import FAILED_RUN, speedup
from gpuengine.bench.stronger_reference import STRONGER

DPI = 100
WIDTH_IN = 10.0
# Every runner the stored runs hold, one colour each: a runner's bars look alike in every figure.
RUNNER_COLOURS = {"gpuengine": "#1f77b4", "gpuengine_loader": "#1f77b4", "gpuengine_oneshot": "#9ecae1",
                  "gpuengine_resident": "#17becf", "gpuengine_1gpu": "#393b79", "gpuengine_tf32": "#6b6ecf",
                  "torch_graph": "#d62728", "torch_compile_graph": "#e377c2", STRONGER: "#8c564b",
                  "torch_compile": "#ff7f0e", "torch_eager": "#2ca02c", "torch_graph_streamed": "#ff9896",
                  "torch_ddp": "#bcbd22", "torch_dataloader": "#98df8a", "tf_keras": "#9467bd",
                  "pinned_h2d": "#7f7f7f", "copy_bound": "#8c6d31"}
SPARE_COLOURS = ("#637939", "#e7ba52", "#ad494a", "#a55194", "#5254a3", "#ce6dbd", "#de9ed6", "#c7c7c7",
                 "#dbdb8d", "#9edae5", "#c49c94", "#f7b6d2")   # for runners this table does not know yet
CASE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd",
                "#e6550d", "#31a354", "#756bb1", "#636363")


def _figure(height_in: float, columns: int = 1, rows: int = 1, **subplots):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the report's figures need matplotlib: pip install -e '.[report]' (./gate installs it)") \
            from exc
    figure = Figure(figsize=(WIDTH_IN, max(2.5, height_in)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)   # Agg: PNGs without a display
    return figure, figure.subplots(rows, columns, squeeze=False, **subplots)


def _save(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", metadata={"Software": None})  # no version stamp: rebuilds diff only on data
    return path


def marked(label: str, run: Run) -> str:
    """A figure's label for a measurement of `run`: said to come from a failed run where it does."""
    return label if run.passed else f"{label} [{FAILED_RUN}]"


def colours(runners) -> dict[str, str]:
    """A colour per runner: its own where RUNNER_COLOURS has one, else a spare one no other runner here has."""
    runners = list(dict.fromkeys(runners))
    used = {RUNNER_COLOURS[r] for r in runners if r in RUNNER_COLOURS}
    spare = iter(c for c in SPARE_COLOURS if c not in used)
    return {r: RUNNER_COLOURS.get(r) or next(spare, "#7f7f7f") for r in runners}


def _grouped_bars(axis, labels: list[str], series: dict[str, list[float | None]],
                  spans: dict[str, list[tuple[float, float] | None]] | None = None,
                  palette: dict[str, str] | None = None):
    """Horizontal bars: one group per label and one bar per series, the first of each on top; `spans`
    gives a series (low, high) whiskers per label; `palette` the figure's colours. A None value leaves a gap."""
    height = 0.8 / max(1, len(series))
    palette = palette or colours(series)
    for i, (name, values) in enumerate(series.items()):
        whiskers = (spans or {}).get(name) or [None] * len(labels)
        bars = [(len(labels) - 1 - row + 0.4 - height * (i + 0.5), value, whisker or (value, value))
                for row, (value, whisker) in enumerate(zip(values, whiskers)) if value is not None]
        if not bars:
            continue
        ys, vs, ws = zip(*bars)
        xerr = [[v - w[0] for v, w in zip(vs, ws)], [w[1] - v for v, w in zip(vs, ws)]] if spans else None
        axis.barh(ys, vs, height=height, color=palette[name], label=name, xerr=xerr,
                  error_kw={"elinewidth": 1, "capsize": 2, "ecolor": "#333333"})
    axis.set_yticks(range(len(labels)), labels[::-1], fontsize=8)
    axis.set_ylim(-0.6, len(labels) - 0.4)
    axis.grid(axis="x", alpha=0.3)


def _ratio_spans(benchmarks: list[Benchmark], refs: list[str]):
    medians = {ref: [(b.ratio(ref) or {}).get("median") for b in benchmarks] for ref in refs}
    spans = {ref: [(r["low"], r["high"]) if r else None for r in (b.ratio(ref) for b in benchmarks)] for ref in refs}
    return medians, spans


def _log_axis(axis, unit: str = "", which: str = "x"):
    """A log axis ticked at 1, 2, 5 x 10^k, written out ('2×', '50M') rather than as powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    getattr(axis, f"set_{which}scale")("log")
    ticks = getattr(axis, f"{which}axis")
    ticks.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ticks.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    ticks.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}{unit}" if unit else _si(value)))


def _fit_log_ticks(axis, which: str = "x", decades: float = 2.0):
    """Ticks a half-width log axis can label: at powers of ten alone beyond `decades` (1, 2, 5 per decade
    overprint), at round values in between under half a decade (no 1, 2 or 5 may fall inside)."""
    from matplotlib.ticker import LogLocator, MaxNLocator
    low, high = getattr(axis, f"get_{which}lim")()
    if low <= 0:
        return
    span = math.log10(high / low)
    if span > decades:
        getattr(axis, f"{which}axis").set_major_locator(LogLocator(subs=(1.0,)))
    elif span < 0.5:
        getattr(axis, f"{which}axis").set_major_locator(MaxNLocator(nbins=4))


def _si_axis(axis):
    from matplotlib.ticker import FuncFormatter
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _si(value)))


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _speedup_axis(axis, title: str, short: bool = False):
    _log_axis(axis, "×")
    axis.axvline(1.0, color="black", linewidth=1)
    axis.set_xlabel("speed-up: reference time / engine time\n(> 1: engine faster)" if short else
                    "speed-up: reference time / engine time (> 1: engine faster)")
    axis.set_title(title, fontsize=10)


def draw_speedup(tier: TierRuns):
    """The README's figure: each headline case's speed-up over the strongest PyTorch reference it was measured
    against (glance.headline_speedups: the measurement the tables read), coloured by that reference, the run
    named beside the bar; None where no headline case is stored."""
    found = headline_speedups(tier)
    if not found:
        return None
    figure, axes = _figure(0.3 * len(found) + 1.4)
    axis = axes[0][0]
    palette = colours(s.reference for s in found)
    ys = list(range(len(found)))[::-1]
    medians = [s.ratio["median"] for s in found]
    axis.barh(ys, medians, height=0.6, color=[palette[s.reference] for s in found],
              xerr=[[m - s.ratio["low"] for m, s in zip(medians, found)],
                    [s.ratio["high"] - m for m, s in zip(medians, found)]],
              error_kw={"elinewidth": 1, "capsize": 2, "ecolor": "#333333"})
    for y, s in zip(ys, found):
        axis.annotate(f"{speedup(s.ratio['median'])}, run {s.run.label}", (s.ratio["high"], y), xytext=(4, 0),
                      textcoords="offset points", va="center", fontsize=7,
                      bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8})  # over the 1× line
    axis.set_yticks(ys, [marked(s.case, s.run) for s in found], fontsize=8)
    axis.set_ylim(-0.6, len(found) - 0.4)
    axis.grid(axis="x", alpha=0.3)
    _speedup_axis(axis, f"gpuengine vs the strongest PyTorch reference each case was measured against, {tier.title}"
                        "\nbars: same-run median; whiskers: lowest–highest round")
    axis.set_xlim(min(0.8, 0.9 * min(s.ratio["low"] for s in found)), 2.2 * max(s.ratio["high"] for s in found))
    from matplotlib.patches import Patch
    axis.legend([Patch(color=c) for c in palette.values()], [f"vs {ref}" for ref in palette], loc="lower right",
                fontsize=8, title="reference", title_fontsize=8)
    return figure


def speedup_figure(tier: TierRuns, path: Path) -> Path | None:
    figure = draw_speedup(tier)
    return None if figure is None else _save(figure, path)


def draw_workload(function: str, records: list[Record], tier: TierRuns | None = None):
    """Samples/s of the engine and every reference per case (its newest measurement), and the speed-ups
    with their spread; one legend entry and one colour per runner drawn in either panel. With `tier`, a case
    whose newest run did not time torch_graph_best shows it from the newest run that did, as its table does."""
    benchmarks = [bench for _, bench in records]
    labels = [marked(bench.case or bench.name, run) for run, bench in records]
    beside = [None if tier is None or bench.ratio(STRONGER) is not None else beside_strongest(tier, bench)
              for bench in benchmarks]
    refs = references(benchmarks + [found[1] for found in beside if found is not None])
    palette = colours(["gpuengine", *refs])
    figure, axes = _figure(0.22 * len(labels) * (len(refs) + 1) / 2 + 1.5, columns=2, sharey=True)
    throughput = {"gpuengine": [b.throughput(b.engine) for b in benchmarks]}
    throughput.update({ref: [b.throughput(ref) for b in benchmarks] for ref in refs})
    _grouped_bars(axes[0][0], labels, throughput, palette=palette)
    _log_axis(axes[0][0])
    axes[0][0].set_xlabel("samples/s (log)")
    axes[0][0].set_title(f"{workload_name(function)}: throughput", fontsize=10)
    medians, spans = _ratio_spans(benchmarks, refs)
    if STRONGER in refs:
        strongest = [found[1] if found else bench for bench, found in zip(benchmarks, beside)]
        medians[STRONGER], spans[STRONGER] = (values[STRONGER] for values in _ratio_spans(strongest, [STRONGER]))
    _grouped_bars(axes[0][1], labels, medians, spans, palette=palette)
    runs = list(dict.fromkeys(f"{run.label} ({run.date})" for run, _ in records))
    older = any(beside) and STRONGER in refs
    _speedup_axis(axes[0][1], (f"speed-up, run {runs[0]}" if len(runs) == 1 else
                               f"speed-up, newest run of each case ({len(runs)} runs)")
                  + (f"\n{STRONGER}: the newest run that timed it" if older else ""), short=True)
    for axis in axes[0]:   # half the figure's width each
        _fit_log_ticks(axis)
    drawn = {}   # label -> handle, both panels: a reference without samples/s of its own has bars only on the right
    for axis in axes[0]:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            drawn.setdefault(label, handle)
    order = [name for name in palette if name in drawn]   # the engine, then the references strongest first
    figure.legend([drawn[name] for name in order], order, loc="outside upper center", ncol=min(len(order), 6),
                  fontsize=8)
    return figure


def workload_figure(function: str, records: list[Record], tier: TierRuns, path: Path) -> Path:
    return _save(draw_workload(function, records, tier), path)


def peak_figure(tier: TierRuns, path: Path) -> Path | None:
    """Fraction of the measured GEMM peak of the engine and the references, per workload and precision."""
    rows = [(marked(f"{label} · {precision}", found[0]), found[1]) for label, precision, found in summary_rows(tier)
            if found and found[1].info.get("fraction_of_peak")]
    if not rows:
        return None
    figure, axes = _figure(0.3 * len(rows) * 1.5 + 1.2)
    names = ("gpuengine", *PYTORCH_REFERENCES)
    fractions = {name: [100 * b.info["fraction_of_peak"][b.engine if name == "gpuengine" else name]
                        if (b.engine if name == "gpuengine" else name) in b.info["fraction_of_peak"] else None
                        for _, b in rows] for name in names}
    fractions = {name: values for name, values in fractions.items() if any(v is not None for v in values)}
    _grouped_bars(axes[0][0], [label for label, _ in rows], fractions)
    axes[0][0].bar_label(axes[0][0].containers[0], fmt="%.1f%%", fontsize=7, padding=2)  # the engine's bars
    axes[0][0].set_xlim(0, 100)
    axes[0][0].set_xlabel("% of the GEMM peak measured in the same session, at the case's precision")
    axes[0][0].set_title(f"How close to the limit of {tier.title}", fontsize=10)
    axes[0][0].legend(loc="lower right", fontsize=8)
    return _save(figure, path)


def max_batch_figure(records: list[Record], path: Path) -> Path | None:
    """Largest batch per runner, training and inference side by side."""
    by_mode: dict[str, dict[str, int]] = {}
    for run, bench in records:
        for runner, search in bench.info["max_batch"].items():
            if search.get("max_batch"):
                by_mode.setdefault(bench.info.get("mode", "?"), {})[marked(runner, run)] = search["max_batch"]
    if not by_mode:
        return None
    figure, axes = _figure(0.3 * sum(len(v) for v in by_mode.values()) + 1.5, columns=len(by_mode))
    for axis, (mode, batches) in zip(axes[0], sorted(by_mode.items(), reverse=True)):
        runners = sorted(batches, key=batches.get)
        palette = colours(r.split("[")[0].strip() for r in runners)
        axis.barh(range(len(runners)), [batches[r] for r in runners],
                  color=[palette[r.split("[")[0].strip()] for r in runners])
        axis.set_yticks(range(len(runners)), runners, fontsize=8)
        axis.set_title(f"{mode}: largest batch under the cap", fontsize=10)
        axis.set_xlabel("samples per batch")
        _si_axis(axis)
        axis.grid(axis="x", alpha=0.3)
    return _save(figure, path)


def energy_figure(records: list[Record], path: Path) -> Path | None:
    rows = [(marked(f"{bench.name} · {runner}", run), runner, bench.info["energy"]) for run, bench in records
            for runner in bench.info["energy"].get("total_j_per_sample", {})]
    if not rows:
        return None
    figure, axes = _figure(0.35 * len(rows) + 1.2)
    axis = axes[0][0]
    ys = range(len(rows))[::-1]
    palette = colours(r for _, r, _ in rows)
    axis.barh(ys, [e["total_j_per_sample"][r] * 1e6 for _, r, e in rows], color=[palette[r] for _, r, _ in rows])
    axis.barh(ys, [e.get("active_j_per_sample", {}).get(r, 0) * 1e6 for _, r, e in rows], height=0.35,
              color="#333333", alpha=0.5)
    axis.set_yticks(list(ys), [label for label, _, _ in rows], fontsize=8)
    axis.set_xlabel("µJ per training sample, lower is better (wide bar: total; narrow dark bar: above idle power)")
    axis.set_title("Energy per sample", fontsize=10)
    axis.grid(axis="x", alpha=0.3)
    return _save(figure, path)
