"""`python -m gpuengine profile WORKLOAD`: one training step's kernels by op family, the engine beside PyTorch.

    python -m gpuengine profile resnet --precision bf16 [--batch 128] [--cuda-graph 1] [--replays 5]
                                [--toggle batchnorm=engine] [--references torch_graph torch_compile_graph]
                                [--store baselines_store]
    python -m gpuengine profile resnet --against REV|DIR [...]     the base's engine and the head's, diffed
    python -m gpuengine profile-diff BASE.json HEAD.json [--runner gpuengine] [--top 10]

WORKLOAD is mlp, cnn, resnet, transformer or zoo:NAME (zoo:alexnet, ...), the
Transformer at its seed shape's 128 positions or at --length's. The
engine and each reference (torch_graph, and torch_compile_graph where
gpuengine/reference/torch_common.py offers it) are warmed up and captured,
then a few replays of their steps are profiled with CUPTI through
torch.profiler (capture.py); the table on stdout has the op families as rows
and the runners as columns, in microseconds per training step, and the whole
profile, every kernel included, goes to
baselines_store/<gpu>/profiles/<workload>-<toggles>.json, which the report
shows. --precision and --cuda-graph default to GPUENGINE_PRECISION and
GPUENGINE_CUDA_GRAPH, else tf32 and 1 (one captured step per launch);
--batch to the perf tests' batch of the workload. The data stay resident.
The engine runs with its default toggles, or with each `--toggle NAME=VALUE`
(as `./gate toggle-cost` takes them; the profile's file name and title
carry them); the references are the same either way.

Every argument is checked before anything is built (`check`). Exit status: 0
profiled and written; 1 the profile failed (the profiler saw no kernels,
replays were lost), could not be written, or a reference failed (its runner
says why; the others are written); 2 a usage error, a machine without a CUDA
GPU included: CUPTI has nothing to see on the CPU tier's NumPy backend.

With `--against REV|DIR` the engine alone is profiled twice, at the base
(REV checked out in a temporary worktree, or DIR, a checkout on disk: the
gate's A/B checkout, which __main__ hands in as `check_out`) and at the
working tree, each by its own checkout's command in a process of its own
(against.py), and the diff of the two is printed (diff.py); the profiles stay
under build/profile-against/, the stored ones are not touched. Status 1 when
a side (base or head) failed. `profile-diff` prints the diff of two profile files; a file
that is not a readable profile with that runner is a usage error naming it.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from datetime import datetime, timezone
from pathlib import Path

from ...config import CUDA_GRAPH_RANGE, PRECISIONS, EngineConfig
from ..cli_args import UsageError, output_folder, parse_toggle, whole, workload_entry
from ..json_files import JsonFileError
from . import diff as profile_diff
from .diff import DEFAULT_TOP, diff_profiles, format_diff, load_profile
from .record import ENGINE, case_words
from .workloads import ACCEPTED, LENGTHED, REFERENCE_CANDIDATES, offered_references

PROG = "python -m gpuengine profile"
DEFAULT_REPLAYS = 5
MAX_REPLAYS = 50   # each replay is one profiler cycle: more only makes the JSON and the wait longer


def add_parser(commands, check_out=None) -> None:
    """The profile command; `check_out(rev, root)`, where given, turns --against's REV|DIR into a checkout on disk
    (root, commit, label, cleanup()) or raises UsageError."""
    parser = commands.add_parser("profile", help="one training step's kernels by op family, engine vs PyTorch (GPU)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help=f"one of {ACCEPTED}")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="fp32 | tf32 | bf16 (default: GPUENGINE_PRECISION, else tf32)")
    parser.add_argument("--batch", type=whole(1), help="the training batch (default: the perf tests' for the workload)")
    parser.add_argument("--length", type=whole(1),
                        help=f"the sequence length, for {', '.join(LENGTHED)} (default: its seed shape's; the perf "
                             "tests run 64, 128, 256 and 384)")
    parser.add_argument("--cuda-graph", type=whole(*CUDA_GRAPH_RANGE),
                        help="the engine's training steps per graph launch, 0 for eager (default: "
                             "GPUENGINE_CUDA_GRAPH, else 1)")
    parser.add_argument("--replays", type=whole(1, MAX_REPLAYS), default=DEFAULT_REPLAYS,
                        help=f"profiled replays, each of one epoch; the median is kept (default {DEFAULT_REPLAYS})")
    parser.add_argument("--toggle", action="append", default=[], metavar="NAME=VALUE",
                        help="an engine toggle other than its default, e.g. batchnorm=engine (repeatable)")
    parser.add_argument("--references", nargs="*", choices=REFERENCE_CANDIDATES,
                        help="the PyTorch references to profile (default: those torch_common.py offers; the option "
                             "with no name profiles the engine alone)")
    parser.add_argument("--store", type=output_folder, default=Path("baselines_store"),
                        help="the store whose <gpu>/profiles/ folder receives the JSON (default: baselines_store)")
    if check_out is not None:
        parser.add_argument("--against", metavar="REV|DIR",
                            help="profile the engine at REV (a commit, in a temporary worktree) or DIR (a checkout) "
                                 "and at the working tree, each in its own process, and print the diff")
    parser.set_defaults(run=run, check=check, parser=parser, check_out=check_out, against=None)


def add_diff_parser(commands) -> None:
    parser = commands.add_parser("profile-diff", help="two kernel profiles compared: the families and kernels "
                                 "whose time per step moved most", description=profile_diff.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path, help="the base's profile (JSON, as `profile` writes it)")
    parser.add_argument("head", type=Path, help="the head's profile")
    parser.add_argument("--runner", "--side", dest="runner", default=ENGINE,
                        help=f"the runner compared (default {ENGINE}; or torch_graph, ...; --side: its older name)")
    parser.add_argument("--top", type=whole(1), default=DEFAULT_TOP,
                        help=f"kernels shown, those that moved most (default {DEFAULT_TOP})")
    parser.set_defaults(run=run_diff, check=check_diff, parser=parser)


def check_diff(args) -> None:
    """Both files read as profiles holding the runner; the diff made (args.diff)."""
    try:
        args.diff = diff_profiles(load_profile(args.base), load_profile(args.head), args.runner)
    except (JsonFileError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def run_diff(args) -> int:
    print(format_diff(args.diff, args.top))
    return 0


def no_cuda_reason() -> str | None:
    """Why kernels cannot be profiled here, or None: the engine needs a CUDA GPU through CuPy, the profiler
    through torch."""
    from ...runtime.backend import gpu_visible
    if not gpu_visible():
        return "no CUDA GPU is visible here (CuPy missing, or no device)"
    import torch
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (a CPU build of torch?)"
    return None


def check(args) -> None:
    """The workload, the references this checkout offers, and a CUDA GPU; fills in args.case and the defaults."""
    from .record import ProfileCase
    args.workload_entry = workload_entry(args.workload, args.length, "workload")
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"{PROG} profiles with torch.profiler and compares with PyTorch, and PyTorch is not "
                         "installed (the torch extra; ./gate installs it)")
    toggles = dict(parse_toggle(text, "--toggle") for text in args.toggle)
    if len(toggles) < len(args.toggle):
        raise UsageError(f"argument --toggle: a toggle is given twice in {' '.join(args.toggle)}")
    if args.against is not None and toggles:
        raise UsageError("argument --toggle: --against profiles base and head with their default toggles "
                         "(./gate toggle-cost compares a toggle)")
    if args.against is not None and args.references:
        raise UsageError(f"argument --references: --against profiles the engine alone (base and head); "
                         f"{' '.join(args.references)} goes without it")
    offered = offered_references()
    if args.references is None:
        args.references = list(offered)
    missing = [mode for mode in args.references if mode not in offered]
    if missing:
        raise UsageError(f"argument --references: {', '.join(missing)} is not offered by this checkout's "
                         f"gpuengine/reference/torch_common.py (its MODES); use {', '.join(offered) or 'none'}")
    args.references = list(dict.fromkeys(args.references))   # a name given twice is profiled once
    why = no_cuda_reason()
    if why:
        raise UsageError(f"no CUDA GPU to profile: {why}. {PROG} times kernels on the device with CUPTI; the CPU "
                         "tier's NumPy backend launches none")
    config = EngineConfig.from_env(precision=args.precision, cuda_graph=args.cuda_graph)
    args.case = ProfileCase(args.workload_entry.name, config.precision,
                            args.batch or args.workload_entry.default_batch(), config.cuda_graph,
                            tuple(toggles.items()), args.length)
    if args.against is not None:   # last: a checkout is made only once everything else is known to be right
        from ..machine_info import REPO
        args.references = []
        args.base = args.check_out(args.against, REPO)


def command_line(args) -> list[str]:
    """The command that profiles this case again, every default spelled out."""
    case = args.case
    return ["python", "-m", "gpuengine", "profile", *case_words(case), "--replays", str(args.replays),
            *[word for text in args.toggle for word in ("--toggle", text)], "--references", *args.references]


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_against(args) -> int:
    """The engine at the base and at the working tree, each profiled in its own process; their diff printed."""
    from ..cudnn_plans import PLAN_FILE
    from ..machine_info import REPO, current_tier
    from .against import SCRATCH, Checkout, SideFailed, head_checkout, profile_base_and_head
    base, tier = args.base, current_tier(on_gpu=True)
    try:
        diff = profile_base_and_head(args.case, Checkout(Path(base.root), base.commit, f"base {base.label}"),
                                     head_checkout(REPO), args.replays, tier.name, args.store / tier.name / PLAN_FILE,
                                     log=_log)
    except (SideFailed, JsonFileError, ValueError) as exc:
        return _error(f"{args.case.describe()} against {base.label}: {exc}", 1)
    finally:
        base.cleanup()
    print(format_diff(diff))
    print(f"profile: both profiles are kept under {SCRATCH}/: python -m gpuengine profile-diff {diff.base.path} "
          f"{diff.head.path}")
    return 0


def run(args) -> int:
    if args.against is not None:
        return run_against(args)
    from ..machine_info import checkout_commit, collect_machine_info, current_tier
    from .capture import ProfileError
    from .record import FAILED, format_text_table, make_record, profile_path, write_profile
    from .session import measure, reuse_cudnn_plans
    case = args.case
    tier = current_tier(on_gpu=True)
    path = profile_path(args.store, tier.name, case)
    plans = reuse_cudnn_plans(args.store, tier.name)
    _log(f"profile: {case.describe()} on {tier.gpu_label}; the engine's cuDNN plans: {plans}")
    try:
        runners = measure(case, args.workload_entry, args.references, args.replays, _log)
    except ProfileError as exc:
        return _error(f"{case.describe()}: {exc}; nothing written", 1)
    config = EngineConfig(precision=case.precision, cuda_graph=case.cuda_graph, resident_data=True, device="cuda",
                          **dict(case.engine_toggles))
    record = make_record(case, runners, collect_machine_info(tier, config), *checkout_commit(), args.replays, plans,
                         command_line(args), datetime.now(timezone.utc))
    print(format_text_table(record))
    try:
        write_profile(path, record)
    except OSError as exc:
        return _error(f"{path}: not written ({exc})", 1)
    print(f"profile: written to {path}")
    failed = [name for name, runner in runners.items() if runner.get(FAILED)]
    if failed:
        return _error(f"{', '.join(failed)} failed (said above and in {path}); the other runners were written", 1)
    return 0
