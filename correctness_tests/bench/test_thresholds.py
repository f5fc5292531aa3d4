"""gpuengine.bench.thresholds: rule matching, torch_best, checks, and the repository's own rules file."""
from __future__ import annotations

import json

import pytest

from gpuengine.bench import thresholds
from gpuengine.bench.benchmarking import Comparison
from gpuengine.bench.json_files import JsonFileError
from gpuengine.bench.thresholds import (TORCH_BEST, ThresholdRule, check_ratios, evaluate_ratios, load_rules,
    rule_for, threshold_for, wildcard_match)

H100 = "NVIDIA H100 80GB HBM3"
TRAIN = "test_mlp_train[tf32-graph8-resident-bpe1]"


def rule(gpu="*", test="*", reference="*", min_ratio=1.0, why="test rule") -> ThresholdRule:
    return ThresholdRule(gpu, test, reference, min_ratio, why)


def comparison(**reference_ms) -> Comparison:
    """The engine takes 1 ms per round; each reference the given ms (ratio = reference ms)."""
    times = {"gpuengine": [1.0, 1.0, 1.0], **{name: [ms] * 3 for name, ms in reference_ms.items()}}
    return Comparison.from_times("gpuengine", times, {name: 1000 for name in times})


def test_brackets_in_pytest_ids_are_literal():
    assert wildcard_match("test_mlp_train[tf32-graph8-*-bpe1]", TRAIN)
    assert not wildcard_match("test_mlp_train[tf32-graph8-*-bpe1]", "test_mlp_train[tf32-graph8-resident-bpe12]")
    assert not wildcard_match("test_mlp_train[tf32]", "test_mlp_train[t]")  # no character classes


def test_question_mark_is_one_character():
    assert wildcard_match("test_mlp_infer[tf32-resident-b????*]", "test_mlp_infer[tf32-resident-b2000]")
    assert not wildcard_match("test_mlp_infer[tf32-resident-b????*]", "test_mlp_infer[tf32-resident-b512]")


def test_gpu_names_match_case_insensitively_tests_do_not():
    assert rule(gpu="*h100*").matches(H100, TRAIN, "torch_graph")
    assert not rule(test="TEST_MLP_TRAIN*").matches(H100, TRAIN, "torch_graph")


def test_first_matching_rule_wins():
    rules = [rule(gpu="*H100*", test="test_mlp_train[tf32-*]", reference="torch_graph", min_ratio=1.2),
             rule(gpu="*", test="test_mlp_train*", reference="torch_graph", min_ratio=1.0)]
    assert threshold_for(H100, TRAIN, "torch_graph", rules) == 1.2
    assert threshold_for("NVIDIA H200", TRAIN, "torch_graph", rules) == 1.0
    assert threshold_for(H100, TRAIN, "torch_eager", rules) is None


def test_null_min_ratio_exempts_before_a_broader_rule():
    rules = [rule(test="test_mlp_train[*-graph0-*]", min_ratio=None), rule(min_ratio=1.2)]
    assert threshold_for(H100, "test_mlp_train[tf32-graph0-resident-bpe12]", "torch_graph", rules) is None
    assert rule_for(H100, "test_mlp_train[tf32-graph0-resident-bpe12]", "torch_graph", rules) is rules[0]
    assert threshold_for(H100, TRAIN, "torch_graph", rules) == 1.2


def test_torch_best_is_the_fastest_torch_reference_only():
    # gpuengine_oneshot is faster than every torch reference, but torch_best means PyTorch at its strongest.
    result = comparison(torch_eager=3.0, torch_graph=1.5, gpuengine_oneshot=0.5)
    checks = evaluate_ratios(result, H100, TRAIN, [rule(reference=TORCH_BEST, min_ratio=1.2)])
    assert [(c.reference, c.compared_with, c.ratio) for c in checks] == [(TORCH_BEST, "torch_graph", 1.5)]
    assert checks[0].passed


def test_check_ratios_returns_only_the_misses():
    rules = [rule(reference="torch_graph", min_ratio=1.2), rule(reference="torch_eager", min_ratio=2.0)]
    result = comparison(torch_eager=3.0, torch_graph=1.1)
    assert len(evaluate_ratios(result, H100, TRAIN, rules)) == 2
    (miss,) = check_ratios(result, H100, TRAIN, rules)
    assert (miss.reference, miss.min_ratio) == ("torch_graph", 1.2)
    assert miss.ratio == pytest.approx(1.1)
    assert "torch_graph: 1.100x, threshold 1.2x" in miss.describe()
    assert miss.as_dict()["passed"] is False


def test_references_the_run_did_not_measure_are_not_checked():
    rules = [rule(reference="torch_graph", min_ratio=1.2), rule(reference=TORCH_BEST, min_ratio=1.2)]
    assert check_ratios(comparison(tf_keras=0.5), H100, TRAIN, rules) == []


def write_rules(tmp_path, entries):
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps(entries))
    return path


def test_load_rules_reads_and_validates(tmp_path):
    entry = {"gpu": "*", "test": "t*", "reference": "torch_graph", "min_ratio": 1.5, "why": "because"}
    assert load_rules(write_rules(tmp_path, [entry])) == [ThresholdRule("*", "t*", "torch_graph", 1.5, "because")]


@pytest.mark.parametrize("broken, message", [
    ({"gpu": "*", "test": "t", "reference": "r", "min_ratio": 1.0}, "exactly the keys"),
    ({"gpu": "*", "test": "t", "reference": "r", "min_ratio": 0, "why": "w"}, "positive number or null"),
    ({"gpu": "*", "test": "t", "reference": "r", "min_ratio": "1.2", "why": "w"}, "positive number or null"),
    ({"gpu": "*", "test": "", "reference": "r", "min_ratio": 1.0, "why": "w"}, "non-empty string"),
])
def test_load_rules_names_the_broken_rule(tmp_path, broken, message):
    with pytest.raises(ValueError, match=f"rule 0: .*{message}"):
        load_rules(write_rules(tmp_path, [broken]))


def test_load_rules_wants_a_list(tmp_path):
    with pytest.raises(ValueError, match="JSON list"):
        load_rules(write_rules(tmp_path, {"gpu": "*"}))


def test_a_corrupt_rules_file_is_one_error_naming_the_file_and_position(tmp_path):
    path = tmp_path / "thresholds.json"
    path.write_text('[\n  {"gpu": "*", "test": "t",}\n]')
    with pytest.raises(JsonFileError, match=r"thresholds.json: not valid JSON at line 2, column 28: "):
        load_rules(path)
    with pytest.raises(JsonFileError, match=r"absent.json: no such file"):
        load_rules(tmp_path / "absent.json")


def test_default_path_is_read_at_call_time(tmp_path, monkeypatch):
    path = write_rules(tmp_path, [{"gpu": "*", "test": "*", "reference": "*", "min_ratio": 9.0, "why": "w"}])
    monkeypatch.setattr(thresholds, "RULES_PATH", path)
    assert threshold_for(H100, TRAIN, "torch_graph") == 9.0


# Each claim's floor: its target, or just under the measured lead where the lead holds with margin (so that a real
# loss of the lead fails even when it comes in steps too small for the stored-run check).
@pytest.mark.parametrize("gpu, test, reference, expected", [
    (H100, TRAIN, "torch_graph", 1.85),                                           # target 1.2, measured 2.06
    (H100, "test_mlp_train[tf32-graph1-resident-bpe12]", "torch_graph", 1.4),    # target 1.2, measured 1.59
    ("NVIDIA H200", "test_mlp_train[tf32-graph1-resident-bpe12]", "torch_eager", 2.0),
    ("NVIDIA H200", "test_mlp_train[tf32-graph0-resident-bpe12]", "torch_graph", None),
    ("NVIDIA H200", "test_mlp_train[tf32-graph1-streamed-bpe12]", "torch_graph", None),
    (H100, "test_mlp_infer[tf32-resident-b8000]", TORCH_BEST, 1.2),
    (H100, "test_mlp_infer[tf32-resident-b512]", TORCH_BEST, None),
    ("NVIDIA H200", "test_mlp_train[fp32-graph8-resident-bpe4]", "torch_graph", 1.05),   # target 1.0, measured 1.2
    ("NVIDIA H200", "test_cnn_train[bf16-graph8-resident-b128]", "torch_graph", 1.85),
    (H100, "test_transformer_train[seq64-tf32-graph8-b16]", "torch_graph", 1.3),     # the target binds: 1.40
    (H100, "test_resnet_train[cifar10-tf32-graph8-resident-b128]", "torch_graph", 1.25),   # missed, not lowered
    ("NVIDIA H200", "test_mlp_infer[fp32-resident-b32000]", "torch_graph", 1.0),
    ("none (CPU tier, NumPy backend)", TRAIN, "torch_graph", None),
])
def test_repository_rules_encode_the_claims(gpu, test, reference, expected):
    assert threshold_for(gpu, test, reference) == expected
