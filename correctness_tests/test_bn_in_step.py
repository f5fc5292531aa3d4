"""scripts/bn_in_step.py: a profile's batch-norm launches paired with bn_layers' layers, forward in order and
backward in reverse, and the files that do not pair refused by name."""
from __future__ import annotations

import json

import pytest

from .script_module import load_script

LAYERS = {"workload": "resnet", "precision": "bf16",
          "layers": [{"layer": "bn1", "shape": [128, 16, 16, 64], "engine_forward_us": 18.8,
                      "engine_backward_us": 18.8},
                     {"layer": "layer1.0.bn1", "shape": [128, 8, 8, 64], "engine_forward_us": 10.8,
                      "engine_backward_us": 9.9}]}


def profile(batchnorm="engine", forward=(21.0, 12.5), backward=(11.0, 19.5), precision="bf16") -> dict:
    names = ("bn_forward", "bn_backward") if batchnorm == "engine" else ("nhwc_batch_norm_fwd", "nhwc_batch_norm_bwd")
    kernels = [{"name": names[0], "launch_us": list(forward)}, {"name": names[1], "launch_us": list(backward)}]
    return {"workload": "resnet", "toggles": {"precision": precision, "batchnorm": batchnorm},
            "runners": {"gpuengine": {"kernels": kernels}}}


def test_forward_launches_pair_in_order_and_backward_ones_in_reverse():
    result = load_script("bn_in_step").pair(profile(), LAYERS)
    assert result["side"] == "engine" and result["cold"] is False   # bn_layers without --cold: L2 warm
    first, second = result["layers"]
    assert (first["forward_alone_us"], first["forward_step_us"]) == (18.8, 21.0)
    assert (first["backward_alone_us"], first["backward_step_us"]) == (18.8, 19.5)   # the last backward launch
    assert (second["forward_step_us"], second["backward_step_us"]) == (12.5, 11.0)
    assert result["totals"] == {"forward_alone_us": 29.6, "forward_step_us": 33.5, "backward_alone_us": 28.7,
                                "backward_step_us": 30.5}


@pytest.mark.parametrize("changed, message", [
    (dict(precision="tf32"), "the profile is of resnet tf32, the layers' times of resnet bf16"),
    (dict(batchnorm="cudnn"), "bn_layers timed no cudnn side"),
    (dict(forward=(21.0,)), "bn_forward launches 1 times a step where bn_layers timed 2 layers"),
])
def test_files_that_do_not_pair_are_refused_naming_why(changed, message):
    with pytest.raises(ValueError, match=message):
        load_script("bn_in_step").pair(profile(**changed), LAYERS)


def test_the_command_prints_the_table_writes_json_and_refuses_with_status_2(tmp_path, capsys):
    script = load_script("bn_in_step")
    (tmp_path / "p.json").write_text(json.dumps(profile()))
    (tmp_path / "l.json").write_text(json.dumps(LAYERS))
    assert script.main([str(tmp_path / "p.json"), str(tmp_path / "l.json"), "--out", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("engine's batch norm, us a call: alone, L2 warm")
    assert out[-1].split()[:5] == ["total", "29.6", "33.5", "+3.9", "28.7"]
    assert json.loads((tmp_path / "o.json").read_text())["totals"]["forward_step_us"] == 33.5
    (tmp_path / "p.json").write_text(json.dumps({**profile(), "runners": {}}))
    assert script.main([str(tmp_path / "p.json"), str(tmp_path / "l.json")]) == 2
    assert "the profile has no runner 'gpuengine'" in capsys.readouterr().err
    (tmp_path / "p.json").write_text(json.dumps(profile()))
    (tmp_path / "l.json").write_text(json.dumps({**LAYERS, "cold": True}))
    assert script.main([str(tmp_path / "p.json"), str(tmp_path / "l.json")]) == 0
    assert "alone after an L2 flush" in capsys.readouterr().out.splitlines()[0]
