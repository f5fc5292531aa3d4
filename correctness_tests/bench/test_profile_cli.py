"""`python -m gpuengine profile`: every bad argument is one usage error naming it (status 2) before anything is
built, a machine without a CUDA GPU is told why, and a profile (measured here by a stub) is printed as the
family table and written whole to baselines_store/<gpu>/profiles/, or not at all."""
from __future__ import annotations

import json
import os

import pytest

import gpuengine.runtime.backend as backend
from gpuengine.__main__ import main as cli_main
from gpuengine.bench.json_files import write_json
from gpuengine.bench.machine_info import Tier
from gpuengine.bench.profile import cli as profile_cli
from gpuengine.bench.profile import capture, session, workloads
from gpuengine.bench.profile.record import (ENGINE, FAILED, UNAVAILABLE, ProfileCase, format_text_table,
                                            make_record, read_profile, write_profile)

from ..command_line import refused

pytest.importorskip("torch", reason="the profile command needs torch")

H100 = Tier("nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3")


def side(gemm: float, data: float, step: float, other: float = 0.0) -> dict:
    kernels = [{"name": "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "family": "gemm", "us": gemm, "count": 2.0},
               {"name": "gather", "family": "data", "us": data, "count": 1.0}]
    if other:
        kernels.append({"name": "mystery_kernel", "family": "other", "us": other, "count": 1.0})
    families = {"gemm": gemm, "data": data, **({"other": other} if other else {})}
    total = gemm + data + other
    return {"step_us": step, "kernel_us": total, "gaps_us": round(step - total, 3), "replay_step_us": [step],
            "families": families, "kernels": kernels}


@pytest.fixture
def no_build(monkeypatch):
    """Fails the test if the command got as far as building a runner."""
    def refuse(*args, **kwargs):
        raise AssertionError("a runner was built before the arguments were checked")
    monkeypatch.setattr(workloads.ProfileWorkload, "engine_runner", refuse)


@pytest.mark.parametrize("argv,message", [
    (["nope"], "argument workload: 'nope' is not accepted; use one of mlp, cnn, resnet, transformer, zoo:NAME (NAME "
               "one of alexnet, resnet18, resnet50, vgg16, mobilenet_v2)"),
    (["zoo"], "argument workload: 'zoo' is not accepted: the zoo takes a network name and 'zoo' gives no network "
              "name; use zoo:NAME, NAME one of alexnet, resnet18, resnet50, vgg16, mobilenet_v2"),
    (["zoo:lenet"], "argument workload: 'zoo:lenet' is not accepted: the zoo takes a network name and 'zoo:lenet' "
                    "gives no network 'lenet'; use zoo:NAME, NAME one of alexnet, resnet18, resnet50, vgg16, "
                    "mobilenet_v2"),
    (["mlp:wide"], "argument workload: 'mlp:wide' is not accepted; use one of mlp, cnn, resnet, transformer, "
                   "zoo:NAME (NAME one of alexnet, resnet18, resnet50, vgg16, mobilenet_v2)"),
    (["mlp", "--batch", "0"], "argument --batch: '0' is not accepted; use a whole number >= 1"),
    (["mlp", "--batch", "8k"], "argument --batch: '8k' is not accepted; use a whole number >= 1"),
    (["mlp", "--cuda-graph", "2000"], "argument --cuda-graph: '2000' is not accepted; use a whole number from 0 to "
                                      "1024"),
    (["mlp", "--replays", "0"], "argument --replays: '0' is not accepted; use a whole number from 1 to 50"),
    (["mlp", "--precision", "fp64"], "argument --precision: invalid choice: 'fp64' (choose from 'fp32', 'tf32', "
                                     "'bf16')"),
    (["mlp", "--references", "torch_eager"], "argument --references: invalid choice: 'torch_eager' (choose from "
                                             "'torch_graph', 'torch_compile_graph')"),
    (["mlp", "--toggle", "batchnorm=fast"], "argument --toggle: batchnorm='fast' is not accepted; use one of cudnn, "
                                            "engine, auto"),
    (["mlp", "--toggle", "batchnorm"], "argument --toggle: 'batchnorm' is not TOGGLE=VALUE (e.g. deterministic=0)"),
    (["mlp", "--toggle", "precision=bf16"], "argument --toggle: precision is set per case here (--precision, "
                                            "--cuda-graph); give another toggle"),
    (["mlp", "--toggle", "batchnorm=engine", "--toggle", "batchnorm=cudnn"],
     "argument --toggle: a toggle is given twice in batchnorm=engine batchnorm=cudnn"),
    (["mlp", "--length", "384"], "argument --length: 'mlp' has no sequence length to set; transformer has"),
    (["zoo:alexnet", "--length", "384"], "argument --length: 'zoo:alexnet' has no sequence length to set; "
                                         "transformer has"),
    (["transformer", "--length", "0"], "argument --length: '0' is not accepted; use a whole number >= 1"),
])
def test_a_bad_argument_is_one_usage_error_naming_it(capsys, no_build, argv, message):
    assert refused(capsys, "profile", *argv) == message


def test_a_reference_this_checkout_lacks_is_refused_naming_what_it_offers(capsys, no_build, monkeypatch):
    monkeypatch.setattr(profile_cli, "offered_references", lambda: ("torch_graph",))
    assert refused(capsys, "profile", "mlp", "--references", "torch_graph", "torch_compile_graph") == (
        "argument --references: torch_compile_graph is not offered by this checkout's "
        "gpuengine/reference/torch_common.py (its MODES); use torch_graph")


def test_a_bad_toggle_variable_is_refused_naming_it(capsys, no_build, monkeypatch):
    monkeypatch.setenv("GPUENGINE_CUDA_GRAPH", "eight")
    assert refused(capsys, "profile", "mlp") == ("GPUENGINE_CUDA_GRAPH='eight' is not accepted; use a whole number "
                                                 "from 0 to 1024")


def test_without_a_gpu_the_command_says_why_and_stops(capsys, no_build, monkeypatch):
    monkeypatch.setattr(backend, "gpu_visible", lambda: False)
    assert refused(capsys, "profile", "resnet", "--precision", "bf16") == (
        "no CUDA GPU to profile: no CUDA GPU is visible here (CuPy missing, or no device). python -m gpuengine "
        "profile times kernels on the device with CUPTI; the CPU tier's NumPy backend launches none")


def test_a_gpu_that_torch_cannot_see_is_named(capsys, no_build, monkeypatch):
    import torch
    monkeypatch.setattr(backend, "gpu_visible", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refused(capsys, "profile", "mlp")
    assert message.startswith(f"no CUDA GPU to profile: torch {torch.__version__} sees no CUDA device")


@pytest.fixture
def on_a_gpu(monkeypatch, tmp_path):
    """The command past its checks as on an H100, with the session's measurements stubbed."""
    monkeypatch.setattr(profile_cli, "no_cuda_reason", lambda: None)
    monkeypatch.setattr(profile_cli, "offered_references", lambda: ("torch_graph", "torch_compile_graph"))
    import gpuengine.bench.machine_info as machine_info
    monkeypatch.setattr(machine_info, "current_tier", lambda on_gpu: H100)
    monkeypatch.setattr(machine_info, "collect_machine_info", lambda tier, config: {"gpu": tier.gpu_name})
    monkeypatch.setattr(session, "reuse_cudnn_plans", lambda store, tier: "autotuned afresh (test)")
    asked = {}

    def measure(case, workload, references, replays, log, **kwargs):
        asked.update(case=case, workload=workload.name, references=references, replays=replays)
        runners = {ENGINE: side(600.0, 40.0, 700.0, other=5.0), "torch_graph": side(650.0, 80.0, 760.0)}
        runners.update({m: {UNAVAILABLE: "RuntimeError: compile failed", FAILED: True}
                      for m in references if m != "torch_graph"})
        return runners
    monkeypatch.setattr(session, "measure", measure)
    return tmp_path / "store", asked


def test_a_profile_is_printed_as_the_family_table_and_written(capsys, on_a_gpu):
    store, asked = on_a_gpu
    status = cli_main(["profile", "zoo:alexnet", "--precision", "bf16", "--replays", "3", "--references",
                       "torch_graph", "torch_graph", "--store", str(store)])
    assert status == 0
    assert asked == {"case": ProfileCase("zoo:alexnet", "bf16", 16, 1), "workload": "zoo:alexnet",
                     "references": ["torch_graph"], "replays": 3}
    path = store / H100.name / "profiles" / "zoo-alexnet-bf16-b16-graph1.json"
    record = json.loads(path.read_text())
    stored = read_profile(record, path)
    assert stored.workload == "zoo:alexnet" and stored.toggles == {"precision": "bf16", "batch": 16, "cuda_graph": 1}
    assert stored.runners[ENGINE]["families"] == {"gemm": 600.0, "data": 40.0, "other": 5.0}
    assert record["command"] == ["python", "-m", "gpuengine", "profile", "zoo:alexnet", "--precision", "bf16",
                                 "--batch", "16", "--cuda-graph", "1", "--replays", "3", "--references", "torch_graph"]
    assert record["steps_per_replay"] == 2 and record["cudnn_plans"] == "autotuned afresh (test)"
    out = capsys.readouterr().out.splitlines()
    rows = {line.split("  ")[0]: line.split() for line in out}
    assert out[1].split() == ["family", ENGINE, "torch_graph"]
    assert rows["GEMM"][-2:] == ["600.0", "650.0"] and rows["data (gather/copy)"][-2:] == ["40.0", "80.0"]
    assert rows["gaps (device idle)"][-2:] == ["55.0", "30.0"] and rows["step (device span)"][-2:] == ["700.0", "760.0"]
    assert f"{ENGINE}: in 'other' (no family rule knows them): mystery_kernel 5.0 µs" in out
    assert out[-1] == f"profile: written to {path}"


def test_a_toggled_engine_is_profiled_and_written_under_its_own_name(capsys, on_a_gpu):
    store, asked = on_a_gpu
    assert cli_main(["profile", "resnet", "--precision", "bf16", "--toggle", "batchnorm=engine", "--toggle",
                     "deterministic=0", "--references", "torch_graph", "--store", str(store)]) == 0
    assert asked["case"] == ProfileCase("resnet", "bf16", 128, 1, (("batchnorm", "engine"), ("deterministic", False)))
    path = store / H100.name / "profiles" / "resnet-bf16-b128-graph1-batchnorm-engine-deterministic-0.json"
    record = json.loads(path.read_text())
    assert record["toggles"] == {"precision": "bf16", "batch": 128, "cuda_graph": 1, "batchnorm": "engine",
                                 "deterministic": False}
    assert record["command"][-6:] == ["--toggle", "batchnorm=engine", "--toggle", "deterministic=0", "--references",
                                      "torch_graph"]
    title = capsys.readouterr().out.splitlines()[0]
    assert title.startswith("resnet (bf16, batch 128, cuda_graph 1, batchnorm engine, deterministic False) on ")
    assert read_profile(record, path).title == "resnet (bf16, batch 128, cuda_graph 1, batchnorm engine, " \
                                               "deterministic False)"


def test_a_transformer_at_another_length_is_profiled_and_written_under_its_own_name(capsys, on_a_gpu, monkeypatch):
    store, asked = on_a_gpu
    built = {}
    monkeypatch.setattr(session, "measure", lambda case, workload, *a, **k: built.update(
        case=case, shape=workload.arrays(4, True)[0].shape) or {ENGINE: side(600.0, 40.0, 700.0)})
    assert cli_main(["profile", "transformer", "--length", "384", "--precision", "bf16", "--references",
                     "--store", str(store)]) == 0
    assert built["case"] == ProfileCase("transformer", "bf16", 16, 1, length=384)
    assert built["shape"] == (4, 2 * 384)   # [source | shifted target] of 384 positions each
    path = store / H100.name / "profiles" / "transformer-seq384-bf16-b16-graph1.json"
    record = json.loads(path.read_text())
    assert record["toggles"] == {"precision": "bf16", "batch": 16, "cuda_graph": 1, "length": 384}
    assert record["command"][4:7] == ["transformer", "--length", "384"]
    assert capsys.readouterr().out.splitlines()[0].startswith("transformer (bf16, batch 16, cuda_graph 1, length 384)")


def test_a_toggle_goes_without_against(capsys, no_build):
    assert refused(capsys, "profile", "mlp", "--toggle", "batchnorm=engine", "--against", "HEAD") == (
        "argument --toggle: --against profiles base and head with their default toggles (./gate toggle-cost "
        "compares a toggle)")


def test_a_profile_on_a_copy_of_the_tree_names_the_commit_the_gate_was_told(capsys, on_a_gpu, monkeypatch):
    """A lent GPU's copy has no .git, or a stale one: GATE_COMMIT_ID names the commit, as in the suite's runs."""
    store, _ = on_a_gpu
    monkeypatch.setenv("GATE_COMMIT_ID", "0123456789abcdef")
    monkeypatch.setenv("GATE_COMMIT_DIRTY", "1")
    assert cli_main(["profile", "mlp", "--references", "torch_graph", "--store", str(store)]) == 0
    (path,) = (store / H100.name / "profiles").glob("mlp-*.json")
    record = json.loads(path.read_text())
    assert (record["commit"], record["dirty"]) == ("0123456789abcdef", True)


def test_a_failed_reference_is_written_as_such_and_the_status_says_so(capsys, on_a_gpu):
    store, _ = on_a_gpu
    assert cli_main(["profile", "mlp", "--store", str(store)]) == 1
    (path,) = (store / H100.name / "profiles").glob("*.json")
    assert path.name == "mlp-tf32-b8000-graph1.json"
    record = json.loads(path.read_text())
    assert record["runners"]["torch_compile_graph"] == {UNAVAILABLE: "RuntimeError: compile failed", FAILED: True}
    captured = capsys.readouterr()
    assert "torch_compile_graph: not profiled: RuntimeError: compile failed" in captured.out
    assert "torch_compile_graph failed" in captured.err


def test_a_profile_the_profiler_could_not_see_writes_nothing(capsys, on_a_gpu, monkeypatch):
    store, _ = on_a_gpu

    def blind(*args, **kwargs):
        raise capture.ProfileError("2 of 5 replays recorded no kernel")
    monkeypatch.setattr(session, "measure", blind)
    assert cli_main(["profile", "cnn", "--store", str(store)]) == 1
    assert "2 of 5 replays recorded no kernel; nothing written" in capsys.readouterr().err
    assert not store.exists()


def test_a_profile_that_cannot_be_written_leaves_the_old_one_whole(capsys, on_a_gpu, monkeypatch):
    store, _ = on_a_gpu
    path = store / H100.name / "profiles" / "cnn-tf32-b128-graph1.json"
    write_json(path, {"the": "previous profile"})

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", full_disk)
    assert cli_main(["profile", "cnn", "--store", str(store)]) == 1
    assert f"{path}: not written" in capsys.readouterr().err
    assert json.loads(path.read_text()) == {"the": "previous profile"}
    assert [p.name for p in path.parent.iterdir()] == [path.name]   # no temporary file left beside it


def test_the_record_reads_back_and_a_malformed_one_is_named():
    from datetime import datetime, timezone
    case = ProfileCase("resnet", "tf32", 128, 8)
    record = make_record(case, {ENGINE: side(1.0, 2.0, 4.0)}, {"gpu": "NVIDIA H100"}, "abc123", False, 5, "x",
                         ["python"], datetime(2026, 11, 24, tzinfo=timezone.utc))
    assert record["steps_per_replay"] == 8 and read_profile(record, "p.json").steps_per_replay == 8
    broken = json.loads(json.dumps(record))
    broken["runners"][ENGINE]["step_us"] = "fast"
    with pytest.raises(ValueError, match=r"p.json: runners.gpuengine.step_us must be a number, got 'fast'"):
        read_profile(broken, "p.json")
    with pytest.raises(ValueError, match=r"p.json: format 3; this code reads formats 1, 2"):
        read_profile({**record, "format": 3}, "p.json")
    legacy = {k: v for k, v in record.items() if k != "runners"} | {"format": 1, "sides": record["runners"]}
    assert read_profile(legacy, "p.json").runners == record["runners"]   # from before the runners were called so
    assert "step (device span)" in format_text_table(record)
    assert "step timed, no profiler" not in format_text_table(record)   # a profile from before that figure
    timed = json.loads(json.dumps(record))
    timed["runners"][ENGINE]["timed_step_us"] = 650.0
    assert read_profile(timed, "p.json").runners[ENGINE]["timed_step_us"] == 650.0
    rows = {line.split("  ")[0]: line.split() for line in format_text_table(timed).splitlines()}
    runners = len(record["runners"])
    assert rows["step timed, no profiler"][-runners:] == ["650.0", *["—"] * (runners - 1)]
    timed["runners"][ENGINE]["timed_step_us"] = -1
    with pytest.raises(ValueError, match=r"p.json: runners.gpuengine.timed_step_us must be"):
        read_profile(timed, "p.json")


def test_the_idle_before_each_family_is_read_back_and_printed_largest_first():
    from datetime import datetime, timezone
    case = ProfileCase("resnet", "bf16", 128, 1)
    record = make_record(case, {ENGINE: side(1.0, 2.0, 4.0)}, {"gpu": "NVIDIA H200"}, "abc123", False, 5, "x",
                         ["python"], datetime(2026, 11, 30, tzinfo=timezone.utc))
    assert "device idle before" not in format_text_table(record)   # a profile from before that figure
    record["runners"][ENGINE]["idle_before"] = {"gemm": 3.5, "norm": 320.0, "data": 41.2}
    assert read_profile(record, "p.json").runners[ENGINE]["idle_before"]["norm"] == 320.0
    assert (f"{ENGINE}: device idle before the launches of batch/layer norm 320.0, data (gather/copy) 41.2, "
            "GEMM 3.5 µs") in format_text_table(record).splitlines()
    record["runners"][ENGINE]["idle_before"] = {"norm": -1}
    with pytest.raises(ValueError, match=r"p.json: runners.gpuengine.idle_before.norm must be"):
        read_profile(record, "p.json")


def test_write_profile_is_whole_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "profiles" / "mlp.json"
    write_profile(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}

    def interrupted(src, dst):
        raise KeyboardInterrupt   # a Ctrl-C between writing the new file and renaming it over the old one
    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(path, {"b": 2})
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in path.parent.iterdir()] == ["mlp.json"]
