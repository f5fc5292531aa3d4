"""What a process's earlier work leaves behind that slows the engine's CUDA-graph replays (issue 38: ResNet-50
CIFAR bf16 replays took 2,490 us a step in processes that autotuned their plans, round_gaps and toggle-cost,
and 2,375 in a profile on the kept plans; the kernels were the same, the device idle ~0.3 us more before each).

    python3 scripts/residue.py resnet --precision bf16 [--store baselines_store] [--phases kept,modules,...]
                               [--modules 200] [--hold-gib 16] [--batch 96] [--toggle NAME=VALUE] [--out FILE]

The engine is built on the kept plans (as a profile builds it) and its step timed as a profile times it (bursts of
rounds of one graph8 launch) after each phase, in order, in one process:
  kept       nothing else done yet
  modules    MODULES modules of small kernels compiled, loaded and each kernel launched once
  memory     CuPy's pool grown by HOLD_GIB GiB, held
  released   those blocks given back to the driver
  autotuned  a second engine of the workload at batch BATCH autotuned afresh (every candidate plan built and
             timed) and captured, kept alive
  dropped    that engine let go, its cuDNN graphs out of the process's cache, the pool's free blocks released
  torch      PyTorch's captured step (torch_graph) built from the engine's weights and run, kept alive
  again      the first phase's measurement repeated: drift of the machine over the session
Whichever phase moves the step is what a perf session's earlier tests leave behind. Prints one line a phase;
--out writes them as JSON.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRAPH = 8
PHASES = ("kept", "modules", "memory", "released", "autotuned", "dropped", "torch", "again")
KERNELS_PER_MODULE = 8
TIMINGS = 3   # unprofiled_step_us calls a phase; their median is the phase's step


def module_source(index: int) -> str:
    """A module of KERNELS_PER_MODULE distinct small kernels (distinct names and constants: nothing is shared)."""
    kernels = [f'extern "C" __global__ void residue_{index}_{k}(float* x, int n) {{\n'
               f"    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               f"    if (i < n) x[i] = x[i] * {1.0 + (index * KERNELS_PER_MODULE + k) * 1e-6:.9f}f + {k}.0f;\n}}\n"
               for k in range(KERNELS_PER_MODULE)]
    return "".join(kernels)


def load_modules(cp, count: int) -> list:
    """`count` modules compiled and loaded, each kernel launched once (lazy loading loads a function at its first
    launch); the modules are returned so that they stay loaded."""
    x = cp.zeros(256, dtype=cp.float32)
    modules = []
    for index in range(count):
        module = cp.RawModule(code=module_source(index))
        for k in range(KERNELS_PER_MODULE):
            module.get_function(f"residue_{index}_{k}")((1,), (256,), (x, cp.int32(256)))
        modules.append(module)
    cp.cuda.Device().synchronize()
    return modules


def step_us(runner, steps: int) -> dict:
    """The step as a profile times it, TIMINGS times: their median and all of them."""
    from gpuengine.bench.profile.capture import unprofiled_step_us
    times = [unprofiled_step_us(runner, steps) for _ in range(TIMINGS)]
    return {"step_us": round(statistics.median(times), 1), "timings_us": times}


class Session:
    """The kept-plan engine, timed after each phase, and what the phases leave alive until the end."""

    def __init__(self, workload, case, modules: int, hold_gib: float, batch: int):
        import cupy as cp
        from gpuengine.ops import autotune, cudnn
        self.cp, self.autotune, self.cudnn = cp, autotune, cudnn
        self.workload, self.case = workload, case
        self.module_count, self.hold_gib, self.batch = modules, hold_gib, batch
        self.pool = cp.get_default_memory_pool()
        self.engine = workload.engine_runner(case)
        self.engine.prepare()
        self.engine.run_round()
        self.engine.synchronize()
        self.own_graphs = set(cudnn.built_graphs())   # the kept-plan engine's, which 'dropped' keeps
        self.loaded, self.held, self.other, self.reference = [], [], None, None

    def pool_gib(self) -> str:
        return f"pool {self.pool.total_bytes() / 2**30:.1f} GiB"

    def kept(self) -> str:
        return f"{len(self.own_graphs)} cuDNN graphs"

    again = kept

    def modules(self) -> str:
        self.loaded.append(load_modules(self.cp, self.module_count))
        return f"{self.module_count} modules of {KERNELS_PER_MODULE} kernels"

    def memory(self) -> str:
        self.held = [self.cp.empty(1 << 30, dtype=self.cp.uint8) for _ in range(int(self.hold_gib))]
        return self.pool_gib()

    def released(self) -> str:
        self.held = []
        self.pool.free_all_blocks()
        return self.pool_gib()

    def autotuned(self) -> str:
        from dataclasses import replace
        kept_plans = self.autotune.PLAN_CHOICES
        self.autotune.use_plan_choices({})   # nothing preset: every graph of the other batch autotunes
        try:
            self.other = self.workload.engine_runner(replace(self.case, batch=self.batch))
            self.other.prepare()
            self.other.run_round()
            self.other.synchronize()
        finally:
            self.autotune.PLAN_CHOICES = kept_plans
        new = set(self.cudnn.built_graphs()) - self.own_graphs
        return f"batch {self.batch}: {len(new)} cuDNN graphs built and autotuned"

    def dropped(self) -> str:
        dropped = [key for key in self.cudnn.built_graphs() if key not in self.own_graphs]
        for key in dropped:
            del self.cudnn._GRAPHS[key]
        self.other = None
        gc.collect()
        self.pool.free_all_blocks()
        return f"{len(dropped)} cuDNN graphs dropped; {self.pool_gib()}"

    def torch(self) -> str:
        self.reference = self.workload.reference_runner("torch_graph", self.case, self.engine.state_dict(),
                                                    self.engine.buffers_dict())
        self.reference.prepare()
        self.reference.run_round()
        self.reference.synchronize()
        return "torch_graph built and run"

    def run(self, phase: str) -> dict:
        """The phase done, then the engine's step timed."""
        note = getattr(self, phase)()
        return {"phase": phase, **step_us(self.engine, self.case.steps_per_replay), "note": note}


def parse_phases(text: str) -> list[str]:
    """'kept,modules,again' -> the phases in that order; ValueError naming an unknown one."""
    phases = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ValueError(f"--phases {text!r}: {', '.join(unknown) or 'none given'}; choose from {', '.join(PHASES)}")
    return phases


def main(argv=None) -> int:
    from gpuengine.bench.cli_args import UsageError, parse_toggle
    from gpuengine.bench.json_files import write_json
    from gpuengine.bench.machine_info import current_tier
    from gpuengine.bench.profile.record import ProfileCase
    from gpuengine.bench.profile.session import reuse_cudnn_plans
    from gpuengine.bench.profile.workloads import get_workload
    from gpuengine.config import PRECISIONS
    from gpuengine.runtime.backend import gpu_visible
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16")
    parser.add_argument("--store", type=Path, default=Path("baselines_store"), help="where the kept plans are")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--hold-gib", type=float, default=16.0)
    parser.add_argument("--batch", type=int, default=96, help="the second engine's batch (phase autotuned)")
    parser.add_argument("--toggle", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.modules < 1 or args.hold_gib < 1 or args.batch < 1:
        parser.error(f"--modules {args.modules}, --hold-gib {args.hold_gib}, --batch {args.batch}: each at least 1")
    try:
        phases = parse_phases(args.phases)
        toggles = dict(parse_toggle(text, "--toggle") for text in args.toggle)
        workload = get_workload(args.workload)
    except (UsageError, ValueError) as exc:
        parser.error(str(exc))
    if not gpu_visible():
        print("residue: needs a GPU with CuPy and the cuDNN frontend; none is visible here", file=sys.stderr)
        return 2
    case = ProfileCase(args.workload, args.precision, workload.batch, GRAPH, tuple(sorted(toggles.items())))
    plans = reuse_cudnn_plans(args.store, current_tier(on_gpu=True).name)
    print(f"residue: {args.workload} {args.precision} graph{GRAPH}; the engine's cuDNN plans: {plans}", flush=True)
    session = Session(workload, case, args.modules, args.hold_gib, args.batch)
    records = []
    for phase in phases:
        records.append(session.run(phase))
        print(f"{phase:10s} {records[-1]['step_us']:9.1f} us a step  {records[-1]['note']}", flush=True)
    if args.out:
        write_json(args.out, {"workload": args.workload, "precision": args.precision, "graph": GRAPH,
                              "toggles": toggles, "plans": plans, "phases": records})
    return 0


if __name__ == "__main__":
    sys.exit(main())
