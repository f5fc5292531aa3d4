"""Same-run comparisons inside pytest-benchmark: the engine's rounds are the benchmark, references alternate with them.

`benchmark.pedantic` calls `setup()` then `target()` once per round: setup
times one round of every reference and target one round of the engine, so
runners alternate R1 R2 E R1 R2 E ... in one process (docs/architecture.md,
"Measuring honestly") while pytest-benchmark stores and compares the engine's
rounds. Both sides are timed by `benchmarking.time_round` (drain the device
before each clock read); an A/B pair's engines time their rounds in their own
workers the same way, the base's round in setup (gpuengine/gate/ab/sides.py). Every
round, here or in a worker, runs on the session's timing core (gpuengine/gate/ab/worker.py's
`timing_cpu`), so base, head and references are timed alike. With
benchmarks disabled (xdist, --benchmark-disable), pedantic would run a single
round, so the same alternation runs without it and ratios are still measured
and gated. Timing gates only on a GPU tier: a ratio below a claim that has
held, or a regression against the base (A/B, gpuengine/gate/rules/paired.py) or the
test's stored baseline run (gpuengine/gate/rules/regression.py), through
gpuengine/gate/plugin.py.
A ratio below a target not met yet is recorded and listed in the summary, and
fails the test only where the session says so (`--claims`, the nightly tier).
A reference that cannot run here (`ReferenceUnavailable`: no CUDA, no
torchvision, Inductor's step not capturable for the workload) is left out by
`ready_references`, its reason kept in the run and listed in the summary: one
such reference does not fail the test.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pytest

from gpuengine.bench.benchmarking import Comparison, Runner, time_round
from gpuengine.bench.machine_info import Tier
from gpuengine.bench.thresholds import CLAIM, TARGET, RatioCheck, ThresholdRule, evaluate_ratios
from gpuengine.reference import ReferenceUnavailable

from .ab.worker import on_cpu

UNAVAILABLE = "references_unavailable"   # extra_info: {reference: why it could not run here}
# The words of the gate's timing failures (record_and_gate): a test failed by these alone was measured, and its
# verdict stands (./gate bisect tells such a failure from a broken test by them).
CLAIM_MISSED, TARGETS_MISSED, REGRESSION = ("engine below a claim that has held", "targets not met yet",
                                            "Performance has regressed")
TIMING_FAILURES = (CLAIM_MISSED, TARGETS_MISSED, REGRESSION)


class TargetsMissed(pytest.fail.Exception):
    """A perf test's failure whose only shortfalls are targets not met yet (with --claims): the gate plugin
    still saves such a run as a baseline, since nothing regressed and every claim held."""

    __module__ = "builtins"   # as pytest's own outcomes: reports say "TargetsMissed: ...", not a module path


class TargetShortfall(str):
    """A gate failure message about targets not met only (what a test defers; see fail_with)."""


def fail_with(failures: list[str]):
    """Fail the test with every gate failure; as TargetsMissed when all of them are target shortfalls."""
    message = "\n".join(failures)
    if all(isinstance(failure, TargetShortfall) for failure in failures):
        raise TargetsMissed(message, pytrace=False)
    pytest.fail(message, pytrace=False)


@dataclass(frozen=True)
class MissedTarget:
    test: str
    gpu: str
    check: RatioCheck

    def describe(self) -> str:
        """'<test> vs torch_graph on <GPU>: target 1.25x, measured 1.11x: not met'."""
        return f"{self.test} vs {self.check.against} on {self.gpu}: {self.check.verdict()}"


@dataclass
class Targets:
    """A session's policy on targets not met yet, and the ones it met: the gate plugin keeps one per session
    (gpuengine/gate/plugin.py, the `gate_targets` fixture) and lists them in the terminal summary."""

    fail: bool = False   # --claims (or the nightly tier): a missed target fails its test like a missed claim
    missed: list[MissedTarget] = field(default_factory=list)


def ready_references(benchmark, builds: dict[str, Callable[[], Runner]]) -> list[Runner]:
    """The references of `builds` (name -> build()) that build and prepare here (warm-up, compilation, capture),
    prepared, in order. One raising ReferenceUnavailable is left out, its reason kept in extra_info[UNAVAILABLE]
    (the comparison settles torch_graph_best with it; the summary lists it); any other error fails the test."""
    ready = []
    for name, build in builds.items():
        try:
            runner = build()
            runner.prepare()
        except ReferenceUnavailable as exc:
            benchmark.extra_info.setdefault(UNAVAILABLE, {})[name] = str(exc)
            continue
        if runner.name != name:
            raise ValueError(f"the reference built as {name!r} is named {runner.name!r}")
        ready.append(runner)
    return ready


def unavailable_references(benchmark) -> dict[str, str]:
    """{reference: why} for the references ready_references left out of this test."""
    return dict(benchmark.extra_info.get(UNAVAILABLE) or {})


def sides(engine) -> list:
    """The engine runners one test times: the engine, or the base's and the head's of an A/B pair
    (gpuengine/gate/ab/sides.py), base first."""
    return list(engine.sides) if hasattr(engine, "sides") else [engine]


def round_ms(runner: Runner, cpu: int | None = None) -> float:
    """One timed round: a worker's engine times itself (no pipe inside its clock, on the same core), the rest here
    on core `cpu` (the session's timing core; None: wherever the scheduler puts it)."""
    timed_round = getattr(runner, "timed_round", None)
    if timed_round is not None:
        return timed_round()
    with on_cpu(cpu):
        return time_round(runner)


def _prepare(engine, references: Sequence[Runner]):
    names = [runner.name for runner in (*sides(engine), *references)]
    if len(set(names)) != len(names):
        raise ValueError(f"runner names must be unique, got {names}")
    for runner in (engine, *references):   # a pair prepares both sides, the base first
        runner.prepare()


def warm_up(engine, references: Sequence[Runner], warmup_rounds: int, timing_cpu: int | None = None) -> float | None:
    """Warm-up rounds, references then engine, not recorded; returns the median ms of one round of all
    runners (what a timed round will cost: the rounds budget needs it), None without warm-up rounds."""
    if warmup_rounds < 0:
        raise ValueError(f"warmup_rounds={warmup_rounds}: need warmup_rounds >= 0")
    _prepare(engine, references)
    sets = [sum(round_ms(runner, timing_cpu) for runner in (*references, *sides(engine)))
            for _ in range(warmup_rounds)]
    return float(np.median(sets)) if sets else None


def alternate_rounds(benchmark, engine, references: Sequence[Runner], rounds: int,
                     warmup_rounds: int, timing_cpu: int | None = None) -> dict[str, list[float]]:
    """Per-runner round times in ms after warm-up; the engine's rounds are also pytest-benchmark's. The rounds
    timed here run on core `timing_cpu`, as an A/B pair's workers time theirs.

    An A/B pair's base runs in the setup of each round, before the references in even rounds and after
    them in odd ones, so the head is preceded by the base half the time and by a reference the other half.
    """
    if rounds < 1 or warmup_rounds < 0:
        raise ValueError(f"rounds={rounds}, warmup_rounds={warmup_rounds}: need rounds >= 1, warmup_rounds >= 0")
    _prepare(engine, references)
    *others, head = sides(engine)
    times: dict[str, list[float]] = {runner.name: [] for runner in (*others, head, *references)}
    done = [0]

    def setup_round():
        order = [*others, *references] if done[0] % 2 == 0 else [*references, *others]
        done[0] += 1
        for runner in order:
            times[runner.name].append(round_ms(runner, timing_cpu))

    def engine_round():
        times[head.name].append(round_ms(head, timing_cpu))

    if benchmark.disabled:
        for _ in range(warmup_rounds + rounds):
            setup_round()
            engine_round()
    else:
        benchmark.pedantic(engine_round, setup=setup_round, rounds=rounds, warmup_rounds=warmup_rounds,
                           iterations=1)
    return {name: ms[warmup_rounds:] for name, ms in times.items()}


def record_and_gate(benchmark, comparison: Comparison, test_name: str, precision: str, tier: Tier,
                    rules: list[ThresholdRule] | None = None, gate_test=None, defer_to: list | None = None,
                    targets: Targets | None = None) -> list[RatioCheck]:
    """Store the comparison with the run; on a GPU tier, fail the test on a missed claim or, with `gate_test`
    (gpuengine/gate/plugin.py), on a regression against its stored baseline run. A missed target is noted in
    `targets` (the session's, for its summary) and fails the test only where `targets.fail` (--claims).
    With `defer_to` the failures are appended there instead, for the test to fail once its own checks (loss
    descent) have run (fail_with). Returns the thresholds missed, claims and targets."""
    checks = evaluate_ratios(comparison, tier.gpu_label, test_name, rules)
    missed = [check for check in checks if not check.passed]
    benchmark.extra_info.update(comparison.extra_info())
    benchmark.extra_info.update({
        "tier": tier.name,
        "precision": precision,
        "timing_gated": tier.on_gpu,
        "ratio_checks": [check.as_dict() for check in checks],   # each with its kind, a miss with passed false
    })
    failures = []
    claims = [check for check in missed if check.kind == CLAIM]
    if claims:
        lines = "\n  ".join(check.describe() for check in claims)
        failures.append(f"{test_name} on {tier.gpu_label}: {CLAIM_MISSED} (same-run ratio):\n"
                        f"  {lines}")
    goals = [check for check in missed if check.kind == TARGET]
    if goals and tier.on_gpu and targets is not None:
        targets.missed += [MissedTarget(test_name, tier.gpu_label, check) for check in goals]
        if targets.fail:
            lines = "\n  ".join(f"{check.against}: {check.verdict()} ({check.why})" for check in goals)
            failures.append(TargetShortfall(f"{test_name} on {tier.gpu_label}: {TARGETS_MISSED}, which fail "
                                            f"with --claims:\n  {lines}"))
    outcome = gate_test.check(benchmark.extra_info) if gate_test is not None else None
    if outcome is not None:
        benchmark.extra_info["stored_run_check"] = outcome.record
        if outcome.failure:
            failures.append(f"{REGRESSION}:\n\t{outcome.failure}")
    if failures and tier.on_gpu:
        if defer_to is None:
            fail_with(failures)
        defer_to.extend(failures)
    return missed


def skip_unless_selected(run_settings, **case):
    """Skip a perf case that the run's chosen toggles exclude (tox matrix envs, --gpuengine-* options).

    Perf cases are sized for the visible hardware, so a run that forces the other device skips them too.
    """
    from gpuengine.runtime.backend import gpu_visible
    if run_settings.tier.on_gpu != gpu_visible():
        pytest.skip("perf cases are sized for the visible hardware; this run forces "
                    f"device={run_settings.config.device}")
    for toggle, value in case.items():
        chosen = getattr(run_settings.config, toggle)
        if toggle in run_settings.chosen and chosen != value:
            pytest.skip(f"this run fixes {toggle}={chosen}; the case measures {toggle}={value}")


def epoch_loss(runner) -> float:
    """Train one more round and read the mean loss of its last epoch (outside timing)."""
    if hasattr(runner, "train"):   # the engine (here or in a worker) reads its device loss history through train()
        return runner.train(runner.epochs_per_round)[-1]
    runner.run_round()
    runner.synchronize()
    return runner.last_epoch_loss()


def assert_losses_descend(benchmark, first: dict, last: dict):
    """Record the losses around the timed rounds; every side must have trained."""
    benchmark.extra_info["loss_before"] = first
    benchmark.extra_info["loss_after"] = last
    for name in first:
        assert np.isfinite(last[name]) and last[name] < first[name], \
            f"{name}: loss {first[name]} -> {last[name]} did not descend"

