"""`./gate report` and build_report's publishing: every output whole, or as it was.

The page is built in a scratch folder beside `--out` and swapped in whole;
the README's block and the results page are rewritten only after it. Each
test breaks one step (an empty store, a figure that cannot be written half
way, a swap that fails, an old report that cannot be deleted, a forbidden
`--out`) and checks what is left: the previous report byte for byte, no
scratch folder, one error line naming the place and the cause. The machines
run these as root, where permissions refuse nothing: the failures are
stubbed, or a path under a file stands for a forbidden place.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuengine.gate.commands import main as cli_main
from gpuengine.gate.report import PublishError, ReportError, build_report, load_store, markdown_report
from gpuengine.gate.report.headline import headline_markdown
from gpuengine.gate.report.tables import GENERATED_BEGIN, GENERATED_END, generated_block, results_page

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "baselines_store"
NEEDS_MATPLOTLIB = "the report extra (matplotlib) is not installed: pip install -e '.[report]' (./gate installs it)"
PROG = "./gate report: error: "


@pytest.fixture(scope="module")
def store():
    return load_store(STORE)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` and its bytes: a report compared before and after a failed rebuild."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def published(root: Path) -> tuple[Path, Path, Path]:
    """A previous report (index and a figure of two tiers), a README with its block and a results page."""
    out = root / "out"
    for tier in ("nvidia-h200", "nvidia-h100"):
        (out / "figures" / tier).mkdir(parents=True)
        (out / "figures" / tier / "speedup.png").write_bytes(tier.encode())
    (out / "index.html").write_text("the previous report")
    readme = root / "README.md"
    readme.write_text(f"{GENERATED_BEGIN}\nthe published numbers\n{GENERATED_END}\n")
    results = root / "results.md"
    results.write_text("the published tables")
    return out, readme, results


def test_an_empty_store_is_an_error_that_leaves_every_output_as_it_was(tmp_path, capsys):
    empty = tmp_path / "store"
    empty.mkdir()
    out, readme, results = published(tmp_path)
    before = snapshot(tmp_path)
    assert cli_main(["report", "--store", str(empty), "--out", str(out), "--readme", str(readme),
                     "--results", str(results)]) == 2
    assert capsys.readouterr().err == (f"{PROG}{empty}: no stored run, nothing to report; {out}, {readme}, {results} "
                                       "are left as they were\n")
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md", "out", "results.md", "store"]


def test_an_empty_store_writes_nothing_where_nothing_was(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    assert cli_main(["report", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "out")]) == 2
    assert "no stored run, nothing to report" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["store"]
    with pytest.raises(ReportError, match=f"^{tmp_path}/store: no stored run, nothing to report; {tmp_path}/out is "
                                          "left as it was$"):
        build_report(tmp_path / "store", tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def small_store(root: Path) -> Path:
    """One CPU-tier run of the committed store: a report of it draws a few figures."""
    source = next((STORE / "cpu-tier").rglob("0001_*.json"))
    tier = root / "store" / "cpu-tier" / source.parent.name
    tier.mkdir(parents=True)
    shutil.copy(source, tier / source.name)
    return root / "store"


def test_a_rebuild_replaces_the_whole_report_folder(tmp_path):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    out = tmp_path / "out"
    (out / "figures" / "gone-tier").mkdir(parents=True)
    (out / "index.html").write_text("the previous report")
    (out / "figures" / "gone-tier" / "stale.png").write_bytes(b"png")
    report = build_report(small_store(tmp_path), out)
    assert not (out / "figures" / "gone-tier").exists(), "a figure of the previous report outlived the rebuild"
    assert report.figures and all(figure.is_file() for figure in report.figures)
    assert "the previous report" not in report.index.read_text()
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask   # an ordinary folder, not mkdtemp's private one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "store"]   # no scratch or old folder left


def previous_report(out: Path) -> None:
    (out / "figures" / "old").mkdir(parents=True)
    (out / "index.html").write_text("the previous report")
    (out / "figures" / "old" / "a.png").write_bytes(b"png")


def failing_replace(out: Path, also_undo: bool = False):
    """os.replace that cannot move the new report into place (nor, also_undo, the old one back)."""
    real_replace = os.replace

    def replace(source, target):
        name = Path(source).name
        if Path(target) == out and (name.startswith(".out-new-") or (also_undo and name.startswith(".out-old-"))):
            raise OSError("disk trouble")
        return real_replace(source, target)
    return replace


def test_the_report_is_exchanged_with_the_previous_one_in_one_step_where_the_system_can(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report import publish
    out = tmp_path / "out"
    previous_report(out)
    answers, real_exchange = [], publish._exchange
    monkeypatch.setattr(publish, "_exchange", lambda a, b: answers.append(real_exchange(a, b)) or answers[-1])
    report = build_report(small_store(tmp_path), out)
    assert "the previous report" not in report.index.read_text() and report.leftover is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "store"]
    if answers != [True]:   # the report was swapped in by two renames instead
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available on this system or file system")


@pytest.mark.parametrize("how", ["exchange", "two renames"])
def test_a_failure_while_publishing_puts_the_previous_report_back_whole(tmp_path, monkeypatch, how):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report import publish
    out = tmp_path / "out"
    previous_report(out)
    if how == "exchange":
        def exchange(a, b):
            raise OSError("disk trouble")
        monkeypatch.setattr(publish, "_exchange", exchange)
    else:
        monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
        monkeypatch.setattr(os, "replace", failing_replace(out))
    with pytest.raises(PublishError, match=f"^{out}: the report could not be written \\(disk trouble\\); the previous "
                                           "report is left as it was$"):
        build_report(small_store(tmp_path), out)
    assert (out / "index.html").read_text() == "the previous report"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["figures", "figures/old", "figures/old/a.png",
                                                                        "index.html"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "store"]


def test_a_previous_report_that_cannot_be_put_back_is_said_where_it_is(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report import publish
    out = tmp_path / "out"
    previous_report(out)
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    monkeypatch.setattr(os, "replace", failing_replace(out, also_undo=True))
    with pytest.raises(PublishError) as failed:
        build_report(small_store(tmp_path), out)
    (old,) = tmp_path.glob(".out-old-*")
    assert f"the previous report could not be put back and is at {old}" in str(failed.value)
    assert (old / "index.html").read_text() == "the previous report" and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [old.name, "store"]   # the new report's scratch is gone


def test_an_out_folder_holding_other_files_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "src"
    out.mkdir()
    (out / "engine.py").write_text("precious")
    assert cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(out)]) == 2
    assert f"{out}: holds engine.py besides a report" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["engine.py"] and (out / "engine.py").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "store"]


def test_a_missing_store_is_an_error_naming_it_and_writes_nothing(tmp_path, capsys):
    missing = tmp_path / "no-such-store"
    assert cli_main(["report", "--store", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert f"{missing}: no such store folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ReportError, match="no such store folder"):
        load_store(missing)


def test_a_readme_without_the_markers_is_an_error_before_anything_is_written(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no generated block here\n")
    assert cli_main(["report", "--out", str(tmp_path / "out"), "--readme", str(readme)]) == 2
    assert f"{readme}: no generated block" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and readme.read_text() == "# no generated block here\n"


def test_without_matplotlib_the_error_names_the_extra_and_the_old_report_stays(tmp_path, monkeypatch, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "index.html").write_text("the previous report")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)   # import matplotlib.figure now fails
    assert cli_main(["report", "--store", str(STORE), "--out", str(tmp_path / "out")]) == 1
    assert "pip install -e '.[report]'" in capsys.readouterr().err
    assert (tmp_path / "out" / "index.html").read_text() == "the previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]   # no scratch folder left behind


def test_markdown_option_prints_the_readme_tables_and_writes_nothing(store, tmp_path, capsys):
    assert cli_main(["report", "--store", str(STORE), "--out", str(tmp_path / "out"), "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == markdown_report(store).strip() and printed.startswith("### NVIDIA ")   # a GPU tier first, the CPU tier last
    assert not (tmp_path / "out").exists()


def test_readme_option_rewrites_only_the_generated_block(store, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{GENERATED_BEGIN}\nstale\n{GENERATED_END}\n\ntail\n")
    results = tmp_path / "results.md"
    assert cli_main(["report", "--store", str(STORE), "--markdown", "--readme", str(readme),
                     "--results", str(results)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\n") and text.endswith(f"{GENERATED_END}\n\ntail\n")
    assert generated_block(text) == headline_markdown(store.tiers, store.rules).strip()
    assert results.read_text() == results_page(markdown_report(store))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "results.md"]   # nothing left aside




@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs git and a checkout")
def test_the_default_report_folder_is_one_git_ignores():
    """`./gate report` (and ./gate perf) build where git does not look; ./gate report names report/."""
    from gpuengine.gate.commands import build_parser
    out = build_parser().parse_args(["report"]).out
    for path in (f"{out}/index.html", f"{out}/figures/nvidia-h200/speedup.png"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, \
            f"{path} is not ignored by git: a report build dirties the checkout"
    assert subprocess.run(["git", "check-ignore", "-q", "report/index.html"], cwd=REPO).returncode == 1


def test_a_figure_that_fails_half_way_leaves_the_previous_report_readme_and_results(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report import figures
    source = small_store(tmp_path)
    out, readme, results = published(tmp_path)
    assert cli_main(["report", "--store", str(source), "--out", str(out)]) == 0   # a real report first
    capsys.readouterr()
    before = snapshot(tmp_path)
    real_save, saved = figures._save, []

    def save(figure, path):   # the first figure is written, the second meets a read-only folder
        if saved:
            raise PermissionError(13, "Permission denied", str(path))
        saved.append(path)
        return real_save(figure, path)
    monkeypatch.setattr(figures, "_save", save)
    assert cli_main(["report", "--store", str(source), "--out", str(out), "--readme", str(readme),
                     "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{PROG}{out}: the report could not be written ([Errno 13] Permission denied: ")
    assert err.endswith("; the previous report is left as it was\n") and err.count("\n") == 1
    assert saved, "the build stopped before its first figure: nothing half-way was tested"
    assert snapshot(tmp_path) == before   # the report, README and results page, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "out", "results.md", "store"]   # no scratch


def test_an_old_report_that_cannot_be_deleted_is_said_and_the_new_one_is_in_place(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    from gpuengine.gate.report import build
    out, _, _ = published(tmp_path)
    real_rmtree = build.shutil.rmtree

    def rmtree(path, *args, **kwargs):   # as a read-only figures folder of the old report would
        if Path(path).name.startswith((".out-old-", ".out-new-")):
            raise PermissionError(13, "Permission denied", str(Path(path) / "figures" / "nvidia-h200"))
        return real_rmtree(path, *args, **kwargs)
    monkeypatch.setattr(build.shutil, "rmtree", rmtree)
    assert cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(out)]) == 0
    (old,) = tmp_path.glob(".out-*")   # .out-new-*: exchanged into the scratch folder's name; else .out-old-*
    assert f"report: warning: {old}: the previous report, replaced but not deleted" in capsys.readouterr().err
    assert (old / "index.html").read_text() == "the previous report"
    assert "the previous report" not in (out / "index.html").read_text()
    assert not (out / "figures" / "nvidia-h200").exists()   # the new page links only its own figures


def test_an_out_in_a_forbidden_place_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    source = small_store(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stopped:
        cli_main(["report", "--store", str(source), "--out", str(tmp_path / "file" / "out")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"{PROG}argument --out: '{tmp_path}/file/out' cannot be "
                                                        f"written: {tmp_path}/file is not a folder")
    monkeypatch.setattr(os, "access", lambda path, mode: False)   # as a read-only parent folder answers
    with pytest.raises(SystemExit):
        cli_main(["report", "--store", str(source), "--out", str(tmp_path / "out")])
    assert capsys.readouterr().err.splitlines()[-1] == (f"{PROG}argument --out: '{tmp_path}/out' cannot be written: "
                                                        f"{tmp_path} is not writable")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "store"]


def test_a_scratch_folder_that_cannot_be_made_is_one_line(tmp_path, monkeypatch, capsys):
    from gpuengine.gate.report import build

    def mkdtemp(**kwargs):   # what a read-only parent answers where the up-front check cannot see it
        raise PermissionError(13, "Permission denied", str(tmp_path / ".out-new-x"))
    monkeypatch.setattr(build.tempfile, "mkdtemp", mkdtemp)
    assert cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (f"{PROG}{tmp_path}/out: the report could not be written ([Errno 13] Permission "
                                       f"denied: '{tmp_path}/.out-new-x'); nothing was published\n")


@pytest.mark.parametrize("option", ["--readme", "--results"])
def test_a_readme_or_results_page_that_cannot_be_written_is_refused_first(tmp_path, capsys, option):
    missing = tmp_path / "no" / "page.md"
    with pytest.raises(SystemExit) as stopped:
        cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(tmp_path / "out"), option,
                  str(missing)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"{PROG}argument {option}: '{missing}' cannot be written: "
                                                        f"its folder {missing.parent} does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_a_readme_that_does_not_exist_is_refused_first(tmp_path, capsys):
    missing = tmp_path / "README.md"
    with pytest.raises(SystemExit) as stopped:
        cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(tmp_path / "out"), "--readme",
                  str(missing)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"{PROG}argument --readme: '{missing}' does not exist; give "
                                                        "the file whose generated block to rewrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_screenshots_with_markdown_are_refused_first(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli_main(["report", "--store", str(small_store(tmp_path)), "--markdown", "--screenshots", str(tmp_path)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"{PROG}argument --screenshots: not with --markdown, which "
                                                        "writes no page")


def test_screenshots_without_a_chromium_fail_saying_how_to_get_one_the_report_built(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    monkeypatch.setenv("GATE_CHROMIUM", str(tmp_path / "no-chromium-here"))
    out, shots = tmp_path / "out", tmp_path / "shots"
    assert cli_main(["report", "--store", str(small_store(tmp_path)), "--out", str(out), "--screenshots",
                     str(shots)]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{PROG}--screenshots: no Chromium found: install Chromium (Debian: apt-get install chromium) or name one "
        "in $GATE_CHROMIUM")
    assert (out / "index.html").is_file() and not shots.exists()
