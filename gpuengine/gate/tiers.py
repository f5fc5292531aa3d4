"""The suite's two tiers: which cases each perf test runs, and how many rounds it times.

`./gate perf` is the quick tier: every workload and precision, the toggle
sweeps thinned to the cases a regression would show in, each test's rounds
chosen from its learned noise (`baselines_store/<tier>/noise.json`) to reach
the gate's power target, within its workload's time budget. `./gate perf
--full` is the nightly tier: every case, twice the rounds. A perf module hands
its full case list to `cases()` once,

    CASES = tiers.cases("cnn_train", ALL_CASES, quick=lambda c: ..., ids=case_id, budget_s=90)

    @pytest.mark.parametrize("case", CASES)
    def test_cnn_train(case, benchmark, compare, ...): ...

and its `compare(...)` call asks `rounds_for` (through the gate plugin) how
many rounds to time; nothing else in a module decides either. `budget_s` is
the quick tier's seconds of timed rounds for all of the workload's quick cases
on one GPU (set-up, compilation and capture come on top); the quick tier of
the whole suite is meant to stay within 10 minutes on one H100, short enough
to run before every merge (docs/gate.md, "Tier time").
The first quick case (or `study=`) is the one `./gate gatepower`
measures for the workload.

The tiers also differ in what a target not met yet does (`targets_fail`): the
quick tier lists it in the summary and passes, the nightly tier fails its test
as `--claims` does (baselines_store/thresholds.json's kinds, docs/gate.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import pytest

from gpuengine.gate.rules.regression import MIN_ROUNDS

NIGHTLY = "nightly"           # marker: a case only the full tier runs
STUDY = "gatepower"           # marker: the case the gatepower study measures for its workload
WORKLOAD = "perf_workload"    # marker: the workload a case belongs to, with its time budget
FULL_ROUNDS_FACTOR = 2
NIGHTLY_FAILS_TARGETS = True   # the nightly tier holds the engine to its targets too, as --claims does

MARKERS = (
    f"{NIGHTLY}: a perf case of the nightly tier only (./gate perf --full runs it)",
    f"{STUDY}: the case of its workload that ./gate gatepower measures",
    f"{WORKLOAD}(name, budget_s, quick_cases): the workload of a perf case and its quick-tier time budget",
)


def cases(workload: str, full_cases: Sequence, *, quick: Callable[[object], bool] | Collection,
          ids: Callable[[object], str], budget_s: float, study=None, nightly_only: bool = False) -> list:
    """`full_cases` as pytest params: the quick tier's marked with the workload, the others `nightly`
    (all of them with `nightly_only`: a comparison too slow to set up for the quick tier, no study case)."""
    full = list(full_cases)
    if not full:
        raise ValueError(f"{workload}: no cases")
    if nightly_only:
        workload_mark = getattr(pytest.mark, WORKLOAD)(workload, budget_s=budget_s, quick_cases=len(full))
        return [pytest.param(case, id=ids(case), marks=[workload_mark, getattr(pytest.mark, NIGHTLY)])
                for case in full]
    in_quick = [bool(quick(case)) if callable(quick) else case in quick for case in full]
    if not any(in_quick):
        raise ValueError(f"{workload}: the quick tier keeps none of its {len(full)} cases")
    if not budget_s > 0:
        raise ValueError(f"{workload}: budget_s must be > 0 seconds, got {budget_s}")
    study = full[in_quick.index(True)] if study is None else study
    if study not in full or not in_quick[full.index(study)]:
        raise ValueError(f"{workload}: the study case {study!r} is not one of its quick cases")
    workload_mark = getattr(pytest.mark, WORKLOAD)(workload, budget_s=budget_s, quick_cases=sum(in_quick))
    params = []
    for case, keep in zip(full, in_quick):
        marks = [workload_mark] + ([] if keep else [getattr(pytest.mark, NIGHTLY)])
        if case == study:
            marks.append(getattr(pytest.mark, STUDY))
        params.append(pytest.param(case, id=ids(case), marks=marks))
    return params


# References the quick tier on a GPU leaves to the nightly tier: no claim the quick tier checks reads them, and
# some cost minutes to set up (torch.compile, Keras); the quick tier times the engine and torch_graph.
NIGHTLY_REFERENCES = frozenset({"torch_eager", "torch_compile", "tf_keras", "torch_graph_streamed",
                                "gpuengine_oneshot", "gpuengine_tf32", "gpuengine_resident"})
# torch_compile_graph (with torch_graph, the rules' torch_graph_best) costs Inductor's compilation per model
# (ResNet-50 about a minute, the zoo's five networks more, the Transformer one per length) and a third runner
# per round, on a quick tier at its 10 minutes already: the quick tier times it only in the tests named here,
# the MLP's headline cases, where it compiles in seconds; the nightly tier everywhere. Elsewhere the quick
# tier times torch_graph alone, which decides no rule reading torch_graph_best (docs/gate.md).
QUICK_COMPILE_GRAPH_TESTS = frozenset({"test_mlp_train[tf32-graph8-resident-bpe1]",
                                       "test_mlp_infer[tf32-resident-b8000]"})


def references(names: Sequence[str], *, full: bool, on_gpu: bool, test: str = "") -> list[str]:
    """The references of `names` test `test` times: all of them nightly and on the CPU tier (smoke of every
    path); in the GPU quick tier, those outside NIGHTLY_REFERENCES, torch_compile_graph in
    QUICK_COMPILE_GRAPH_TESTS only."""
    if full or not on_gpu:
        return list(names)
    return [name for name in names if name not in NIGHTLY_REFERENCES
            and (name != "torch_compile_graph" or test in QUICK_COMPILE_GRAPH_TESTS)]


def recipes(**tests) -> dict[str, tuple[list, Callable]]:
    """A module's `ENGINES`: test name -> (its cases as `cases()` made them, build(case) -> engine runner).

    `build` makes the engine side of a case from the case alone, so that an A/B session
    (gpuengine/gate/ab/session.py) can build it in the base's checkout and in the head's alike."""
    for test, entry in tests.items():
        if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])
                and all(hasattr(param, "id") for param in entry[0])):
            raise ValueError(f"{test}: a recipe is (cases from tiers.cases, build(case) -> runner)")
    return dict(tests)


def targets_fail(*, full: bool, claims: bool) -> bool:
    """Whether a target not met yet fails its test: with --claims, and in the nightly tier (--full)."""
    return claims or (full and NIGHTLY_FAILS_TARGETS)


@dataclass(frozen=True)
class RoundsChoice:
    rounds: int
    why: str

    def as_dict(self) -> dict:
        return {"rounds": self.rounds, "why": self.why}


def rounds_for(requested: int, *, recommended: int | None, full: bool, test_budget_s: float | None,
               round_set_ms: float | None, forced: int | None = None, min_rounds: int | None = None,
               preferred: int | None = None) -> RoundsChoice:
    """The rounds to time: learned (noise.json) or the module's default; doubled nightly; within budget quick.

    A budget never cuts below MIN_ROUNDS (fewer cannot reach the rank test's significance), unless the
    test asked for fewer itself (the CPU tier's smoke rounds). `min_rounds` raises the floor and the test's
    own request alike (an A/B test's paired rank test needs 7); `preferred` raises the request only (an A/B
    test asks for more where rounds are cheap, paired.preferred_rounds), and the budget may cut it back.
    """
    if requested < 1:
        raise ValueError(f"rounds={requested}: at least one timed round is needed")
    if forced is not None:
        return RoundsChoice(forced, "forced by the gatepower study (--rounds)")
    base, why = (recommended, "noise.json's power target") if recommended else (requested, "the test's default")
    if min_rounds is not None and base < min_rounds:
        base, why = min_rounds, f"{why}, raised to the {min_rounds} the A/B rank test needs"
    if preferred is not None and base < preferred:
        base, why = preferred, f"{why}, raised to the {preferred} an A/B test asks for at this round length"
    if full:
        return RoundsChoice(max(base, requested) * FULL_ROUNDS_FACTOR, f"{why}, x{FULL_ROUNDS_FACTOR} (--full)")
    if test_budget_s and round_set_ms:
        affordable = int(test_budget_s * 1e3 // round_set_ms)
        if affordable < base:
            floor = max(min(base, MIN_ROUNDS), min_rounds or 0)
            return RoundsChoice(max(affordable, floor), f"{why}, cut to the workload's budget "
                                                        f"({test_budget_s:.1f} s for this case)")
    return RoundsChoice(base, why)
