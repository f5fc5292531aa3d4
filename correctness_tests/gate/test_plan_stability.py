"""`./gate plans`: fresh autotunings compared choice by choice, per case and kind.

The runs themselves need a GPU; here their records are written by hand, as `tune_once` writes them.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuengine.gate.commands import main
from gpuengine.gate import plan_stability
from gpuengine.ops.autotune import key_text

CUDNN = key_text(("conv_fprop", "tf32", None, ("x", "spec")))
GEMM = key_text(("gemm", "tf32", (512, 1000), (4000, 4), (1000, 1000), (4, 4000), (4000, 4), "float32", "float32", True))
WAY = key_text(("conv_forward_choice", "tf32", None, ("relu", False)))


def run_record(**cases) -> dict:
    return {"cases": {case: {"choices": choices, "setup_s": 12.5} for case, choices in cases.items()}}


def test_a_choice_key_says_what_it_chooses():
    assert plan_stability.kind_of(CUDNN) == "cudnn"
    assert plan_stability.kind_of(GEMM) == "gemm"
    assert plan_stability.kind_of(WAY) == "way"


def test_runs_are_compared_choice_by_choice_per_case_and_kind():
    first = run_record(**{"resnet tf32": {CUDNN: "eng0", GEMM: "algorithm_id=6", WAY: "direct"},
                          "resnet bf16": {CUDNN: "eng4"}})
    second = run_record(**{"resnet tf32": {CUDNN: "eng0", GEMM: "algorithm_id=21", WAY: "direct", "('new',)": "e"},
                           "resnet bf16": {CUDNN: "eng4"}})
    result = plan_stability.compare([first, second])
    tf32 = result["cases"]["resnet tf32"]
    assert tf32["by_kind"] == {"cudnn": {"choices": 1, "same": 1}, "gemm": {"choices": 1, "same": 0},
                               "way": {"choices": 1, "same": 1}}   # a key only one run made is not compared
    assert tf32["setup_s"] == [12.5, 12.5]
    assert result["total"] == {"choices": 4, "same": 3} and result["stability"] == 0.75
    text = plan_stability.table(result)
    assert "resnet tf32" in text and "all: 3 of 4 choices the same in every run (75.0%)" in text


def test_the_cudnn_set_up_cost_is_summed_over_a_cases_graphs():
    graphs = [SimpleNamespace(offered=dict.fromkeys(range(30)), plans=[0, 2, 3], timings={0: 1, 2: 1}, build_s=1.25, tune_s=0.5),
              SimpleNamespace(offered={0: "eng0"}, plans=[0], timings={}, build_s=0.5, tune_s=0.0)]
    assert plan_stability.cudnn_cost(graphs) == {"graphs": 2, "candidates": 31, "built": 4, "timed": 2,
                                                 "build_s": 1.8, "tune_s": 0.5}


def test_a_case_missing_from_a_run_counts_no_choice():
    result = plan_stability.compare([run_record(**{"cnn tf32": {CUDNN: "eng0"}}), run_record()])
    assert result["total"] == {"choices": 0, "same": 0} and result["stability"] is None
    assert "(n/a)" in plan_stability.table(result)


@pytest.mark.parametrize("argv, message", [
    (["plans", "zoo:lenet"], "argument workloads: 'zoo:lenet' is not accepted"),
    (["plans", "--runs", "1"], "argument --runs"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_without_a_gpu_nothing_is_autotuned(capsys, monkeypatch):
    monkeypatch.setattr("gpuengine.runtime.backend.gpu_visible", lambda: False)
    with pytest.raises(SystemExit):
        main(["plans", "resnet"])
    assert "no CUDA GPU is visible here" in capsys.readouterr().err


def test_the_rule_is_replayed_on_recorded_timings_at_other_margins():
    def run(first_ms):   # the heuristic's first way, then one 3% faster than 1.0 ms
        return {"cases": {"resnet tf32": {"timed": {CUDNN: [["eng0", first_ms, 0.0], ["eng7", 0.97, 0.0]]}}}}
    runs = [run(1.01), run(0.995)]   # eng0 4% / 2.5% slower than eng7
    tight, loose = plan_stability.replay(runs, 0.02), plan_stability.replay(runs, 0.05)
    assert tight["choices"] == 1 and tight["same"] == 1 and tight["slower_than_fastest"] == 0   # eng7 in both
    assert loose["same"] == 1 and loose["slower_than_fastest"] == pytest.approx((1.01 + 0.995) / 1.94 - 1)
    flip = plan_stability.replay([run(1.01), run(0.985)], 0.02)   # 4% and 1.5% slower: eng7, then eng0
    assert flip["same"] == 0 and flip["stability"] == 0
    result = plan_stability.compare([run_record(), run_record()]) | {"replayed": [tight, flip]}
    text = plan_stability.table(result)
    assert "replayed at min_margin 2%: 1 of 1 alike (100.0%)" in text and "0 of 1 alike (0.0%)" in text


def test_variants_of_one_engine_are_replayed_at_the_knob_margin():
    def run(first_ms):   # two variants of eng0, the second 0.97 ms
        return {"cases": {"resnet tf32": {"timed": {CUDNN: [["eng0_k1=0", first_ms, 0.0], ["eng0_k1=1", 0.97, 0.0]]}}}}
    runs = [run(1.01), run(0.985)]   # 4% and 1.5% slower: the plain 2% margin flips, the 5% between knobs not
    plain, knobs = plan_stability.replay(runs, 0.02), plan_stability.replay(runs, 0.02, 0.05)
    assert plain["same"] == 0 and knobs["same"] == 1 and knobs["knob_margin"] == 0.05
    text = plan_stability.table(plan_stability.compare([run_record(), run_record()]) | {"replayed": [knobs]})
    assert "replayed at min_margin 2%, knobs 5%: 1 of 1 alike (100.0%)" in text


def test_a_cap_on_cudnn_candidates_is_replayed_with_its_build_cost():
    # eng9 (offered fourth) is 10% faster than the heuristic's first; eng3 failed to build
    graph = {"offered": ["eng0", "eng3", "eng5", "eng9"], "build_ms": [100.0, 50.0, 200.0, 400.0]}
    timed = [["eng0", 1.0, 0.0], ["eng5", 0.98, 0.0], ["eng9", 0.9, 0.0]]
    runs = [{"cases": {"resnet tf32": {"timed": {CUDNN: timed}, "cudnn_graphs": {CUDNN: graph}}}}]
    two, four = plan_stability.capped(runs, 2), plan_stability.capped(runs, 4)
    assert two == {"cap": 2, "graphs": 1, "changed": 1, "build_s": 0.15, "all_build_s": 0.75,
                   "slower": pytest.approx(1.0 / 0.9 - 1)}
    assert four["changed"] == 0 and four["slower"] == 0 and four["build_s"] == 0.75
    text = plan_stability.table(plan_stability.compare([run_record()]) | {"capped": [two]})
    assert "cuDNN's first 2 candidates only: building 0 of 1 s, 1 of 1 choices differ" in text


def test_each_cudnn_graphs_offer_is_kept_in_order_with_its_build_times():
    graph = SimpleNamespace(key=("conv_fprop", "tf32", None, ("x", "spec")), offered={0: "eng0", 3: "eng7", 4: "eng2"},
                            build_ms={0: 12.5, 4: 80.0}, runtime_compiled={3, 4})
    assert plan_stability.cudnn_graphs([graph]) == {CUDNN: {"offered": ["eng0", "eng7", "eng2"],
                                                           "build_ms": [12.5, None, 80.0],
                                                           "compiled": [False, True, True]}}


def test_each_fresh_autotuning_runs_this_command_again_in_a_process_of_its_own(tmp_path):
    from gpuengine.gate.commands import build_parser
    args = SimpleNamespace(workloads=["resnet", "cnn"], precision=["tf32"])
    command = plan_stability.tune_once_command(args, tmp_path / "run0.json")
    assert command[1:3] == ["-m", "gpuengine.gate.commands"]   # python -m gpuengine refuses the gate's commands
    again = build_parser().parse_args(command[3:])
    assert (again.command, again.workloads, again.precision, again.tune_once) == (
        "plans", ["resnet", "cnn"], ["tf32"], tmp_path / "run0.json")
