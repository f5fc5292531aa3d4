"""`./gate toggle-cost`: the toggle is checked as EngineConfig checks it, before anything runs,
and the table says how much faster the toggled engine ran and whether both still trained.

The timing itself needs a GPU (it runs in the GPU session's `steps` plan).
"""
from __future__ import annotations

import pytest

from gpuengine.gate.commands import main
from gpuengine.gate import toggle_cost
from gpuengine.bench.cli_args import UsageError


def test_a_toggle_is_parsed_to_the_value_the_engine_compares_against():
    assert toggle_cost.parse_toggle("deterministic=0") == ("deterministic", False)
    assert toggle_cost.parse_toggle("batch_pool=1") == ("batch_pool", 1)


@pytest.mark.parametrize("text, message", [
    ("deterministic", "is not TOGGLE=VALUE"),
    ("deterministic=maybe", "deterministic='maybe' is not accepted"),
    ("cuda_graph=4", "cuda_graph is set per case here"),
    ("speed=11", "unknown toggle 'speed'"),
])
def test_a_bad_toggle_is_refused_by_name(text, message):
    with pytest.raises(UsageError, match=message):
        toggle_cost.parse_toggle(text)


def test_the_table_gives_each_sides_time_the_speedup_and_whether_both_trained():
    record = {"case": "resnet bf16", "median_ms": {"default": 80.0, "deterministic=False": 76.0},
              "toggled_speedup": {"median": 1.0526, "low": 1.04, "high": 1.06}, "trains": True}
    line = toggle_cost.table([record]).splitlines()[-1]
    assert line.split() == ["resnet", "bf16", "80.000", "76.000", "1.053", "(1.040-1.060)", "yes"]


def test_without_a_gpu_nothing_is_timed(capsys, monkeypatch):
    monkeypatch.setattr("gpuengine.runtime.backend.gpu_visible", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        main(["toggle-cost", "deterministic=0", "resnet"])
    assert exit_.value.code == 2 and "no CUDA GPU is visible here" in capsys.readouterr().err


def test_a_length_for_a_workload_without_one_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["toggle-cost", "deterministic=0", "transformer", "resnet", "--length", "384"])
    assert exit_.value.code == 2 and "--length: 'resnet' has no sequence length to set" in capsys.readouterr().err


def test_an_unknown_workload_with_a_length_is_refused_as_a_workload(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["toggle-cost", "deterministic=0", "nosuch", "--length", "384"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument workloads: 'nosuch' is not accepted" in err
