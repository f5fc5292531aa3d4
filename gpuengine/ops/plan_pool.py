"""cuDNN's runtime-compiled plans built in worker processes while this one goes on: a cold set-up's lever.

A cold set-up is mostly cuDNN compiling plans at run time (the batch norms'
knob variants: about 200 ms each, one after another, the frontend holding the
GIL while it builds; docs/gate.md, "Tier time"). cuDNN serialises a built
plan, and a serialised runtime-compiled plan deserialises in about 17 ms with
the same output (scripts/cudnn_plan_transfer.py on an H200). So where a graph's
definition can travel (a picklable `define`: the batch norms' and convolutions'), its
runtime-compiled candidates are built by a pool of worker processes, each
with a CUDA context and a cuDNN handle of its own on the same GPU, and the
graph brings them in when it is first executed; the layers' set-up builds the
other graphs meanwhile. `plan_workers` (GPUENGINE_PLAN_WORKERS) sizes the pool;
0, the default, builds every plan here, as before.

A worker defines the graph again from `define`, finds each asked-for plan by
its name among the heuristics' candidates, builds it and serialises it (the
frontend serialises the plan built last). Whatever fails there is left out,
as a plan that fails to build here is.
"""
from __future__ import annotations

import atexit
import multiprocessing
import pickle
import time
from concurrent.futures import Future, ProcessPoolExecutor

_POOL: dict = {}   # (device, workers) -> the pool; one per process
_WORKER: dict = {}   # in a worker: its cuDNN handle


def picklable(define) -> bool:
    """Whether a graph's definition can be sent to a worker."""
    try:
        pickle.dumps(define)
    except Exception:   # noqa: BLE001  closures, and whatever else pickle refuses, stay here
        return False
    return True


def pool(device: int, workers: int) -> ProcessPoolExecutor:
    """The process-wide pool of `workers` processes on CUDA device `device`, started on first use."""
    key = (device, workers)
    if key not in _POOL:
        # spawn: a forked CUDA context is unusable, and the workers import only what building needs
        _POOL[key] = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_start_worker, initargs=(device,))
        atexit.register(_POOL[key].shutdown, wait=False, cancel_futures=True)
    return _POOL[key]


def submit(device: int, workers: int, define_graph, plan_names, define, io_dtype: str, precision: str,
           deterministic: bool, names: list[str]) -> Future:
    """A future of {plan name: (serialised plan, build milliseconds)} for those of `names` that built;
    `define_graph` and `plan_names` are ops/cudnn.py's (module functions travel by name)."""
    return pool(device, workers).submit(build_serialised, define_graph, plan_names, define, io_dtype, precision,
                                        deterministic, names)


def _start_worker(device: int):
    import cudnn
    import cupy
    import ml_dtypes  # noqa: F401  numpy knows "bfloat16" by name only once ml_dtypes is imported
    cupy.cuda.Device(device).use()
    _WORKER["handle"] = cudnn.create_handle()


def build_serialised(define_graph, plan_names, define, io_dtype: str, precision: str, deterministic: bool,
                     names: list[str]) -> dict:
    """In a worker: the graph defined again, each named plan built and serialised."""
    graph = define_graph(_WORKER["handle"], io_dtype, precision, deterministic, define)[0]
    index_of = {name: index for index, name in plan_names(graph).items()}
    built = {}
    for name in names:
        if name not in index_of:
            continue
        started = time.perf_counter()
        try:
            graph.build_plan_at_index(index_of[name])
            data = bytes(graph.serialize())
        except Exception:   # noqa: BLE001  a plan that does not build is left out, as here
            continue
        built[name] = (data, round(1e3 * (time.perf_counter() - started), 2))
    return built
