"""The marking of thresholds.json's rules against the stored runs: a claim is never wired that they contradict.

A rule marked `claim` fails the gate when missed, so it must be one the engine
has met: the newest stored measurement of every test it decides, on its GPU,
meets it (gpuengine/gate/report/claims.py). A target that those measurements now
meet is a promotion candidate: reported (a warning here, and in the failure
message when a claim is wrong), not a failure, because making it a claim, and
at which floor, is a judgment on more than one run (docs/gate.md).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

from gpuengine.gate.report.claims import review
from gpuengine.gate.report.store import load_store

REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


class PromotionCandidates(UserWarning):
    """Targets the newest stored measurements meet: they may become claims."""


def test_every_claim_is_met_by_the_newest_stored_measurement_of_every_test_it_decides():
    found = review(load_store(REPO / "baselines_store"))
    assert found.claims_hold, found.report()
    if found.promotable:
        warnings.warn(PromotionCandidates(found.report()))


# A synthetic store: rules and runs written out as ./gate perf and an editor would.

def rule(test, reference, min_ratio, kind, gpu="*H100*") -> dict:
    return {"gpu": gpu, "test": test, "reference": reference, "min_ratio": min_ratio, "kind": kind, "why": "test"}


def write_run(store: Path, tier: str, gpu: str, name: str, when: str, ratios: dict[str, dict[str, float]],
              failed: bool = False) -> None:
    folder = store / tier / ("history" if failed else "") / "Linux-CPython-3.12-64bit"
    folder.mkdir(parents=True, exist_ok=True)
    benchmarks = [{"name": test, "fullname": f"perf_tests/t.py::{test}", "stats": {"median": 0.1},
                   "extra_info": {"ratios": {ref: {"median": r} for ref, r in refs.items()}}}
                  for test, refs in ratios.items()]
    run = {"machine_info": {"gpu": gpu, "tier": tier}, "commit_info": {"id": "abcdef0"}, "datetime": when,
           "benchmarks": benchmarks}
    (folder / name).write_text(json.dumps(run))


def store_with(tmp_path: Path, rules: list[dict]) -> Path:
    store = tmp_path / "store"
    store.mkdir()
    (store / "thresholds.json").write_text(json.dumps(rules))
    return store


def test_a_claim_the_newest_measurement_misses_is_reported_even_when_an_older_run_met_it(tmp_path):
    store = store_with(tmp_path, [rule("test_a[*]", "torch_graph", 1.5, "claim")])
    write_run(store, "nvidia-h100", H100, "0001_old.json", "2026-11-20T10:00:00+00:00",
              {"test_a[x]": {"torch_graph": 1.8}, "test_a[y]": {"torch_graph": 1.7}})
    write_run(store, "nvidia-h100", H100, "0001_new.json", "2026-11-21T10:00:00+00:00",
              {"test_a[x]": {"torch_graph": 1.2}}, failed=True)   # a failed run is still the newest measurement
    found = review(load_store(store))
    assert not found.claims_hold and found.unsupported == []
    (message,) = found.contradicted
    assert message.startswith("rule 0 (claim: gpu '*H100*', test 'test_a[*]', torch_graph >= 1.5x): test_a[x] vs "
                              f"torch_graph on {H100} (history/0001 abcdef0, failed run): claim 1.5x, measured "
                              "1.20x: not met")
    assert "Claims the newest stored measurement misses" in found.report()


def test_a_claim_nothing_measured_on_its_gpu_is_unsupported(tmp_path):
    store = store_with(tmp_path, [rule("test_a[*]", "torch_graph", 1.5, "claim", gpu="*H200*"),
                                  rule("test_a[*]", "torch_graph", 1.5, "claim")])
    write_run(store, "nvidia-h100", H100, "0001_a.json", "2026-11-20T10:00:00+00:00",
              {"test_a[x]": {"torch_graph": 1.8}})
    write_run(store, "cpu-tier", "none (CPU tier, NumPy backend)", "0001_cpu.json", "2026-11-20T10:00:00+00:00",
              {"test_a[x]": {"torch_graph": 0.1}})   # the CPU tier never counts, for or against
    found = review(load_store(store))
    assert found.contradicted == [] and len(found.unsupported) == 1
    assert found.unsupported[0].startswith("rule 0 (claim: gpu '*H200*'") and not found.claims_hold


def test_a_target_every_newest_measurement_meets_is_a_promotion_candidate_and_no_failure(tmp_path):
    store = store_with(tmp_path, [rule("test_a[*]", "torch_best", 1.2, "target"),
                                  rule("test_b[*]", "torch_graph", 1.2, "target"),
                                  rule("test_c[*]", "torch_graph", 1.2, "target"),
                                  rule("test_*", "*", None, "exempt")])
    write_run(store, "nvidia-h100", H100, "0001_a.json", "2026-11-20T10:00:00+00:00",
              {"test_a[x]": {"torch_graph": 1.3, "torch_eager": 2.0}, "test_a[y]": {"torch_graph": 1.25},
               "test_b[x]": {"torch_graph": 1.3}, "test_b[y]": {"torch_graph": 1.1}})
    found = review(load_store(store))
    assert found.claims_hold
    (candidate,) = found.promotable   # test_b holds in one case of two; test_c was never measured
    assert candidate.startswith("rule 0 (target: gpu '*H100*', test 'test_a[*]', torch_best >= 1.2x): test_a[x] "
                                "vs torch_best (torch_graph)")
    assert "test_a[y] vs torch_best (torch_graph)" in candidate and "target 1.2x, measured 1.25x: met" in candidate
    assert "promotion candidates" in found.report()
    assert sorted(found.evidence) == [0, 1, 2]   # the exempt rule decides nothing
