"""scripts/cudnn_execute_cost.py (the host time of one eager cuDNN execution) says plainly where it cannot run."""
from __future__ import annotations

import pytest

from gpuengine.runtime.backend import gpu_visible

from .script_module import load_script


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible: the script measures instead of refusing")
def test_without_a_gpu_it_is_one_clear_error(capsys):
    assert load_script("cudnn_execute_cost").main(["--calls", "10"]) == 2
    assert "needs a GPU with CuPy and the cuDNN frontend; none is visible here" in capsys.readouterr().err
