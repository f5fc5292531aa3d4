"""Host time of one eager cuDNN execution, as the engine calls the frontend: a stack refresh's cost to eager steps.

    python3 scripts/cudnn_execute_cost.py [--calls 5000]

Builds one small convolution graph through the engine (ops/cudnn.py), lets its first run choose the plan, then
times back-to-back executions by wall clock. The kernel takes a few microseconds, so the time per call is the
host's: the frontend's Python and binding work. Each way the frontend offers is timed, interleaved in rounds:
the engine's call (`execute_plan_at_index` with a uid -> pointer dict) and, where the frontend has them, the
ordered form (`tensor_uids=`, buffers in a tuple) and `execute()` of a pinned plan (`select_plan`), which skips
the per-call check of every candidate's exclusions. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    from gpuengine.runtime.backend import Backend, gpu_visible
    if not gpu_visible():
        print("cudnn_execute_cost: needs a GPU with CuPy and the cuDNN frontend; none is visible here",
              file=sys.stderr)
        return 2
    import cudnn
    import cupy
    import numpy as np
    from gpuengine.layers.geometry import Window
    from gpuengine.ops.cudnn import conv_forward, runtime_for

    backend = Backend("cuda")
    window = Window((8, 8), (3, 3), (1, 1), (1, 1, 1, 1))
    with backend.activate():
        x, w = cupy.ones((2, 8, 8, 16), np.float32), cupy.ones((16, 3, 3, 16), np.float32)
        y = cupy.zeros((2, 8, 8, 16), np.float32)
        bound = conv_forward(runtime_for(backend), "fp32", window, x, w, y)
        bound.run()   # chooses the plan
        graph, runtime = bound.graph, bound.runtime
        plan, workspace, handle = graph.plan, runtime.workspace.data.ptr, runtime.handle
        uids = tuple(bound.pointers)
        pointers = tuple(bound.pointers[u] for u in uids)
        ways = {"engine (uid dict)": lambda: graph.graph.execute_plan_at_index(bound.pointers, workspace, plan,
                                                                               handle=handle)}
        try:
            graph.graph.execute_plan_at_index(pointers, workspace, plan, handle=handle, tensor_uids=uids)
            ways["ordered (tensor_uids)"] = lambda: graph.graph.execute_plan_at_index(
                pointers, workspace, plan, handle=handle, tensor_uids=uids)
        except TypeError:
            pass   # a frontend without the ordered form
        if hasattr(graph.graph, "select_plan"):   # a frontend whose execute() runs a pinned plan
            graph.graph.select_plan(plan)
            graph.graph.execute(bound.pointers, workspace, handle=handle)   # builds the pinned plan once
            ways["pinned (execute)"] = lambda: graph.graph.execute(bound.pointers, workspace, handle=handle)
            ways["pinned, ordered"] = lambda: graph.graph.execute(pointers, workspace, handle=handle,
                                                                  tensor_uids=uids)
        stream = backend.stream   # the runtime's handle launches on it
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, call in ways.items():
                stream.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    call()
                stream.synchronize()
                times[name].append((time.perf_counter() - start) / args.calls * 1e6)
    print(json.dumps({"cudnn_frontend": str(cudnn.__version__), "cudnn": str(cudnn.backend_version()),
                      "plan": graph.plan_names[plan], "calls": args.calls, "rounds": args.rounds,
                      "us_per_call": {name: round(statistics.median(t), 2) for name, t in times.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
