"""Seed note 000's other axis: the largest batch that fits a 6 GiB card, engine vs each PyTorch reference.

For one training step (forward + backward + Adam) and for one inference pass
of the dense Rosenbrock MLP in TF32, each engine variant and each reference is
searched by `gpuengine.bench.maxbatch.search` (a fresh process per trial, doubling
then bisection to 0.1%, the 6 GiB cap enforced on the allocator and measured
from outside through NVML). The ratio engine / reference and the marginal
bytes per sample go into the stored run's `extra_info`; ratios are gated by
`baselines_store/thresholds.json`. The benchmark's own timing is a
confirmation trial of the engine at its maximum batch, in a fresh process
(it must fit again). The engine's searches are cached per session, so the
three reference tests of a mode search the engine once. Each search takes
minutes (torch_compile compiles in every trial): these tests are `slow`.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from gpuengine.bench.benchmarking import Comparison, RatioSummary
from gpuengine.bench.maxbatch.search import SearchResult, Status, SubprocessTrial, search
from gpuengine.bench.maxbatch.trial import TrialSpec

from gpuengine.gate.harness import record_and_gate

pytest.importorskip("torch", reason="PyTorch is not installed: no reference to compare the max batch with")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CAP_GIB = 6.0         # seed note 000's card
PRECISION = "tf32"
START = 1 << 16       # a few doublings to the 0.3-0.8 M samples a 6 GiB cap holds at the seed shape
REFERENCES = ("torch_eager", "torch_compile", "torch_graph")
PLAN_TOLERANCE = 0.05

_searches: dict[TrialSpec, SearchResult] = {}


def searched(spec: TrialSpec) -> SearchResult:
    """The search for `spec`, run once per session; an ERROR fails the test that needs it, with its message."""
    if spec not in _searches:
        _searches[spec] = search(spec, start=START, log=lambda line: print(line, flush=True))
    result = _searches[spec]
    if result.error is not None:
        pytest.fail(f"{spec.label} ({spec.mode}) max-batch search failed: {result.error.describe()}", pytrace=False)
    if result.max_batch == 0:
        pytest.fail(f"{spec.label} ({spec.mode}): not even batch 1 fits under {CAP_GIB} GiB", pytrace=False)
    return result


def engine_spec(mode: str, data: str = "resident", pool: int = TrialSpec.batch_pool) -> TrialSpec:
    return TrialSpec("mlp", mode, "gpuengine", PRECISION, CAP_GIB, pool, data, "seed", "cuda")


def summary(result: SearchResult) -> dict:
    at_max = next(t for t in result.trials if t.batch == result.max_batch)
    return {"max_batch": result.max_batch, "first_failure": result.first_failure,
            "bytes_per_sample": None if result.bytes_per_sample() is None else round(result.bytes_per_sample()),
            "peak_bytes_at_max": at_max.peak_bytes, "measured_by": at_max.measured_by,
            "trials": len(result.trials)}


def gate(benchmark, request, run_settings, targets, engine: str, ratios: dict[str, float]):
    """Record the ratios and check them against thresholds.json (a missed claim fails on a GPU tier, a missed
    target with --claims)."""
    comparison = Comparison(engine, {}, {}, {ref: RatioSummary(ref, r, r, r, [r]) for ref, r in ratios.items()})
    record_and_gate(benchmark, comparison, request.node.name, PRECISION, run_settings.tier, targets=targets)


def confirm_fit(spec: TrialSpec, batch: int) -> dict:
    """One more trial at the maximum batch in a fresh process: the search's answer must reproduce."""
    result = SubprocessTrial(spec)(batch)
    assert result.status is Status.FITS, f"{spec.label} at its max batch {batch} no longer fits: {result.describe()}"
    return result.details


CASES = [(mode, reference) for mode in ("train", "infer") for reference in REFERENCES]


@pytest.mark.parametrize("mode,reference", CASES, ids=[f"{PRECISION}-cap{CAP_GIB:g}-{m}-{r}" for m, r in CASES])
def test_mlp_max_batch(mode, reference, benchmark, request, run_settings, gate_targets):
    ours_spec = engine_spec(mode)
    ours = searched(ours_spec)
    theirs = searched(replace(ours_spec, engine=reference))
    details = benchmark.pedantic(confirm_fit, args=(ours_spec, ours.max_batch), rounds=1, iterations=1)
    plan, pool = details["plan"]["total"], details["allocator_bytes"]
    benchmark.extra_info.update({
        "cap_gib": CAP_GIB, "mode": mode, "shape": "seed",
        "max_batch": {ours_spec.label: summary(ours), reference: summary(theirs)},
        "ratio": round(ours.max_batch / theirs.max_batch, 4),
        "engine_plan_at_max": details["plan"], "engine_pool_bytes_at_max": pool,
    })
    # The engine's own report must account for its footprint to 5%, at the batch that matters, or it cannot tell
    # a user what fits.
    assert pool == pytest.approx(plan, rel=PLAN_TOLERANCE), f"pool {pool} bytes vs planned {details['plan']}"
    gate(benchmark, request, run_settings, gate_targets, ours_spec.label,
         {reference: ours.max_batch / theirs.max_batch})


def test_mlp_max_batch_pool_cost(benchmark, request, run_settings, gate_targets):
    """What the streamed loader's staged batch costs: max training batch at batch_pool 1 and 2."""
    one, two = engine_spec("train", "streamed", 1), engine_spec("train", "streamed", 2)
    at_one, at_two, resident = searched(one), searched(two), searched(engine_spec("train"))
    benchmark.pedantic(confirm_fit, args=(one, at_one.max_batch), rounds=1, iterations=1)
    benchmark.extra_info.update({
        "cap_gib": CAP_GIB, "mode": "train",
        "max_batch": {s.label: summary(r) for s, r in ((one, at_one), (two, at_two),
                                                       (engine_spec("train"), resident))},
        "pool1_over_pool2": round(at_one.max_batch / at_two.max_batch, 4),
    })
    # Pool 1 holds one device copy of the batch, pool 2 two (the batch buffers and the stage).
    assert at_one.max_batch > at_two.max_batch, (at_one.max_batch, at_two.max_batch)
    gate(benchmark, request, run_settings, gate_targets, one.label,
         {two.label: at_one.max_batch / at_two.max_batch})
