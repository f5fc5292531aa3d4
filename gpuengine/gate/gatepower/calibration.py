"""Calibration: each test's run-to-run noise from unchanged trials in separate sessions, into noise.json.

The trials come from `./gate gatepower calibrate` (level 0 only);
the estimate is noise.estimate's (random-effects model, shrunk towards the
prior with few runs). Tests the calibration did not run keep their entry.
"""
from __future__ import annotations

from gpuengine.gate.rules.noise import CalibratedNoise, estimate
from .trials import TrialSet


def calibrate(tests: dict[str, TrialSet], calibrated: str) -> dict[str, CalibratedNoise]:
    """Per test, the noise of its unchanged trials grouped by session."""
    noise = {}
    for name, test in sorted(tests.items()):
        sessions = sorted({trial.session for trial in test.trials})
        grouped = [[t.samples for t in test.at(0.0) if t.session == s] for s in sessions]
        noise[name] = estimate(grouped, test.rounds, calibrated)
    return noise


def format_table(noise: dict[str, CalibratedNoise]) -> str:
    rows = [["test", "signal", "run-to-run", "round sd", "runs", "rounds now", "recommended", "caught 95% at"]]
    for name, entry in sorted(noise.items()):
        signal, values = ("ratio", entry.ratio) if entry.ratio else ("time", entry.time)
        rows.append([name.split("::")[-1], f"{signal} vs {entry.reference}" if entry.ratio else signal,
                     f"{values.between_run_sd:.2%}", f"{values.round_sd:.2%}", str(entry.runs), str(entry.rounds),
                     str(entry.recommended_rounds), f"{entry.detectable_slowdown:.1%}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

