"""One perf test's rounds and its verdict: the A/B rule where it ran against a base, else the stored-run rule.

`GateTest` is what a perf test asks of the gate (the `gate_test` fixture,
plugin.py): how many rounds to time, then the check of what it measured. A
test that ran A/B is judged head against base, round by round in this
session (gpuengine/gate/rules/paired.py); otherwise against the newest
stored baseline of its stack that timed the same runners
(gpuengine/gate/rules/regression.py), "not comparable" where only another
stack's runs hold it, and "no baseline" where none does. Each verdict is
listed in the session state for the summary.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpuengine.bench.stack_lock import stack_of
from gpuengine.gate.rules import paired
from gpuengine.gate.rules.regression import NoiseLevels, RunSamples, decide
from gpuengine.gate.rules.verdicts import NO_BASELINE, NOT_COMPARABLE, REGRESSED, Decision
from gpuengine.gate.store.stored_runs import StoredRun, newest_with_runners, runners_of

from . import tiers


def has_timings(bench: dict) -> bool:
    """Whether a stored benchmark carries timings a run can be compared with (a ratio's, or the engine's alone)."""
    samples = RunSamples.from_extra_info(bench.get("extra_info") or {})
    return samples.ratio_cost is not None or samples.time_cost is not None


@dataclass(frozen=True)
class CheckOutcome:
    record: dict           # what goes into extra_info["stored_run_check"]
    failure: str | None    # the pytest-benchmark-style line when the test regressed


class GateTest:
    """What the gate knows about one perf test: its rounds and its check. `state` is the session's
    plugin.GateState (not imported: plugin.py builds this class's instances)."""

    def __init__(self, state, node):
        self.state, self.fullname = state, node.nodeid
        self.study = state.study                    # set in gatepower study sessions only
        self._workload = node.get_closest_marker(tiers.WORKLOAD)
        self.workload = self._workload.args[0] if self._workload else node.originalname

    def rounds(self, requested: int, round_set_ms: float | None, paired_rounds: bool = False) -> tiers.RoundsChoice:
        entry = self.state.noise.tests.get(self.fullname)
        budget = None
        if self._workload is not None and self.state.tier.on_gpu:
            budget = self._workload.kwargs["budget_s"] / self._workload.kwargs["quick_cases"]
        forced = self.state.study.rounds if self.state.study else None
        if paired_rounds and self.state.ab_rounds and forced is None:
            return tiers.RoundsChoice(self.state.ab_rounds, "--ab-rounds")
        ab = paired_rounds and self.state.tier.on_gpu
        return tiers.rounds_for(requested, recommended=entry.recommended_rounds if entry else None,
                               full=self.state.full, test_budget_s=budget, round_set_ms=round_set_ms, forced=forced,
                               min_rounds=paired.MIN_ROUNDS if ab else None,
                               preferred=paired.preferred_rounds(round_set_ms) if ab else None)

    def check(self, extra_info: dict) -> CheckOutcome | None:
        """The A/B check where the test ran against a base, else the stored-run check of this run's extra_info;
        None when the run compares with nothing."""
        if "ab" in extra_info:
            return self.check_paired(extra_info["ab"])
        if not self.state.compare:
            return None
        runners = runners_of({"extra_info": extra_info})
        run = newest_with_runners(self.state.comparable_runs, self.fullname, runners, usable=has_timings)
        if run is None:
            elsewhere = newest_with_runners(self.state.runs, self.fullname, runners, usable=has_timings)
            if elsewhere is not None:
                return self.not_comparable(elsewhere)
            reason = self.no_baseline_reason(runners)
            self.state.checked.append((self.fullname, NO_BASELINE, f"{NO_BASELINE:16}{self.fullname}: {reason}"))
            return CheckOutcome({"verdict": NO_BASELINE, "reason": reason}, None)
        current = RunSamples.from_extra_info(extra_info)
        baseline = RunSamples.from_extra_info(run.benchmarks[self.fullname].get("extra_info", {}), current.reference)
        return self.outcome(decide(current, baseline, self.noise_levels(current.reference)), run.label,
                            {"baseline_run": run.label})

    def noise_levels(self, reference: str | None) -> NoiseLevels:
        """The stored-run rule's run-to-run noise: noise.json's calibration, else what the stored runs of the same
        code show, else the prior."""
        if self.fullname in self.state.noise.tests or self.state.stored_noise is None:
            return self.state.noise.levels(self.fullname)
        return self.state.stored_noise.levels(self.fullname, reference)

    def outcome(self, decision: Decision, against: str, record: dict) -> CheckOutcome:
        """Either rule's decision recorded, listed for the summary, and failing the test where it regressed."""
        line = decision.line(self.fullname, against)
        self.state.checked.append((self.fullname, decision.verdict, f"{decision.verdict:16}{line}"))
        return CheckOutcome({**record, **decision.as_dict()}, line if decision.verdict == REGRESSED else None)

    def not_comparable(self, stored: StoredRun) -> CheckOutcome:
        """A test whose stored runs of the same runners all ran on another stack: said so, never a regression."""
        changed = f"stack changed ({stack_of(stored.machine_info)} -> {self.state.stack})"
        line = f"{self.fullname}: {changed}; its newest stored run, {stored.label}, is not compared with"
        self.state.checked.append((self.fullname, NOT_COMPARABLE, f"{NOT_COMPARABLE:16}{line}"))
        return CheckOutcome({"verdict": NOT_COMPARABLE, "reason": changed, "stored_run": stored.label}, None)

    def no_baseline_reason(self, runners: frozenset) -> str:
        newest = self.state.baselines.get(self.fullname)
        if newest is None:
            return "no stored baseline run has this test yet"
        # H100, ce9bf4e: the CNN's engine rounds ran 5% slower in the nightly tier than in the quick one.
        return (f"no stored run timed it beside the same runners ({', '.join(sorted(runners))}); its newest, "
                f"{newest.label}, timed {', '.join(sorted(runners_of(newest.benchmarks[self.fullname])))}, and "
                "the runners between the engine's rounds change its speed, so another tier's run is not compared")

    def check_paired(self, ab: dict) -> CheckOutcome:
        """Head over base, round by round in this session (gpuengine/gate/rules/paired.py)."""
        learned = self.state.process_noise.get(self.fullname)
        decision = paired.decide_paired(ab["head_round_ms"], ab["base_round_ms"],
                                        head_samples=ab["head_samples_per_round"],
                                        base_samples=ab["base_samples_per_round"],
                                        process_sd=learned.sd if learned else None,
                                        source=learned.source() if learned else None)
        self.state.ab_catches[self.fullname] = decision.catches
        return self.outcome(decision, f"A/B against {ab['base']}", {"mode": "A/B", "base": ab["base"]})
