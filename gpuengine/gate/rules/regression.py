"""The stored-run regression rule: did the engine get slower than in its baseline run, beyond the noise?

Two signals per perf test, both from per-round samples of one run:
- the engine's time over `torch_graph`'s (else the fastest torch reference
  measured), round by round in the same process, so machine drift cancels:
  this run's per-round ratios against the baseline's ("ratio-of-ratios");
- the engine's own round time per sample, which says whether the engine
  moved at all (a faster reference also lowers the ratio).
Each signal is oriented "larger = slower" in log space. A test regressed when
the primary signal (the ratio, else the engine time) is slower with a
one-sided Mann-Whitney p < ALPHA *and* by more than the minimum effect, and
the engine time, where both runs have it, confirms (slower, p < ALPHA).

The minimum effect is asv's "factor" made per test: max(MIN_EFFECT, z(1-ALPHA)
x the sd of the difference of two run medians), each run's sd being the
run-to-run noise (noise.json's `between_run_sd`, else stored_noise.py's from
the stored runs of the same code) plus its own rounds'
spread as the median's variance (pi/2 sd^2 / n). Rounds of one process agree
far better than runs of two (stored H200 runs of the graph-captured tests:
0.05-0.4% within a run, 0.2-1.7% between runs), so the rank test alone would
cry wolf; the learned noise is what keeps false alarms near ALPHA, and the
rank test what keeps a few odd rounds from deciding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .significance import (MEDIAN_VARIANCE_FACTOR, bootstrap_median_shift, mann_whitney_less, normal_quantile,
    rank_test_detectable_shift, rank_test_power, robust_sd)
from .verdicts import IMPROVED, MIN_EFFECT, NOT_COMPARABLE, NOT_SIGNIFICANT, REGRESSED

ALPHA = 0.01                  # one-sided, per test: at most 1% false alarms with the engine unchanged
GOAL_SLOWDOWN = 0.05        # the gate's power goal (docs/gate.md): a 5% slowdown ...
GOAL_POWER = 0.95           # ... detected 95% of the time
DEFAULT_BETWEEN_RUN_SD = 0.01  # uncalibrated prior: H200 graph-captured tests sat at 0.2-1.7% across runs
PREFERRED_REFERENCE = "torch_graph"
MIN_ROUNDS = 5                # the fewest a side where a one-sided rank test can reach p < 0.01 (1/252 exact)
MAX_ROUNDS = 40


@dataclass(frozen=True)
class NoiseLevels:
    """Run-to-run sd (log units) of each signal beyond its rounds' own spread, and where it comes from."""

    ratio_between_sd: float
    time_between_sd: float
    source: str

    @classmethod
    def uncalibrated(cls) -> "NoiseLevels":
        return cls(DEFAULT_BETWEEN_RUN_SD, DEFAULT_BETWEEN_RUN_SD,
                   f"not calibrated: prior run-to-run noise {DEFAULT_BETWEEN_RUN_SD:.1%}")


@dataclass(frozen=True)
class RunSamples:
    """One run of one test as per-round log samples, oriented so that larger means a slower engine."""

    reference: str | None
    ratio_cost: np.ndarray | None   # log(engine time / reference time) per round
    time_cost: np.ndarray | None    # log(engine ms per sample) per round

    @classmethod
    def from_extra_info(cls, info: dict, reference: str | None = None) -> "RunSamples":
        """From a stored benchmark's extra_info; `reference` forces which ratio to read."""
        ratios = info.get("ratios") or {}
        reference = reference or choose_reference({name: r.get("median", 0.0) for name, r in ratios.items()})
        ratio_cost = None
        rounds = (ratios.get(reference) or {}).get("per_round") if reference else None
        if rounds and all(isinstance(r, (int, float)) and r > 0 for r in rounds):
            ratio_cost = -np.log(np.asarray(rounds, dtype=np.float64))
        time_cost = None
        engine_ms, samples = info.get("engine_round_ms"), info.get("engine_samples_per_round")
        if engine_ms and samples and all(isinstance(t, (int, float)) and t > 0 for t in engine_ms):
            time_cost = np.log(np.asarray(engine_ms, dtype=np.float64) / samples)
        return cls(reference if ratio_cost is not None else None, ratio_cost, time_cost)


def choose_reference(medians: dict[str, float]) -> str | None:
    """torch_graph when measured, else the torch reference the engine is least ahead of, else none."""
    if PREFERRED_REFERENCE in medians:
        return PREFERRED_REFERENCE
    torch_refs = [name for name in medians if name.startswith("torch_")]
    return min(torch_refs, key=lambda name: medians[name]) if torch_refs else None


def run_sd(between_sd: float, samples: np.ndarray) -> float:
    """sd of this run's median around the test's long-run value: run-to-run noise plus its rounds' spread."""
    return math.sqrt(between_sd ** 2 + MEDIAN_VARIANCE_FACTOR * robust_sd(samples) ** 2 / len(samples))


@dataclass(frozen=True)
class SignalTest:
    """One signal of one comparison, in log units (positive shift = slower)."""

    name: str
    shift: float
    ci: tuple[float, float]
    p_slower: float
    p_faster: float
    min_effect: float
    rounds: tuple[int, int]        # (baseline, current)

    @classmethod
    def compare(cls, name: str, baseline: np.ndarray, current: np.ndarray, between_sd: float,
                alpha: float, floor: float) -> "SignalTest":
        shift, low, high = bootstrap_median_shift(baseline, current)
        noise = math.hypot(run_sd(between_sd, baseline), run_sd(between_sd, current))
        min_effect = max(math.log1p(floor), normal_quantile(1 - alpha) * noise)
        return cls(name, shift, (low, high), mann_whitney_less(baseline, current).p_value,
                   mann_whitney_less(current, baseline).p_value, min_effect, (len(baseline), len(current)))

    def slower(self, alpha: float) -> bool:
        return self.p_slower < alpha and self.shift > self.min_effect

    def faster(self, alpha: float) -> bool:
        return self.p_faster < alpha and -self.shift > self.min_effect

    def as_dict(self) -> dict:
        return {"signal": self.name, "slowdown": round(math.expm1(self.shift), 5),
                "ci95": [round(math.expm1(c), 5) for c in self.ci], "p_slower": float(f"{self.p_slower:.3g}"),
                "p_faster": float(f"{self.p_faster:.3g}"), "min_effect": round(math.expm1(self.min_effect), 5),
                "rounds": list(self.rounds)}

    def describe(self) -> str:
        low, high = (math.expm1(c) for c in self.ci)
        return (f"{math.expm1(self.shift):+.1%} (95% CI {low:+.1%}..{high:+.1%}), p={self.p_slower:.2g} "
                f"(Mann-Whitney U, {self.rounds[1]} vs {self.rounds[0]} rounds)")


@dataclass(frozen=True)
class Decision:
    """The verdict of one test against its baseline run, with everything the failure message needs."""

    verdict: str
    primary: SignalTest | None
    confirmation: SignalTest | None
    noise_source: str
    reason: str

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "noise": self.noise_source,
                "primary": self.primary.as_dict() if self.primary else None,
                "confirmation": self.confirmation.as_dict() if self.confirmation else None}

    def line(self, fullname: str, against: str) -> str:
        """One line in pytest-benchmark's failure style: `name (stored run) - what failed`."""
        return f"{fullname} ({against}) - {self.reason}"


def decide(current: RunSamples, baseline: RunSamples, noise: NoiseLevels, alpha: float = ALPHA,
           floor: float = MIN_EFFECT) -> Decision:
    """Regressed, improved or not significant: the rule of this module's docstring."""
    time_test = None
    if current.time_cost is not None and baseline.time_cost is not None:
        time_test = SignalTest.compare("engine time per sample", baseline.time_cost, current.time_cost,
                                       noise.time_between_sd, alpha, floor)
    if current.ratio_cost is not None and baseline.ratio_cost is not None and current.reference == baseline.reference:
        primary = SignalTest.compare(f"engine time / {current.reference} time", baseline.ratio_cost,
                                     current.ratio_cost, noise.ratio_between_sd, alpha, floor)
        confirmation = time_test
    elif time_test is not None:
        primary, confirmation = time_test, None
    else:
        return Decision(NOT_COMPARABLE, None, None, noise.source,
                        "no signal in common with the stored run (no shared reference ratio, no engine round times)")
    effect = f"min effect {math.expm1(primary.min_effect):.1%} ({noise.source})"
    if primary.slower(alpha):
        if confirmation is not None and not (confirmation.shift > 0 and confirmation.p_slower < alpha):
            return Decision(NOT_SIGNIFICANT, primary, confirmation, noise.source,
                            f"{primary.name} {primary.describe()}, but {confirmation.name} {confirmation.describe()} "
                            "did not rise: the reference or the machine moved, not the engine")
        confirmed = f"; {confirmation.name} {confirmation.describe()}" if confirmation else ""
        return Decision(REGRESSED, primary, confirmation, noise.source,
                        f"Field '{primary.name}' has failed RankTest+MinEffect: {primary.describe()} > {effect}"
                        f"{confirmed}")
    if primary.faster(alpha):
        return Decision(IMPROVED, primary, confirmation, noise.source,
                        f"{primary.name} {primary.describe()}: the engine got faster (p={primary.p_faster:.2g})")
    why = (f"not significant at p < {alpha}" if primary.p_slower >= alpha and primary.p_faster >= alpha
           else f"within the {effect}")
    return Decision(NOT_SIGNIFICANT, primary, confirmation, noise.source,
                    f"{primary.name} {primary.describe()}: {why}")


def detectable_slowdown(between_sd: float, round_sd: float, rounds: int, time_round_sd: float | None = None,
                        alpha: float = ALPHA, floor: float = MIN_EFFECT, power: float = GOAL_POWER) -> float:
    """Smallest slowdown (fraction) this rule catches with probability >= `power` at `rounds` rounds a side.

    Each criterion (the effect beyond the minimum, the rank test, the engine-time confirmation) must
    hold with probability >= 1 - (1 - power) / criteria, so that all hold together with >= `power`.
    """
    criteria = 2 if time_round_sd is None else 3
    each = 1 - (1 - power) / criteria
    diff_sd = math.sqrt(2 * (between_sd ** 2 + MEDIAN_VARIANCE_FACTOR * round_sd ** 2 / rounds))
    needs = [max(math.log1p(floor), normal_quantile(1 - alpha) * diff_sd) + normal_quantile(each) * diff_sd]
    needs += [rank_test_detectable_shift(sd, rounds, alpha, each)
              for sd in [round_sd] + ([time_round_sd] if time_round_sd is not None else [])]
    return math.expm1(max(needs))


def recommend_rounds(between_sd: float, round_sd: float, time_round_sd: float | None, min_rounds: int,
                     max_rounds: int, goal: float = GOAL_SLOWDOWN) -> tuple[int, float]:
    """Fewest rounds in [min_rounds, max_rounds] that catch `goal` at GOAL_POWER, and what they catch.

    When even `max_rounds` cannot (run-to-run noise does not shrink with rounds), `max_rounds` and
    its detectable slowdown.
    """
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {min_rounds}, {max_rounds}")
    criteria = 2 if time_round_sd is None else 3
    each = 1 - (1 - GOAL_POWER) / criteria
    shift = math.log1p(goal)
    for rounds in range(min_rounds, max_rounds + 1):
        diff_sd = math.sqrt(2 * (between_sd ** 2 + MEDIAN_VARIANCE_FACTOR * round_sd ** 2 / rounds))
        effect_ok = shift >= max(math.log1p(MIN_EFFECT), normal_quantile(1 - ALPHA) * diff_sd) \
            + normal_quantile(each) * diff_sd
        ranks_ok = all(sd <= 0 or rank_test_power(shift / sd, rounds, ALPHA) >= each
                       for sd in [round_sd] + ([time_round_sd] if time_round_sd is not None else []))
        if effect_ok and ranks_ok:
            return rounds, detectable_slowdown(between_sd, round_sd, rounds, time_round_sd)
    return max_rounds, detectable_slowdown(between_sd, round_sd, max_rounds, time_round_sd)
