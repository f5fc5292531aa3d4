"""`python -m gpuengine profile WORKLOAD`: one training step's kernels by op family, the engine beside PyTorch.

    python -m gpuengine profile resnet --precision bf16 [--batch 128] [--cuda-graph 1] [--replays 5]
                                [--references torch_graph torch_compile_graph] [--store baselines_store]

WORKLOAD is mlp, cnn, resnet, transformer or zoo:NAME (zoo:alexnet, ...). The
engine and each reference (torch_graph, and torch_compile_graph where
gpuengine/reference/torch_common.py offers it) are warmed up and captured,
then a few replays of their steps are profiled with CUPTI through
torch.profiler (capture.py); the table on stdout has the op families as rows
and the sides as columns, in microseconds per training step, and the whole
profile, every kernel included, goes to
baselines_store/<gpu>/profiles/<workload>-<toggles>.json, which the report
shows. --precision and --cuda-graph default to GPUENGINE_PRECISION and
GPUENGINE_CUDA_GRAPH, else tf32 and 1 (one captured step per launch);
--batch to the perf tests' batch of the workload. The data stay resident.

Every argument is checked before anything is built (`check`). Exit status: 0
profiled and written; 1 the profile failed (the profiler saw no kernels,
replays were lost), could not be written, or a reference failed (its side
says why; the others are written); 2 a usage error, a machine without a CUDA
GPU included: CUPTI has nothing to see on the CPU tier's NumPy backend.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from datetime import datetime, timezone
from pathlib import Path

from ...config import CUDA_GRAPH_RANGE, PRECISIONS, EngineConfig
from ..cli_args import UsageError, output_folder, whole
from .workloads import ACCEPTED, REFERENCE_CANDIDATES, get_workload, offered_references

PROG = "python -m gpuengine profile"
DEFAULT_REPLAYS = 5
MAX_REPLAYS = 50   # each replay is one profiler cycle: more only makes the JSON and the wait longer


def add_parser(commands) -> None:
    parser = commands.add_parser("profile", help="one training step's kernels by op family, engine vs PyTorch (GPU)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", help=f"one of {ACCEPTED}")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="fp32 | tf32 | bf16 (default: GPUENGINE_PRECISION, else tf32)")
    parser.add_argument("--batch", type=whole(1), help="the training batch (default: the perf tests' for the workload)")
    parser.add_argument("--cuda-graph", type=whole(*CUDA_GRAPH_RANGE),
                        help="the engine's training steps per graph launch, 0 for eager (default: "
                             "GPUENGINE_CUDA_GRAPH, else 1)")
    parser.add_argument("--replays", type=whole(1, MAX_REPLAYS), default=DEFAULT_REPLAYS,
                        help=f"profiled replays, each of one epoch; the median is kept (default {DEFAULT_REPLAYS})")
    parser.add_argument("--references", nargs="*", choices=REFERENCE_CANDIDATES,
                        help="the PyTorch references to profile (default: those torch_common.py offers; the option "
                             "with no name profiles the engine alone)")
    parser.add_argument("--store", type=output_folder, default=Path("baselines_store"),
                        help="the store whose <gpu>/profiles/ folder receives the JSON (default: baselines_store)")
    parser.set_defaults(run=run, check=check, parser=parser)


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
    try:
        args.workload_entry = get_workload(args.workload)
    except ValueError as exc:
        raise UsageError(f"argument workload: {exc}") from None
    if importlib.util.find_spec("torch") is None:
        raise UsageError(f"{PROG} profiles with torch.profiler and compares with PyTorch, and PyTorch is not "
                         "installed (the torch extra; ./gate installs it)")
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
                            args.batch or args.workload_entry.default_batch(), config.cuda_graph)


def command_line(args) -> list[str]:
    """The command that profiles this case again, every default spelled out."""
    case = args.case
    return ["python", "-m", "gpuengine", "profile", case.workload, "--precision", case.precision, "--batch",
            str(case.batch), "--cuda-graph", str(case.cuda_graph), "--replays", str(args.replays),
            "--references", *args.references]


def _error(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args) -> int:
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
        sides = measure(case, args.workload_entry, args.references, args.replays, _log)
    except ProfileError as exc:
        return _error(f"{case.describe()}: {exc}; nothing written", 1)
    config = EngineConfig(precision=case.precision, cuda_graph=case.cuda_graph, resident_data=True, device="cuda")
    record = make_record(case, sides, collect_machine_info(tier, config), *checkout_commit(), args.replays, plans,
                         command_line(args), datetime.now(timezone.utc))
    print(format_text_table(record))
    try:
        write_profile(path, record)
    except OSError as exc:
        return _error(f"{path}: not written ({exc})", 1)
    print(f"profile: written to {path}")
    failed = [name for name, side in sides.items() if side.get(FAILED)]
    if failed:
        return _error(f"{', '.join(failed)} failed (said above and in {path}); the other sides were written", 1)
    return 0
