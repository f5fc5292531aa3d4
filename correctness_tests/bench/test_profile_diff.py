"""Two kernel profiles compared (gpuengine/bench/profile/diff.py), `profile-diff`, and `profile --against`'s plumbing.

The profiles are fragments of stored H100 ones (the engine's side of
baselines_store/nvidia-h100-80gb-hbm3/profiles/, copied under profiles/ here
so a newer profile of the same case does not move these tests), and a head
made from one by planting a slowdown. `--against` runs each side's profile
command in a process of its own; here a stand-in writes the profile that
process would have, so everything but the GPU is exercised.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import gpuengine.runtime.backend as backend
from gpuengine.__main__ import main as cli_main
from gpuengine.bench import machine_info
from gpuengine.bench.injected_delay import DELAY_ENV, GUARD_ENV
from gpuengine.bench.json_files import write_json
from gpuengine.bench.machine_info import Tier
from gpuengine.bench.profile import against
from gpuengine.bench.profile import cli as profile_cli
from gpuengine.bench.profile.diff import diff_profiles, format_diff, load_profile
from gpuengine.bench.profile.record import ProfileCase, profile_path, read_profile
from gpuengine.gate.ab import checkout

from ..command_line import refused

PROFILES = Path(__file__).parent / "profiles"
MLP = PROFILES / "mlp-tf32-b8000-graph1.json"
H100 = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")
MLP_CASE = ProfileCase("mlp", "tf32", 8000, 1)


def planted(record: dict, spin_us: float = 50.0, gather_us: float = 10.0) -> dict:
    """`record` with a slower head: a new kernel of `spin_us` per step (the injected delay's), the gather
    `gather_us` slower, Adam gone; the totals and families kept consistent."""
    head = copy.deepcopy(record)
    side = head["runners"]["gpuengine"]
    kernels = [dict(k, us=round(k["us"] + gather_us, 3)) if k["name"] == "gather" else k
               for k in side["kernels"] if k["name"] != "adam"]
    kernels.append({"name": "spin", "family": "other", "us": spin_us, "count": 1.0})
    families: dict[str, float] = {}
    for k in kernels:
        families[k["family"]] = round(families.get(k["family"], 0.0) + k["us"], 3)
    kernel_us = round(sum(k["us"] for k in kernels), 3)
    side.update(kernels=kernels, families=families, kernel_us=kernel_us, step_us=round(kernel_us + side["gaps_us"], 3),
                timed_step_us=round(kernel_us + 5.0, 3))
    side_base = record["runners"]["gpuengine"]
    side_base.setdefault("timed_step_us", round(side_base["kernel_us"] + 5.0, 3))
    head["commit"] = "fedcba9876543210"
    return head


@pytest.fixture
def pair(tmp_path):
    """(base path, head path): the stored MLP profile and the same with a planted slowdown."""
    base = json.loads(MLP.read_text())
    head = planted(base)
    write_json(tmp_path / "base.json", base)
    write_json(tmp_path / "head.json", head)
    return tmp_path / "base.json", tmp_path / "head.json"


def test_the_diff_names_the_planted_kernel_first_and_its_totals_add_up(pair):
    diff = diff_profiles(*(load_profile(p) for p in pair))
    first, second, third = diff.top(3)
    assert (first.name, first.base_us, first.head_us, first.describe_change()) == ("spin", None, 50.0,
                                                                                  "+50.0 µs (new)")
    assert (second.name, second.describe_change()) == ("adam", "-15.3 µs (gone)")
    assert (third.name, round(third.change_us, 3), round(third.relative, 3)) == ("gather", 10.0, 0.373)
    totals = {t.name: t for t in diff.totals}
    kernels_change = totals["kernels (sum)"].change_us
    assert kernels_change == pytest.approx(50.0 + 10.0 - 15.312, abs=0.01)
    assert sum(f.change_us for f in diff.families) == pytest.approx(kernels_change, abs=0.01)
    assert totals["step timed, no profiler"].change_us == pytest.approx(kernels_change, abs=0.01)
    assert totals["launches per step"].describe_change() == "+0.0 launches (+0.0%)"   # adam gone, spin new
    assert [f.family for f in diff.families][:2] == ["other", "optimizer"] and diff.notes == []
    text = format_diff(diff, top=3)
    assert "gpuengine: base 2b8c5b2+dirty" in text and "head fedcba9+dirty" in text
    assert "mlp (tf32, batch 8000, cuda_graph 1) on NVIDIA H100 80GB HBM3: µs per training step" in text
    spin = next(line for line in text.splitlines() if line.lstrip().startswith("spin"))
    assert spin.split()[1:] == ["—", "50.0", "+50.0", "µs", "(new)", "[other]"]
    assert "kernels whose time moved most (3 of 10), largest change first:" in text


def test_two_real_profiles_of_different_cases_are_compared_with_a_note():
    tf32, bf16 = load_profile(PROFILES / "resnet-tf32-b128-graph1.json"), load_profile(PROFILES /
                                                                                      "resnet-bf16-b128-graph1.json")
    diff = diff_profiles(tf32, bf16)
    assert diff.notes == [f"only {tf32.path} has the step timed without the profiler (older profiles lack it)",
                          "different cases: resnet (tf32, batch 128, cuda_graph 1) and resnet (bf16, batch 128, "
                          "cuda_graph 1)"]
    changes = [abs(k.change_us) for k in diff.kernels]
    assert changes == sorted(changes, reverse=True) and len(diff.kernels) == 92
    assert diff.families[0].name == "GEMM" and diff.families[0].describe_change() == "-655.2 µs (-86.0%)"
    assert sum(f.change_us for f in diff.families) == pytest.approx(diff.totals[1].change_us, abs=0.05)


def test_profile_diff_prints_and_refuses_a_file_that_is_no_profile_naming_it(pair, capsys, tmp_path):
    assert cli_main(["profile-diff", *map(str, pair), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "kernels whose time moved most (2 of 10)" in out and "spin" in out
    assert refused(capsys, "profile-diff", str(pair[0]), str(tmp_path / "none.json")) == \
        f"{tmp_path / 'none.json'}: no such file"
    assert refused(capsys, "profile-diff", str(pair[0]), str(pair[1]), "--runner", "torch_graph") == \
        f"{pair[0]}: no runner 'torch_graph' (it has gpuengine)"
    unprofiled = json.loads(pair[1].read_text())
    unprofiled["runners"]["gpuengine"] = {"unavailable": "out of memory", "failed": True}
    write_json(pair[1], unprofiled)
    assert refused(capsys, "profile-diff", *map(str, pair)) == f"{pair[1]}: gpuengine was not profiled: out of memory"


def test_against_on_a_machine_without_a_gpu_says_why_before_checking_anything_out(capsys, monkeypatch):
    pytest.importorskip("torch", reason="the profile command needs torch")
    monkeypatch.setattr(backend, "gpu_visible", lambda: False)
    monkeypatch.setattr(checkout, "for_command", lambda *a: pytest.fail("a base was checked out"))
    assert refused(capsys, "profile", "mlp", "--against", "HEAD~1").startswith(
        "no CUDA GPU to profile: no CUDA GPU is visible here (CuPy missing, or no device)")
    assert refused(capsys, "profile", "mlp", "--against", "HEAD", "--references", "torch_graph") == (
        "argument --references: --against profiles the engine alone (base and head); torch_graph goes without it")


def fake_side(store_of: dict, heads: dict):
    """A stand-in for one side's profile process: writes the profile it would have (the stored MLP one at the base,
    the planted one at the head) where its --store says, and keeps what it was given."""
    def run(command, cwd, env, log, timeout_s):
        side = "head" if "head" in str(log) else "base"
        store = Path(command[command.index("--store") + 1])
        store_of[side] = {"cwd": cwd, "env": env, "store": store, "command": command}
        record = json.loads(MLP.read_text())
        write_json(profile_path(store, H100.name, MLP_CASE), heads.get(side, record))
        log.write_text(f"{side} profiled\n")
        return 0
    return run


def test_each_side_runs_its_own_checkout_from_the_same_plans_and_the_delay_reaches_the_head_alone(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv(DELAY_ENV, "40")
    monkeypatch.setenv(GUARD_ENV, str(tmp_path))
    monkeypatch.setenv("GATE_COMMIT_ID", "headcommit")
    plans = tmp_path / "plans.json"
    plans.write_text('{"plans": {}}')
    seen: dict = {}
    run = fake_side(seen, {"head": planted(json.loads(MLP.read_text()))})
    base = against.Checkout(tmp_path / "base", "0123456789abcdef", "base 0123456")
    diff = against.profile_base_and_head(MLP_CASE, base, against.head_checkout(tmp_path / "head"), 3, H100.name,
                                         plans, tmp_path / "scratch", log=lambda line: None, run=run)
    assert diff.top(1)[0].name == "spin"
    assert seen["base"]["cwd"] == tmp_path / "base" and seen["head"]["cwd"] == tmp_path / "head"
    assert seen["base"]["env"]["PYTHONPATH"].split(":")[0] == str(tmp_path / "base")
    assert seen["base"]["env"]["GATE_COMMIT_ID"] == "0123456789abcdef" and DELAY_ENV not in seen["base"]["env"]
    assert seen["head"]["env"]["GATE_COMMIT_ID"] == "headcommit" and seen["head"]["env"][DELAY_ENV] == "40"
    assert seen["base"]["command"][2:] == ["gpuengine", "profile", "mlp", "--precision", "tf32", "--batch", "8000",
                                           "--cuda-graph", "1", "--replays", "3", "--references", "--store",
                                           str(tmp_path / "scratch" / "base")]
    for side in ("base", "head"):
        assert (seen[side]["store"] / H100.name / "cudnn_plans.json").read_text() == plans.read_text()

    def broken(command, cwd, env, log, timeout_s):
        log.write_text("Traceback ...\nImportError: no module named gpuengine.bench.profile\n")
        return 1
    with pytest.raises(against.SideFailed, match=r"the base's profile \(base 0123456, .*\) exited with status 1; "
                                                 r"the end of .*base.log:\nTraceback ...\nImportError"):
        against.profile_side("base", base, MLP_CASE, 3, H100.name, None, tmp_path / "scratch", broken)


def test_profile_against_a_checkout_folder_prints_the_diff(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch", reason="the profile command needs torch")
    folder = tmp_path / "base"
    for package in ("gpuengine", "perf_tests"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text("")
    (folder / "COMMIT").write_text("0123456789abcdef\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profile_cli, "no_cuda_reason", lambda: None)
    monkeypatch.setattr(profile_cli, "offered_references", lambda: ("torch_graph",))
    monkeypatch.setattr(machine_info, "current_tier", lambda on_gpu: H100)
    seen: dict = {}
    monkeypatch.setattr(against, "run_logged", fake_side(seen, {"head": planted(json.loads(MLP.read_text()))}))
    assert cli_main(["profile", "mlp", "--precision", "tf32", "--against", "base"]) == 0   # relative to here
    out = capsys.readouterr().out
    assert "gpuengine: base 2b8c5b2+dirty" in out and "  spin" in out and "+50.0 µs (new)" in out
    assert seen["base"]["cwd"] == folder and seen["base"]["env"]["GATE_COMMIT_ID"] == "0123456789abcdef"
    assert seen["base"]["store"] == tmp_path / "build/profile-against/base"   # absolute: the side works elsewhere
    assert f"python -m gpuengine profile-diff {tmp_path}/build/profile-against/base/nvidia-h100-80gb-hbm3/" in out
    assert read_profile(json.loads((tmp_path / "build/profile-against/head/nvidia-h100-80gb-hbm3/profiles/"
                                    "mlp-tf32-b8000-graph1.json").read_text()), "head").commit == "fedcba9876543210"
    assert refused(capsys, "profile", "mlp", "--against", str(tmp_path / "nowhere")).startswith(
        f"argument --against: --against {tmp_path / 'nowhere'}: ")
