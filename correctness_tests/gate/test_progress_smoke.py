"""The engine's autotuning progress reaches the terminal while a test waits: from an A/B worker, and in a plain session.

No GPU: a fake worker logs the progress records the engine will log (through
worker.py's own routing, so the format is the one the session reads) and
takes its time to reply; a fake test logs one in a session of its own.
"""
from __future__ import annotations

import io
import logging
import sys
import textwrap
import time
from pathlib import Path

import pytest

from correctness_tests.inner_sessions import leave_xdist
from gpuengine.gate import spread
from gpuengine.gate.ab import sides as ab_sides
from gpuengine.gate.ab.sides import BASE, HEAD, Sides, Worker, progress_message
from gpuengine.gate.ab.worker import PROGRESS_LOGGERS, route_progress
from gpuengine.gate.progress import HANDLER

REPO = Path(__file__).resolve().parents[2]
AB = REPO / "gpuengine" / "gate" / "ab"   # where the real worker script lies

FAKE_WORKER = """
import logging, os, sys, time
sys.path.insert(0, {ab!r})
import worker as ab_worker   # the real worker's channel, its routing of the progress loggers and its protocol number

channel = ab_worker.load_channel().Channel(0, os.dup(1))
os.dup2(2, 1)
ab_worker.route_progress(sys.stderr)
autotune = logging.getLogger("gpuengine.autotune")
channel.send(("ok", {{"protocol": ab_worker.PROTOCOL}}))
while True:
    op, args = channel.receive()
    if op == "quit":
        channel.send(("ok", None))
        break
    print("an engine's other output, not progress", file=sys.stderr)
    for done in (0, 40, 96):
        autotune.info("cuDNN autotune: %d graphs timed, %d to go, %d s", done, 96 - done, done // 3)
        time.sleep(0.3)
    autotune.debug("below INFO: not relayed")
    logging.getLogger("gpuengine.other").warning("another logger: not relayed")
    channel.send(("ok", "built"))
"""


@pytest.fixture
def fake_worker_script(tmp_path, monkeypatch) -> Path:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER.format(ab=str(AB)))
    monkeypatch.setattr(ab_sides, "WORKER_SCRIPT", script)
    monkeypatch.setattr(ab_sides, "PROGRESS_POLL_S", 0.05)
    return script


def test_a_workers_progress_is_relayed_while_the_session_waits_for_its_reply(tmp_path, fake_worker_script):
    relayed: list[tuple[float, str]] = []
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "base.log").write_text("gpuengine.autotune: a line of the last session: not again\n")
    worker = Worker(BASE, tmp_path, tmp_path / "logs", progress=lambda line: relayed.append((time.monotonic(), line)))
    try:
        worker.start()
        assert worker.request("build", "perf_tests.test_x", "test_x", "case") == "built"
        replied = time.monotonic()
    finally:
        worker.stop()
    assert [line for _, line in relayed] == ["[base] cuDNN autotune: 0 graphs timed, 96 to go, 0 s",
                                             "[base] cuDNN autotune: 40 graphs timed, 56 to go, 13 s",
                                             "[base] cuDNN autotune: 96 graphs timed, 0 to go, 32 s"]
    assert relayed[0][0] < replied - 0.4, "the first line came only with the reply: not live"
    assert "an engine's other output" in worker.log_tail()   # the log keeps everything, the terminal the progress


def test_a_sessions_workers_relay_to_the_sessions_writer(tmp_path):
    write = print
    sides = Sides(tmp_path, tmp_path, tmp_path / "logs", None, progress=write)
    assert sides.workers[HEAD].progress is write and sides.workers[BASE].progress is write


def test_a_progress_line_is_told_from_the_rest_of_a_log(pytestconfig, monkeypatch):
    session_handler, _ = pytestconfig.stash[HANDLER]   # this session's own, writing to the terminal
    shown = []
    monkeypatch.setattr(session_handler, "write", shown.append)
    stream = io.StringIO()
    handler = route_progress(stream)
    try:
        logging.getLogger("gpuengine.autotune").info("cuDNN autotune: %d graphs timed", 3)
    finally:
        for name in PROGRESS_LOGGERS:
            logging.getLogger(name).removeHandler(handler)
            logging.getLogger(name).propagate = True
    (line,) = stream.getvalue().splitlines()
    assert progress_message(line) == "cuDNN autotune: 3 graphs timed" and shown == ["cuDNN autotune: 3 graphs timed"]
    assert progress_message("Traceback (most recent call last):") is None
    assert progress_message("gpuengine.autotuner: x") is None
    assert progress_message("gpuengine.autotune.cudnn: conv plans: 3 of 9") == "conv plans: 3 of 9"   # a child logger


PLAIN_TEST = """
import logging

def test_builds_an_engine():
    autotune = logging.getLogger("gpuengine.autotune")
    autotune.info("cuDNN autotune: %d graphs timed, %d to go, %d s", 40, 56, 31)
    autotune.debug("below INFO: not shown")
    logging.getLogger("gpuengine.other").info("another logger: not shown")
    print("the test's own output: captured")
"""


def test_a_plain_sessions_progress_goes_to_the_terminal_live(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    leave_xdist(monkeypatch)
    monkeypatch.setenv("GATE_PROGRESS_FILE", str(tmp_path / "gpu0.progress"))   # a spread run's per-GPU session
    pytester.makepyfile(test_engine=textwrap.dedent(PLAIN_TEST))
    result = pytester.runpytest_subprocess("-p", "gpuengine.gate.hooks", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    # On a line of its own inside the test's progress line, though the test passed and its output was captured.
    assert "\n  cuDNN autotune: 40 graphs timed, 56 to go, 31 s\n" in out
    assert "not shown" not in out and "captured" not in out
    assert (tmp_path / "gpu0.progress").read_text() == "cuDNN autotune: 40 graphs timed, 56 to go, 31 s\n"


class ScriptWorker(spread.Worker):
    """A per-GPU worker whose 'pytest' is a script: it writes progress as a session would, then ends."""

    def command(self, args: list[str]) -> list[str]:
        return [sys.executable, "-c", SPREAD_SESSION]


SPREAD_SESSION = """
import os, time
for done in (0, 96):
    with open(os.environ["GATE_PROGRESS_FILE"], "a") as lines:
        lines.write(f"[base] cuDNN autotune: {done} graphs timed\\n")
    time.sleep(0.5)
print("the session's own output")
"""


def test_a_spread_runs_progress_shows_as_it_comes_and_its_output_when_it_ends(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(spread, "PROGRESS_POLL_S", 0.05)
    workers = [ScriptWorker(f"gpu{i}", str(i), [], tmp_path / f"gpu{i}.json") for i in range(2)]
    assert spread.run_workers(workers, [], tmp_path) == {"gpu0": 0, "gpu1": 0}
    out = capsys.readouterr().out
    for name in ("gpu0", "gpu1"):
        first, last, ended = (out.index(f"[{name}] [base] cuDNN autotune: 0 graphs timed\n"),
                              out.index(f"[{name}] [base] cuDNN autotune: 96 graphs timed\n"),
                              out.index(f"===== perf worker {name} (exit status 0) =====\nthe session's own output"))
        assert first < last < ended
    assert out.index("[gpu1] [base] cuDNN autotune: 0") < out.index("===== perf worker gpu0")   # both at once
