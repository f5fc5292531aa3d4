"""A perf run spread over a machine's GPUs: the split of the test list, and the merge of the workers' runs.

pytest-benchmark disables itself under xdist, so `./gate perf` on a machine
with several GPUs (gpuengine/gate/spread.py) runs one pytest process per GPU,
each pinned to its GPU by CUDA_VISIBLE_DEVICES and writing its run with
`--benchmark-json`, then the tests that need every GPU (data parallel) in a
last process that sees them all. The runs are merged here into one stored
run per GPU kind, in pytest-benchmark's own format, numbered after the runs
already stored (its NNNN_ prefix), in the folder each session would have
stored it in (`run_folder`), so the gate plugin, the report and
pytest-benchmark's tools read it like any other run.
"""
from __future__ import annotations

import statistics
from pathlib import Path

INTERRUPTED = 2   # pytest's exit status of a session stopped by Ctrl-C
GATE_OUTCOME = "gpuengine_gate"   # gpuengine/gate/plugin.py's verdict in a run: which tests failed on targets only
TIER_TIME = "gpuengine_tier_time"   # gpuengine/gate/tier_time.py's record of how long a run took, per workload


def failed_on_targets_only(exit_status: int, run: dict) -> bool:
    """A worker that failed (pytest's exit status 1) only because tests missed targets (--claims): its run
    passed the gate's own verdict, as a single run's would (gpuengine/gate/plugin.py)."""
    outcome = run.get(GATE_OUTCOME) if isinstance(run.get(GATE_OUTCOME), dict) else {}
    return exit_status == 1 and bool(outcome.get("failed_on_targets_only")) and not outcome.get("failed_otherwise")


def interrupted(exit_status: int | None, run: dict | None) -> bool:
    """A worker whose session was interrupted (pytest's exit status 2, or its run says so): no verdict, and the
    merged run is not stored at all, as a single interrupted run is not (gpuengine/gate/plugin.py)."""
    outcome = (run or {}).get(GATE_OUTCOME)
    return exit_status == INTERRUPTED or (isinstance(outcome, dict) and bool(outcome.get("interrupted")))


def _merged_outcome(outcomes: list[dict]) -> dict:
    return {"targets_fail": any(o.get("targets_fail") for o in outcomes),
            "targets_not_met": sum(o.get("targets_not_met", 0) for o in outcomes),
            "failed_on_targets_only": sorted({t for o in outcomes for t in o.get("failed_on_targets_only", [])}),
            "failed_otherwise": sorted({t for o in outcomes for t in o.get("failed_otherwise", [])}),
            "failures": dict(sorted((t, why) for o in outcomes for t, why in (o.get("failures") or {}).items()))}


def _merged_tier_time(records: dict[str, dict]) -> dict:
    """The workers' tier times as one (worker name -> its record): each workload's tests and seconds summed, each
    session's own length kept; the whole takes the longest session's, a lower bound that the spread, which timed
    the whole, replaces (gpuengine/gate/spread.py)."""
    per_workload: dict[str, dict] = {}
    for record in records.values():
        for workload, entry in (record.get("per_workload") or {}).items():
            into = per_workload.setdefault(workload, {**entry, "tests": 0, "seconds": 0.0})
            into["tests"] += entry.get("tests", 0)
            into["seconds"] = round(into["seconds"] + entry.get("seconds", 0.0), 1)
    sessions = {worker: record.get("session_seconds") for worker, record in records.items()}
    return {**next(iter(records.values())), "per_workload": dict(sorted(per_workload.items())),
            "session_seconds": max((s for s in sessions.values() if isinstance(s, (int, float))), default=None),
            "sessions_seconds": sessions}


def split_tests(test_ids: list[str], workers: int, seconds: dict[str, float] | None = None,
                together: list[str] | tuple = ()) -> list[list[str]]:
    """`test_ids` over `workers` lists of about equal time: longest first, each to the least loaded worker
    (ties: the lowest worker). `seconds`: each test's time in a stored run; unknown tests count the median.
    `together`: tests that must all go to one worker, so that no two of them ever run at once (they share the
    host's bandwidth): placed as one block of their summed time."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if len(set(test_ids)) != len(test_ids):
        raise ValueError("test ids repeat: " + ", ".join(sorted({t for t in test_ids if test_ids.count(t) > 1})))
    strangers = sorted(set(together) - set(test_ids))
    if strangers:
        raise ValueError("tests to keep together are not among the tests to split: " + ", ".join(strangers))
    seconds = seconds or {}
    known = [seconds[t] for t in test_ids if t in seconds]
    default = statistics.median(known) if known else 1.0
    index = {t: i for i, t in enumerate(test_ids)}
    kept = set(together)
    blocks = [[t] for t in test_ids if t not in kept] + ([[t for t in test_ids if t in kept]] if kept else [])
    weighed = sorted(((sum(seconds.get(t, default) for t in tests), tests) for tests in blocks),
                     key=lambda entry: (-entry[0], index[entry[1][0]]))
    loads, parts = [0.0] * workers, [[] for _ in range(workers)]
    for weight, tests in weighed:
        worker = min(range(workers), key=lambda w: (loads[w], w))
        parts[worker] += tests
        loads[worker] += weight
    return [sorted(part, key=index.__getitem__) for part in parts]   # each worker runs in collection order


def benchmark_seconds(run: dict) -> dict[str, float]:
    """Each benchmark's seconds in a stored run, the split's weights: its wall time where the run kept it
    (extra_info["test_seconds"]: building, compiling and capture included), else its timed rounds' total."""
    seconds = {}
    for bench in run.get("benchmarks", []):
        if not (isinstance(bench, dict) and "fullname" in bench and isinstance(bench.get("stats"), dict)):
            continue
        wall = (bench.get("extra_info") or {}).get("test_seconds")
        seconds[bench["fullname"]] = float(wall if isinstance(wall, (int, float)) else bench["stats"].get("total", 0.0))
    return seconds


def merge_runs(runs: list[dict], workers: list[str]) -> dict[str, dict]:
    """One run per GPU kind (machine_info["gpu"]) from the workers' runs, `workers[i]` naming run i (e.g. its
    CUDA_VISIBLE_DEVICES). A test in two runs, or a run without benchmarks, is refused by name."""
    if len(runs) != len(workers) or not runs:
        raise ValueError(f"{len(runs)} runs for {len(workers)} worker names: need one name per run, >= 1 run")
    by_kind: dict[str, list[tuple[dict, str]]] = {}
    for run, worker in zip(runs, workers):
        if not isinstance(run.get("benchmarks"), list) or not isinstance(run.get("machine_info"), dict):
            raise ValueError(f"worker {worker}'s run is not a pytest-benchmark run (benchmarks, machine_info)")
        by_kind.setdefault(str(run["machine_info"].get("gpu")), []).append((run, worker))
    merged = {}
    for kind, members in by_kind.items():
        seen: dict[str, str] = {}
        benchmarks = []
        for run, worker in members:
            for bench in run["benchmarks"]:
                name = bench["fullname"]
                if name in seen:
                    raise ValueError(f"{name} is in the runs of worker {seen[name]} and worker {worker}")
                seen[name] = worker
                extra = dict(bench.get("extra_info", {}), spread_worker=worker)
                if "timing_cpu" in run["machine_info"]:   # which core timed it (perf_tests/conftest.py)
                    extra["timing_cpu"] = run["machine_info"]["timing_cpu"]
                benchmarks.append(dict(bench, extra_info=extra))
        first = members[0][0]
        machine_info = dict(first["machine_info"], spread={"workers": [w for _, w in members],
                                                          "tests_per_worker": {w: sum(seen[n] == w for n in seen)
                                                                               for _, w in members}})
        machine_info.pop("timing_cpu", None)   # the first worker's: each benchmark says its own instead
        merged[kind] = {**{k: v for k, v in first.items() if k not in ("benchmarks", "machine_info", "datetime")},
                        "machine_info": machine_info,
                        "datetime": max(str(run.get("datetime", "")) for run, _ in members),
                        "benchmarks": sorted(benchmarks, key=lambda b: b["fullname"])}
        outcomes = [run[GATE_OUTCOME] for run, _ in members if isinstance(run.get(GATE_OUTCOME), dict)]
        if outcomes:
            merged[kind][GATE_OUTCOME] = _merged_outcome(outcomes)
        times = {worker: run[TIER_TIME] for run, worker in members if isinstance(run.get(TIER_TIME), dict)}
        if times:
            merged[kind][TIER_TIME] = _merged_tier_time(times)
    return merged


def run_folder(machine_info: dict, store: Path, named: Path | None) -> Path:
    """The folder the workers' sessions store a run in, a merged one too: the tier's series in `store`
    (<tier>/, <tier>/slow/, <tier>/config-.../), or `named`, the folder --benchmark-storage named."""
    series = machine_info.get("series")
    if series is not None:
        return store / machine_info["tier"] / series
    if named is None:
        raise ValueError("the sessions' runs name no series and no --benchmark-storage was given: "
                         "where they are stored is not known")
    return named
