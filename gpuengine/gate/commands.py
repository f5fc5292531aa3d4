"""The gate's commands, run by `./gate COMMAND` (`python -m gpuengine.gate.commands COMMAND`).

    ./gate report [--store baselines_store] [--out report] [--markdown] [--readme README.md]
                  [--results docs/results.md] [--screenshots DIR]
        the report of every stored run: <out>/index.html and its figures; --markdown prints the README's
        results tables instead, --readme PATH also rewrites PATH's generated block with them, --screenshots
        checks the page in headless Chromium
    ./gate gatepower [study|calibrate] [--sessions N] [--trials T] [--levels 0,5,10] ...
        the regression gate's false-alarm and detection rates under injected slowdowns, or
        each perf test's run-to-run noise for noise.json (gpuengine/gate/gatepower/cli.py)
    ./gate plans [WORKLOAD ...] [--precision tf32 bf16] [--runs 2] [--out FILE]
        whether fresh autotunings in new processes keep the same plan choices, per case and kind (a GPU
        only; gpuengine/gate/plan_stability.py)
    ./gate toggle-cost TOGGLE=VALUE [WORKLOAD ...] [--precision ...] [--cuda-graph 8] [--rounds 21]
        the engine with a toggle set beside the default engine, rounds alternating in one process: what the
        toggle costs or gains per workload and precision (a GPU only; gpuengine/gate/toggle_cost.py)

`./gate report` writes the committed outputs (--out report --readme README.md --results docs/results.md);
`./gate perf` builds the report of its run into build/report/ (git-ignored). Every command checks its arguments, and the
GPUENGINE_* toggles where it runs the engine, before any work starts (gpuengine/bench/cli_args.py).
"""
from __future__ import annotations

import argparse
import sys

from gpuengine.bench.cli_args import run_command

from . import plan_stability, toggle_cost
from .gatepower import cli as gatepower_cli
from .report import cli as report_cli

ENGINE_COMMANDS = ("gatepower", "plans", "toggle-cost")   # these read the GPUENGINE_* toggles


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="./gate", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    report_cli.add_parser(commands)
    gatepower_cli.add_parser(commands)
    plan_stability.add_parser(commands)
    toggle_cost.add_parser(commands)
    return parser


def main(argv=None) -> int:
    return run_command(build_parser(), sys.argv[1:] if argv is None else argv, ENGINE_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
