"""The run's summary in markdown (gpuengine/gate/pr_summary.py), on constructed runs and on a stored H100 run."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from gpuengine.gate.pr_summary import RunFacts, Section, VerdictRow, render, write

REPO = Path(__file__).resolve().parents[2]
GREEN_H100_RUN = (REPO / "baselines_store" / "nvidia-h100-80gb-hbm3" / "Linux-CPython-3.12-64bit"
                  / "0039_66b85b0d8578bf575dde6f3b040a80de005cc3d9_20261127_212709.json")
BASE = "66b85b0d8578bf575dde6f3b040a80de005cc3d9"
INFER = "perf_tests/test_mlp.py::test_mlp_infer[tf32-resident-b8000]"
TRAIN = "perf_tests/test_cnn.py::test_cnn_train[tf32-graph8-resident-b128]"
STORED = "perf_tests/test_zoo.py::test_zoo_train[alexnet-tf32-streamed-b16]"
NEW = "perf_tests/test_resnet.py::test_resnet_train[cifar10-tf32-graph8-resident-b128]"
CRASHED = "perf_tests/test_transformer.py::test_transformer_train[seq64-tf32-graph8-b16]"


def ab_check(verdict: str, slowdown: float, interval=(-0.01, 0.01), bar=0.025, catches=0.031) -> dict:
    return {"mode": "A/B", "base": BASE[:7], "verdict": verdict, "slowdown": slowdown, "interval": list(interval),
            "p_slower": 0.001, "p_faster": 1.0, "bar": bar, "rounds": 11, "noise": "A/A", "catches_95pct": catches}


def bench(name: str, check: dict | None, ratio_checks=(), ab: bool = True) -> dict:
    info = {"ratio_checks": list(ratio_checks)}
    if check is not None:
        info["stored_run_check"] = check
    if ab and check is not None and check.get("mode") == "A/B":
        info["ab"] = {"base": BASE[:7], "base_commit": BASE, "base_why": "--against main"}
    return {"fullname": name, "name": name.split("::")[1], "stats": {}, "extra_info": info}


def run(benchmarks: list[dict], gpu: bool = True, failed=(), failures=None, tier="quick", targets_fail=False) -> dict:
    return {"machine_info": {"tier": "nvidia-h100-80gb-hbm3" if gpu else "cpu-tier",
                             "gpu": "NVIDIA H100 80GB HBM3" if gpu else "none", "cudnn": "9.19.0", "torch": "2.11.0",
                             "stack_lock": {"tier": "cuda13", "sha256": "52ff223d84e6", "matches": True,
                                            "differs": []}},
            "commit_info": {"id": "0123456789abcdef", "dirty": False},
            "gpuengine_gate": {"targets_fail": targets_fail, "failed_on_targets_only": [],
                               "failed_otherwise": list(failed), "failures": failures or {}},
            "gpuengine_tier_time": {"tier": tier, "on_gpu": gpu, "session_seconds": 540.0, "quick_tier_target_s": 600,
                                    "per_workload": {"mlp_infer": {"tests": 1, "seconds": 12.5,
                                                                   "timed_rounds_budget_s": 30}}},
            "benchmarks": benchmarks}


def visible(markdown: str) -> list[str]:
    """The lines GitHub shows before anything is clicked open: outside <details> blocks, blank lines left out."""
    shown, depth = [], 0
    for line in markdown.splitlines():
        depth += line.startswith("<details>")
        if depth == 0 and line.strip():
            shown.append(line)
        depth -= line.startswith("</details>")
    return shown


def test_a_green_run_fits_one_screen_its_passing_tests_grouped_out_of_sight():
    stored = json.loads(GREEN_H100_RUN.read_text())
    markdown = render(RunFacts(stored, 0, ["saved as a baseline: `baselines_store/...`"]))
    shown = visible(markdown)
    assert len(shown) <= 25, "\n".join(shown)
    assert shown[0] == "## gpuengine perf gate: passed"
    assert "42 tests measured: 1 improved, 41 not significant" in shown[1]
    assert "<details><summary>41 tests not significant" in markdown
    assert markdown.count("| not significant |") == 41 and "### Failures" not in markdown
    assert "**Stack**: cuda13 lock 52ff223d84e6, as locked; driver 580.159.04, CUDA 13.2, cuDNN 9.19.0" in markdown
    improved = next(line for line in shown if "test_mlp_infer[fp32-resident-b512]" in line)
    assert "| improved | -3.8% | -4.0%..-3.6% | 3.7% | 5.7% | A/B against 66b85b0 |" in improved
    assert "- a 5% slowdown: caught 95% of the time by 34 of 39 A/B tests" in markdown   # what each could catch
    assert "4 target(s) not met: goals, not failures" in markdown                        # collapsed, not failed
    assert "| stored run 0038 (66b85b0) |" in markdown   # the data-parallel tests compare with a stored run


def test_each_failure_is_listed_in_full_with_the_command_that_runs_it_again():
    claim = {"reference": "torch_graph", "compared_with": "torch_graph", "ratio": 1.02, "min_ratio": 1.1,
             "kind": "claim", "passed": False, "why": "held since run 0012"}
    stored_check = {"baseline_run": "Linux-CPython-3.12-64bit/0037_41b70ac2af7a_20261127_184301.json",
                    "verdict": "regressed", "reason": "Field ...", "noise": "prior",
                    "primary": {"slowdown": 0.081, "ci95": [0.05, 0.11], "min_effect": 0.034}}
    benchmarks = [bench(INFER, ab_check("regressed", 0.062, (0.041, 0.07))),
                  bench(TRAIN, ab_check("not significant", 0.001), [claim]),
                  bench(STORED, stored_check),
                  bench(NEW, {"verdict": "no baseline", "reason": "no stored baseline run has this test yet"})]
    failures = {INFER: "Performance has regressed: ...", TRAIN: "below a claim that has held",
                STORED: "Performance has regressed: ...", CRASHED: "RuntimeError: device out of memory"}
    facts = RunFacts(run(benchmarks, failed=sorted(failures), failures=failures), 1)
    markdown = render(facts)
    assert markdown.startswith("## gpuengine perf gate: FAILED (exit status 1)")
    assert "### Failures (4)" in markdown
    assert (f"**`{INFER}`**: regressed: +6.2% (95% CI +4.1%..+7.0%), bar 2.5%, catches 3.1%; A/B against 66b85b0"
            in markdown)
    assert f"**`{STORED}`**: regressed: +8.1% (95% CI +5.0%..+11.0%), bar 3.4%; stored run 0037 (41b70ac)" in markdown
    assert f"**`{CRASHED}`**: RuntimeError: device out of memory" in markdown
    commands = re.findall(r"```\n(.*)\n```", markdown)
    assert commands == [  # the failures in test order, each run again as the session ran it
        "./gate perf --against 66b85b0d8578 -k 'test_cnn.py and test_cnn_train[tf32-graph8-resident-b128]'",
        "./gate perf --against 66b85b0d8578 -k 'test_mlp.py and test_mlp_infer[tf32-resident-b8000]'",
        "./gate perf --against 66b85b0d8578 -k 'test_transformer.py and test_transformer_train[seq64-tf32-graph8-b16]'",
        "./gate perf --against none -k 'test_zoo.py and test_zoo_train[alexnet-tf32-streamed-b16]'"]
    assert shlex.split(commands[0])[-1] == "test_cnn.py and test_cnn_train[tf32-graph8-resident-b128]"
    assert f"- `{TRAIN}` vs torch_graph: 1.020x, claim 1.1x (held since run 0012)" in markdown
    assert f"- `{NEW}`: no baseline: no stored baseline run has this test yet" in markdown


def test_the_nightly_tier_and_claims_policy_and_a_stack_base_are_in_the_command():
    nightly = RunFacts(run([bench(INFER, ab_check("regressed", 0.06))], failed=[INFER], tier="full"), 1)
    assert nightly.reproduce(INFER).startswith("./gate perf --against 66b85b0d8578 --full -k ")
    claims = RunFacts(run([bench(INFER, {"verdict": "not significant", "primary": {}})], failed=[INFER],
                          targets_fail=True), 1)
    assert claims.reproduce(INFER).startswith("./gate perf --against none --claims -k ")
    stack = bench(INFER, ab_check("regressed", 0.06))
    stack["extra_info"]["ab"] = {"base": "stack cuda13 lock 3f1a", "base_commit": None,
                                 "base_why": "--against-stack HEAD~1:locks/cuda13.txt"}
    assert RunFacts(run([stack], failed=[INFER]), 1).reproduce(INFER).startswith(
        "./gate perf --against-stack 'HEAD~1:locks/cuda13.txt' -k ")
    alone = RunFacts(run([], failed=[CRASHED]), 1)   # nothing says which base: ./gate perf's own default
    assert alone.reproduce(CRASHED) == ("./gate perf -k "
                                        "'test_transformer.py and test_transformer_train[seq64-tf32-graph8-b16]'")


def test_the_cpu_tier_says_nothing_gates_and_lists_no_claims_or_targets():
    target = {"reference": "torch_graph", "compared_with": "torch_graph", "ratio": 0.2, "min_ratio": 1.25,
              "kind": "target", "passed": False, "why": "a goal"}
    facts = RunFacts(run([bench(INFER, ab_check("regressed", 0.3), [target])], gpu=False), 0)
    markdown = render(facts)
    assert "**CPU tier (timings are smoke: nothing about timing gates)**" in markdown
    assert "### Regressed or improved (CPU tier: recorded, not gated)" in markdown
    assert "target" not in markdown and "goal" not in markdown.split("Tier time")[1]
    assert "Tier time: 9.0 min (this machine's)" in markdown


def test_verdicts_read_from_either_rules_record():
    ab = VerdictRow.from_record(INFER, ab_check("improved", -0.05, (-0.06, -0.04)),
                                 {"base_commit": BASE, "base_why": "x"})
    assert (ab.verdict, ab.slowdown, ab.interval, ab.bar, ab.catches, ab.rerun_against) == \
        ("improved", -0.05, (-0.06, -0.04), 0.025, 0.031, BASE[:12])
    none = VerdictRow.from_record(NEW, {"verdict": "not comparable", "reason": "stack changed (a -> b)",
                                         "stored_run": "M/0003_abcdef0123_2026.json"})
    assert (none.verdict, none.slowdown, none.reason, none.against) == \
        ("not comparable", None, "stack changed (a -> b)", "stored run 0003 (abcdef0)")


def test_sections_of_other_parts_of_the_gate_come_after_the_runs_own():
    markdown = render(RunFacts(run([]), 0), [Section("Why it regressed", ["kernel x: +40 µs"])])
    assert markdown.rstrip().endswith("### Why it regressed\n\nkernel x: +40 µs")


def test_the_summary_is_written_whole_and_appended_to_the_step_summary(tmp_path):
    step = tmp_path / "step_summary.md"
    step.write_text("## an earlier step\n")
    target = tmp_path / "build" / "summary.md"
    assert write("# first\n", target, {"GITHUB_STEP_SUMMARY": str(step)}) == [target, step]
    write("# second\n", target, {"GITHUB_STEP_SUMMARY": str(step)})
    assert target.read_text() == "# second\n"
    assert step.read_text() == "## an earlier step\n\n# first\n\n# second\n"
    assert write("# alone\n", target, {}) == [target]
    assert [p.name for p in target.parent.iterdir()] == ["summary.md"]   # nothing left aside


def test_an_interrupted_run_is_said_to_be_no_verdict():
    text = render(RunFacts(run([bench(INFER, ab_check("not significant", 0.0))]), 2))
    assert text.startswith("## gpuengine perf gate: interrupted: no verdict, nothing saved\n")
