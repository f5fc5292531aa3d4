"""PyTorch twin of the ResNet-50 v1.5 workload (workloads/resnet.py; seed note 002, docs/seeds.md).

Written out by hand, as the note's PyTorch program is, with the structure,
module names and parameter order of torchvision's `resnet50` (He et al. 2016,
"Deep Residual Learning", bottleneck version; v1.5: a downsampling block's
stride sits on its 3x3 convolution): `conv1` 7x7/2 -> `bn1` -> `relu` ->
`maxpool` 3x3/2 -> `layer1`..`layerN` of `Bottleneck`s (`conv1` 1x1, `conv2`
3x3 with the stride, `conv3` 1x1 to expansion x width, each under BatchNorm,
a `downsample` 1x1 conv + BN shortcut where the shape changes, residual add
then ReLU) -> `avgpool` -> `fc`. No convolution bias; BN eps 1e-5, momentum
0.1. `ResNetShape` sets the widths, depths and classes, so the CPU tier builds
a reduced one with the same names; its `block="basic"` builds torchvision's
`BasicBlock` (3x3 with the stride -> 3x3, each under BN, expansion 1) for
ResNet-18. Initialisation is torchvision's (He normal
fan-out for convolutions, BN scale 1 and shift 0, torch's default for `fc`),
drawn from a seeded generator.

The engine uses these parameter names too. Conv filters are KRSC (out, kh,
kw, in) in the engine and (out, in, kh, kw) in torch; every other parameter
(BN scale and shift, `fc` weight (classes, features) and bias) and the BN
running statistics have the same layout on both sides.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..workloads.resnet import BN_EPSILON, BN_MOMENTUM, LEARNING_RATE, SEED_SHAPE, ResNetShape
from .torch_common import TorchTrainRunner, host_array, to_nchw

_TO_TORCH, _TO_ENGINE = (0, 3, 1, 2), (0, 2, 3, 1)   # conv filter axes: KRSC <-> (out, in, kh, kw)
_RUNNING = ("running_mean", "running_var")            # the BN buffers both sides keep (not num_batches_tracked)


def _batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=BN_MOMENTUM)


def _projection(in_channels: int, out: int, stride: int) -> nn.Module | None:
    """torchvision's `downsample`: a 1x1 (strided) conv + BN where the block changes shape, else None."""
    if stride == 1 and in_channels == out:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), _batch_norm(out))


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride) -> 1x1 expand, each with BN; ReLU after the first two and after the residual add."""

    def __init__(self, in_channels: int, width: int, stride: int = 1, expansion: int = 4):
        super().__init__()
        out = width * expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = _batch_norm(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _batch_norm(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = _batch_norm(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _projection(in_channels, out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (N, C, H, W)
        shortcut = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + shortcut)


class BasicBlock(nn.Module):
    """3x3 (stride) -> 3x3, each with BN; ReLU after the first and after the residual add."""

    def __init__(self, in_channels: int, width: int, stride: int = 1, expansion: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _batch_norm(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = _batch_norm(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _projection(in_channels, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (N, C, H, W)
        shortcut = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + shortcut)


class TorchResNet(nn.Module):
    def __init__(self, shape: ResNetShape = SEED_SHAPE, seed: int = 0):
        super().__init__()
        self.shape = shape
        with torch.device("meta"):   # no default initialisation: it would draw from the global RNG
            self.conv1 = nn.Conv2d(shape.channels, shape.stem_width, 7, stride=2, padding=3, bias=False)
            self.bn1 = _batch_norm(shape.stem_width)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
            channels = shape.stem_width
            for stage, (width, blocks) in enumerate(zip(shape.widths, shape.blocks)):
                units = []
                for block in range(blocks):
                    unit = BasicBlock if shape.block == "basic" else Bottleneck
                    units.append(unit(channels, width, 2 if stage > 0 and block == 0 else 1, shape.expansion))
                    channels = width * shape.expansion
                self.add_module(f"layer{stage + 1}", nn.Sequential(*units))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(channels, shape.classes)
        self.to_empty(device="cpu")
        self._initialise(torch.Generator().manual_seed(seed))

    @torch.no_grad()
    def _initialise(self, generator: torch.Generator) -> None:
        """torchvision's initialisation, every draw from `generator`."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu", generator=generator)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
                module.reset_running_stats()
        # nn.Linear's own reset_parameters: He uniform with a = sqrt(5), bias uniform in +-1/sqrt(fan_in).
        nn.init.kaiming_uniform_(self.fc.weight, a=math.sqrt(5), generator=generator)
        bound = 1.0 / math.sqrt(self.fc.in_features)
        nn.init.uniform_(self.fc.bias, -bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # x (N, C, H, W) -> logits (N, classes)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in range(len(self.shape.blocks)):
            x = getattr(self, f"layer{stage + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _relayout(weights: Mapping, axes: tuple) -> dict[str, np.ndarray]:
    """Host copies of `weights` with every 4-D array (a conv filter; nothing else is 4-D) transposed by `axes`."""
    host = {name: host_array(value) for name, value in weights.items()}
    return {name: np.array(a.transpose(axes) if a.ndim == 4 else a, order="C") for name, a in host.items()}


def engine_to_torch(weights: Mapping) -> dict[str, np.ndarray]:
    """Engine-layout parameters or gradients (arrays or tensors) in torch's layouts, same names."""
    return _relayout(weights, _TO_TORCH)


def torch_to_engine(weights: Mapping) -> dict[str, np.ndarray]:
    """Torch-layout parameters or gradients (tensors or arrays) in the engine's layouts, same names."""
    return _relayout(weights, _TO_ENGINE)


def _check_names(expected, given, what: str) -> None:
    missing, unknown = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing or unknown:
        def listed(names):
            return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise KeyError(f"{what} must name exactly the model's {len(expected)} entries; missing: "
                       f"{listed(missing) or 'none'}; unknown: {listed(unknown) or 'none'}")


@torch.no_grad()
def _copy_checked(targets: Mapping[str, torch.Tensor], values: Mapping[str, np.ndarray], engine_shape) -> None:
    """Copy `values` (torch layout) into `targets` after checking every shape: all or nothing."""
    for name, value in values.items():
        if value.shape != tuple(targets[name].shape):
            raise ValueError(f"{name}: expected engine shape {engine_shape(targets[name])}, "
                             f"got {engine_shape(value)}")
    for name, value in values.items():
        targets[name].copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))


def _engine_shape(value) -> tuple:
    shape = tuple(value.shape)
    return tuple(shape[i] for i in _TO_ENGINE) if len(shape) == 4 else shape


def load_weights(model: TorchResNet, weights: Mapping) -> None:
    """Copy engine-layout parameters into the model; every name present, every shape exact, or nothing is copied."""
    params = dict(model.named_parameters())
    _check_names(params, weights, "weights")
    converted = engine_to_torch(weights)
    # The message gives shapes in the engine's layout, the one the caller passed.
    _copy_checked(params, converted, _engine_shape)


def _running_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: b for name, b in model.named_buffers() if name.rsplit(".", 1)[-1] in _RUNNING}


def buffers_of(model: nn.Module) -> dict[str, np.ndarray]:
    """The BN running means and variances ("layer1.0.bn1.running_mean", ...) as float32 host copies."""
    return {name: host_array(b).astype(np.float32) for name, b in _running_buffers(model).items()}


def load_buffers(model: nn.Module, buffers: Mapping) -> None:
    """Copy BN running statistics into the model; torch's `num_batches_tracked` entries, if given, are ignored."""
    running = _running_buffers(model)
    given = {k: v for k, v in buffers.items() if not k.endswith(".num_batches_tracked")}
    _check_names(running, given, "buffers")
    _copy_checked(running, {k: host_array(v) for k, v in given.items()}, lambda v: tuple(v.shape))


def build_model(shape: ResNetShape = SEED_SHAPE, weights: Mapping | None = None, buffers: Mapping | None = None,
                seed: int = 0) -> TorchResNet:
    model = TorchResNet(shape, seed)
    if weights is not None:
        load_weights(model, weights)
    if buffers is not None:
        load_buffers(model, buffers)
    return model


def resnet_train_runner(mode: str, x: np.ndarray, t: np.ndarray, batch_size: int, precision: str,
                        lr: float = LEARNING_RATE, device: str = "cuda", seed: int = 0,
                        shape: ResNetShape = SEED_SHAPE, weights: Mapping | None = None,
                        buffers: Mapping | None = None, channels_last: bool | None = None,
                        **runner_options) -> TorchTrainRunner:
    """Train on engine arrays x (n, H, W, C) and one-hot t (n, classes), resident on `device`; cross-entropy loss.

    `channels_last=None` takes each mode's layout: NCHW for torch_eager
    (the loop as written), channels-last for torch_compile and the graph modes (their
    fastest). `runner_options` go to TorchTrainRunner (compile_backend,
    compile_mode, warmup_steps, name, epochs_per_round).
    """
    if x.ndim != 4 or tuple(x.shape[1:]) != shape.image_shape or t.shape != (len(x), shape.classes):
        raise ValueError(f"x must be (n,) + {shape.image_shape} and t (n, {shape.classes}); got {x.shape}, {t.shape}")
    if channels_last is None:
        channels_last = mode != "torch_eager"
    # Cross-entropy against probability rows: the engine's one-hot float32 targets.
    return TorchTrainRunner(mode, build_model(shape, weights, buffers, seed), nn.functional.cross_entropy,
                            to_nchw(x), t.astype(np.float32, copy=False), batch_size, precision, lr, device, seed,
                            channels_last=channels_last, **runner_options)


def twin_train_runner(mode, x, t, batch, precision, *, lr, device, shape, weights, buffers):
    """The workload table's one signature of a twin's training runner (gpuengine/workloads/workload.py)."""
    return resnet_train_runner(mode, x, t, batch, precision, lr=lr, device=device, shape=shape, weights=weights,
                               buffers=buffers)


def twin_ddp_model(shape, x, t, weights, buffers):
    """(model, loss, channels_last, x as the model reads it) for PyTorch DDP from the engine's weights and
    batch-norm statistics: the workload table's one signature (bench/dp_worker.py)."""
    return build_model(shape, weights, buffers), torch.nn.functional.cross_entropy, True, to_nchw(x)
