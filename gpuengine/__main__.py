"""Command line: `python -m gpuengine <command>`, the engine's commands (the gate's are `./gate`'s:
gpuengine/gate/commands.py).

    python -m gpuengine maxbatch mlp --cap-gib 6 [--precision tf32] [--engines ...] [--batch-pool 1 3]
        the largest batch of one training step and of one inference pass under a
        memory cap, for the engine and each PyTorch reference, as a table
    python -m gpuengine info [--tier]
        the machine facts every stored benchmark run records; --tier: only the tier, the folder of
        baselines_store/ this machine's runs go to (`./gate runs` hands it to pytest-benchmark)
    python -m gpuengine profile WORKLOAD [--precision bf16] [--batch N] [--cuda-graph N] [--references ...]
        one training step of the engine and of the PyTorch references per kernel, by op family, in
        microseconds, saved under baselines_store/<gpu>/profiles/ (a GPU only; gpuengine/bench/profile/cli.py);
        with --against REV|DIR the engine at REV and at the working tree, and which kernels moved between them
    python -m gpuengine profile-diff BASE.json HEAD.json [--runner gpuengine] [--top 10]
        two stored profiles compared: the op families and kernels whose time per step moved most

Every command checks its arguments, and the GPUENGINE_* toggles where it runs the
engine, before any work starts: a bad one is a usage error (status 2) naming the
argument or variable, the value and what is allowed (gpuengine/bench/cli_args.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from .bench.cli_args import UsageError, run_command
from .bench.maxbatch import cli as maxbatch_cli
from .bench.profile import cli as profile_cli
from .config import EngineConfig
from .gate.ab import checkout

ENGINE_COMMANDS = ("maxbatch", "info", "profile")   # these read the GPUENGINE_* toggles
MOVED = ("report", "gatepower", "plans", "toggle-cost")   # the gate's commands: ./gate COMMAND


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
    profile_cli.add_parser(commands, check_out=_profile_base)
    profile_cli.add_diff_parser(commands)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in MOVED:
        print(f"python -m gpuengine {argv[0]}: a command of the gate, run by ./gate {argv[0]} (gpuengine/gate/"
              "commands.py)", file=sys.stderr)
        return 2
    return run_command(build_parser(), argv, ENGINE_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
