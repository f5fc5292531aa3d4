"""The A/B regression rule: did the head's engine run slower than the base's, round by round in one session?

`./gate perf --against REV` times the engine of the base commit and the
engine of the working tree ("head") in one session, each in its own process,
their rounds back to back (gpuengine/gate/ab/sides.py). Per round i the signal is
d_i = log(head time per sample / base time per sample): the machine, clocks,
driver and thermal state are the same for both, only the code differs.

Model: d_i = delta + (b_head - b_base) + e_i, where b is a process's own
offset (memory placement, which kernels a timing-based choice picked) and e_i
the round's noise. The median of the d_i then varies around delta with
variance 2 sd_process^2 + pi/2 sd_round^2 / n. A test regressed when

- the median slowdown exceeds the bar, max(MIN_EFFECT, z(1 - ALPHA) x that
  sd), where sd_process is learned from A/A runs of this mode (a commit
  against itself; noise.json's `ab_process_sd`), a prior before that; and
- a one-sided Wilcoxon signed-rank test says the head is slower, p < RANK_ALPHA.

ALPHA is per test and small (0.1%) because a quick tier runs about forty
tests and the whole tier must be green on an unchanged engine at least 95% of
the time; the bar carries that. The rank test only keeps a few odd rounds
from deciding, so its level is looser (5%): at 0.01, 7 rounds would all have
to be slower, and one stray round let a 5% slowdown through (H100 A/B study
at 51993c7: 90-93% caught at 5%). The signed-rank test and the median's
interval are checked against scipy.stats (correctness_tests/gate/
test_statistics_vs_scipy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .significance import MEDIAN_VARIANCE_FACTOR, normal_quantile, robust_sd
from .verdicts import IMPROVED, MIN_EFFECT, NOT_SIGNIFICANT, REGRESSED

ALPHA = 0.001           # per test: ~40 tests stay green together >= 95% of the time
RANK_ALPHA = 0.05       # the signed-rank test's level: with 7 rounds, one small stray round may disagree
DEFAULT_PROCESS_SD = 0.005   # prior per-process offset before any A/A run: half the stored-run prior
MIN_ROUNDS = 7          # fewest paired rounds: the median of fewer is loose, and the rank test could allow no stray
PREFERRED_ROUNDS = (11, 21)   # with 11 one stray round of the largest rank still leaves p < 0.05, with 21 three
PREFERRED_ROUNDS_MS = 2000    # rounds beyond 11 only while a test's paired rounds stay within this time
INTERVAL = 0.95



def preferred_rounds(round_set_ms: float | None) -> int:
    """The rounds an A/B test asks for: 11, and up to 21 while they cost at most PREFERRED_ROUNDS_MS.

    H100 studies at 7 rounds lost 5-13% of the 5% and 10% slowdowns to one stray round (a 2-8 ms stall in a
    2-7 ms round); cheap rounds buy tolerance for several, dear ones (ResNet, the zoo) keep the fewest."""
    low, high = PREFERRED_ROUNDS
    if not round_set_ms or round_set_ms <= 0:
        return low
    return int(min(high, max(low, PREFERRED_ROUNDS_MS // round_set_ms)))


def signed_rank_p_greater(d: Sequence[float]) -> float:
    """Exact one-sided p of the Wilcoxon signed-rank test that the d_i lie above zero (zeros dropped;
    tied magnitudes get their average rank, the exact null distribution counted over doubled ranks)."""
    d = np.asarray(d, dtype=np.float64)
    if not np.isfinite(d).all():
        raise ValueError("the signed-rank test got a non-finite value")
    d = d[d != 0]
    n = len(d)
    if n == 0:
        return 1.0
    magnitudes = np.abs(d)
    order = np.argsort(magnitudes, kind="stable")
    ranks = np.empty(n)
    sorted_mag = magnitudes[order]
    i = 0
    while i < n:   # average ranks over ties
        j = i
        while j + 1 < n and sorted_mag[j + 1] == sorted_mag[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    doubled = np.rint(ranks * 2).astype(int)
    observed = int(doubled[d > 0].sum())
    counts = np.zeros(int(doubled.sum()) + 1)   # ways each rank sum arises with random signs
    counts[0] = 1.0
    for r in doubled:
        counts[r:] += counts[:-r].copy()   # each rank joins the positive sum or not
    return float(counts[observed:].sum() / counts.sum())


def median_interval(d: Sequence[float], level: float = INTERVAL) -> tuple[float, float]:
    """Distribution-free interval of the median: order statistics k and n+1-k, with k the largest that
    keeps the binomial tails below (1 - level) / 2 each (the whole range where n is too small for that)."""
    values = np.sort(np.asarray(d, dtype=np.float64))
    n = len(values)
    if n == 0:
        raise ValueError("no rounds")
    tail = (1 - level) / 2
    k, cumulative = 0, 0.0
    while k < n // 2:
        cumulative += math.comb(n, k) / 2 ** n
        if cumulative > tail:
            break
        k += 1
    k = max(k, 1)
    return float(values[k - 1]), float(values[n - k])


@dataclass(frozen=True)
class PairedDecision:
    """One test's verdict, head against base, with everything its failure line needs."""

    verdict: str
    slowdown: float                   # median head/base - 1 (negative: the head is faster)
    interval: tuple[float, float]     # of the slowdown, INTERVAL two-sided
    p_slower: float
    p_faster: float
    bar: float                        # the slowdown the median must exceed to fail
    rounds: int
    noise_source: str
    catches: float                    # the slowdown this session's noise lets the rule catch 95% of the time

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "slowdown": round(self.slowdown, 5),
                "interval": [round(x, 5) for x in self.interval], "p_slower": float(f"{self.p_slower:.3g}"),
                "p_faster": float(f"{self.p_faster:.3g}"), "bar": round(self.bar, 5), "rounds": self.rounds,
                "noise": self.noise_source, "catches_95pct": round(self.catches, 5)}

    def line(self, fullname: str, against: str) -> str:
        return f"{fullname} ({against}) - {self.describe()}"

    def describe(self) -> str:
        low, high = self.interval
        # the p of the side the median leans to: an improvement's p of "slower" is near 1 and says nothing
        side, p = ("faster", self.p_faster) if self.slowdown < 0 else ("slower", self.p_slower)
        return (f"head {self.slowdown:+.1%} vs base (95% CI {low:+.1%}..{high:+.1%}, signed-rank p({side})={p:.2g}, "
                f"{self.rounds} paired rounds), bar {self.bar:.1%}, catches {self.catches:.1%} ({self.noise_source})")


def decide_paired(head_ms: Sequence[float], base_ms: Sequence[float], *, head_samples: int = 1,
                  base_samples: int = 1, process_sd: float | None = None, source: str | None = None,
                  alpha: float = ALPHA, rank_alpha: float = RANK_ALPHA, floor: float = MIN_EFFECT) -> PairedDecision:
    """The rule of this module's docstring on rounds paired in order (round i of each side timed back to back)."""
    head = np.asarray(head_ms, dtype=np.float64)
    base = np.asarray(base_ms, dtype=np.float64)
    if len(head) != len(base) or len(head) == 0:
        raise ValueError(f"paired rounds: need the same non-zero number a side, got {len(head)} and {len(base)}")
    if not (np.isfinite(head).all() and np.isfinite(base).all()) or min(head.min(), base.min()) <= 0:
        raise ValueError("a round took no measurable time (or was not finite): make rounds longer")
    if process_sd is None:
        process_sd = DEFAULT_PROCESS_SD
        source = source or f"A/A not calibrated: prior process offset {DEFAULT_PROCESS_SD:.1%}"
    d = np.log(head / head_samples) - np.log(base / base_samples)
    n = len(d)
    sd = math.sqrt(2 * process_sd ** 2 + MEDIAN_VARIANCE_FACTOR * robust_sd(d) ** 2 / n)
    bar = max(math.log1p(floor), normal_quantile(1 - alpha) * sd)
    median = float(np.median(d))
    p_slower, p_faster = signed_rank_p_greater(d), signed_rank_p_greater(-d)
    low, high = median_interval(d)
    if median > bar and p_slower < rank_alpha:
        verdict = REGRESSED
    elif -median > bar and p_faster < rank_alpha:
        verdict = IMPROVED
    else:
        verdict = NOT_SIGNIFICANT
    return PairedDecision(verdict, math.expm1(median), (math.expm1(low), math.expm1(high)), p_slower, p_faster,
                          math.expm1(bar), n, source or f"A/A noise: process offset {process_sd:.2%}",
                          detectable_slowdown(process_sd, robust_sd(d), n, alpha=alpha, floor=floor))


def power_summary(catches: dict[str, float], levels: tuple[float, ...] = (0.05, 0.10)) -> list[str]:
    """The A/B tests' power at this session's noise, in lines: how many would catch each slowdown 95% of
    the time (the rule's normal model), and the ones that would not."""
    if not catches:
        return []
    lines = []
    for level in levels:
        missed = sorted((value, name) for name, value in catches.items() if value > level)
        lines.append(f"a {level:.0%} slowdown: caught 95% of the time by {len(catches) - len(missed)} of "
                     f"{len(catches)} A/B tests at this session's noise")
        lines += [f"    not by {name}: catches {value:.1%}" for value, name in missed if level == levels[-1]]
    return lines


def detectable_slowdown(process_sd: float, round_sd: float, rounds: int, power: float = 0.95,
                        alpha: float = ALPHA, floor: float = MIN_EFFECT) -> float:
    """Smallest slowdown the rule catches with probability >= `power` (normal model; the rank test is
    taken as passed, which it is whenever the slowdown exceeds a few round sds)."""
    sd = math.sqrt(2 * process_sd ** 2 + MEDIAN_VARIANCE_FACTOR * round_sd ** 2 / rounds)
    bar = max(math.log1p(floor), normal_quantile(1 - alpha) * sd)
    return math.expm1(bar + normal_quantile(power) * sd)
