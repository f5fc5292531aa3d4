"""Why an A/B test regressed: its case profiled at the base and at the head, and the kernels that moved, printed.

When tests that ran A/B (gpuengine/gate/ab/) regressed on a GPU, the session
ends by profiling each one's case, one captured step per replay, at the base's
checkout and at the head's, each by its own checkout's profile command in a
process of its own from the same kept cuDNN plans
(gpuengine/bench/profile/against.py), and prints the op families and kernels
whose time per step moved most (gpuengine/bench/profile/diff.py), on the
terminal and in the markdown summary. The largest slowdowns first, at most
`--profile-regressions N` tests (default 3; 0: none): each pair costs two
engine builds. A spread run (gpuengine/gate/spread.py) gives its per-GPU
sessions 0 and profiles the merged run's regressions itself, once the GPUs
are free, from a checkout of the base's commit (or the --against folder).

A perf test maps onto the profile command's cases by its name and case id
(`profile_case`): the training tests of the MLP, CNN, ResNet, Transformer and
zoo, and the loader's streamed training; where the profile cannot build the
test's case exactly (streamed data, another sequence length) it profiles the
nearest one and says what differs. Inference and the loader alone have no
profile case, and are named with why. Off a GPU nothing is profiled (CUPTI
needs a CUDA device), said once; a stack A/B (`--against-stack`) is not
profiled either: its base is another Python environment, not a checkout.
The profiler is a parameter of `explain`, so all of this runs on the CPU tier
with a stand-in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from gpuengine.bench.cudnn_plans import PLAN_FILE
from gpuengine.bench.machine_info import CPU_TIER
from gpuengine.bench.profile.against import SCRATCH, Checkout, head_checkout, profile_base_and_head
from gpuengine.bench.profile.diff import ProfileDiff, format_diff
from gpuengine.bench.profile.record import ProfileCase
from gpuengine.bench.profile.workloads import get_workload
from gpuengine.config import PRECISIONS
from gpuengine.gate.rules.verdicts import REGRESSED
from gpuengine.workloads import transformer
from gpuengine.workloads.registry import ENTRIES

from .ab import checkout
from .ab.session import ab_state
from .plugin import GATE
from .pr_summary import Section
from .summary import add_section

DEFAULT_LIMIT = 3   # regressed tests profiled per session: each is two engine builds, a minute or more on a GPU
TOP_KERNELS = 8
REPLAYS = 5
LINES = pytest.StashKey[list]()
# perf test function -> its workload in the table (a family's network is its case id's first word: zoo:alexnet)
PROFILED = {test: entry for entry in ENTRIES.values() for test in entry.profiled}
GRAPH, BATCH, SEQUENCE = re.compile(r"^graph(\d+)$"), re.compile(r"^b(\d+)$"), re.compile(r"^seq(\d+)$")


@dataclass(frozen=True)
class Regressed:
    test: str
    slowdown: float
    base: str   # the base's label, as the verdict names it


def regressed_ab_tests(run: dict) -> list[Regressed]:
    """The tests of a run (its JSON) that regressed head against base, the largest slowdown first."""
    found = []
    for bench in run.get("benchmarks", []):
        check = (bench.get("extra_info") or {}).get("stored_run_check") or {}
        if check.get("mode") == "A/B" and check.get("verdict") == REGRESSED:
            found.append(Regressed(bench["fullname"], float(check.get("slowdown", 0.0)), str(check.get("base", "?"))))
    return sorted(found, key=lambda r: (-r.slowdown, r.test))


def profile_case(test: str) -> tuple[ProfileCase | None, list[str]]:
    """The profile case of a perf test and what in it differs from the test's; (None, [why]) where there is none."""
    name, _, case_id = test.partition("::")[2].partition("[")
    words = case_id.rstrip("]").split("-")
    if name not in PROFILED:
        return None, [f"the profile command has no case for {name} (it profiles training steps: "
                      f"{', '.join(sorted(PROFILED))})"]
    entry = PROFILED[name]
    workload = f"{entry.name}:{words[0]}" if entry.members else entry.name
    try:
        profiled = get_workload(workload)
    except ValueError as exc:
        return None, [str(exc)]
    precision = next((w for w in words if w in PRECISIONS), None)
    if precision is None:
        return None, [f"its case id {case_id.rstrip(']')!r} names no precision"]
    graph = next((int(m[1]) for w in words if (m := GRAPH.match(w))), None)
    batch = next((int(m[1]) for w in words if (m := BATCH.match(w))), profiled.batch)
    differs = []
    if graph is None:
        differs.append("its case id names no steps per launch: profiled at 1")
    if "streamed" in words:
        differs.append("profiled with resident data: the test streams its batches from the host")
    length = next((int(m[1]) for w in words if (m := SEQUENCE.match(w))), None)
    if length == transformer.SEED_SHAPE.length:
        length = None   # the seed shape's: the case a plain `profile transformer` makes
    if "cifar100" in words:
        differs.append("profiled with CIFAR-10's 10 classes, the test has 100")
    return ProfileCase(profiled.name, precision, batch, 1 if graph is None else graph, length=length), differs


def explain(regressed: list[Regressed], profile: Callable[[ProfileCase], ProfileDiff], limit: int = DEFAULT_LIMIT,
            top: int = TOP_KERNELS) -> list[str]:
    """Per regressed test (at most `limit`), what its profiles at base and head say moved; a test without a profile
    case, or whose profiling failed, says why; the rest are named as not profiled."""
    lines = []
    for item in regressed[:limit]:
        case, differs = profile_case(item.test)
        title = f"{item.test}: head {item.slowdown:+.1%} against {item.base}"
        if case is None:
            lines += [f"{title}: not profiled: {differs[0]}", ""]
            continue
        try:
            diff = profile(case)
        except Exception as exc:   # noqa: BLE001  one failed profile must not lose the session's other results
            lines += [f"{title}: profiling {case.describe()} failed: {type(exc).__name__}: {exc}", ""]
            continue
        lines += [f"{title}; profiled: {case.describe()}", *(f"  ({why})" for why in differs),
                  *format_diff(diff, top).splitlines(), ""]
    if len(regressed) > limit:
        rest = ", ".join(item.test for item in regressed[limit:])
        lines.append(f"{len(regressed) - limit} more regressed test(s) not profiled (--profile-regressions "
                     f"{limit}): {rest}")
    return lines


def profiler(base: checkout.Base, root: Path, tier_name: str,
             log: Callable[[str], None]) -> Callable[[ProfileCase], ProfileDiff]:
    """The real profiler: the case at `base`'s checkout and at the working tree `root`, from the tier's kept plans
    (as gpuengine/gate/kept_plans.py keeps them), the profiles under build/profile-against/."""
    plans = root / "baselines_store" / tier_name / PLAN_FILE

    def profile(case: ProfileCase) -> ProfileDiff:
        return profile_base_and_head(case, Checkout(base.root, base.commit, f"base {base.label}"),
                                     head_checkout(root), REPLAYS, tier_name, plans, root / SCRATCH, log)
    return profile


def not_profiled(regressed: list[Regressed], on_gpu: bool, stack_base: bool) -> list[str]:
    """Why the regressed tests are not profiled at all, in one line; none where they are."""
    if not on_gpu:
        return [f"{len(regressed)} A/B test(s) regressed; not profiled: the CPU tier has no GPU to profile on"]
    if stack_base:
        return [f"{len(regressed)} A/B test(s) regressed; not profiled: the base is another lock's stack "
                "(--against-stack), not a checkout the profile command can run"]
    return []


def run_base(run: dict, against: str | None, root: Path) -> checkout.Base:
    """A spread run's base, checked out again once its sessions are gone: the --against folder where one was
    given, else the commit its A/B tests name; BaseError where neither can be had."""
    if against is not None and Path(against).is_dir():
        return checkout.from_folder(Path(against))
    commits = [(bench.get("extra_info") or {}).get("ab", {}).get("base_commit") for bench in run.get("benchmarks", [])]
    commit = next((c for c in commits if c), None)
    if commit is None:
        raise checkout.BaseError("the run's A/B tests name no base commit")
    return checkout.checkout(root, commit, "the base of the spread's A/B tests", commit[:7])


def explain_spread_run(run: dict, against: str | None, root: Path, limit: int = DEFAULT_LIMIT,
                       log: Callable[[str], None] = print) -> list[str]:
    """The profiles of a merged spread run's regressed A/B tests (gpuengine/gate/spread.py): none where none
    regressed or `limit` is 0."""
    regressed = regressed_ab_tests(run)
    if not regressed or limit <= 0:
        return []
    machine = run.get("machine_info") or {}
    whys = [str((bench.get("extra_info") or {}).get("ab", {}).get("base_why", "")) for bench in run["benchmarks"]]
    lines = not_profiled(regressed, machine.get("tier", CPU_TIER) != CPU_TIER,
                         any(why.startswith("--against-stack") for why in whys))
    if lines:
        return lines
    try:
        base = run_base(run, against, root)
    except checkout.BaseError as exc:
        return [f"{len(regressed)} A/B test(s) regressed; not profiled: {exc}"]
    try:
        return explain(regressed, profiler(base, root, machine["tier"], log), limit)
    finally:
        base.cleanup()


def summary_section(lines: list[str]) -> Section:
    return Section("Why it regressed: each test's engine profiled at the base and at the head",
                   ["```", *lines, "```"])


def add_options(parser):
    parser.getgroup("gpuengine gate").addoption(
        "--profile-regressions", metavar="N", type=int, default=DEFAULT_LIMIT,
        help="after an A/B session on a GPU, profile the base's and the head's engine of up to N regressed tests "
             f"and print the kernels that moved most (default {DEFAULT_LIMIT}; 0: none)")


def finish(session, exitstatus):
    """After the A/B workers are gone (ab/session.py, tryfirst), before the markdown summary (summary.py, trylast);
    not after Ctrl-C: whoever stopped the session does not want minutes of profiling."""
    config = session.config
    state, ab = config.stash.get(GATE, None), ab_state(config)
    limit = config.getoption("profile_regressions", 0)
    if (state is None or ab is None or state.study is not None or state.run is None or limit <= 0
            or exitstatus == pytest.ExitCode.INTERRUPTED):
        return
    regressed = regressed_ab_tests(state.run)
    if not regressed:
        return
    lines = not_profiled(regressed, state.tier.on_gpu, ab.stack is not None)
    if not lines:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        log = reporter.write_line if reporter is not None else print
        lines = explain(regressed, profiler(ab.base, config.rootpath, state.tier.name, log), limit)
    config.stash[LINES] = lines
    add_section(config, summary_section(lines))


def terminal_summary(terminalreporter):
    lines = terminalreporter.config.stash.get(LINES, None)
    if lines:
        terminalreporter.section("gpuengine: why it regressed (the engine profiled at the base and at the head)")
        for line in lines:
            terminalreporter.write_line(line)
