"""One runner's kernels per training step: torch.profiler's device events over a few replays, and their medians.

torch.profiler with CUDA activity turns CUPTI on for the whole process, so it
records every kernel, memcpy and memset on the device whoever launched it:
torch's, Inductor's Triton kernels, cuBLAS and cuDNN behind either runner, and
the engine's CuPy kernels, inside CUDA graph replays too (CUDA 12 and later
record each node of a replayed graph). A runner is profiled after it is
prepared (warm-up, compile, capture) and one more untimed round; then the
profiler's schedule alternates a warm-up step (CUPTI on, events dropped) with
an active step of one round each, `replays` times, and hands over each active
step's events as it closes. A round is one epoch of `steps` training steps
(profile/workloads.py sizes the data set so): per kernel name, its summed time
and launch count in each replay, divided by `steps`, and the median over
replays; the step is the device span of a replay (first event's start to last
event's end) over `steps`, and its gaps the step less the kernels' sum: the
device idle between kernels, or, when negative, kernels that overlapped.
Each kernel's `launch_us` is its time at each launch of a step, in launch
order (the median over the replays' steps: a layer's own launch, where a
kernel serves many), and its `idle_before_us` the device idle just before its launches
(from the latest end of the events before it to its start), and the side's
`idle_before` that by the family of the kernel launched next: where in the
step the gaps sit (a graph node that waits longer to start than others).

CUPTI itself slows a graph replay between its kernels, more for some graphs
than others, so the profiled span is not what the perf tests time. Before
profiling, the same runner is therefore timed without the profiler
(`unprofiled_step_us`: bursts of rounds launched back to back, a
synchronize around each burst, as in the perf tests' rounds): set beside
the kernels' sum, it says how much of the step is really idle device.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from .families import family_of

# Kineto's activity types of work on the device; its other device events (gpu_user_annotation) span kernels.
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
WARM_ROUNDS = 1   # untimed rounds after prepare(): a graph's first replay uploads it, a compiled step may settle
BURST_ROUNDS = 10   # rounds launched back to back per timed burst: one synchronize's cost spread over many steps
BURSTS = 5          # timed bursts; their median is kept


class ProfileError(RuntimeError):
    """The profiler did not see what a profile needs (no device events, replays lost); the message says which."""


@dataclass(frozen=True)
class DeviceEvent:
    """One kernel, memcpy or memset on the device: its demangled name and its time range in microseconds."""

    name: str
    start_us: float
    end_us: float

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


def is_device_work(event) -> bool:
    """A torch.profiler FunctionEvent that is a kernel, memcpy or memset on a CUDA device."""
    from torch.autograd import DeviceType
    if event.device_type != DeviceType.CUDA:
        return False
    kind = getattr(event, "activity_type", None)
    return kind is None or kind in DEVICE_WORK   # None: a torch that does not say; every CUDA event then counts


def device_events(function_events, keep: Callable = is_device_work) -> list[DeviceEvent]:
    """The events `keep` accepts, as DeviceEvents (the name not rewritten for tables, the time range in us)."""
    return [DeviceEvent(getattr(e, "trace_name", None) or e.name, float(e.time_range.start), float(e.time_range.end))
            for e in function_events if keep(e)]


def record_replays(run_once: Callable[[], None], replays: int, activities=None,
                   keep: Callable = is_device_work) -> list[list[DeviceEvent]]:
    """The events of `replays` calls of `run_once`, one list per call, each call after a warm-up call of its own.

    `run_once` must wait for the device before it returns (a runner's round, then synchronize), so that a
    replay's events all fall inside its active step. `activities` default to CUDA alone (nothing host-side
    is kept; CPU tracing would only slow the host). A cycle the profiler stopped early (a CUPTI buffer
    overflow) hands nothing over: fewer lists than replays is a ProfileError.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    collected: list[list[DeviceEvent]] = []

    def closed(prof) -> None:
        collected.append(device_events(prof.events(), keep))

    plan = schedule(wait=0, warmup=1, active=1, repeat=replays)
    with warnings.catch_warnings():   # that each cycle's events are its own is what we want, not news
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with profile(activities=list(activities or [ProfilerActivity.CUDA]), schedule=plan,
                     on_trace_ready=closed) as prof:
            for _ in range(2 * replays):
                run_once()
                prof.step()
    if len(collected) != replays:
        raise ProfileError(f"torch {torch.__version__}'s profiler handed over {len(collected)} of {replays} replays "
                           "(device activity collection stopped early?); run again, or ask for fewer --replays")
    return collected


MOST_LAUNCHES = 256   # a kernel launched more often a step keeps its sums only


def _launch_times(durations: list[list[float]], steps: int) -> dict:
    """{"launch_us": [...]}: a kernel's time at each of its launches of a step (`durations`: each replay's, in start
    order), the median over every step of every replay; {} where the replays launch it a different number of times,
    or not the same times each step."""
    per_step = len(durations[0]) // steps
    if not 0 < per_step <= MOST_LAUNCHES or any(len(d) != per_step * steps for d in durations):
        return {}
    return {"launch_us": [round(statistics.median(d[s * per_step + k] for d in durations for s in range(steps)), 3)
                          for k in range(per_step)]}


def summarise(replays: list[list[DeviceEvent]], steps: int) -> dict:
    """Per training step, median over replays: each kernel's time and launches, each family's time, the step's
    device span and its gaps. A replay without one event is a ProfileError: nothing was seen to compare."""
    if steps < 1:
        raise ValueError(f"steps={steps}: a replay holds at least one training step")
    if not replays or any(not events for events in replays):
        empty = sum(not events for events in replays)
        raise ProfileError(f"{empty or 'all'} of {len(replays)} replays recorded no kernel: the profiler saw no "
                           "device work (CUPTI unavailable to torch.profiler, or a build without CUDA activity)")
    replays = [sorted(events, key=lambda e: e.start_us) for events in replays]   # launch order, on the device
    names = list(dict.fromkeys(e.name for events in replays for e in events))
    durations = {name: [[] for _ in replays] for name in names}   # each launch's time, by replay, in start order
    idle = {name: [0.0] * len(replays) for name in names}
    for i, events in enumerate(replays):
        reached = None   # the latest end of the events started so far
        for e in events:
            durations[e.name][i].append(e.us)
            if reached is not None and e.start_us > reached:
                idle[e.name][i] += e.start_us - reached
            reached = e.end_us if reached is None else max(reached, e.end_us)

    def per_step(values) -> float:
        return round(statistics.median(values) / steps, 3)

    kernels = [{"name": name, "family": family_of(name), "us": per_step([sum(d, 0.0) for d in durations[name]]),
                "count": per_step([len(d) for d in durations[name]]), "idle_before_us": per_step(idle[name]),
                **_launch_times(durations[name], steps)} for name in names]
    kernels.sort(key=lambda k: (-k["us"], k["name"]))
    families: dict[str, float] = {}
    idle_before: dict[str, float] = {}
    for k in kernels:
        families[k["family"]] = round(families.get(k["family"], 0.0) + k["us"], 3)
        idle_before[k["family"]] = round(idle_before.get(k["family"], 0.0) + k["idle_before_us"], 3)
    spans = [(max(e.end_us for e in events) - min(e.start_us for e in events)) / steps for events in replays]
    step_us = round(statistics.median(spans), 3)
    kernel_us = round(sum(k["us"] for k in kernels), 3)
    return {"step_us": step_us, "kernel_us": kernel_us, "gaps_us": round(step_us - kernel_us, 3),
            "replay_step_us": [round(s, 3) for s in spans], "families": families,
            "idle_before": {f: us for f, us in idle_before.items() if us > 0}, "kernels": kernels}


def unprofiled_step_us(runner, steps: int, bursts: int = BURSTS, rounds: int = BURST_ROUNDS,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """Microseconds per training step without the profiler: the median burst of `rounds` rounds (each one epoch
    of `steps` steps) launched back to back, the device drained before both clock reads."""
    per_step = []
    for _ in range(bursts):
        runner.synchronize()
        start = clock()
        for _ in range(rounds):
            runner.run_round()
        runner.synchronize()
        per_step.append((clock() - start) * 1e6 / (rounds * steps))
    return round(statistics.median(per_step), 3)


def profile_runner(runner, replays: int, steps: int, activities=None, keep: Callable = is_device_work) -> dict:
    """A prepared-and-warmed runner's profile (summarise) and its step timed without the profiler
    ("timed_step_us"): `runner` is a benchmarking.Runner whose round is one epoch of `steps` training steps."""
    runner.prepare()
    for _ in range(WARM_ROUNDS):
        runner.run_round()
        runner.synchronize()
    timed = unprofiled_step_us(runner, steps)

    def one_round() -> None:
        runner.run_round()
        runner.synchronize()
    return {**summarise(record_replays(one_round, replays, activities, keep), steps), "timed_step_us": timed}
