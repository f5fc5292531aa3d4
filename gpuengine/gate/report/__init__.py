"""The report of the stored runs: a static HTML page with PNG figures, and the README's Markdown tables.

- `store`: reading `baselines_store/` (every tier, run and maxbatch table; what was skipped and why);
- `tables`: cells that name their source, the number formats, Markdown and the README's generated block;
- `seeds`: the seed notes' headline tables in their own layouts, the note's numbers beside this GPU's;
- `sections`: per workload, by precision, peak, max batch, energy, history and machine tables;
- `claims`, `headline`: the rules of thresholds.json against the newest measurements; `ab_runs`: the gate's
  own A/B runs; `glance`: each case against PyTorch at its strongest, and the first screen;
- `figures`: the PNGs (matplotlib, Agg); `html`: the page; `build`: all of it into a scratch folder;
- `publish`: the scratch folder swapped in for `<out>/` whole; `cli`: the command, its checks and errors;
- `browser`: the page in headless Chromium (broken images, elements wider than the page, screenshots).

    ./gate report [--store baselines_store] [--out build/report] [--markdown] [--readme README.md]
                               [--results docs/results.md] [--screenshots DIR]
"""
from .build import PublishError, Report, build_report, markdown_report
from .store import ReportError, load_store

__all__ = ["PublishError", "Report", "ReportError", "build_report", "load_store", "markdown_report"]
