"""The report's figures: PNGs drawn with matplotlib's Agg backend, no display and no pyplot state.

Speed-ups are same-run medians of per-round ratios with the lowest and highest round as error bars
(`gpuengine.bench.benchmarking.RatioSummary`), on a log axis so that 2x faster and 2x slower look
alike (the history's figures are history.py's). Every figure shows the newest measurement of each test;
one from a run that failed the gate is labelled "[failed run]". matplotlib is the `report` extra.
"""
from __future__ import annotations

from pathlib import Path

from .sections import PYTORCH_REFERENCES, Record, references, summary_rows, workload_name
from .store import Benchmark, Run, TierRuns
from .tables import FAILED_RUN
from ..stronger_reference import STRONGER

DPI = 100
WIDTH_IN = 10.0
RUNNER_COLOURS = {"gpuengine": "#1f77b4", "gpuengine_oneshot": "#9ecae1", "torch_graph": "#d62728",
                  "torch_compile_graph": "#e377c2", STRONGER: "#8c564b", "torch_compile": "#ff7f0e",
                  "torch_eager": "#2ca02c", "tf_keras": "#9467bd"}
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


def colour(runner: str) -> str:
    return RUNNER_COLOURS.get(runner, "#7f7f7f")


def _grouped_bars(axis, labels: list[str], series: dict[str, list[float | None]],
                  spans: dict[str, list[tuple[float, float] | None]] | None = None):
    """Horizontal bars: one group per label and one bar per series, the first of each on top; `spans`
    gives a series (low, high) whiskers per label. A None value leaves a gap."""
    height = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        whiskers = (spans or {}).get(name) or [None] * len(labels)
        bars = [(len(labels) - 1 - row + 0.4 - height * (i + 0.5), value, whisker or (value, value))
                for row, (value, whisker) in enumerate(zip(values, whiskers)) if value is not None]
        if not bars:
            continue
        ys, vs, ws = zip(*bars)
        xerr = [[v - w[0] for v, w in zip(vs, ws)], [w[1] - v for v, w in zip(vs, ws)]] if spans else None
        axis.barh(ys, vs, height=height, color=colour(name), label=name, xerr=xerr,
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


def _si_axis(axis):
    from matplotlib.ticker import FuncFormatter
    axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _si(value)))


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


def _speedup_axis(axis, title: str):
    _log_axis(axis, "×")
    axis.axvline(1.0, color="black", linewidth=1)
    axis.set_xlabel("speed-up: reference time / engine time (> 1: engine faster)")
    axis.set_title(title, fontsize=10)


def speedup_figure(tier: TierRuns, path: Path) -> Path | None:
    """The README's figure: speed-up over each PyTorch reference for the summary cases that are stored."""
    stored = [(marked(f"{label} · {precision}", found[0]), found[1])
              for label, precision, found in summary_rows(tier) if found]
    if not stored:
        return None
    labels, benchmarks = [label for label, _ in stored], [bench for _, bench in stored]
    refs = [ref for ref in (STRONGER, *PYTORCH_REFERENCES) if any(b.ratio(ref) for b in benchmarks)]
    figure, axes = _figure(0.32 * len(labels) * max(1, len(refs)) / 2 + 1.2)
    medians, spans = _ratio_spans(benchmarks, refs)
    _grouped_bars(axes[0][0], labels, medians, spans)
    _speedup_axis(axes[0][0], f"gpuengine vs PyTorch on {tier.title}: same-run median, bars = lowest–highest round")
    axes[0][0].legend(loc="lower right", fontsize=8)
    return _save(figure, path)


def workload_figure(function: str, records: list[Record], path: Path) -> Path:
    """Samples/s of the engine and every reference per case (its newest measurement), and the speed-ups
    with their spread."""
    benchmarks = [bench for _, bench in records]
    labels = [marked(bench.case or bench.name, run) for run, bench in records]
    refs = references(benchmarks)
    figure, axes = _figure(0.22 * len(labels) * (len(refs) + 1) / 2 + 1.5, columns=2, sharey=True)
    throughput = {"gpuengine": [b.throughput(b.engine) for b in benchmarks]}
    throughput.update({ref: [b.throughput(ref) for b in benchmarks] for ref in refs})
    _grouped_bars(axes[0][0], labels, throughput)
    _log_axis(axes[0][0])
    axes[0][0].set_xlabel("samples/s (log)")
    axes[0][0].set_title(f"{workload_name(function)}: throughput", fontsize=10)
    figure.legend(*axes[0][0].get_legend_handles_labels(), loc="outside upper center", ncol=len(throughput),
                  fontsize=8)
    medians, spans = _ratio_spans(benchmarks, refs)
    _grouped_bars(axes[0][1], labels, medians, spans)
    runs = list(dict.fromkeys(f"{run.label} ({run.date})" for run, _ in records))
    _speedup_axis(axes[0][1], f"speed-up, run {runs[0]}" if len(runs) == 1 else
                  f"speed-up, newest run of each case ({len(runs)} runs)")
    return _save(figure, path)


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
        axis.barh(range(len(runners)), [batches[r] for r in runners],
                  color=[colour(r.split("[")[0]) for r in runners])
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
    axis.barh(ys, [e["total_j_per_sample"][r] * 1e6 for _, r, e in rows], color=[colour(r) for _, r, _ in rows])
    axis.barh(ys, [e.get("active_j_per_sample", {}).get(r, 0) * 1e6 for _, r, e in rows], height=0.35,
              color="#333333", alpha=0.5)
    axis.set_yticks(list(ys), [label for label, _, _ in rows], fontsize=8)
    axis.set_xlabel("µJ per training sample, lower is better (wide bar: total; narrow dark bar: above idle power)")
    axis.set_title("Energy per sample", fontsize=10)
    axis.grid(axis="x", alpha=0.3)
    return _save(figure, path)
