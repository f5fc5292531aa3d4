"""Uncompressed BMP images and class folders of them (seed notes 001/002: MNIST and CIFAR as BMPs).

The format (Microsoft's "Bitmap Storage" / BITMAPINFOHEADER docs), parsed with
struct, no PIL: a 14-byte file header ("BM", file size, reserved, offset of
the pixels), a DIB header of at least 40 bytes (width, height -- negative for
top-down rows --, planes = 1, bits per pixel, compression = 0 for BI_RGB, ...,
palette size), for 8-bit images a palette of BGRA entries, then rows padded to
a multiple of 4 bytes, bottom-up unless the height is negative. Read: 8-bit
palette images and 24-bit BGR. Anything else -- another depth, compression, a
truncated or missing file, a pixel offset that points into the headers, a size
other than the data set's, colour in a grayscale set, an empty class folder --
is a DataError naming the file, and nothing is returned: a folder loads
completely or not at all. The arguments (channels, the image shape) are checked
before any file is read.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ... import checks
from ..checks import DataError
from ..labels import training_arrays

_FILE_HEADER = struct.Struct("<2sIHHI")
_INFO_HEADER = struct.Struct("<IiiHHIIiiII")
_LUMA = np.array([0.299, 0.587, 0.114])   # ITU-R BT.601, for grayscale palettes that are not exactly gray
CHANNELS = (1, 3)   # gray or RGB


def _row_bytes(width: int, bits: int) -> int:
    return (width * bits // 8 + 3) // 4 * 4


def read_bmp(path, channels: int = 1) -> np.ndarray:
    """uint8 (H, W, channels) pixels of an 8- or 24-bit uncompressed BMP; channels 1 (gray) or 3 (RGB)."""
    checks.choice("channels", channels, CHANNELS, "1 for gray, 3 for RGB", DataError)
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; expected an uncompressed 8- or 24-bit BMP image") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read the BMP image: {exc}") from exc
    if len(data) < _FILE_HEADER.size + _INFO_HEADER.size:
        raise DataError(f"{path}: {len(data)} bytes is too short for a BMP header (truncated?)")
    magic, _, _, _, offset = _FILE_HEADER.unpack_from(data, 0)
    header_size, width, height, planes, bits, compression, _, _, _, palette_size, _ = \
        _INFO_HEADER.unpack_from(data, _FILE_HEADER.size)
    if magic != b"BM" or header_size < _INFO_HEADER.size or planes != 1:
        raise DataError(f"{path}: not a Windows BMP (magic {magic!r}, header {header_size} bytes, planes {planes})")
    if bits not in (8, 24):
        raise DataError(f"{path}: {bits}-bit BMP; only 8-bit (palette) and 24-bit images are read")
    if compression != 0:
        raise DataError(f"{path}: compressed BMP (compression type {compression}); only uncompressed is read")
    headers_end = _FILE_HEADER.size + header_size
    if offset < headers_end:   # pixels read from there would be the headers themselves: garbage, silently
        raise DataError(f"{path}: pixel data offset {offset} points into the headers; expected an offset >= "
                        f"{headers_end}, where they end (a damaged file?)")
    rows, stride = abs(height), _row_bytes(width, bits)
    if width < 1 or rows < 1 or offset + rows * stride > len(data):
        raise DataError(f"{path}: {width}x{rows} pixels need {offset + rows * stride} bytes, the file has "
                        f"{len(data)} (truncated?)")
    pixels = np.frombuffer(data, np.uint8, rows * stride, offset).reshape(rows, stride)
    if height > 0:
        pixels = pixels[::-1]   # bottom-up rows
    if bits == 8:
        entries = palette_size or 256
        palette_at = headers_end
        if palette_at + 4 * entries > offset:
            raise DataError(f"{path}: a palette of {entries} colours does not fit before the pixels")
        palette = np.frombuffer(data, np.uint8, 4 * entries, palette_at).reshape(entries, 4)[:, 2::-1]
        index = pixels[:, :width]
        if int(index.max()) >= entries:
            raise DataError(f"{path}: pixel index {int(index.max())} is beyond the {entries}-colour palette")
        rgb = palette[index]
    else:
        rgb = pixels[:, :3 * width].reshape(rows, width, 3)[:, :, ::-1]
    if channels == 3:
        return np.ascontiguousarray(rgb)
    if not ((rgb[..., 0] == rgb[..., 1]) & (rgb[..., 1] == rgb[..., 2])).all():
        raise DataError(f"{path}: the image has colour, but the data set is grayscale (1 channel)")
    return np.ascontiguousarray(rgb[..., :1])


def write_bmp(path, image: np.ndarray):
    """Write uint8 (H, W) or (H, W, 1) as an 8-bit gray-palette BMP, (H, W, 3) RGB as 24-bit."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
        raise ValueError(f"write_bmp takes uint8 (H, W), (H, W, 1) or (H, W, 3), got {image.dtype} {image.shape}")
    rgb = image.ndim == 3 and image.shape[2] == 3
    height, width = image.shape[:2]
    bits = 24 if rgb else 8
    stride = _row_bytes(width, bits)
    body = np.zeros((height, stride), np.uint8)
    body[:, :width * bits // 8] = (image[:, :, ::-1] if rgb else image.reshape(height, width)).reshape(height, -1)
    palette = b"" if rgb else np.repeat(np.arange(256, dtype=np.uint8), 4).reshape(256, 4).tobytes()
    offset = _FILE_HEADER.size + _INFO_HEADER.size + len(palette)
    header = _FILE_HEADER.pack(b"BM", offset + body.nbytes, 0, 0, offset)
    info = _INFO_HEADER.pack(_INFO_HEADER.size, width, height, 1, bits, 0, body.nbytes, 2835, 2835,
                             0 if rgb else 256, 0)
    Path(path).write_bytes(header + info + palette + body[::-1].tobytes())


def load_bmp_folder(root, image_shape: tuple) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A folder of class subfolders of BMPs: (x float32 (n, H, W, C) in [0, 1], t one-hot, class names).

    Classes are the subfolders sorted by name, or by number when every name is a
    whole number (so folder "10" is label 10, not 2); each must hold at least one
    .bmp, and every image must be `image_shape` = (H, W, C) with C 1 or 3.
    """
    image_shape = checks.shape("image_shape", image_shape, 3, DataError)
    if image_shape[2] not in CHANNELS:
        checks.refuse("image_shape", image_shape, "(height, width, channels) with channels 1 (gray) or 3 (RGB)",
                      DataError)
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such folder of class subfolders")
    folders = [p for p in root.iterdir() if p.is_dir()]
    numbered = all(p.name.isdecimal() for p in folders)
    classes = sorted(folders, key=(lambda p: (int(p.name), p.name)) if numbered else None)
    if not classes:
        raise DataError(f"{root}: no class subfolders (expected one folder of .bmp files per class)")
    images, labels = [], []
    for label, folder in enumerate(classes):
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".bmp")
        if not files:
            raise DataError(f"{folder}: empty class folder (no .bmp files)")
        for file in files:
            image = read_bmp(file, image_shape[2])
            if image.shape != image_shape:
                raise DataError(f"{file}: image is {image.shape[1]}x{image.shape[0]} pixels, the data set's "
                                f"images are {image_shape[1]}x{image_shape[0]}")
            images.append(image)
            labels.append(label)
    x, t = training_arrays(np.stack(images), np.array(labels), len(classes), str(root))
    return x, t, [folder.name for folder in classes]
