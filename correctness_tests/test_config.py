"""EngineConfig: defaults, every toggle from code and from GPUENGINE_* variables, normalisation,
precedence (defaults < environment < explicit overrides), replace() and describe().

Bad values are refused in test_bad_input.py; here every accepted spelling must
arrive as the one normal value the engine compares against.
"""
from __future__ import annotations

import dataclasses

import pytest

from gpuengine.config import ENV_PREFIX, ConfigError, EngineConfig
from gpuengine.runtime.backend import Backend, get_backend

DEFAULTS = {"precision": "tf32", "cuda_graph": 1, "resident_data": True, "batch_pool": 2, "profile": False,
            "deterministic": True, "batchnorm": "cudnn", "bias_grad": "auto", "plan_workers": 0, "device": None,
            "vram_cap_gib": None}

# (toggle, raw spelling, normal value): what code, the command line or tox may write.
SPELLINGS = [
    ("precision", "fp32", "fp32"), ("precision", " BF16 ", "bf16"), ("precision", "TF32", "tf32"),
    ("cuda_graph", "0", 0), ("cuda_graph", " 12 ", 12), ("cuda_graph", 5, 5),
    ("resident_data", "0", False), ("resident_data", "off", False), ("resident_data", "No", False),
    ("resident_data", "FALSE", False), ("resident_data", "1", True), ("resident_data", "on", True),
    ("resident_data", "yes", True), ("resident_data", "True", True), ("resident_data", False, False),
    ("batch_pool", "1", 1), ("batch_pool", 2, 2),
    ("profile", "1", True), ("profile", "true", True), ("profile", "0", False), ("profile", True, True),
    ("deterministic", "0", False), ("deterministic", "on", True), ("deterministic", False, False),
    ("batchnorm", "Engine", "engine"), ("batchnorm", " cudnn ", "cudnn"), ("batchnorm", "AUTO", "auto"),
    ("bias_grad", " Epilogue", "epilogue"), ("bias_grad", "sum", "sum"), ("plan_workers", " 4 ", 4),
    ("plan_workers", 0, 0),
    ("device", "CPU", "cpu"), ("device", "cuda", "cuda"), ("device", "auto", None), ("device", "", None),
    ("vram_cap_gib", "6", 6.0), ("vram_cap_gib", "0.5", 0.5), ("vram_cap_gib", 6, 6.0),
    ("vram_cap_gib", "full", None), ("vram_cap_gib", "None", None), ("vram_cap_gib", "", None),
]


def test_defaults():
    config = EngineConfig()
    assert {name: getattr(config, name) for name in EngineConfig.toggles()} == DEFAULTS


def test_toggles_are_the_design_table_in_order():
    assert EngineConfig.toggles() == tuple(DEFAULTS)


def test_every_toggle_has_accepted_spellings_here():
    assert {toggle for toggle, _, _ in SPELLINGS} == set(EngineConfig.toggles())


@pytest.mark.parametrize("toggle,raw,normal", SPELLINGS)
def test_from_code(toggle, raw, normal):
    value = getattr(EngineConfig(**{toggle: raw}), toggle)
    assert value == normal and type(value) is type(normal)


@pytest.mark.parametrize("toggle,raw,normal", [s for s in SPELLINGS if isinstance(s[1], str) and s[1] != ""])
def test_from_the_environment(toggle, raw, normal):
    config = EngineConfig.from_env(environ={ENV_PREFIX + toggle.upper(): raw})
    value = getattr(config, toggle)
    assert value == normal and type(value) is type(normal)
    others = {name for name in EngineConfig.toggles() if name != toggle}
    assert all(getattr(config, name) == DEFAULTS[name] for name in others)


def test_all_toggles_from_the_environment_at_once():
    environ = {"GPUENGINE_PRECISION": "bf16", "GPUENGINE_CUDA_GRAPH": "4", "GPUENGINE_RESIDENT_DATA": "0",
               "GPUENGINE_BATCH_POOL": "1", "GPUENGINE_PROFILE": "1", "GPUENGINE_DETERMINISTIC": "0",
               "GPUENGINE_DEVICE": "cpu", "GPUENGINE_VRAM_CAP_GIB": "6", "PATH": "/usr/bin", "GPUENGINE": "x"}
    assert EngineConfig.from_env(environ=environ) == EngineConfig(
        precision="bf16", cuda_graph=4, resident_data=False, batch_pool=1, profile=True, deterministic=False,
        device="cpu", vram_cap_gib=6)


def test_empty_environment_variables_are_unset():
    environ = {ENV_PREFIX + name.upper(): "" for name in EngineConfig.toggles()}
    assert EngineConfig.from_env(environ=environ) == EngineConfig()


def test_from_env_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("GPUENGINE_PRECISION", "fp32")
    monkeypatch.setenv("GPUENGINE_CUDA_GRAPH", "7")
    config = EngineConfig.from_env()
    assert (config.precision, config.cuda_graph) == ("fp32", 7)


def test_overrides_beat_the_environment_and_none_means_not_given():
    environ = {"GPUENGINE_PRECISION": "bf16", "GPUENGINE_CUDA_GRAPH": "4"}
    config = EngineConfig.from_env(environ=environ, precision="fp32", cuda_graph=None, batch_pool="2")
    assert (config.precision, config.cuda_graph, config.batch_pool) == ("fp32", 4, 2)


def test_overrides_are_normalised_like_everything_else():
    assert EngineConfig.from_env(environ={}, resident_data="off", device="CPU") == EngineConfig(resident_data=False,
                                                                                                 device="cpu")


def test_configs_are_frozen_and_hashable():
    config = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.precision = "bf16"
    assert hash(config) == hash(EngineConfig()) and config == EngineConfig(precision="TF32", resident_data="1")


def test_replace_normalises_and_keeps_the_rest():
    base = EngineConfig(precision="bf16", cuda_graph=4, device="cpu")
    changed = base.replace(cuda_graph="0", resident_data="off")
    assert (changed.cuda_graph, changed.resident_data) == (0, False)
    assert (changed.precision, changed.device, changed.batch_pool) == ("bf16", "cpu", 2)
    assert (base.cuda_graph, base.resident_data) == (4, True)


def test_describe_names_every_toggle_with_its_value():
    config = EngineConfig(precision="bf16", cuda_graph=4, resident_data=False, batch_pool=2, profile=True,
                          device="cpu", vram_cap_gib=6)
    assert config.describe() == ("precision=bf16 cuda_graph=4 resident_data=False batch_pool=2 profile=True "
                                 "deterministic=True batchnorm=cudnn bias_grad=auto device=cpu vram_cap_gib=6.0")
    shown = DEFAULTS | {"device": "auto", "vram_cap_gib": "full"}   # None is spelled as from_env accepts it
    assert EngineConfig().describe().split() == [f"{name}={value}" for name, value in shown.items()
                                                 if name != "plan_workers"]   # the set-up's speed only


def test_describe_of_the_defaults_reads_back():
    pairs = dict(item.split("=", 1) for item in EngineConfig().describe().split())
    assert EngineConfig.from_env(environ={}, **pairs) == EngineConfig()


def test_mistyped_environment_variable_is_an_error():
    with pytest.raises(ConfigError, match="GPUENGINE_PRECISON"):
        EngineConfig.from_env(environ={"GPUENGINE_PRECISON": "bf16"})


def test_describe_reads_back_through_from_env():
    """What a stored result says about its configuration is enough to rebuild it."""
    config = EngineConfig(precision="fp32", cuda_graph=0, resident_data=False, batch_pool=1, device="cpu",
                          vram_cap_gib=0.25)
    pairs = dict(item.split("=", 1) for item in config.describe().split())
    assert EngineConfig.from_env(environ={}, **pairs) == config


def test_only_a_config_with_a_cap_touches_the_process_wide_pool(monkeypatch):
    calls = []
    monkeypatch.setattr(Backend, "set_memory_cap", lambda self, cap: calls.append(cap))
    get_backend(EngineConfig(device="cpu", vram_cap_gib=6))
    get_backend(EngineConfig(device="cpu"))   # uncapped: must not lift the 6 GiB cap set just before
    assert calls == [6.0]
