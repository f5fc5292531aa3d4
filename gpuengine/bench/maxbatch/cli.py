"""`python -m gpuengine maxbatch WORKLOAD`: the max-batch search of the engine and each PyTorch reference.

Every argument is checked before the first trial process starts (`check`):
each trial is a fresh process, so a bad workload, precision or shape, or a
GPU that is not there, would otherwise fail once per engine and mode, after
a Python start-up each, and a `--json` that cannot be written would fail only
after the whole search.
"""
from __future__ import annotations

import importlib.util
import sys

from ...config import BATCH_POOL_RANGE, PRECISIONS
from ..cli_args import UsageError, number, output_file, whole
from ..json_files import write_json
from .trial import ENGINES, MODES, TrialSpec, parse_cap

CPU_ENGINES = tuple(e for e in ENGINES if e != "torch_graph")   # torch_graph captures a torch.cuda.CUDAGraph
TORCH_ENGINES = tuple(e for e in ENGINES if e.startswith("torch_"))


def add_parser(commands) -> None:
    mb = commands.add_parser("maxbatch", help="largest batch under a memory cap, engine vs PyTorch",
                             description=__doc__.split("\n\n")[0])
    mb.add_argument("workload", help="e.g. mlp")
    mb.add_argument("--cap-gib", type=parse_cap, default=6.0,
                    help="memory cap of the whole process in GiB (default 6, seed note 000's card), or 'full'")
    mb.add_argument("--precision", choices=PRECISIONS, default="tf32", help="fp32 | tf32 | bf16 (default tf32)")
    mb.add_argument("--engines", nargs="+", choices=ENGINES,
                    help="which of the engine and the PyTorch references to search (default: all; with "
                         "--device cpu all but torch_graph, which captures a CUDA graph)")
    mb.add_argument("--batch-pool", nargs="+", type=whole(*BATCH_POOL_RANGE), default=[1, 2],
                    help="streamed-loader pool sizes to search for training (default: 1 2)")
    mb.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    mb.add_argument("--start", type=whole(1), default=1024, help="first batch tried; the search doubles from it")
    mb.add_argument("--limit", type=whole(1), default=1 << 31, help="largest batch tried (the table shows >= it)")
    mb.add_argument("--precision-target", type=number(0, 1, low_open=True, high_open=True), default=1e-3,
                    help="bisection stops within this fraction (between 0 and 1; default 0.001)")
    mb.add_argument("--shape", default="seed", help="the workload's shape: seed (the note's) | smoke (tiny)")
    mb.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu runs the plumbing on NumPy/CPU torch: nothing is capped or measured")
    mb.add_argument("--timeout", type=number(0, low_open=True), default=900,
                    help="seconds before one trial counts as an error (default 900)")
    mb.add_argument("--json", metavar="PATH", type=output_file,
                    help="also write every search and trial as JSON (its folder must exist)")
    mb.add_argument("--quiet", action="store_true", help="no per-trial progress on stderr")
    mb.set_defaults(run=run, check=check, parser=mb)


def check(args) -> None:
    """What the trial processes would each fail on, refused once, here; fills in the default engines."""
    from ...runtime.backend import gpu_visible
    from ...workloads.registry import SHAPE_KINDS
    from .workloads import MAX_BATCH_WORKLOADS
    if args.workload not in MAX_BATCH_WORKLOADS:
        raise UsageError(f"argument workload: {args.workload!r} is not accepted; max-batch trials know "
                         f"{', '.join(sorted(MAX_BATCH_WORKLOADS))}")
    if args.shape not in SHAPE_KINDS:
        raise UsageError(f"argument --shape: {args.shape!r} is not accepted; use one of {', '.join(SHAPE_KINDS)}")
    if args.device == "cuda" and not gpu_visible():
        raise UsageError("argument --device: cuda (the default) needs a GPU, and no CUDA GPU is visible here "
                         "(CuPy missing or no device); --device cpu runs the search on the NumPy backend "
                         "(and CPU torch), with nothing capped or measured")
    # A name given twice would search twice (hours on a GPU): each once, in the order given.
    args.modes, args.batch_pool = list(dict.fromkeys(args.modes)), list(dict.fromkeys(args.batch_pool))
    if args.engines is None:
        args.engines = list(ENGINES if args.device == "cuda" else CPU_ENGINES)
    elif args.device == "cpu" and "torch_graph" in args.engines:
        raise UsageError("argument --engines: torch_graph captures a torch.cuda.CUDAGraph and needs --device cuda; "
                         f"with --device cpu use {', '.join(CPU_ENGINES)}")
    args.engines = list(dict.fromkeys(args.engines))
    asked_torch = [e for e in args.engines if e in TORCH_ENGINES]
    if asked_torch and importlib.util.find_spec("torch") is None:
        raise UsageError(f"argument --engines: {', '.join(asked_torch)} need PyTorch, which is not installed "
                         "(the torch extra); --engines gpuengine searches the engine alone")


def run(args) -> int:
    from .search import compare_max_batches, format_table
    base = TrialSpec(workload=args.workload, precision=args.precision, cap_gib=args.cap_gib, shape=args.shape,
                     device=args.device)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    rows = compare_max_batches(base, args.engines, args.batch_pool, args.modes, start=args.start,
                               precision=args.precision_target, limit=args.limit, timeout_s=args.timeout, log=log)
    print(format_table(rows, args.cap_gib))
    if args.json:
        record = [{"workload": r.workload, "mode": r.mode, "precision": r.precision, "engine": r.engine,
                   "reference": r.reference, "ratio": r.ratio, "cap_gib": args.cap_gib,
                   "engine_search": r.engine_result.as_dict() if r.engine_result else None,
                   "reference_search": r.reference_result.as_dict() if r.reference_result else None}
                  for r in rows]
        try:   # aside and renamed: a failure leaves no half-written file
            write_json(args.json, record)
        except OSError as exc:
            print(f"python -m gpuengine maxbatch: error: --json {args.json}: not written ({exc})", file=sys.stderr)
            return 1
    failed = any(r is not None and r.error is not None
                 for row in rows for r in (row.engine_result, row.reference_result))
    return 1 if failed else 0
