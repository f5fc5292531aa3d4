"""Device buffers allocated once, each booked under a category.

The engine allocates every buffer it will use before the first step; steady-
state steps allocate nothing. Booking each allocation under a category
(parameters, gradients, optimizer, activations, batch, workspace) gives the
footprint plan that memory tests compare with the measured pool peak.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "batch", "workspace")
# Room kept for what a set-up allocates after an optional buffer: the GEMMs planned later (cuBLASLt
# workspaces of up to 32 MiB each, ops/gemm.py) and small buffers.
RESERVE_BYTES = 64 << 20


class Allocator:
    """Allocates zero-filled buffers on a backend and keeps the byte count per category."""

    def __init__(self, backend):
        self.backend = backend
        self.bytes_by_category: dict[str, int] = defaultdict(int)
        self.booked_bytes = 0   # what libraries allocate at their first run: not in the pool yet at set-up

    def zeros(self, shape, dtype, category: str):
        if category not in CATEGORIES:
            raise ValueError(f"unknown memory category {category!r}; use one of {', '.join(CATEGORIES)}")
        dtype = np.dtype(dtype)
        with self.backend.activate():
            buf = self.backend.xp.zeros(shape, dtype=dtype)
        self.bytes_by_category[category] += int(buf.nbytes)
        return buf

    def table(self, rows: list[tuple[int, ...]]):
        """`rows` of integers (device addresses, counts) as an int64 workspace table on the device, for a kernel
        that reads its work from it (built outside capture)."""
        with self.backend.activate():
            table = self.zeros((len(rows), len(rows[0])), np.int64, "workspace")
            self.backend.upload(table, np.asarray(rows, np.int64))
        return table

    def book(self, nbytes: int, category: str):
        """Account for memory a library allocates on our behalf (e.g. a GEMM workspace)."""
        self.bytes_by_category[category] += int(nbytes)
        self.booked_bytes += int(nbytes)

    def fits(self, nbytes: int) -> bool:
        """Whether an optional buffer of `nbytes` leaves room for the rest of the set-up: what is booked but not
        allocated yet, and RESERVE_BYTES for what is built after it (always, where the backend knows no limit)."""
        room = self.backend.memory_room()
        return room is None or int(nbytes) + max(0, self.booked_bytes) + RESERVE_BYTES <= room

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_category.values())

    def report(self) -> dict[str, int]:
        return {c: self.bytes_by_category.get(c, 0) for c in CATEGORIES} | {"total": self.total_bytes}


def merge_reports(*reports: dict[str, int]) -> dict[str, int]:
    """The sum of several allocators' reports (e.g. a predictor's weights and its workspace's buffers)."""
    merged = {c: sum(r.get(c, 0) for r in reports) for c in CATEGORIES}
    return merged | {"total": sum(merged.values())}
