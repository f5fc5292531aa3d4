"""The one worker channel: Python objects between two processes over a pair of pipes, one frame each.

An A/B session drives its base and head workers through one
(gpuengine/gate/ab/sides.py and worker.py), and a data-parallel benchmark its
ranks (gpuengine/bench/dp_group.py and dp_worker.py). A frame is an 8-byte
length, then the object pickled; both ends run this file, so the format
is never negotiated. A receive waits with a deadline, in slices that let
the caller do something meanwhile (relay a worker's progress), and a pipe
closed by the other end is `ChannelClosed`, never a hang.

Only the standard library is imported: the A/B worker loads this file by its
path before a base checkout, which may predate it, goes onto sys.path.
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import time

HEADER = struct.Struct("!Q")   # a frame's length in bytes
PICKLE_PROTOCOL = 4            # readable by every Python a stack A/B's base may run
READ_CHUNK = 1 << 16


class ChannelClosed(EOFError):
    """The other end closed its pipe: it exited, crashed or was killed."""


class ChannelTimeout(TimeoutError):
    """Nothing whole arrived before the deadline."""


class Channel:
    """One end: frames are read from `read_fd` and written to `write_fd` (raw file descriptors, not closed here
    unless `close` is called)."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self._buffer = bytearray()

    def send(self, obj) -> None:
        """`obj` as one frame; BrokenPipeError when the other end is gone."""
        payload = pickle.dumps(obj, protocol=PICKLE_PROTOCOL)
        left = memoryview(HEADER.pack(len(payload)) + payload)
        while left:   # a large frame (a build spec with thousands of kept plan choices) takes several writes
            left = left[os.write(self.write_fd, left):]

    def ready(self) -> bool:
        """Whether a whole frame has arrived and waits to be taken."""
        if len(self._buffer) < HEADER.size:
            return False
        (length,) = HEADER.unpack_from(self._buffer)
        return len(self._buffer) >= HEADER.size + length

    def take(self):
        """The frame that `ready` says has arrived."""
        (length,) = HEADER.unpack_from(self._buffer)
        end = HEADER.size + length
        payload = bytes(self._buffer[HEADER.size:end])
        del self._buffer[:end]
        return pickle.loads(payload)

    def fill(self) -> None:
        """Whatever the pipe holds now (call when select says it is readable); ChannelClosed at its end."""
        chunk = os.read(self.read_fd, READ_CHUNK)
        if not chunk:
            raise ChannelClosed(f"the pipe (fd {self.read_fd}) was closed by the other end")
        self._buffer += chunk

    def receive(self, timeout_s: float | None = None, meanwhile=None, every_s: float = 1.0):
        """The next object; waits at most `timeout_s` (None: for ever), calling `meanwhile()` every `every_s`
        while it waits. ChannelTimeout past the deadline, ChannelClosed when the other end closed its pipe."""
        return receive_any({None: self}, timeout_s, meanwhile, every_s)[1]

    def close(self) -> None:
        for fd in {self.read_fd, self.write_fd}:
            try:
                os.close(fd)
            except OSError:
                pass


def receive_any(channels: dict, timeout_s: float | None, meanwhile=None, every_s: float = 1.0):
    """(key, object) from whichever of `channels` ({key: Channel}) has a whole frame first, those already
    arrived first in the dict's order; waits at most `timeout_s` (None: for ever), calling `meanwhile()` every
    `every_s` while nothing arrives. ChannelTimeout past the deadline; ChannelClosed carries the key of the
    channel that closed as its `key`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        for key, channel in channels.items():
            if channel.ready():
                return key, channel.take()
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise ChannelTimeout(f"nothing whole arrived in {timeout_s:g} s")
        by_fd = {channel.read_fd: key for key, channel in channels.items()}
        readable, _, _ = select.select(list(by_fd), [], [], every_s if left is None else min(left, every_s))
        for fd in readable:
            try:
                channels[by_fd[fd]].fill()
            except ChannelClosed as exc:
                exc.key = by_fd[fd]
                raise
        if not readable and meanwhile is not None:
            meanwhile()
