"""Command line: `python -m gpuengine <command>`.

    python -m gpuengine maxbatch mlp --cap-gib 6 [--precision tf32] [--engines ...] [--batch-pool 1 3]
        the largest batch of one training step and of one inference pass under a
        memory cap, for the engine and each PyTorch reference, as a table
    python -m gpuengine info
        the machine facts every stored benchmark run records
    python -m gpuengine report [--store baselines_store] [--out build/report] [--markdown] [--readme README.md]
                               [--results docs/results.md]
        the report of every stored run: <out>/index.html and its figures (by default in build/report/,
        which git ignores; `./gate report` passes --out report, the committed copy); --markdown prints
        the README's results tables instead, --readme PATH also rewrites PATH's generated block with them
    python -m gpuengine gatepower [study|calibrate] [--sessions N] [--trials T] [--levels 0,5,10] ...
        the regression gate's false-alarm and detection rates under injected slowdowns, or
        each perf test's run-to-run noise for noise.json (gpuengine/bench/gatepower/cli.py)

Every command checks its arguments, and the GPUENGINE_* toggles where it runs the
engine, before any work starts: a bad one is a usage error (status 2) naming the
argument or variable, the value and what is allowed (gpuengine/bench/cli_args.py).
"""
from __future__ import annotations

import argparse
import json
import sys

from .bench.cli_args import UsageError
from .bench.gatepower import cli as gatepower_cli
from .bench.maxbatch import cli as maxbatch_cli
from .config import ConfigError, EngineConfig

DEFAULT_REPORT_OUT = "build/report"   # git-ignored: building the report never dirties the checkout
ENGINE_COMMANDS = ("maxbatch", "info", "gatepower")   # these read the GPUENGINE_* toggles (trials, sessions)


def _info(args) -> int:
    from .bench.machine_info import collect_machine_info, current_tier
    from .config import EngineConfig
    from .runtime.backend import resolve_device
    config = EngineConfig.from_env()
    info = collect_machine_info(current_tier(resolve_device(config) == "cuda"), config)
    print(json.dumps(info, indent=2, default=str))
    return 0


def _report(args) -> int:
    from pathlib import Path

    from .bench.report import ReportError, build_report, load_store, markdown_report
    from .bench.report.headline import headline_markdown
    from .bench.json_files import write_text
    from .bench.report.tables import plural, replace_generated_block, results_page
    try:
        store = load_store(args.store)
        readme = Path(args.readme).read_text() if args.readme else None
        markdown = markdown_report(store)
        # Checked before anything is written: a README without the markers stops the command whole.
        refreshed = (replace_generated_block(readme, headline_markdown(store.tiers, store.rules), args.readme)
                     if args.readme else None)
    except (ReportError, OSError, ValueError) as exc:
        print(f"python -m gpuengine report: error: {exc}", file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown)
    else:
        try:
            report = build_report(store, args.out)
        except ReportError as exc:   # --out holds other files: nothing was written
            print(f"python -m gpuengine report: error: {exc}", file=sys.stderr)
            return 2
        except ImportError as exc:   # no matplotlib: the previous report stays as it was
            print(f"python -m gpuengine report: error: {exc}", file=sys.stderr)
            return 1
        if report.kept:
            print(f"report: {report.index}: kept as it was ({args.store} holds no stored run)")
        else:
            print(f"report: {report.index} ({plural(len(store.tiers), 'tier')}, {plural(store.run_count, 'run')}, "
                  f"{plural(len(report.figures), 'figure')})")
        for tier in store.tiers:
            if tier.runs:
                print(f"report: {tier.name}: newest run {tier.runs[-1].label} ({tier.runs[-1].date}, "
                      f"{tier.runs[-1].status}) -> "
                      f"{report.index}#{tier.name}")
        for notice in report.notices:
            print(f"report: skipped: {notice}")
    if refreshed is not None and not store.tiers:
        print(f"report: {args.readme}: generated block kept as it was ({args.store} holds no stored run)",
              file=sys.stderr)
    elif refreshed is not None and refreshed != readme:
        write_text(args.readme, refreshed)
        print(f"report: {args.readme}: generated block refreshed", file=sys.stderr)
    if args.results and store.tiers:
        write_text(args.results, results_page(markdown))
        print(f"report: {args.results}: every table of the stored runs", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpuengine", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    maxbatch_cli.add_parser(commands)
    info = commands.add_parser("info", help="GPU, driver, CUDA, cuDNN, clocks and power limit of this machine")
    info.set_defaults(run=_info, parser=info)
    report = commands.add_parser("report", help="HTML report with figures of the stored runs (or the README's tables)")
    report.add_argument("--store", default="baselines_store", help="the stored runs (default: baselines_store)")
    report.add_argument("--out", default=DEFAULT_REPORT_OUT,
                        help=f"folder of index.html and figures/, replaced whole (default: {DEFAULT_REPORT_OUT}, "
                             "git-ignored; ./gate report writes the committed report/)")
    report.add_argument("--markdown", action="store_true",
                        help="print the README's results tables (Markdown) instead of writing the page")
    report.add_argument("--readme", metavar="PATH", help="also rewrite the generated block of PATH with the headline "
                        "table (claims by workload, per GPU)")
    report.add_argument("--results", metavar="PATH", help="also write every table of the stored runs to PATH "
                        "(Markdown; ./gate report writes docs/results.md)")
    report.set_defaults(run=_report, parser=report)
    gatepower_cli.add_parser(commands)
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
