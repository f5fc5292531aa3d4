"""Engine settings: one dataclass holding every toggle (docs/architecture.md, "Toggles").

Each toggle is settable from code (`EngineConfig(precision="bf16")`), from the
pytest command line (conftest maps `--gpuengine-<toggle>` onto it) and from a
`GPUENGINE_<TOGGLE>` environment variable (so tox can set it). An unknown value
is a `ConfigError` naming the toggle (or the variable it came from), the value
and what it accepts, never a silent default. Whole-number toggles have a range:
a value past it is a typo, and would still name a folder of stored runs.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

PRECISIONS = ("fp32", "tf32", "bf16")
# whose kernels train batch norm: cuDNN's graphs, the engine's own, or by the map's rows (layers/batchnorm.py)
BATCHNORMS = ("cudnn", "engine", "auto")
BIAS_GRADS = ("auto", "sum", "epilogue")   # bias gradients: by layer (BuildContext), a column sum, in the GEMM
DEVICES = ("cuda", "cpu")
ENV_PREFIX = "GPUENGINE_"
# Steps per graph launch: launch overhead is already negligible at tens of steps; capture time grows with each.
CUDA_GRAPH_RANGE = (0, 1024)
# Streamed data's batch buffers on the device: 1 (the step gathers its own) or 2 (the next one staged; streamed.py).
BATCH_POOL_RANGE = (1, 2)
# Processes building runtime-compiled cuDNN plans (ops/plan_pool.py): each holds a CUDA context of its own.
PLAN_WORKERS_RANGE = (0, 32)
SET_UP_TOGGLES = ("plan_workers",)   # how fast the engine is set up, not what its steps run


class ConfigError(ValueError):
    """A toggle was given a value it does not accept."""


def _parse_bool(toggle: str, raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{toggle}={raw!r} is not accepted; use one of 0, 1, true, false")


def _parse_int(toggle: str, raw, bounds: tuple[int, int]) -> int:
    try:
        value = int(str(raw).strip()) if not isinstance(raw, int) or isinstance(raw, bool) else raw
    except ValueError:
        value = None
    if isinstance(raw, bool) or value is None or not bounds[0] <= value <= bounds[1]:
        raise ConfigError(f"{toggle}={raw!r} is not accepted; use a whole number from {bounds[0]} to {bounds[1]}")
    return value


def _parse_choice(toggle: str, raw, choices) -> str:
    text = str(raw).strip().lower()
    if text not in choices:
        raise ConfigError(f"{toggle}={raw!r} is not accepted; use one of {', '.join(choices)}")
    return text


def _parse_device(toggle: str, raw) -> str | None:
    if raw is None or str(raw).strip().lower() in ("", "auto"):
        return None
    return _parse_choice(toggle, raw, DEVICES)


def _parse_cap(toggle: str, raw) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, str) and raw.strip().lower() in ("", "none", "full"):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{toggle}={raw!r} is not accepted; use a positive number of GiB, or 'full'")
    return value


# toggle -> parser(label, raw): label is the toggle, or the variable the value came from.
_PARSERS = {
    "precision": lambda label, raw: _parse_choice(label, raw, PRECISIONS),
    "cuda_graph": lambda label, raw: _parse_int(label, raw, CUDA_GRAPH_RANGE),
    "resident_data": _parse_bool,
    "batch_pool": lambda label, raw: _parse_int(label, raw, BATCH_POOL_RANGE),
    "profile": _parse_bool,
    "deterministic": _parse_bool,
    "batchnorm": lambda label, raw: _parse_choice(label, raw, BATCHNORMS),
    "bias_grad": lambda label, raw: _parse_choice(label, raw, BIAS_GRADS),
    "plan_workers": lambda label, raw: _parse_int(label, raw, PLAN_WORKERS_RANGE),
    "device": _parse_device,
    "vram_cap_gib": _parse_cap,
}


@dataclass(frozen=True)
class EngineConfig:
    """Every engine toggle; validated and normalised on construction."""

    precision: str = "tf32"         # fp32 (IEEE) | tf32 (tensor cores) | bf16 (fp32 master weights)
    cuda_graph: int = 1             # 0 = eager; N = N training steps per graph launch
    resident_data: bool = True      # stage the dataset on the device once, gather there
    batch_pool: int = 2             # streamed data's batch buffers on the device (2: the next batch is staged)
    profile: bool = False           # per-phase device-event timings of a step
    deterministic: bool = True      # only cuDNN engines (SDPA backward included) that give the same bits every run
    batchnorm: str = "cudnn"        # batch norm's training kernels: cudnn (graphs) | engine (its own) | auto (by map)
    bias_grad: str = "auto"         # bias gradients: auto (by layer) | sum (a column-sum kernel) | epilogue (cuBLASLt)
    plan_workers: int = 0           # processes building cuDNN's runtime-compiled plans at set-up (0: built here)
    device: str | None = None       # cuda | cpu; None picks cuda when a GPU is visible
    vram_cap_gib: float | None = None  # cap the engine's device memory pool

    def __post_init__(self):
        for name, parse in _PARSERS.items():
            object.__setattr__(self, name, parse(name, getattr(self, name)))

    @classmethod
    def toggles(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "EngineConfig":
        """Defaults, then `GPUENGINE_*` variables, then explicit overrides (None = not given).

        Every variable set is checked, even one an override replaces, and its error names the variable."""
        environ = os.environ if environ is None else environ
        known_env = {ENV_PREFIX + name.upper() for name in cls.toggles()}
        unknown_env = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known_env)
        if unknown_env:
            raise ConfigError(f"unknown variable(s) {', '.join(unknown_env)}; the toggles are "
                              f"{', '.join(sorted(known_env))}")
        values = {}
        for name in cls.toggles():
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = _PARSERS[name](ENV_PREFIX + name.upper(), raw)
        known = set(cls.toggles())
        for name, value in overrides.items():
            if name not in known:
                raise ConfigError(f"unknown toggle {name!r}; the toggles are {', '.join(sorted(known))}")
            if value is not None:
                values[name] = value
        return cls(**values)

    def replace(self, **changes) -> "EngineConfig":
        unknown = set(changes) - set(self.toggles())
        if unknown:
            raise ConfigError(f"unknown toggle(s) {sorted(unknown)}; the toggles are {', '.join(self.toggles())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def given_or_from_env(cls, config) -> "EngineConfig":
        """`config` itself, or the environment's settings for None; anything else is refused by name."""
        if config is None:
            return cls.from_env()
        if not isinstance(config, cls):
            raise ConfigError(f"config={config!r} is not accepted; use an EngineConfig, or None for the "
                              "GPUENGINE_* environment's settings")
        return config

    def describe(self) -> str:
        """Every toggle that shapes what a step runs, with its value (plan_workers only speeds the set-up)."""
        shown = {"device": self.device or "auto", "vram_cap_gib": self.vram_cap_gib or "full"}
        return " ".join(f"{name}={shown.get(name, getattr(self, name))}" for name in self.toggles()
                        if name not in SET_UP_TOGGLES)
