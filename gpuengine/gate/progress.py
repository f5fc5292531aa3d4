"""The engine's progress through long set-ups, on the terminal while a test waits for them.

A first run autotunes cuDNN for minutes (ResNet-50, the zoo) before a test
times anything, and a session that prints nothing meanwhile looks hung. The
engine logs that progress through Python's logging, logger
"gpuengine.autotune" at INFO ("cuDNN autotune: 40 graphs timed, 56 to go,
31 s"), and knows nothing of pytest. pytest captures what a test prints, so
the lines go through the terminal reporter with capturing suspended, as
pytest's own live logging does:

- in this process (a plain session, or a test an A/B session runs here):
  `ProgressHandler` on those loggers, registered for the session;
- from an A/B session's workers: each worker writes the records to its log
  (gpuengine/gate/ab/worker.py) and the session relays the new lines while it
  waits for that worker's reply (gpuengine/gate/ab/sides.py) to `terminal_writer`,
  which gpuengine/gate/ab/session.py hands to the workers: "  [base] cuDNN
  autotune: ...".

A spread run's per-GPU sessions write to logs shown when they end, so each
also copies its progress lines to the file GATE_PROGRESS_FILE names, which
gpuengine/gate/spread.py shows as they come. gpuengine/gate/hooks.py starts and
stops it with the session. A session without a terminal reporter (-p no:terminal) shows no
progress on the terminal.
"""
from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import pytest

from .ab.worker import PROGRESS_LOGGERS

INDENT = "  "   # under the test's line, apart from pytest's own output
PROGRESS_FILE_ENV = "GATE_PROGRESS_FILE"   # where a session also appends its progress lines (spread.py's)


def terminal_writer(config: pytest.Config) -> Callable[[str], None]:
    """write(text): `text` on a line of its own on the terminal, now, even in the middle of a captured test (and
    at the end of GATE_PROGRESS_FILE where set)."""
    copy = os.environ.get(PROGRESS_FILE_ENV, "").strip()

    def write(text: str):
        if copy:
            with open(copy, "a") as lines:
                lines.write(text + "\n")
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
            reporter.write_line(INDENT + text)   # starts a new line where pytest's dots left one open

    return write


def new_lines(path: Path, read: int) -> tuple[list[str], int]:
    """The complete lines of file `path` past byte `read`, and the byte to read on from (a line still being
    written waits for the next look); none where the file is not there (yet)."""
    try:
        with open(path, "rb") as file:
            file.seek(read)
            chunk = file.read()
    except OSError:
        return [], read
    complete = chunk.rfind(b"\n") + 1
    return chunk[:complete].decode(errors="replace").splitlines(), read + complete


class ProgressHandler(logging.Handler):
    """The progress loggers' records, INFO and up, as lines through `write` (terminal_writer's)."""

    def __init__(self, write: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.write = write

    def emit(self, record: logging.LogRecord):
        try:
            self.write(self.format(record))
        except Exception:   # logging's rule: a handler that fails must not fail the code that logged
            self.handleError(record)


HANDLER = pytest.StashKey[tuple]()   # (the session's handler, each logger's level before it)


def start(config: pytest.Config):
    handler = ProgressHandler(terminal_writer(config))
    levels = {}
    for name in PROGRESS_LOGGERS:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)   # the root's WARNING would drop the records before any handler
        logger.addHandler(handler)
    config.stash[HANDLER] = (handler, levels)


def stop(config: pytest.Config):
    handler, levels = config.stash.get(HANDLER, (None, {}))
    for name, level in levels.items():
        logger = logging.getLogger(name)
        logger.removeHandler(handler)
        logger.setLevel(level)
