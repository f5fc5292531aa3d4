"""The two engines of an A/B session: base and head, each in a worker process, driven from the test.

A perf module that can run A/B names, per test, the cases and the function
that builds its engine runner from a case alone (`ENGINES`, gpuengine/gate/tiers.py's
`recipes`). In an A/B session (`--against`) the test's `engine_for(case)`
fixture returns an `EnginePair`: the same recipe built by the base's checkout
in one worker and by the head's (the working tree) in another
(gpuengine/gate/ab/worker.py). The test hands the pair to `compare` as it would
its engine; each round times the base, the references and then the head, the
base and the references swapping places every other round, so the head follows
the base half the time and a reference the other half. Each worker times its
own rounds (no pipe inside the clock), with the head's timing code on both
sides. The references stay in the pytest process. Each side's worker runs
an `Interpreter`, a Python and its environment: this process's for both in a
code A/B; in a stack A/B (`--against-stack`, gpuengine/gate/ab/stack.py) both
import the working tree and the base runs another lock's environment.

Workers live for the whole session; a test builds its engine in both and
drops it at teardown. A worker that dies (out of memory, a crash) fails that
test with the tail of its log and is started afresh for the next. While the
session waits for a reply (a build with minutes of cuDNN autotuning), it
relays the engine's progress lines from the worker's log to `progress`
(the terminal, gpuengine/gate/progress.py) every PROGRESS_POLL_S, each prefixed
with the side: "[base] cuDNN autotune: 40 graphs timed, 56 to go, 31 s".
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from gpuengine.bench.channel import Channel, ChannelClosed, ChannelTimeout

from .worker import PROGRESS_LOGGERS, PROTOCOL
from ..progress import new_lines

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
REPLY_TIMEOUT_S = 1800   # a ResNet-50 build with autotuning takes minutes; a hung GPU takes forever
PROGRESS_POLL_S = 2.0    # how often a wait for a reply looks in the worker's log for new progress lines
HEAD, BASE = "head", "base"   # the workers; the runners keep the recipe's name, the base's with "_base"
READS = frozenset({"state_dict", "buffers_dict", "parameter_count", "outputs", "bytes_per_step",
                   "delivered"})   # an engine runner's reads


def progress_message(line: str) -> str | None:
    """The message of a progress line in a worker's log (worker.PROGRESS_FORMAT: a progress logger's name, or
    one of its children's, then ': '), None for any other line."""
    name, colon, message = line.partition(": ")
    if colon and any(name == logger or name.startswith(logger + ".") for logger in PROGRESS_LOGGERS):
        return message.rstrip("\r\n")
    return None


class SideError(RuntimeError):
    """A worker could not do what the test asked; the message names the side and the cause."""


@dataclass(frozen=True)
class Interpreter:
    """The Python a worker runs and the environment it runs in: this process's for a code A/B; for a stack A/B
    (`--against-stack`) the base's is another lock's (gpuengine/gate/stack/env.py)."""

    python: str = sys.executable
    environ: Mapping[str, str] | None = None   # the whole environment; None: this process's

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if self.environ is None else self.environ), **(extra or {})}


class Worker:
    """One worker process: the engine of one checkout, in one Python."""

    def __init__(self, side: str, root: Path, log_dir: Path, env: dict | None = None,
                 progress: Callable[[str], None] | None = None, interpreter: Interpreter | None = None):
        self.side, self.root = side, Path(root)
        self.log_path = Path(log_dir) / f"{side}.log"
        self.interpreter = interpreter or Interpreter()
        self.env = self.interpreter.environment(env)   # `env`: variables over the interpreter's environment
        # what its errors call it: the checkout, and the Python where it is not this process's
        self.where = str(self.root) + ("" if self.interpreter.python == sys.executable
                                       else f", {self.interpreter.python}")
        self.progress = progress   # where the engine's progress lines go while a reply is awaited
        self.process = None
        self.channel: Channel | None = None   # requests and replies (gpuengine/bench/channel.py)
        self.exit_status: int | None = None   # the last process's, once stopped
        self.info: dict = {}
        self._log_read = 0         # bytes of the log already looked through for progress lines

    def start(self):
        self._log_read = self.log_path.stat().st_size if self.log_path.exists() else 0   # the last process's: seen
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen([self.interpreter.python, str(WORKER_SCRIPT), str(self.root)],
                                            cwd=self.root,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self.env)
        finally:
            log.close()
        self.channel = Channel(self.process.stdout.fileno(), self.process.stdin.fileno())
        self.info = self._reply("start")
        if self.info.get("protocol") != PROTOCOL:
            raise SideError(f"{self.side} worker speaks protocol {self.info.get('protocol')}, not {PROTOCOL}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque(log, maxlen=lines)).rstrip()
        except OSError:
            return "(no log)"

    def relay_progress(self):
        """Hand the progress lines the worker logged since the last look to `progress`, as '[side] message'."""
        if self.progress is None:
            return
        lines, self._log_read = new_lines(self.log_path, self._log_read)
        for line in lines:
            message = progress_message(line)
            if message is not None:
                self.progress(f"[{self.side}] {message}")

    def _reply(self, what: str):
        """The worker's reply to `what`; waiting in slices of PROGRESS_POLL_S, its progress relayed after each."""
        waited = []

        def meanwhile():
            waited.append(True)
            self.relay_progress()

        try:
            status, value = self.channel.receive(REPLY_TIMEOUT_S, meanwhile, PROGRESS_POLL_S)
        except (ChannelClosed, ChannelTimeout, pickle.UnpicklingError) as exc:
            self.stop()
            reason = f"no reply in {REPLY_TIMEOUT_S} s" if isinstance(exc, ChannelTimeout) \
                else f"exit status {self.exit_status}"
            raise SideError(f"the {self.side} worker ({self.where}) died during {what}: {reason}; the end of its "
                            f"log {self.log_path}:\n{self.log_tail()}") from None
        finally:
            if waited:
                self.relay_progress()   # the lines logged since the last look, the last one before the reply
        if status != "ok":
            raise SideError(f"{self.side} ({self.where}): {what}: {value}")
        return value

    def request(self, op: str, *args):
        if not self.alive:
            self.start()
        try:
            self.channel.send((op, args))
        except OSError:
            self.stop()
            raise SideError(f"the {self.side} worker ({self.where}) is gone; its log {self.log_path}:\n"
                            f"{self.log_tail()}") from None
        return self._reply(op if op != "call" else f"{args[0]}()")

    def stop(self, timeout_s: float = 10):
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                self.channel.send(("quit", ()))
                process.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        self.exit_status = process.returncode
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()
            except OSError:
                pass


class RemoteRunner:
    """A `benchmarking.Runner` whose engine lives in a worker; it times its own rounds (`timed_round`)."""

    def __init__(self, worker: Worker, built: dict):
        self.worker = worker
        self.name = built["name"] + ("_base" if worker.side == BASE else "")
        self.samples_per_round = built["samples_per_round"]
        self.epochs_per_round = built["epochs_per_round"]
        self.engine_file = built["engine_file"]

    def prepare(self):
        self.worker.request("call", "prepare")

    def run_round(self):
        self.worker.request("call", "run_round")

    def synchronize(self):
        self.worker.request("call", "synchronize")

    def timed_round(self) -> float:
        return self.worker.request("timed_round")

    def train(self, epochs: int) -> list[float]:
        return self.worker.request("call", "train", epochs)

    def set_delay_us(self, us: float):
        """The gatepower study's injected delay per step in this side's engine."""
        self.worker.request("set_delay", us)

    def call(self, method: str, *args):
        return self.worker.request("call", method, *args)

    def __getattr__(self, method: str):
        """The engine runner's reads (READS) as methods here."""
        if method not in READS:
            raise AttributeError(method)
        return lambda *args: self.call(method, *args)


@dataclass
class EnginePair:
    """The base's and the head's engine for one case; reads (weights, outputs) come from the head's."""

    head: RemoteRunner
    base: RemoteRunner

    tuned: dict = field(default_factory=dict)   # plans the base timed, handed to the head before it was built

    @property
    def name(self) -> str:
        return self.head.name

    @property
    def sides(self) -> list[RemoteRunner]:
        return [self.base, self.head]

    def prepare(self):
        """The head's warm-up (the base warmed up before the head was built: Sides.pair)."""
        self.base.prepare()
        self.head.prepare()

    @property
    def samples_per_round(self) -> int:
        return self.head.samples_per_round

    @property
    def epochs_per_round(self):
        return self.head.epochs_per_round

    def __getattr__(self, method: str):
        """The head's reads (READS): what references start from and what the test checks."""
        if method not in READS:
            raise AttributeError(method)
        return lambda *args: self.head.call(method, *args)


class Sides:
    """The session's two workers and the pair of the running test."""

    def __init__(self, head_root: Path, base_root: Path, log_dir: Path, plan_presets: dict | None,
                 progress: Callable[[str], None] | None = None, interpreters: dict[str, Interpreter] | None = None,
                 share_plans: bool = True):
        """`interpreters`: each side's Python and environment (default: this process's); `share_plans`: the
        base's new plan choices go to the head (False where the sides run different cuDNN versions)."""
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        interpreters = interpreters or {}
        self.workers = {side: Worker(side, root, log_dir, progress=progress, interpreter=interpreters.get(side))
                        for side, root in ((HEAD, head_root), (BASE, base_root))}
        self.presets = plan_presets
        self.share_plans = share_plans
        self.pairs: list[EnginePair] = []
        self.tuned: dict = {}

    def _worker(self, name: str) -> Worker:
        worker = self.workers[name]
        if not worker.alive:
            worker.start()
            if self.presets is not None:
                worker.request("use_plans", self.presets)
        return worker

    def catalog(self, name: str, modules: list[str]) -> dict:
        return self._worker(name).request("catalog", modules)

    def pair(self, module: str, test: str, case_id: str) -> EnginePair:
        """The base's engine built and warmed up first: the head builds its own after receiving the plans the
        base chose, so it builds those plans alone (building every candidate of ResNet-50 took 2 minutes); not
        where the plans are not shared, and each side then autotunes its own."""
        base_worker = self._worker(BASE)
        base = RemoteRunner(base_worker, base_worker.request("build", module, test, case_id))
        base.prepare()
        # Another cuDNN's choices are neither the head's to run nor the plan file's to keep.
        tuned = base_worker.request("tuned_plans") if self.share_plans else {}
        head_worker = self._worker(HEAD)
        if tuned:
            head_worker.request("add_plans", {key: entry["plan"] for key, entry in tuned.items()})
        head = RemoteRunner(head_worker, head_worker.request("build", module, test, case_id))
        self.pairs.append(EnginePair(head, base, tuned))
        return self.pairs[-1]

    def drop(self):
        for worker in self.workers.values():
            if worker.alive:
                try:
                    worker.request("drop")
                except SideError:
                    pass   # a dead worker holds nothing; the next test starts it afresh

    def close(self):
        """Stop both workers; the head's new cuDNN plan choices are kept for the session's plan file."""
        for pair in self.pairs:
            self.tuned.update(pair.tuned)
        head = self.workers[HEAD]
        if head.alive and self.presets is not None:
            try:
                self.tuned.update(head.request("tuned_plans"))
            except SideError:
                pass
        for worker in self.workers.values():
            worker.stop()
