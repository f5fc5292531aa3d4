"""A profile's JSON: what it holds, where it is stored, reading it back, and its table of families by runner.

    baselines_store/<gpu>/profiles/<workload>-<precision>-b<batch>-graph<cuda_graph>.json

(`zoo:alexnet` is `zoo-alexnet` in the name), written aside and renamed
(json_files.write_json); profiling the same workload and toggles again
replaces the file, so each holds the newest profile of its case:

    {"format": 2, "kind": "gpuengine kernel profile", "workload": "resnet",
     "toggles": {"precision": "tf32", "batch": 128, "cuda_graph": 1},
     "recorded_at": "2026-11-24T18:02:11+00:00", "commit": "<sha>", "dirty": false, "command": [...],
     "machine": {machine_info.collect_machine_info: gpu, driver, CUDA, cuDNN, clocks, ...},
     "replays": 5, "steps_per_replay": 2, "cudnn_plans": "<how the engine's plans were chosen>",
     "runners": {"gpuengine": {"step_us": 812.4, "kernel_us": 790.1, "gaps_us": 22.3, "replay_step_us": [...],
                               "timed_step_us": 801.0,
                               "families": {"gemm": 500.2, ...}, "idle_before": {"norm": 12.1, ...},
                               "kernels": [{"name": "...", "family": "gemm", "us": 120.5, "count": 2.0,
                                            "idle_before_us": 1.5, "launch_us": [80.1, 40.4]}, ...]},
                 "torch_graph": {...},
                 "torch_compile_graph": {"unavailable": "<why>", "failed": false}}}

Every time is microseconds per training step, every count launches per step
(capture.py: medians over the replays); "timed_step_us" is the step timed
without the profiler, "idle_before" the device idle before each family's launches, a kernel's "launch_us" its
time at each launch of a step in launch order (absent from profiles recorded before they were, and "launch_us"
where the replays launch a kernel unevenly). The report reads these files back
(`read_profile`: a malformed one is an error naming the file and the field; format 1 files, from before
the runners were called so, keep them under "sides").
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..json_files import JsonFileError, require_number, write_json
from .families import label, ordered

FORMAT = 2
RUNNERS_KEY = {1: "sides", 2: "runners"}   # format -> the key of the runners' figures
KIND = "gpuengine kernel profile"
PROFILES = "profiles"   # the folder of a tier (baselines_store/<gpu>/) that holds them
RUNNER_TIMES = ("step_us", "kernel_us", "gaps_us")
TIMED = "timed_step_us"   # optional: profiles recorded before it lack it
IDLE = "idle_before"      # optional, the same way
ENGINE = "gpuengine"          # the engine's runner; the references' are their modes (torch_graph, ...)
UNAVAILABLE = "unavailable"   # a runner's key: why it was not profiled
FAILED = "failed"             # ... and whether it failed, rather than this machine lacking it


@dataclass(frozen=True)
class ProfileCase:
    """What one profile measures: the workload (`zoo:NAME` for the zoo) and the engine's toggles."""

    workload: str
    precision: str
    batch: int
    cuda_graph: int
    engine_toggles: tuple = ()   # (name, value) pairs the engine runs with beyond its defaults: ("batchnorm", "engine")
    length: int | None = None    # the Transformer's sequence length where not its seed shape's

    @property
    def steps_per_replay(self) -> int:
        """Training steps in one profiled round: one launch of `cuda_graph` steps, and at least two."""
        return max(2, self.cuda_graph)

    @property
    def toggles(self) -> dict:
        return {"precision": self.precision, "batch": self.batch, "cuda_graph": self.cuda_graph,
                **({} if self.length is None else {"length": self.length}), **dict(self.engine_toggles)}

    @property
    def slug(self) -> str:
        """The file name's stem: 'resnet-bf16-b128-graph1', 'zoo-alexnet-tf32-b16-graph1',
        'resnet-bf16-b128-graph1-batchnorm-engine', 'transformer-seq384-bf16-b16-graph1'."""
        toggled = "".join(f"-{name}-{int(value) if isinstance(value, bool) else value}"
                          for name, value in self.engine_toggles)
        workload = self.workload.replace(':', '-') + ("" if self.length is None else f"-seq{self.length}")
        return f"{workload}-{self.precision}-b{self.batch}-graph{self.cuda_graph}{toggled}"

    def describe(self) -> str:
        return f"{self.workload} ({describe_toggles(self.toggles)})"


def case_words(case: ProfileCase) -> list[str]:
    """The profile command's words that give the case: its workload, its sequence length where not the seed
    shape's, its precision, batch and steps per launch (engine toggles are the caller's)."""
    length = [] if case.length is None else ["--length", str(case.length)]
    return [case.workload, *length, "--precision", case.precision, "--batch", str(case.batch), "--cuda-graph",
            str(case.cuda_graph)]


def describe_toggles(toggles: dict) -> str:
    """'bf16, batch 128, cuda_graph 1' and any other toggle after them ('..., batchnorm engine')."""
    others = "".join(f", {name} {value}" for name, value in toggles.items()
                     if name not in ("precision", "batch", "cuda_graph"))
    return (f"{toggles.get('precision', '?')}, batch {toggles.get('batch', '?')}, "
            f"cuda_graph {toggles.get('cuda_graph', '?')}{others}")


def profile_path(store: Path | str, tier_name: str, case: ProfileCase) -> Path:
    return Path(store) / tier_name / PROFILES / f"{case.slug}.json"


def make_record(case: ProfileCase, runners: dict[str, dict], machine: dict, commit: str, dirty: bool | None,
                replays: int, cudnn_plans: str, command: list[str], recorded_at: datetime) -> dict:
    return {"format": FORMAT, "kind": KIND, "workload": case.workload, "toggles": case.toggles,
            "recorded_at": recorded_at.isoformat(timespec="seconds"), "commit": commit, "dirty": dirty,
            "command": command, "machine": machine, "replays": replays, "steps_per_replay": case.steps_per_replay,
            "cudnn_plans": cudnn_plans, RUNNERS_KEY[FORMAT]: runners}


def write_profile(path: Path | str, record: dict) -> Path:
    """The record at `path`, whole or not at all (a temporary file renamed over it)."""
    return write_json(path, record)


@dataclass(frozen=True)
class StoredProfile:
    """A profile file read back: its case, when and where it was recorded, and each runner's figures."""

    path: Path               # as the caller named it (the report: relative to the store)
    workload: str
    toggles: dict
    recorded_at: datetime
    commit: str
    dirty: bool | None
    gpu: str
    replays: int
    steps_per_replay: int
    runners: dict[str, dict]

    @property
    def case_key(self) -> tuple:
        """What a newer profile of the same case replaces: the workload and its toggles."""
        return (self.workload, tuple(sorted((k, str(v)) for k, v in self.toggles.items())))

    @property
    def title(self) -> str:
        return f"{self.workload} ({describe_toggles(self.toggles)})"

    def unavailable(self) -> dict[str, str]:
        return {name: runner[UNAVAILABLE] for name, runner in self.runners.items() if UNAVAILABLE in runner}


def _by_family(value, where: str):
    """`value` checked as microseconds by family (non-negative numbers)."""
    if not isinstance(value, dict):
        raise JsonFileError(f"{where} must be an object of microseconds by family, got {value!r}")
    for family, us in value.items():
        require_number(us, f"{where}.{family}", minimum=0)


def _runner(runner, where: str) -> dict:
    if not isinstance(runner, dict):
        raise JsonFileError(f"{where} must be an object, got {runner!r}")
    if UNAVAILABLE in runner:
        if not isinstance(runner[UNAVAILABLE], str):
            raise JsonFileError(f"{where}.{UNAVAILABLE} must say why, got {runner[UNAVAILABLE]!r}")
        return runner
    for key in RUNNER_TIMES:
        require_number(runner.get(key), f"{where}.{key}")
    if TIMED in runner:
        require_number(runner[TIMED], f"{where}.{TIMED}", minimum=0)
    _by_family(runner.get("families"), f"{where}.families")
    _by_family(runner.get(IDLE, {}), f"{where}.{IDLE}")
    if not isinstance(runner.get("kernels"), list):
        raise JsonFileError(f"{where}.kernels must be a list, got {runner.get('kernels')!r}")
    return runner


def read_profile(data, path: Path | str) -> StoredProfile:
    """`data` (a profile file's parsed JSON) checked field by field; JsonFileError naming `path` and the field."""
    where = str(path)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise JsonFileError(f"{where}: not a kernel profile (no \"kind\": {KIND!r})")
    if data.get("format") not in RUNNERS_KEY:
        raise JsonFileError(f"{where}: format {data.get('format')!r}; this code reads formats "
                            f"{', '.join(map(str, RUNNERS_KEY))}")
    key = RUNNERS_KEY[data["format"]]
    workload, toggles, runners = data.get("workload"), data.get("toggles"), data.get(key)
    if not isinstance(workload, str) or not isinstance(toggles, dict):
        raise JsonFileError(f"{where}: \"workload\" must be a name and \"toggles\" an object")
    if not isinstance(runners, dict) or not runners:
        raise JsonFileError(f"{where}: \"{key}\" must be an object with at least one runner")
    try:
        recorded_at = datetime.fromisoformat(str(data.get("recorded_at")))
    except ValueError:
        raise JsonFileError(f"{where}: \"recorded_at\" is {data.get('recorded_at')!r}, not an ISO date") from None
    checked = {name: _runner(runner, f"{where}: {key}.{name}") for name, runner in runners.items()}
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    return StoredProfile(Path(path), workload, toggles, recorded_at, str(data.get("commit") or ""), data.get("dirty"),
                         str(machine.get("gpu") or "unknown GPU"),
                         int(require_number(data.get("replays"), f"{where}: replays", minimum=1)),
                         int(require_number(data.get("steps_per_replay"), f"{where}: steps_per_replay", minimum=1)),
                         checked)


def family_rows(runners: dict[str, dict]) -> list[tuple[str, list[float | None]]]:
    """(row label, one value per runner in `runners`' order): each family any runner spent time in, then the kernels'
    sum, the gaps, the step under the profiler and without it, and the launches per step. None where a runner was
    not profiled; the timed step's row only where a runner has that figure."""
    profiled = [runner if UNAVAILABLE not in runner else None for runner in runners.values()]
    families = ordered({f for runner in profiled if runner for f, us in runner["families"].items() if us > 0})
    rows = [(label(f), [runner["families"].get(f, 0.0) if runner else None for runner in profiled]) for f in families]
    rows += [("kernels (sum)", [runner["kernel_us"] if runner else None for runner in profiled]),
             ("gaps (device idle)", [runner["gaps_us"] if runner else None for runner in profiled]),
             ("step (device span)", [runner["step_us"] if runner else None for runner in profiled]),
             *([("step timed, no profiler", [runner.get(TIMED) if runner else None for runner in profiled])]
               if any(runner and TIMED in runner for runner in profiled) else []),
             ("launches per step", [sum(k.get("count", 0) for k in runner["kernels"]) if runner else None
                                    for runner in profiled])]
    return rows


def unclassified(runner: dict, limit: int = 5) -> list[dict]:
    """The runner's costliest kernels that no family rule knows (families.py could learn them)."""
    return [k for k in runner.get("kernels", []) if k.get("family") == "other"][:limit]


def format_text_table(record: dict) -> str:
    """The family table as text: families as rows, runners as columns, microseconds per step, then the totals."""
    runners = record[RUNNERS_KEY[FORMAT]]
    names = list(runners)
    rows = family_rows(runners)
    width = max(len(r[0]) for r in rows) + 2
    columns = [max(len(n), 10) + 2 for n in names]
    lines = [f"{record['workload']} ({describe_toggles(record['toggles'])}) on "
             f"{record['machine'].get('gpu', '?')}: µs per training step, median of {record['replays']} replays "
             f"of {record['steps_per_replay']} steps",
             "family".ljust(width) + "".join(n.rjust(c) for n, c in zip(names, columns))]
    for name, values in rows:
        cells = ["—" if v is None else (f"{v:,.0f}" if name.startswith("launches") else f"{v:,.1f}") for v in values]
        if name == "kernels (sum)":
            lines.append("-" * (width + sum(columns)))
        lines.append(name.ljust(width) + "".join(c.rjust(w) for c, w in zip(cells, columns)))
    for name, runner in runners.items():
        if runner.get(IDLE):
            waits = sorted(runner[IDLE].items(), key=lambda item: (-item[1], item[0]))[:4]
            lines.append(f"{name}: device idle before the launches of " +
                         ", ".join(f"{label(f)} {us:,.1f}" for f, us in waits) + " µs")
    for name, runner in runners.items():
        if UNAVAILABLE in runner:
            lines.append(f"{name}: not profiled: {runner[UNAVAILABLE]}")
        elif unclassified(runner):
            shown = "; ".join(f"{k['name'][:80]} {k['us']:.1f} µs" for k in unclassified(runner))
            lines.append(f"{name}: in 'other' (no family rule knows them): {shown}")
    return "\n".join(lines)

