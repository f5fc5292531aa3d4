"""The GPU probes of scripts/ (cudnn_execute_cost.py, cudnn_plan_transfer.py, setup_time.py, bn_layers.py,
residue.py) say plainly where they cannot run."""
from __future__ import annotations

import pytest

from gpuengine.runtime.backend import gpu_visible

from .script_module import load_script


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: the script measures instead of refusing")
@pytest.mark.parametrize("script,args", [("cudnn_execute_cost", ["--calls", "10"]),
                                         ("cudnn_plan_transfer", ["--workers", "1"]),
                                         ("setup_time", ["resnet", "--toggle", "plan_workers=2"]),
                                         ("bn_layers", ["resnet", "--reps", "3"]),
                                         ("residue", ["resnet", "--phases", "kept,modules,again"])])
def test_without_a_gpu_it_is_one_clear_error(script, args, capsys):
    assert load_script(script).main(args) == 2
    assert "needs a GPU with CuPy and the cuDNN frontend; none is visible here" in capsys.readouterr().err


def test_residue_refuses_an_unknown_phase_by_name(capsys):
    with pytest.raises(SystemExit):
        load_script("residue").main(["resnet", "--phases", "kept,warmth"])
    assert "--phases 'kept,warmth': warmth; choose from kept, modules," in capsys.readouterr().err


def test_residue_modules_hold_distinct_kernels():
    """Each module's kernels have names of their own: a module loads new functions, not shared ones."""
    script = load_script("residue")
    names = [line.split("void ")[1].split("(")[0] for index in range(3)
             for line in script.module_source(index).splitlines() if "__global__" in line]
    assert len(names) == 3 * script.KERNELS_PER_MODULE == len(set(names))


def test_setup_time_refuses_a_bad_toggle_by_name(capsys):
    with pytest.raises(SystemExit):
        load_script("setup_time").main(["resnet", "--toggle", "plan_workers=lots"])
    assert "argument --toggle: plan_workers='lots' is not accepted" in capsys.readouterr().err


def test_bn_layers_refuses_no_repetitions(capsys):
    with pytest.raises(SystemExit):
        load_script("bn_layers").main(["resnet", "--reps", "0"])
    assert "--reps 0: at least 1" in capsys.readouterr().err


def test_bn_layers_refuses_a_bad_layer_pattern_by_name(capsys):
    with pytest.raises(SystemExit):
        load_script("bn_layers").main(["resnet", "--only", "layer1.(", "--batchnorm", "engine"])
    assert "--only 'layer1.(': not a regular expression" in capsys.readouterr().err


def test_bn_layers_tables_every_side_and_the_planned_grids(capsys, monkeypatch, tmp_path):
    """The table and JSON of three sides from stand-in timings: what a device run prints and writes."""
    import json

    from gpuengine.runtime import backend
    script = load_script("bn_layers")
    monkeypatch.setattr(backend, "gpu_visible", lambda: True)
    asked = []
    grid = {"tiles": 16, "chunks": 8, "tile_packs": 1, "cluster": 8}
    ticket = {"tiles": 4, "chunks": 4, "tile_packs": 4, "cluster": 1}

    def layer_times(workload, precision, side, reps, only="", narrowest=1, widest=None, cold=False):
        asked.append((side, narrowest, widest, cold))
        plans = {"cudnn": None, "engine": [grid, {**grid, "chunks": 4, "cluster": 4}], "ticket": [ticket, ticket]}
        return [{"layer": "layer1.0.bn1", "shape": [128, 4, 4, 128], "activation": "relu", "residual": False,
                 "mask": True, "plans": plans[side], "forward_us": {"cudnn": 8.8, "engine": 7.0, "ticket": 13.6}[side],
                 "backward_us": 9.0}]
    monkeypatch.setattr(script, "layer_times", layer_times)
    assert script.main(["resnet", "--out", str(tmp_path / "bn.json"), "--narrowest", "2", "--widest", "8",
                        "--cold"]) == 0
    assert asked == [(side, 2, 8, True) for side in ("cudnn", "engine", "ticket")]
    out = capsys.readouterr().out
    assert "cuDNN fwd" in out and "ticket bwd" in out and "grids" in out
    assert "relu+mask" in out and "8.8" in out and "13.6" in out and "16x8 1p c8 | 16x4 1p c4" in out
    record = json.loads((tmp_path / "bn.json").read_text())
    layer = record["layers"][0]
    assert layer["engine_plans"][0] == grid and layer["ticket_plans"] == [ticket, ticket]
    assert "cudnn_plans" not in layer and (record["narrowest"], record["widest"], record["cold"]) == (2, 8, True)
    assert layer["engine_forward_us"] == 7.0 and record["totals"]["ticket_forward_us"] == 13.6


def test_bn_layers_cold_calls_take_the_flushes_own_time_off(monkeypatch):
    """--cold: a graph of flush-then-call, less a graph of the flushes alone; without it the calls alone."""
    script = load_script("bn_layers")
    ran = []

    def flush():
        ran.append("flush")

    def call():
        ran.append("call")

    def graph_us(backend, step, reps):   # stand-in device time: 30 us a flush, 7 a call
        ran.clear()
        step()
        return 30.0 * ran.count("flush") + 7.0 * ran.count("call")
    monkeypatch.setattr(script, "_graph_us", graph_us)
    assert script._time_us(None, call, 5, flush) == 7.0
    assert script._time_us(None, call, 5) == 7.0 and ran == ["call"]


@pytest.mark.parametrize("argv, message", [(["--narrowest", "3"], "--narrowest 3: 1, 2, 4 or 8 packs"),
                                           (["--narrowest", "4", "--widest", "2"],
                                            "--widest 2 is narrower than --narrowest 4")])
def test_bn_layers_refuses_tile_bounds_it_cannot_plan(capsys, argv, message):
    with pytest.raises(SystemExit):
        load_script("bn_layers").main(["resnet", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("side, chunks", [("engine", (1, 2, 4, 8)), ("ticket", ()), ("cudnn", (1, 2, 4, 8))])
def test_bn_layers_plans_the_ticket_side_without_on_chip_chunks_as_the_trainer_builds(side, chunks):
    """The plan is made when the runner builds its trainer: ON_CHIP_CHUNKS must be empty then for the ticket side,
    and back to the planned sizes after."""
    from types import SimpleNamespace

    from gpuengine.ops import batchnorm as ops_batchnorm
    seen = {}

    def engine_runner(case):
        seen["built"] = ops_batchnorm.ON_CHIP_CHUNKS
        seen["widths"] = ops_batchnorm.FORCED_TILES
        seen["toggles"] = dict(case.engine_toggles)
        runner = SimpleNamespace(trainer=SimpleNamespace(program=SimpleNamespace(layers={})))
        runner.prepare = lambda: seen.setdefault("warmed", ops_batchnorm.ON_CHIP_CHUNKS)
        return runner

    workload = SimpleNamespace(name="resnet", batch=128, engine_runner=engine_runner)
    assert load_script("bn_layers").layer_times(workload, "bf16", side, 1, narrowest=2, widest=4) == []
    assert seen["built"] == seen["warmed"] == chunks and ops_batchnorm.ON_CHIP_CHUNKS == (1, 2, 4, 8)
    assert seen["widths"] == (2, 4) and ops_batchnorm.FORCED_TILES is None
    assert seen["toggles"] == {"batchnorm": "cudnn" if side == "cudnn" else "engine"}
    load_script("bn_layers").layer_times(workload, "bf16", side, 1)
    assert seen["widths"] is None   # without bounds each layer times its plans, as the trainer builds
