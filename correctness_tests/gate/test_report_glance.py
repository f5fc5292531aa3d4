"""gpuengine.gate.report: what a reader sees first. The first screen (is the newest run green, how fast, against
what, on which GPU), the headline figure against the strongest reference the tables read, the workload figures'
legends and colours, no figure text cut at its edge, and the page's order and links."""
from __future__ import annotations

import json
import re

import pytest

from gpuengine.gate.report import build_report, load_store
from gpuengine.gate.report.glance import headline_speedups, strongest_reference, tier_glance
from gpuengine.gate.report.html import FOLD_ROWS
from gpuengine.gate.report.sections import STRONGER, summary_rows, summary_table, timed_workloads
from gpuengine.gate.report.tables import BASELINE_ROW
from gpuengine.bench.thresholds import CLAIM, ThresholdRule

from .test_report import NEEDS_MATPLOTLIB, STORE
from .test_report_runs import CNN_128, MLP_1, gpu_run, write_run

TORCH_GRAPH_BEST = {"median": 1.7, "low": 1.68, "high": 1.72, "spread": 0.02, "per_round": [1.7, 1.68, 1.72],
                    "label": "torch_compile_graph in 3 of 3 rounds"}


@pytest.fixture
def quick_after_nightly(tmp_path):
    """A nightly run (0001 nnnnnnn) that timed torch_graph_best for the CNN, then a quick run (0002 qqqqqqq) that
    did not; the MLP case never timed it."""
    nightly = gpu_run("2026-11-25T07:00:00+00:00", "n", {CNN_128: 3.0e6})
    nightly["benchmarks"][0]["extra_info"]["ratios"][STRONGER] = TORCH_GRAPH_BEST
    store = tmp_path / "store"
    write_run(store, "Linux-CPython-3.12-64bit/0001_n.json", nightly)
    write_run(store, "Linux-CPython-3.12-64bit/0002_q.json",
              gpu_run("2026-11-27T07:00:00+00:00", "q", {CNN_128: 3.1e6, MLP_1: 2.0e6}))
    return store


def test_each_headline_case_is_put_against_the_strongest_reference_it_was_measured_beside(quick_after_nightly):
    tier = load_store(quick_after_nightly).tiers[0]
    found = {s.case: s for s in headline_speedups(tier)}
    cnn = found["CNN train, batch 128 · tf32"]   # the quick run is newer, but the nightly timed torch_graph_best
    assert (cnn.reference, cnn.run.label, cnn.ratio["median"]) == (STRONGER, "0001 nnnnnnn", 1.7)
    mlp = found["MLP train, 1 batch/epoch · tf32"]   # never timed: the PyTorch runner the engine led least
    ratios = mlp.bench.ratios
    weakest_lead = min(("torch_graph", "torch_compile_graph", "torch_compile", "torch_eager"),
                       key=lambda ref: ratios[ref]["median"] if ref in ratios else float("inf"))
    assert mlp.reference == weakest_lead == strongest_reference(mlp.bench) and mlp.run.label == "0002 qqqqqqq"


def test_the_headline_figure_draws_those_bars_coloured_by_reference(quick_after_nightly):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from matplotlib.container import BarContainer
    from gpuengine.gate.report.figures import draw_speedup
    tier = load_store(quick_after_nightly).tiers[0]
    expected = headline_speedups(tier)
    figure = draw_speedup(tier)
    (bars,) = [found for found in figure.axes[0].containers if isinstance(found, BarContainer)]
    drawn = sorted(zip((bar.get_y() for bar in bars.patches), (bar.get_width() for bar in bars.patches)),
                   reverse=True)   # top bar first, as the cases are listed
    assert [width for _, width in drawn] == [s.ratio["median"] for s in expected]
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert sorted(legend) == sorted({f"vs {s.reference}" for s in expected}) and len(legend) == 2
    faces = {tuple(bar.get_facecolor()) for bar in bars.patches}
    assert len(faces) == 2   # one colour per reference


def test_the_committed_headline_figure_reads_what_the_summary_table_reads(store):
    """Wherever the summary table shows a speed-up over torch_graph_best (its newest-beside row included), the
    headline figure draws that one, not the kinder torch_graph of a newer quick run; under a failed run the table
    also shows the baseline in force, which the figure does not draw."""
    for tier in (t for t in store.tiers if t.on_gpu):
        table = summary_table(tier)
        best_column = table.columns.index(f"vs {STRONGER}")
        found = {s.case: s for s in headline_speedups(tier)}
        label = None
        for row in table.rows:
            if row[0].text == BASELINE_ROW:
                continue
            label = row[0].text if not row[0].text.startswith("↳") else label
            case = f"{label} · {row[1].text}"
            value = row[best_column].text
            if re.match(r"\d", value):
                assert found[case].reference == STRONGER, case
                assert value.startswith(f"{found[case].ratio['median']:.2f}×"), (case, value)


@pytest.fixture(scope="module")
def store():
    return load_store(STORE)


@pytest.fixture(scope="module")
def drawn(store):
    """Every workload figure and the headline figure of the tier with the most workloads (the H100's: each
    runner the store holds but one), drawn from the committed runs; a figure takes half a second."""
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report.figures import draw_speedup, draw_workload
    tier = max(store.tiers, key=lambda tier: len(timed_workloads(tier)))
    figures = {f"{tier.name}/{function}": draw_workload(function, records, tier)
               for function, records in timed_workloads(tier).items()}
    if any(found for _, _, found in summary_rows(tier)):
        figures[f"{tier.name}/headline"] = draw_speedup(tier)
    return figures


def test_every_runner_a_workload_figure_draws_has_a_legend_entry_and_a_colour_of_its_own(drawn):
    from matplotlib.container import BarContainer
    for name, figure in drawn.items():
        if name.endswith("/headline"):
            continue
        colours = {}
        for axis in figure.axes:
            for bars in (found for found in axis.containers if isinstance(found, BarContainer)):
                colours.setdefault(bars.get_label(), set()).update(
                    tuple(patch.get_facecolor()) for patch in bars.patches)
        (legend,) = figure.legends
        assert sorted(text.get_text() for text in legend.get_texts()) == sorted(colours), name
        assert all(len(faces) == 1 for faces in colours.values()), name
        assert len({faces.pop() for faces in colours.values()}) == len(colours), f"{name}: runners share a colour"


def test_nothing_a_figure_draws_is_cut_at_its_edge(drawn):
    """Labels, ticks, titles and legends inside the figure: a long axis label once ran off a half-width panel."""
    from matplotlib.text import Text
    for name, figure in drawn.items():
        figure.canvas.draw()   # lays the figure out (constrained layout runs at draw time)
        renderer = figure.canvas.get_renderer()
        drawn_box, edge = figure.get_tightbbox(renderer), figure.bbox_inches   # both in inches
        inside = (drawn_box.x0 >= edge.x0 - 0.01 and drawn_box.x1 <= edge.x1 + 0.01
                  and drawn_box.y0 >= edge.y0 - 0.01 and drawn_box.y1 <= edge.y1 + 0.01)
        if not inside:
            outside = lambda box: box.x0 < -1 or box.y0 < -1 or box.x1 > figure.bbox.x1 + 1 or \
                box.y1 > figure.bbox.y1 + 1
            suspects = [text.get_text() for text in figure.findobj(Text)
                        if text.get_visible() and text.get_text() and outside(text.get_window_extent(renderer))]
            pytest.fail(f"{name}: what it draws spans {drawn_box} inches, past its edge {edge}; texts past it: "
                        f"{suspects}")


def test_the_first_screen_says_the_newest_run_failed_and_which_claim_it_missed(tmp_path):
    store = tmp_path / "store"
    write_run(store, "Linux-CPython-3.12-64bit/0001_a.json", gpu_run("2026-11-21T07:00:00+00:00", "a", {MLP_1: 1e6}))
    failed = gpu_run("2026-11-22T07:00:00+00:00", "b", {MLP_1: 2e6})
    failed["commit_info"]["branch"] = "topic"
    write_run(store, "history/Linux-CPython-3.12-64bit/0001_b.json", failed)
    rules = [ThresholdRule("*", "test_mlp_train[*]", "torch_graph", 100.0, "out of reach", CLAIM),
             ThresholdRule("*", "test_mlp_train[*]", "torch_eager", 1.0, "held", CLAIM)]
    glance = tier_glance(load_store(store).tiers[0], rules)
    assert not glance.newest.passed and glance.newest_text() == "history/0001 bbbbbbb on topic, 2026-11-22 07:00"
    assert glance.claims_text() == "1 of 2 held, 1 missed" and glance.targets_text() == "none"
    ratio = glance.speedups[0].ratio["median"]
    assert glance.speedup_text() == f"{ratio:.2f}–{ratio:.2f}× (median {ratio:.2f}×) over 1 headline case"
    assert glance.references_text() == f"{glance.speedups[0].reference} in 1 case (no run timed {STRONGER})"


def test_the_page_opens_on_the_glance_links_every_anchor_and_ends_with_what_was_left_out(quick_after_nightly,
                                                                                          tmp_path):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    runs = quick_after_nightly / "nvidia-h200" / "Linux-CPython-3.12-64bit"
    (runs / "0003_notes.json").write_text("{not json")   # something to leave out
    many = json.loads((runs / "0002_q.json").read_text())
    template = many["benchmarks"][0]
    names = [f"test_cnn_train[tf32-graph8-resident-b{batch}]" for batch in range(1, FOLD_ROWS + 3)]
    many["benchmarks"] = [dict(template, name=name, fullname=f"perf_tests/test_cnn.py::{name}")
                          for name in names]   # a workload table longer than a fold
    many["datetime"] = "2026-11-28T07:00:00+00:00"
    (runs / "0004_many.json").write_text(json.dumps(many))
    page = build_report(quick_after_nightly, tmp_path / "report").index.read_text(encoding="utf-8")
    order = [page.index(marker) for marker in ('id="at-a-glance"', "<nav>", '<section class="tier">', 'id="skipped"')]
    assert order == sorted(order), "glance, contents, tiers, then what was left out"
    assert "0003_notes.json: not valid JSON" in page[order[-1]:]
    glance = page[order[0]:order[1]]
    assert "0004 qqqqqqq on main" in glance and "passed the gate" in glance and f", {STRONGER} in 1 case" in glance
    ids = set(re.findall(r' id="([^"]+)"', page))
    assert not [target for target in re.findall(r'href="#([^"]+)"', page) if target not in ids]
    folded = re.findall(r"<details[^>]*><summary><b>([^<]+)</b>: (\d+) rows", page)
    assert folded and all(int(rows) > FOLD_ROWS for _, rows in folded)
    assert any(title.startswith("CNN training") for title, _ in folded)
