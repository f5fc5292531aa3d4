"""Work a training program's backward layers hand over as it is built, done by one launch after the backward pass.

The bf16 weight gradients' widening (widen.py) and the column sums' finish
(partial_sums.py) each collect their work from the layers while the program
builds them, then do all of it in one launch over a table of device addresses
(`run`). Data parallel sends each backward step's gradients as soon as that
step has written them, so there a step's share is done by a launch of its own
right after it (`run_step`).
"""
from __future__ import annotations


class StepLaunches:
    """A training program's collected items, done by a launch of `threads`-thread blocks over an int64 table:
    a subclass makes a launch of its items (`_launch`) and does one on the NumPy backend (`_on_host`)."""

    threads = 256
    unbuilt = "runs once built"   # the errors' words, a subclass's own
    late = "added after the launch was built"

    def __init__(self, backend, allocator):
        self.backend, self.allocator = backend, allocator
        self.step = 0   # the backward step whose layer is being built: the program sets it
        self._items: list[tuple[int, tuple]] = []   # (backward step, item)
        self._launches: dict | None = None   # None (every item) or a backward step -> (kernel, grid, table)

    def _add(self, items: list[tuple]):
        if self._launches is not None:
            raise RuntimeError(self.late)
        self._items += [(self.step, item) for item in items]

    def __len__(self):
        return len(self._items)

    def build(self):
        """The launches' tables, on the device once every item is in (outside capture)."""
        self._launches = {}
        if not self.backend.is_gpu or not self._items:
            return
        for step in [None] + sorted({s for s, _ in self._items}):
            self._launches[step] = self._launch([item for s, item in self._items if step is None or s == step])

    def run(self):
        """Every item (after the whole backward pass)."""
        self._run(None)

    def run_step(self, step: int):
        """The items of backward step `step` (after that step, before its gradients are sent)."""
        self._run(step)

    def _run(self, step):
        if self._launches is None:
            raise RuntimeError(self.unbuilt)
        if not self.backend.is_gpu:
            for s, item in self._items:
                if step is None or s == step:
                    self._on_host(*item)
            return
        if step in self._launches:
            kernel, grid, table = self._launches[step]
            kernel(grid, (self.threads,), (table,))

    def _launch(self, items: list[tuple]) -> tuple:
        """(kernel, grid, table) doing `items`."""
        raise NotImplementedError

    def _on_host(self, *item):
        raise NotImplementedError
