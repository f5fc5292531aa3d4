"""`python -m gpuengine maxbatch`: every argument is checked before the first trial process starts.

Each trial is a fresh process: before these checks an unknown workload, fp64,
a bad --shape, or no --device cpu on a machine without a GPU started one
process per engine and mode, each failing the same way; --start 0 and
--precision-target 0 were tracebacks, --timeout -1 was taken, and a --json
that could not be written failed after the whole search. A stub trial fails
the test if a process would start; the searches are stubbed where a test needs
the command to finish.
"""
from __future__ import annotations

import json

import pytest

import gpuengine.runtime.backend as backend
from gpuengine.__main__ import main as cli_main
from gpuengine.bench.maxbatch import cli as maxbatch_cli
from gpuengine.bench.maxbatch import search
from gpuengine.bench.maxbatch.search import MaxBatchRow, SearchResult, Status, TrialResult

from ..command_line import refused

CPU = ["--device", "cpu", "--shape", "smoke"]


@pytest.fixture
def no_trial(monkeypatch):
    def refuse(self, batch):
        raise AssertionError("a trial process started before the arguments were checked")
    monkeypatch.setattr(search.SubprocessTrial, "__call__", refuse)


@pytest.mark.parametrize("option,value,allowed", [
    ("--start", "0", "a whole number >= 1"), ("--start", "-8", "a whole number >= 1"),
    ("--limit", "0", "a whole number >= 1"),
    ("--precision-target", "0", "a number > 0 and < 1"), ("--precision-target", "1", "a number > 0 and < 1"),
    ("--timeout", "-1", "a number > 0"), ("--timeout", "0", "a number > 0"), ("--timeout", "nan", "a number > 0"),
    ("--batch-pool", "3", "a whole number from 1 to 2"),
    ("--cap-gib", "0", "a positive number of GiB, or 'full'"), ("--cap-gib", "inf", "a positive number of GiB, "
                                                                                      "or 'full'"),
    ("--cap-gib", "six", "a positive number of GiB, or 'full'")])
def test_a_bad_number_names_the_option_the_value_and_the_range(capsys, no_trial, option, value, allowed):
    assert refused(capsys, "maxbatch", "mlp", *CPU, option, value) == f"argument {option}: '{value}' is not accepted; use {allowed}"


@pytest.mark.parametrize("argv,message", [
    (["nope", *CPU], "argument workload: 'nope' is not accepted; max-batch trials know mlp"),
    (["mlp", *CPU, "--precision", "fp64"],
     "argument --precision: invalid choice: 'fp64' (choose from 'fp32', 'tf32', 'bf16')"),
    (["mlp", "--device", "cpu", "--shape", "huge"], "argument --shape: 'huge' is not accepted; use one of seed, smoke"),
    (["mlp", *CPU, "--engines", "gpuengine", "torch_graph"],
     "argument --engines: torch_graph captures a torch.cuda.CUDAGraph and needs --device cuda; with --device cpu use "
     "gpuengine, torch_eager, torch_compile")])
def test_what_every_trial_would_fail_on_is_refused_once(capsys, no_trial, argv, message):
    assert refused(capsys, "maxbatch", *argv) == message


def test_no_gpu_without_device_cpu_says_how_to_run_it(capsys, no_trial, monkeypatch):
    monkeypatch.setattr(backend, "gpu_visible", lambda: False)
    message = refused(capsys, "maxbatch", "mlp", "--shape", "smoke")
    assert message.startswith("argument --device: cuda (the default) needs a GPU, and no CUDA GPU is visible here")
    assert "--device cpu runs the search on the NumPy backend" in message


def test_a_json_path_that_cannot_be_written_is_refused_before_the_search(capsys, no_trial, tmp_path):
    missing = tmp_path / "no" / "out.json"
    assert refused(capsys, "maxbatch", "mlp", *CPU, "--json", str(missing)) == (
        f"argument --json: '{missing}' cannot be written: its folder {missing.parent} does not exist")
    assert refused(capsys, "maxbatch", "mlp", *CPU, "--json", str(tmp_path)) == (
        f"argument --json: '{tmp_path}' is a folder; give the path of a file")
    (tmp_path / "file").write_text("")
    assert refused(capsys, "maxbatch", "mlp", *CPU, "--json", str(tmp_path / "file" / "out.json")) == (
        f"argument --json: '{tmp_path}/file/out.json' cannot be written: {tmp_path}/file is not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_bad_toggle_is_refused_before_the_trials_inherit_it(capsys, no_trial, monkeypatch):
    monkeypatch.setenv("GPUENGINE_CUDA_GRAPH", "99999999999999999999")
    assert refused(capsys, "maxbatch", "mlp", *CPU) == ("GPUENGINE_CUDA_GRAPH='99999999999999999999' is not accepted; "
                                            "use a whole number from 0 to 1024")


@pytest.fixture
def searched(monkeypatch):
    """compare_max_batches replaced: records what it was asked, answers one row per mode."""
    asked = {}

    def compare(base, engines, batch_pools, modes, **options):
        asked.update(engines=list(engines), batch_pools=list(batch_pools), modes=list(modes), **options)
        found = SearchResult(64, None, [TrialResult(64, Status.FITS, seconds=0.1)])
        return [MaxBatchRow(base.workload, mode, base.precision, "gpuengine", found, None, None) for mode in modes]
    monkeypatch.setattr(search, "compare_max_batches", compare)
    return asked


def test_without_a_gpu_the_default_engines_leave_torch_graph_out(searched):
    assert cli_main(["maxbatch", "mlp", *CPU, "--quiet"]) == 0
    assert searched["engines"] == ["gpuengine", "torch_eager", "torch_compile"]


def test_good_arguments_reach_the_search(searched):
    assert cli_main(["maxbatch", "mlp", *CPU, "--quiet", "--start", "1", "--limit", "1", "--precision-target",
                     "0.5", "--timeout", "0.5", "--batch-pool", "1", "2"]) == 0
    assert (searched["start"], searched["limit"], searched["precision"], searched["timeout_s"]) == (1, 1, 0.5, 0.5)
    assert searched["batch_pools"] == [1, 2]


def test_the_json_is_written_aside_and_renamed(searched, tmp_path):
    out = tmp_path / "maxbatch.json"
    assert cli_main(["maxbatch", "mlp", *CPU, "--quiet", "--modes", "infer", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())
    assert record["mode"] == "infer" and record["engine_search"]["max_batch"] == 64
    assert [p.name for p in tmp_path.iterdir()] == ["maxbatch.json"]   # no temporary file left


def test_a_json_write_that_fails_at_the_end_is_one_line(searched, tmp_path, monkeypatch, capsys):
    def fail(path, content):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(maxbatch_cli, "write_json", fail)
    assert cli_main(["maxbatch", "mlp", *CPU, "--quiet", "--json", str(tmp_path / "m.json")]) == 1
    err = capsys.readouterr().err
    assert err == (f"python -m gpuengine maxbatch: error: --json {tmp_path}/m.json: not written ([Errno 28] No space "
                   "left on device)\n")


def test_a_name_given_twice_is_searched_once(searched):
    assert cli_main(["maxbatch", "mlp", *CPU, "--quiet", "--engines", "gpuengine", "torch_eager", "gpuengine",
                     "--batch-pool", "2", "1", "2", "--modes", "infer", "infer"]) == 0
    assert searched["engines"] == ["gpuengine", "torch_eager"] and searched["batch_pools"] == [2, 1]
    assert searched["modes"] == ["infer"]
