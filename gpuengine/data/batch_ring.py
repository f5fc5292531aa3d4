"""The streamed loader's ring: worker threads gather each batch into a host slot and upload it.

Gathering on the Python thread between launches held the streamed
loader to ~2 GB/s where pinned copies do tens of GB/s. Here the Python thread
only hands out steps and orders streams; the gather runs in worker threads
(NumPy's take releases the GIL), each step split into shares, and the share's
upload is queued as soon as its rows are in (uploads.py). The life of slot
k = s mod pool, for step s:

  1. `release` of step s - pool hands step s out: one task per share;
  2. a worker waits until the slot's previous upload left the host slot, gathers
     its rows of step s there and queues their upload (after the compute
     stream's `consumed` event of step s - pool, on the device);
  3. the worker finishing the step's last share records the slot's `copied` event;
  4. `acquire` before the launch that reads step s waits (on the host) until the
     worker has queued it, then makes the compute stream wait on `copied`;
  5. `release` after that launch records `consumed` and hands out step s + pool.

A worker's exception stops the hand-out; the steps before the failed one are
still delivered, and the `acquire` that needs the failed step raises a
`LoaderError` naming the step and rows, with the exception as its cause, after
stopping the workers.
`close()` stops and joins the workers (threads start at the first `acquire`).
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
from typing import Callable

import numpy as np

from .. import checks
from .checks import DataError

MAX_DEFAULT_WORKERS = 8
MIN_ROWS_PER_SHARE = 64   # a smaller share costs more in hand-off than splitting the gather saves
_ring_ids = itertools.count()


class LoaderError(RuntimeError):
    """The streamed loader cannot deliver a batch; `__cause__` is a worker's exception where there was one."""


def default_workers() -> int:
    """Loader threads when none are asked for: one per core, up to MAX_DEFAULT_WORKERS."""
    return max(1, min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1))


def check_whole(name: str, value, minimum: int = 1) -> int:
    """The loader's sizes: the shared whole-number check, raising the data's own error."""
    return checks.whole(name, value, minimum, error=DataError)


def shares(batch: int, workers: int) -> list[tuple[int, int]]:
    """The row ranges one step's gather is split into: up to one per worker, none under MIN_ROWS_PER_SHARE."""
    count = max(1, min(workers, batch // MIN_ROWS_PER_SHARE))
    bounds = [batch * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class BatchRing:
    """`pool` slots filled by `workers` threads with the rows `rows(step=, lo=, hi=)` of each step."""

    def __init__(self, uploads, rows: Callable[..., np.ndarray], src_x: np.ndarray, src_t: np.ndarray,
                 batch: int, pool: int, workers: int):
        self.uploads, self.rows, self.src_x, self.src_t = uploads, rows, src_x, src_t
        self.batch = check_whole("batch", batch)
        self.pool = check_whole("batch_pool", pool)
        self.workers = check_whole("loader_workers", workers)
        self.shares = shares(batch, workers)
        self.name = f"gpuengine-loader-{next(_ring_ids)}"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._slot_step: list[int | None] = [None] * pool   # the step each slot holds or is being filled with
        self._pending = [0] * pool                            # its shares not yet uploaded
        self._failure: tuple | None = None                    # (step, lo, hi, exception) of the first failure
        self._next = 0            # the next step to hand out
        self._released = -1       # the last step whose launch has read its slot
        self._horizon: int | None = None   # the last step handed out ahead of need (None: no limit)
        self._closed = False

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def acquire(self, first: int, steps: int):
        """Before a launch of steps first..first+steps-1: each step's batch queued for upload, the compute
        stream ordered after it. Waits on the workers (never on the device) while a batch is not in yet."""
        if not 1 <= steps <= self.pool:
            raise DataError(f"a launch of {steps} steps cannot read from a ring of {self.pool} slots")
        last = first + steps - 1
        with self._lock:
            if first != self._released + 1:
                self._restart(first)
            self._hand_out(self._released + self.pool, needed=last)
            for step in range(first, first + steps):
                slot = step % self.pool
                while self._serves(last) and not (self._slot_step[slot] == step and self._pending[slot] == 0):
                    self._changed.wait()
        self._raise_unless_serving(last)
        for step in range(first, first + steps):
            self.uploads.compute_waits(step % self.pool)

    def release(self, first: int, steps: int):
        """After the launch of steps first..first+steps-1: their slots free once the compute stream is past
        the launch; the steps that reuse them handed out."""
        for step in range(first, first + steps):
            self.uploads.mark_consumed(step % self.pool)
        with self._lock:
            if self._closed:
                return
            self._released = first + steps - 1
            self._hand_out(self._released + self.pool)

    def prefetch_until(self, step: int | None):
        """Hand out no step past `step` before a launch needs it (None: no limit). A benchmark sets it to the
        end of each timed round, so no batch of the next round is gathered or uploaded between rounds."""
        with self._lock:
            self._horizon = step
            self._hand_out(self._released + self.pool)

    def close(self):
        """Stop the workers and wait for them and for any upload still in flight. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._changed.notify_all()
            threads = list(self._threads)
        for _ in threads:
            self._tasks.put(None)
        for thread in threads:
            if thread is not threading.current_thread():   # a finaliser may run on a worker thread
                thread.join()
        self.uploads.drain()

    # -- under the lock -----------------------------------------------------------------

    def _serves(self, step: int) -> bool:
        """Open, and no worker failed on this step or an earlier one."""
        return not self._closed and (self._failure is None or self._failure[0] > step)

    def _restart(self, first: int):
        """A launch out of sequence: let handed-out shares finish, then hand out from `first`."""
        while not self._closed and any(self._pending):
            self._changed.wait()
        self._slot_step = [None] * self.pool
        self._next, self._released = first, first - 1

    def _hand_out(self, last: int, needed: int = -1):
        """Hand out the steps up to `last`, but none past the prefetch horizon unless the launch needs it."""
        if self._closed or self._failure is not None:
            return
        if self._horizon is not None:
            last = min(last, max(self._horizon, needed))
        if not self._threads:
            self._start_workers()
        while self._next <= last:
            step, slot = self._next, self._next % self.pool
            self._slot_step[slot], self._pending[slot] = step, len(self.shares)
            for lo, hi in self.shares:
                self._tasks.put((step, slot, lo, hi))
            self._next += 1

    def _start_workers(self):
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    # -- outside the lock -----------------------------------------------------------------

    def _raise_unless_serving(self, step: int):
        with self._lock:
            failure, closed = self._failure, self._closed
        if failure is not None and failure[0] <= step:
            self.close()
            step, lo, hi, error = failure
            raise LoaderError(f"{self.name}: a worker failed gathering step {step} (batch rows {lo}..{hi - 1}): "
                              f"{type(error).__name__}: {error}") from error
        if closed:
            raise LoaderError(f"{self.name} is closed: it delivers no more batches")

    def _work(self):
        try:
            self.uploads.start_worker()
        except Exception as error:   # no device for this thread: every task it takes fails with the cause
            start_error = error
        else:
            start_error = None
        while True:
            task = self._tasks.get()
            if task is None:
                return
            step, slot, lo, hi = task
            error = start_error
            if error is None and self._serves(step):
                try:
                    self._fill(step, slot, lo, hi)
                except Exception as caught:
                    error = caught
            with self._lock:
                if error is not None and (self._failure is None or step < self._failure[0]):
                    self._failure = (step, lo, hi, error)
                self._pending[slot] -= 1
                if self._pending[slot] == 0 and self._serves(step):
                    self.uploads.mark_uploaded(slot)
                self._changed.notify_all()

    def _fill(self, step: int, slot: int, lo: int, hi: int):
        self.uploads.wait_host_slot_free(slot)
        rows = self.rows(step=step, lo=lo, hi=hi)
        if len(rows) and not 0 <= rows.min() <= rows.max() < len(self.src_x):
            raise IndexError(f"rows {rows.min()}..{rows.max()} are outside the data set's {len(self.src_x)}")
        part = slice(slot * self.batch + lo, slot * self.batch + hi)
        # mode="clip" once the rows are checked: the default "raise" gathers into a fresh temporary before
        # copying to `out`, page faults that serialised the workers (1.1 GB/s on an H100 host).
        np.take(self.src_x, rows, axis=0, out=self.uploads.host_x[part], mode="clip")   # releases the GIL
        np.take(self.src_t, rows, axis=0, out=self.uploads.host_t[part], mode="clip")
        self.uploads.upload(slot, lo, hi)
