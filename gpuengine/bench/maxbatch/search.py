"""The largest batch that fits under a memory cap: trials in fresh processes, doubling then bisection.

Seed note 000 asked how large a batch each engine fits on a 6 GB card, for one
training step (forward + backward + Adam) and for one inference pass. Each
trial runs `gpuengine.bench.maxbatch.trial` in a process of its own and comes back
FITS, OOM ("does not fit": an answer) or ERROR (anything else, with its
message: never counted as OOM). The search doubles from `start` until a trial
does not fit; then, where the fits measured their memory, it narrows the
bracket around the batch the measured memory slope predicts (device memory is
close to linear in batch, so two probes just below and above that batch
usually settle it, a few at most); then it bisects whatever is left until the
gap between the largest fit and the smallest failure is within `precision`
(0.1%) of the fit. Every probe only shrinks the bracket, so a bad prediction
costs trials, never correctness. An ERROR ends that search and is reported,
never raised, so one broken reference cannot take a table or a test suite down
with it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Callable

from .trial import ERROR, FITS, OOM, TrialSpec

PACKAGE_ROOT = Path(__file__).resolve().parents[2]   # the directory holding gpuengine/, for the child's path
TRIAL_TIMEOUT_S = 900
PREDICTED_PROBES = 3   # trials spent around the predicted batch, at most, before plain bisection takes over


class Status(Enum):
    FITS = FITS
    OOM = OOM
    ERROR = ERROR


@dataclass(frozen=True)
class TrialResult:
    batch: int
    status: Status
    peak_bytes: int | None = None
    measured_by: str | None = None
    error: str | None = None
    seconds: float | None = None
    details: dict = field(default_factory=dict, compare=False)   # everything else the trial reported

    @classmethod
    def from_record(cls, batch: int, record: dict, seconds: float | None = None) -> "TrialResult":
        known = {"status", "peak_bytes", "measured_by", "error", "batch", "seconds"}
        try:
            status = Status(record["status"])
        except (KeyError, ValueError):
            return cls(batch, Status.ERROR, error=f"trial printed an unreadable result: {record!r}", seconds=seconds)
        return cls(batch, status, record.get("peak_bytes"), record.get("measured_by"), record.get("error"),
                   seconds, {k: v for k, v in record.items() if k not in known})

    def describe(self) -> str:
        text = f"batch {self.batch}: {self.status.value}"
        if self.peak_bytes is not None:
            text += f", {self.peak_bytes / (1 << 30):.3f} GiB ({self.measured_by})"
        if self.seconds is not None:
            text += f", {self.seconds:.1f} s"
        return text + (f" - {self.error}" if self.error and self.status is not Status.FITS else "")


@dataclass
class SearchResult:
    max_batch: int                     # the largest batch that fit; 0 when even the smallest tried did not
    first_failure: int | None          # the smallest batch that did not fit (None: the search hit its limit)
    trials: list[TrialResult]
    error: TrialResult | None = None   # the trial that failed for another reason than memory, ending the search

    @property
    def ok(self) -> bool:
        return self.error is None and self.max_batch > 0

    def fits(self) -> list[TrialResult]:
        return sorted((t for t in self.trials if t.status is Status.FITS), key=lambda t: t.batch)

    def bytes_per_sample(self) -> float | None:
        """Marginal device bytes per sample: the slope of the measured peak between the smallest and largest fit.

        Fixed costs (context, weights, workspaces) cancel, unlike in peak / batch.
        """
        measured = [t for t in self.fits() if t.peak_bytes is not None]
        if len(measured) < 2 or measured[-1].batch == measured[0].batch:
            return None
        lo, hi = measured[0], measured[-1]
        return (hi.peak_bytes - lo.peak_bytes) / (hi.batch - lo.batch)

    def as_dict(self) -> dict:
        return {"max_batch": self.max_batch, "first_failure": self.first_failure,
                "bytes_per_sample": self.bytes_per_sample(),
                "error": None if self.error is None else self.error.describe(),
                "trials": [{"batch": t.batch, "status": t.status.value, "peak_bytes": t.peak_bytes,
                            "measured_by": t.measured_by, "error": t.error, "seconds": t.seconds} for t in self.trials]}


def _memory_limits(t: TrialResult) -> dict[str, tuple[int, int]]:
    """(bytes used, bytes allowed) for each measurement a fitting trial reported: the process and its allocator."""
    cap, baseline, pool = (t.details.get(k) for k in ("cap_bytes", "baseline_bytes", "allocator_bytes"))
    limits = {}
    if t.peak_bytes is not None and cap is not None:
        limits["process"] = (t.peak_bytes, cap)
    if pool is not None and cap is not None and baseline is not None:
        limits["allocator"] = (pool, cap - baseline)   # the allocator is limited to what the context leaves
    return limits


def predict_max_batch(fits: list[TrialResult]) -> float | None:
    """The batch where memory meets its limit, extrapolated linearly from the two largest measured fits.

    Done for the process's memory against the cap and for the allocator's pool against its limit; the
    smaller prediction wins (whichever runs out first). None where no two fits measured memory that grew.
    """
    predictions = []
    for kind in ("process", "allocator"):
        points = sorted((t.batch, *_memory_limits(t)[kind]) for t in fits if kind in _memory_limits(t))
        if len(points) < 2:
            continue
        (b0, used0, _), (b1, used1, allowed) = points[-2:]
        if b1 > b0 and used1 > used0:   # a flat or falling curve predicts nothing
            predictions.append(b1 + (allowed - used1) * (b1 - b0) / (used1 - used0))
    return min(predictions, default=None)


def find_max_batch(trial: Callable[[int], TrialResult], start: int = 1024, precision: float = 1e-3,
                   limit: int = 1 << 31, log: Callable[[str], None] | None = None) -> SearchResult:
    """Double from `start` until a trial does not fit, probe around the batch the memory slope predicts,
    then bisect to within `precision` of the fit."""
    if start < 1 or not 0 < precision < 1:
        raise ValueError(f"start={start} must be >= 1 and precision={precision} between 0 and 1")
    trials: list[TrialResult] = []

    def run(batch: int) -> TrialResult:
        result = trial(batch)
        trials.append(result)
        if log is not None:
            log(result.describe())
        return result

    def settled() -> bool:
        return failure - fit <= max(1.0, precision * fit)

    fit, failure, batch = 0, None, min(start, limit)
    while failure is None:
        result = run(batch)
        if result.status is Status.ERROR:
            return SearchResult(fit, failure, trials, result)
        if result.status is Status.OOM:
            failure = batch
        elif batch >= limit:
            return SearchResult(batch, None, trials)
        else:
            fit, batch = batch, min(2 * batch, limit)
    guess = predict_max_batch([t for t in trials if t.status is Status.FITS])
    if guess is not None and fit < guess < failure:   # a prediction outside the bracket is plainly wrong
        batch = min(max(int(guess * (1 - precision / 2)), fit + 1), failure - 1)   # just below it: should fit
        # One step either way from `batch` then leaves a bracket within precision.
        step = max(1, int(precision * batch / (1 + precision)))
        for _ in range(PREDICTED_PROBES):
            if settled() or not fit < batch < failure:   # done, or the next probe would be no use: bisect
                break
            result = run(batch)
            if result.status is Status.ERROR:
                return SearchResult(fit, failure, trials, result)
            # Step away from the prediction on the side the answer lies, doubling the step: a probe
            # just past the other side when the prediction was good, a few more when it was a bit off.
            if result.status is Status.FITS:
                fit = batch
                batch = min(fit + step, (fit + failure) // 2)   # past the middle, bisection does better
            else:
                failure = batch
                batch = max(failure - step, (fit + failure) // 2)
            step *= 2
    while not settled():
        batch = (fit + failure) // 2
        result = run(batch)
        if result.status is Status.ERROR:
            return SearchResult(fit, failure, trials, result)
        if result.status is Status.FITS:
            fit = batch
        else:
            failure = batch
    return SearchResult(fit, failure, trials)


def last_json_record(stdout: str) -> dict | None:
    """The last line of `stdout` that is a JSON object (libraries may print before it)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                return record
    return None


def _tail(text: str | bytes | None, lines: int = 12) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class SubprocessTrial:
    """trial(batch) -> TrialResult, each call a fresh `python -m gpuengine.bench.maxbatch.trial` process."""

    def __init__(self, spec: TrialSpec, timeout_s: float = TRIAL_TIMEOUT_S, python: str = sys.executable,
                 command: Callable[[int], list[str]] | None = None):
        self.spec, self.timeout_s, self.python = spec, timeout_s, python
        self.command = command or self.trial_command

    def trial_command(self, batch: int) -> list[str]:
        return [self.python, "-m", "gpuengine.bench.maxbatch.trial", *self.spec.to_argv(batch)]

    def __call__(self, batch: int) -> TrialResult:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
        start = time.perf_counter()
        # Output to files, not pipes, and the trial in a session of its own: helper processes it leaves
        # behind (torch.compile's workers) cannot hold the output open, and are killed with the session.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(self.command(batch), stdout=out, stderr=err, env=env, start_new_session=True)
            try:
                proc.wait(timeout=self.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_session(proc)
            seconds = time.perf_counter() - start
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if timed_out:
            return TrialResult(batch, Status.ERROR, seconds=seconds,
                               error=f"trial timed out after {self.timeout_s:g} s; stderr: {_tail(stderr)}")
        record = last_json_record(stdout)
        if record is None:
            return TrialResult(batch, Status.ERROR, seconds=seconds,
                               error=f"trial process {_exit_text(proc.returncode)} without a result; "
                                     f"stderr: {_tail(stderr) or '(empty)'}")
        return TrialResult.from_record(batch, record, seconds)


def _kill_session(proc: subprocess.Popen):
    """Kill whatever is left of the trial's session, then reap the trial itself."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass   # nothing left in the session
    proc.wait()


def search(spec: TrialSpec, start: int = 1024, precision: float = 1e-3, limit: int = 1 << 31,
           timeout_s: float = TRIAL_TIMEOUT_S, log: Callable[[str], None] | None = None) -> SearchResult:
    """The max-batch search of one engine or reference, one process per trial."""
    prefix = f"{spec.workload} {spec.mode} {spec.precision} {spec.label}: "
    return find_max_batch(SubprocessTrial(spec, timeout_s), start, precision, limit,
                          log=None if log is None else (lambda line: log(prefix + line)))


@dataclass
class MaxBatchRow:
    """One line of the table: an engine variant against one reference, for one mode."""

    workload: str
    mode: str
    precision: str
    engine: str | None
    engine_result: SearchResult | None
    reference: str | None
    reference_result: SearchResult | None

    @property
    def ratio(self) -> float | None:
        e, r = self.engine_result, self.reference_result
        if e is None or r is None or not e.ok or not r.ok:
            return None
        return e.max_batch / r.max_batch


def engine_specs(base: TrialSpec, batch_pools) -> list[TrialSpec]:
    """The engine's variants: resident data (no prefetch pool), and for training the streamed loader at each pool."""
    specs = [replace(base, engine="gpuengine", data="resident")]
    if base.mode == "train":
        specs += [replace(base, engine="gpuengine", data="streamed", batch_pool=p) for p in batch_pools]
    return specs


def compare_max_batches(base: TrialSpec, engines, batch_pools=(1, 2), modes=("train", "infer"), start: int = 1024,
                        precision: float = 1e-3, limit: int = 1 << 31, timeout_s: float = TRIAL_TIMEOUT_S,
                        log: Callable[[str], None] | None = None,
                        searcher: Callable[..., SearchResult] = search) -> list[MaxBatchRow]:
    """Search every engine variant and reference named in `engines`, per mode; pair them into table rows."""
    rows = []
    for mode in modes:
        mode_base = replace(base, mode=mode)
        ours = engine_specs(mode_base, batch_pools) if "gpuengine" in engines else []
        theirs = [replace(mode_base, engine=e) for e in engines if e != "gpuengine"]
        found = {spec.label: searcher(spec, start=start, precision=precision, limit=limit, timeout_s=timeout_s,
                                      log=log)
                 for spec in ours + theirs}
        for engine in [s.label for s in ours] or [None]:
            for reference in [s.label for s in theirs] or [None]:
                rows.append(MaxBatchRow(base.workload, mode, base.precision, engine, found.get(engine),
                                        reference, found.get(reference)))
    return rows


def _batch_text(result: SearchResult | None) -> str:
    if result is None:
        return "-"
    if result.error is not None:
        return "error"
    return f"{result.max_batch:,}" if result.first_failure is not None else f">={result.max_batch:,}"


def _per_sample_text(result: SearchResult | None) -> str:
    value = None if result is None else result.bytes_per_sample()
    return "-" if value is None else f"{value:,.0f}"


def format_table(rows: list[MaxBatchRow], cap_gib: float | None) -> str:
    """The max-batch table, then one line per search that ended in an error."""
    cap = "the whole device" if cap_gib is None else f"a {cap_gib:g} GiB cap"
    header = ("workload", "mode", "precision", "engine", "max batch", "reference", "max batch", "ratio",
              "B/sample engine", "B/sample ref")
    lines = [tuple(header)]
    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        lines.append((row.workload, row.mode, row.precision, row.engine or "-", _batch_text(row.engine_result),
                      row.reference or "-", _batch_text(row.reference_result), ratio,
                      _per_sample_text(row.engine_result), _per_sample_text(row.reference_result)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {4, 6, 7, 8, 9}
    text = [f"max batch of one step under {cap} (bytes/sample: marginal device bytes per sample)"]
    for line in lines:
        text.append("  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                              for i, (c, w) in enumerate(zip(line, widths))).rstrip())
    failed = {}
    for row in rows:
        for name, result in ((row.engine, row.engine_result), (row.reference, row.reference_result)):
            if result is not None and result.error is not None:
                failed[(row.mode, name)] = result.error.describe()
    text += [f"! {mode} {name}: {error}" for (mode, name), error in failed.items()]
    return "\n".join(text)
