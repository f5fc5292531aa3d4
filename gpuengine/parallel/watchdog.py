"""A stall limit on each stage of a data-parallel rank: past it, the rank names where every rank is and exits.

An all-reduce inside a captured graph waits for its peers without a limit, so
a rank's main thread can sit in a device wait forever. Each rank announces its
stages (set-up, each epoch, the end) in the rendezvous store; a timer thread,
on a store connection of its own (the main thread's may be blocked in a read),
fires when a stage outlasts the limit: it prints the stage, the last stage
each rank announced (those behind it are the ranks not heard from) and every
thread's stack, and ends the process with status 1, after which the launcher
stops the other ranks. faulthandler's watchdog, which needs no GIL, stays armed
a little longer, in case the main thread holds the GIL while it waits.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
from datetime import timedelta

from .group import ProcessGroup

BACKSTOP_S = 30.0   # faulthandler's dump and exit, after the timer thread had its chance
READ_S = 5.0        # the timer thread's reads of the other ranks' stages


class StallWatch:
    def __init__(self, group: ProcessGroup, limit_s: float, store=None):
        """store: where the stages are announced; by default a connection of its own to the rendezvous store (rank 0
        must already host it: build the watch after the Rendezvous)."""
        if not limit_s > 0:
            raise ValueError(f"the stall limit must be > 0 seconds, got {limit_s}")
        self.group, self.limit_s = group, limit_s
        if store is None:
            from torch.distributed import TCPStore
            store = TCPStore(group.master_addr, group.master_port, None, False, timeout=timedelta(seconds=READ_S),
                             wait_for_workers=False)
        self._store = store
        self._timer: threading.Timer | None = None
        self._index = 0

    def _key(self, rank: int) -> str:
        return f"stage/{rank}"

    def stage(self, name: str):
        """A new stage begins: announce it, and give it the whole limit afresh."""
        self._cancel()
        self._index += 1
        self._store.set(self._key(self.group.rank), json.dumps([self._index, name]))
        self._timer = threading.Timer(self.limit_s, self._expired, args=(self._index, name))
        self._timer.daemon = True
        self._timer.start()
        faulthandler.dump_traceback_later(self.limit_s + BACKSTOP_S, exit=True)

    def stop(self):
        """The last stage ended: no limit from here on."""
        self._cancel()
        faulthandler.cancel_dump_traceback_later()

    def _cancel(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def where(self) -> dict[int, tuple[int, str] | None]:
        """Each rank's last announced stage (index, name); None where it never announced one or is unreachable."""
        found: dict[int, tuple[int, str] | None] = {}
        for rank in range(self.group.world_size):
            try:
                key = self._key(rank)
                found[rank] = tuple(json.loads(self._store.get(key))) if self._store.check([key]) else None
            except Exception:   # rank 0's store is gone with it: nothing more to learn
                found[rank] = None
        return found

    def report(self, index: int, name: str) -> str:
        """What a rank past its limit says: its stage, and where every rank last said it was."""
        me = self.group.rank
        lines = [f"gpuengine data parallel: rank {me} spent more than {self.limit_s:g} s in stage {name!r}: a wait "
                 "on a peer (a collective) or on the device that never ended"]
        for rank, seen in self.where().items():
            if rank == me:
                continue
            if seen is None:
                lines.append(f"  rank {rank}: not heard from (no stage announced, or the store is gone)")
            else:
                where = "behind: not heard from in this stage" if seen[0] < index else \
                    "in the same stage" if seen[0] == index else "ahead"
                lines.append(f"  rank {rank}: last announced stage {seen[1]!r} ({where})")
        return "\n".join(lines)

    def _expired(self, index: int, name: str):
        try:
            text = self.report(index, name)
        except Exception as exc:   # say the stall even when the report cannot be made
            text = f"gpuengine data parallel: rank {self.group.rank} stalled in stage {name!r} ({exc})"
        sys.stderr.write(text + "\nThe rank's threads:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
        os._exit(1)
