"""Command line: `python -m gpuengine <command>`.

    python -m gpuengine maxbatch mlp --cap-gib 6 [--precision tf32] [--engines ...] [--batch-pool 1 3]
        the largest batch of one training step and of one inference pass under a
        memory cap, for the engine and each PyTorch reference, as a table
    python -m gpuengine info [--tier]
        the machine facts every stored benchmark run records; --tier: only the tier, the folder of
        baselines_store/ this machine's runs go to (`./gate runs` hands it to pytest-benchmark)
    python -m gpuengine report [--store baselines_store] [--out build/report] [--markdown] [--readme README.md]
                               [--results docs/results.md]
        the report of every stored run: <out>/index.html and its figures (by default in build/report/,
        which git ignores; `./gate report` passes --out report, the committed copy); --markdown prints
        the README's results tables instead, --readme PATH also rewrites PATH's generated block with them
    python -m gpuengine gatepower [study|calibrate] [--sessions N] [--trials T] [--levels 0,5,10] ...
        the regression gate's false-alarm and detection rates under injected slowdowns, or
        each perf test's run-to-run noise for noise.json (gpuengine/bench/gatepower/cli.py)
    python -m gpuengine profile WORKLOAD [--precision bf16] [--batch N] [--cuda-graph N] [--references ...]
        one training step of the engine and of the PyTorch references per kernel, by op family, in
        microseconds, saved under baselines_store/<gpu>/profiles/ (a GPU only; gpuengine/bench/profile/cli.py);
        with --against REV|DIR the engine at REV and at the working tree, and which kernels moved between them
    python -m gpuengine profile-diff BASE.json HEAD.json [--side gpuengine] [--top 10]
        two stored profiles compared: the op families and kernels whose time per step moved most
    python -m gpuengine plans [WORKLOAD ...] [--precision tf32 bf16] [--runs 2] [--out FILE]
        whether fresh autotunings in new processes keep the same plan choices, per case and kind (a GPU
        only; gpuengine/bench/plan_stability.py)
    python -m gpuengine toggle-cost TOGGLE=VALUE [WORKLOAD ...] [--precision ...] [--cuda-graph 8] [--rounds 21]
        the engine with a toggle set beside the default engine, rounds alternating in one process: what the
        toggle costs or gains per workload and precision (a GPU only; gpuengine/bench/toggle_cost.py)

Every command checks its arguments, and the GPUENGINE_* toggles where it runs the
engine, before any work starts: a bad one is a usage error (status 2) naming the
argument or variable, the value and what is allowed (gpuengine/bench/cli_args.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from .bench.cli_args import UsageError
from .bench import plan_stability, toggle_cost
from .bench.gatepower import cli as gatepower_cli
from .bench.maxbatch import cli as maxbatch_cli
from .bench.profile import cli as profile_cli
from .bench.report import cli as report_cli
from .config import ConfigError, EngineConfig
from .gate.ab import checkout

ENGINE_COMMANDS = ("maxbatch", "info", "gatepower", "profile", "plans", "toggle-cost")   # these read the GPUENGINE_* toggles


def _info(args) -> int:
    from .bench.machine_info import collect_machine_info, current_tier
    from .runtime.backend import resolve_device
    config = EngineConfig.from_env()
    tier = current_tier(resolve_device(config) == "cuda")
    if args.tier:
        print(tier.name)
        return 0
    print(json.dumps(collect_machine_info(tier, config), indent=2, default=str))
    return 0


def _profile_base(against: str, root):
    """`profile --against`'s base: REV in a temporary worktree, or DIR (gpuengine/gate/ab/checkout.py)."""
    try:
        return checkout.for_command(against, root)
    except checkout.BaseError as exc:
        raise UsageError(f"argument --against: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpuengine", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    maxbatch_cli.add_parser(commands)
    info = commands.add_parser("info", help="GPU, driver, CUDA, cuDNN, clocks and power limit of this machine")
    info.add_argument("--tier", action="store_true",
                      help="print only the tier: the folder of baselines_store/ this machine's runs go to")
    info.set_defaults(run=_info, parser=info)
    report_cli.add_parser(commands)
    gatepower_cli.add_parser(commands)
    profile_cli.add_parser(commands, check_out=_profile_base)
    profile_cli.add_diff_parser(commands)
    plan_stability.add_parser(commands)
    toggle_cost.add_parser(commands)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:   # before any work: a bad value is refused once, not by every trial or session it would reach
        if args.command in ENGINE_COMMANDS:
            EngineConfig.from_env()
        if getattr(args, "check", None):
            args.check(args)
    except (UsageError, ConfigError) as exc:
        args.parser.error(str(exc))   # prints the usage and the message, exits 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
