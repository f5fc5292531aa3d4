"""Replay choice rules on the stored plan-stability records: how alike two fresh autotunings would choose, and
at what cost.

    python3 scripts/plan_rules.py [baselines_store/<gpu>/plan_stability]

Each record (`./gate plans`) keeps, for two processes that autotuned afresh, every way timed for every choice
in the heuristic's order. A rule maps one process's timings to a choice; the table gives, pooled over the
records, the share of choices both processes would make alike, and the cost: each process's choices as the *other*
process timed them, summed, over the fastest ways' time there (the other's timings, so a choice is not
judged by the noise that picked it). Rules:

  margin M          one margin between all ways: the first in the heuristic's order within M of the fastest
  engine E knobs K  autotune.choose: the engine first (autotune.engine_of: eng12 of eng12_k2=4_k3=0, a GEMM's
                    algorithm id; each standing for its fastest variant) at E, then that engine's variants at K;
                    the rule in force at E = MIN_MARGIN, K = KNOB_MARGIN
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuengine.ops.autotune import KNOB_MARGIN, MIN_MARGIN, choose  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "baselines_store" / "nvidia-h100-80gb-hbm3" / "plan_stability"


def by_margin(margin: float, knob_margin: float | None = None):
    """autotune.choose at `margin` (and `knob_margin` between one engine's variants; None: one margin for all)."""
    def rule(ways: list[tuple[str, float]]) -> str:
        return choose([w for w, _ in ways], {w: SimpleNamespace(ms=ms) for w, ms in ways}, min_margin=margin,
                      knob_margin=knob_margin)
    rule.name = f"margin {margin:.0%}" if knob_margin is None else f"engine {margin:.0%} knobs {knob_margin:.0%}"
    return rule


def pairs(folder: Path):
    """(first process's ways, second's) per choice timed in both, from every record with two runs."""
    for path in sorted(folder.glob("*.json")):
        runs = json.loads(path.read_text()).get("runs", [])
        if len(runs) != 2:
            continue
        for case, first in runs[0]["cases"].items():
            second = runs[1]["cases"].get(case, {}).get("timed", {})
            for key, ways in first.get("timed", {}).items():
                if key in second:
                    yield path.name, [(w, ms) for w, ms, _ in ways], [(w, ms) for w, ms, _ in second[key]]


def score(rule, choices) -> tuple[int, float]:
    """Choices alike, and the chosen ways' summed time over the fastest ways' (docs/gate.md's column)."""
    alike, chosen_ms, fastest_ms = 0, 0.0, 0.0
    for _, first, second in choices:
        a, b = rule(first), rule(second)
        alike += a == b
        for pick, other in ((a, dict(second)), (b, dict(first))):
            if pick in other:   # pruned by the other process's first estimate: over twice its fastest
                chosen_ms += other[pick]
                fastest_ms += min(other.values())
    return alike, chosen_ms / fastest_ms - 1


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else DEFAULT
    choices = list(pairs(folder))
    if not choices:
        print(f"plan_rules: no record with two runs' timings in {folder}", file=sys.stderr)
        return 2
    records = sorted({name for name, _, _ in choices})
    print(f"{len(choices)} choices from {len(records)} records: {', '.join(records)}")
    rules = [by_margin(m) for m in (0.0, MIN_MARGIN, 0.03, 0.05, 0.08)]
    rules += [by_margin(e, k) for e in (0.01, MIN_MARGIN, 0.03) for k in (MIN_MARGIN, KNOB_MARGIN, 0.08)]
    print(f"{'rule':<22} {'alike':>9} {'share':>7} {'cost':>7}   per record")
    for rule in rules:
        alike, cost = score(rule, choices)
        each = [score(rule, [c for c in choices if c[0] == name])[0] for name in records]
        per = ", ".join(f"{n}/{sum(c[0] == name for c in choices)}" for n, name in zip(each, records))
        print(f"{rule.name:<22} {alike:>4}/{len(choices):<4} {alike / len(choices):>7.1%} {cost:>7.2%}   {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
