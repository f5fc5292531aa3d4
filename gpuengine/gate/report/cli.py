"""`./gate report`: the page of every stored run, the README's headline block, docs/results.md.

Nothing is half-written: every output place is checked before the store is
read (`check`), the page is built aside and swapped in whole (build.py), and
the README and results page are rewritten, each aside and renamed, only once
the page is in place. A store with no run is an error that leaves every
output as it was. Bad input exits 2, a failure to write exits 1, each with
one line naming the place and the cause.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gpuengine.bench.cli_args import UsageError, checked, output_file, replaced_folder

DEFAULT_OUT = "build/report"   # git-ignored: building the report never dirties the checkout
PROG = "./gate report"


def add_parser(commands) -> None:
    report = commands.add_parser("report", help="HTML report with figures of the stored runs (or the README's tables)",
                                 description=__doc__.split("\n\n")[0])
    report.add_argument("--store", type=Path, default=Path("baselines_store"),
                        help="the stored runs (default: baselines_store)")
    report.add_argument("--out", type=Path, default=Path(DEFAULT_OUT),
                        help=f"folder of index.html and figures/, replaced whole (default: {DEFAULT_OUT}, "
                             "git-ignored; ./gate report writes the committed report/)")
    report.add_argument("--markdown", action="store_true",
                        help="print the README's results tables (Markdown) instead of writing the page")
    report.add_argument("--readme", metavar="PATH", type=Path,
                        help="also rewrite the generated block of PATH with the headline table (claims by "
                             "workload, per GPU)")
    report.add_argument("--results", metavar="PATH", type=Path,
                        help="also write every table of the stored runs to PATH (Markdown; ./gate report writes "
                             "docs/results.md)")
    report.add_argument("--screenshots", metavar="DIR", type=Path,
                        help="then open the page in headless Chromium (apt-get install chromium, or "
                             "$GATE_CHROMIUM): fail on a broken image or an element wider than the page, and "
                             "save PNGs of the first screen, the first GPU's headline and claims, and the page's "
                             "end into DIR")
    report.set_defaults(run=run, check=check, parser=report)


def check(args) -> None:
    """Every place the command writes can be written, before the store is read."""
    if not args.markdown:
        checked("--out", replaced_folder, str(args.out))
    elif args.screenshots is not None:
        raise UsageError("argument --screenshots: not with --markdown, which writes no page")
    for option, path in (("--readme", args.readme), ("--results", args.results)):
        if path is not None:
            checked(option, output_file, str(path))
    if args.readme is not None and not args.readme.is_file():   # its generated block is rewritten, not made
        raise UsageError(f"argument --readme: '{args.readme}' does not exist; give the file whose generated block "
                         "to rewrite")


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _kept(args) -> str:
    """The outputs a refused run leaves as they were, for its error message."""
    kept = ([] if args.markdown else [str(args.out)]) + [str(p) for p in (args.readme, args.results) if p]
    if not kept:
        return ""
    return ", ".join(kept) + (" is left as it was" if len(kept) == 1 else " are left as they were")


def _looked_at(index: Path, store, folder: Path) -> bool:
    """The page in headless Chromium: its screenshots saved into `folder`; False (said why) on a problem."""
    from .browser import BrowserError, check_page
    from .html import screens
    try:
        layout, shots = check_page(index, screens(store.tiers), folder)
    except BrowserError as exc:
        print(f"{PROG}: error: --screenshots: {exc}", file=sys.stderr)
        return False
    for shot in shots:
        print(f"report: screenshot {shot}")
    for problem in layout.problems():
        print(f"{PROG}: error: {index}: {problem}", file=sys.stderr)
    return not layout.problems()


def run(args) -> int:
    from gpuengine.bench.json_files import write_text
    from . import PublishError, ReportError, build_report, load_store, markdown_report
    from .headline import headline_markdown
    from .tables import plural, replace_generated_block, results_page
    try:
        store = load_store(args.store)
        if not store.tiers:
            raise ReportError(f"{args.store}: no stored run, nothing to report"
                              + (f"; {_kept(args)}" if _kept(args) else ""))
        readme = args.readme.read_text() if args.readme else None
        markdown = markdown_report(store)
        # Checked before anything is written: a README without the markers stops the command whole.
        refreshed = (replace_generated_block(readme, headline_markdown(store.tiers, store.rules), args.readme)
                     if args.readme else None)
    except (ReportError, OSError, ValueError) as exc:
        return _error(str(exc), 2)
    if args.markdown:
        print(markdown)
    else:
        try:
            report = build_report(store, args.out)
        except PublishError as exc:   # writing failed part way: the previous report stays whole
            return _error(str(exc), 1)
        except ReportError as exc:    # --out holds other files: nothing was written
            return _error(str(exc), 2)
        except ImportError as exc:    # no matplotlib: the previous report stays as it was
            return _error(str(exc), 1)
        print(f"report: {report.index} ({plural(len(store.tiers), 'tier')}, {plural(store.run_count, 'run')}, "
              f"{plural(len(report.figures), 'figure')})")
        for tier in store.tiers:
            if tier.runs:
                newest = tier.runs[-1]
                print(f"report: {tier.name}: newest run {newest.label} ({newest.date}, {newest.status}) -> "
                      f"{report.index}#{tier.name}")
        for notice in report.notices:
            print(f"report: skipped: {notice}")
        if report.leftover:
            print(f"report: warning: {report.leftover}", file=sys.stderr)
        if args.screenshots is not None and not _looked_at(report.index, store, args.screenshots):
            return 1
    try:   # only now that the page is in place: the README and results page never run ahead of it
        if refreshed is not None and refreshed != readme:
            write_text(args.readme, refreshed)
            print(f"report: {args.readme}: generated block refreshed", file=sys.stderr)
        if args.results:
            write_text(args.results, results_page(markdown))
            print(f"report: {args.results}: every table of the stored runs", file=sys.stderr)
    except OSError as exc:
        return _error(f"not written ({exc})", 1)
    return 0
