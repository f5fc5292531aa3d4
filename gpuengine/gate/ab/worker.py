"""One side of `./gate perf --against`: the engine of one checkout, in a process of its own.

gpuengine/gate/ab/sides.py starts this script twice per session, as

    python gpuengine/gate/ab/worker.py ROOT

once with the base's checkout as ROOT and once with the head's (the working
tree). ROOT goes first on sys.path, so `gpuengine` and the perf test modules
whose `ENGINES` recipes build the engine are that checkout's, while this
script, and so the timing of a round, is the head's for both sides. Requests
and replies are tuples over the worker channel (gpuengine/bench/channel.py,
the head's, loaded by its path) on stdin and stdout; whatever the engine
prints goes to stderr, the worker's log. Only the standard library is
imported before ROOT is on the path.

Both workers of a session time their rounds on one core, the session's
timing core (`timing_cpu`: GATE_TIMING_CPU, which gpuengine/gate/spread.py sets
to a core of its own for each GPU's session, else the last core this process
may use), as the session's pytest process times the references on it
(gpuengine/gate/harness.py): base, head and references alike, and never two of
them at once. The thread is pinned for the round only (`on_cpu`).

The engine's progress through a long set-up (cuDNN autotuning: minutes for
ResNet-50 and the zoo on a first run) is logged to the "gpuengine.autotune"
logger; here it goes to the log as `gpuengine.autotune: <message>` lines,
which the session relays to the terminal while it waits for the reply.
"""
from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import sys
import time
import traceback
import types
from contextlib import contextmanager

PROTOCOL = 2   # sides.py refuses a worker that speaks another (2: channel.py's frames)
TIMING_CPU_ENV = "GATE_TIMING_CPU"   # the session's timing core, set per GPU by gpuengine/gate/spread.py
PROGRESS_LOGGERS = ("gpuengine.autotune",)   # the engine's progress through long set-ups, at INFO
PROGRESS_FORMAT = "%(name)s: %(message)s"    # how a progress record reads in the log: sides.py picks it out


def route_progress(stream) -> logging.Handler:
    """The progress loggers' INFO records to `stream` (the worker's stderr: its log), one line each."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(PROGRESS_FORMAT))
    for name in PROGRESS_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False   # once: not again through whatever handler the root logger gets
    return handler


def cpu_list_text(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5': a set of cores as Linux's cpulists write it (timing_cores.cpu_text's twin: this
    script imports no gpuengine of its own, and a base checkout's may predate timing_cores)."""
    spans = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def timing_cpu(environ=None) -> int | None:
    """The core a session times its rounds on: GATE_TIMING_CPU where set, else the last core this process may
    use (the first tends to take interrupts); None where the OS cannot pin a thread. A value that is not one of
    this process's cores is a ValueError that names it and the cores there are."""
    raw = (os.environ if environ is None else environ).get(TIMING_CPU_ENV, "").strip()
    if not hasattr(os, "sched_setaffinity"):
        if raw:
            raise ValueError(f"{TIMING_CPU_ENV}={raw!r}: this OS cannot pin a thread to a core")
        return None
    allowed = os.sched_getaffinity(0)
    if not raw:
        return max(allowed)
    try:
        cpu = int(raw)
    except ValueError:
        raise ValueError(f"{TIMING_CPU_ENV}={raw!r} is not a core number; this process may run on cores "
                         f"{cpu_list_text(allowed)}") from None
    if cpu not in allowed:
        raise ValueError(f"{TIMING_CPU_ENV}={cpu} is not a core this process may run on ({cpu_list_text(allowed)})")
    return cpu


@contextmanager
def on_cpu(cpu: int | None):
    """The calling thread on `cpu` alone for the body, then back on the cores it had: a thread or process started
    between rounds (a DataLoader's workers, its pin-memory thread) takes its starter's cores, and must not find
    them narrowed to one. None: as it is."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})   # pid 0: this thread only
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def close_runner(runner):
    """Stop what an engine runner started (the streamed loader's threads, its pinned memory)."""
    close = getattr(getattr(runner, "trainer", runner), "close", None)   # a trainer's, or a loader's own
    if close is not None:
        close()


class WorkerError(Exception):
    """A request this checkout cannot serve; the message goes back to the session as it is."""


class Side:
    """The checkout's engine runner of the current test, built from its module's recipe."""

    def __init__(self, root: str, cpu: int | None = None):
        self.root = root
        self.cpu = cpu        # the session's timing core (timing_cpu)
        self.runner = None
        self.choices = None   # the cuDNN plan choices handed to this process's engine (GPU tier)

    def catalog(self, modules: list[str]) -> dict:
        """{module: {test: [case ids]}} of every recipe, or {module: "why not"} where a module has none."""
        found = {}
        for name in modules:
            try:
                module = importlib.import_module(name)
            except Exception as exc:   # the checkout's own module fails to import: say how
                found[name] = f"import failed: {type(exc).__name__}: {exc}"
                continue
            recipes = getattr(module, "ENGINES", None)
            if not isinstance(recipes, dict):
                found[name] = "defines no ENGINES recipes"   # an older commit, or a module without them
                continue
            found[name] = {test: [param.id for param in cases] for test, (cases, _) in recipes.items()}
        return found

    def build(self, module_name: str, test: str, case_id: str) -> dict:
        self.drop()
        module = importlib.import_module(module_name)
        recipes = getattr(module, "ENGINES", None)
        if not isinstance(recipes, dict) or test not in recipes:
            raise WorkerError(f"{module_name} of {self.root} has no engine recipe for {test}")
        cases, build = recipes[test]
        matches = [param.values[0] for param in cases if param.id == case_id]
        if not matches:
            raise WorkerError(f"{module_name}::{test} of {self.root} has no case {case_id}")
        self.runner = build(matches[0])
        return {"name": self.runner.name, "samples_per_round": int(self.runner.samples_per_round),
                "epochs_per_round": getattr(self.runner, "epochs_per_round", None),
                "engine_file": sys.modules["gpuengine"].__file__}

    def call(self, method: str, *args):
        if self.runner is None:
            raise WorkerError(f"no engine built: cannot call {method}")
        if method.startswith("_"):
            raise WorkerError(f"{method} is not the runner's to call")
        return getattr(self.runner, method)(*args)

    def timed_round(self) -> float:
        """Milliseconds of one round, the device drained before both clock reads (as benchmarking.time_round).

        The round runs on the session's timing core in both workers: a launch-bound round otherwise moves with
        the core the scheduler happened to give each process. Other threads keep their cores."""
        runner = self.runner
        if runner is None:
            raise WorkerError("no engine built: nothing to time")
        with on_cpu(self.cpu):
            runner.synchronize()
            start = time.perf_counter()
            runner.run_round()
            runner.synchronize()
            return (time.perf_counter() - start) * 1e3

    def set_delay(self, us: float) -> None:
        """The gatepower study's injected delay per step, in this checkout's engine (armed by the study only)."""
        from gpuengine.bench import injected_delay
        injected_delay.set_delay_us(us)

    def use_plans(self, presets: dict) -> int:
        from gpuengine.ops import autotune
        self.choices = autotune.use_plan_choices(presets)
        return len(presets)

    def add_plans(self, presets: dict) -> int:
        """Run these choices too (the other side's, just timed), so both sides run the same plans."""
        if self.choices is None:
            return self.use_plans(presets)
        self.choices.preset.update(presets)
        return len(presets)

    def tuned_plans(self) -> dict:
        return dict(self.choices.tuned) if self.choices is not None else {}

    def drop(self):
        """Let go of the test's engine and its device memory before the next is built."""
        runner, self.runner = self.runner, None
        close_runner(runner)
        del runner
        gc.collect()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
            sys.modules["cupy"].get_default_pinned_memory_pool().free_all_blocks()


def serve(side: Side, channel):
    handlers = {"catalog": side.catalog, "build": side.build, "call": side.call, "timed_round": side.timed_round,
                "set_delay": side.set_delay, "use_plans": side.use_plans, "add_plans": side.add_plans,
                "tuned_plans": side.tuned_plans, "drop": side.drop}
    while True:
        try:
            op, args = channel.receive()
        except EOFError:   # the session went away (the channel's ChannelClosed): so does the worker
            return
        if op == "quit":
            side.drop()
            channel.send(("ok", None))
            return
        try:
            handler = handlers.get(op)
            if handler is None:
                raise WorkerError(f"unknown request {op!r}")
            reply = ("ok", handler(*args))
        except WorkerError as exc:
            reply = ("error", str(exc))
        except Exception as exc:   # the engine failed: the session fails the test with this text
            traceback.print_exc(file=sys.stderr)
            reply = ("error", f"{type(exc).__name__}: {exc}")
        channel.send(reply)


def load_channel():
    """The head's gpuengine/bench/channel.py, by its path beside this script: the base checkout's gpuengine,
    which goes first on sys.path, may predate it."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "bench", "channel.py")
    spec = importlib.util.spec_from_file_location("_gate_worker_channel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pin_perf_tests(root: str):
    """perf_tests as this checkout's folder alone. Without an __init__.py (checkouts since it held only tests) it
    is a namespace package, which would also take in another checkout's perf_tests further on sys.path (the
    session's, through PYTHONPATH): a test the base lacks would then be found in the head's folder."""
    folder = os.path.join(root, "perf_tests")
    if os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, "__init__.py")):
        package = types.ModuleType("perf_tests")
        package.__path__ = [folder]
        sys.modules["perf_tests"] = package


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(f"usage: gpuengine/gate/ab/worker.py ROOT (a checkout folder); got {argv[1:]}", file=sys.stderr)
        return 2
    root = os.path.realpath(argv[1])
    channel = load_channel().Channel(0, os.dup(1))
    os.dup2(2, 1)                 # prints of the engine and of imported modules go to the log, not the protocol
    sys.stdout = sys.stderr
    sys.path[0] = root            # instead of this script's folder: the checkout's packages come first
    _pin_perf_tests(root)
    route_progress(sys.stderr)
    try:
        cpu = timing_cpu()
    except ValueError as exc:
        channel.send(("error", f"cannot time rounds: {exc}"))
        return 1
    try:
        import gpuengine
        engine_file = os.path.realpath(gpuengine.__file__)
        if not engine_file.startswith(root + os.sep):
            raise WorkerError(f"gpuengine was imported from {engine_file}, not from the checkout {root}")
        hello = ("ok", {"protocol": PROTOCOL, "root": root, "pid": os.getpid(), "engine_file": engine_file,
                        "timing_cpu": cpu, "python": sys.executable})
    except Exception as exc:
        hello = ("error", f"cannot import gpuengine from {root}: {type(exc).__name__}: {exc}")
    channel.send(hello)
    if hello[0] != "ok":
        return 1
    serve(Side(root, cpu), channel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
