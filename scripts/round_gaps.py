"""Where an engine round's time goes around its graph launches: the device's idle time before each replay and the
host time of each launch call, in rounds of a perf test's length and of a profile's (issue 38: the engine's
ResNet-50 rounds take 140-160 us a step more than its profile's bursts time, PyTorch's rounds the same as theirs).

    python3 scripts/round_gaps.py resnet --precision bf16 [--epoch 50 48 8] [--rounds 5] [--references]
                                  [--toggle NAME=VALUE] [--no-pin] [--out FILE]

For each epoch length (steps; the data set holds that many batches, resident, CUDA graphs of 8 steps as the perf
tests run them) the engine is built as the perf tests build it and timed three ways: rounds of one epoch each
between two synchronizations (host clock, as the perf tests time them), bursts of `rounds` rounds back to back
(as a profile times them), and the same single rounds with a device event recorded before and after each graph
launch and the launch call's host time, so that a round splits into replays and the device's idle time before
each (and the SM clock read while each such round runs). With --references, PyTorch's captured step
(torch_graph, from the engine's weights) runs a round between each two of the engine's, as in a perf test, and
the engine's single rounds are timed once more before torch is built (the first epoch length's alone are clean:
torch keeps its memory after).
Every timed round runs on the core the perf tests time theirs on (--no-pin: anywhere). Prints a table;
--out writes every round as JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRAPH = 8   # steps a launch, as the perf tests' graph8 cases


def instrument(trainer, events: list):
    """Each captured graph's launch records a device event before and after it and appends (steps, before, after,
    the call's host us) to `events`; returns a function that puts the plain launches back."""
    xp, stream = trainer.backend.xp, trainer.backend.stream
    plain = {steps: graph.launch for steps, graph in trainer.graphs.items()}
    for steps, graph in trainer.graphs.items():
        def launch(original=plain[steps], steps=steps):
            before, after = xp.cuda.Event(), xp.cuda.Event()
            before.record(stream)
            started = time.perf_counter()
            original()
            called = time.perf_counter()
            after.record(stream)
            events.append((steps, before, after, (called - started) * 1e6))
        graph.launch = launch

    def restore():
        for steps, graph in trainer.graphs.items():
            graph.launch = plain[steps]
    return restore


def elapsed_us(first, second) -> float:
    from cupy.cuda import get_elapsed_time
    return get_elapsed_time(first, second) * 1e3


def sm_clock():
    """A function that reads the GPU's SM clock in MHz (NVML), or returns None where NVML cannot."""
    from gpuengine.bench import nvml
    try:
        lib, handle = nvml.nvml(), nvml.handle_for_cuda_device()
    except nvml.NvmlUnavailable:
        return lambda: None
    return lambda: lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM)


def clocked_round(runner, clock) -> tuple[float, int | None]:
    """A round's host milliseconds (as benchmarking.time_round) and the SM clock read while its work runs."""
    runner.synchronize()
    started = time.perf_counter()
    runner.run_round()
    mhz = clock()
    runner.synchronize()
    return (time.perf_counter() - started) * 1e3, mhz


def split_round(runner, events: list, clock) -> dict:
    """One instrumented round: its host time, the SM clock while it ran, its device span, and per launch its steps,
    the replay's device time, the device's idle time before it (from the previous replay's end) and the launch
    call's host time."""
    events.clear()
    host_ms, mhz = clocked_round(runner, clock)
    launches = [{"steps": steps, "replay_us": round(elapsed_us(before, after), 1),
                 "idle_before_us": None if k == 0 else round(elapsed_us(events[k - 1][2], before), 1),
                 "call_us": round(call_us, 1)} for k, (steps, before, after, call_us) in enumerate(events)]
    return {"host_ms": round(host_ms, 3), "sm_mhz": mhz,
            "device_ms": round(elapsed_us(events[0][1], events[-1][2]) / 1e3, 3), "launches": launches}


def measure(workload, precision: str, epoch: int, rounds: int, references: bool, toggles: dict,
            pin: bool = True) -> dict:
    """The three timings of one epoch length (module docstring), every round kept; `pin`: each timed round's
    thread on the core the perf tests time on (gate/ab/worker.py's timing_cpu), as theirs is."""
    from gpuengine.bench.benchmarking import time_round
    from gpuengine.bench.profile.capture import unprofiled_step_us
    from gpuengine.bench.runners import EngineTrainRunner
    from gpuengine.config import EngineConfig
    from gpuengine.gate.ab.worker import on_cpu, timing_cpu
    cpu = timing_cpu() if pin else None
    x, t = workload.arrays(workload.batch * epoch, False)
    config = EngineConfig(precision=precision, cuda_graph=GRAPH, resident_data=True, device="cuda", **toggles)
    engine = EngineTrainRunner(workload.network(False), x, t, workload.batch, config, epochs_per_round=1,
                               lr=workload.lr)
    engine.prepare()
    reference, before = None, []
    if references:   # the engine's rounds before torch is built beside it in this process, then after
        with on_cpu(cpu):
            time_round(engine)
            before = [time_round(engine) for _ in range(rounds)]
        reference = workload.torch_runner("torch_graph", x, t, workload.batch, precision, engine.state_dict(),
                                          engine.buffers_dict(), "cuda", False)
        reference.prepare()
    beside = [reference] if reference else []
    single, split, reference_ms = [], [], []
    events: list = []
    clock, reference_mhz = sm_clock(), []
    with on_cpu(cpu):
        for runner in [engine, *beside]:   # warm rounds: a graph's first replay uploads it
            time_round(runner)
        for _ in range(rounds):
            single.append(time_round(engine))
            reference_ms += [time_round(r) for r in beside]
        burst = unprofiled_step_us(engine, epoch, bursts=3, rounds=rounds)   # as a profile times its step
        restore = instrument(engine.trainer, events)
        try:
            for _ in range(rounds):
                split.append(split_round(engine, events, clock))
                for ms, mhz in (clocked_round(r, clock) for r in beside):
                    reference_ms.append(ms)
                    reference_mhz.append(mhz)
        finally:
            restore()
    return {"epoch_steps": epoch, "timing_cpu": cpu, "single_before_torch_ms": before, "single_ms": single,
            "burst_step_us": burst, "split": split, "reference_ms": reference_ms, "reference_mhz": reference_mhz}


def summary(record: dict) -> str:
    """One line: us a step of single rounds, bursts and instrumented rounds, the instrumented rounds' device
    span, their replays and idle time, and the launch calls' host time (medians)."""
    steps = record["epoch_steps"]

    def per_step(ms: list[float]) -> float:
        return 1e3 * statistics.median(ms) / steps

    split = record["split"]
    replays = [sum(launch["replay_us"] for launch in s["launches"]) for s in split]
    idle = [sum(launch["idle_before_us"] or 0.0 for launch in s["launches"]) for s in split]
    calls = [launch["call_us"] for s in split for launch in s["launches"] if launch["steps"] == GRAPH]
    core = "" if record.get("timing_cpu") is None else f" (core {record['timing_cpu']})"
    line = (f"epoch {steps:>3}{core}: single {per_step(record['single_ms']):8.1f}"
            f"  burst {record['burst_step_us']:8.1f}  instrumented {per_step([s['host_ms'] for s in split]):8.1f}"
            f"  (device span {per_step([s['device_ms'] for s in split]):8.1f}, replays "
            f"{statistics.median(replays) / steps:8.1f}, idle between {statistics.median(idle) / steps:6.1f})"
            f"  graph{GRAPH} launch call {statistics.median(calls) if calls else 0.0:7.1f} us")
    clocks = [s["sm_mhz"] for s in split if s.get("sm_mhz")]
    if clocks:
        line += f"  SM {statistics.median(clocks):.0f} MHz"
    if record.get("single_before_torch_ms"):
        line += f"  single before torch {per_step(record['single_before_torch_ms']):8.1f}"
    if record["reference_ms"]:
        line += f"  torch_graph {per_step(record['reference_ms']):8.1f}"
        theirs = [mhz for mhz in record.get("reference_mhz", []) if mhz]
        line += f" (SM {statistics.median(theirs):.0f} MHz)" if theirs else ""
    return line


def main(argv=None) -> int:
    from gpuengine.bench.cli_args import UsageError, parse_toggle
    from gpuengine.bench.json_files import write_json
    from gpuengine.bench.profile.workloads import get_workload
    from gpuengine.config import PRECISIONS
    from gpuengine.runtime.backend import gpu_visible
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--epoch", type=int, nargs="+", default=[50, 48, 8],
                        help="steps an epoch (a round), each length a run of its own")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--references", action="store_true", help="torch_graph's rounds between the engine's")
    parser.add_argument("--toggle", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--no-pin", action="store_true",
                        help="time on whatever core the scheduler picks, not on the perf tests' timing core")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or any(e < 1 for e in args.epoch):
        parser.error(f"--rounds {args.rounds} and --epoch {args.epoch}: each at least 1")
    try:
        toggles = dict(parse_toggle(text, "--toggle") for text in args.toggle)
        workload = get_workload(args.workload)
    except (UsageError, ValueError) as exc:
        parser.error(str(exc))
    if not gpu_visible():
        print("round_gaps: needs a GPU with CuPy and the cuDNN frontend; none is visible here", file=sys.stderr)
        return 2
    records = []
    for epoch in args.epoch:
        records.append(measure(workload, args.precision, epoch, args.rounds, args.references, toggles,
                               pin=not args.no_pin))
        print(summary(records[-1]), flush=True)
    if args.out:
        write_json(args.out, {"workload": args.workload, "precision": args.precision, "graph": GRAPH,
                              "toggles": toggles, "records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
