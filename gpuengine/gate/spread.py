"""`./gate perf` on a machine with several GPUs: one pytest process per GPU, then the all-GPU tests, one stored run.

    python -m gpuengine.gate.spread [pytest args...]      (the gate calls it when nvidia-smi lists >= 2 GPUs)

1. Collect the perf tests the gate would run (same selection, the user's args).
2. Split the single-GPU tests over the GPUs (gpuengine/gate/store/spread_runs.py:
   balanced by each test's wall time in the newest stored run), and run one
   pytest per GPU at once, pinned with CUDA_VISIBLE_DEVICES=<i>, each
   comparing with the stored baselines and writing its run as JSON.
3. Run the tests that need every GPU (perf_tests/test_data_parallel.py) in
   one pytest that sees them all, after the others (they would share GPUs).
4. Merge the runs into one per GPU kind and store it like `--benchmark-autosave`
   does, in the folder each session would have stored it in (its run's
   machine_info "series": the tier's speed runs, slow/ for `-m slow`, a
   config-... folder for toggles; or the folder --benchmark-storage names),
   named after the commit as a single run is (GATE_COMMIT_ID where set):
   a baseline if every process passed, or failed only on targets not met
   (--claims), or with --save-baseline; else under history/; nothing at all
   when a process was interrupted (Ctrl-C: no verdict). The exit status is
   the worst of the processes'.
5. Keep every worker's new cuDNN plan choices in the tier's cudnn_plans.json,
   as a single run's autosave does (gpuengine/gate/kept_plans.py): the
   workers hand them over (GATE_PLANS_OUT) and the spread is the one writer;
   the per-GPU ones' before step 3, whose ranks then start from them.
Workers do not save on their own (no --benchmark-autosave, --save-baseline
held back): only the merged run is stored. Nor do they write the markdown
summary (--gate-summary held back): the spread writes it once, for the
merged run, with the whole spread's wall time as the tier's time
(gpuengine/gate/pr_summary.py). Nor do they profile their regressed A/B
tests (--profile-regressions 0): the spread profiles the merged run's, once
the GPUs are free (gpuengine/gate/regression_profiles.py). A per-GPU pytest's output is
shown when it ends, but its engine's autotuning progress as it comes
("[gpu0] [base] cuDNN autotune: ...", gpuengine/gate/progress.py).

Host bandwidth. The tests whose timed rounds move data over the host link
(`shares_host_bandwidth`: the loader module's, every case whose id says
`streamed`, and nightly the tests timing a reference that streams from host
arrays) would slow each other if two GPUs ran them at once: one GPU's copies
would eat the other's bandwidth and its rounds, not the code, would decide.
They all go to one GPU's pytest, as one block of the split, so they run one
after another, beside the other GPUs' compute-bound tests. A phase of their
own after the parallel one would take H + (T - H) / N of wall time (H their
time, T the whole, N GPUs); one block takes about max(H, T / N), never more,
and no schedule can beat that bound: H runs serially and T / N is each
GPU's share. (H100, run 0033: H 108 s of T 232 s, so two GPUs still split
evenly.) The all-GPU tests stay last and alone.

A stack A/B (`--against-stack LOCK`, gpuengine/gate/ab/stack.py) builds the
base's environment here, once, before the sessions start; each session then
finds it stamped and reuses it.

Timing cores. Each GPU's session (its engine workers and its references)
times its rounds on a core of its own (GATE_TIMING_CPU, gpuengine/gate/ab/worker.py):
NUMA-local to its GPU where Linux says which cores are, else a distinct core
of the affinity set (gpuengine/bench/timing_cores.py); core 0 and a
hyper-thread sibling of another GPU's core only when nothing else is left.
One core for every session (the host's last) put the launch-bound rounds of
two GPUs' engines on it at once: a likely cause of issue 36's steady A/A
offset. The merged run keeps the cores chosen and why
(machine_info["spread"]["timing_cores_chosen"]), and each test the core that
timed it (extra_info["timing_cpu"]).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pytest import ExitCode

from gpuengine.bench import cudnn_plans

from gpuengine.gate import changepoints
from gpuengine.bench.json_files import JsonFileError
from gpuengine.bench.machine_info import checkout_commit, named_commit_info, run_tag
from gpuengine.gate.store.run_storage import storage_folder, store_run
from gpuengine.gate.store.spread_runs import (benchmark_seconds, failed_on_targets_only, interrupted, merge_runs,
                                              run_folder, split_tests)
from gpuengine.gate.store.stored_runs import history_folder, newest_per_test, scan, tier_folders
from gpuengine.bench.timing_cores import TimingCore, timing_cores
from gpuengine.gate.ab.stack import StackBaseError, prepare_from_args
from gpuengine.gate.ab.worker import TIMING_CPU_ENV
from gpuengine.gate.progress import PROGRESS_FILE_ENV, new_lines
from gpuengine.gate.pr_summary import RunFacts, change_points, render
from gpuengine.gate.pr_summary import write as write_markdown
from gpuengine.gate.regression_profiles import DEFAULT_LIMIT, explain_spread_run, summary_section

ROOT = Path(__file__).resolve().parents[2]   # the checkout
WHOLE_MACHINE = ("perf_tests/test_data_parallel.py",)   # tests that spread themselves over every GPU
SELECTION = ["perf_tests", "-m", "not slow"]   # as ./gate perf
HELD_BACK = ("--save-baseline", "--benchmark-autosave")
SUMMARY_OPTION = "--gate-summary"   # the markdown summary: written here, once, for the merged run
PROFILE_OPTION = "--profile-regressions"   # regressed A/B tests profiled here, once the sessions are done
PROGRESS_POLL_S = 2.0   # how often the per-GPU sessions' progress files are looked at while they run
HOST_BANDWIDTH_MODULES = ("perf_tests/test_loader.py",)   # the loader alone, and training streamed against it
STREAMED_CASE = re.compile(r"\[(?:[^\]]*-)?streamed(?:-[^\]]*)?\]$")   # a case id naming streamed data
# Tests that time, in the nightly tier only (tiers.NIGHTLY_REFERENCES), a reference fed from host arrays:
# gpuengine_oneshot uploads each inference batch and reads its outputs back; Keras' fit streams its batches.
NIGHTLY_HOST_BANDWIDTH = ("perf_tests/test_mlp.py::test_mlp_infer[", "perf_tests/test_cnn.py::test_cnn_train_vs_keras[")


@dataclass(frozen=True)
class Worker:
    name: str                   # "gpu<i>" or "all-gpus": stored in each benchmark's extra_info
    devices: str | None         # CUDA_VISIBLE_DEVICES, None: every GPU
    tests: list[str]
    json_path: Path
    timing: TimingCore | None = None   # the core its session times rounds on (GATE_TIMING_CPU); None: its default

    def command(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "pytest", *self.tests, "-m", "not slow", "--benchmark-compare",
                f"--benchmark-json={self.json_path}", *args]

    @property
    def progress_path(self) -> Path:
        return self.json_path.with_suffix(".progress")

    @property
    def plans_path(self) -> Path:
        return self.json_path.with_suffix(".plans.json")

    def environment(self, environ=None) -> dict[str, str]:
        """The pytest's environment: its GPU, its timing core, its progress file and where it hands its plan choices,
        over the caller's."""
        env = dict(os.environ if environ is None else environ)
        env[cudnn_plans.HAND_OFF_ENV] = str(self.plans_path)
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")   # nvidia-smi's numbering, the one counted here
            env[PROGRESS_FILE_ENV] = str(self.progress_path)     # its output shows at its end, its progress live
        if self.timing is not None:
            env[TIMING_CPU_ENV] = str(self.timing.cpu)
        return env


def shares_host_bandwidth(test_id: str, full: bool = False) -> bool:
    """Whether a test's timed rounds move data between host and GPU, so that two GPUs running such tests at
    once would skew each other; `full`: in the nightly tier (--full), whose references differ."""
    return (test_id.startswith(HOST_BANDWIDTH_MODULES) or bool(STREAMED_CASE.search(test_id))
            or (full and test_id.startswith(NIGHTLY_HOST_BANDWIDTH)))


def gpu_count() -> int:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def visible_devices(environ=None, listed=None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the GPUs this run may use: the caller's own list where it set one
    (nvidia-smi lists every GPU of the host regardless), else 0..N-1 of the GPUs nvidia-smi lists."""
    env = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    return [str(i) for i in range(gpu_count() if listed is None else listed)]


def stop_before_running(message: str, status: int = ExitCode.USAGE_ERROR):
    """Nothing ran: the message, and pytest's exit status for it, which ./gate reads as "no test ran"."""
    print(f"gpuengine.gate.spread: {message}", file=sys.stderr, flush=True)
    raise SystemExit(int(status))


def collect(args: list[str]) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "pytest", *SELECTION, "--collect-only", "-q", *args], cwd=ROOT,
                            capture_output=True, text=True)
    if result.returncode not in (0, 5):
        stop_before_running(f"collecting the perf tests failed:\n{result.stdout}\n{result.stderr}", result.returncode)
    return [line.strip() for line in result.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def stored_seconds(store: Path) -> dict[str, float]:
    """Each test's timed seconds in the newest stored run holding it, over every tier folder."""
    runs = [run for tier in tier_folders(store) for run in scan(tier)[0]]
    runs.sort(key=lambda run: run.saved_at)
    seconds = {}
    for name, run in newest_per_test(runs).items():
        seconds.update({k: v for k, v in benchmark_seconds({"benchmarks": [run.benchmarks[name]]}).items()})
    return seconds


def plan_workers(test_ids: list[str], devices: list[str] | int, seconds: dict[str, float], out: Path,
                 full: bool = False, cores: dict[str, TimingCore] | None = None) -> list[Worker]:
    """The per-GPU workers (non-empty ones), then the all-GPU worker if any test needs every GPU. devices: the
    CUDA_VISIBLE_DEVICES entry of each GPU (visible_devices()), or a count for 0..N-1. The tests that share
    host bandwidth all go to one GPU's worker; `full`: the nightly tier (--full); `cores`: each GPU's timing
    core (timing_cores.timing_cores)."""
    cores = cores or {}
    devices = [str(i) for i in range(devices)] if isinstance(devices, int) else list(devices)
    whole = [t for t in test_ids if t.startswith(WHOLE_MACHINE)]
    single = [t for t in test_ids if not t.startswith(WHOLE_MACHINE)]
    host = [t for t in single if shares_host_bandwidth(t, full)]
    workers = [Worker(f"gpu{device}", device, part, out / f"gpu{device}.json", cores.get(device))
               for device, part in zip(devices, split_tests(single, len(devices), seconds, together=host)) if part]
    if whole:
        workers.append(Worker("all-gpus", None, whole, out / "all-gpus.json"))
    return workers


def describe(worker: Worker, full: bool) -> str:
    """'gpu0: 20 tests (9 sharing host bandwidth, one at a time)': what the spread line says of a worker."""
    host = sum(shares_host_bandwidth(t, full) for t in worker.tests)
    return (f"{worker.name}: {len(worker.tests)} tests" + (f" ({host} sharing host bandwidth, one at a time)" if host
                                                           else "")
            + (f", timed on core {worker.timing.cpu} ({worker.timing.why})" if worker.timing else ""))


def relay_progress(workers: list[Worker], read: dict[str, int], show=print):
    """Show the progress lines each worker's session wrote since the last look, '[gpu0] ...' each."""
    for worker in workers:
        lines, read[worker.name] = new_lines(worker.progress_path, read.get(worker.name, 0))
        for line in lines:
            show(f"[{worker.name}] {line}", flush=True)


def run_workers(workers: list[Worker], args: list[str], out: Path) -> dict[str, int]:
    """Per-GPU workers at once, their progress shown as it comes and each one's log when it ends; their plan choices
    kept; then the all-GPU one. Exit status by name."""
    status: dict[str, int] = {}
    single = [w for w in workers if w.devices is not None]
    procs, read = {}, {}
    for worker in single:
        with open(out / f"{worker.name}.log", "wb") as log:
            procs[worker.name] = subprocess.Popen(worker.command(args), cwd=ROOT, env=worker.environment(), stdout=log,
                                                  stderr=subprocess.STDOUT)
    while procs:
        for worker in single:
            ended = worker.name in procs and procs[worker.name].poll() is not None
            relay_progress([worker], read)   # after the poll: all it wrote before it ended
            if ended:
                status[worker.name] = procs.pop(worker.name).returncode
                print(f"===== perf worker {worker.name} (exit status {status[worker.name]}) =====\n"
                      f"{(out / f'{worker.name}.log').read_text(errors='replace')}", flush=True)
        if procs:
            time.sleep(PROGRESS_POLL_S)
    keep_plans(single)   # before the all-GPU tests: their ranks start from what the GPUs' sessions timed
    for worker in workers:
        if worker.devices is None:
            print(f"===== perf worker {worker.name}: every GPU =====", flush=True)
            status[worker.name] = subprocess.run(worker.command(args), cwd=ROOT, env=worker.environment()).returncode
    return status


def take_option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value of option `name` (`name VALUE` or `name=VALUE`; the last one given) and `args` without it."""
    value, rest, i = None, [], 0
    while i < len(args):
        if args[i] == name:
            if i + 1 == len(args):
                raise SystemExit(f"gpuengine.gate.spread: {name} needs a value")
            value, i = args[i + 1], i + 2
        elif args[i].startswith(name + "="):
            value, i = args[i][len(name) + 1:], i + 1
        else:
            rest.append(args[i])
            i += 1
    return value, rest


def save_merged(workers: list[Worker], status: dict[str, int], store: Path, machine_id: str, tag: str,
                save_baseline: bool, commit_info: dict | None = None, wall_seconds: float | None = None,
                named: Path | None = None) -> list[Path]:
    """Merge the workers' JSON runs, one per GPU kind, into <folder>/[history/]<machine id>/NNNN_<tag>.json, the
    folder run_folder's. `commit_info`: fields that name the commit over what the workers' runs say
    (GATE_COMMIT_ID's); `wall_seconds`: the spread's own length, the merged run's tier time (its sessions ran at
    once); `named`: the folder --benchmark-storage named, if any."""
    runs, names = [], []
    for worker in workers:
        if worker.json_path.is_file():
            runs.append(json.loads(worker.json_path.read_text()))
            names.append(worker.name)
        else:
            print(f"gpuengine.gate.spread: worker {worker.name} wrote no run (exit status {status.get(worker.name)})",
                  file=sys.stderr)
    run_of = dict(zip(names, runs))
    stopped = [w.name for w in workers if interrupted(status.get(w.name), run_of.get(w.name))]
    if stopped:
        print(f"gpuengine.gate.spread: interrupted ({', '.join(stopped)}): no verdict, nothing was saved",
              file=sys.stderr)
        return []
    if not runs:
        return []
    passed = len(runs) == len(workers) and all(status.get(name) == 0 or failed_on_targets_only(status.get(name), run)
                                               for name, run in zip(names, runs))
    saved = []
    for merged in merge_runs(runs, names).values():
        if commit_info:
            merged["commit_info"] = {**merged.get("commit_info", {}), **commit_info}
        spread = merged["machine_info"]["spread"]
        spread["timing_cores_chosen"] = {w.name: w.timing.as_dict() for w in workers
                                         if w.timing is not None and w.name in spread["workers"]}
        if wall_seconds is not None and isinstance(merged.get("gpuengine_tier_time"), dict):
            merged["gpuengine_tier_time"]["session_seconds"] = round(wall_seconds, 1)
        series = run_folder(merged["machine_info"], store, named)
        folder = (series if passed or save_baseline else history_folder(series)) / machine_id
        saved.append(store_run(folder, tag, json.dumps(merged, indent=4)))
    return saved


def keep_plans(workers: list[Worker], show=print) -> int:
    """Each worker's new cuDNN plan choices into the kept-plans file they belong to; returns how many were kept."""
    total = 0
    for worker in workers:
        if not worker.plans_path.is_file():
            continue   # no GPU tier, or a session that ended before its finish
        try:
            path, saved = cudnn_plans.keep_handed(worker.plans_path)
        except JsonFileError as exc:
            show(f"gpuengine.gate.spread: {worker.name}'s cuDNN plan choices not kept: {exc}", flush=True)
            continue
        total += saved
        if saved:
            show(f"gpuengine.gate.spread: {worker.name}'s {saved} new cuDNN plan choices kept in {path}", flush=True)
    return total


def write_summary(path: Path, saved: list[Path], status: dict[str, int], workers: list[Worker], out: Path,
                  extra=()) -> list[Path]:
    """The markdown summary of the merged run(s) (one per GPU kind, normally one), with where each was saved and
    which workers wrote no run; the files written (pr_summary.write)."""
    notes = [f"spread over {len(workers)} pytest sessions ({', '.join(w.name for w in workers)}); their logs in "
             f"`{out}`"]
    notes += [f"worker {w.name} wrote no run (exit status {status.get(w.name)}): its tests are missing here, its "
              "log says why" for w in workers if not w.json_path.is_file()]
    worst = max(status.values(), default=0)
    if not saved:
        return write_markdown(render(RunFacts({}, worst, notes + ["nothing was saved"]), extra), path)
    shown = [where.relative_to(ROOT) if where.is_relative_to(ROOT) else where for where in saved]
    return write_markdown("\n".join(render(RunFacts(json.loads(where.read_text()), worst, [*notes, f"saved: `{name}`"]),
                                           extra) for where, name in zip(saved, shown)), path)


def explain_and_summarise(saved: list[Path], status: dict[str, int], workers: list[Worker], out: Path,
                          against: str | None, profile_limit: int, summary: str | None, sections: list):
    """After the sessions: the merged run's regressed A/B tests profiled at base and head (up to `profile_limit`),
    then its markdown summary written to `summary` where given, those profiles and `sections` in it."""
    sections = list(sections)
    for path in saved:
        lines = explain_spread_run(json.loads(path.read_text()), against, ROOT, profile_limit)
        if lines:
            print("\n".join(["gpuengine.gate.spread: why it regressed (the engine profiled at the base and at the "
                              "head):", *lines]), flush=True)
            sections.append(summary_section(lines))
    if summary is not None:
        written = write_summary(Path(summary), saved, status, workers, out, sections)
        print(f"gpuengine.gate.spread: the run's summary for a pull request: {', '.join(map(str, written))}",
              flush=True)


def merged_run_naming() -> tuple[str, dict | None]:
    """The merged run's tag and the commit_info fields that name its commit, as a single run's autosave gets them
    (conftest.py): GATE_COMMIT_ID where set (a lent machine's copy of the tree has no .git), else git's answer."""
    return run_tag(*checkout_commit()), named_commit_info()


def main(argv: list[str] | None = None) -> int:
    from pytest_benchmark.utils import get_machine_id
    argv = list(sys.argv[1:] if argv is None else argv)
    save_baseline = "--save-baseline" in argv
    summary, argv = take_option(argv, SUMMARY_OPTION)
    profiles, argv = take_option(argv, PROFILE_OPTION)
    try:
        profile_limit = DEFAULT_LIMIT if profiles is None else int(profiles)
    except ValueError:
        raise SystemExit(f"gpuengine.gate.spread: {PROFILE_OPTION} {profiles!r}: use a whole number >= 0") from None
    args = [a for a in argv if a not in HELD_BACK]
    devices = visible_devices()
    if len(devices) < 2:
        stop_before_running(f"{len(devices)} GPU(s) visible (CUDA_VISIBLE_DEVICES="
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>: every GPU nvidia-smi lists')}); "
                            "a spread run needs >= 2")
    try:   # --against-stack: the base's environment built once here; every GPU's session reuses it
        prepare_from_args(args, ROOT)
    except StackBaseError as exc:
        stop_before_running(str(exc))
    started = time.monotonic()
    tests = collect(args)
    if not tests:
        stop_before_running("no perf test selected", ExitCode.NO_TESTS_COLLECTED)
    out = Path(tempfile.mkdtemp(prefix="gpuengine-spread-"))
    full = "--full" in args
    workers = plan_workers(tests, devices, stored_seconds(ROOT / "baselines_store"), out, full, timing_cores(devices))
    print(f"gpuengine.gate.spread: GPUs {','.join(devices)}; " + "; ".join(describe(w, full) for w in workers),
          flush=True)
    try:
        status = run_workers(workers, [*args, PROFILE_OPTION, "0"], out)
    except KeyboardInterrupt:   # Ctrl-C: the sessions had it too, and none of them is a verdict
        print("gpuengine.gate.spread: interrupted: no verdict, nothing was saved", file=sys.stderr, flush=True)
        return ExitCode.INTERRUPTED
    tag, commit_info = merged_run_naming()
    saved = save_merged(workers, status, ROOT / "baselines_store", get_machine_id(), tag, save_baseline, commit_info,
                        time.monotonic() - started, storage_folder(take_option(args, "--benchmark-storage")[0]))
    sections = []
    for path in saved:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"gpuengine.gate.spread: saved the merged run as {shown}", flush=True)
        tier = json.loads(path.read_text())["machine_info"]["tier"]
        lines = changepoints.recent_lines(changepoints.folder_of(path), tier)
        print("\n".join(f"gpuengine.gate.spread: change points: {line}" for line in lines), flush=True)
        sections.append(change_points(lines))
    keep_plans([w for w in workers if w.devices is None])
    explain_and_summarise(saved, status, workers, out, take_option(args, "--against")[0], profile_limit, summary,
                          sections)
    return max(status.values(), default=0)


if __name__ == "__main__":
    sys.exit(main())
