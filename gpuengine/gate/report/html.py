"""The report as one static HTML page: inline CSS, no script, figures as PNG files beside it; opens from disk.

Layout: first a screen that answers "is the newest run green, how fast, against what, on which GPU" (one
row per tier, glance.py) and the contents; then per tier its parts (where the engine stands, the seed notes,
per workload, peak, memory and energy, profiles, history, machines), each with its figures and tables; last,
what the store held that the report left out, and why. A cell's source (test and run, or the seed note) is
its tooltip. Text cells wrap, so that a table fits the page; only the tables with a column per stored run
(`Table.scrolls`) scroll sideways, and a table of more than FOLD_ROWS rows is folded under its title.
"""
from __future__ import annotations

import re
from html import escape

from .glance import TierGlance
from .parts import Part, TierSection
from .store import Store, TierRuns
from .tables import FAILED_RUN, NOT_MEASURED, Table, plural

# Right-aligned, so that figures line up by their last digit: "38.7 M/s", "1,442,547", "2.05× (2.04–2.06)".
NUMBER = re.compile(r"^[-−]?[\d.,]+(e-?\d+)?(–[\d.,]+)?\s?(×|%|k/s|M/s|G/s|/s| K| M| W| J| GiB| MHz| TFLOP/s)?"
                    r"( \(.*\)| / .*)?$")

FOLD_ROWS = 20   # a longer table is folded under its title: the page stays a page a reader can scroll through

STYLE = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; margin: 0;
       color: #1b1f23; background: #f6f8fa; line-height: 1.45; }
header { background: #24292f; color: #f6f8fa; padding: 1.2em 2em; }
header h1 { margin: 0 0 .3em 0; font-size: 1.6em; }
header a { color: #9ecbff; }
header .failed { background: #ffebe9; color: #82071e; padding: 0 .3em; border-radius: 3px; }
main { padding: 0 2em 3em 2em; max-width: 1400px; }
nav ul { margin: .3em 0; padding-left: 1.2em; }
section.tier { background: #ffffff; border: 1px solid #d0d7de; border-radius: 6px; padding: 0 1.5em 1em 1.5em;
               margin-top: 1.5em; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h3 { margin-top: 1.8em; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { font-size: .85em; color: #57606a; }
.table-wrap { overflow-x: auto; margin: .8em 0 1.4em 0; }
table { border-collapse: collapse; font-size: .85em; }
caption { text-align: left; font-weight: 600; padding: .3em 0; }
th, td { border: 1px solid #d0d7de; padding: .25em .55em; text-align: left; vertical-align: top; }
th { background: #f0f3f6; vertical-align: bottom; }
td.num { text-align: right; }
.nowrap { white-space: nowrap; }
td > div + div { margin-top: .4em; }
.scrolls td { white-space: nowrap; }
table.glance { font-size: .95em; width: 100%; }
table.glance small { color: #57606a; }
td.pass { color: #116329; }
td.fail { background: #ffebe9; color: #82071e; }
.badge { display: inline-block; padding: 0 .4em; border-radius: 3px; font-size: .85em; font-weight: 600; }
.badge.pass { background: #dafbe1; color: #116329; }
.badge.fail { background: #ffebe9; color: #82071e; }
tbody tr:nth-child(even) { background: #fafbfc; }
td.note { background: #fff8e6; }
td.missing { color: #8c959f; font-style: italic; }
td.failed { background: #ffebe9; color: #82071e; }
p.caption { font-size: .8em; color: #57606a; margin-top: -.8em; max-width: 1100px; }
details { margin: .8em 0 1.4em 0; }
summary { cursor: pointer; font-size: .9em; color: #0550ae; }
.skipped li { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .85em; }
"""


GLANCE_NOTE = (
    "Newest run: the newest stored run of the GPU and whether it passed the gate (a run that fails is kept under "
    "history/, never a baseline). Claims and targets: the rules of baselines_store/thresholds.json against the "
    "newest measurement of each case. Speed-up: reference time / engine time in the same run, the median of "
    "per-round ratios (above 1 the engine is faster), for each headline case over the strongest PyTorch reference "
    "it was measured against: torch_graph_best, the faster of torch_graph and torch_compile_graph in each round, "
    "from the newest run that timed it. Every table below shows the newest measurement of each test; one from a "
    f"run that failed the gate is marked \u201c{FAILED_RUN}\u201d, with the baseline in force beside it. Absolute "
    "times compare only within one GPU.")


def _breakable(text: str) -> str:
    """Escaped, a line break allowed after each underscore: 'torch_compile_graph' need not set a column's width."""
    return escape(text).replace("_", "_<wbr>")


def _line(text: str) -> str:
    """A line of a cell; a figure like '2.05× (2.04–2.06)' may break before its spread, nowhere else."""
    if not NUMBER.match(text):
        return _breakable(text)
    value, _, spread = text.partition(" (")
    return f'<span class="nowrap">{escape(value)}</span>' + \
        (f' <span class="nowrap">({escape(spread)}</span>' if spread else "")


def _cell(cell) -> str:
    classes = ["missing"] if cell.text == NOT_MEASURED else ["note"] if cell.from_note else []
    if cell.failed:
        classes.append("failed")
    lines = cell.text.split("\n")   # one item a line: a headline cell's targets, a speed-up and samples/s
    if all(NUMBER.match(line) for line in lines):
        classes.append("num")
    text = _line(cell.text) if len(lines) == 1 else "".join(f"<div>{_line(line)}</div>" for line in lines)
    attrs = (f' class="{" ".join(classes)}"' if classes else "") + \
        (f' title="{escape(cell.source)}"' if cell.source else "")
    return f"<td{attrs}>{text}</td>"


def render_table(table: Table, anchor: str = "") -> str:
    head = "".join(f"<th>{_breakable(column)}</th>" for column in table.columns)
    body = "\n".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in table.rows)
    caption = f'<p class="caption">{escape(table.caption)}</p>' if table.caption else ""
    wrap = "table-wrap scrolls" if table.scrolls else "table-wrap"
    folded = len(table.rows) > FOLD_ROWS
    named = f' id="{escape(anchor)}"' if anchor else ""
    html = (f'<div class="{wrap}"{"" if folded else named}><table><caption>{escape(table.title)}</caption>\n'
            f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table></div>{caption}")
    if not folded:
        return html
    return (f"<details{named}><summary><b>{escape(table.title)}</b>: {len(table.rows)} rows, folded "
            f"(open to read)</summary>\n{html}</details>")


def _failed_count(runs, text: str = " ({} failed the gate)") -> str:
    failed = sum(not run.passed for run in runs)
    return text.format(failed) if failed else ""


def _tier_header(section: TierSection) -> str:
    tier = section.tier
    facts = "; ".join(f'{escape(series or "speed runs")}: {len(runs)}{_failed_count(runs)}, newest '
                      f'<span title="{escape(str(runs[-1].path))}">{escape(runs[-1].label)}</span> on '
                      f"{escape(runs[-1].date)}" for series, runs in tier.series().items()) or "no pytest-benchmark run"
    smoke = "" if tier.on_gpu else " — smoke timings only, never gating"
    links = " · ".join(f'<a href="#{escape(part.anchor)}">{escape(part.heading)}</a>' for part in section.parts)
    return (f'<h2 id="{escape(tier.name)}">{escape(tier.title)} <small>({escape(tier.name)}/)</small>{smoke}</h2>'
            f"<p>Stored runs, {facts}.</p><p>{links}</p>")


def _part(part: Part) -> str:
    chunks = [f'<h3 id="{escape(part.anchor)}">{escape(part.heading)}</h3>']
    if part.intro:
        chunks.append(f"<p>{escape(part.intro)}</p>")
    for i, figure in enumerate(part.figures, 1):   # numbered ids: a figure or table can be linked to
        chunks.append(f'<figure id="{escape(part.anchor)}-figure-{i}"><img src="{escape(figure.src)}" '
                      f'alt="{escape(figure.alt)}"><figcaption>{escape(figure.alt)}</figcaption></figure>')
    chunks += [render_table(table, f"{part.anchor}-table-{i}") for i, table in enumerate(part.tables, 1)]
    return "\n".join(chunks)


def _glance_row(glance: TierGlance) -> str:
    tier, run = glance.tier, glance.newest
    gpu = (f'<a href="#{escape(tier.name)}">{escape(tier.title)}</a>'
           + (f"<br><small>{escape(glance.stack_text())}</small>" if glance.stack_text() else ""))
    failed = len(tier.failed_runs)
    newest = escape(glance.newest_text()) + ("" if run is None else
                                             f'<br><span class="badge {"pass" if run.passed else "fail"}">'
                                             f'{"passed the gate" if run.passed else "failed the gate"}</span>'
                                             + (f" <small>{failed} of {len(tier.runs)} stored runs failed</small>"
                                                if failed else ""))
    if not tier.on_gpu:
        never = "— (CPU timings are smoke, never gating)"
        return (f"<tr><td>{gpu}</td><td>{newest}</td><td>{never}</td><td>—</td><td>smoke shapes on NumPy: "
                f'see <a href="#{escape(tier.name)}-workloads">each workload</a></td></tr>')
    verdict = "" if not glance.claims else "fail" if any(not m.check.passed for m in glance.claims) else "pass"
    fast = (f"{escape(glance.speedup_text())}<br><small>against {escape(glance.references_text())}; "
            f'<a href="#{escape(tier.name)}-summary">the figure and the tables</a></small>' if glance.speedups
            else "no headline case stored")
    return (f'<tr><td>{gpu}</td><td>{newest}</td><td class="{verdict}">{escape(glance.claims_text())}</td>'
            f"<td>{escape(glance.targets_text())}</td><td>{fast}</td></tr>")


def _glance(sections: list[TierSection]) -> str:
    """The first screen: per tier, is the newest run green, what the claims say, how fast and against what."""
    rows = "\n".join(_glance_row(s.glance) for s in sections)
    return (f'<section id="at-a-glance"><h2>At a glance</h2><div class="table-wrap"><table class="glance">'
            "<thead><tr><th>GPU</th><th>Newest run</th><th>Claims (a miss fails the gate)</th>"
            "<th>Targets (goals)</th><th>Engine speed-up over PyTorch at its strongest</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
            f"<p class=\"caption\">{escape(GLANCE_NOTE)}</p></section>")


def _contents(sections: list[TierSection]) -> str:
    lines = "".join(f'<li><a href="#{escape(s.tier.name)}">{escape(s.tier.title)}</a> '
                    f"({plural(len(s.tier.runs), 'run')}{_failed_count(s.tier.runs, ', {} failed the gate')}): "
                    + " · ".join(f'<a href="#{escape(p.anchor)}">{escape(p.heading)}</a>' for p in s.parts)
                    + "</li>" for s in sections)
    return (f'<nav><h2>Contents</h2><ul>{lines or "<li>none: the store holds no runs</li>"}'
            '<li><a href="#skipped">Left out of this report, and why</a></li></ul></nav>')


def render_page(store: Store, sections: list[TierSection], notices: list[str]) -> str:
    skipped = "".join(f"<li>{escape(notice)}</li>" for notice in notices) or "<li>nothing</li>"
    failed = (f", {store.failed_count} of which failed the gate (kept under <code>history/</code>)"
              if store.failed_count else "")
    body = "\n".join(f'<section class="tier">{_tier_header(s)}\n' + "\n".join(_part(p) for p in s.parts)
                     + "</section>" for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuengine benchmark report</title>
<style>{STYLE}</style>
</head>
<body>
<header>
<h1>gpuengine benchmark report</h1>
<div>Built by <code>./gate report</code> from {store.run_count} stored runs in
<code>{escape(store.path.name or str(store.path))}/</code>{failed}.</div>
</header>
<main>
{_glance(sections)}
{_contents(sections)}
{body}
<section class="skipped" id="skipped"><h2>Left out of this report, and why</h2><ul>{skipped}</ul></section>
</main>
</body>
</html>
"""


def screens(tiers: list[TierRuns]) -> dict[str, tuple[str | None, int | None]]:
    """What a look at the page should cover (`browser.check_page`'s screens): the first screen; of the first
    GPU tier its headline figure, its claims table whole and its first workload; the end of the page."""
    shots: dict[str, tuple[str | None, int | None]] = {"first-screen": (None, None)}
    gpu = next((tier for tier in tiers if tier.on_gpu), None)
    if gpu is not None:
        name = gpu.name
        shots |= {f"{name}-headline": (f"{name}-summary", None), f"{name}-claims": (f"{name}-summary-table-1", 0),
                  f"{name}-workload": (f"{name}-workloads", None)}
    return shots | {"left-out": ("skipped", 0)}
