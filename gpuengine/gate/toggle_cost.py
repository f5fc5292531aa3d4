"""`./gate toggle-cost`: what an engine toggle costs, the engine beside itself in one process.

    ./gate toggle-cost deterministic=0 resnet transformer zoo:resnet50 [--precision tf32 bf16]
                                    [--cuda-graph 8] [--rounds 21] [--length 384] [--out FILE]

For each workload and precision, two engines are built as a profile builds
them (profile/workloads.py: the perf tests' network, batch and data, resident,
`--cuda-graph` steps per launch and per round; the Transformer at --length
positions where given): one with the default toggles,
one with TOGGLE=VALUE. Each is warmed up (its own autotuning included), then
their rounds alternate (benchmarking.interleave) and the median of per-round
ratios says how much faster the toggled engine is (> 1: faster). Both must
still train: the loss after the timed rounds below the loss before them.
The table goes to stdout, the record to --out (JSON); the records docs/gate.md
cites for `deterministic=0` (issue 36: what determinism costs) are kept in
baselines_store/<gpu>/toggle_cost/ (not results: the report passes them by).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from gpuengine.bench.benchmarking import interleave, ratio
from gpuengine.bench.cli_args import gpu_workloads, parse_toggle, whole, workload_arguments
from gpuengine.bench.json_files import write_json
from gpuengine.config import CUDA_GRAPH_RANGE, PRECISIONS

DEFAULT_WORKLOADS = ("cnn", "resnet", "transformer", "zoo:resnet50", "zoo:mobilenet_v2")


class _Named:
    """A runner under another name, so that the two engines of one comparison keep their rounds apart."""

    def __init__(self, runner, name: str):
        self.runner, self.name = runner, name
        self.samples_per_round = runner.samples_per_round

    def prepare(self):
        self.runner.prepare()

    def run_round(self):
        self.runner.run_round()

    def synchronize(self):
        self.runner.synchronize()


def measure(workload_name: str, precision: str, toggle: tuple[str, object], cuda_graph: int, rounds: int,
            length: int | None = None) -> dict:
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.bench.profile.workloads import get_workload
    workload = get_workload(workload_name, length)
    case = ProfileCase(workload_name, precision, workload.batch, cuda_graph, length=length)
    name, value = toggle
    sides = {"default": workload.engine_runner(case), f"{name}={value}": workload.engine_runner(case, **{name: value})}
    runners = [_Named(runner, side) for side, runner in sides.items()]
    before = {side: runner.train(1)[-1] for side, runner in sides.items()}
    times = interleave(runners, rounds)
    after = {side: runner.train(1)[-1] for side, runner in sides.items()}
    default, toggled = list(sides)
    summary = ratio(times[toggled], times[default], toggled)
    label = workload_name if length is None else f"{workload_name} seq{length}"
    return {"case": f"{label} {precision}", "median_ms": {s: statistics.median(t) for s, t in times.items()},
            "toggled_speedup": summary.as_dict(), "loss_before": before, "loss_after": after,
            "trains": all(after[side] < before[side] for side in sides)}


def table(records: list[dict]) -> str:
    lines = [f"{'case':<26} {'default ms':>11} {'toggled ms':>11} {'toggled speed-up':>17}  trains"]
    for record in records:
        default, toggled = record["median_ms"].values()
        speedup = record["toggled_speedup"]
        lines.append(f"{record['case']:<26} {default:>11.3f} {toggled:>11.3f} "
                     f"{speedup['median']:>10.3f} ({speedup['low']:.3f}-{speedup['high']:.3f})  "
                     f"{'yes' if record['trains'] else 'NO'}")
    return "\n".join(lines)


def add_parser(commands) -> None:
    parser = commands.add_parser("toggle-cost", help="what an engine toggle costs, engine beside engine (GPU)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("toggle", help="TOGGLE=VALUE, e.g. deterministic=0")
    workload_arguments(parser, DEFAULT_WORKLOADS, PRECISIONS)
    parser.add_argument("--cuda-graph", type=whole(1, CUDA_GRAPH_RANGE[1]), default=8,
                        help="training steps per launch and per timed round (default 8)")
    parser.add_argument("--rounds", type=whole(3, 101), default=21)
    parser.add_argument("--length", type=whole(1),
                        help="the sequence length of workloads that have one (default: the seed shape's)")
    parser.add_argument("--out", type=Path, default=Path("build") / "toggle_cost.json")
    parser.set_defaults(run=run, check=check, parser=parser)


def check(args) -> None:
    args.parsed_toggle = parse_toggle(args.toggle)
    gpu_workloads(args.workloads, "the CPU tier times nothing", args.length)


def run(args) -> int:
    records = []
    for name in args.workloads:
        for precision in args.precision:
            records.append(measure(name, precision, args.parsed_toggle, args.cuda_graph, args.rounds, args.length))
            print(table(records[-1:]).splitlines()[-1], flush=True)
    print(table(records))
    write_json(args.out, {"toggle": args.toggle, "cuda_graph": args.cuda_graph, "rounds": args.rounds,
                          **({} if args.length is None else {"length": args.length}), "records": records})
    print(f"toggle-cost: written to {args.out}")
    return 0 if all(record["trains"] for record in records) else 1
