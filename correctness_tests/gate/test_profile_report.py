"""The report's kernel profiles: each case's newest profile under baselines_store/<gpu>/profiles/ as a table of
families by side, a malformed file skipped with its reason, and a tier without one saying so (not an error)."""
from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from gpuengine.bench.json_files import write_json
from gpuengine.bench.profile.record import ENGINE, FAILED, UNAVAILABLE, ProfileCase, make_record
from gpuengine.gate.report import build_report, load_store
from gpuengine.gate.report.sections import profile_tables

from ..bench.test_profile_cli import side
from .test_report import NEEDS_MATPLOTLIB, STORE, parse_page, row

H100 = "nvidia-h100-80gb-hbm3"
CPU_RUN = sorted((STORE / "cpu-tier").rglob("[0-9][0-9][0-9][0-9]_*.json"))[-1]


def profile(case: ProfileCase, runners: dict, day: int) -> dict:
    return make_record(case, runners, {"gpu": "NVIDIA H100 80GB HBM3"}, "0123456789abcdef", False, 5, "stored plans",
                       ["python", "-m", "gpuengine", "profile"], datetime(2026, 11, day, 12, tzinfo=timezone.utc))


@pytest.fixture
def store(tmp_path) -> Path:
    """An H100 tier holding profiles only (an older one of the same case, two cases, a broken file); a CPU tier
    holding one committed run and no profile."""
    root = tmp_path / "store"
    profiles = root / H100 / "profiles"
    tf32, bf16 = ProfileCase("resnet", "tf32", 128, 1), ProfileCase("resnet", "bf16", 128, 1)
    write_json(profiles / "resnet-tf32-b128-graph1.before-the-fix.json",
               profile(tf32, {ENGINE: side(900.0, 40.0, 1000.0), "torch_graph": side(650.0, 80.0, 760.0)}, 20))
    write_json(profiles / f"{tf32.slug}.json",
               profile(tf32, {ENGINE: side(600.0, 40.0, 700.0), "torch_graph": side(650.0, 80.0, 760.0)}, 24))
    write_json(profiles / f"{bf16.slug}.json",
               profile(bf16, {ENGINE: side(300.0, 20.0, 340.0), "torch_graph": side(350.0, 40.0, 400.0),
                              "torch_compile_graph": {UNAVAILABLE: "RuntimeError: compile failed", FAILED: True}}, 23))
    broken = profile(tf32, {ENGINE: side(1.0, 1.0, 3.0)}, 22)
    broken["runners"][ENGINE]["gaps_us"] = None
    write_json(profiles / "broken.json", broken)
    machine = CPU_RUN.relative_to(STORE)
    (root / machine).parent.mkdir(parents=True)
    shutil.copy(CPU_RUN, root / machine)
    return root


def test_each_case_shows_its_newest_profile_as_families_by_runner(store):
    loaded = load_store(store)
    (tier,) = [t for t in loaded.tiers if t.name == H100]
    assert len(tier.profiles) == 3 and tier.on_gpu and tier.gpu == "NVIDIA H100 80GB HBM3"
    assert tier.runs == [] and [n for n in loaded.skipped if f"{H100}/" in n and "broken.json" not in n] == []
    assert any(n.startswith(f"{H100}/profiles/broken.json: runners.gpuengine.gaps_us must be a number, got None")
               for n in loaded.skipped)
    bf16, tf32 = profile_tables(tier)   # by workload, then precision
    assert tf32.title == "Kernel profile: resnet (tf32, batch 128, cuda_graph 1), µs per training step"
    assert tf32.columns == ["Family", ENGINE, "torch_graph"]
    cells = {r[0].text: [c.text for c in r[1:]] for r in tf32.rows}
    assert cells == {"GEMM": ["600.0", "650.0"], "data (gather/copy)": ["40.0", "80.0"],
                     "kernels (sum)": ["640.0", "730.0"], "gaps (device idle)": ["60.0", "30.0"],
                     "step (device span)": ["700.0", "760.0"], "launches per step": ["3", "3"]}
    assert "resnet-tf32-b128-graph1.json (0123456, 2026-11-24 12:00, NVIDIA H100 80GB HBM3)" in tf32.caption
    assert bf16.columns == ["Family", ENGINE, "torch_graph", "torch_compile_graph"]
    assert [c.text for c in bf16.rows[0]] == ["GEMM", "300.0", "350.0", "—"]
    assert bf16.caption.endswith("torch_compile_graph not profiled: RuntimeError: compile failed.")


def test_the_page_shows_the_profiles_and_says_where_there_are_none(store, tmp_path):
    pytest.importorskip("matplotlib", reason=NEEDS_MATPLOTLIB)
    page = parse_page(build_report(load_store(store), tmp_path / "report").index)
    table = page.tables["Kernel profile: resnet (tf32, batch 128, cuda_graph 1), µs per training step"]
    assert row(table, "step (device span)") == {"Family": "step (device span)", ENGINE: "700.0",
                                                "torch_graph": "760.0"}
    html = (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    h100, cpu = html.split('id="cpu-tier"')   # GPU tiers come first
    assert "Kernel profiles by op family" in h100 and "No kernel profile was recorded" not in h100
    assert "Kernel profiles by op family" in cpu and "No kernel profile was recorded on this tier" in cpu
