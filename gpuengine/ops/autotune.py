"""Autotune and pin: time the ways of computing one thing on live buffers, keep one, remember the choice.

Three callers: every cuDNN graph chooses among its candidate plans
(ops/cudnn.py), every cuBLASLt GEMM among its heuristic's algorithms
(ops/gemm.py), and `FasterOf` between whole implementations of one op (a
depthwise convolution by cuDNN or by direct kernels).

What is timed is the kernels, not their launches: each way is captured in a
CUDA graph of N back-to-back executions, N chosen so that a replay lasts
about TARGET_REPLAY_MS, and the replays are timed between device events in
interleaved passes. Timed from Python one launch at a time, a plan whose
kernels take a few microseconds measured the host's launch rate, and two
autotunings of ResNet-50 kept different plans for 53 of 96 graphs.

The choice is stable by construction: the ways come in their heuristic's
order, and a later way replaces an earlier one only when it is faster by
more than a margin (`choose`). Where candidates are that close, the
heuristic order decides, so every machine of a kind keeps the same choice.
A way's median time repeats within about 1% from process to process, while
its passes' spread does not (0.3% in one process, 8% in the next): a margin
widened by the spread moved with it, and two fresh ResNet-50 autotunings
kept the same plan for 86.9% of choices, against 96.2% with the fixed 2%.
The choices that still differed were all variants of one engine (a cuDNN
engine's knobs, a cuBLASLt algorithm's tiles and splits) swapping places,
never the engine: so the engine is chosen first at MIN_MARGIN, each
standing for its fastest variant, then its variants at KNOB_MARGIN
(docs/gate.md, "Plan choices").

`PLAN_CHOICES` carries choices between processes for whoever sets it (the
perf gate keeps them with its baselines): a key with a preset takes that
choice without timing, the others are timed and recorded (once per key and process). Empty by default.
Progress goes to the logger "gpuengine.autotune" (INFO), so a first run that
autotunes for minutes does not look hung.
"""
from __future__ import annotations

import logging
import math
import re
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

TARGET_REPLAY_MS = 0.2   # long beside a replay's own start-up (a few us) and the events' 0.5 us resolution
MAX_REPEATS = 512        # executions captured per way: bounds capture time for kernels of a microsecond
PASSES = 5               # interleaved timed passes over the ways; a way's time is their median
PRUNE_FACTOR = 2.0       # a way estimated this much slower than the fastest is out before the careful timing
MIN_MARGIN = 0.02        # a later way must beat an earlier one by more than this fraction
KNOB_MARGIN = 0.05       # the same between variants of one engine, which swap places between processes
PROGRESS_EVERY_S = 5.0
BURST_GAP_S = 30.0

log = logging.getLogger("gpuengine.autotune")


def key_text(key: tuple) -> str:
    """A choice's key as stable text (its parts are numbers, strings, tuples and frozen dataclasses)."""
    return repr(key)


class PlanChoices:
    """Chosen ways by key: `preset` ones from an earlier process, `tuned` ones timed now."""

    def __init__(self, preset: dict[str, str] | None = None):
        self.preset = dict(preset or {})
        self.tuned: dict[str, dict] = {}   # key text -> {"plan": name, "ms": time} timed in this process
        self.timed: dict[str, list] = {}   # key text -> [[way, ms, spread], ...] in the heuristic's order

    def chosen_for(self, key: tuple) -> str | None:
        """The choice already made for `key`: preset by an earlier process, or timed in this one (a shape that
        repeats, as in a network's identical blocks, is timed once)."""
        text = key_text(key)
        tuned = self.tuned.get(text)
        return self.preset.get(text, tuned["plan"] if tuned else None)

    def in_force(self) -> dict[str, str]:
        """Every choice made so far by key text, preset or timed: what another process should start from."""
        return {**self.preset, **{text: entry["plan"] for text, entry in self.tuned.items()}}

    def adopt(self, tuned: dict[str, dict]):
        """Choices another process timed ({key text: {"plan", "ms"}}), kept as if timed here."""
        self.tuned.update({text: entry for text, entry in tuned.items() if self.preset.get(text) != entry["plan"]})

    def record(self, key: tuple, plan_name: str, ms: float, timings: list | None = None):
        """A choice made; `timings`: every way timed for it, [(name, Timing)] in the heuristic's order (what
        `./gate plans` replays to see how the choice moves with the margin)."""
        if self.preset.get(key_text(key)) != plan_name:
            self.tuned[key_text(key)] = {"plan": plan_name, "ms": round(ms, 5)}
        if timings:
            self.timed[key_text(key)] = [[str(name), round(t.ms, 6), round(t.spread, 5)] for name, t in timings]


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


@dataclass(frozen=True)
class Timing:
    """One way's device time per execution: the median of its passes, and their spread relative to it."""

    ms: float
    spread: float   # (slowest - fastest pass) / median: the timing's own noise
    repeats: int    # executions per captured replay

    @classmethod
    def of(cls, pass_ms: list[float], repeats: int) -> "Timing":
        median = statistics.median(pass_ms)
        return cls(median, (max(pass_ms) - min(pass_ms)) / median if median > 0 else math.inf, repeats)


def engine_of(name: str) -> str:
    """A way's engine: a cuDNN plan's (eng12 of eng12_k2=4_k3=0), a cuBLASLt algorithm's id (algorithm_id=21 of
    algorithm_id=21,tile=(64, 128),...: its tile, split and cluster are its knobs); any other way (a depthwise
    way) is its own."""
    match = re.match(r"(eng\d+)_k|(algorithm_id=\d+),", name)
    return next(group for group in match.groups() if group) if match else name


def _first_close(order: list, ms: dict, margin: float):
    best = min(ms[way] for way in order)
    return next(way for way in order if ms[way] <= best * (1 + margin))   # the fastest always is


def choose(order: list, timings: dict, min_margin: float = MIN_MARGIN, knob_margin: float | None = KNOB_MARGIN,
           engine=None) -> object:
    """The way to keep, from ways in their heuristic's `order`: first the engine (`engine(way)`, by default
    engine_of its name; each engine stands for its fastest variant and ranks where its first variant does), the
    first within `min_margin` of the fastest engine; then, among that engine's variants, the first within
    `knob_margin` of its fastest. A later way wins only where it is clearly faster. knob_margin None: no
    engines, the first way within `min_margin` of the fastest way."""
    timed = [name for name in order if name in timings]
    if not timed:
        raise ValueError("no way was timed")
    ms = {way: timings[way].ms for way in timed}
    if knob_margin is None:
        return _first_close(timed, ms, min_margin)
    engine = engine or (lambda way: engine_of(str(way)))
    engines = {way: engine(way) for way in timed}
    fastest: dict = {}
    for way, of in engines.items():
        fastest[of] = min(ms[way], fastest.get(of, math.inf))
    chosen = _first_close(list(fastest), fastest, min_margin)
    return _first_close([way for way in timed if engines[way] == chosen], ms, knob_margin)


def _capture(stream, run, repeats: int):
    """A CUDA graph of `repeats` executions of `run` on `stream`."""
    with stream:
        stream.begin_capture()
        try:
            for _ in range(repeats):
                run()
        finally:
            graph = stream.end_capture()
    return graph


def _replay_ms(xp, stream, graph, start, stop, replays: int = 1) -> float:
    start.record(stream)
    for _ in range(replays):
        graph.launch(stream)
    stop.record(stream)
    stop.synchronize()
    return xp.cuda.get_elapsed_time(start, stop)


def time_captured(xp, stream, ways: dict) -> dict:
    """Device milliseconds per execution of each way (name -> callable, run once eagerly already) as a Timing.

    A first estimate replays one captured execution; ways estimated PRUNE_FACTOR slower than the fastest are
    dropped, the others captured N times over and timed in PASSES interleaved passes."""
    start, stop = xp.cuda.Event(), xp.cuda.Event()
    singles = {name: _capture(stream, run, 1) for name, run in ways.items()}
    estimates = {name: math.inf for name in ways}
    for _ in range(3):   # interleaved, each way's fastest: a GPU still raising its clocks slows the first ones
        for name, graph in singles.items():
            estimates[name] = min(estimates[name], _replay_ms(xp, stream, graph, start, stop))
    del singles
    floor = min(estimates.values())
    graphs, repeats = {}, {}
    for name, estimate in estimates.items():
        if estimate > PRUNE_FACTOR * floor:
            continue
        repeats[name] = max(1, min(MAX_REPEATS, round(TARGET_REPLAY_MS / max(estimate, 1e-4))))
        graphs[name] = _capture(stream, ways[name], repeats[name])
        graphs[name].launch(stream)
    passes: dict = {name: [] for name in graphs}
    for _ in range(PASSES):
        for name, graph in graphs.items():
            passes[name].append(_replay_ms(xp, stream, graph, start, stop) / repeats[name])
    return {name: Timing.of(ms, repeats[name]) for name, ms in passes.items()}


def tune(xp, stream, key: tuple, ways: dict, names: dict | None = None) -> tuple:
    """Time `ways` (in the heuristic's order), choose one and record the choice under `key`, each way by its
    name (`names[way]`, else the way itself); returns (the chosen way, every Timing)."""
    timings = time_captured(xp, stream, ways)
    name = names.__getitem__ if names else str
    chosen = choose(list(ways), timings, engine=lambda way: engine_of(name(way)))
    PLAN_CHOICES.record(key, name(chosen), timings[chosen].ms,
                        [(name(way), timings[way]) for way in ways if way in timings])
    return chosen, timings


class Progress:
    """How far a burst of autotuning is, said on the "gpuengine.autotune" logger every PROGRESS_EVERY_S seconds.

    A burst ends after BURST_GAP_S without a step: the next test's model starts its own count."""

    def __init__(self, what: str):
        self.what = what
        self.done = 0
        self.started = self.said = self.last = -math.inf

    def step(self, pending: int | None = None):
        """One more done; `pending`: how many are known to be still to do (None: not known)."""
        now = time.perf_counter()
        if now - self.last > BURST_GAP_S:
            self.done, self.started, self.said = 0, now, now
        self.done += 1
        self.last = now
        if pending == 0 or now - self.said >= PROGRESS_EVERY_S:
            self.said = now
            to_go = "" if pending is None else f", {pending} to go"
            log.info("%s: %d%s, %.0f s", self.what, self.done, to_go, now - self.started)


class FasterOf:
    """Ways of computing the same outputs; the first eager run times each on the live buffers and keeps one.

    `key` names the choice in PLAN_CHOICES: a preset there is taken without timing, and a choice made here is
    recorded, so the gate runs the same kernels from run to run as it runs the same cuDNN plans. The ways'
    order is their preference where timings are too close to tell (`choose`). `restores`: buffers the ways
    update in place (running statistics), put back after the timing's many launches.
    """

    def __init__(self, backend, key: tuple, ways: dict, restores: tuple = ()):
        self.backend, self.key, self.restores = backend, key, restores
        self.ways = {name: run for name, run in ways.items() if run is not None}
        if not self.ways:
            raise ValueError(f"{key}: no way to run it")
        self.chosen = next(iter(self.ways)) if len(self.ways) == 1 else None
        self.timings: dict = {}

    def run(self):
        if self.chosen is None:
            self.choose()
        self.ways[self.chosen]()

    def choose(self):
        """Keep a way now (a preset, or the fastest timed on the live buffers) without running it after."""
        preset = PLAN_CHOICES.chosen_for(self.key)
        if preset in self.ways:
            self.chosen = preset
            return
        refuse_capture(self.backend.stream, str(self.key[0]))
        with self.backend.activate() if self.restores else nullcontext():   # copies on the ways' stream, in order
            saved = [buffer.copy() for buffer in self.restores]
            for run in self.ways.values():
                run()   # first runs: cuDNN autotunes its plan, kernels load
            self.chosen, self.timings = tune(self.backend.xp, self.backend.stream, self.key, self.ways)
            for buffer, value in zip(self.restores, saved):
                buffer[...] = value
