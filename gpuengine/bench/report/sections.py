"""The report's tables beyond the seed notes: per workload, by precision, peak, memory, energy, history, machines.

Each reads what `gpuengine.bench.benchmarking.Comparison.extra_info` and the perf tests store
(perf_tests/: samples_per_s, ratios with low/high/spread, fraction_of_peak against the GEMM peak
measured in the same session, max_batch searches, energy) and the machine facts of
`gpuengine.bench.machine_info`. A workload's table shows the newest run that holds it.
"""
from __future__ import annotations

from ..thresholds import rule_for
from .store import Benchmark, Run, Store, TierRuns
from .tables import NONE, NOT_MEASURED, Cell, Table, count, percent, rate, speedup, speedup_with_spread

REFERENCE_ORDER = ("torch_graph", "torch_compile", "torch_eager", "tf_keras", "gpuengine_oneshot")
HISTORY_REFERENCE = "torch_graph"   # the opponent the engine must beat (DESIGN.md)
WORKLOAD_NAMES = {
    "test_mlp_train": "MLP training (seed 000)", "test_mlp_infer": "MLP inference (seed 000)",
    "test_cnn_train": "CNN training (seed 001)", "test_cnn_train_vs_keras": "CNN training vs Keras (seed 001)",
    "test_resnet_train": "ResNet-50 training (seed 002)", "test_zoo_train": "Model zoo training (seed 003)",
    "test_transformer_train": "Transformer training (seed 004)",
}
# (label, test pattern with {p} for the precision): the cases the README's summary shows at each precision.
SUMMARY_CASES = (("MLP train, 1 batch/epoch", "test_mlp_train[{p}-graph8-resident-bpe1]"),
                 ("MLP train, 50 batches/epoch", "test_mlp_train[{p}-graph8-resident-bpe50]"),
                 ("MLP infer, batch 8000", "test_mlp_infer[{p}-resident-b8000]"),
                 ("CNN train, batch 128", "test_cnn_train[{p}-graph8-resident-b128]"),
                 ("CNN train, batch 1024", "test_cnn_train[{p}-graph8-resident-b1024]"),
                 ("ResNet-50 train, CIFAR-10", "test_resnet_train[cifar10-{p}-graph8-resident-b128]"))
SUMMARY_PRECISIONS = ("tf32", "fp32", "bf16")


def workload_name(function: str) -> str:
    return WORKLOAD_NAMES.get(function, function)


def source(run: Run, bench: Benchmark) -> str:
    return f"{bench.name}, run {run.label} ({run.date})"


def references(benchmarks: list[Benchmark]) -> list[str]:
    """Every reference of these benchmarks, the strongest PyTorch first."""
    names = {name for bench in benchmarks for name in bench.ratios}
    return sorted(names, key=lambda n: (REFERENCE_ORDER.index(n) if n in REFERENCE_ORDER else len(REFERENCE_ORDER), n))


def timed_workloads(tier: TierRuns) -> dict[str, tuple[Run, list[Benchmark]]]:
    """Per test function with throughputs: the newest run that holds it and its cases there."""
    workloads: dict[str, tuple[Run, list[Benchmark]]] = {}
    for run in reversed(tier.runs):
        for bench in run.benchmarks.values():
            if bench.samples_per_s and bench.function not in workloads:
                workloads[bench.function] = (run, [])
            if bench.samples_per_s and workloads[bench.function][0] is run:
                workloads[bench.function][1].append(bench)
    return workloads


def workload_table(function: str, run: Run, benchmarks: list[Benchmark]) -> Table:
    refs = references(benchmarks)
    columns = ["Case", "Precision", "gpuengine"]
    for ref in refs:
        columns += [ref, f"vs {ref}"]
    table = Table(f"{workload_name(function)}: samples/s and same-run speed-up (lowest–highest round)",
                  columns + ["gpuengine % of peak"],
                  caption=f"Run {run.label} ({run.date}, {run.path}).")
    for bench in benchmarks:
        where = source(run, bench)
        cells = [Cell(bench.case or bench.name, where), Cell(bench.precision or NONE),
                 Cell(rate(bench.throughput(bench.engine)), where)]
        for ref in refs:
            cells += [Cell(rate(bench.throughput(ref)), where), Cell(speedup_with_spread(bench.ratio(ref)), where)]
        fraction = (bench.info.get("fraction_of_peak") or {}).get(bench.engine)
        table.add(*cells, Cell(percent(fraction), where))
    return table


def summary_rows(tier: TierRuns) -> list[tuple[str, str, tuple[Run, Benchmark] | None]]:
    """(case label, precision, newest stored record or None) for the README's cases."""
    return [(label, precision, tier.find(pattern.format(p=precision), precision))
            for label, pattern in SUMMARY_CASES for precision in SUMMARY_PRECISIONS]


def summary_table(tier: TierRuns) -> Table:
    refs = ("torch_graph", "torch_compile", "torch_eager")
    table = Table(f"Engine speed-up over each PyTorch reference by precision, {tier.title} (same run, median of "
                  "interleaved rounds, lowest–highest round)",
                  ["Workload", "Precision", "gpuengine", *(f"vs {ref}" for ref in refs), "% of GEMM peak"])
    used = {}
    for label, precision, found in summary_rows(tier):
        if found is None:
            table.add(label, precision, NOT_MEASURED, *(NOT_MEASURED for _ in refs), NOT_MEASURED)
            continue
        run, bench = found
        used[run.label] = run
        where = source(run, bench)
        fraction = (bench.info.get("fraction_of_peak") or {}).get(bench.engine)
        table.add(label, precision, Cell(rate(bench.throughput(bench.engine)), where),
                  *(Cell(speedup_with_spread(bench.ratio(ref)), where) for ref in refs), Cell(percent(fraction), where))
    runs = ", ".join(f"{run.label} ({run.date})" for run in used.values()) or "none yet"
    table.caption = (f"Runs {runs}. fp32 is IEEE fp32; tf32 uses tensor cores with fp32 storage; bf16 computes in "
                     "bf16 with fp32 master weights, on both sides. % of peak: of the GEMM peak measured in the same "
                     "session at that precision.")
    return table


def peak_table(tier: TierRuns) -> Table:
    table = Table("Fraction of the measured GEMM peak, per workload and precision",
                  ["Workload", "Case", "Precision", "Measured peak", "gpuengine", "gpuengine % of peak",
                   "torch_graph % of peak", "torch_compile % of peak", "torch_eager % of peak"])
    for function, (run, benchmarks) in timed_workloads(tier).items():
        for bench in benchmarks:
            fractions = bench.info.get("fraction_of_peak")
            if not fractions:
                continue
            where = source(run, bench)
            achieved = (bench.info.get("achieved_tflops") or {}).get(bench.engine)
            table.add(workload_name(function), Cell(bench.case, where), bench.precision or NONE,
                      f"{bench.info.get('peak_tflops_measured', 0):.0f} TFLOP/s",
                      Cell(NONE if achieved is None else f"{achieved:.1f} TFLOP/s", where),
                      *(Cell(percent(fractions.get(name)), where)
                        for name in (bench.engine, "torch_graph", "torch_compile", "torch_eager")))
    return table


def max_batch_records(tier: TierRuns) -> tuple[Run, list[Benchmark]] | None:
    """The newest run holding max-batch searches, and those records."""
    for run in reversed(tier.runs):
        records = [bench for bench in run.benchmarks.values() if isinstance(bench.info.get("max_batch"), dict)]
        if records:
            return run, records
    return None


def max_batch_table(run: Run, records: list[Benchmark]) -> Table:
    table = Table("Largest batch under the memory cap (one fresh process per trial)",
                  ["Test", "Mode", "Runner", "Max batch", "Bytes per sample", "Peak device memory at max",
                   "Trials", "Engine / reference"],
                  caption=f"Run {run.label} ({run.date}, {run.path}); cap {records[0].info.get('cap_gib')} GiB.")
    for bench in records:
        where = source(run, bench)
        ratio = bench.info.get("ratio", bench.info.get("pool1_over_pool3"))
        for runner, search in bench.info["max_batch"].items():
            peak = search.get("peak_bytes_at_max")
            table.add(Cell(bench.case or bench.name, where), bench.info.get("mode", NONE), runner,
                      Cell(count(search.get("max_batch")), where), count(search.get("bytes_per_sample")),
                      NONE if peak is None else f"{peak / 2**30:.2f} GiB", str(search.get("trials", NONE)),
                      Cell(speedup(ratio), where))
    return table


def maxbatch_file_tables(tier: TierRuns) -> list[Table]:
    tables = []
    for stored in tier.maxbatch_tables:
        table = Table(f"python -m gpuengine maxbatch: {stored.path}",
                      ["Mode", "Engine", "Engine max batch", "Reference", "Reference max batch", "Ratio", "Error"])
        for row in stored.rows:
            ours, theirs = row.get("engine_search") or {}, row.get("reference_search") or {}
            error = ours.get("error") or theirs.get("error")
            table.add(str(row.get("mode")), str(row.get("engine")), count(ours.get("max_batch")),
                      str(row.get("reference") or NONE), count(theirs.get("max_batch")), speedup(row.get("ratio")),
                      error.split(" - ")[-1][:120] if error else NONE)
        tables.append(table)
    return tables


def energy_records(tier: TierRuns) -> list[tuple[Run, Benchmark]]:
    """The newest stored record of each energy test."""
    newest: dict[str, tuple[Run, Benchmark]] = {}
    for run in reversed(tier.runs):
        for bench in run.benchmarks.values():
            if isinstance(bench.info.get("energy"), dict) and bench.name not in newest:
                newest[bench.name] = (run, bench)
    return list(newest.values())


def energy_table(records: list[tuple[Run, Benchmark]]) -> Table:
    table = Table("Energy per training sample (NVML energy counter around alternating windows)",
                  ["Test", "Runner", "J per sample", "J per sample above idle", "Average power", "Samples/s",
                   "Reference J / engine J"])
    for run, bench in records:
        energy, where = bench.info["energy"], source(run, bench)
        for runner, total in energy.get("total_j_per_sample", {}).items():
            table.add(Cell(bench.name, where), runner, Cell(f"{total:.3g}", where),
                      f"{energy.get('active_j_per_sample', {}).get(runner, float('nan')):.3g}",
                      f"{energy.get('avg_power_w', {}).get(runner, float('nan')):.0f} W",
                      rate(energy.get("samples_per_s", {}).get(runner)),
                      Cell(speedup_with_spread(bench.ratio(runner)) if runner != bench.engine else NONE, where))
    table.caption = " ".join(f"{bench.name}: run {run.label} ({run.date}), idle "
                             f"{bench.info['energy'].get('idle_power_w')} W." for run, bench in records)
    return table


def history_table(runs: list[Run], store: Store, gpu: str) -> Table:
    """Per test, the engine's speed-up over torch_graph in each run, and the threshold it is held to."""
    table = Table(f"Speed-up over {HISTORY_REFERENCE} by run", ["Test", *(f"{r.label} {r.date}" for r in runs),
                                                                 "Threshold"])
    names = list(dict.fromkeys(name for run in runs for name, bench in run.benchmarks.items()
                               if bench.samples_per_s and bench.ratio(HISTORY_REFERENCE)))   # timed tests only
    for name in names:
        rule = rule_for(gpu, name, HISTORY_REFERENCE, store.rules)
        threshold = NONE if rule is None or rule.min_ratio is None else f"≥ {rule.min_ratio:g}×"
        cells = []
        for run in runs:
            bench = run.benchmarks.get(name)
            ratio = bench.ratio(HISTORY_REFERENCE) if bench else None
            cells.append(Cell(speedup(ratio["median"]) if ratio else NONE, source(run, bench) if bench else ""))
        table.add(name, *cells, threshold)
    return table


def max_batch_history(runs: list[Run]) -> Table:
    table = Table("Max batch by run", ["Test", "Runner", *(f"{r.label} {r.date}" for r in runs)])
    rows = dict.fromkeys((name, runner) for run in runs for name, bench in run.benchmarks.items()
                         for runner in (bench.info.get("max_batch") or {}))
    for name, runner in rows:
        table.add(name, runner, *(count(((run.benchmarks[name].info.get("max_batch") or {}).get(runner) or {})
                                        .get("max_batch")) if name in run.benchmarks else NONE for run in runs))
    return table


def machine_table(tier: TierRuns) -> Table:
    table = Table("Machine facts of each run", ["Run", "Date", "Series", "GPU", "Driver", "CUDA runtime", "cuDNN",
                                                "CuPy", "torch", "nvmath", "Python", "Power limit", "SM clock max",
                                                "Engine config", "Run took"])
    for run in tier.runs:
        m = run.machine
        clocks = m.get("gpu_clocks_mhz") or {}
        facts = [m.get(key) for key in ("gpu", "gpu_driver", "cuda_runtime", "cudnn", "cupy", "torch", "nvmath",
                                        "python_version")]
        power = m.get("gpu_power_limit_w")
        table.add(Cell(run.label, str(run.path)), run.date, run.series or "speed", *(str(f or NONE) for f in facts),
                  NONE if power is None else f"{power:g} W",
                  NONE if clocks.get("sm_max") is None else f"{clocks['sm_max']} MHz",
                  str(m.get("gpuengine_config") or NONE), run_took(run.tier_time))
    return table


def run_took(tier_time: dict | None) -> str:
    """'quick tier, 9.4 min' from a run's gpuengine_tier_time (runs before the gate recorded it: none)."""
    seconds = (tier_time or {}).get("session_seconds")
    if not isinstance(seconds, (int, float)):
        return NONE
    return f"{tier_time.get('tier', '?')} tier, {seconds / 60:.1f} min"
