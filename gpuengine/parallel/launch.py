"""`python -m gpuengine.parallel.launch --gpus N <script.py | workload> [args...]`: one process per GPU, data parallel.

Each child gets the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a free loopback port), plus
NCCL_NVLS_ENABLE=0 (NVLink multicast can take the lent hosts' GPUs out of
service), and imports the same gpuengine as the launcher. A target that is
not a script (no `.py`, no `/`) names a seed workload, which each rank trains
through `gpuengine.workloads.data_parallel` (that module knows the names): its
arguments and the GPUENGINE_* settings are checked once (`--check`) before any
rank starts, so a bad one is said once, not by every rank. Where the engine
would run on the CPU (no CUDA GPU visible, or GPUENGINE_DEVICE=cpu) the
launcher says so first: the ranks then train on NumPy and all-reduce through
the rendezvous store, not NCCL. When a rank exits with an
error or dies, the others are stopped and the launcher exits with an error
naming that rank: no rank waits forever on a peer that is gone.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..config import ConfigError, EngineConfig
from ..runtime.backend import resolve_device

WORKLOAD_MODULE = "gpuengine.workloads.data_parallel"   # by name only: the engine never imports workloads
POLL_S = 0.05


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(rank: int, world: int, port: int, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    package_root = str(Path(__file__).resolve().parents[2])   # children import this very gpuengine
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    return env


def command_for(target: str, args: list[str]) -> list[str]:
    if Path(target).is_file():
        return [sys.executable, target, *args]
    if target.endswith(".py") or "/" in target or not target.isidentifier():
        raise SystemExit(f"gpuengine.parallel.launch: {target!r} is neither a script file nor a workload name")
    return [sys.executable, "-m", WORKLOAD_MODULE, target, *args]


def check_workload(command: list[str]):
    """A workload's arguments and GPUENGINE_* checked once, in one process, before any rank starts: the module
    says what is wrong (usage and error, once) and the launcher stops."""
    if command[1:3] != ["-m", WORKLOAD_MODULE]:
        return   # a script: its arguments are its own
    checked = subprocess.run([*command[:3], "--check", *command[3:]], env=child_env(0, 1, 0))
    if checked.returncode != 0:
        print(f"gpuengine.parallel.launch: no rank started: {WORKLOAD_MODULE} refused the arguments (above)",
              file=sys.stderr, flush=True)
        raise SystemExit(checked.returncode)


def device_notice(world: int, environ=None) -> str | None:
    """What the launcher says where the engine in the ranks would run on the CPU (None on a GPU, or where the
    GPUENGINE_* settings are bad: the check or the ranks say that)."""
    try:
        on_cpu = resolve_device(EngineConfig.from_env(environ=environ)) == "cpu"
    except ConfigError:
        return None
    if not on_cpu:
        return None
    explicit = (os.environ if environ is None else environ).get("GPUENGINE_DEVICE", "").strip().lower() == "cpu"
    why = "GPUENGINE_DEVICE=cpu" if explicit else "no CUDA GPU is visible"
    return (f"gpuengine.parallel.launch: {why}: the engine in each of the {world} rank(s) runs on the CPU (NumPy "
            "backend), all-reducing through the rendezvous store, not NCCL: a check of data parallel training, "
            "not a speed-up")


def stop(procs: dict[int, subprocess.Popen], grace_s: float) -> list[int]:
    """Terminate the ranks still running, kill those that outlive the grace period; the ranks stopped."""
    running = [r for r, p in procs.items() if p.poll() is None]
    for r in running:
        procs[r].send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for r in running:
        try:
            procs[r].wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            procs[r].kill()
            procs[r].wait()
    return running


def launch(world: int, command: list[str], grace_s: float = 5.0, timeout_s: float | None = None) -> int:
    """Run `command` as `world` ranks; 0 when every rank succeeded, else the failed rank's exit status (or 1)."""
    if world < 1:
        raise SystemExit(f"gpuengine.parallel.launch: --gpus must be >= 1, got {world}")
    port = free_port()
    procs = {r: subprocess.Popen(command, env=child_env(r, world, port)) for r in range(world)}
    started = time.monotonic()
    try:
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            failed = [r for r, c in codes.items() if c not in (None, 0)]
            if failed:
                rank, code = failed[0], codes[failed[0]]
                stopped = stop(procs, grace_s)
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                others = f"; stopped rank(s) {', '.join(map(str, stopped))}" if stopped else ""
                print(f"gpuengine.parallel.launch: rank {rank} failed ({how}){others}", file=sys.stderr, flush=True)
                return code if code > 0 else 1
            if all(c == 0 for c in codes.values()):
                return 0
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                stopped = stop(procs, grace_s)
                print(f"gpuengine.parallel.launch: timed out after {timeout_s:g} s; stopped rank(s) "
                      f"{', '.join(map(str, stopped))}", file=sys.stderr, flush=True)
                return 1
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        stop(procs, grace_s)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuengine.parallel.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="processes to start, one per GPU")
    parser.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds a stopped rank gets before SIGKILL")
    parser.add_argument("target", help="a Python script, or a seed workload's name (mlp, cnn, ...)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the script")
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be >= 1, got {args.gpus}")
    command = command_for(args.target, args.args)
    check_workload(command)
    notice = device_notice(args.gpus)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    return launch(args.gpus, command, args.grace, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
