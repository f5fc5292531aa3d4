"""Each batch norm of a workload timed alone, cuDNN's graphs against the engine's kernels (issue 38's lever):
which shapes the engine's one-launch batch norm loses on, where a step's profile only sums them.

    python3 scripts/bn_layers.py resnet --precision bf16 [--reps 50] [--out FILE]
                                 [--batchnorm cudnn|engine|ticket] [--only REGEX] [--narrowest PACKS] [--widest PACKS]
                                 [--cold]

Three sides: cuDNN's graphs, the engine's kernels as planned (clusters on sm_90 where they fit), and the engine's
kernels on the ticket's ending alone (no clusters). --batchnorm times one side alone and --only the layers whose
names match: a few launches for `ncu` to read. --narrowest and --widest fix the packs of the engine's on-chip
tiles (ops/batchnorm.py FORCED_TILES): whether a warp reads whole sectors of a row, or whole lines; without them
each layer's first run times the plans of TILE_CHOICES and keeps one, as a trainer does.

Builds the workload's engine as a profile builds it (perf tests' network, batch, resident data, kept plans),
once a side, warms each up, then times every BatchNorm2D's
forward and backward (its launches as the step makes them): `reps` calls captured in one CUDA graph on the
engine stream, one replay between device events, as a step's graph runs them. Eager calls would time the host's
launches (13-23 us a call at a8d04cd, where the kernels of a 2x2 map take a few). A layer's calls back to back
find its few MB in L2, where a step's call may find them in device memory: --cold writes over the L2 before
each call and takes the writes' own time off (scripts/bn_in_step.py pairs either with a profile's launches).
Prints a table by layer and one JSON object (per layer: shape, fused parts, microseconds a call, each engine
side's cluster sizes).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_WARM = 5
L2_FLUSHES = 4   # --cold: each call after a write of this many times the L2's bytes
SIDES = ("cudnn", "engine", "ticket")
LABELS = {"cudnn": "cuDNN", "engine": "engine", "ticket": "ticket"}


def _graph_us(backend, call, reps: int) -> float:
    """Device microseconds a call, replayed from a graph of `reps` calls on the engine stream: the engine's kernels
    launch on the current stream and cuDNN's on its handle's (the engine stream), so both are captured there."""
    from gpuengine.runtime.capture import GraphCapturedStep
    with backend.activate():
        for _ in range(_WARM):
            call()
        graph = GraphCapturedStep(backend, call, reps, {})
        graph.capture()
        graph.launch()   # the first replay uploads the graph: not timed
        timer = backend.timer()
        backend.xp.cuda.runtime.profilerStart()   # ncu --profile-from-start off sees the timed replay alone
        timer.start()
        graph.launch()
        elapsed = timer.stop()
        backend.xp.cuda.runtime.profilerStop()
        return elapsed * 1000.0 / reps


def _l2_flush(xp):
    """A call that writes L2_FLUSHES times the device's L2 bytes on the current stream: the kernel after it finds
    its inputs in device memory."""
    l2_bytes = int(xp.cuda.Device().attributes["L2CacheSize"])
    buffer = xp.empty(L2_FLUSHES * l2_bytes // 4, dtype=xp.float32)
    return lambda: buffer.fill(1.0)


def _time_us(backend, call, reps: int, flush=None) -> float:
    """_graph_us of `call`; with `flush`, each call after a flush (cold: its inputs out of L2), the flushes' own
    time taken off. Repeating one layer's call alone keeps its few MB in L2, which a step's call does not find."""
    if flush is None:
        return _graph_us(backend, call, reps)

    def cold():
        flush()
        call()
    return _graph_us(backend, cold, reps) - _graph_us(backend, flush, reps)


def _plans(layer) -> list | None:
    """The engine kernels' grids (forward, backward): tiles, chunks, a tile's packs, the cluster size (1: the
    ticket's ending); None for cuDNN's graphs."""
    graphs = (getattr(layer, "_fwd_graph", None), getattr(layer, "_bwd_graph", None))
    sums = [getattr(graph, "sums", None) for graph in graphs]
    if None in sums:
        return None
    return [{"tiles": s.plan.tiles, "chunks": s.plan.chunks, "tile_packs": s.plan.tile_cols,
             "cluster": s.defines["CLUSTER"]} for s in sums]


def _grid_text(plan: dict) -> str:
    """tiles x chunks, a tile's packs, the cluster size (c1: the ticket's ending): "32x4 1p c4"."""
    return f"{plan['tiles']}x{plan['chunks']} {plan['tile_packs']}p c{plan['cluster']}"


def layer_times(workload, precision: str, side: str, reps: int, only: str = "", narrowest: int | None = None,
                widest: int | None = None, cold: bool = False) -> list[dict]:
    """Per BatchNorm2D of the workload's network on `side` (those named to match `only`): its shape, fused parts,
    times (`cold`: each call after an L2 flush) and the engine's grids."""
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.layers import BatchNorm2D
    from gpuengine.ops import batchnorm as ops_batchnorm
    case = ProfileCase(workload.name, precision, workload.batch, 1,
                       (("batchnorm", "cudnn" if side == "cudnn" else "engine"),))
    planned = ops_batchnorm.ON_CHIP_CHUNKS, ops_batchnorm.FORCED_TILES
    # the plan is made as the trainer builds, and chosen at its first run
    ops_batchnorm.ON_CHIP_CHUNKS = () if side == "ticket" else planned[0]
    ops_batchnorm.FORCED_TILES = None if narrowest is None and widest is None else (narrowest or 1, widest)
    try:
        runner = workload.engine_runner(case)
        runner.prepare()
    finally:
        ops_batchnorm.ON_CHIP_CHUNKS, ops_batchnorm.FORCED_TILES = planned
    rows = []
    flush = None
    if cold:
        with runner.trainer.backend.activate():
            flush = _l2_flush(runner.trainer.backend.xp)
    for name, layer in runner.trainer.program.layers.items():
        if not isinstance(layer, BatchNorm2D) or getattr(layer, "x", None) is None:   # not built: fused away
            continue
        if not re.search(only, name):
            continue
        rows.append({"layer": name, "shape": list(layer.x.shape), "activation": layer.activation,
                     "residual": layer.res is not None, "mask": layer.mask is not None, "plans": _plans(layer),
                     "forward_us": round(_time_us(runner.trainer.backend, layer.forward, reps, flush), 2),
                     "backward_us": round(_time_us(runner.trainer.backend, layer.backward, reps, flush), 2)})
    return rows


def main(argv=None) -> int:
    from gpuengine.bench.json_files import write_json
    from gpuengine.bench.profile.workloads import get_workload
    from gpuengine.config import PRECISIONS
    from gpuengine.runtime.backend import gpu_visible
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path, help="also write the JSON object here (written aside, renamed)")
    parser.add_argument("--batchnorm", choices=SIDES, help="time this side alone (default: both)")
    parser.add_argument("--only", default="", help="the layers whose names match this regular expression")
    parser.add_argument("--narrowest", type=int, help="the engine's on-chip tiles at least this many packs wide (1, "
                        "2, 4, 8; default: each layer times its plans and keeps one, as the trainer does)")
    parser.add_argument("--widest", type=int, help="the engine's on-chip tiles at most this many packs wide (1, 2, "
                        "4, 8; default: 32 channels)")
    parser.add_argument("--cold", action="store_true", help=f"each call after a write of {L2_FLUSHES}x the L2 cache "
                        "(its time taken off): inputs from device memory, as in a step")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")
    for option in ("narrowest", "widest"):
        packs = getattr(args, option)
        if packs is not None and packs not in (1, 2, 4, 8):
            parser.error(f"--{option} {packs}: 1, 2, 4 or 8 packs")
    if args.widest is not None and args.widest < (args.narrowest or 1):
        parser.error(f"--widest {args.widest} is narrower than --narrowest {args.narrowest}")
    try:
        re.compile(args.only)
    except re.error as error:
        parser.error(f"--only {args.only!r}: not a regular expression ({error})")
    if not gpu_visible():
        print("bn_layers: needs a GPU with CuPy and the cuDNN frontend; none is visible here", file=sys.stderr)
        return 2
    workload = get_workload(args.workload)
    sides = SIDES if args.batchnorm is None else (args.batchnorm,)
    times = {side: layer_times(workload, args.precision, side, args.reps, args.only, args.narrowest, args.widest,
                               args.cold)
             for side in sides}
    rows = times[sides[0]]
    planned = "engine" if "engine" in sides else None   # its grids, forward | backward
    print(f"{'layer':<28} {'shape':<20} {'fused':<14}" + "".join(f" {LABELS[s] + ' fwd':>10} {LABELS[s] + ' bwd':>10}"
                                                                  for s in sides) + ("  grids" if planned else ""))
    for index, row in enumerate(rows):
        fused = "+".join(p for p, on in (("res", row["residual"]), (row["activation"] or "", True),
                                         ("mask", row["mask"])) if on and p)
        grids = " | ".join(_grid_text(plan) for plan in times[planned][index]["plans"]) if planned else ""
        print(f"{row['layer']:<28} {'x'.join(map(str, row['shape'])):<20} {fused:<14}" + "".join(
            f" {times[s][index]['forward_us']:>10.1f} {times[s][index]['backward_us']:>10.1f}" for s in sides)
              + (f"  {grids}" if planned else ""))
    totals = {f"{side}_{d}_us": round(sum(r[f"{d}_us"] for r in times[side]), 1)
              for side in sides for d in ("forward", "backward")}
    print("totals:", totals, "(cold: each call after an L2 flush)" if args.cold else "(warm: L2 kept between calls)")
    record = {"workload": args.workload, "precision": args.precision, "reps": args.reps, "cold": args.cold,
              "only": args.only, "narrowest": args.narrowest, "widest": args.widest, "totals": totals,
              "layers": [{**{key: v for key, v in row.items() if not key.endswith("_us") and key != "plans"},
                          **{f"{side}_{d}_us": times[side][index][f"{d}_us"]
                             for side in sides for d in ("forward", "backward")},
                          **{f"{side}_plans": times[side][index]["plans"] for side in sides if side != "cudnn"}}
                         for index, row in enumerate(rows)]}
    print(json.dumps(record))
    if args.out is not None:
        write_json(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
