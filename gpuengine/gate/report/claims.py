"""What the stored runs say of each rule in thresholds.json: the evidence for marking it a claim or a target.

A rule is a claim only where the stored runs show it held. For every GPU tier
of the store, each rule is checked, per test, against the newest measurement
that measured the reference it reads (whichever run holds it: a run that
failed the gate is still a measurement; the quick tier times fewer
references than the nightly one), with the rules as they are now
(`thresholds.evaluate_stored`). Then:

- a claim is **contradicted** when one of the measurements it decides misses
  it, and **unsupported** when it decides none (no stored run of its GPU
  measured what it claims);
- a target is a **promotion candidate** when every measurement it decides
  meets it: it may be made a claim, at its floor or just under the lead
  (docs/gate.md, "Thresholds: claims and targets").

The CPU tier is left out: its timings are smoke and never gate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpuengine.bench.thresholds import CLAIM, TARGET, RatioCheck, ThresholdRule, evaluate_stored
from .store import Benchmark, Run, Store, TierRuns


@dataclass(frozen=True)
class Measured:
    """One rule applied to the newest measurement of one test on one GPU tier."""

    tier: str
    gpu: str
    run: Run
    bench: Benchmark
    check: RatioCheck

    def describe(self) -> str:
        return (f"{self.bench.name} vs {self.check.against} on {self.gpu} ({self.run.label}, {self.run.status}): "
                f"{self.check.verdict()}")


def newest_checks(tier: TierRuns, rules: list[ThresholdRule]) -> list[Measured]:
    """Every gated rule applied, per test, to the newest measurement of `tier` that measured what the rule reads
    (the quick tier leaves some references to the nightly one), newest runs first."""
    found, decided = [], set()
    for run in reversed(tier.runs):
        gpu = run.machine.get("gpu") or tier.gpu
        for bench in run.benchmarks.values():
            for check in evaluate_stored(bench.ratios, gpu, bench.name, rules) if bench.ratios else []:
                if (bench.name, id(check.rule)) not in decided:
                    decided.add((bench.name, id(check.rule)))
                    found.append(Measured(tier.name, gpu, run, bench, check))
    return found


def rule_text(index: int, rule: ThresholdRule) -> str:
    return (f"rule {index} ({rule.kind}: gpu {rule.gpu!r}, test {rule.test!r}, {rule.reference} "
            f">= {rule.min_ratio:g}x)")


@dataclass
class Review:
    """The rules of a store against its newest measurements; each list holds one message per finding."""

    contradicted: list[str] = field(default_factory=list)   # claims a newest measurement misses
    unsupported: list[str] = field(default_factory=list)    # claims no newest measurement is checked against
    promotable: list[str] = field(default_factory=list)     # targets every measurement they decide meets
    evidence: dict[int, list[Measured]] = field(default_factory=dict)   # rule index -> what it decided

    @property
    def claims_hold(self) -> bool:
        return not self.contradicted and not self.unsupported

    def report(self) -> str:
        parts = []
        if self.contradicted:
            parts.append("Claims the newest stored measurement misses (fix the engine, or mark the rule a "
                         "target: it has not held):\n  " + "\n  ".join(self.contradicted))
        if self.unsupported:
            parts.append("Claims no stored measurement of their GPU shows held (mark them targets until a "
                         "run meets them):\n  " + "\n  ".join(self.unsupported))
        if self.promotable:
            parts.append("Targets the newest stored measurement meets, promotion candidates (mark the rule a "
                         "claim once the lead is steady, its floor set as docs/gate.md says):\n  "
                         + "\n  ".join(self.promotable))
        return "\n".join(parts)


def review(store: Store) -> Review:
    """The store's rules (its thresholds.json) against the newest measurement of every test on each GPU tier."""
    rules = store.rules
    index = {id(rule): i for i, rule in enumerate(rules)}
    result = Review(evidence={i: [] for i, rule in enumerate(rules) if rule.min_ratio is not None})
    for tier in store.tiers:
        if tier.on_gpu:
            for measured in newest_checks(tier, rules):
                result.evidence[index[id(measured.check.rule)]].append(measured)
    for i, found in result.evidence.items():
        rule = rules[i]
        if rule.kind == CLAIM:
            if not found:
                result.unsupported.append(f"{rule_text(i, rule)}: no newest measurement of a test it matches")
            result.contradicted += [f"{rule_text(i, rule)}: {m.describe()}" for m in found if not m.check.passed]
        elif rule.kind == TARGET and found and all(m.check.passed for m in found):
            result.promotable.append(f"{rule_text(i, rule)}: " + "; ".join(m.describe() for m in found))
    return result
