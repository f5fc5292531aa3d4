"""`./gate plans`: do fresh autotunings on one GPU keep the same choices?

    ./gate plans resnet zoo:resnet50 [--precision tf32 bf16] [--runs 2] [--out FILE]

Every choice the engine makes by timing (a cuDNN graph's plan, a GEMM's
cuBLASLt algorithm, a depthwise convolution's way: ops/autotune.py) is made
afresh in each of `--runs` new processes, one after another on this GPU,
with nothing preset: each process builds every case's engine as a profile
does (profile/workloads.py: the perf tests' network, batch and data), warms it
up (which autotunes), and writes what it chose. The runs are then compared
choice by choice: the share of choices every run made alike, per case and per
kind, is the plan stability docs/gate.md states (issue 36 asks for 95%). The
set-up time of each case (building, autotuning, capture) is kept beside it.
Every run also keeps each choice's timings (every way timed, in the
heuristic's order), so the rule can be replayed offline at other margins
(`replay`): the table then says how stable, and how much slower than the
fastest ways, the choices would be under the rule in force and at each
plain margin in MARGINS: the measurement the margins are chosen from. The table goes to stdout, the whole
record to --out (JSON); the ones docs/gate.md cites are kept in
baselines_store/<gpu>/plan_stability/ (not results: the report passes them by).
"""
from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuengine.bench.cli_args import gpu_workloads, whole, workload_arguments
from gpuengine.bench.json_files import write_json

PROG = "./gate plans"
DEFAULT_WORKLOADS = ("mlp", "cnn", "resnet", "transformer", "zoo:resnet50", "zoo:mobilenet_v2")
MARGINS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08)   # min_margin values the rule is replayed at
CAPS = (8, 16, 32, 64)   # first-N-candidates limits the cuDNN choices are replayed at (building is the cost)


def kind_of(key: str) -> str:
    """What a choice key chooses: 'gemm' (a cuBLASLt algorithm), 'way' (FasterOf) or 'cudnn' (a graph's plan)."""
    first = key.lstrip("(").split(",")[0].strip("'\" ")
    if first == "gemm":
        return "gemm"
    return "way" if first.endswith("_choice") else "cudnn"


def compare(runs: list[dict]) -> dict:
    """Per case and per kind: choices made in every run, and how many of them every run made alike."""
    cases: dict = {}
    for case in runs[0]["cases"]:
        chosen = [run["cases"][case]["choices"] for run in runs if case in run["cases"]]
        keys = set.intersection(*(set(c) for c in chosen)) if len(chosen) == len(runs) else set()
        by_kind: dict = {}
        for key in keys:
            tally = by_kind.setdefault(kind_of(key), {"choices": 0, "same": 0})
            tally["choices"] += 1
            tally["same"] += len({c[key] for c in chosen}) == 1
        cases[case] = {"by_kind": by_kind, "setup_s": [run["cases"][case]["setup_s"] for run in runs
                                                        if case in run["cases"]]}
    total = {"choices": 0, "same": 0}
    for case in cases.values():
        for tally in case["by_kind"].values():
            total["choices"] += tally["choices"]
            total["same"] += tally["same"]
    return {"cases": cases, "total": total,
            "stability": total["same"] / total["choices"] if total["choices"] else None}


def recorded(ways: list) -> dict:
    """A choice's recorded timings, [[way, ms, spread], ...], as autotune.Timing by way."""
    from ..ops.autotune import Timing
    return {name: Timing(ms, spread, 1) for name, ms, spread in ways}


def replay(runs: list[dict], min_margin: float, knob_margin: float | None = None) -> dict:
    """The rule (autotune.choose) replayed on every run's recorded timings at `min_margin` (and `knob_margin`
    between one engine's variants; None: one margin between all ways): how many choices every run would
    make alike, and the chosen ways' total time over the fastest ways' (summed over runs)."""
    from ..ops.autotune import choose
    same = choices = 0
    chosen_ms = fastest_ms = 0.0
    for case in runs[0]["cases"]:
        timed = [run["cases"][case].get("timed", {}) for run in runs if case in run["cases"]]
        if len(timed) != len(runs):
            continue
        for key in set.intersection(*(set(t) for t in timed)):
            picks = set()
            for ways in (t[key] for t in timed):
                timings = recorded(ways)
                pick = choose([name for name, _, _ in ways], timings, min_margin=min_margin, knob_margin=knob_margin)
                picks.add(pick)
                chosen_ms += timings[pick].ms
                fastest_ms += min(t.ms for t in timings.values())
            choices += 1
            same += len(picks) == 1
    return {"min_margin": min_margin, "knob_margin": knob_margin, "choices": choices, "same": same,
            "stability": same / choices if choices else None,
            "slower_than_fastest": chosen_ms / fastest_ms - 1 if fastest_ms else None}


def capped(runs: list[dict], cap: int, min_margin: float | None = None) -> dict:
    """The first run's cuDNN choices replayed as if only the heuristics' first `cap` candidates were built:
    the build seconds that would save, and how much slower the choices would run than with every candidate."""
    from ..ops.autotune import MIN_MARGIN, choose
    margin = MIN_MARGIN if min_margin is None else min_margin
    saved_s = all_s = capped_ms = full_ms = 0.0
    changed = graphs = 0
    for case in runs[0]["cases"].values():
        for key, graph in case.get("cudnn_graphs", {}).items():
            all_s += sum(ms for ms in graph["build_ms"] if ms is not None) / 1e3
            saved_s += sum(ms for ms in graph["build_ms"][cap:] if ms is not None) / 1e3
            ways = case.get("timed", {}).get(key)
            if not ways:
                continue
            position = {name: i for i, name in enumerate(graph["offered"])}
            timings = recorded(ways)
            order = [name for name, _, _ in ways]
            kept = [name for name in order if position.get(name, cap) < cap]
            if not kept:
                continue
            full, cut = choose(order, timings, min_margin=margin), choose(kept, timings, min_margin=margin)
            graphs += 1
            changed += full != cut
            full_ms += timings[full].ms
            capped_ms += timings[cut].ms
    return {"cap": cap, "graphs": graphs, "changed": changed, "build_s": round(all_s - saved_s, 2),
            "all_build_s": round(all_s, 2), "slower": capped_ms / full_ms - 1 if full_ms else None}


def cudnn_graphs(graphs) -> dict:
    """Each graph's candidates in the heuristics' order, the milliseconds each build took (None: not tried)
    and whether cuDNN compiles it at run time."""
    from ..ops.autotune import key_text
    return {key_text(graph.key): {"offered": list(graph.offered.values()),
                                  "build_ms": [graph.build_ms.get(index) for index in graph.offered],
                                  "compiled": [index in graph.runtime_compiled for index in graph.offered]}
            for graph in graphs}


def cudnn_cost(graphs) -> dict:
    """What building and autotuning `graphs` (ops/cudnn.py's CudnnGraph) cost: counts and seconds."""
    graphs = list(graphs)
    return {"graphs": len(graphs), "candidates": sum(len(g.offered) for g in graphs),
            "built": sum(len(g.plans) for g in graphs), "timed": sum(len(g.timings) for g in graphs),
            "build_s": round(sum(g.build_s for g in graphs), 1), "tune_s": round(sum(g.tune_s for g in graphs), 1)}


def tune_once(cases: list[tuple[str, str]], out: Path) -> None:
    """In this (fresh) process: build and warm up each case's engine with nothing preset, write the choices."""
    from ..ops import autotune, cudnn
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.bench.profile.workloads import get_workload
    progress = logging.getLogger(autotune.log.name)
    progress.setLevel(logging.INFO)
    progress.addHandler(logging.StreamHandler(sys.stderr))
    record = {"cases": {}}
    for workload_name, precision in cases:
        workload = get_workload(workload_name)
        choices = autotune.use_plan_choices({})
        known = set(cudnn.built_graphs())
        started = time.perf_counter()
        runner = workload.engine_runner(ProfileCase(workload_name, precision, workload.batch, 1))
        runner.prepare()
        runner.synchronize()
        case = f"{workload_name} {precision}"
        record["cases"][case] = {
            "choices": {key: entry["plan"] for key, entry in choices.tuned.items()},
            "timed": dict(choices.timed),
            "setup_s": round(time.perf_counter() - started, 1),
            "cudnn": cudnn_cost(graph for key, graph in cudnn.built_graphs().items() if key not in known),
            "cudnn_graphs": cudnn_graphs(graph for key, graph in cudnn.built_graphs().items() if key not in known)}
        print(f"plans: {case}: set-up {record['cases'][case]['setup_s']} s, cuDNN {record['cases'][case]['cudnn']}",
              file=sys.stderr, flush=True)
        del runner   # its device memory goes back before the next case is built
    write_json(out, record)


def table(result: dict) -> str:
    lines = [f"{'case':<28} {'kind':<6} {'same':>5} / {'all':<5} set-up s per run"]
    for case, entry in result["cases"].items():
        setup = ", ".join(f"{s:.0f}" for s in entry["setup_s"])
        for kind, tally in sorted(entry["by_kind"].items()):
            lines.append(f"{case:<28} {kind:<6} {tally['same']:>5} / {tally['choices']:<5} {setup}")
    total = result["total"]
    share = "n/a" if result["stability"] is None else f"{100 * result['stability']:.1f}%"
    lines.append(f"all: {total['same']} of {total['choices']} choices the same in every run ({share})")
    for margin in result.get("replayed", []):
        if margin["choices"]:
            knobs = "" if margin.get("knob_margin") is None else f", knobs {100 * margin['knob_margin']:.0f}%"
            lines.append(f"  replayed at min_margin {100 * margin['min_margin']:.0f}%{knobs}: {margin['same']} of "
                         f"{margin['choices']} alike ({100 * margin['stability']:.1f}%), chosen ways "
                         f"{100 * margin['slower_than_fastest']:.2f}% slower than the fastest")
    for cap in result.get("capped", []):
        if cap["graphs"]:
            lines.append(f"  cuDNN's first {cap['cap']} candidates only: building {cap['build_s']:.0f} of "
                         f"{cap['all_build_s']:.0f} s, {cap['changed']} of {cap['graphs']} choices differ, "
                         f"chosen plans {100 * cap['slower']:.2f}% slower than with every candidate")
    return "\n".join(lines)


def tune_once_command(args, out: Path) -> list[str]:
    """One fresh autotuning in a process of its own: this command again, `--tune-once OUT`."""
    return [sys.executable, "-m", "gpuengine.gate.commands", "plans", *args.workloads, "--precision",
            *args.precision, "--tune-once", str(out)]


def add_parser(commands) -> None:
    parser = commands.add_parser("plans", help="do fresh autotunings keep the same plan choices? (GPU)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_arguments(parser, DEFAULT_WORKLOADS, ("tf32", "bf16"))
    parser.add_argument("--runs", type=whole(2, 10), default=2, help="fresh processes that autotune (default 2)")
    parser.add_argument("--out", type=Path, default=Path("build") / "plan_stability.json")
    parser.add_argument("--tune-once", type=Path, metavar="JSON", help=argparse.SUPPRESS)   # a run's own process
    parser.set_defaults(run=run, check=check, parser=parser)


def check(args) -> None:
    gpu_workloads(args.workloads, "nothing is autotuned on the CPU tier")


def run(args) -> int:
    cases = [(name, precision) for name in args.workloads for precision in args.precision]
    if args.tune_once is not None:
        tune_once(cases, args.tune_once)
        return 0
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpuengine-plans-") as folder:
        for index in range(args.runs):
            out = Path(folder) / f"run{index}.json"
            command = tune_once_command(args, out)
            print(f"plans: fresh autotuning {index + 1} of {args.runs}: {len(cases)} case(s)", flush=True)
            status = subprocess.run(command).returncode
            if status != 0:
                print(f"plans: run {index + 1} failed (exit status {status})", file=sys.stderr)
                return 1
            runs.append(json.loads(out.read_text()))
    from ..ops.autotune import KNOB_MARGIN, MIN_MARGIN
    result = compare(runs) | {"runs": runs, "workloads": args.workloads, "precisions": args.precision,
                              "replayed": [replay(runs, MIN_MARGIN, KNOB_MARGIN)]   # the rule in force first
                              + [replay(runs, margin) for margin in MARGINS],
                              "capped": [capped(runs, cap) for cap in CAPS]}
    print(table(result))
    write_json(args.out, result)
    print(f"plans: written to {args.out}")
    return 0
