"""What a pytest session that a test starts (pytester, or `python -m pytest` in a subprocess) must not inherit.

Under `pytest -n N` each test runs in a pytest-xdist worker whose environment
names it (PYTEST_XDIST_WORKER, ...). An inner session that inherits those
believes it is a worker too, and pytest-benchmark there disables itself: no
run is timed or saved. Every test that starts one drops them here.
"""
from __future__ import annotations

import os

XDIST_PREFIX = "PYTEST_XDIST_"   # PYTEST_XDIST_WORKER, PYTEST_XDIST_WORKER_COUNT, PYTEST_XDIST_TESTRUNUID


def outside_xdist(environ=None) -> dict[str, str]:
    """`environ` (default: this process's) less pytest-xdist's worker variables: for a subprocess."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith(XDIST_PREFIX)}


def leave_xdist(monkeypatch) -> None:
    """Drop pytest-xdist's worker variables from this process for the test: pytester's sessions inherit it."""
    for name in [k for k in os.environ if k.startswith(XDIST_PREFIX)]:
        monkeypatch.delenv(name)
