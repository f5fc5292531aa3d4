"""The GPU probes of scripts/ (cudnn_execute_cost.py, cudnn_plan_transfer.py, setup_time.py, bn_layers.py) say
plainly where they cannot run."""
from __future__ import annotations

import pytest

from gpuengine.runtime.backend import gpu_visible

from .script_module import load_script


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: the script measures instead of refusing")
@pytest.mark.parametrize("script,args", [("cudnn_execute_cost", ["--calls", "10"]),
                                         ("cudnn_plan_transfer", ["--workers", "1"]),
                                         ("setup_time", ["resnet", "--toggle", "plan_workers=2"]),
                                         ("bn_layers", ["resnet", "--reps", "3"])])
def test_without_a_gpu_it_is_one_clear_error(script, args, capsys):
    assert load_script(script).main(args) == 2
    assert "needs a GPU with CuPy and the cuDNN frontend; none is visible here" in capsys.readouterr().err


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
