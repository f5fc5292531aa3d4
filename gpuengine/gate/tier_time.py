"""How long the tier took: each perf test's wall time, per workload and in all, against the 10-minute goal.

The quick tier (`./gate perf`) is meant to stay within 10 minutes on one
H100 as the suite grows; tiers.py's `budget_s` only bounds the timed rounds,
while set-up (building the engine, torch.compile, capture, warm-up) comes on
top. So the gate measures the whole: every test's set-up, call and teardown,
summed per workload (tiers.py's `perf_workload` marker), with the session's
wall time. The run's stored JSON carries them (`extra_info["test_seconds"]`
per benchmark, `gpuengine_tier_time` for the run) and the terminal summary
says whether the quick tier kept its goal; on the CPU tier the figures are
this machine's, not the GPU's, and are labelled so.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import pytest

from . import tiers
from .plugin import GATE

QUICK_TIER_GOAL_S = 600.0   # the whole quick tier within 10 minutes on one H100: short enough for every merge


@dataclass
class TierClock:
    started: float
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))   # nodeid -> wall s
    workload_of: dict[str, str] = field(default_factory=dict)     # nodeid -> workload (perf tests only)
    budget_of: dict[str, float] = field(default_factory=dict)     # workload -> timed-round budget (s)

    def per_workload(self) -> dict[str, dict]:
        """workload -> {"tests", "seconds", "timed_rounds_budget_s"} for the perf tests that ran."""
        out: dict[str, dict] = {}
        for nodeid, workload in self.workload_of.items():
            entry = out.setdefault(workload, {"tests": 0, "seconds": 0.0,
                                               "timed_rounds_budget_s": self.budget_of[workload]})
            entry["tests"] += 1
            entry["seconds"] = round(entry["seconds"] + self.seconds[nodeid], 1)
        return dict(sorted(out.items()))


CLOCK = pytest.StashKey[TierClock]()


def _tier_of(config) -> tuple[bool, bool]:
    """(on a GPU, nightly tier) as the gate plugin settled them."""
    state = config.stash.get(GATE, None)
    return (bool(state and state.tier.on_gpu), bool(state and state.full))


def start_clock(session):
    session.config.stash[CLOCK] = TierClock(time.monotonic())


def add_test_time(item, started: float):
    """Set-up, call and teardown alike since `started`: a test's cost to the tier includes building and compiling."""
    clock = item.config.stash.get(CLOCK, None)
    if clock is None:
        return
    clock.seconds[item.nodeid] += time.monotonic() - started
    marker = item.get_closest_marker(tiers.WORKLOAD)
    if marker is not None:
        clock.workload_of[item.nodeid] = marker.args[0]
        clock.budget_of[marker.args[0]] = marker.kwargs["budget_s"]


def tier_record(config) -> dict | None:
    """What the stored run keeps of this tier's time (None before the session started)."""
    clock = config.stash.get(CLOCK, None)
    if clock is None:
        return None
    on_gpu, full = _tier_of(config)
    return {"tier": "full" if full else "quick", "on_gpu": on_gpu,
            "session_seconds": round(time.monotonic() - clock.started, 1), "per_workload": clock.per_workload(),
            "quick_tier_target_s": QUICK_TIER_GOAL_S}   # the key stored runs have always had


def record(config, output_json):
    """Each benchmark's own wall time, and the run's per-workload times, into the stored run."""
    record = tier_record(config)
    if record is None:
        return
    seconds = config.stash[CLOCK].seconds
    for bench in output_json.get("benchmarks", []):
        if bench.get("fullname") in seconds:
            bench.setdefault("extra_info", {})["test_seconds"] = round(seconds[bench["fullname"]], 1)
    output_json["gpuengine_tier_time"] = record


def terminal_summary(terminalreporter):
    record = tier_record(terminalreporter.config)
    if record is None or not record["per_workload"]:
        return
    terminalreporter.section("gpuengine tier time")
    for workload, entry in record["per_workload"].items():
        budget = entry["timed_rounds_budget_s"]
        terminalreporter.write_line(f"{workload:28} {entry['tests']:3} tests {entry['seconds']:8.1f} s"
                                    + (f"   (timed rounds budget {budget:g} s)" if budget else ""))
    elapsed = record["session_seconds"]
    line = f"{record['tier']} tier: {elapsed / 60:.1f} min in all"
    if not record["on_gpu"]:
        line += " (CPU tier: this machine's time, not a GPU's)"
    elif record["tier"] == "quick":
        verdict = "within" if elapsed <= QUICK_TIER_GOAL_S else "OVER"
        line += f", {verdict} the {QUICK_TIER_GOAL_S / 60:.0f}-minute goal of one GPU"
    terminalreporter.write_line(line)
