"""On a GPU: the conv + BN fusion probe runs end to end on the reduced ResNet, and every fused piece cuDNN
accepts matches float64 (scripts/probe_conv_bn_fusion.py; its CPU side is test_conv_bn_sites.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuengine.runtime.backend import gpu_visible

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_fusion_probe_smoke(precision, tmp_path):
    import probe_conv_bn_fusion
    payload = probe_conv_bn_fusion.main(["--smoke", "--precisions", precision, "--out", str(tmp_path / "p.json")])
    rows = payload["rows"][precision]
    assert len(rows) == payload["distinct_sites"]
    errors = [(r["site"], n) for r in rows for n in r["notes"] if n.startswith("ERROR")]
    assert not errors, errors
    for r in rows:   # today's engine path always runs
        assert r["us"]["F0"] > 0 and r["us"]["B0"] > 0, r["site"]
    fused = [r for r in rows if r["numerics_ok"] is not None]
    if not fused:
        pytest.skip(f"cuDNN accepted no fused forward+backward here: {rows[0]['notes']}")
    bad = [(r["site"], r["numerics"]) for r in fused if not r["numerics_ok"]]
    assert not bad, bad
