"""Same-run ratio thresholds: how much faster than each reference the engine must be, per test and GPU.

The rules live in `baselines_store/thresholds.json`, a JSON list read top to
bottom, most specific first; the first rule matching (GPU, test, reference)
decides:

    {"gpu": "*H100*", "test": "test_mlp_train[tf32-graph*-resident-*]",
     "reference": "torch_graph_best", "min_ratio": 1.45, "kind": "claim", "why": "measured 1.59x ..."}

Patterns know two wildcards, `*` (any run of characters) and `?` (one
character); everything else is literal, brackets included, so a pytest id such
as `test_mlp_infer[tf32-resident-b8000]` reads as itself. GPU names match
case-insensitively. `min_ratio: null` is an explicit exemption: the ratio is
reported, not gated. A reference is a runner name from the comparison,
`torch_graph_best`: the faster of torch_graph and torch_compile_graph in each
round (stronger_reference.py; what the rules over PyTorch's captured step
read), or `torch_best`: the fastest `torch_*` runner of that run by its median
(PyTorch counts only at its strongest: docs/architecture.md, "The references
we compare against"). A check names which runner it met: "torch_graph_best
(torch_compile_graph in 7 of 9 rounds)", "torch_best (torch_graph)".
Ratios come from `benchmarking.Comparison`: reference time over engine time, so
1.2 means the engine is 1.2x as fast.

Each rule says what kind it is (`kind`):

- `claim`: the engine has met this floor in the stored runs of that GPU (a
  floor just under its measured lead, or the target itself where it holds);
  a miss fails the test, on every tier of the gate;
- `target`: a goal the stored runs do not show met yet; a miss is recorded in
  the run and listed in the summary ("target 1.25x, measured 1.11x: not met")
  and fails the test only with `--claims` (and in the nightly tier, `--full`);
- `exempt`: `min_ratio: null`, reported and never gated.

correctness_tests/gate/test_claims.py holds the marking to the stored runs:
a claim that their newest measurement misses fails it.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from pathlib import Path

from .benchmarking import Comparison
from .json_files import JsonFileError, load_json
from .stronger_reference import STRONGER

# The repository's file; the package is installed editable (./gate, tox), so this resolves in the checkout.
RULES_PATH = Path(__file__).resolve().parents[2] / "baselines_store" / "thresholds.json"
TORCH_BEST = "torch_best"
CLAIM, TARGET, EXEMPT = "claim", "target", "exempt"
KINDS = (CLAIM, TARGET, EXEMPT)


def wildcard_match(pattern: str, text: str, ignore_case: bool = False) -> bool:
    """Whole-string match where only `*` and `?` are special."""
    return _wildcard_regex(pattern, ignore_case).fullmatch(text) is not None


@functools.lru_cache(maxsize=1024)
def _wildcard_regex(pattern: str, ignore_case: bool) -> re.Pattern:
    """Built once per pattern: the report checks every stored run against every rule (thousands of matches)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.IGNORECASE if ignore_case else 0)


@dataclass(frozen=True)
class ThresholdRule:
    gpu: str                 # pattern on the GPU name, case-insensitive
    test: str                # pattern on the test name with its parameter id
    reference: str           # pattern on the reference name ("torch_graph_best", "torch_best", "*")
    min_ratio: float | None  # None: reported, not gated
    why: str                 # where the number comes from
    kind: str                # CLAIM (has held: a miss fails), TARGET (a goal not met yet), EXEMPT (min_ratio None)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"'kind' must be one of {', '.join(repr(k) for k in KINDS)}, got {self.kind!r}")
        if (self.kind == EXEMPT) != (self.min_ratio is None):
            raise ValueError(f"'kind' is {self.kind!r} with 'min_ratio' {self.min_ratio!r}: a rule with a number is "
                             f"a {CLAIM!r} (it has held) or a {TARGET!r} (not met yet); 'min_ratio': null is "
                             f"{EXEMPT!r}")

    def matches(self, gpu_name: str, test_name: str, reference: str) -> bool:
        return (wildcard_match(self.gpu, gpu_name, ignore_case=True) and wildcard_match(self.test, test_name)
                and wildcard_match(self.reference, reference))


@dataclass(frozen=True)
class RatioCheck:
    """One threshold applied to one measured ratio."""

    reference: str       # as the rule names it ("torch_best" stays torch_best)
    compared_with: str   # the runner actually compared against (torch_graph_best: its label)
    ratio: float         # median per-round speed-up of the engine
    rule: ThresholdRule  # the rule that decided (a claim or a target)

    @property
    def min_ratio(self) -> float:
        return self.rule.min_ratio

    @property
    def kind(self) -> str:
        return self.rule.kind

    @property
    def why(self) -> str:
        return self.rule.why

    @property
    def passed(self) -> bool:
        return self.ratio >= self.min_ratio

    @property
    def against(self) -> str:
        return self.reference if self.reference == self.compared_with else f"{self.reference} ({self.compared_with})"

    def as_dict(self) -> dict:
        return {"reference": self.reference, "compared_with": self.compared_with, "ratio": round(self.ratio, 4),
                "min_ratio": self.min_ratio, "kind": self.kind, "passed": self.passed, "why": self.why}

    def describe(self) -> str:
        return f"{self.against}: {self.ratio:.3f}x, {self.kind} {self.min_ratio:g}x ({self.why})"

    def verdict(self) -> str:
        """'target 1.25x, measured 1.11x: not met' (or 'claim 1.85x, measured 2.05x: met')."""
        return f"{self.kind} {self.min_ratio:g}x, measured {measured_text(self.ratio, self.min_ratio)}: " \
               + ("met" if self.passed else "not met")


def measured_text(ratio: float, min_ratio: float) -> str:
    """The ratio with two decimals, or more where two would round it onto the other side of `min_ratio`."""
    for digits in (2, 3, 4):
        text = f"{ratio:.{digits}f}"
        if (float(text) >= min_ratio) == (ratio >= min_ratio):
            break
    return f"{text}x"


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
    try:
        return ThresholdRule(**entry)
    except ValueError as exc:   # the kind: unknown, or not what min_ratio says
        raise JsonFileError(f"{where}: {exc}") from None


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


def evaluate_medians(medians: dict[str, float], gpu_name: str, test_name: str,
                     rules: list[ThresholdRule] | None = None, labels: dict[str, str] | None = None) -> list[RatioCheck]:
    """Every threshold that applies to the engine's median speed-ups over these references, passed or not;
    `labels` says which runner a derived reference was (torch_graph_best's label)."""
    rules = load_rules() if rules is None else rules
    labels = labels or {}
    candidates = {name: name for name in medians}
    torch_refs = [name for name in medians if name.startswith("torch_") and name != STRONGER]   # runners only
    if torch_refs:
        candidates[TORCH_BEST] = min(torch_refs, key=lambda name: medians[name])
    checks = []
    for reference, runner in candidates.items():
        rule = rule_for(gpu_name, test_name, reference, rules)
        if rule is not None and rule.min_ratio is not None:
            checks.append(RatioCheck(reference, labels.get(runner, runner), medians[runner], rule))
    return checks


def evaluate_ratios(comparison: Comparison, gpu_name: str, test_name: str,
                    rules: list[ThresholdRule] | None = None) -> list[RatioCheck]:
    """Every threshold that applies to this comparison, passed or not."""
    return evaluate_medians({name: summary.median for name, summary in comparison.ratios.items()}, gpu_name,
                            test_name, rules, {name: summary.label for name, summary in comparison.ratios.items()
                                               if summary.label})


def evaluate_stored(ratios: dict, gpu_name: str, test_name: str,
                    rules: list[ThresholdRule] | None = None) -> list[RatioCheck]:
    """The same for a stored run's `extra_info["ratios"]` ({reference: {"median": ...}}), against `rules` as
    they are now: what today's rules say of an old measurement."""
    medians = {name: summary["median"] for name, summary in (ratios or {}).items()
               if isinstance(summary, dict) and isinstance(summary.get("median"), (int, float))
               and not isinstance(summary.get("median"), bool)}
    labels = {name: ratios[name]["label"] for name in medians if isinstance(ratios[name].get("label"), str)}
    return evaluate_medians(medians, gpu_name, test_name, rules, labels)


def check_ratios(comparison: Comparison, gpu_name: str, test_name: str,
                 rules: list[ThresholdRule] | None = None) -> list[RatioCheck]:
    """The thresholds this comparison misses (empty when it meets them all)."""
    return [check for check in evaluate_ratios(comparison, gpu_name, test_name, rules) if not check.passed]
