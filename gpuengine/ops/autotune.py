"""Autotune and pin: time the ways of computing one thing on live buffers, keep the fastest, remember the choice.

Two callers: every cuDNN graph times its candidate plans (ops/cudnn.py), and
`FasterOf` times whole implementations of one op against each other (a
depthwise convolution by cuDNN or by direct kernels). Both time in
interleaved passes, each way keeping its fastest pass, and never inside
CUDA-graph capture (a choice timed there would time nothing and be kept for
good).

`PLAN_CHOICES` carries choices between processes for whoever sets it (the
perf gate keeps them with its baselines): a key with a preset takes that
choice without timing, the others are timed and recorded. Two fresh
autotunings of ResNet-50 kept different cuDNN plans for 53 of 96 graphs, so
without pinning, separate runs of an unchanged engine differ by plan luck.
Empty by default: everything is timed afresh.
"""
from __future__ import annotations

TIMING_REPEATS = 5   # executions per timing, and
TIMING_PASSES = 3    # interleaved passes over the ways; a way's time is its fastest pass


def key_text(key: tuple) -> str:
    """A choice's key as stable text (its parts are numbers, strings, tuples and frozen dataclasses)."""
    return repr(key)


class PlanChoices:
    """Chosen ways by key: `preset` ones from an earlier process, `tuned` ones timed now."""

    def __init__(self, preset: dict[str, str] | None = None):
        self.preset = dict(preset or {})
        self.tuned: dict[str, dict] = {}   # key text -> {"plan": name, "ms": time} timed in this process

    def preset_for(self, key: tuple) -> str | None:
        return self.preset.get(key_text(key))

    def record(self, key: tuple, plan_name: str, ms: float):
        if self.preset.get(key_text(key)) != plan_name:
            self.tuned[key_text(key)] = {"plan": plan_name, "ms": round(ms, 5)}


PLAN_CHOICES = PlanChoices()


def use_plan_choices(preset: dict[str, str]) -> PlanChoices:
    """Choices made from now on start from `preset`; returns the new choices (what gets timed lands there)."""
    global PLAN_CHOICES
    PLAN_CHOICES = PlanChoices(preset)
    return PLAN_CHOICES


def refuse_capture(stream, what: str):
    if stream.is_capturing():
        raise RuntimeError(f"{what} first ran inside CUDA-graph capture: run it eagerly once first "
                           "(the trainer's and predictor's warm-up do)")


def time_interleaved(xp, stream, ways: dict) -> dict:
    """Milliseconds per run of each way (name -> callable), its fastest of TIMING_PASSES interleaved passes."""
    start, stop = xp.cuda.Event(), xp.cuda.Event()
    times: dict = {name: [] for name in ways}
    for _ in range(TIMING_PASSES):
        for name, run in ways.items():
            start.record(stream)
            for _ in range(TIMING_REPEATS):
                run()
            stop.record(stream)
            stop.synchronize()
            times[name].append(xp.cuda.get_elapsed_time(start, stop) / TIMING_REPEATS)
    return {name: min(ms) for name, ms in times.items()}


class FasterOf:
    """Ways of computing the same outputs; the first eager run times each on the live buffers, keeps the fastest.

    `key` names the choice in PLAN_CHOICES: a preset there is taken without timing, and a choice made here is
    recorded, so the gate runs the same kernels from run to run as it runs the same cuDNN plans.
    """

    def __init__(self, backend, key: tuple, ways: dict):
        self.backend, self.key = backend, key
        self.ways = {name: run for name, run in ways.items() if run is not None}
        if not self.ways:
            raise ValueError(f"{key}: no way to run it")
        self.chosen = next(iter(self.ways)) if len(self.ways) == 1 else None
        self.times_ms: dict[str, float] = {}

    def run(self):
        if self.chosen is None:
            self._choose()
        self.ways[self.chosen]()

    def _choose(self):
        preset = PLAN_CHOICES.preset_for(self.key)
        if preset in self.ways:
            self.chosen = preset
            return
        refuse_capture(self.backend.stream, str(self.key[0]))
        for run in self.ways.values():
            run()   # first runs: cuDNN autotunes its plan, kernels load
        self.times_ms = time_interleaved(self.backend.xp, self.backend.stream, self.ways)
        self.chosen = min(self.times_ms, key=self.times_ms.get)
        PLAN_CHOICES.record(self.key, self.chosen, self.times_ms[self.chosen])
