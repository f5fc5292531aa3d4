"""Data-parallel benchmarks from one process: N worker ranks driven over pipes, each runner a `Runner` here.

The perf suite times runners in its own process (benchmarking.time_round), so
a data-parallel runner is a proxy: `run_round()` tells every rank that holds
it to run one round and drain its device, `synchronize()` waits for all of
their replies. The clock in this process then brackets the slowest rank, the
way a step of data-parallel training is as slow as its slowest rank; a pipe
round trip (tens of microseconds) sits inside each round of hundreds of ms.

Ranks are `python -m gpuengine.bench.dp_worker`, started with the launcher's
variables (gpuengine.parallel.launch.child_env: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT, NCCL_NVLS_ENABLE=0). Commands and replies are dicts over
the worker channel (channel.py), two pipes per rank; a rank's output goes to
a log file whose tail is quoted when it fails. A rank that raises, dies or stays silent past the timeout
fails the call with an error naming it, and the other ranks are stopped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..parallel.launch import child_env, free_port, stop
from .channel import Channel, ChannelClosed, ChannelTimeout, receive_any

CALL_TIMEOUT_S = 900.0   # ResNet-50's warm-up (cuDNN autotuning, capture) on a rank takes minutes at worst
LOG_TAIL_CHARS = 3000


class WorkerError(RuntimeError):
    """A rank raised, died, or did not answer in time."""


class WorkerGroup:
    def __init__(self, world: int, env: dict | None = None, timeout_s: float = CALL_TIMEOUT_S):
        if world < 1:
            raise ValueError(f"a worker group needs >= 1 rank, got {world}")
        self.world, self.timeout_s = world, timeout_s
        self._logs = Path(tempfile.mkdtemp(prefix="gpuengine-dp-"))
        self._procs: dict[int, subprocess.Popen] = {}
        self._channels: dict[int, Channel] = {}
        port = free_port()
        for rank in range(world):
            cmd_read, cmd_write = os.pipe()
            reply_read, reply_write = os.pipe()
            child = child_env(rank, world, port)
            child.update(env or {})
            child.update(GPUENGINE_DP_CMD_FD=str(cmd_read), GPUENGINE_DP_REPLY_FD=str(reply_write))
            with open(self.log_path(rank), "wb") as log:
                self._procs[rank] = subprocess.Popen([sys.executable, "-m", "gpuengine.bench.dp_worker"], env=child,
                                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                     pass_fds=(cmd_read, reply_write))
            os.close(cmd_read)
            os.close(reply_write)
            self._channels[rank] = Channel(reply_read, cmd_write)

    def log_path(self, rank: int) -> Path:
        return self._logs / f"rank{rank}.log"

    def log_tail(self, rank: int) -> str:
        try:
            text = self.log_path(rank).read_text(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL_CHARS:]

    def _fail(self, message: str, rank: int):
        stopped = stop(self._procs, grace_s=3.0)
        others = f"; stopped rank(s) {', '.join(map(str, stopped))}" if stopped else ""
        raise WorkerError(f"{message}{others}\n--- rank {rank}'s output (tail) ---\n{self.log_tail(rank)}")

    def send(self, ranks, message: dict):
        for rank in ranks:
            try:
                self._channels[rank].send(message)
            except BrokenPipeError:
                self._fail(f"rank {rank} is gone (exit status {self._procs[rank].poll()}) before {message['op']}",
                           rank)

    def collect(self, ranks, what: str) -> dict[int, dict]:
        """One reply from each of `ranks`; WorkerError naming the first rank that raised, died or timed out."""
        replies: dict[int, dict] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(replies) < len(ranks):
            waiting = {r: self._channels[r] for r in ranks if r not in replies}
            try:
                rank, reply = receive_any(waiting, max(deadline - time.monotonic(), 0.0))
            except ChannelTimeout:
                late = list(waiting)
                self._fail(f"rank(s) {', '.join(map(str, late))} did not finish {what} within {self.timeout_s:g} s",
                           late[0])
            except ChannelClosed as exc:   # the rank exited or was killed
                code = self._procs[exc.key].wait()
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                self._fail(f"rank {exc.key} died during {what} ({how})", exc.key)
            replies[rank] = reply
            if "error" in reply:
                self._fail(f"rank {rank} raised during {what}:\n{reply['error']}", rank)
        return replies

    def call(self, ranks, message: dict) -> dict[int, dict]:
        self.send(ranks, message)
        return self.collect(ranks, message["op"])

    def build(self, spec: dict) -> dict[str, "RemoteRunner"]:
        """Every rank builds the runners of `spec` (dp_worker.build_runners); their proxies by name."""
        replies = self.call(range(self.world), {"op": "build", "spec": spec})
        runners = {}
        for name, info in replies[0]["runners"].items():
            runners[name] = RemoteRunner(self, name, info["samples_per_round"], info["ranks"], info.get("notes", {}))
        return runners

    def tuned_plans(self) -> dict[str, dict]:
        """The choices rank 0 timed itself (the ones its spec's `plans` lacked), as autotune records them."""
        return self.call([0], {"op": "plans"})[0]["tuned"]

    def close(self):
        """Ask every live rank to exit; stop the ones that do not within the grace period."""
        live = [r for r, p in self._procs.items() if p.poll() is None]
        for rank in live:
            try:
                self._channels[rank].send({"op": "exit"})
            except BrokenPipeError:
                pass
        deadline = time.monotonic() + 30.0
        for rank in live:
            try:
                self._procs[rank].wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
        stop(self._procs, grace_s=3.0)
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        shutil.rmtree(self._logs, ignore_errors=True)   # a failure quoted its rank's log already; none left in /tmp

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RemoteRunner:
    """`benchmarking.Runner` of a runner that lives on the worker ranks `ranks` (all of them, or rank 0 alone)."""

    def __init__(self, group: WorkerGroup, name: str, samples_per_round: int, ranks: list[int], notes: dict):
        self.group, self.name, self.samples_per_round, self.ranks = group, name, samples_per_round, list(ranks)
        self.notes = notes          # what the ranks report about it (e.g. torch_ddp's mode)
        self._in_flight = False

    def prepare(self):
        self.group.call(self.ranks, {"op": "prepare", "runner": self.name})

    def run_round(self):
        self.group.send(self.ranks, {"op": "round", "runner": self.name})
        self._in_flight = True

    def synchronize(self):
        if self._in_flight:
            self._in_flight = False
            self.group.collect(self.ranks, f"a round of {self.name}")
        else:
            self.group.call(self.ranks, {"op": "sync", "runner": self.name})

    def epoch_loss(self) -> float:
        """One more round; the last epoch's loss averaged over the ranks (each rank's mean over as many rows)."""
        self.synchronize()
        replies = self.group.call(self.ranks, {"op": "loss", "runner": self.name})
        return sum(replies[r]["loss"] for r in self.ranks) / len(self.ranks)
