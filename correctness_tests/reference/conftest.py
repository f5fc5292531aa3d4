"""Fixtures of the PyTorch reference tests."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def restore_precision_flags():
    """The TF32 flags are process-global; leave them as the test found them."""
    torch = pytest.importorskip("torch", reason="torch is not installed; the PyTorch references cannot run")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])
