"""The (conv -> BN [-> ReLU]) sites of a network, for the conv + BN fusion probe, and the probe's arithmetic.

Pure Python and NumPy (CPU-tested in correctness_tests/test_conv_bn_sites.py); probe_conv_bn_fusion.py runs
the GPU side. A site is a convolution whose only reader is a BatchNorm2D. In the fused scheme (NVIDIA's MLPerf
ResNet recipe: cuDNN runtime fusion) a site's convolution emits the per-channel sum and sum of squares of its
output (genstats), a tiny finalize turns them into the BN's scale s and bias b, and the BN is applied where
its output is read:
  conv_prologue  the BN(+ReLU) output is read only by convolutions: never written; each reader applies
                 relu(s*x + b) on load (prologue), in fprop and in wgrad, and its dgrad recomputes it for
                 the ReLU's gradient;
  materialized   read by something else (the stem's max pool): an apply kernel writes it;
  block_end      BN + residual add + ReLU: an apply kernel writes relu(s*y + b + shortcut), the shortcut
                 being the block's input or, `dual`, a projection BN's s'*y' + b';
  shortcut       a projection's BN: applied inside its block end's kernel.
BN math (Ioffe & Szegedy 2015, the engine's layers/batchnorm.py): over M = N*H*W values per channel,
mean = sum/M, var = sqsum/M - mean^2, s = gamma/sqrt(var + eps), b = beta - mean*s; backward from dz:
dbeta = sum dz, dgamma = inv_std (sum dz*y - mean sum dz), dy = A dz + B y + C with A = s,
B = -A inv_std dgamma / M, C = -A dbeta / M - B mean (the coefficients cuDNN's dbn_weight calls eq_scale_dy,
eq_scale_x and eq_bias).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuengine.layers import BatchNorm2D, Conv2D
from gpuengine.layers.geometry import resolve_window
from gpuengine.model.network import INPUT

ROLES = ("conv_prologue", "materialized", "block_end", "shortcut")
PASSES = ("F0", "F1", "B0", "B1")   # today's forward, fused forward, today's backward, fused backward


@dataclass(frozen=True)
class ConvBnSite:
    """One convolution feeding one BN, at a batch size: everything that shapes its graphs and kernels."""

    batch: int
    input_hwc: tuple          # the convolution's per-sample input (H, W, C)
    filters: int
    kernel: tuple             # (kh, kw)
    stride: tuple
    pads: tuple               # top, bottom, left, right
    prologue: bool            # the input is an unwritten BN + ReLU output: relu(s*x + b) is applied on load
    role: str                 # what reads the BN's output (ROLES)
    relu: bool                # the BN ends in a ReLU
    dual: bool = False        # block_end whose shortcut is a projection BN
    input_grad: bool = True   # the convolution's input needs a gradient (not the network's data)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"site role {self.role!r} is not one of {ROLES}")

    @property
    def window(self):
        h, w, _ = self.input_hwc
        top, bottom, left, right = self.pads
        if (top, left) != (bottom, right):
            raise ValueError(f"asymmetric padding {self.pads} has no Conv2D padding argument")
        return resolve_window("site", (h, w), self.kernel, self.stride, (top, left))

    @property
    def output_hwc(self) -> tuple:
        return self.window.output_hw + (self.filters,)

    def describe(self) -> str:
        (h, w, c), (oh, ow, k) = self.input_hwc, self.output_hwc
        tags = ["pro" if self.prologue else "", self.role + ("+proj" if self.dual else ""),
                "" if self.input_grad else "no-dx"]
        return (f"{h}x{w}x{c}->{oh}x{ow}x{k} {self.kernel[0]}x{self.kernel[1]}/{self.stride[0]} "
                + " ".join(t for t in tags if t))


def _is_conv_reader(network, reader, source: str) -> bool:
    return isinstance(reader.layer, Conv2D) and reader.inputs == (source,)


def _role(network, bn_node) -> tuple[str, bool]:
    """(role, dual) of a BN node: what reads its output (see the module docstring)."""
    if bn_node.layer.residual:
        residual = bn_node.inputs[1]
        # A projection BN is dual-applied here; a previous block end's output is already written.
        source = None if residual == INPUT else _node(network, residual).layer
        dual = isinstance(source, BatchNorm2D) and not source.residual
        return "block_end", dual
    readers = network.readers(bn_node.name)
    if readers and all(_is_conv_reader(network, r, bn_node.name) for r in readers):
        return "conv_prologue", False
    if readers and all(r.layer.__class__ is BatchNorm2D and r.layer.residual and r.inputs[1] == bn_node.name
                       for r in readers):
        return "shortcut", False
    return "materialized", False


def _node(network, name: str):
    return next(n for n in network.nodes if n.name == name)


def conv_bn_sites(network, batch: int) -> list[tuple[str, ConvBnSite]]:
    """(convolution node name, site) for every convolution read by exactly one node, a BatchNorm2D, in order."""
    sites = []
    for node in network.nodes:
        if not isinstance(node.layer, Conv2D):
            continue
        readers = network.readers(node.name)
        if len(readers) != 1 or not isinstance(readers[0].layer, BatchNorm2D) or readers[0].inputs[0] != node.name:
            continue
        layer, bn = node.layer, readers[0]
        if layer.groups != 1 or layer.use_bias or layer.activation:
            raise ValueError(f"{node.name}: the fusion probe takes plain convolutions (no groups, bias or "
                             f"activation) under a BN; got groups={layer.groups}, bias={layer.use_bias}, "
                             f"activation={layer.activation}")
        (source,) = node.inputs
        in_shape = network.shapes[source]
        window = resolve_window(node.name, in_shape[:2], layer.kernel_size, layer.stride, layer.padding)
        prologue = (source != INPUT and isinstance(_node(network, source).layer, BatchNorm2D)
                    and _role(network, _node(network, source))[0] == "conv_prologue")
        if prologue and _node(network, source).layer.activation != "relu":
            raise ValueError(f"{node.name}: a prologue BN without ReLU is not a ResNet shape")
        role, dual = _role(network, bn)
        sites.append((node.name, ConvBnSite(batch, tuple(in_shape), layer.filters, window.kernel, window.stride,
                                            window.pads, prologue, role, bn.layer.activation == "relu", dual,
                                            source != INPUT)))
    return sites


def distinct_sites(sites) -> list[tuple[ConvBnSite, list[str]]]:
    """Sites de-duplicated by everything that shapes their graphs, first appearance first, with their nodes."""
    groups: dict[ConvBnSite, list[str]] = {}
    for name, site in sites:
        groups.setdefault(site, []).append(name)
    return list(groups.items())


# -- float64 references of the finalize and apply kernels (the GPU numerics check and the CPU test) --------


def bn_finalize_ref(ysum, ysqsum, count: int, gamma, beta, running_mean, running_var, eps: float,
                    momentum: float) -> dict:
    """Scale, bias, batch mean, inverse std and the next running statistics from a conv's genstats."""
    mean = ysum / count
    var = np.maximum(ysqsum / count - mean * mean, 0.0)
    inv_std = 1.0 / np.sqrt(var + eps)
    scale = gamma * inv_std
    return {"scale": scale, "bias": beta - mean * scale, "mean": mean, "inv_std": inv_std,
            "running_mean": (1 - momentum) * running_mean + momentum * mean,
            "running_var": (1 - momentum) * running_var + momentum * var * count / max(count - 1, 1)}


def dbn_coefficients_ref(dsum, dysum, count: int, mean, inv_std, gamma) -> dict:
    """dgamma, dbeta and dy = A dz + B y + C's per-channel A, B, C from sum dz and sum dz*y."""
    dbeta = dsum
    dgamma = inv_std * (dysum - mean * dsum)
    a = gamma * inv_std
    b = -a * inv_std * dgamma / count
    return {"dgamma": dgamma, "dbeta": dbeta, "A": a, "B": b, "C": -a * dbeta / count - b * mean}


def prologue_ref(x, scale, bias):
    """relu(s*x + b) over NHWC x: the BN + ReLU a prologue applies on load."""
    return np.maximum(x * scale + bias, 0.0)


# -- results: the per-step estimate and the tables ---------------------------------------------------------


def step_estimate(rows: list[dict]) -> dict:
    """Sum over sites of multiplicity x time, today vs fused, forward and backward, over the rows measured.

    A row is {"multiplicity": m, "us": {"F0": .., "F1": .., "B0": .., "B1": ..}} with None where a pass was not
    measured; each direction sums only the rows that measured both of its passes, and says how many convs.
    """
    out = {}
    for direction, today, fused in (("forward", "F0", "F1"), ("backward", "B0", "B1")):
        done = [r for r in rows if r["us"].get(today) is not None and r["us"].get(fused) is not None]
        out[direction] = {"convs": sum(r["multiplicity"] for r in done),
                          "today_us": sum(r["multiplicity"] * r["us"][today] for r in done),
                          "fused_us": sum(r["multiplicity"] * r["us"][fused] for r in done)}
    both = [r for r in rows if all(r["us"].get(p) is not None for p in PASSES)]
    today = sum(r["multiplicity"] * (r["us"]["F0"] + r["us"]["B0"]) for r in both)
    fused = sum(r["multiplicity"] * (r["us"]["F1"] + r["us"]["B1"]) for r in both)
    out["step"] = {"convs": sum(r["multiplicity"] for r in both), "today_us": today, "fused_us": fused,
                   "saved_us": today - fused, "today_over_fused": today / fused if fused else None}
    return out


def _us(value) -> str:
    return "-" if value is None else f"{value:8.1f}"


def format_table(precision: str, rows: list[dict], total_convs: int) -> str:
    """One line per site: shape, multiplicity, F0 vs F1 and B0 vs B1 (us), notes; then the step estimate."""
    head = f"{'site':44s} {'x':>2s} {'F0 us':>8s} {'F1 us':>8s} {'B0 us':>8s} {'B1 us':>8s}  notes"
    lines = [f"== {precision}", head, "-" * len(head)]
    for r in rows:
        us = r["us"]
        lines.append(f"{r['site']:44s} {r['multiplicity']:2d} {_us(us.get('F0'))} {_us(us.get('F1'))} "
                     f"{_us(us.get('B0'))} {_us(us.get('B1'))}  {'; '.join(r.get('notes', []))}")
    est = step_estimate(rows)
    for what in ("forward", "backward", "step"):
        e = est[what]
        ratio = f" ({e['today_us'] / e['fused_us']:.2f}x)" if e["fused_us"] else ""
        lines.append(f"{what:8s} over {e['convs']:2d} of {total_convs} convs: today {e['today_us'] / 1e3:7.3f} ms, "
                     f"fused {e['fused_us'] / 1e3:7.3f} ms{ratio}")
    return "\n".join(lines)
