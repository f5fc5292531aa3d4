"""Replay choice rules on the stored plan-stability records: how alike two fresh autotunings would choose, and
at what cost.

    python3 scripts/plan_rules.py [baselines_store/<gpu>/plan_stability]

Each record (`./gate plans`) keeps, for two processes that autotuned afresh, every way timed for every choice
in the heuristic's order. A rule maps one process's timings to a choice; the table gives, pooled over the
records, the share of choices both processes would make alike, and the cost: each process's choices as the *other*
process timed them, summed, over the fastest ways' time there (the other's timings, so a choice is not
judged by the noise that picked it). Rules:

  margin M        autotune.choose: the first way in the heuristic's order within M of the fastest (the engine's
                  rule at M = autotune.MIN_MARGIN)
  engine E knobs K  the engine first, then its knobs: each cuDNN engine (eng12 of eng12_k2=4_k3=0) stands for its
                  fastest variant and the engines are chosen by `choose` at E; then that engine's variants by
                  `choose` at K. Variants of one engine lie close and swap places between processes; engines
                  do not (GEMM algorithms and depthwise ways have no knobs: each is its own engine)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuengine.ops.autotune import MIN_MARGIN, choose  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "baselines_store" / "nvidia-h100-80gb-hbm3" / "plan_stability"


def engine(way: str) -> str:
    """A cuDNN plan's engine (eng12 of eng12_k2=4_k3=0); any other way (a GEMM algorithm, a depthwise way) is its
    own."""
    match = re.match(r"(eng\d+)_k", way)
    return match.group(1) if match else way


def by_margin(margin: float):
    def rule(ways: list[tuple[str, float]]) -> str:
        return choose([w for w, _ in ways], {w: SimpleNamespace(ms=ms) for w, ms in ways}, min_margin=margin)
    rule.name = f"margin {margin:.0%}"
    return rule


def by_engine(engine_margin: float, knob_margin: float):
    def rule(ways: list[tuple[str, float]]) -> str:
        fastest: dict[str, float] = {}
        for way, ms in ways:   # in the heuristic's order: an engine ranks where its first variant does
            fastest[engine(way)] = min(ms, fastest.get(engine(way), ms))
        chosen = by_margin(engine_margin)(list(fastest.items()))
        return by_margin(knob_margin)([(w, ms) for w, ms in ways if engine(w) == chosen])
    rule.name = f"engine {engine_margin:.0%} knobs {knob_margin:.0%}"
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
    rules += [by_engine(e, k) for e in (0.01, MIN_MARGIN, 0.03) for k in (MIN_MARGIN, 0.05, 0.08)]
    print(f"{'rule':<22} {'alike':>9} {'share':>7} {'cost':>7}   per record")
    for rule in rules:
        alike, cost = score(rule, choices)
        each = [score(rule, [c for c in choices if c[0] == name])[0] for name in records]
        per = ", ".join(f"{n}/{sum(c[0] == name for c in choices)}" for n, name in zip(each, records))
        print(f"{rule.name:<22} {alike:>4}/{len(choices):<4} {alike / len(choices):>7.1%} {cost:>7.2%}   {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
