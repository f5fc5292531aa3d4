"""Each batch norm of a workload timed alone, cuDNN's graphs against the engine's kernels (issue 38's lever):
which shapes the engine's one-launch batch norm loses on, where a step's profile only sums them.

    python3 scripts/bn_layers.py resnet --precision bf16 [--reps 50] [--out FILE]

Builds the workload's engine as a profile builds it (perf tests' network, batch, resident data, kept plans),
once with batchnorm=cudnn and once with batchnorm=engine, warms each up, then times every BatchNorm2D's
forward and backward (its launches as the step makes them): `reps` calls captured in one CUDA graph on the
engine stream, one replay between device events, as a step's graph runs them. Eager calls would time the host's
launches (13-23 us a call at a8d04cd, where the kernels of a 2x2 map take a few). Prints a table by layer and
one JSON object (per layer: shape, fused parts, microseconds a call).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_WARM = 5


def _time_us(backend, call, reps: int) -> float:
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
        timer.start()
        graph.launch()
        return timer.stop() * 1000.0 / reps


def layer_times(workload, precision: str, batchnorm: str, reps: int) -> list[dict]:
    """Per BatchNorm2D of the workload's network under `batchnorm`: its shape, fused parts and times."""
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.layers import BatchNorm2D
    case = ProfileCase(workload.name, precision, workload.batch, 1, (("batchnorm", batchnorm),))
    runner = workload.engine_runner(case)
    runner.prepare()
    rows = []
    for name, layer in runner.trainer.program.layers.items():
        if not isinstance(layer, BatchNorm2D) or getattr(layer, "x", None) is None:   # not built: fused away
            continue
        rows.append({"layer": name, "shape": list(layer.x.shape), "activation": layer.activation,
                     "residual": layer.res is not None, "mask": layer.mask is not None,
                     "forward_us": round(_time_us(runner.trainer.backend, layer.forward, reps), 2),
                     "backward_us": round(_time_us(runner.trainer.backend, layer.backward, reps), 2)})
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
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps {args.reps}: at least 1")
    if not gpu_visible():
        print("bn_layers: needs a GPU with CuPy and the cuDNN frontend; none is visible here", file=sys.stderr)
        return 2
    workload = get_workload(args.workload)
    cudnn, engine = (layer_times(workload, args.precision, bn, args.reps) for bn in ("cudnn", "engine"))
    print(f"{'layer':<28} {'shape':<20} {'fused':<14} {'cuDNN fwd':>9} {'engine fwd':>10} {'cuDNN bwd':>9} "
          f"{'engine bwd':>10}")
    for c, e in zip(cudnn, engine):
        fused = "+".join(p for p, on in (("res", c["residual"]), (c["activation"] or "", True), ("mask", c["mask"]))
                         if on and p)
        print(f"{c['layer']:<28} {'x'.join(map(str, c['shape'])):<20} {fused:<14} {c['forward_us']:>9.1f} "
              f"{e['forward_us']:>10.1f} {c['backward_us']:>9.1f} {e['backward_us']:>10.1f}")
    totals = {f"{bn}_{d}_us": round(sum(r[f"{d}_us"] for r in rows), 1)
              for bn, rows in (("cudnn", cudnn), ("engine", engine)) for d in ("forward", "backward")}
    print("totals:", totals)
    record = {"workload": args.workload, "precision": args.precision, "reps": args.reps, "totals": totals,
              "layers": [{**c, "engine_forward_us": e["forward_us"], "engine_backward_us": e["backward_us"]}
                         for c, e in zip(cudnn, engine)]}
    print(json.dumps(record))
    if args.out is not None:
        write_json(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
