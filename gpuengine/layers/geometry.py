"""Sliding-window geometry of convolution and pooling on NHWC maps, and its NumPy helpers.

Padding is one of
- "valid": none;
- "same": TensorFlow's rule (tf.nn.convolution docs): output = ceil(input / stride),
  total padding max((output - 1) * stride + kernel - input, 0), the odd pixel at
  the bottom/right; for stride 1 and odd kernels this is torch's padding="same";
- pixels, an int or (rows, cols): symmetric, torch's `padding=p`.
A window larger than the input is accepted whenever the padding makes the
output at least one pixel (seed note 002: ResNet's 3x3 convolutions on 2x2
maps). The NumPy helpers view a padded batch as its windows (im2col without a
copy) and add window gradients back onto the input (col2im).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def pair(what: str, value) -> tuple[int, int]:
    """(rows, cols) from an int or a pair of ints, each >= 1."""
    values = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
                                   for v in values):
        raise ValueError(f"{what} must be a whole number >= 1 or a pair of them, got {value!r}")
    return int(values[0]), int(values[1])


@dataclass(frozen=True)
class Window:
    """A kernel sliding over an (H, W) map: sizes, strides and per-side padding."""

    input_hw: tuple[int, int]
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]   # top, bottom, left, right

    @property
    def output_hw(self) -> tuple[int, int]:
        (h, w), (kh, kw), (sh, sw) = self.input_hw, self.kernel, self.stride
        top, bottom, left, right = self.pads
        return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1

    @property
    def pre_padding(self) -> list[int]:
        return [self.pads[0], self.pads[2]]

    @property
    def post_padding(self) -> list[int]:
        return [self.pads[1], self.pads[3]]


def _same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def resolve_window(what: str, input_hw, kernel, stride, padding) -> Window:
    """The window of `kernel`/`stride`/`padding` over `input_hw`; a ValueError naming `what` if it has no output."""
    kernel, stride = pair(f"{what}: kernel size", kernel), pair(f"{what}: stride", stride)
    h, w = input_hw
    if padding == "valid":
        pads = (0, 0, 0, 0)
    elif padding == "same":
        pads = _same_pads(h, kernel[0], stride[0]) + _same_pads(w, kernel[1], stride[1])
    else:
        values = (padding, padding) if isinstance(padding, (int, np.integer)) else tuple(padding)
        if len(values) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
                                       for v in values):
            raise ValueError(f"{what}: padding must be 'valid', 'same', or pixels >= 0 (an int or a pair), "
                             f"got {padding!r}")
        pads = (int(values[0]), int(values[0]), int(values[1]), int(values[1]))
    window = Window((int(h), int(w)), kernel, stride, pads)
    out_h, out_w = window.output_hw
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{what}: a {kernel[0]}x{kernel[1]} window with padding {padding!r} does not fit a "
                         f"{h}x{w} input (output {out_h}x{out_w}); pad it or use a smaller window")
    return window


def pad(x: np.ndarray, window: Window, value: float = 0.0) -> np.ndarray:
    """x (N, H, W, C) padded on each side as the window asks."""
    top, bottom, left, right = window.pads
    return np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)


def windows(x_padded: np.ndarray, window: Window) -> np.ndarray:
    """A read-only view (N, Ho, Wo, kh, kw, C) of every window of a padded batch."""
    (sh, sw), (out_h, out_w) = window.stride, window.output_hw
    view = sliding_window_view(x_padded, window.kernel, axis=(1, 2))   # (N, H', W', C, kh, kw)
    return view[:, ::sh, ::sw][:, :out_h, :out_w].transpose(0, 1, 2, 4, 5, 3)


def add_windows(grad: np.ndarray, window: Window) -> np.ndarray:
    """Sum window gradients (N, Ho, Wo, kh, kw, C) back onto the unpadded input (N, H, W, C)."""
    n, out_h, out_w, kh, kw, c = grad.shape
    (h, w), (sh, sw) = window.input_hw, window.stride
    top, bottom, left, right = window.pads
    padded = np.zeros((n, h + top + bottom, w + left + right, c), grad.dtype)
    for i in range(kh):
        for j in range(kw):
            padded[:, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw, :] += grad[:, :, :, i, j, :]
    return padded[:, top:top + h, left:left + w, :]
