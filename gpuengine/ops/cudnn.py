"""cuDNN frontend graphs in one place: built once per key, autotuned on first use, one shared workspace.

Every graph goes through the frontend's fixed pipeline (NVIDIA cudnn-frontend,
docs "Graph API" and samples/python): validate -> build_operation_graph ->
create_execution_plans (heuristics A, then FALLBACK) -> check_support -> build
the candidate plans. Building is the slow part, so graphs are cached by
everything that shapes them (op, dims, strides, dtypes, window, fusions,
precision) and built when a layer is built, never inside CUDA-graph capture.
Every precompiled candidate the heuristics return is built (under a
millisecond each on an H100); of those cuDNN compiles at run time (its
RUNTIME_COMPILATION note: about 250 ms each, the batch norms' ~23 knob
variants of one engine) only the first RUNTIME_COMPILED_CANDIDATES in the
heuristics' order. The first eager execution times the built plans on the
live buffers and keeps one (ops/autotune.py: kernels timed in captured replays, the
heuristic's order deciding between plans too close to tell): the
equivalent of `torch.backends.cudnn.benchmark`. Graphs run on raw CuPy device
pointers on the engine stream, so they record into a captured step like any
kernel.

Precision: fp32 deselects tensor-core (TF32) and down-converting engines, tf32
deselects down-converting ones, bf16 runs bf16 I/O; all accumulate in fp32.
Non-deterministic engines are deselected unless the config's `deterministic`
toggle is off, so a replayed graph computes exactly what the eager step
computed; graphs built without that filter have keys (and plans) of their own.

All graphs of one engine stream run one after another, so they share one
workspace; it only grows, and a replaced buffer stays alive because a captured
step may still point at it.

A preset in `autotune.PLAN_CHOICES` (the perf gate keeps them with its
baselines) makes a graph build and time that one plan only; the plans it
times are recorded there (ops/autotune.py says why).
"""
from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass

import numpy as np

from . import autotune, plan_pool

# Runtime-compiled plans are most of a cold set-up (ResNet-50's 72 of 80 s on an H100 at 8 of them). Replayed
# on the recorded timings, the first 4 build in 40% less time than the first 8, their choices' cuDNN time
# 0.09-0.36% more, and two processes agree more often (docs/gate.md, "Which candidates").
RUNTIME_COMPILED_CANDIDATES = 4
PLAN_WORKERS = 0   # processes building runtime-compiled plans (plan_pool.py); the trainer sets its config's
CLOCK_WARMUP_S = 0.3  # device busy time before timing after an idle spell: an idle GPU runs at low clocks
IDLE_S = 1.0


class CudnnUnsupported(RuntimeError):
    """cuDNN has no engine for this graph on this GPU (callers may fall back to a simpler graph)."""


def _cudnn():
    import cudnn
    return cudnn


def _data_type(dtype):
    cudnn = _cudnn()
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return cudnn.data_type.FLOAT
    if dtype.name == "bfloat16":
        return cudnn.data_type.BFLOAT16
    raise TypeError(f"no cuDNN data type for {dtype}")


@dataclass(frozen=True)
class TensorSpec:
    """cuDNN's view of a buffer: dims in N, C, H, W order, the buffer's own strides, and its dtype."""

    dims: tuple
    strides: tuple
    dtype: str

    @classmethod
    def of(cls, a) -> "TensorSpec":
        """An NHWC activation (N, H, W, C), KRSC filters (K, R, S, C), or a per-channel vector (C,)."""
        if a.ndim == 1:
            (c,) = a.shape
            return cls((1, c, 1, 1), (c, 1, c, c), a.dtype.name)
        if a.ndim != 4 or not a.flags.c_contiguous:
            raise ValueError(f"cuDNN graphs take contiguous 4-D NHWC/KRSC buffers or channel vectors, got {a.shape}")
        n, h, w, c = a.shape
        return cls((n, c, h, w), (h * w * c, 1, w * c, c), a.dtype.name)

    def make(self, graph, name: str):
        return graph.tensor(name=name, dim=list(self.dims), stride=list(self.strides),
                            data_type=_data_type(self.dtype))

    def mark_output(self, tensor):
        tensor.set_output(True).set_dim(list(self.dims)).set_stride(list(self.strides))
        tensor.set_data_type(_data_type(self.dtype))


def excluded_notes(precision: str, deterministic: bool = True) -> list:
    notes = _cudnn().numerical_note
    excluded = [notes.NONDETERMINISTIC] if deterministic else []
    if precision in ("fp32", "tf32"):
        excluded.append(notes.DOWN_CONVERT_INPUTS)
    if precision == "fp32":
        excluded.append(notes.TENSOR_CORE)
    return excluded


def define_graph(handle: int, io_dtype, precision: str, deterministic: bool, define, key: tuple = ("graph",)):
    """(the frontend graph, its tensors by name): defined, validated, its candidates offered (heuristics A, then
    FALLBACK) and deselected by the precision's notes; CudnnUnsupported where no engine supports it."""
    cudnn = _cudnn()
    graph = cudnn.pygraph(io_data_type=_data_type(io_dtype), intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tensors = define(graph)   # name -> cudnn tensor
    try:
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.deselect_numeric_notes(excluded_notes(precision, deterministic))
        graph.check_support()
    except Exception as exc:   # the frontend raises several types for "no engine supports this"
        raise CudnnUnsupported(f"cuDNN cannot run {key[0]} {key[1:]}: {exc}") from exc
    return graph, tensors


class CudnnGraph:
    """One built graph: the uid of each named tensor, its candidate plans, and the plan autotuning chose.

    With `workers` (ops/plan_pool.py) and a definition that can travel, the runtime-compiled candidates are
    built in worker processes and brought in (`bring_plans`) before the graph's first execution."""

    def __init__(self, key: tuple, handle: int, io_dtype, precision: str, define, deterministic: bool = True,
                 workers: int = 0, device: int = 0):
        self.key, self.handle = key, handle
        started = time.perf_counter()
        graph, tensors = define_graph(handle, io_dtype, precision, deterministic, define, key)
        names = plan_names(graph)
        preset = autotune.PLAN_CHOICES.chosen_for(key)
        self.plans, self.build_ms = [], {}   # build_ms: plan index -> milliseconds its build took
        if preset in names.values():   # a choice of an earlier process: that plan alone, if it still builds
            self.plans = _build_plans(graph, [i for i, name in names.items() if name == preset], self.build_ms)
        self.preset = bool(self.plans)
        compiled = _runtime_compiled(graph, names)
        self.brought: dict = {}    # plan index -> a graph deserialised from a worker's build of that plan
        self._coming = None        # (future, {name: index}) of the plans workers build
        if not self.plans:
            wanted = _worth_building(names, compiled)
            sent = [i for i in wanted if i in compiled] if workers and plan_pool.picklable(define) else []
            if sent:
                future = plan_pool.submit(device, workers, define_graph, plan_names, define, np.dtype(io_dtype).name,
                                          precision, deterministic, [names[i] for i in sent])
                self._coming = (future, {names[i]: i for i in sent})
            self.plans = _build_plans(graph, [i for i in wanted if i not in sent], self.build_ms)
        if not self.plans and self._coming is None:
            raise CudnnUnsupported(f"cuDNN built no plan for {key[0]} {key[1:]} under {precision}")
        self.graph = graph
        self.uids = {name: t.get_uid() for name, t in tensors.items()}
        self.plan_names = {i: names[i] for i in self.plans}
        self.workspace_bytes = {i: int(graph.get_workspace_size_plan_at_index(i)) for i in self.plans}
        self.plan: int | None = None   # chosen by the first eager execution
        self.timings: dict = {}        # plan index -> autotune.Timing
        self.offered = names   # plan index -> name: the heuristics' offer in their order (after deselection)
        self.runtime_compiled = compiled   # the offer's plan indices that cuDNN compiles at run time
        self.build_s = time.perf_counter() - started   # set-up cost: building is the slow part
        self.tune_s = 0.0

    def bring_plans(self):
        """The workers' plans, waited for and deserialised on this graph's handle (once; before timing)."""
        if self._coming is None:
            return
        future, index_of = self._coming
        self._coming = None
        started = time.perf_counter()
        try:
            built = future.result()
        except Exception:   # noqa: BLE001  a worker that died builds nothing: the plans built here remain
            built = {}
        for name, (data, build_ms) in built.items():
            index, brought = index_of[name], _cudnn().pygraph(handle=self.handle)
            brought.deserialize(self.handle, list(data))
            self.brought[index] = brought
            self.plan_names[index], self.build_ms[index] = name, build_ms
            self.workspace_bytes[index] = int(brought.get_workspace_size())
        self.plans = sorted(set(self.plans) | set(self.brought))   # the heuristics' order, as built here
        self.build_s += time.perf_counter() - started
        if not self.plans:
            raise CudnnUnsupported(f"cuDNN built no plan for {self.key[0]} {self.key[1:]}")

    def execute(self, pointers: dict, workspace_ptr: int, plan: int, handle: int):
        if plan in self.brought:
            self.brought[plan].execute(pointers, workspace_ptr, handle=handle)
        else:
            self.graph.execute_plan_at_index(pointers, workspace_ptr, plan, handle=handle)


def plan_names(graph) -> dict[int, str]:
    """Each candidate's index and name in heuristic order; a name the two heuristics both return counts once."""
    names: dict[int, str] = {}
    for index in range(graph.get_execution_plan_count()):
        name = graph.get_plan_name_at_index(index)
        if name not in names.values():
            names[index] = name
    return names


def _runtime_compiled(graph, names: dict) -> set[int]:
    """The plan indices of `names` whose engines cuDNN compiles at run time."""
    note = _cudnn().behavior_note.RUNTIME_COMPILATION
    return {index for index in names if note in graph.get_behavior_notes_for_plan_at_index(index)}


def _worth_building(names: dict, compiled: set[int]) -> list[int]:
    """The indices to build, in the heuristics' order: every precompiled plan, the first few runtime-compiled."""
    kept, compiled_kept = [], 0
    for index in names:
        if index in compiled:
            if compiled_kept == RUNTIME_COMPILED_CANDIDATES:
                continue
            compiled_kept += 1
        kept.append(index)
    return kept


def _build_plans(graph, indices, build_ms: dict) -> list[int]:
    """Those of `indices` whose plans build, in their order; each attempt's milliseconds go to `build_ms`."""
    built = []
    for index in indices:
        started = time.perf_counter()
        try:
            graph.build_plan_at_index(index)
        except Exception:   # deselected, or this engine fails to build on this GPU: try the next one
            continue
        finally:
            build_ms[index] = round(1e3 * (time.perf_counter() - started), 2)
        built.append(index)
    return built


_GRAPHS: dict[tuple, CudnnGraph] = {}   # building is slow: one graph per key, per process
_BUILDING = autotune.Progress("cuDNN graphs built")
_TUNING = autotune.Progress("cuDNN graphs autotuned")


def built_graphs() -> dict[tuple, CudnnGraph]:
    """Every graph this process built, by key: what building and autotuning cost (`./gate plans`)."""
    return dict(_GRAPHS)


def _untimed() -> int:
    """Graphs built in this process whose plan is still to be timed: what autotuning has left, as far as known."""
    return sum(1 for graph in _GRAPHS.values() if graph.plan is None and not graph.preset)


class CudnnRuntime:
    """A cuDNN handle on a backend's engine stream, and the workspace the graphs on that stream share.

    `deterministic`: whether its graphs keep to engines that compute the same bits on every run."""

    def __init__(self, backend, deterministic: bool = True):
        cudnn = _cudnn()
        self.backend, self.stream, self.deterministic = backend, backend.stream, deterministic
        # Never destroyed: the process-wide graph cache holds plans built with this handle.
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=self.stream.ptr)
        self.workspace = backend.xp.empty((256,), np.uint8)
        self._retired = []   # earlier workspaces, kept alive for steps captured with them
        self._last_tuned = float("-inf")   # when this runtime last timed plans (the clocks are warm after)

    def graph(self, key: tuple, io_dtype, precision: str, define) -> CudnnGraph:
        if not self.deterministic:   # other candidate engines: a graph, and a kept choice, of its own
            key += (("deterministic", False),)
        key = (self.backend.xp.cuda.Device().id,) + key
        if key not in _GRAPHS:
            _GRAPHS[key] = CudnnGraph(key[1:], self.handle, io_dtype, precision, define, self.deterministic,
                                      PLAN_WORKERS, key[0])
            _BUILDING.step()
        return _GRAPHS[key]

    def reserve(self, nbytes: int, allocator=None):
        """Grow the shared workspace to at least `nbytes` (outside capture only)."""
        if nbytes <= self.workspace.nbytes:
            return
        self._retired.append(self.workspace)
        with self.backend.activate():
            self.workspace = self.backend.xp.empty((nbytes,), np.uint8)
        if allocator is not None:
            allocator.book(nbytes, "workspace")

    def execute(self, graph: CudnnGraph, pointers: dict):
        if graph.plan is None:
            autotune.refuse_capture(self.stream, f"cuDNN graph {graph.key[0]} {graph.key[1:]}")
            self.autotune(graph, pointers)
        graph.execute(pointers, self.workspace.data.ptr, graph.plan, self.handle)

    def autotune(self, graph: CudnnGraph, pointers: dict):
        """Time every built plan on the live buffers (outputs are overwritten) and keep one (autotune.choose).

        The GPU is first kept busy for a moment when it has been idle: a GPU ramping up from idle clocks made
        whichever plans were timed first look slow."""
        started = time.perf_counter()
        graph.bring_plans()
        candidates = []
        for plan in graph.plans:
            self.reserve(graph.workspace_bytes[plan])
            try:
                graph.execute(pointers, self.workspace.data.ptr, plan, self.handle)   # surfaces failures
                self.stream.synchronize()
            except Exception:   # a plan that builds but fails to launch here is simply not a candidate
                continue
            candidates.append(plan)
        if not candidates:
            raise CudnnUnsupported(f"no plan of {graph.key[0]} {graph.key[1:]} executed on this GPU")
        if len(candidates) == 1:
            graph.plan = candidates[0]
            autotune.PLAN_CHOICES.record(graph.key, graph.plan_names[graph.plan], 0.0)
        else:
            self._warm_clocks(graph, pointers, candidates[0])
            ways = {plan: functools.partial(graph.execute, pointers, self.workspace.data.ptr, plan, self.handle)
                    for plan in candidates}
            graph.plan, graph.timings = autotune.tune(self.backend.xp, self.stream, graph.key, ways, graph.plan_names)
            self._last_tuned = time.perf_counter()
        graph.tune_s = time.perf_counter() - started
        if not graph.preset:
            _TUNING.step(_untimed())

    def _warm_clocks(self, graph: CudnnGraph, pointers: dict, plan: int):
        """Run the graph for CLOCK_WARMUP_S of device time if nothing was timed for IDLE_S seconds."""
        if time.perf_counter() - self._last_tuned < IDLE_S:
            return
        start = time.perf_counter()
        while time.perf_counter() - start < CLOCK_WARMUP_S:
            for _ in range(20):
                graph.execute(pointers, self.workspace.data.ptr, plan, self.handle)
            self.stream.synchronize()


_RUNTIMES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def runtime_for(backend, deterministic: bool = True) -> CudnnRuntime:
    """The runtime of the backend's engine stream (one for deterministic graphs, one for the others)."""
    runtimes = _RUNTIMES.setdefault(backend, {})
    if deterministic not in runtimes:
        runtimes[deterministic] = CudnnRuntime(backend, deterministic)
    return runtimes[deterministic]


class BoundGraph:
    """A cached graph bound to fixed buffers: `run()` executes it, capturable, allocating nothing.

    `host_scalars` are pass-by-value inputs (a norm's epsilon): host arrays the graph reads at launch.
    """

    def __init__(self, runtime: CudnnRuntime, graph: CudnnGraph, buffers: dict, allocator=None,
                 host_scalars: dict | None = None, preserve: tuple = ()):
        host_scalars = host_scalars or {}
        if buffers.keys() | host_scalars.keys() != graph.uids.keys():
            raise ValueError(f"{graph.key[0]}: buffers {sorted(buffers | host_scalars)} given, "
                             f"the graph takes {sorted(graph.uids)}")
        self.runtime, self.graph = runtime, graph
        self.pointers = {graph.uids[name]: int(a.data.ptr) for name, a in buffers.items()}
        self.pointers.update({graph.uids[name]: int(a.ctypes.data) for name, a in host_scalars.items()})
        self.buffers = buffers | host_scalars   # keeps the memory behind the pointers alive
        self.preserve = preserve   # buffers the graph updates in place (running statistics)
        runtime.reserve(max(graph.workspace_bytes.values(), default=0), allocator)   # brought plans: at autotune

    def run(self):
        if self.graph.plan is None and self.preserve:
            # Autotuning executes every plan several times: undo its in-place updates, then run once for real.
            saved = [b.copy() for b in self.preserve]
            self.runtime.execute(self.graph, self.pointers)
            for buffer, value in zip(self.preserve, saved):
                buffer[...] = value
        self.runtime.execute(self.graph, self.pointers)


# -- the graphs of a convolution layer -------------------------------------------------


def _conv_args(window) -> dict:
    return dict(pre_padding=window.pre_padding, post_padding=window.post_padding, stride=list(window.stride),
                dilation=[1, 1], compute_data_type=_cudnn().data_type.FLOAT)


def graph_key(op: str, precision: str, window, **buffers) -> tuple:
    return (op, precision, window) + tuple((name, TensorSpec.of(a)) for name, a in sorted(buffers.items()))


def conv_forward(runtime, precision: str, window, x, w, y, bias=None, relu: bool = False, allocator=None):
    """y = [relu](conv(x, w) [+ bias]) as one graph; CudnnUnsupported where cuDNN cannot fuse it."""
    buffers = {"x": x, "w": w, "y": y} | ({"bias": bias} if bias is not None else {})
    define = functools.partial(_conv_graph, specs={name: TensorSpec.of(a) for name, a in buffers.items()},
                               window=window, relu=relu)
    graph = runtime.graph(graph_key("conv_fprop", precision, window, **buffers) + (("relu", relu),), x.dtype, precision,
                          define)
    return BoundGraph(runtime, graph, buffers, allocator)


def _conv_graph(g, specs: dict, window, relu: bool) -> dict:
    """conv_forward's graph from its buffers' specs alone (picklable: a plan_pool worker can define it too)."""
    tensors = {name: spec.make(g, name) for name, spec in specs.items() if name != "y"}
    out = g.conv_fprop(image=tensors["x"], weight=tensors["w"], **_conv_args(window))
    if "bias" in specs:
        out = g.bias(input=out, bias=tensors["bias"])
    if relu:
        out = g.relu(input=out)
    specs["y"].mark_output(out)
    return tensors | {"y": out}


def _single_op(runtime, precision: str, window, op: str, args: dict, out: str, buffers: dict, allocator):
    """A graph of one cuDNN convolution op; `args` maps the op's keywords to input buffer names, the
    first input's dtype is the graph's I/O dtype."""
    define = functools.partial(_op_graph, specs={name: TensorSpec.of(a) for name, a in buffers.items()},
                               window=window, op=op, args=tuple(args.items()), out=out)
    io_dtype = buffers[next(iter(args.values()))].dtype
    graph = runtime.graph(graph_key(op, precision, window, **buffers), io_dtype, precision, define)
    return BoundGraph(runtime, graph, buffers, allocator)


def _op_graph(g, specs: dict, window, op: str, args: tuple, out: str) -> dict:
    """_single_op's graph from its buffers' specs alone (picklable, as _conv_graph)."""
    tensors = {name: specs[name].make(g, name) for _, name in args}
    result = getattr(g, op)(**{kw: tensors[name] for kw, name in args}, **_conv_args(window))
    specs[out].mark_output(result)
    return tensors | {out: result}


def conv_data_grad(runtime, precision: str, window, dy, w, dx, allocator=None):
    """dx = the input gradient of conv(x, w) given its output gradient dy."""
    return _single_op(runtime, precision, window, "conv_dgrad", {"loss": "dy", "filter": "w"}, "dx",
                      {"dy": dy, "w": w, "dx": dx}, allocator)


def conv_weight_grad(runtime, precision: str, window, x, dy, dw, allocator=None):
    """dw (KRSC, the dtype of x and dy) = the filter gradient of conv(x, w) given dy."""
    return _single_op(runtime, precision, window, "conv_wgrad", {"image": "x", "loss": "dy"}, "dw",
                      {"x": x, "dy": dy, "dw": dw}, allocator)
