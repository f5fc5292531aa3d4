"""vector_width: how many values a kernel thread moves in one access, on the CPU tier (addresses faked)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuengine.runtime.kernels import vector_width


def gpu_array(address: int, itemsize: int = 4):
    """What vector_width reads of a CuPy array: its address and item size."""
    return SimpleNamespace(data=SimpleNamespace(ptr=address), itemsize=itemsize)


@pytest.mark.parametrize("count,addresses,itemsize,widest,width", [
    (64, (256, 512), 4, 4, 4),     # aligned, divisible: a float4 a thread
    (6, (256,), 4, 4, 2),          # six channels: pairs
    (3, (256,), 4, 4, 1),          # three channels: one at a time
    (64, (256, 260), 4, 4, 1),     # one address 4 bytes past 16: scalar
    (64, (256, 264), 4, 4, 2),     # 8 bytes past: pairs still line up
    (64, (256, 272), 2, 8, 8),     # bf16: 16 bytes are eight values
    (64, (256, 258), 2, 8, 1),
    (64, (), 4, 4, 4),             # no arrays: the count alone decides (the kernel table's compile rows)
])
def test_width_divides_the_count_and_suits_every_address(count, addresses, itemsize, widest, width):
    arrays = [gpu_array(a, itemsize) for a in addresses]
    assert vector_width(count, *arrays, widest=widest) == width
