"""The A/B mode of the gate: `--against`, the base it names, and the `engine_for` fixture.

With `--against REV|DIR|auto` (gpuengine/gate/ab/checkout.py) the session checks out
the base, asks the base's perf modules, before the first test, which engine
recipes and cases they have, and then builds each covered test's engine in
both checkouts (gpuengine/gate/ab/sides.py). A test is covered when its module
names its recipe in `ENGINES` and the base has the same test and case. With
an explicit base, a test the base lacks stops the session with one error
naming the base and the tests, before anything runs or is saved; with `auto`
(what `./gate perf` passes) such a test is compared with its stored baseline
instead. Which tests really run A/B, and why the others do not, is said right
after collection (`pytest_report_collectionfinish`), once the base has listed
its recipes; the header only names the base. A base that cannot be checked
out or imported is one error too. The worktree and the workers go when the session ends, Ctrl-C
included. gpuengine/gate/hooks.py calls it after plugin.py configured the gate.

With `--head REV|DIR` beside an explicit `--against` the head is that
checkout instead of the working tree (`./gate bisect`'s steps, each a commit
against the good one): the working tree still runs the session, its tests,
references and rule, and both workers build their engines from their own
checkouts; a selected test either side lacks stops the session as above.

With `--against-stack LOCK` (gpuengine/gate/ab/stack.py, excluding `--against`)
the base is the working tree itself, run in the environment of another
lock, and everything else is as above.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuengine.gate.rules import aa_noise
from gpuengine.bench.json_files import JsonFileError
from gpuengine.gate.store.stored_runs import scan

from . import checkout, owner, stack as stack_ab
from .sides import BASE, HEAD, EnginePair, Interpreter, SideError, Sides
from .worker import close_runner
from ..plugin import GATE
from ..progress import terminal_writer

STORED_MODE = "stored-run mode"
LOG_DIR = Path("build") / "ab"   # a folder per session for its workers' logs (owner.py), git-ignored


@dataclass
class AbState:
    base: checkout.Base
    explicit: bool                      # named by the user, not chosen by auto
    head: checkout.Base | None = None   # --head: another checkout as the head (None: the working tree)
    base_code: str = ""                 # aa_noise.code_hash of each side: equal on an A/A run
    head_code: str = ""
    sides: Sides | None = None
    stack: stack_ab.StackBase | None = None   # --against-stack: the base is another lock's stack, the code the same
    covered: set[str] = field(default_factory=set)           # node ids run A/B
    uncovered: dict[str, str] = field(default_factory=dict)  # node id -> why it compares with its stored run
    log_dir: Path | None = None   # this session's own folder under LOG_DIR, held while it lives
    log_lock: int | None = None

    @property
    def same_code(self) -> str:
        if self.base_code != self.head_code:
            return ""
        return " (the same code on both stacks)" if self.stack is not None else " (the same code: an A/A run)"

    def close(self):
        if self.sides is not None:
            self.sides.close()
        self.base.cleanup()
        if self.log_lock is not None:
            os.close(self.log_lock)   # the logs stay until the next session in this clone starts
            self.log_lock = None
        if self.head is not None:
            self.head.cleanup()

    @property
    def checked_sides(self) -> dict[str, checkout.Base]:
        """The checkouts whose catalogs the session checks: the base's, and the head's where it is not this tree."""
        return {BASE: self.base, **({HEAD: self.head} if self.head is not None else {})}


AB = pytest.StashKey[AbState]()


def add_options(parser):
    group = parser.getgroup("gpuengine gate")
    group.addoption(
        "--against", metavar="REV|DIR|auto|none", default=None,
        help="A/B mode: time the engine of REV (a commit, checked out in a worktree; or DIR, a checkout on disk) "
             "and the working tree's in this session, rounds alternating, and fail on head-over-base slowdowns; "
             "auto: the merge base with main in a branch, the newest stored baseline's commit on main "
             "(./gate perf's default); none: compare with stored runs only (the default)")
    group.addoption(
        "--head", metavar="REV|DIR", default=None,
        help="with --against REV|DIR: the head is the engine of REV (checked out in a worktree) or of DIR instead "
             "of the working tree's; the working tree still runs the session (./gate bisect's steps)")
    group.addoption(
        stack_ab.AGAINST_STACK, metavar="LOCK", default=None,
        help="A/B mode across stacks: the working tree's engine in the environment of another lock (LOCK: a file, "
             "or REV:PATH such as HEAD~3:locks/cuda13.txt) as the base, and in this Python as the head; the "
             "base's venv is built in build/stacks/ (with GATE_NO_INSTALL=1: the packages this Python does not "
             "meet, from --stack-wheels); excludes --against")
    group.addoption(
        stack_ab.STACK_WHEELS, metavar="DIR", default=None,
        help="with GATE_NO_INSTALL=1 and --against-stack: the folder of wheels the base's packages are installed "
             "from (./gate wheels DIR --have FREEZE --lock LOCK fetches them; default: $GATE_STACK_WHEELS)")


def _newest_baseline_commit(storage: Path | None) -> str | None:
    if storage is None or not storage.exists():
        return None
    try:
        runs, _ = scan(storage)
    except JsonFileError:
        return None
    commits = [run.commit for run in runs if run.commit]
    return commits[-1] if commits else None


def configure(config):
    against, stack = config.getoption("against", None), config.getoption("against_stack", None)
    if stack is not None and against is not None:
        raise pytest.UsageError(f"gpuengine: --against {against} and {stack_ab.AGAINST_STACK} {stack}: one base at "
                                "a time (--against: another commit's code; --against-stack: another lock's stack, "
                                "the same code)")
    if config.getoption("stack_wheels", None) is not None and stack is None:
        raise pytest.UsageError(f"gpuengine: {stack_ab.STACK_WHEELS} goes with {stack_ab.AGAINST_STACK} LOCK (the "
                                "wheels of the base's stack)")
    head_spec = config.getoption("head", None)
    if head_spec is not None and (against or checkout.NONE) in (checkout.AUTO, checkout.NONE):
        raise pytest.UsageError(f"gpuengine: --head {head_spec} goes with --against REV|DIR (a base named, not "
                                f"{against or 'none'}, nor --against-stack)")
    state = config.stash.get(GATE, None)
    if state is None:
        return
    if stack is not None:
        _configure_stack(config, state, stack)
        return
    against = against or checkout.NONE
    if against == checkout.NONE:
        return
    try:
        stale = checkout.remove_stale_worktrees(config.rootpath)
    except checkout.BaseError as exc:
        state.notices.append(f"base worktrees of killed sessions not looked for: {exc}")
    else:
        if stale:
            state.notices.append(f"removed {len(stale)} base worktree(s) left by killed sessions: "
                                 + ", ".join(map(str, stale)))
    try:
        base, why = checkout.resolve(against, config.rootpath, _newest_baseline_commit(state.storage))
    except checkout.BaseError as exc:
        raise pytest.UsageError(f"gpuengine: {exc}") from None
    if base is None:
        state.notices.append(f"{STORED_MODE}: no A/B base ({why}); each test compares with its stored baseline")
        return
    head = None
    if head_spec is not None:
        try:
            head = checkout.named(head_spec, config.rootpath, "--head")
        except checkout.BaseError as exc:
            base.cleanup()
            raise pytest.UsageError(f"gpuengine: {exc}") from None
    ab = AbState(base, explicit=against != checkout.AUTO, head=head, base_code=aa_noise.code_hash(base.root),
                 head_code=aa_noise.code_hash(head.root if head is not None else config.rootpath))
    _start(config, state, ab)
    of_head = f" of the head {head.label} (checkout {head.root})" if head is not None else ""
    state.notices.append(f"A/B{of_head} base {base.label}{ab.same_code}: {why} (checkout {base.root}); which tests "
                         "run A/B is said once it has listed its recipes, after collection")


def _start(config, state, ab: AbState):
    """The session is A/B: its bar learned, its state kept and closed at the end, its own log folder held."""
    _learn_process_noise(state)
    config.stash[AB] = ab
    config.add_cleanup(ab.close)
    ab.log_dir, ab.log_lock = owner.session_folder(config.rootpath / LOG_DIR)


def _learn_process_noise(state):
    """Each test's process offset, from the stored A/A runs of this GPU kind (and, as the prior, of the others):
    the A/B rule's bar."""
    if state.storage is not None:
        state.process_noise = aa_noise.learned_noise(state.storage)


def _configure_stack(config, state, spec: str):
    """--against-stack: the base is the working tree in another lock's environment, built (or reused) now."""
    try:
        stack = stack_ab.resolve(spec, config.rootpath, no_install=stack_ab.no_install(),
                                 wheels=stack_ab.wheels_setting(config.getoption("stack_wheels", None)))
    except stack_ab.StackBaseError as exc:
        raise pytest.UsageError(f"gpuengine: {exc}") from None
    code = aa_noise.code_hash(config.rootpath)
    base = checkout.Base(config.rootpath, None, stack.label, f"{stack_ab.AGAINST_STACK} {spec}")
    ab = AbState(base, explicit=True, base_code=code, head_code=code, stack=stack)
    _start(config, state, ab)
    state.notices.append(stack.notice())   # the mode each test runs in follows after collection


def _plan_presets(config) -> dict | None:
    """The cuDNN plans the session starts from (gpuengine/gate/kept_plans.py), for both workers: None off a GPU."""
    from ..kept_plans import KEPT
    kept = config.stash.get(KEPT, None)
    if kept is None:
        return None
    return dict(kept["choices"].preset)


def ask_base(session):
    """Ask the base which of the selected tests it can build; stop before anything runs if it cannot."""
    ab = session.config.stash.get(AB, None)
    if ab is None:
        return
    wanted: dict[str, list] = {}
    for item in session.items:
        recipes = getattr(getattr(item, "module", None), "ENGINES", None)
        if isinstance(recipes, dict) and getattr(item, "originalname", None) in recipes:
            wanted.setdefault(item.module.__name__, []).append(item)
    if not wanted:
        return
    presets, interpreters, share_plans = _plan_presets(session.config), None, True
    if ab.stack is not None:
        interpreters = {BASE: Interpreter(ab.stack.env.python, ab.stack.env.environ)}
        share_plans = ab.stack.shares_plans
        if not share_plans and presets is not None:   # another cuDNN: each side autotunes every graph afresh
            presets = {}
    head_root = ab.head.root if ab.head is not None else session.config.rootpath
    ab.sides = Sides(head_root, ab.base.root, ab.log_dir, presets,
                     progress=terminal_writer(session.config),   # the workers' autotuning progress, live
                     interpreters=interpreters, share_plans=share_plans)
    lacking = []   # the sides that lack a selected test
    for side, checked in ab.checked_sides.items():
        try:
            catalog = ab.sides.catalog(side, sorted(wanted))
        except SideError as exc:
            pytest.exit(f"gpuengine: the {side} {checked.label} cannot serve A/B: {exc}", pytest.ExitCode.USAGE_ERROR)
        missing = _missing_tests(side, catalog, wanted)
        for node, why in missing.items():
            ab.uncovered[node] = f"{ab.uncovered[node]}; {why}" if node in ab.uncovered else why
        if missing:
            lacking.append(f"{side} {checked.label}'s")
    ab.covered = {item.nodeid for items in wanted.values() for item in items if item.nodeid not in ab.uncovered}
    if ab.uncovered and ab.explicit:
        lines = "\n  ".join(f"{node}: {why}" for node, why in sorted(ab.uncovered.items()))
        pytest.exit(f"gpuengine: the {' and the '.join(lacking)} tests differ from this tree's, nothing was run or "
                    f"saved (deselect them with -k, or --against another base):\n  {lines}",
                    pytest.ExitCode.USAGE_ERROR)
    state = session.config.stash[GATE]
    if ab.uncovered:
        state.notices.append(f"A/B: {len(ab.uncovered)} test(s) the base lacks compare with their stored baseline")


def _missing_tests(side: str, catalog: dict, wanted: dict[str, list]) -> dict[str, str]:
    """node id -> why, for each selected test a side's catalog (module -> test -> case ids, or why not) lacks."""
    missing = {}
    for module, items in wanted.items():
        tests = catalog.get(module)
        for item in items:
            case_id = item.callspec.id
            if not isinstance(tests, dict):
                missing[item.nodeid] = f"the {side}'s {module} {tests or 'is missing'}"
            elif case_id not in tests.get(item.originalname, []):
                missing[item.nodeid] = f"the {side}'s {module} has no such test or case"
    return missing


def mode_lines(config, items) -> list[str]:
    """The mode each selected test really runs in, now that the base has listed its recipes: A/B, or stored-run
    mode with why (the base lacks the test, or the test has no engine recipe)."""
    ab = config.stash.get(AB, None)
    if ab is None:
        return []
    lines = []
    if ab.covered:
        lines.append(f"gpuengine gate: A/B against {ab.base.label}{ab.same_code}: {len(ab.covered)} test(s), base "
                     "and head engines alternating round by round with the references, each in its own process; "
                     f"process noise learned from stored A/A runs (this GPU kind's, the others' as the prior) for "
                     f"{len(config.stash[GATE].process_noise)} test(s); worker logs in {ab.sides.log_dir}")
    if ab.uncovered:
        reasons = Counter(ab.uncovered.values())
        lines.append(f"gpuengine gate: {STORED_MODE} for {len(ab.uncovered)} test(s) the base {ab.base.label} cannot "
                     f"build ({'; '.join(f'{n}: {why}' for why, n in sorted(reasons.items()))}): each compares "
                     "with its stored baseline")
    recipeless = len(items) - len(ab.covered) - len(ab.uncovered)
    if recipeless:
        lines.append(f"gpuengine gate: {STORED_MODE} for {recipeless} test(s) without an engine recipe (ENGINES) "
                     "to build in a base: each compares with its stored baseline")
    return lines


def finish(session):
    """The workers stopped; the head's new plan choices join the session's, for kept_plans to save with the run."""
    ab = session.config.stash.get(AB, None)
    if ab is None or ab.sides is None:
        return
    ab.sides.close()
    from ..kept_plans import KEPT
    kept = session.config.stash.get(KEPT, None)
    tuned = ab.sides.tuned
    if kept is not None and ab.stack is not None and not ab.stack.shares_plans:
        # The head autotuned every graph afresh, by the session's choice, not because a stored plan failed to
        # build: its choices fill the plan file's gaps and leave the stored ones (--retune-cudnn replaces them).
        tuned = {key: entry for key, entry in tuned.items() if key not in kept["file"].plans}
    if kept is not None and tuned:
        kept["choices"].tuned.update(tuned)


def ab_state(config) -> AbState | None:
    return config.stash.get(AB, None)



@pytest.fixture
def engine_for(request):
    """engine_for(case) -> the test's engine runner from its module's `ENGINES` recipe: built here, or, for a
    test an A/B session covers, an `EnginePair` of the base's and the head's built in their workers."""
    recipes = getattr(request.module, "ENGINES", None)
    test = request.node.originalname
    if not isinstance(recipes, dict) or test not in recipes:
        raise pytest.UsageError(f"{request.module.__name__}: no ENGINES recipe for {test}")
    _, build = recipes[test]
    ab = ab_state(request.config)
    if ab is None or request.node.nodeid not in ab.covered:
        def local(case):
            runner = build(case)
            request.addfinalizer(lambda: close_runner(runner))
            return runner

        return local

    def pair(case) -> EnginePair:
        request.addfinalizer(ab.sides.drop)
        try:
            return ab.sides.pair(request.module.__name__, test, request.node.callspec.id)
        except SideError as exc:
            pytest.fail(f"A/B against {ab.base.label}: {exc}", pytrace=False)

    return pair


def ab_record(config, pair: EnginePair, times: dict[str, list[float]]) -> dict:
    """What the stored run keeps of the A/B rounds: both sides' round times and where each side came from (with
    --head also the head's; in a stack A/B also both locks and the change between them, gpuengine/gate/ab/stack.py),
    and how many other A/B sessions of this clone were running as the rounds ended (their rounds shared the machine)."""
    ab = config.stash[AB]
    return {"base": ab.base.label, "base_commit": ab.base.commit, "base_why": ab.base.why,
            "base_code": ab.base_code, "head_code": ab.head_code,
            "base_round_ms": [round(ms, 6) for ms in times[pair.base.name]],
            "head_round_ms": [round(ms, 6) for ms in times[pair.head.name]],
            "base_samples_per_round": pair.base.samples_per_round,
            "head_samples_per_round": pair.head.samples_per_round,
            "timing_cpu": {side.worker.side: side.worker.info.get("timing_cpu") for side in pair.sides},
            "python": {side.worker.side: side.worker.info.get("python") for side in pair.sides},
            "other_sessions": owner.others_alive(config.rootpath / LOG_DIR, ab.log_dir),
            **({"head": ab.head.label, "head_commit": ab.head.commit} if ab.head is not None else {}),
            **(ab.stack.record() if ab.stack is not None else {})}
