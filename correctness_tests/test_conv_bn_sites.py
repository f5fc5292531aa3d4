"""The conv + BN fusion probe's CPU side (scripts/conv_bn_sites.py): ResNet's sites, the BN references, the arithmetic.

The probe's GPU run (scripts/probe_conv_bn_fusion.py, test_gpu_conv_bn_fusion.py) checks its fused cuDNN
graphs and kernels against these float64 references, so the references are checked here against the
engine's own NumPy BatchNorm2D.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpuengine.layers import BatchNorm2D
from gpuengine.workloads import resnet

from .layer_harness import run_layer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from conv_bn_sites import (bn_finalize_ref, conv_bn_sites, dbn_coefficients_ref, distinct_sites,  # noqa: E402
                           format_table, prologue_ref, step_estimate)


@pytest.fixture(scope="module")
def resnet50_sites():
    return conv_bn_sites(resnet.build_resnet(), 128)


def test_resnet50_has_53_convs_each_feeding_a_bn(resnet50_sites):
    net = resnet.build_resnet()
    convs = [n.name for n in net.nodes if type(n.layer).__name__ == "Conv2D"]
    assert len(convs) == 53
    assert [name for name, _ in resnet50_sites] == convs


def test_roles_and_prologues_follow_the_bottleneck(resnet50_sites):
    sites = dict(resnet50_sites)
    roles = Counter(s.role for s in sites.values())
    assert roles == {"conv_prologue": 32, "block_end": 16, "shortcut": 4, "materialized": 1}
    # conv2 and conv3 read bn1's and bn2's unwritten ReLU outputs; conv1 and the projections read block inputs
    assert {n for n, s in sites.items() if s.prologue} == {n for n in sites if n.endswith((".conv2", ".conv3"))}
    assert {n for n, s in sites.items() if s.dual} == {f"layer{k}.0.conv3" for k in range(1, 5)}
    stem = sites["conv1"]
    assert stem.role == "materialized" and not stem.input_grad and stem.input_hwc == (32, 32, 3)
    assert stem.output_hwc == (16, 16, 64)
    assert sites["layer4.2.conv2"].output_hwc == (1, 1, 512)


def test_distinct_sites_keep_every_conv_once(resnet50_sites):
    groups = distinct_sites(resnet50_sites)
    assert sum(len(names) for _, names in groups) == 53
    assert sorted(n for _, names in groups for n in names) == sorted(n for n, _ in resnet50_sites)
    assert len(groups) == 28
    multiplicity = {site.describe(): len(names) for site, names in groups}
    assert multiplicity["2x2x256->2x2x256 3x3/1 pro conv_prologue"] == 5   # layer3's five identity blocks
    assert len(set(multiplicity)) == len(groups)   # descriptions tell the shapes apart


def test_unfused_block_ends_are_written_by_their_add():
    sites = dict(conv_bn_sites(resnet.build_resnet(fused=False), 128))
    assert len(sites) == 53
    assert Counter(s.role for s in sites.values()) == {"conv_prologue": 32, "materialized": 21}


def _bn_case(seed=0, shape=(6, 3, 3, 8)):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 1.5 + 0.3
    gamma, beta = 1 + 0.2 * rng.standard_normal(shape[3]), 0.2 * rng.standard_normal(shape[3])
    return x, rng.standard_normal(shape), gamma, beta


def test_finalize_and_apply_reproduce_the_engine_batchnorm():
    x, dy, gamma, beta = _bn_case()
    count = x.size // x.shape[3]
    ref = run_layer(BatchNorm2D("relu", name="bn"), x, dy, weights={"bn.weight": gamma, "bn.bias": beta})
    fin = bn_finalize_ref(x.sum(axis=(0, 1, 2)), (x * x).sum(axis=(0, 1, 2)), count, gamma, beta,
                          np.zeros(8), np.ones(8), 1e-5, 0.1)
    np.testing.assert_allclose(prologue_ref(x, fin["scale"], fin["bias"]), ref["y"], rtol=1e-9, atol=1e-9)
    # running statistics are float32 buffers in the engine
    np.testing.assert_allclose(fin["running_mean"], ref["buffer:bn.running_mean"], rtol=1e-6)
    np.testing.assert_allclose(fin["running_var"], ref["buffer:bn.running_var"], rtol=1e-6)
    # backward: dz = relu'(y) dy, then dx = A dz + B x + C and the parameter gradients
    dz = dy * (ref["y"] > 0)
    coef = dbn_coefficients_ref(dz.sum(axis=(0, 1, 2)), (dz * x).sum(axis=(0, 1, 2)), count, fin["mean"],
                                fin["inv_std"], gamma)
    np.testing.assert_allclose(coef["A"] * dz + coef["B"] * x + coef["C"], ref["dx"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(coef["dgamma"], ref["grad:bn.weight"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(coef["dbeta"], ref["grad:bn.bias"], rtol=1e-9, atol=1e-12)


def _row(m, f0, f1, b0, b1, site="s"):
    return {"site": site, "multiplicity": m, "us": {"F0": f0, "F1": f1, "B0": b0, "B1": b1}, "notes": ["n"]}


def test_step_estimate_sums_multiplicity_times_time_over_measured_passes():
    rows = [_row(3, 10.0, 6.0, 20.0, 15.0), _row(2, 5.0, 4.0, None, None), _row(1, None, None, 8.0, 4.0)]
    est = step_estimate(rows)
    assert est["forward"] == {"convs": 5, "today_us": 40.0, "fused_us": 26.0}
    assert est["backward"] == {"convs": 4, "today_us": 68.0, "fused_us": 49.0}
    assert est["step"]["convs"] == 3
    assert est["step"]["today_us"] == 90.0 and est["step"]["fused_us"] == 63.0
    assert est["step"]["saved_us"] == 27.0 and est["step"]["today_over_fused"] == pytest.approx(90 / 63)
    empty = step_estimate([_row(1, None, None, None, None)])
    assert empty["step"] == {"convs": 0, "today_us": 0, "fused_us": 0, "saved_us": 0, "today_over_fused": None}


def test_table_lists_each_site_and_the_estimate():
    text = format_table("bf16", [_row(3, 10.0, 6.0, 20.0, 15.0, "a"), _row(2, None, None, None, None, "b")], 53)
    lines = text.splitlines()
    assert lines[0] == "== bf16"
    assert any(line.startswith("a ") and "10.0" in line and "15.0" in line for line in lines)
    assert any(line.startswith("b ") and line.count(" -") == 4 for line in lines)
    assert "step     over  3 of 53 convs: today   0.090 ms, fused   0.063 ms (1.43x)" in lines
