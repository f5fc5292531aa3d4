"""The worker channel (gpuengine/bench/channel.py): whole objects across pipes, deadlines, and a closed end named."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from gpuengine.bench.channel import Channel, ChannelClosed, ChannelTimeout, receive_any


@pytest.fixture
def pair():
    """Two ends of one channel: a's frames reach b and b's reach a."""
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    a, b = Channel(a_read, a_write), Channel(b_read, b_write)
    yield a, b
    a.close()
    b.close()


def test_objects_cross_whole_in_order_however_large(pair):
    a, b = pair
    big = {f"('conv_fprop', {i})": "x" * 150 for i in range(4000)}   # far more than a pipe's buffer
    sent = [("build", (big,)), {"op": "round"}, np.arange(12.0).reshape(3, 4), None]
    writer = threading.Thread(target=lambda: [a.send(obj) for obj in sent])
    writer.start()
    got = [b.receive(timeout_s=10) for _ in sent]
    writer.join()
    assert got[0] == sent[0] and got[1] == sent[1] and got[3] is None
    np.testing.assert_array_equal(got[2], sent[2])


def test_a_wait_calls_back_meanwhile_and_ends_at_its_deadline(pair):
    _, b = pair
    calls = []
    start = time.monotonic()
    with pytest.raises(ChannelTimeout, match="nothing whole arrived in 0.3 s"):
        b.receive(timeout_s=0.3, meanwhile=lambda: calls.append(time.monotonic()), every_s=0.05)
    assert 0.3 <= time.monotonic() - start < 2.0
    assert len(calls) >= 3


def test_a_half_arrived_frame_waits_for_the_rest(pair):
    a, b = pair
    os.write(a.write_fd, b"\x00\x00\x00\x00\x00\x00\x00\x10abc")   # a header promising 16 bytes, then 3
    with pytest.raises(ChannelTimeout):
        b.receive(timeout_s=0.2)
    assert not b.ready()


def test_a_closed_end_is_channel_closed_not_a_hang(pair):
    a, b = pair
    os.close(a.write_fd)
    with pytest.raises(ChannelClosed, match="closed by the other end"):
        b.receive(timeout_s=10)


def test_receive_any_takes_what_arrived_and_names_the_end_that_closed():
    ends = {}
    for rank in (0, 1):
        read, write = os.pipe()
        ends[rank] = (Channel(read, write), write)
    try:
        ends[1][0].send({"rank": 1})   # each end writes into its own pipe: the frame comes back to it
        assert receive_any({r: c for r, (c, _) in ends.items()}, timeout_s=5) == (1, {"rank": 1})
        with pytest.raises(ChannelTimeout):
            receive_any({r: c for r, (c, _) in ends.items()}, timeout_s=0.2)
        os.close(ends[0][1])
        with pytest.raises(ChannelClosed) as closed:
            receive_any({r: c for r, (c, _) in ends.items()}, timeout_s=5)
        assert closed.value.key == 0
    finally:
        for channel, _ in ends.values():
            channel.close()
