"""Can runtime-compiled cuDNN plans be built in other processes and brought in? The cold start's lever, measured.

    python3 scripts/cudnn_plan_transfer.py [--workers 4] [--precision tf32]

A cold set-up is mostly building runtime-compiled plans, one at a time: the frontend's build holds the GIL
(docs/gate.md, "Tier time"). This builds the batch-norm graphs of ResNet-50's shapes (the engine's own graphs,
ops/cudnn_batchnorm.py) twice: in worker processes that serialise every runtime-compiled candidate they built,
and then here, one after another, as the engine does today. Each serialised plan is deserialised here, its
time taken (does it skip the compilation?), run on the graph's buffers and its output compared bit for bit
with the plan of the same name built here. Prints one JSON object: the two wall times and, per plan, its
build time there and here (here shorter: something kept the compiled kernel between processes), how long
deserialising took and whether the outputs agree.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# ResNet-50's batch-norm inputs on CIFAR-10 at batch 128 (N, H, W, C)
SHAPES = [(128, 16, 16, 64), (128, 16, 16, 256), (128, 8, 8, 128), (128, 8, 8, 512), (128, 4, 4, 256),
          (128, 4, 4, 1024), (128, 2, 2, 512), (128, 2, 2, 2048)]


def bound_graph(backend, runtime, precision: str, shape):
    """The engine's batch-norm training-forward graph of `shape` (its plain form, which every precision builds),
    on fresh buffers, built."""
    import numpy as np
    from gpuengine.ops.cudnn_batchnorm import batchnorm_forward
    xp, channels = backend.xp, shape[-1]
    with backend.activate():
        x = xp.asarray(np.random.default_rng(shape[-1] + shape[1]).standard_normal(shape, np.float32))
        scale, bias = xp.ones(channels, np.float32), xp.zeros(channels, np.float32)
        mean, var = xp.zeros(channels, np.float32), xp.ones(channels, np.float32)
        y = xp.zeros(shape, np.float32)
        saved_mean, saved_inv_std = xp.zeros(channels, np.float32), xp.zeros(channels, np.float32)
        return batchnorm_forward(runtime, precision, x, scale, bias, mean, var, y, saved_mean, saved_inv_std,
                                 1e-5, 0.1)


def build_elsewhere(job):
    """A worker: build its shapes' graphs, then serialise each runtime-compiled plan it built."""
    precision, shapes = job
    from gpuengine.ops.cudnn import CudnnRuntime
    from gpuengine.runtime.backend import Backend
    backend = Backend("cuda")
    runtime, records = CudnnRuntime(backend), []
    for shape in shapes:
        graph = bound_graph(backend, runtime, precision, shape).graph
        for index in sorted(set(graph.plans) & graph.runtime_compiled):
            started = time.perf_counter()
            graph.graph.build_plan_at_index(index)   # makes it the plan serialize() writes
            again_ms = 1e3 * (time.perf_counter() - started)
            data = bytes(graph.graph.serialize())
            records.append({"shape": list(shape), "plan": graph.plan_names[index], "build_ms": graph.build_ms[index],
                            "build_again_ms": round(again_ms, 2), "bytes": len(data), "data": data})
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--precision", default="tf32", choices=("fp32", "tf32", "bf16"))
    args = parser.parse_args(argv)
    from gpuengine.runtime.backend import Backend, gpu_visible
    if not gpu_visible():
        print("cudnn_plan_transfer: needs a GPU with CuPy and the cuDNN frontend; none is visible here",
              file=sys.stderr)
        return 2
    import cudnn
    import numpy as np
    from gpuengine.ops.cudnn import CudnnRuntime

    jobs = [(args.precision, SHAPES[w::args.workers]) for w in range(args.workers)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        built = [r for records in pool.map(build_elsewhere, jobs) for r in records]
    elsewhere_s = time.perf_counter() - started

    backend = Backend("cuda")
    runtime = CudnnRuntime(backend)
    started = time.perf_counter()
    bound = {tuple(shape): bound_graph(backend, runtime, args.precision, shape) for shape in SHAPES}
    here_s = time.perf_counter() - started

    def output_of(run, y):
        """`y` on the host after `run()`."""
        run()
        backend.synchronize()
        return backend.to_host(y).copy()

    plans = []
    for record in built:
        here = bound[tuple(record["shape"])]
        graph = here.graph
        index = next((i for i, name in graph.plan_names.items() if name == record["plan"]), None)
        brought = cudnn.pygraph(handle=runtime.handle)
        started = time.perf_counter()
        brought.deserialize(runtime.handle, list(record["data"]))
        deserialize_ms = 1e3 * (time.perf_counter() - started)

        with backend.activate():
            runtime.reserve(max(graph.workspace_bytes.values()) + int(brought.get_workspace_size()))
            workspace = runtime.workspace.data.ptr
            y = here.buffers["y"]
            brought_y = output_of(lambda: brought.execute(here.pointers, workspace, handle=runtime.handle), y)
            here_y = None if index is None else output_of(
                lambda: graph.execute(here.pointers, workspace, index, runtime.handle), y)
        plans.append({k: v for k, v in record.items() if k != "data"} | {
            "build_here_ms": graph.build_ms.get(index), "deserialize_ms": round(deserialize_ms, 2),
            "same_output": None if here_y is None else bool(np.array_equal(here_y, brought_y))})
    print(json.dumps({"cudnn_frontend": str(cudnn.__version__), "precision": args.precision,
                      "workers": args.workers, "graphs": len(SHAPES), "runtime_compiled_plans": len(built),
                      "built_elsewhere_s": round(elsewhere_s, 2), "built_here_s": round(here_s, 2),
                      "plans": plans}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
