"""The max-batch search on the CPU: search logic on fake trials, and the comparison table.

No device is needed: the search is tested against fake trial functions with a
known threshold (some reporting memory that grows with the batch, as the real
trial does, so the search can predict where it meets the cap). The trial
processes themselves are test_maxbatch_trials.py's.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from gpuengine.__main__ import main as cli_main
from gpuengine.bench.maxbatch.search import (MaxBatchRow, SearchResult, Status, TrialResult, compare_max_batches,
    find_max_batch, format_table, predict_max_batch)
from gpuengine.bench.maxbatch.trial import TrialSpec

BYTES_PER_SAMPLE, FIXED_BYTES = 8_000, 500_000_000


class ThresholdTrial:
    """Fits up to `largest`; records the batches tried; peak = fixed + per-sample bytes."""

    def __init__(self, largest: int, error_at: int | None = None):
        self.largest, self.error_at, self.tried = largest, error_at, []

    def __call__(self, batch: int) -> TrialResult:
        self.tried.append(batch)
        if self.error_at is not None and batch >= self.error_at:
            return TrialResult(batch, Status.ERROR, error="NVRTC compilation failed")
        if batch > self.largest:
            return TrialResult(batch, Status.OOM, error="cupy OutOfMemoryError")
        return TrialResult(batch, Status.FITS, FIXED_BYTES + BYTES_PER_SAMPLE * batch, "fake")


class MeasuredTrial:
    """Device memory that is `memory(batch)` bytes, reported like the real trial; OOM when over the cap.

    The process holds `baseline` bytes after its context; the allocator's pool is the rest of the peak
    (less `overhead`: workspaces outside the pool). `largest`, when given, overrides the cap as the threshold:
    a device that runs out earlier than the measured memory says, so the prediction is off.
    """

    CAP, BASELINE = 6 << 30, 500 << 20

    def __init__(self, memory, largest: int | None = None, overhead: int = 64 << 20):
        self.memory, self.largest, self.overhead, self.tried = memory, largest, overhead, []

    def __call__(self, batch: int) -> TrialResult:
        self.tried.append(batch)
        peak = int(self.memory(batch))
        over = batch > self.largest if self.largest is not None else peak > self.CAP
        if over:
            return TrialResult(batch, Status.OOM, error="out of memory")
        return TrialResult(batch, Status.FITS, peak, "nvml_process",
                           details={"cap_bytes": self.CAP, "baseline_bytes": self.BASELINE,
                                    "allocator_bytes": peak - self.BASELINE - self.overhead})

    def largest_fit(self) -> int:
        """The exact answer: `largest`, or else found by bisecting the (growing) memory curve itself."""
        if self.largest is not None:
            return self.largest
        lo, hi = 0, 1 << 31
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.memory(mid) <= self.CAP else (lo, mid)
        return lo


def linear(per_sample: float, fixed: int = 600 << 20):
    return lambda batch: fixed + per_sample * batch


def doubling_trials(start: int, largest: int) -> int:
    """Trials the doubling phase takes: every power-of-two multiple of start up to the first failure."""
    count, batch = 1, start
    while batch <= largest:
        count, batch = count + 1, 2 * batch
    return count


def assert_exact(result: SearchResult, largest: int, precision: float = 1e-3):
    assert result.error is None
    assert result.max_batch <= largest < result.first_failure
    assert result.first_failure - result.max_batch <= max(1, precision * result.max_batch)


# -- the search ------------------------------------------------------------------------

@pytest.mark.parametrize("largest", [1, 1023, 1024, 399_507, 482_344, 524_288, 10_000_019])
def test_search_finds_the_largest_fit_within_a_tenth_of_a_percent(largest):
    fake = ThresholdTrial(largest)
    result = find_max_batch(fake, start=1024, precision=1e-3)
    assert result.error is None
    assert result.max_batch <= largest < result.first_failure
    assert result.first_failure - result.max_batch <= max(1, 1e-3 * result.max_batch)
    assert result.max_batch >= largest * (1 - 1e-3)
    assert len(fake.tried) < 45


def test_search_doubles_from_start_then_bisects():
    fake = ThresholdTrial(5000)
    find_max_batch(fake, start=1000)
    assert fake.tried[:4] == [1000, 2000, 4000, 8000]
    assert fake.tried[4] == 6000                       # the middle of the last fit and the first failure
    assert all(4000 < b < 8000 for b in fake.tried[4:])


def test_measured_memory_predicts_the_answer_in_two_trials_after_doubling():
    # The stored H200 engine search: about 8,300 bytes per sample, 705,000 samples under a 6 GiB cap.
    fake = MeasuredTrial(linear(8_272))
    largest = fake.largest_fit()
    assert 700_000 < largest < 710_000
    result = find_max_batch(fake, start=65_536)
    assert_exact(result, largest)
    assert len(fake.tried) == doubling_trials(65_536, largest) + 2        # was doubling + 10 (bisection)
    plain = find_max_batch(ThresholdTrial(largest), start=65_536)          # no cap measured: plain bisection
    assert len(plain.trials) - len(result.trials) >= 7


@pytest.mark.parametrize("per_sample", [1_000, 8_272, 20_271, 40_000])   # two fits before the first OOM
@pytest.mark.parametrize("start", [1, 1024, 65_536])
def test_measured_memory_search_is_exact_and_short(per_sample, start):
    fake = MeasuredTrial(linear(per_sample))
    largest = fake.largest_fit()
    result = find_max_batch(fake, start=start)
    assert_exact(result, largest)
    assert len(fake.tried) <= doubling_trials(start, largest) + 4


def test_the_allocator_limit_predicts_when_it_binds_first():
    # Workspaces outside the pool grow with the batch too: the allocator's limit is met before the cap is.
    fake = MeasuredTrial(linear(8_000), overhead=-(200 << 20))
    fits = [fake(b) for b in (262_144, 524_288)]
    by_cap = 524_288 + (fake.CAP - fits[1].peak_bytes) / 8_000
    assert predict_max_batch(fits) == pytest.approx(by_cap - (200 << 20) / 8_000)
    assert predict_max_batch(fits[:1]) is None                              # one point has no slope
    assert predict_max_batch([ThresholdTrial(10 ** 6)(b) for b in (1024, 2048)]) is None   # no cap reported


@pytest.mark.parametrize("memory,runs_out_at", [
    (lambda b: (600 << 20) + 2_000 * b + 0.012 * b * b, None),   # superlinear: the guess is about 6% high
    (lambda b: (600 << 20) + 40_000 * b ** 0.9, None),           # sublinear: the guess is low
    (linear(8_272), 0.997), (linear(8_272), 0.991),              # the device runs out a bit before the cap
    (linear(8_272), 0.8), (linear(8_272), 1.01),                 # far before it; after it
], ids=["superlinear", "sublinear", "0.3% early", "0.9% early", "20% early", "1% late"])
def test_a_misleading_prediction_still_finds_the_exact_answer(memory, runs_out_at):
    fake = MeasuredTrial(memory)
    if runs_out_at is not None:
        fake.largest = int(fake.largest_fit() * runs_out_at)
    largest = fake.largest_fit()
    result = find_max_batch(fake, start=65_536)
    assert_exact(result, largest)
    plain = find_max_batch(ThresholdTrial(largest), start=65_536)
    assert len(result.trials) <= len(plain.trials) + 3                     # a bounded price for a bad guess


def test_an_error_while_probing_the_prediction_ends_the_search():
    fake = MeasuredTrial(linear(8_272))

    def trial(batch):   # the doubling bracket is [524,288, 1,048,576]; anything inside it crashes
        inside = 524_288 < batch < 1_048_576
        return TrialResult(batch, Status.ERROR, error="Xid 79") if inside else fake(batch)
    result = find_max_batch(trial, start=65_536)
    assert result.error is not None and "Xid" in result.error.error
    assert (result.max_batch, result.first_failure) == (524_288, 1_048_576)
    assert len(result.trials) == doubling_trials(65_536, fake.largest_fit()) + 1   # no trial after the error


def plain_search_batches(largest: int, start: int, precision: float = 1e-3) -> list[int]:
    """The batches the search tried before memory predictions: doubling, then bisection."""
    tried, fit, batch = [], 0, start
    while batch <= largest:
        tried.append(batch)
        fit, batch = batch, 2 * batch
    tried.append(batch)
    failure = batch
    while failure - fit > max(1.0, precision * fit):
        batch = (fit + failure) // 2
        tried.append(batch)
        fit, failure = (batch, failure) if batch <= largest else (fit, batch)
    return tried


@pytest.mark.parametrize("largest", [1023, 399_507, 705_024])
def test_without_a_cap_measured_the_search_is_plain_doubling_and_bisection(largest):
    measured, cpu_tried = MeasuredTrial(linear(8_272), largest=largest), []

    def cpu_like(batch):   # as a CPU trial reports: no peak, no cap
        cpu_tried.append(batch)
        return replace(measured(batch), peak_bytes=None, details={})
    fake = ThresholdTrial(largest)                          # a peak, but no cap to extrapolate to
    find_max_batch(fake, start=1000)
    find_max_batch(cpu_like, start=1000)
    assert fake.tried == cpu_tried == plain_search_batches(largest, 1000)


def test_nothing_fits_is_an_answer_not_an_error():
    result = find_max_batch(ThresholdTrial(0), start=64)
    assert result.max_batch == 0 and result.first_failure == 1 and result.error is None and not result.ok


def test_an_error_ends_the_search_and_is_reported_not_raised():
    fake = ThresholdTrial(100_000, error_at=70_000)
    result = find_max_batch(fake, start=1024)
    assert result.error is not None and result.error.status is Status.ERROR
    assert "NVRTC" in result.error.error
    assert result.max_batch == 65_536 and not result.ok
    assert fake.tried[-1] == 131_072                   # no trial after the error


def test_the_search_stops_at_its_limit():
    result = find_max_batch(ThresholdTrial(10 ** 9), start=100, limit=1000)
    assert result.max_batch == 1000 and result.first_failure is None


def test_bytes_per_sample_is_the_marginal_slope():
    result = find_max_batch(ThresholdTrial(300_000), start=1024)
    assert result.bytes_per_sample() == pytest.approx(BYTES_PER_SAMPLE)


def test_search_rejects_nonsense_settings():
    with pytest.raises(ValueError):
        find_max_batch(ThresholdTrial(10), start=0)
    with pytest.raises(ValueError):
        find_max_batch(ThresholdTrial(10), precision=1.5)


# -- comparisons and the table ---------------------------------------------------------

def searched(largest: int, error: str | None = None) -> SearchResult:
    if error is not None:
        return SearchResult(0, None, [], TrialResult(1024, Status.ERROR, error=error))
    return find_max_batch(ThresholdTrial(largest), start=1024)


def test_engine_variants_and_references_pair_into_rows():
    asked = []

    def searcher(spec, **options):
        asked.append((spec.mode, spec.label))
        return searched(400_000 if spec.engine == "torch_eager" else 800_000)

    rows = compare_max_batches(TrialSpec(), ["gpuengine", "torch_eager"], batch_pools=(1, 2), searcher=searcher)
    train = [r for r in rows if r.mode == "train"]
    assert [r.engine for r in train] == ["gpuengine[resident]", "gpuengine[streamed,pool=1]",
                                         "gpuengine[streamed,pool=2]"]
    assert [r.engine for r in rows if r.mode == "infer"] == ["gpuengine"]
    assert all(r.ratio == pytest.approx(2.0, rel=2e-3) for r in rows)
    assert len(asked) == len(set(asked)) == 6          # each search once, however many rows use it


def test_table_lists_ratios_bytes_per_sample_and_errors():
    rows = [MaxBatchRow("mlp", "train", "tf32", "gpuengine[resident]", searched(500_000), "torch_eager",
                        searched(250_000)),
            MaxBatchRow("mlp", "train", "tf32", "gpuengine[resident]", searched(500_000), "torch_compile",
                        searched(0, error="InductorError: no C++ compiler"))]
    text = format_table(rows, 6.0)
    assert "6 GiB cap" in text
    line = next(line for line in text.splitlines() if "torch_eager" in line)
    assert "2.00x" in line and "8,000" in line and "mlp" in line and "train" in line and "tf32" in line
    assert "! train torch_compile: batch 1024: error" in text and "no C++ compiler" in text


def test_command_line_prints_the_table(capsys):
    code = cli_main(["maxbatch", "mlp", "--shape", "smoke", "--device", "cpu", "--engines", "gpuengine",
                     "--modes", "infer", "--start", "32", "--limit", "64", "--quiet", "--cap-gib", "full"])
    out = capsys.readouterr().out
    assert code == 0
    assert "whole device" in out and "gpuengine" in out and ">=64" in out
