"""The report as one static HTML page: inline CSS, no script, figures as PNG files beside it; opens from disk.

Layout: a header with the store, the tiers and what was skipped; then per tier its parts (where the
engine stands, the seed notes, per workload, peak, memory and energy, history, machines), each with
its figures and tables. A cell's source (test and run, or the seed note) is its tooltip.
"""
from __future__ import annotations

import re
from html import escape

from .parts import Part, TierSection
from .store import Store
from .tables import FAILED_RUN, NOT_MEASURED, Table, plural

# Right-aligned, so that figures line up by their last digit: "38.7 M/s", "1,442,547", "2.05× (2.04–2.06)".
NUMBER = re.compile(r"^[-−]?[\d.,]+(e-?\d+)?(–[\d.,]+)?\s?(×|%|k/s|M/s|G/s|/s| K| M| W| J| GiB| MHz| TFLOP/s)?"
                    r"( \(.*\)| / .*)?$")

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
th, td { border: 1px solid #d0d7de; padding: .25em .55em; text-align: left; white-space: nowrap; }
th { background: #f0f3f6; white-space: normal; min-width: 5em; vertical-align: bottom; }
td.num { text-align: right; }
tbody tr:nth-child(even) { background: #fafbfc; }
td.note { background: #fff8e6; }
td.missing { color: #8c959f; font-style: italic; }
td.failed { background: #ffebe9; color: #82071e; }
p.caption { font-size: .8em; color: #57606a; margin-top: -.8em; max-width: 1100px; }
.skipped li { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .85em; }
"""


def _cell(cell) -> str:
    classes = ["missing"] if cell.text == NOT_MEASURED else ["note"] if cell.from_note else []
    if cell.failed:
        classes.append("failed")
    if NUMBER.match(cell.text):
        classes.append("num")
    attrs = (f' class="{" ".join(classes)}"' if classes else "") + \
        (f' title="{escape(cell.source)}"' if cell.source else "")
    return f"<td{attrs}>{escape(cell.text)}</td>"


def render_table(table: Table) -> str:
    head = "".join(f"<th>{escape(column)}</th>" for column in table.columns)
    body = "\n".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in table.rows)
    caption = f'<p class="caption">{escape(table.caption)}</p>' if table.caption else ""
    return (f'<div class="table-wrap"><table><caption>{escape(table.title)}</caption>\n<thead><tr>{head}</tr></thead>'
            f"\n<tbody>\n{body}\n</tbody></table></div>{caption}")


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
    for figure in part.figures:
        chunks.append(f'<figure><img src="{escape(figure.src)}" alt="{escape(figure.alt)}">'
                      f"<figcaption>{escape(figure.alt)}</figcaption></figure>")
    chunks += [render_table(table) for table in part.tables]
    return "\n".join(chunks)


def render_page(store: Store, sections: list[TierSection], notices: list[str]) -> str:
    nav = "".join(f'<li><a href="#{escape(s.tier.name)}">{escape(s.tier.title)}</a> '
                  f"({plural(len(s.tier.runs), 'run')}{_failed_count(s.tier.runs, ', {} failed the gate')})</li>"
                  for s in sections)
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
<div>Built by <code>python -m gpuengine report</code> from {store.run_count} stored runs in
<code>{escape(store.path.name or str(store.path))}/</code>{failed}. Every table shows the newest measurement of
each test; one from a run that failed the gate is marked <span class="failed">{FAILED_RUN}</span>, with the
baseline in force (the newest passing run of that test) beside it. Speed-ups are same-run medians of per-round
ratios (reference time / engine time: above 1 the engine is faster); absolute times compare only within one GPU.</div>
</header>
<main>
<nav><h2>Tiers</h2><ul>{nav or "<li>none: the store holds no runs</li>"}</ul></nav>
<section class="skipped"><h2>Skipped, and why</h2><ul>{skipped}</ul></section>
{body}
</main>
</body>
</html>
"""
