"""Suite-wide pytest plumbing: engine toggles, the run's tier, GPU-only tests, stored runs per tier.

- `--gpuengine-<toggle>` options override the `GPUENGINE_*` environment, which
  overrides the built-in defaults (`EngineConfig.from_env`); a bad value stops
  the session with a usage error naming the toggle.
- The tier (`gpuengine.bench.machine_info`) is the GPU the engine runs on, or the CPU
  tier. pytest-benchmark stores and compares runs in `baselines_store/<tier>/`
  (plus a `config-...` folder when toggles differ from the defaults), so a run
  is only ever compared with runs of the same GPU and settings.
- `--benchmark-compare` with no stored run yet is dropped with a header
  notice (this run becomes the first baseline) instead of failing the session
  at its end; on the CPU tier `--benchmark-compare-fail` is dropped, because
  CPU timings are smoke only. Which stored run each test compares with, and
  whether this run is saved as a baseline or as history, is
  gpuengine/gate/plugin.py's (through gpuengine/gate/hooks.py, registered below).
- When the stored run compared against was measured on another GPU stack
  (driver, CUDA, cuDNN, library versions, toggles, the lock), the header says which
  facts changed, instead of pytest-benchmark's dump of every machine fact
  (clocks and CPU Hz differ on every run).
- Tests marked `gpu` are skipped with a stated reason when no GPU is visible.
- Tests marked `tf` (the TensorFlow/Keras comparisons) run after all the others.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuengine.bench.machine_info import (Tier, collect_machine_info, current_tier, named_commit, named_commit_info,
                                         run_tag)
from gpuengine.bench.stack_lock import stack_of
from gpuengine.gate.store.run_storage import storage_folder
from gpuengine.gate.store.stored_runs import run_files
from gpuengine.config import ConfigError, EngineConfig
from gpuengine.runtime.backend import get_backend, gpu_visible, resolve_device

# pytester: the harness tests run small pytest sessions of their own; gpuengine.gate.hooks: the gate's plugin
# (baselines, saving by outcome, tiers, A/B, kept plans, progress, summaries), each hook calling its parts in order.
pytest_plugins = ("pytester", "gpuengine.gate.hooks")

BASELINES_DIR = "baselines_store"
GPU_SKIP_REASON = "no CUDA GPU visible (CuPy missing or no device): GPU-only test"
DEFAULT_BENCHMARK_STORAGE = "file://./.benchmarks"  # pytest-benchmark's default: nobody chose a storage
STACK_FACTS = ("gpu", "gpu_driver", "cuda_runtime", "cudnn", "cupy", "torch", "nvmath", "gpu_power_limit_w",
               "gpuengine_config", "stack_lock")  # the machine facts that make a stored run comparable or not

TOGGLE_HELP = {
    "precision": "fp32 | tf32 | bf16",
    "cuda_graph": "0 = eager; N = N training steps per CUDA graph launch",
    "resident_data": "1 = dataset staged on the device; 0 = streamed from the host",
    "batch_pool": "streamed data's batch buffers on the device (1, or 2: the next batch staged)",
    "profile": "1 = per-phase device timings of a step",
    "deterministic": "1 = cuDNN's deterministic engines only (the default); 0 = any engine, the fastest",
    "batchnorm": "cudnn = batch norm as cuDNN frontend graphs (the default); engine = the engine's own kernels",
    "bias_grad": "sum = dense layers' bias gradients by the engine's column sum (the default); epilogue = in the "
                 "weight-gradient GEMM (cuBLASLt's BGRADB)",
    "plan_workers": "processes building cuDNN's runtime-compiled plans at set-up (0, the default: built here)",
    "device": "cuda | cpu (default: cuda when a GPU is visible)",
    "vram_cap_gib": "cap of the engine's device memory pool in GiB, or 'full'",
}


@dataclass(frozen=True)
class RunSettings:
    """What this pytest run measures: the engine's settings and the tier of the machine running them."""

    config: EngineConfig
    tier: Tier
    storage: str | None   # where pytest-benchmark stores and compares runs (None: plugin not loaded)
    notices: list[str]    # said in the header: options this run adjusted, stack changes since the stored run
    chosen: frozenset = frozenset()   # toggles set by --gpuengine-* or GPUENGINE_*: perf cases outside them skip


RUN_SETTINGS = pytest.StashKey[RunSettings]()


def pytest_addoption(parser):
    group = parser.getgroup("gpuengine", "engine toggles (default: the GPUENGINE_* environment, then built-in)")
    for toggle in EngineConfig.toggles():
        group.addoption(f"--gpuengine-{toggle.replace('_', '-')}", dest=f"gpuengine_{toggle}", default=None,
                        metavar="VALUE", help=f"{TOGGLE_HELP[toggle]} (env GPUENGINE_{toggle.upper()})")


def _config_variant(config: EngineConfig) -> str | None:
    """A folder name for toggles that differ from the defaults, so such runs get baselines of their own."""
    defaults = EngineConfig(device=config.device)
    changed = [f"{t}-{str(getattr(config, t)).lower()}" for t in EngineConfig.toggles()
               if t != "device" and getattr(config, t) != getattr(defaults, t)]
    return "config-" + "+".join(changed) if changed else None


def _route_benchmark_storage(config: pytest.Config, engine_config: EngineConfig, tier: Tier):
    """Point pytest-benchmark at this tier's folder; runs before its own (trylast) configure reads the options."""
    option = config.option
    if not hasattr(option, "benchmark_storage"):
        return None, []
    notices = []
    if option.benchmark_storage == DEFAULT_BENCHMARK_STORAGE:
        folder = config.rootpath / BASELINES_DIR / tier.name
        variant = _config_variant(engine_config)
        if variant:
            folder = folder / variant
        if (option.markexpr or "").strip() == "slow":
            # The max-batch searches keep a history of their own: `--benchmark-compare` reads the newest
            # run only, and a run of them alone would hide the speed baseline from the next `gate perf`.
            folder = folder / "slow"
        option.benchmark_storage = f"file://{folder}"
        if option.benchmark_compare is True and not run_files(folder):
            option.benchmark_compare = []
            option.benchmark_compare_fail = None
            notices.append(f"no stored run in {folder.relative_to(config.rootpath)} yet: nothing to compare "
                           "against; a saved run becomes the first baseline")
    if not tier.on_gpu and option.benchmark_compare_fail:
        option.benchmark_compare_fail = None
        notices.append("CPU tier: --benchmark-compare-fail ignored, CPU timings never gate")
    return option.benchmark_storage, notices


def pytest_configure(config: pytest.Config):
    overrides = {t: config.getoption(f"gpuengine_{t}") for t in EngineConfig.toggles()}
    try:
        engine_config = EngineConfig.from_env(**overrides)
        on_gpu = resolve_device(engine_config) == "cuda"
    except ConfigError as exc:
        raise pytest.UsageError(f"gpuengine: {exc}") from exc
    tier = current_tier(on_gpu)
    storage, notices = _route_benchmark_storage(config, engine_config, tier)
    from gpuengine.gate import plugin   # a part of gpuengine.gate.hooks, registered through pytest_plugins above
    plugin.configure(config, tier)
    _name_autosave_after_gate_commit(config)
    chosen = frozenset(t for t, value in overrides.items()
                       if value is not None or os.environ.get(f"GPUENGINE_{t.upper()}", "") != "")
    config.stash[RUN_SETTINGS] = RunSettings(engine_config, tier, storage, notices, chosen)
    # pytest-benchmark's own check warns with every machine fact whenever clocks move; ours names what matters.
    warnings.filterwarnings("ignore", message="Benchmark machine_info is different")


def _name_autosave_after_gate_commit(config: pytest.Config):
    """pytest-benchmark names an autosaved run after what git says (a stale .git on a lent machine):
    GATE_COMMIT_ID, when set, names it instead, like the run's commit_info (update_commit_info below)."""
    named = named_commit()
    if named and getattr(config.option, "benchmark_autosave", None):
        config.option.benchmark_autosave = run_tag(*named)


def pytest_report_header(config: pytest.Config) -> list[str]:
    target = config.stash[RUN_SETTINGS]
    tier = target.tier
    if tier.on_gpu:
        what = f"GPU {tier.gpu_name}: same-run ratios and stored-run regressions gate"
    else:
        what = "CPU tier (NumPy backend) — timings are smoke only, not gated"
    lines = [f"gpuengine tier {tier.name}: {what}", f"gpuengine config: {target.config.describe()}"]
    if target.storage:
        lines.append(f"gpuengine benchmark storage: {target.storage}")
    return lines + [f"gpuengine: {notice}" for notice in target.notices]


@pytest.hookimpl(optionalhook=True)  # a pytest-benchmark hook: absent when the plugin is disabled
def pytest_benchmark_update_machine_info(config, machine_info):
    target = config.stash[RUN_SETTINGS]
    machine_info.update(collect_machine_info(target.tier, target.config))
    machine_info["series"] = _series(config.rootpath, target)


def _series(root, target: RunSettings) -> str | None:
    """Where in its tier's folder the run is stored: "" the tier's own runs, else its series' folder ("slow",
    "config-.../slow"), so a run merged from several sessions (gpuengine/gate/spread.py) is stored beside theirs;
    None where --benchmark-storage named a folder outside the tier's."""
    folder = storage_folder(target.storage)
    tier_folder = (root / BASELINES_DIR / target.tier.name).resolve()
    if folder is None or not folder.is_relative_to(tier_folder):
        return None
    series = folder.relative_to(tier_folder)
    return "" if series == Path() else series.as_posix()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_commit_info(config, commit_info):
    """A copy of the tree whose .git is missing or stale (a lent GPU machine) names its commit through
    GATE_COMMIT_ID: when set, it wins over what git reports there."""
    named = named_commit_info()
    if named:
        commit_info.update(named)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    stored = compared_benchmark["machine_info"]
    changed = [f"{fact} {_fact(stored, fact)} -> {_fact(machine_info, fact)}" for fact in STACK_FACTS
               if _fact(stored, fact) != _fact(machine_info, fact)]
    if changed:
        config.stash[RUN_SETTINGS].notices.append(f"the stored run compared against differs: {'; '.join(changed)}")


def _fact(machine_info: dict, fact: str):
    """A machine fact as the header names it: the lock readably ('cpu lock 1a2b3c4d5e6f'), the rest as stored."""
    return str(stack_of(machine_info)) if fact == "stack_lock" else machine_info.get(fact)


def pytest_collection_modifyitems(config, items):
    # TensorFlow comes into the process with the first `tf` test and stays: its import (seconds), its thread
    # pools and Keras' reseeding of Python's and NumPy's global generators (keras.utils.set_random_seed)
    # then reach no other test. The test modules decide to skip without importing it (tf_common).
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("tf") is not None)   # stable
    if gpu_visible():
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def run_settings(pytestconfig) -> RunSettings:
    return pytestconfig.stash[RUN_SETTINGS]


@pytest.fixture(scope="session")
def engine_config(run_settings) -> EngineConfig:
    """The toggles of this run: command line, then GPUENGINE_* environment, then defaults."""
    return run_settings.config


@pytest.fixture(scope="session")
def on_gpu(run_settings) -> bool:
    """True when the engine runs on a CUDA GPU (not the NumPy CPU tier)."""
    return run_settings.tier.on_gpu


@pytest.fixture(scope="session")
def backend(engine_config):
    return get_backend(engine_config)


@pytest.fixture(scope="session")
def requires_torch():
    """The torch module; tests asking for it skip with a reason where it is not installed."""
    return pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e .[torch]): no reference")
