"""What a regression rule says of one test: the words both rules use, their shared floor, and their interface.

Two rules decide whether a test got slower: paired.py (A/B: head and base
round by round in one session) and regression.py (stored-run mode: this run
against the newest stored one that timed the same runners). Each returns a
decision of the `Decision` shape, so the gate (gpuengine/gate/plugin.py)
records, prints and fails on either the same way.
"""
from __future__ import annotations

from typing import Protocol

REGRESSED, IMPROVED, NOT_SIGNIFICANT = "regressed", "improved", "not significant"
NOT_COMPARABLE = "not comparable"   # no signal in common with the stored run, or a run of another stack
NO_BASELINE = "no baseline"         # nothing stored to compare with yet
MIN_EFFECT = 0.02   # below 2% a slowdown is not worth a red build, however certain: both rules' floor


class Decision(Protocol):
    """One test's verdict with everything its line in the summary needs."""

    verdict: str

    def as_dict(self) -> dict:
        """The verdict and its evidence, as stored in the test's extra_info."""

    def line(self, fullname: str, against: str) -> str:
        """'<test> (<what it was compared with>) - <why>', pytest-benchmark's failure style."""
