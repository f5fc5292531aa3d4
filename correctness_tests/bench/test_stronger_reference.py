"""torch_graph_best: the faster of PyTorch's two captured references in each round, and the rules that read it.

The round-by-round choice and its label (gpuengine/bench/stronger_reference.py),
the ratio a comparison derives from it and stores, the checks of a rule that
reads it (live and from a stored run), and what it is not: torch_best's
candidate, or present in a run that timed torch_graph alone.
"""
from __future__ import annotations

import pytest

from gpuengine.bench.benchmarking import Comparison
from gpuengine.bench.stronger_reference import STRONGER, faster_per_round, label
from gpuengine.bench.thresholds import CLAIM, TORCH_BEST, ThresholdRule, evaluate_ratios, evaluate_stored

H100 = "NVIDIA H100 80GB HBM3"
TRAIN = "test_mlp_train[tf32-graph8-resident-bpe1]"
GRAPH = [2.0, 2.0, 2.0, 2.0]
COMPILED = [1.5, 2.5, 1.6, 1.7]   # faster than torch_graph in rounds 0, 2 and 3


def claim(reference: str, min_ratio: float) -> ThresholdRule:
    return ThresholdRule("*", "*", reference, min_ratio, "test rule", CLAIM)


def comparison(unavailable=(), **reference_ms) -> Comparison:
    """The engine takes 1 ms per round, every runner does 1000 samples a round."""
    times = {"gpuengine": [1.0] * 4, **reference_ms}
    return Comparison.from_times("gpuengine", times, {name: 1000 for name in times}, unavailable=unavailable)


def test_each_round_takes_the_faster_candidate_and_says_which():
    times, winners = faster_per_round({"torch_graph": GRAPH, "torch_compile_graph": COMPILED, "torch_eager": [0.1] * 4})
    assert times == [1.5, 2.0, 1.6, 1.7]   # torch_eager is no candidate, however fast
    assert winners == ["torch_compile_graph", "torch_graph", "torch_compile_graph", "torch_compile_graph"]
    assert label(winners) == "torch_compile_graph in 3 of 4 rounds"


def test_a_tie_goes_to_torch_graph():
    assert faster_per_round({"torch_graph": [1.0], "torch_compile_graph": [1.0]}) == ([1.0], ["torch_graph"])
    assert label(["torch_graph", "torch_compile_graph"]) == "torch_graph in 1 of 2 rounds"


def test_it_exists_only_where_both_candidates_were_settled():
    assert faster_per_round({"torch_graph": GRAPH}) is None   # torch_compile_graph left to the nightly tier
    assert faster_per_round({"torch_compile_graph": COMPILED}) is None
    assert faster_per_round({}, unavailable={"torch_graph", "torch_compile_graph"}) is None   # nothing timed
    times, winners = faster_per_round({"torch_graph": GRAPH}, unavailable={"torch_compile_graph"})
    assert times == GRAPH and set(winners) == {"torch_graph"}
    assert label(winners, {"torch_compile_graph"}) == "torch_graph in 4 of 4 rounds; torch_compile_graph unavailable"


def test_candidates_with_different_round_counts_are_an_error():
    with pytest.raises(ValueError, match="different numbers of rounds .*torch_graph: 4, torch_compile_graph: 3"):
        faster_per_round({"torch_graph": GRAPH, "torch_compile_graph": COMPILED[:3]})


def test_a_label_needs_rounds():
    with pytest.raises(ValueError, match="no round to label"):
        label([])


def test_the_comparison_derives_and_stores_the_stronger_ratio_per_round():
    result = comparison(torch_graph=GRAPH, torch_compile_graph=COMPILED)
    stronger = result.ratios[STRONGER]
    assert stronger.per_round == [1.5, 2.0, 1.6, 1.7] and stronger.median == pytest.approx(1.65)
    assert stronger.median <= min(result.ratios[name].median for name in ("torch_graph", "torch_compile_graph"))
    stored = result.extra_info()["ratios"][STRONGER]
    assert stored["label"] == "torch_compile_graph in 3 of 4 rounds"
    assert stored["winners"] == ["torch_compile_graph", "torch_graph", "torch_compile_graph", "torch_compile_graph"]
    assert "label" not in result.extra_info()["ratios"]["torch_graph"]   # a runner's ratio is only its numbers
    assert STRONGER not in result.extra_info()["samples_per_s"]          # and no runner of its own
    assert result.best_reference() == "torch_compile_graph"


def test_the_stronger_ratio_compares_samples_not_rounds():
    # torch_compile_graph does half the samples per round: per sample it is the slower one in every round.
    times = {"gpuengine": [1.0, 1.0], "torch_graph": [2.0, 2.0], "torch_compile_graph": [1.5, 1.5]}
    result = Comparison.from_times("gpuengine", times, {"gpuengine": 1000, "torch_graph": 1000,
                                                        "torch_compile_graph": 500})
    assert result.ratios[STRONGER].per_round == [2.0, 2.0] and result.ratios[STRONGER].label.startswith("torch_graph")


def test_a_run_without_torch_compile_graph_has_no_stronger_ratio_and_decides_no_rule_reading_it():
    result = comparison(torch_graph=GRAPH)
    assert STRONGER not in result.ratios
    assert evaluate_ratios(result, H100, TRAIN, [claim(STRONGER, 1.2)]) == []


def test_a_rule_reading_the_stronger_reference_checks_it_and_names_the_winner():
    result = comparison(torch_graph=GRAPH, torch_compile_graph=COMPILED)
    (check,) = evaluate_ratios(result, H100, TRAIN, [claim(STRONGER, 1.7)])
    assert (check.reference, check.ratio, check.passed) == (STRONGER, pytest.approx(1.65), False)
    assert check.against == "torch_graph_best (torch_compile_graph in 3 of 4 rounds)"
    assert check.describe().startswith("torch_graph_best (torch_compile_graph in 3 of 4 rounds): 1.650x, claim 1.7x")
    # torch_graph alone would have met it: the claim now reads PyTorch's stronger step.
    assert evaluate_ratios(result, H100, TRAIN, [claim("torch_graph", 1.7)])[0].passed


def test_an_unavailable_compiled_graph_leaves_torch_graph_as_the_stronger_reference():
    result = comparison(unavailable={"torch_compile_graph"}, torch_graph=GRAPH)
    (check,) = evaluate_ratios(result, H100, TRAIN, [claim(STRONGER, 1.2)])
    assert check.ratio == pytest.approx(2.0)
    assert check.against == "torch_graph_best (torch_graph in 4 of 4 rounds; torch_compile_graph unavailable)"


def test_a_stored_run_is_judged_with_its_label():
    stored = comparison(torch_graph=GRAPH, torch_compile_graph=COMPILED).extra_info()["ratios"]
    (check,) = evaluate_stored(stored, H100, TRAIN, [claim(STRONGER, 1.6)])
    assert check.passed and check.compared_with == "torch_compile_graph in 3 of 4 rounds"
    assert evaluate_stored({"torch_graph": stored["torch_graph"]}, H100, TRAIN, [claim(STRONGER, 1.6)]) == []


def test_torch_best_picks_among_runners_never_the_derived_reference():
    result = comparison(torch_graph=GRAPH, torch_compile_graph=COMPILED, torch_eager=[3.0] * 4)
    (check,) = evaluate_ratios(result, H100, TRAIN, [claim(TORCH_BEST, 1.0)])
    assert check.compared_with == "torch_compile_graph"   # its median, 1.65, is the smallest of the runners'
