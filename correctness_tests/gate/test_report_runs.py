"""gpuengine.gate.report: which run each table shows. A run that failed the gate is named as one, with the
baseline in force under it; the workload tables show each case's newest measurement; torch_graph_best says which
captured reference it was. Built from copies of stored runs."""
from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest

from gpuengine.gate.report import load_store, markdown_report
from gpuengine.gate.report.headline import headline_table
from gpuengine.gate.report.sections import history_table, summary_table, timed_workloads, workload_table
from gpuengine.gate.report.seeds import seed_tables

from .test_report import H200, STORE, newest_holding, number, stored

GPU_RUN = next((H200 / "Linux-CPython-3.12-64bit").glob("0004_*.json"))
MLP_1 = "test_mlp_train[tf32-graph8-resident-bpe1]"
CNN_128 = "test_cnn_train[tf32-graph8-resident-b128]"
RESNET = "test_resnet_train[cifar10-tf32-graph8-resident-b128]"


def gpu_run(when: str, commit: str, engine_samples_per_s: dict[str, float]) -> dict:
    """A copy of H200 run 0004 holding only the named tests, the engine's samples/s set as given
    (RESNET is 0004's CNN record renamed)."""
    run = json.loads(GPU_RUN.read_text())
    by_name = {b["name"]: b for b in run["benchmarks"]}
    benchmarks = []
    for name, samples in engine_samples_per_s.items():
        bench = copy.deepcopy(by_name[CNN_128 if name == RESNET else name])
        bench["name"] = name
        bench["extra_info"]["samples_per_s"]["gpuengine"] = samples
        benchmarks.append(bench)
    return dict(run, benchmarks=benchmarks, datetime=when, commit_info=dict(run["commit_info"], id=commit * 40))


def write_run(store: Path, rel: str, run: dict) -> None:
    path = store / "nvidia-h200" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run))


@pytest.fixture
def failing_store(tmp_path) -> Path:
    """A baseline (0001 aaaaaaa: MLP and CNN), then a run that failed the gate (history/0001 bbbbbbb: MLP faster,
    and a ResNet record no baseline holds)."""
    store = tmp_path / "store"
    write_run(store, "Linux-CPython-3.12-64bit/0001_a.json",
              gpu_run("2026-11-21T07:00:00+00:00", "a", {MLP_1: 1.0e6, CNN_128: 3.0e6}))
    write_run(store, "history/Linux-CPython-3.12-64bit/0001_b.json",
              gpu_run("2026-11-22T07:00:00+00:00", "b", {MLP_1: 2.0e6, RESNET: 9876.0}))
    return store


def cells(table, first: str) -> list[dict[str, str]]:
    """The rows of a Table whose first cell is `first`, each with the row under it (`next`), as column -> text."""
    out = []
    for i, row_cells in enumerate(table.rows):
        if row_cells[0].text == first:
            following = table.rows[i + 1] if i + 1 < len(table.rows) else []
            out.append(dict(zip(table.columns, (c.text for c in row_cells)),
                            next=dict(zip(table.columns, (c.text for c in following)))))
    return out


def tf32_row(table, first: str) -> dict[str, str]:
    """The one TF32 row of `table` whose first cell is `first` (see cells)."""
    (found,) = [r for r in cells(table, first) if r["Precision"] == "tf32"]
    return found


def test_tables_show_a_failed_runs_measurement_marked_next_to_the_baseline_in_force(failing_store):
    tier = load_store(failing_store).tiers[0]
    summary = summary_table(tier)
    mlp = tf32_row(summary, "MLP train, 1 batch/epoch")
    assert mlp["gpuengine"] == "2.00 M/s"
    assert mlp["Run"].startswith("history/0001 bbbbbbb, 2026-11-22 07:00: failed run")
    assert mlp["next"]["Workload"] == "↳ baseline in force" and mlp["next"]["gpuengine"] == "1.00 M/s"
    assert mlp["next"]["Run"].startswith("0001 aaaaaaa, 2026-11-21 07:00: passed")
    cnn = tf32_row(summary, "CNN train, batch 128")
    assert cnn["gpuengine"] == "3.00 M/s" and cnn["Run"] == "0001 aaaaaaa, 2026-11-21 07:00: passed"
    assert cnn["next"]["Workload"] != "↳ baseline in force"
    resnet = tf32_row(summary, "ResNet-50 train, CIFAR-10")
    assert resnet["Run"].endswith("failed run; no baseline yet") and resnet["gpuengine"] == "9.88 k/s"
    infer = tf32_row(summary, "MLP infer, batch 8000")
    assert infer["gpuengine"] == "not measured yet"   # no run at all holds it
    assert all(c.failed for c in summary.rows[0][2:]) and not any(c.failed for c in summary.rows[1])

    seeds = {t.title: t for t in seed_tables(tier)}
    result = seeds["Seed 000 — the result: dense MLP 1000→1000 tanh→1, TF32"]
    (training,) = cells(result, "Training throughput (1 batch per epoch)")
    assert training["gpuengine (NVIDIA H200)"] == "2.00 M/s [failed run; baseline 1.00 M/s]"
    assert "history/0001 bbbbbbb (2026-11-22 07:00, failed run" in result.caption
    assert "baseline in force" in result.caption and "0001 aaaaaaa (2026-11-21 07:00, passed)" in result.caption
    resnet_seed = seeds["Seed 002 — ResNet-50 training throughput, batch 128 (samples/s)"]
    assert cells(resnet_seed, "CIFAR-10")[0]["gpuengine"] == "9,876 [failed run; no baseline]"
    cnn_seed = seeds["Seed 001 — CNN training throughput (samples/s; note: epoch wall time in parentheses)"]
    assert cells(cnn_seed, "gpuengine (OpenNN in the note)")[0]["Batch 128 (NVIDIA H200)"] == "3,000,000"
    assert "0001 aaaaaaa (2026-11-21 07:00, passed" in cnn_seed.caption

    markdown = markdown_report(load_store(failing_store))
    assert "2 stored runs; 1 of them failed the gate" in markdown and "history/0001 bbbbbbb" in markdown
    assert "| 2.00 M/s [failed run; baseline 1.00 M/s] |" in markdown


def test_a_newer_baseline_is_shown_plain_and_the_failed_run_stays_in_the_history(failing_store):
    write_run(failing_store, "Linux-CPython-3.12-64bit/0002_c.json",
              gpu_run("2026-11-23T07:00:00+00:00", "c", {MLP_1: 1.5e6}))
    tier = load_store(failing_store).tiers[0]
    mlp = tf32_row(summary_table(tier), "MLP train, 1 batch/epoch")
    assert mlp["gpuengine"] == "1.50 M/s" and mlp["Run"] == "0002 ccccccc, 2026-11-23 07:00: passed"
    history = history_table(tier.runs, load_store(failing_store), tier.gpu)
    assert history.columns[1:4] == ["0001 aaaaaaa 2026-11-21 07:00",
                                    "history/0001 bbbbbbb 2026-11-22 07:00 (failed run)",
                                    "0002 ccccccc 2026-11-23 07:00"]


def test_the_workload_table_shows_each_cases_newest_measurement(failing_store):
    """The failed run holds one MLP case; the workload table still shows the others from the baseline."""
    write_run(failing_store, "Linux-CPython-3.12-64bit/0000_old.json",
              gpu_run("2026-11-20T07:00:00+00:00", "d", {"test_mlp_train[tf32-graph8-resident-bpe12]": 5.0e5}))
    tier = load_store(failing_store).tiers[0]
    table = workload_table("test_mlp_train", timed_workloads(tier)["test_mlp_train"], tier)
    assert [(r[0].text, r[-1].text.split(",")[0]) for r in table.rows] == [
        ("tf32-graph8-resident-bpe1", "history/0001 bbbbbbb"), ("↳ baseline in force", "0001 aaaaaaa"),
        ("tf32-graph8-resident-bpe12", "0000 ddddddd")]


@pytest.fixture(scope="module")
def store_at_cd502ab(tmp_path_factory) -> Path:
    """The committed store as it stood after the H100 run at cd502ab, when the newest measurement of the zoo,
    the streamed cases and ResNet-50 came from runs that failed the gate: later runs are left out."""
    folder = tmp_path_factory.mktemp("at-cd502ab") / "baselines_store"

    def later_runs(directory, names):
        return [name for name in names if re.match(r"\d{4}_.*\.json$", name)
                and json.loads((Path(directory) / name).read_text())["datetime"] > "2026-11-24T15:40"]

    shutil.copytree(STORE, folder, ignore=later_runs)
    return folder


def test_the_h100_runs_that_failed_the_gate_show_where_a_reader_looks(store_at_cd502ab):
    store = load_store(store_at_cd502ab)
    h100_folder = store_at_cd502ab / "nvidia-h100-80gb-hbm3"
    h100 = next(tier for tier in store.tiers if tier.name == "nvidia-h100-80gb-hbm3")
    zoo = workload_table("test_zoo_train", timed_workloads(h100)["test_zoo_train"], h100)
    (alexnet,) = cells(zoo, "alexnet-tf32-streamed-b16")
    label, bench = newest_holding(h100_folder, "test_zoo_train[alexnet-tf32-streamed-b16]")
    assert alexnet["vs torch_graph"].startswith(f"{bench['extra_info']['ratios']['torch_graph']['median']:.2f}×")
    assert label.startswith("history/") and alexnet["Run"].startswith(label)
    assert "failed run; no baseline yet" in alexnet["Run"]
    for test, case in (("test_mlp_streamed", "tf32-graph1-pool4-b8000"), ("test_cnn_streamed", "tf32-graph8-pool16-b1024")):
        label, _ = newest_holding(h100_folder, f"{test}[{case}]")   # the newest run is a failed one
        table = workload_table(test, timed_workloads(h100)[test], h100)
        assert label.startswith("history/") and any(r[-1].text.startswith(label) for r in table.rows)

    zoo_seed = next(t for t in seed_tables(h100) if t.title.startswith("Seed 003"))
    info = stored(h100_folder, "test_zoo_train[alexnet-tf32-streamed-b16]")
    engine_ms = cells(zoo_seed, "gpuengine")[0]["alexnet"]
    assert engine_ms.endswith(" [failed run; no baseline]")
    assert float(engine_ms.split()[0]) == pytest.approx(1e3 * 16 / info["samples_per_s"]["gpuengine"], abs=1e-3)
    assert f"{newest_holding(h100_folder, 'test_zoo_train[alexnet-tf32-streamed-b16]')[0]} (" in zoo_seed.caption

    resnet = tf32_row(summary_table(h100), "ResNet-50 train, CIFAR-10")
    newest, in_force = (stored(h100_folder, RESNET), stored(h100_folder, RESNET, history=False))
    assert number(resnet["vs torch_graph"].split()[0]) == pytest.approx(newest["ratios"]["torch_graph"]["median"],
                                                                        abs=5e-3)
    assert resnet["next"]["Workload"] == "↳ baseline in force" and resnet["next"]["Run"].startswith("0001 d4fcd16")
    assert number(resnet["next"]["vs torch_graph"].split()[0]) == pytest.approx(
        in_force["ratios"]["torch_graph"]["median"], abs=5e-3)
    assert newest_holding(h100_folder, RESNET)[0] in markdown_report(store)


def test_tables_and_headline_say_which_captured_reference_torch_graph_best_was(tmp_path):
    """A run that timed both captured references: the workload and summary tables and the headline name the
    faster one, from its stored label."""
    run = gpu_run("2026-11-25T07:00:00+00:00", "e", {MLP_1: 2.0e6})
    info = run["benchmarks"][0]["extra_info"]
    info["samples_per_s"]["torch_compile_graph"] = 1.2e6
    info["ratios"]["torch_compile_graph"] = {"median": 1.6, "low": 1.55, "high": 1.7, "spread": 0.09,
                                             "per_round": [1.6, 1.55, 1.7]}
    info["ratios"]["torch_graph_best"] = {"median": 1.58, "low": 1.55, "high": 1.62, "spread": 0.04,
                                          "per_round": [1.58, 1.55, 1.62],
                                          "winners": ["torch_compile_graph", "torch_graph", "torch_compile_graph"],
                                          "label": "torch_compile_graph in 2 of 3 rounds"}
    store = tmp_path / "store"
    write_run(store, "Linux-CPython-3.12-64bit/0001_e.json", run)
    (store / "thresholds.json").write_text(json.dumps([{"gpu": "*", "test": "test_mlp_train[*]",
                                                        "reference": "torch_graph_best", "min_ratio": 1.85,
                                                        "kind": "target", "why": "test"}]))
    loaded = load_store(store)
    tier = loaded.tiers[0]
    table = workload_table("test_mlp_train", timed_workloads(tier)["test_mlp_train"], tier)
    (row_cells,) = [dict(zip(table.columns, (c.text for c in r))) for r in table.rows]
    # A reference's cell: the speed-up, then its own samples/s; torch_graph_best, no runner, has none.
    assert row_cells["vs torch_graph_best"] == "1.58× (1.55–1.62), torch_compile_graph in 2 of 3 rounds"
    assert row_cells["vs torch_compile_graph"] == "1.60× (1.55–1.70)\n1.20 M/s"
    summary = tf32_row(summary_table(tier), "MLP train, 1 batch/epoch")
    assert summary["vs torch_graph_best"].endswith(", torch_compile_graph in 2 of 3 rounds")
    (headline,) = [[cell.text for cell in row] for row in headline_table(tier, loaded.rules).rows]
    assert headline[3] == ("1.85× torch_graph_best: 1.58× (tf32-graph8-resident-bpe1, torch_compile_graph in 2 of 3 "
                           "rounds, the engine at 37% of peak), not met")


def test_a_quick_tier_run_keeps_the_nightlys_strongest_comparison_in_view(tmp_path):
    """A newer run that did not time torch_graph_best (the quick tier's CNN) shows first; the newest run that did
    follows, so the speed-up over PyTorch at its strongest stays in the tables."""
    nightly = gpu_run("2026-11-25T07:00:00+00:00", "n", {CNN_128: 3.0e6})
    nightly["benchmarks"][0]["extra_info"]["ratios"]["torch_graph_best"] = {
        "median": 1.7, "low": 1.68, "high": 1.72, "spread": 0.02, "per_round": [1.7, 1.68, 1.72],
        "label": "torch_compile_graph in 3 of 3 rounds"}
    store = tmp_path / "store"
    write_run(store, "Linux-CPython-3.12-64bit/0001_n.json", nightly)
    write_run(store, "Linux-CPython-3.12-64bit/0002_q.json", gpu_run("2026-11-27T07:00:00+00:00", "q", {CNN_128: 3.1e6}))
    tier = load_store(store).tiers[0]

    summary = tf32_row(summary_table(tier), "CNN train, batch 128")
    assert summary["gpuengine"] == "3.10 M/s" and summary["vs torch_graph_best"] == "—"
    assert summary["Run"].startswith("0002 qqqqqqq")
    beside = summary["next"]
    assert beside["Workload"] == "↳ newest beside torch_graph_best" and beside["Run"].startswith("0001 nnnnnnn")
    assert beside["vs torch_graph_best"] == "1.70× (1.68–1.72), torch_compile_graph in 3 of 3 rounds"

    table = workload_table("test_cnn_train", timed_workloads(tier)["test_cnn_train"], tier)
    assert "vs torch_graph_best" in table.columns   # only the older run holds it
    assert [r[0].text for r in table.rows] == ["tf32-graph8-resident-b128", "↳ newest beside torch_graph_best"]

    write_run(store, "Linux-CPython-3.12-64bit/0003_r.json", nightly | {"datetime": "2026-11-28T07:00:00+00:00"})
    tier = load_store(store).tiers[0]
    summary = tf32_row(summary_table(tier), "CNN train, batch 128")
    assert summary["vs torch_graph_best"].startswith("1.70×")
    assert summary["next"].get("Workload") != "↳ newest beside torch_graph_best"   # the newest has it: one row
