"""The report's tables beyond the seed notes: per workload, by precision, peak, memory, energy, kernel profiles,
history, machines.

Each reads what `gpuengine.bench.benchmarking.Comparison.extra_info` and the perf tests store
(perf_tests/: samples_per_s, ratios with low/high/spread, fraction_of_peak against the GEMM peak
measured in the same session, max_batch searches, energy) and the machine facts of
`gpuengine.bench.machine_info`. Every table shows the newest measurement of each test, whichever run it
came from: a run that failed the gate (kept under history/) is named as one in the table's Run column,
and the rows of the baseline in force (the newest passing run of that test) follow its rows. In the
speed tables, a case whose newest run did not time torch_graph_best is followed by the newest run that
did. The speed-up over torch_graph_best (the faster of torch_graph and torch_compile_graph in each round)
says which of the two it was: "1.65× (1.50–2.00), torch_compile_graph in 3 of 4 rounds".
"""
from __future__ import annotations

from typing import Callable, Iterable

from gpuengine.bench.profile.record import StoredProfile, family_rows
from gpuengine.bench.stronger_reference import STRONGER
from gpuengine.bench.thresholds import ThresholdRule, rule_for
from gpuengine.workloads.registry import ENTRIES

from .store import Benchmark, Run, Store, TierRuns
from .tables import (BASELINE_ROW, NONE, NOT_MEASURED, STRONGEST_ROW, Cell, Table, count, percent, rate,
                     speedup, speedup_with_spread)

Record = tuple[Run, Benchmark]

PYTORCH_REFERENCES = ("torch_graph", "torch_compile_graph", "torch_compile", "torch_eager")   # strongest first
REFERENCE_ORDER = (STRONGER, *PYTORCH_REFERENCES, "tf_keras", "gpuengine_oneshot")
# The runner measured in every stored run since the first; the rules over it read torch_graph_best now.
HISTORY_REFERENCE = "torch_graph"
# The report's name of each perf test: the workload table's titles, and the tests of no one workload.
WORKLOAD_NAMES = {test: entry.test_title(test) for entry in ENTRIES.values() for test in entry.tests} | {
    "test_loader_bandwidth": "Streamed loader bandwidth", "test_data_parallel_train": "Data-parallel training"}
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
    where = f"{bench.name}, run {run.label} ({run.date})"
    if run.passed:
        return where
    verdict = run.check(bench.name)
    return (f"{where}, a run that failed the gate (kept under history/, not a baseline)"
            + (f"; the gate's check of this test: {verdict}" if verdict else ""))


def run_text(run: Run) -> str:
    """'0001 d4fcd16 (2026-11-23 10:58, passed)': the run, its commit and date, and whether it passed the gate."""
    return f"{run.label} ({run.date}, {run.status})"


def runs_text(runs: Iterable[Run]) -> str:
    return ", ".join(run_text(run) for run in {run.path: run for run in runs}.values()) or "none yet"


def run_cell(run: Run, note: str = "") -> Cell:
    return Cell(f"{run.label}, {run.date}: {run.status}{'; ' + note if note else ''}", str(run.path),
                failed=not run.passed)


def add_measured(table: Table, tier: TierRuns, run: Run, bench: Benchmark,
                 rows: Callable[[Run, Benchmark], list[list[Cell | str]]], strongest: bool = False) -> list[Run]:
    """The rows of one test's newest measurement with its run in the last column; when that run failed
    the gate, the rows of the baseline in force follow (their first cell says so), or the run cell says
    there is none. With `strongest`, when neither was measured beside torch_graph_best, the rows of the
    newest run that was follow too (a quick-tier run must not hide the nightly's strongest comparison).
    Returns the runs shown, for the caption."""
    baseline = None if run.passed else tier.baseline_of(run, bench)
    note = "" if run.passed else "baseline in force below" if baseline else "no baseline yet"
    for cells in rows(run, bench):
        table.add(*(_failed(cell) if not run.passed else cell for cell in cells), run_cell(run, note))
    shown = [run]
    if baseline is not None:
        for cells in rows(*baseline):
            table.add(Cell(BASELINE_ROW, source(*baseline)), *cells[1:], run_cell(baseline[0], "baseline in force"))
        shown.append(baseline[0])
    measured = [bench] if baseline is None else [bench, baseline[1]]
    if strongest and all(shown_bench.ratio(STRONGER) is None for shown_bench in measured):
        beside = beside_strongest(tier, bench)
        if beside is not None:
            for cells in rows(*beside):
                table.add(Cell(STRONGEST_ROW, source(*beside)), *cells[1:], run_cell(beside[0]))
            shown.append(beside[0])
    return shown


def beside_strongest(tier: TierRuns, bench: Benchmark) -> Record | None:
    """The newest measurement of `bench`'s test that ran beside torch_graph_best, passed or failed."""
    return tier.find(bench.name, bench.precision, keep=lambda older: older.ratio(STRONGER) is not None)


def _failed(cell: Cell | str) -> Cell:
    cell = cell if isinstance(cell, Cell) else Cell(cell)
    return Cell(cell.text, cell.source, failed=True)


def ratio_text(bench: Benchmark, reference: str) -> str:
    """'2.05× (2.04–2.06)', and for torch_graph_best which runner it was: ', torch_compile_graph in 3 of 4
    rounds'."""
    ratio = bench.ratio(reference)
    text = speedup_with_spread(ratio)
    return f"{text}, {ratio['label']}" if ratio and ratio.get("label") else text


def history_rule(gpu: str, test: str, rules: list[ThresholdRule]) -> tuple[ThresholdRule | None, str]:
    """The rule over torch_graph that holds the history's test today and the reference it reads: torch_graph's
    own (the energy tests'), else torch_graph_best's."""
    for reference in (HISTORY_REFERENCE, STRONGER):
        rule = rule_for(gpu, test, reference, rules)
        if rule is not None:
            return rule, reference
    return None, HISTORY_REFERENCE


def references(benchmarks: list[Benchmark]) -> list[str]:
    """Every reference of these benchmarks, the strongest PyTorch first."""
    names = {name for bench in benchmarks for name in bench.ratios}
    return sorted(names, key=lambda n: (REFERENCE_ORDER.index(n) if n in REFERENCE_ORDER else len(REFERENCE_ORDER), n))


def timed_workloads(tier: TierRuns) -> dict[str, list[Record]]:
    """Per test function with throughputs: the newest measurement of each of its cases, passed or failed."""
    workloads: dict[str, list[Record]] = {}
    for run, bench in tier.newest(lambda bench: bool(bench.samples_per_s)):
        workloads.setdefault(bench.function, []).append((run, bench))
    return workloads


def with_baselines(tier: TierRuns, records: list[Record]) -> list[Record]:
    """`records` and, for those of failed runs, the baselines in force."""
    baselines = [tier.baseline_of(run, bench) for run, bench in records if not run.passed]
    return records + [found for found in baselines if found is not None]


def workload_table(function: str, records: list[Record], tier: TierRuns) -> Table:
    beside = [found for _, bench in records
              if bench.ratio(STRONGER) is None and (found := beside_strongest(tier, bench)) is not None]
    refs = references([bench for _, bench in with_baselines(tier, records) + beside])   # columns the ↳ rows fill
    table = Table(f"{workload_name(function)}: samples/s and same-run speed-up (lowest–highest round)",
                  ["Case", "Precision", "gpuengine", *(f"vs {ref}" for ref in refs), "gpuengine % of peak", "Run"])

    def rows(run: Run, bench: Benchmark) -> list[list[Cell]]:
        where = source(run, bench)
        cells = [Cell(bench.case or bench.name, where), Cell(bench.precision or NONE),
                 Cell(rate(bench.throughput(bench.engine)), where)]
        for ref in refs:   # the speed-up, then the reference's own samples/s (torch_graph_best, no runner, has none)
            measured = bench.throughput(ref) is not None and bench.ratio(ref) is not None
            cells.append(Cell(ratio_text(bench, ref) + (f"\n{rate(bench.throughput(ref))}" if measured else ""), where))
        fraction = (bench.info.get("fraction_of_peak") or {}).get(bench.engine)
        return [cells + [Cell(percent(fraction), where)]]
    shown = [shown_run for run, bench in records
             for shown_run in add_measured(table, tier, run, bench, rows, strongest=True)]
    table.caption = (f"Per reference, the engine's speed-up over it, then the reference's own samples/s. The newest "
                     f"measurement of each case (and, where it did not time {STRONGER}, the newest that did, marked "
                     f"↳). Runs {runs_text(shown)}.")
    return table


def summary_rows(tier: TierRuns) -> list[tuple[str, str, tuple[Run, Benchmark] | None]]:
    """(case label, precision, newest stored record or None) for the README's cases."""
    return [(label, precision, tier.find(pattern.format(p=precision), precision))
            for label, pattern in SUMMARY_CASES for precision in SUMMARY_PRECISIONS]


def summary_table(tier: TierRuns) -> Table:
    refs = (STRONGER, *PYTORCH_REFERENCES)
    table = Table(f"Engine speed-up over each PyTorch reference by precision, {tier.title} (same run, median of "
                  "interleaved rounds, lowest–highest round)",
                  ["Workload", "Precision", "gpuengine", *(f"vs {ref}" for ref in refs), "% of GEMM peak", "Run"])
    shown: list[Run] = []
    for label, precision, found in summary_rows(tier):
        if found is None:
            table.add(label, precision, NOT_MEASURED, *(NOT_MEASURED for _ in refs), NOT_MEASURED, NONE)
            continue

        def rows(run: Run, bench: Benchmark, label=label, precision=precision) -> list[list[Cell | str]]:
            where = source(run, bench)
            fraction = (bench.info.get("fraction_of_peak") or {}).get(bench.engine)
            return [[label, precision, Cell(rate(bench.throughput(bench.engine)), where),
                     *(Cell(ratio_text(bench, ref), where) for ref in refs),
                     Cell(percent(fraction), where)]]
        shown += add_measured(table, tier, *found, rows, strongest=True)
    table.caption = (f"The newest measurement of each case (and, where it did not time {STRONGER}, the newest that "
                     f"did, marked ↳), from runs {runs_text(shown)}. fp32 is IEEE fp32; tf32 "
                     "uses tensor cores with fp32 storage; bf16 computes in bf16 with fp32 master weights, in the "
                     "engine and the references alike. % of peak: of the GEMM peak measured in the same session "
                     "at that precision. "
                     f"{STRONGER}: the faster of torch_graph and torch_compile_graph in each round, and which it "
                     "was.")
    return table


def peak_table(tier: TierRuns) -> Table:
    table = Table("Fraction of the measured GEMM peak, per workload and precision",
                  ["Workload", "Case", "Precision", "Measured peak", "gpuengine achieved", "gpuengine",
                   *PYTORCH_REFERENCES, "Run"],
                  caption="Measured peak: the GEMM peak timed in the same session at the case's precision; "
                          "gpuengine achieved: the engine's FLOP/s; then each runner's share of that peak.")

    def rows(run: Run, bench: Benchmark) -> list[list[Cell | str]]:
        fractions = bench.info.get("fraction_of_peak") or {}
        where = source(run, bench)
        achieved = (bench.info.get("achieved_tflops") or {}).get(bench.engine)
        return [[workload_name(bench.function), Cell(bench.case, where), bench.precision or NONE,
                 f"{bench.info.get('peak_tflops_measured', 0):.0f} TFLOP/s",
                 Cell(NONE if achieved is None else f"{achieved:.1f} TFLOP/s", where),
                 *(Cell(percent(fractions.get(name)), where) for name in (bench.engine, *PYTORCH_REFERENCES))]]
    for records in timed_workloads(tier).values():
        for run, bench in records:
            if bench.info.get("fraction_of_peak"):
                add_measured(table, tier, run, bench, rows)
    return table


def max_batch_records(tier: TierRuns) -> list[Record]:
    """The newest measurement of each test holding max-batch searches."""
    return tier.newest(lambda bench: isinstance(bench.info.get("max_batch"), dict))


def max_batch_table(records: list[Record], tier: TierRuns) -> Table:
    table = Table("Largest batch under the memory cap (one fresh process per trial)",
                  ["Test", "Mode", "Runner", "Max batch", "Bytes per sample", "Peak device memory at max",
                   "Trials", "Engine / reference", "Run"])

    def rows(run: Run, bench: Benchmark) -> list[list[Cell | str]]:
        where = source(run, bench)
        ratio = bench.info.get("ratio", bench.info.get("pool1_over_pool3"))
        out = []
        for runner, search in bench.info["max_batch"].items():
            peak = search.get("peak_bytes_at_max")
            out.append([Cell(bench.case or bench.name, where), bench.info.get("mode", NONE), runner,
                        Cell(count(search.get("max_batch")), where), count(search.get("bytes_per_sample")),
                        NONE if peak is None else f"{peak / 2**30:.2f} GiB", str(search.get("trials", NONE)),
                        Cell(speedup(ratio), where)])
        return out
    shown = [shown_run for run, bench in records for shown_run in add_measured(table, tier, run, bench, rows)]
    caps = sorted({str(bench.info.get("cap_gib")) for _, bench in records})
    table.caption = f"The newest measurement of each test. Runs {runs_text(shown)}; cap {', '.join(caps)} GiB."
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


def energy_records(tier: TierRuns) -> list[Record]:
    """The newest measurement of each energy test, passed or failed."""
    return tier.newest(lambda bench: isinstance(bench.info.get("energy"), dict))


def energy_table(records: list[Record], tier: TierRuns) -> Table:
    table = Table("Energy per training sample (NVML energy counter around alternating windows)",
                  ["Test", "Runner", "J per sample", "J per sample above idle", "Average power", "Samples/s",
                   "Reference J / engine J", "Run"])

    def rows(run: Run, bench: Benchmark) -> list[list[Cell | str]]:
        energy, where = bench.info["energy"], source(run, bench)
        return [[Cell(bench.name, where), runner, Cell(f"{total:.3g}", where),
                 f"{energy.get('active_j_per_sample', {}).get(runner, float('nan')):.3g}",
                 f"{energy.get('avg_power_w', {}).get(runner, float('nan')):.0f} W",
                 rate(energy.get("samples_per_s", {}).get(runner)),
                 Cell(speedup_with_spread(bench.ratio(runner)) if runner != bench.engine else NONE, where)]
                for runner, total in energy.get("total_j_per_sample", {}).items()]
    shown = [(shown_run, bench) for run, bench in records
             for shown_run in add_measured(table, tier, run, bench, rows)]
    table.caption = " ".join(f"{bench.name}: run {run_text(run)}, idle "
                             f"{run.benchmarks[bench.name].info['energy'].get('idle_power_w')} W."
                             for run, bench in shown)
    return table


def newest_profiles(tier: TierRuns) -> list[StoredProfile]:
    """The newest profile of each workload and toggle set, by workload, then precision, batch and steps per launch."""
    newest = {profile.case_key: profile for profile in tier.profiles}   # oldest first: a newer one replaces it
    return sorted(newest.values(), key=lambda p: (p.workload, str(p.toggles.get("precision")),
                                                  p.toggles.get("batch", 0), p.toggles.get("cuda_graph", 0)))


def profile_table(profile: StoredProfile) -> Table:
    """Families as rows, runners as columns: microseconds per training step, then the totals and launches."""
    where = f"{profile.path}, recorded {profile.recorded_at:%Y-%m-%d %H:%M}"
    table = Table(f"Kernel profile: {profile.title}, µs per training step", ["Family", *profile.runners])
    for name, values in family_rows(profile.runners):
        fmt = "{:,.0f}" if name.startswith("launches") else "{:,.1f}"
        table.add(name, *(Cell(NONE if v is None else fmt.format(v), where) for v in values))
    missing = "; ".join(f"{runner} not profiled: {why}" for runner, why in profile.unavailable().items())
    commit = f"{profile.commit[:7]}{'+dirty' if profile.dirty else ''}" or "no commit"
    table.caption = (f"{profile.path} ({commit}, {profile.recorded_at:%Y-%m-%d %H:%M}, {profile.gpu}): the median of "
                     f"{profile.replays} replays of {profile.steps_per_replay} steps. A family sums its kernels' "
                     "time; the gaps are the step's device span less the kernels' sum (negative: kernels overlapped). "
                     "The profiler slows a replay between kernels; the step timed without it, where recorded, is "
                     "what the perf tests see."
                     + (f" {missing}." if missing else ""))
    return table


def profile_tables(tier: TierRuns) -> list[Table]:
    return [profile_table(profile) for profile in newest_profiles(tier)]


def run_column(run: Run) -> str:
    return f"{run.label} {run.date}{'' if run.passed else ' (' + run.status + ')'}"


def history_table(runs: list[Run], store: Store, gpu: str) -> Table:
    """Per test, the engine's speed-up over torch_graph in each run (failed runs included, and said so),
    and the threshold it is held to today: a claim (a miss fails the gate) or a target (a goal not met yet),
    over torch_graph_best where the rule reads it."""
    table = Table(f"Speed-up over {HISTORY_REFERENCE} by run", ["Test", *(run_column(r) for r in runs),
                                                                 "Threshold"], scrolls=True)
    names = list(dict.fromkeys(name for run in runs for name, bench in run.benchmarks.items()
                               if bench.samples_per_s and bench.ratio(HISTORY_REFERENCE)))   # timed tests only
    for name in names:
        rule, reference = history_rule(gpu, name, store.rules)
        threshold = (NONE if rule is None or rule.min_ratio is None else f"{rule.kind} ≥ {rule.min_ratio:g}×"
                     + ("" if reference == HISTORY_REFERENCE else f" {reference}"))
        cells = []
        for run in runs:
            bench = run.benchmarks.get(name)
            ratio = bench.ratio(HISTORY_REFERENCE) if bench else None
            cells.append(Cell(speedup(ratio["median"]) if ratio else NONE, source(run, bench) if bench else "",
                              failed=bench is not None and not run.passed))
        table.add(name, *cells, threshold)
    return table


def max_batch_history(runs: list[Run]) -> Table:
    table = Table("Max batch by run", ["Test", "Runner", *(run_column(r) for r in runs)], scrolls=True)
    rows = dict.fromkeys((name, runner) for run in runs for name, bench in run.benchmarks.items()
                         for runner in (bench.info.get("max_batch") or {}))
    for name, runner in rows:
        table.add(name, runner, *(Cell(count(((run.benchmarks[name].info.get("max_batch") or {}).get(runner) or {})
                                             .get("max_batch")), source(run, run.benchmarks[name]),
                                       failed=not run.passed)
                                  if name in run.benchmarks else Cell(NONE) for run in runs))
    return table


def machine_table(tier: TierRuns) -> Table:
    table = Table("Machine facts of each run", ["Run", "Date", "Gate", "Series", "GPU", "Driver", "CUDA runtime",
                                                "cuDNN", "CuPy", "torch", "nvmath", "Python", "Power limit",
                                                "SM clock max", "Engine config", "Run took"], scrolls=True)
    for run in tier.runs:
        m = run.machine
        clocks = m.get("gpu_clocks_mhz") or {}
        facts = [m.get(key) for key in ("gpu", "gpu_driver", "cuda_runtime", "cudnn", "cupy", "torch", "nvmath",
                                        "python_version")]
        power = m.get("gpu_power_limit_w")
        table.add(Cell(run.label, str(run.path)), run.date,
                  Cell("passed: a baseline" if run.passed else "failed: kept under history/", failed=not run.passed),
                  run.series or "speed", *(str(f or NONE) for f in facts),
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
