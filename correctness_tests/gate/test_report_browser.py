"""The report in a real browser (headless Chromium, gpuengine.gate.report.browser): the check finds a broken
image and an element wider than the page, and the committed report has neither and opens on its first screen.

Chromium is not part of the locked stack: a fresh CI machine has none and may not run apt as root, so these
tests skip there, saying how to run them. With it installed (Debian: `apt-get install chromium`, about 30 s):
`python -m pytest correctness_tests/gate/test_report_browser.py`, or the command itself:
`./gate report --screenshots DIR`.
"""
from __future__ import annotations

import pytest

from gpuengine.gate.report.browser import HEIGHT, WIDTH, Browser, check_page, find_chromium

from .test_report import REPO

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no Chromium here (CI has none): apt-get install chromium (or name one in $GATE_CHROMIUM), then "
           "python -m pytest correctness_tests/gate/test_report_browser.py")

WIDE_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
.table-wrap { overflow-x: auto; } td { white-space: nowrap; }</style></head><body>
<h1 id="top">A page with faults</h1>
<img src="figures/missing.png" alt="a figure that is not there">
<div class="table-wrap"><table><caption>Too wide for its column</caption><tr><td>{cells}</td></tr></table></div>
<div class="table-wrap scrolls"><table><caption>Scrolls by design</caption><tr><td>{cells}</td></tr></table></div>
<details><summary>folded</summary><p style="width: 3000px">a folded paragraph past the page's edge</p></details>
<p id="fine">A paragraph that fits.</p>
</body></html>"""


def test_the_check_finds_a_broken_image_and_what_sticks_out_of_the_page(tmp_path):
    page = tmp_path / "index.html"
    page.write_text(WIDE_PAGE.replace("{cells}", "<td>a figure</td>" * 200), encoding="utf-8")
    layout, shots = check_page(page, {"top": (None, None), "fine": ("fine", 0)}, tmp_path / "shots")
    assert layout.width == WIDTH and layout.broken == ["figures/missing.png"]
    assert len(layout.wide) == 2, layout.wide   # the scrolling table is allowed; the folded paragraph is opened
    assert 'div.table-wrap "Too wide for its column"' in layout.wide[0] and "px of content in" in layout.wide[0]
    assert layout.wide[1].startswith("p (near #") and "px to its right edge" in layout.wide[1]
    assert [p.name for p in shots] == ["top.png", "fine.png"] and all(p.stat().st_size > 200 for p in shots)
    assert "broken image: figures/missing.png" in layout.problems()


def test_the_committed_report_fits_the_page_and_its_first_screen_holds_the_glance(tmp_path):
    """report/ is the stored runs' (test_report.py holds it to them): no broken image, nothing wider than a
    1280 px window, and the glance table whole on the first screen."""
    index = REPO / "report" / "index.html"
    with Browser.open(index) as browser:
        layout = browser.layout()
        top, bottom = browser.box("at-a-glance")
        shot = browser.screenshot(tmp_path / "first.png")
    assert not layout.problems(), "\n".join(layout.problems())
    assert bottom <= HEIGHT, f"the glance ends at {bottom:.0f} px, below the first screen ({HEIGHT} px)"
    image = pytest.importorskip("matplotlib.image", reason="the report extra (matplotlib) reads the screenshot")
    pixels = image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (HEIGHT, WIDTH)
    assert (abs(pixels - pixels[-1, -1]).sum(axis=-1) > 0.1).mean() > 0.05, "a blank first screen"
