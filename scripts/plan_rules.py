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

A second table replays caps on the runtime-compiled cuDNN candidates a graph builds (ops/cudnn.py's
RUNTIME_COMPILED_CANDIDATES; each costs about a quarter of a second or more to build, the others a
fraction of a millisecond), from the records that mark them: the rule in force on the first N of them in
the heuristic's order, the choices alike between the two processes, the choices that change against the
record's candidates, the build seconds the first processes save, and the chosen plans' summed time over
that of the choices without the cap (each process's own timings).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

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


class Choice(NamedTuple):
    record: str
    first: list[tuple[str, float]]    # the first process's ways and times, in the heuristic's order
    second: list[tuple[str, float]]
    compiled: list[str] | None        # a cuDNN graph's runtime-compiled candidates in order (None: not recorded)
    build_ms: dict[str, float]        # the first process's build time of each candidate


def pairs(folder: Path):
    """Each choice timed in both processes of every record with two runs."""
    for path in sorted(folder.glob("*.json")):
        runs = json.loads(path.read_text()).get("runs", [])
        if len(runs) != 2:
            continue
        for case, first in runs[0]["cases"].items():
            second = runs[1]["cases"].get(case, {}).get("timed", {})
            graphs = first.get("cudnn_graphs", {})
            for key, ways in first.get("timed", {}).items():
                if key not in second:
                    continue
                graph = graphs.get(key, {})
                compiled = ([name for name, flag in zip(graph["offered"], graph["compiled"]) if flag]
                            if "compiled" in graph else None)
                build_ms = {name: ms or 0.0 for name, ms in zip(graph.get("offered", []), graph.get("build_ms", []))}
                yield Choice(path.name, [(w, ms) for w, ms, _ in ways], [(w, ms) for w, ms, _ in second[key]],
                             compiled, build_ms)


def score(rule, choices) -> tuple[int, float]:
    """Choices alike, and the chosen ways' summed time over the fastest ways' (docs/gate.md's column)."""
    alike, chosen_ms, fastest_ms = 0, 0.0, 0.0
    for choice in choices:
        a, b = rule(choice.first), rule(choice.second)
        alike += a == b
        for pick, other in ((a, dict(choice.second)), (b, dict(choice.first))):
            if pick in other:   # pruned by the other process's first estimate: over twice its fastest
                chosen_ms += other[pick]
                fastest_ms += min(other.values())
    return alike, chosen_ms / fastest_ms - 1


def capped(ways: list, compiled: list[str], cap: int) -> list:
    """`ways` without the runtime-compiled candidates past the first `cap`."""
    dropped = set(compiled[cap:])
    return [(way, ms) for way, ms in ways if way not in dropped]


def compiled_caps(choices, caps=(2, 3, 4, 6, 8)):
    """Per cap: (cap, alike, graphs, changed, build seconds saved, chosen time over the uncapped choices')."""
    known = [c for c in choices if c.compiled is not None]
    rule = by_margin(MIN_MARGIN, KNOB_MARGIN)
    processes = [(c, ways, dict(ways), rule(ways)) for c in known for ways in (c.first, c.second)]
    full_ms = sum(times[full] for _, _, times, full in processes)
    for cap in caps:
        picks = [rule(capped(ways, c.compiled, cap)) for c, ways, _, _ in processes]
        alike = sum(a == b for a, b in zip(picks[::2], picks[1::2]))   # a choice's two processes lie side by side
        changed = sum(pick != full for pick, (_, _, _, full) in zip(picks, processes))
        capped_ms = sum(times[pick] for pick, (_, _, times, _) in zip(picks, processes))
        saved_ms = sum(c.build_ms.get(name, 0.0) for c in known for name in c.compiled[cap:])
        yield cap, alike, len(known), changed, saved_ms / 1e3, capped_ms / full_ms - 1 if full_ms else 0.0


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else DEFAULT
    choices = list(pairs(folder))
    if not choices:
        print(f"plan_rules: no record with two runs' timings in {folder}", file=sys.stderr)
        return 2
    records = sorted({c.record for c in choices})
    print(f"{len(choices)} choices from {len(records)} records: {', '.join(records)}")
    rules = [by_margin(m) for m in (0.0, MIN_MARGIN, 0.03, 0.05, 0.08)]
    rules += [by_margin(e, k) for e in (0.01, MIN_MARGIN, 0.03) for k in (MIN_MARGIN, KNOB_MARGIN, 0.08)]
    print(f"{'rule':<22} {'alike':>9} {'share':>7} {'cost':>7}   per record")
    for rule in rules:
        alike, cost = score(rule, choices)
        each = [score(rule, [c for c in choices if c.record == name])[0] for name in records]
        per = ", ".join(f"{n}/{sum(c.record == name for c in choices)}" for n, name in zip(each, records))
        print(f"{rule.name:<22} {alike:>4}/{len(choices):<4} {alike / len(choices):>7.1%} {cost:>7.2%}   {per}")
    caps = list(compiled_caps(choices))
    if caps and caps[0][2]:
        marked = sorted({c.record for c in choices if c.compiled is not None})
        built_s = sum(c.build_ms.get(name, 0.0) for c in choices if c.compiled for name in c.compiled) / 1e3
        print(f"\nruntime-compiled candidates capped, the rule in force ({caps[0][2]} cuDNN graphs from "
              f"{', '.join(marked)}; their first processes built them in {built_s:.1f} s):")
        print(f"{'cap':<6} {'alike':>9} {'changed':>8} {'build saved':>12} {'chosen time':>12}")
        for cap, alike, graphs, changed, saved_s, slower in caps:
            print(f"{cap:<6} {alike:>4}/{graphs:<4} {changed:>8} {saved_s:>10.1f} s {slower:>+12.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
