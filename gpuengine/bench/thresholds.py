"""Same-run ratio thresholds: how much faster than each reference the engine must be, per test and GPU.

The rules live in `baselines_store/thresholds.json`, a JSON list read top to
bottom, most specific first; the first rule matching (GPU, test, reference)
decides:

    {"gpu": "*H100*", "test": "test_mlp_train[tf32-graph*-resident-*]",
     "reference": "torch_graph", "min_ratio": 1.2, "why": "the target: ..."}

Patterns know two wildcards, `*` (any run of characters) and `?` (one
character); everything else is literal, brackets included, so a pytest id such
as `test_mlp_infer[tf32-resident-b8000]` reads as itself. GPU names match
case-insensitively. `min_ratio: null` is an explicit exemption: the ratio is
reported, not gated. A reference is a runner name from the comparison, or
`torch_best`: the fastest `torch_*` reference of that run (PyTorch counts only
at its strongest: docs/architecture.md, "The references we compare against").
Ratios come from `benchmarking.Comparison`: reference time over engine time, so
1.2 means the engine is 1.2x as fast.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from .benchmarking import Comparison
from .json_files import JsonFileError, load_json

# The repository's file; the package is installed editable (./gate, tox), so this resolves in the checkout.
RULES_PATH = Path(__file__).resolve().parents[2] / "baselines_store" / "thresholds.json"
TORCH_BEST = "torch_best"


def wildcard_match(pattern: str, text: str, ignore_case: bool = False) -> bool:
    """Whole-string match where only `*` and `?` are special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.IGNORECASE if ignore_case else 0) is not None


@dataclass(frozen=True)
class ThresholdRule:
    gpu: str                 # pattern on the GPU name, case-insensitive
    test: str                # pattern on the test name with its parameter id
    reference: str           # pattern on the reference name ("torch_graph", "torch_best", "*")
    min_ratio: float | None  # None: reported, not gated
    why: str                 # where the number comes from

    def matches(self, gpu_name: str, test_name: str, reference: str) -> bool:
        return (wildcard_match(self.gpu, gpu_name, ignore_case=True) and wildcard_match(self.test, test_name)
                and wildcard_match(self.reference, reference))


@dataclass(frozen=True)
class RatioCheck:
    """One threshold applied to one measured ratio."""

    reference: str      # as the rule names it ("torch_best" stays torch_best)
    compared_with: str  # the runner actually compared against
    ratio: float        # median per-round speed-up of the engine
    min_ratio: float
    why: str

    @property
    def passed(self) -> bool:
        return self.ratio >= self.min_ratio

    def as_dict(self) -> dict:
        return {"reference": self.reference, "compared_with": self.compared_with, "ratio": round(self.ratio, 4),
                "min_ratio": self.min_ratio, "passed": self.passed, "why": self.why}

    def describe(self) -> str:
        against = self.reference if self.reference == self.compared_with else f"{self.reference} ({self.compared_with})"
        return f"{against}: {self.ratio:.3f}x, threshold {self.min_ratio}x ({self.why})"


def _rule_from(entry, where: str) -> ThresholdRule:
    expected = {f.name for f in fields(ThresholdRule)}
    if not isinstance(entry, dict) or set(entry) != expected:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise JsonFileError(f"{where}: a rule has exactly the keys {sorted(expected)}, got {keys}")
    for key in ("gpu", "test", "reference", "why"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise JsonFileError(f"{where}: {key!r} must be a non-empty string, got {entry[key]!r}")
    min_ratio = entry["min_ratio"]
    if min_ratio is not None and (isinstance(min_ratio, bool) or not isinstance(min_ratio, (int, float))
                                  or not min_ratio > 0):
        raise JsonFileError(f"{where}: 'min_ratio' must be a positive number or null, got {min_ratio!r}")
    return ThresholdRule(**entry)


def load_rules(path: Path | str | None = None) -> list[ThresholdRule]:
    """The rules of `path` (default: RULES_PATH, read when called), validated: JsonFileError names the file
    and the line and column (bad JSON) or the rule (bad content)."""
    path = Path(RULES_PATH if path is None else path)
    entries = load_json(path)
    if not isinstance(entries, list):
        raise JsonFileError(f"{path}: expected a JSON list of rules, got {type(entries).__name__}")
    return [_rule_from(entry, f"{path}, rule {i}") for i, entry in enumerate(entries)]


def rule_for(gpu_name: str, test_name: str, reference: str,
             rules: list[ThresholdRule] | None = None) -> ThresholdRule | None:
    """The first rule matching, or None."""
    for rule in load_rules() if rules is None else rules:
        if rule.matches(gpu_name, test_name, reference):
            return rule
    return None


def threshold_for(gpu_name: str, test_name: str, reference: str,
                  rules: list[ThresholdRule] | None = None) -> float | None:
    """The minimum speed-up required over `reference`, or None when nothing gates it."""
    rule = rule_for(gpu_name, test_name, reference, rules)
    return None if rule is None else rule.min_ratio


def fastest_torch_reference(comparison: Comparison) -> str | None:
    """The torch_* runner the engine is least ahead of."""
    torch_refs = [name for name in comparison.ratios if name.startswith("torch_")]
    return min(torch_refs, key=lambda name: comparison.ratios[name].median) if torch_refs else None


def evaluate_ratios(comparison: Comparison, gpu_name: str, test_name: str,
                    rules: list[ThresholdRule] | None = None) -> list[RatioCheck]:
    """Every threshold that applies to this comparison, passed or not."""
    rules = load_rules() if rules is None else rules
    candidates = {name: name for name in comparison.ratios}
    best = fastest_torch_reference(comparison)
    if best is not None:
        candidates[TORCH_BEST] = best
    checks = []
    for reference, runner in candidates.items():
        rule = rule_for(gpu_name, test_name, reference, rules)
        if rule is not None and rule.min_ratio is not None:
            checks.append(RatioCheck(reference, runner, comparison.ratios[runner].median, rule.min_ratio, rule.why))
    return checks


def check_ratios(comparison: Comparison, gpu_name: str, test_name: str,
                 rules: list[ThresholdRule] | None = None) -> list[RatioCheck]:
    """The thresholds this comparison misses (empty when it meets them all)."""
    return [check for check in evaluate_ratios(comparison, gpu_name, test_name, rules) if not check.passed]
