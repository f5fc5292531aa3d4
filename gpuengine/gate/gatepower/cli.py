"""`./gate gatepower [study|calibrate]`: the gate's power study and its noise calibration.

    ./gate gatepower                 A/A and injected 5%/10% slowdowns on the `gatepower` case
                                                  of each workload: false-alarm and detection rates per test,
                                                  -> baselines_store/<tier>/gatepower/<date>_<commit>.json
    ./gate gatepower calibrate       the unchanged engine, every quick-tier perf test, in several
                                                  sessions -> each test's run-to-run noise in noise.json
    ./gate gatepower --from-trials DIR --store TIER [--against BASE]
                                                  no session: the study of the trials kept in DIR
                                                  (--keep-trials), e.g. of a study a lease cut short

Time budget: a session costs start-up (imports, torch.compile, capture) plus,
per test, the gate's own rounds and up to `--trials` trials (each: the test's
rounds at every level, the engine alternating with torch_graph), stopped at
`--trial-budget` seconds per test after two. Estimated from the stored H200
round times (not yet timed on a GPU): a study session of the MLP, CNN and
ResNet cases takes about 5-6 minutes on one H100, most of it compiling the
references, so the default 2 sessions take about 12 (`-k "not resnet"`:
about 5); a calibration costs about `sessions` quick-tier runs
(`-m gatepower` calibrates the study's cases only, about as long as the
study). `--budget-min` stops starting sessions once the next would overrun
it; `--sessions`, `--trials`, `--trial-budget`, `--levels`, `-k`, `--rounds`
shrink the work, `--session-timeout` bounds one session. Every option is
checked before the first session starts (`check`): a session costs minutes.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from gpuengine.gate.rules import aa_noise, paired
from gpuengine.bench.cli_args import UsageError, checked, number, output_folder, whole
from gpuengine.bench.json_files import write_json
from gpuengine.bench.machine_info import checkout_commit
from gpuengine.gate.rules.noise import NoiseTable
from gpuengine.gate.rules.regression import ALPHA, GOAL_POWER, GOAL_SLOWDOWN
from gpuengine.gate.store.stored_runs import GATEPOWER, NOISE_FILE, scan
from gpuengine.gate.rules.verdicts import MIN_EFFECT
from . import analysis, calibration
from .sessions import REPO, SessionPlan, kept_sessions, run_sessions
from .trials import parse_levels, read_trials

FORMAT = 1
STUDY_MARKER = "gatepower and not slow"
CALIBRATE_MARKER = "perf_workload and not slow"   # every case planned by gpuengine/gate/tiers.py
DEFAULT_SESSIONS = {"study": 2, "calibrate": 3}
DEFAULT_TRIALS = {"study": 10, "calibrate": 4}
MAX_TRIALS = 10   # docs/gate.md's maximum: past it another session teaches more than more trials in one


def _levels(text: str) -> str:
    """argparse type: the study's levels, checked here (the sessions read the text as given)."""
    try:
        parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_parser(commands) -> None:
    parser = commands.add_parser("gatepower", help="measure the regression gate's power; calibrate its noise",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", choices=("study", "calibrate"), default="study")
    parser.add_argument("--sessions", type=whole(1), help="separate pytest processes (default: study 2, calibrate 3)")
    parser.add_argument("--trials", type=whole(1, MAX_TRIALS),
                        help=f"at most this many trials per test and session, 1 to {MAX_TRIALS} "
                             "(default: study 10, calibrate 4)")
    parser.add_argument("--trial-budget", type=number(0, low_open=True), default=60.0,
                        help="seconds of trials per test and session; at least 2 trials run (default 60)")
    parser.add_argument("--levels", type=_levels, default="0,5,10",
                        help="study: injected slowdowns in %%, 0 first, each under 1000 (default 0,5,10)")
    parser.add_argument("-m", "--marker", help=f"pytest -m of the tests (default: study {STUDY_MARKER!r}, "
                                               f"calibrate {CALIBRATE_MARKER!r})")
    parser.add_argument("-k", "--keyword", help="pytest -k to narrow the tests")
    parser.add_argument("--full", action="store_true", help="the nightly tier's cases and rounds")
    parser.add_argument("--rounds", type=whole(1), help="rounds per trial (default: the gate's own choice)")
    parser.add_argument("--budget-min", type=number(0, low_open=True),
                        help="stop starting sessions once the next would overrun this many minutes")
    parser.add_argument("--session-timeout", type=number(0, low_open=True),
                        help="seconds before one session is stopped")
    parser.add_argument("--store", type=output_folder, help="tier folder for noise.json and gatepower/ "
                                                            "(default baselines_store/<tier>)")
    parser.add_argument("--against", default="none", metavar="REV|DIR|none",
                        help="study in A/B mode: each session times the engine of REV (or the checkout DIR) beside "
                             "the working tree's, the injected slowdown on the head only; REV = HEAD on a clean tree "
                             "makes level 0 an A/A run (default none: the stored-run rule's study)")
    parser.add_argument("--keep-trials", type=Path, help="keep the raw trial files and session logs here (a new "
                                                         "or empty folder)")
    parser.add_argument("--from-trials", type=Path, metavar="DIR",
                        help="run no session: analyse the trials a study kept in DIR (--keep-trials; its "
                             "session-N folders), with --store the GPU tier folder it ran for (a study cut short "
                             "by a lease, or analysed on another machine)")
    parser.set_defaults(run=main, check=check, parser=parser)


def check(args) -> None:
    """What would otherwise fail inside every session, or after the last, refused before the first."""
    sessions = args.sessions or DEFAULT_SESSIONS[args.action]
    trials = args.trials or DEFAULT_TRIALS[args.action]
    if sessions * trials < 2:
        raise UsageError(f"arguments --sessions {sessions} and --trials {trials}: sessions x trials must be >= 2: "
                         "one run has no run-to-run spread to learn and no pair to judge")
    keep = args.keep_trials
    if keep is not None:
        checked("--keep-trials", output_folder, str(keep))
        if keep.is_dir() and any(keep.iterdir()):
            raise UsageError(f"argument --keep-trials: {str(keep)!r} is not empty; old trials would mix in "
                             "(give a new or empty folder)")
    if args.from_trials is not None:
        if args.action != "study" or args.store is None:
            raise UsageError("argument --from-trials: analyses a study's kept trials; give the GPU tier folder they "
                             "were measured for with --store (and no calibrate)")
        if not kept_sessions(args.from_trials):
            raise UsageError(f"argument --from-trials: {str(args.from_trials)!r} holds no session-N folder of "
                             "trials (what --keep-trials keeps)")
        return
    if not (REPO / "perf_tests").is_dir():
        raise UsageError(f"{REPO} has no perf_tests/: gatepower runs from a checkout of the repository")
    if args.store is None:   # the result is written after the last session: its folder is checked now
        args.store = checked("--store", output_folder, str(REPO / "baselines_store" / _tier().name))


def _stored_gpu(store: Path) -> str:
    """The GPU named by the store's newest run (the tier of kept trials analysed on another machine)."""
    runs, _ = scan(store)
    return next((run.machine_info.get("gpu") for run in reversed(runs) if run.machine_info.get("gpu")), store.name)


def _tier():
    from ...config import EngineConfig
    from ...runtime.backend import resolve_device
    from gpuengine.bench.machine_info import current_tier
    return current_tier(resolve_device(EngineConfig.from_env()) == "cuda")


def _log(line: str):
    print(line, file=sys.stderr, flush=True)


def main(args) -> int:
    study = args.action == "study"
    sessions = args.sessions or DEFAULT_SESSIONS[args.action]   # check() refused 0 and the rest
    trials = args.trials or DEFAULT_TRIALS[args.action]
    levels = args.levels if study else "0"
    kept = args.from_trials is not None
    tier = None if kept else _tier()
    store = args.store or REPO / "baselines_store" / tier.name   # check() fills it in and checks it
    tier_name, gpu = (store.name, _stored_gpu(store)) if kept else (tier.name, tier.gpu_label)
    noise_path = store / NOISE_FILE
    try:   # a broken noise.json stops here, once, not in every session
        noise = NoiseTable.load(noise_path)
    except ValueError as exc:
        raise SystemExit(f"gatepower: {exc}") from None
    plan = SessionPlan(args.marker or (STUDY_MARKER if study else CALIBRATE_MARKER), args.keyword, levels, trials,
                       args.trial_budget, args.rounds, args.full, noise_path, args.session_timeout, args.against)
    started, date = time.monotonic(), datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="gatepower-") as scratch:
        work = args.keep_trials or Path(scratch)
        results = (kept_sessions(args.from_trials) if kept else
                   run_sessions(plan, sessions, work, args.budget_min * 60 if args.budget_min else None, _log))
        tests = read_trials([r.out_dir for r in results])
    failed = [r for r in results if r.returncode not in (0, None)]   # -1: stopped at --session-timeout
    for r in failed:
        _log(f"gatepower: session {r.index} exited with status {r.returncode}; see {r.log}"
             + ("" if args.keep_trials else " (--keep-trials DIR keeps the logs)"))
    if not tests:
        _log("gatepower: no test wrote trials (none selected, or every one failed or skipped)")
        return 1
    commit = checkout_commit()[0]
    if not study:
        learned = calibration.calibrate(tests, f"{date:%Y-%m-%d} at {commit[:10]}")
        calibration_info = {"date": date.isoformat(timespec="seconds"), "commit": commit, "sessions": len(results),
                            "trials": trials, "marker": plan.marker, "keyword": args.keyword, "full": args.full}
        path = noise.updated(learned, calibration_info).save(tier_name)
        print(calibration.format_table(learned))
        print(f"\nnoise of {len(learned)} tests written to {path}")
        return 1 if failed else 0
    process = aa_noise.learned_noise(store)
    stored_rule = {"alpha": ALPHA, "min_effect": MIN_EFFECT,
                   "noise_file": str(noise_path.relative_to(REPO) if noise_path.is_relative_to(REPO) else noise_path),
                   "noise_calibrated": bool(noise.tests)}
    figures = {name: analysis.analyse_test(test, noise, process.get(name)) for name, test in sorted(tests.items())}
    record = {
        "format": FORMAT, "tier": tier_name, "gpu": gpu, "commit": commit,
        "date": date.isoformat(timespec="seconds"), "command": ["./gate", *sys.argv[1:]],
        "sessions": len(results), "sessions_asked": len(results) if kept else sessions,
        "session_status": None if kept else [r.returncode for r in results],
        "from_trials": str(args.from_trials) if kept else None,
        "trials": trials, "levels_pct": levels, "rounds": args.rounds or "the gate's own (noise.json, budget)",
        "seconds": None if kept else round(time.monotonic() - started, 1),
        "against": args.against,
        "rule": stored_rule if args.against == "none" else {
            "mode": "A/B", "alpha": paired.ALPHA, "rank_alpha": paired.RANK_ALPHA, "min_effect": MIN_EFFECT,
            "process_noise": f"learned from the stored A/A runs of {len(process)} test(s), else the prior"},
        "targets": {"false_alarm_rate_max": ALPHA if args.against == "none" else paired.ALPHA,
                    f"detection_rate_{analysis.level_key(GOAL_SLOWDOWN)}_min": GOAL_POWER},
        "tests": figures, "families": analysis.summarise_families(figures),
    }
    path = write_json(store / GATEPOWER / f"{date:%Y%m%d_%H%M%S}_{commit[:10]}.json", record)
    print(analysis.format_table(figures))
    print(f"\n{len(figures)} tests, {len(results)} sessions x {trials} trials: written to {path}")
    return 1 if failed else 0
