"""The rendezvous: byte blobs exchanged between ranks through a TCP key-value store on MASTER_ADDR:MASTER_PORT.

Rank 0 hosts PyTorch's `torch.distributed.TCPStore` (the store torchrun and
`init_process_group` use); every rank is a client. It carries the NCCL unique
id on a GPU, the start-up configuration check, and on the CPU tier the
stand-in all-reduce's data. Every wait has a timeout, so a rank that died
turns into an error naming the ranks not heard from, not a hang. torch is
imported here only: a single-process engine never needs it.
"""
from __future__ import annotations

import atexit
import json
from datetime import timedelta

from ..config import ConfigError
from .group import ProcessGroup

DEFAULT_TIMEOUT_S = 60.0


class RendezvousError(RuntimeError):
    """A rank was not heard from within the timeout, or the ranks disagree."""


class Rendezvous:
    def __init__(self, group: ProcessGroup, timeout_s: float = DEFAULT_TIMEOUT_S):
        from torch.distributed import TCPStore
        self.group, self.timeout_s = group, timeout_s
        try:
            self.store = TCPStore(group.master_addr, group.master_port, group.world_size, group.is_root,
                                  timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        except Exception as exc:   # port taken (rank 0), or no store came up there within the timeout
            role = "host" if group.is_root else "reach"
            raise RendezvousError(f"rank {group.rank} could not {role} the rendezvous store at MASTER_ADDR:"
                                  f"MASTER_PORT={group.master_addr}:{group.master_port} ({exc})") from None
        self._round = 0
        self._closed = False
        atexit.register(self.close)   # rank 0 hosts the store: it must outlive every rank's last read

    def _key(self, name: str, round_: int, rank: int) -> str:
        return f"{name}/{round_}/{rank}"

    def _get(self, key: str, rank: int) -> bytes:
        try:
            return self.store.get(key)
        except Exception as exc:   # the store raises DistStoreError (a RuntimeError) on timeout or a lost master
            self._closed = True   # a peer is gone: nobody is left to wait for at exit
            raise RendezvousError(f"rank {self.group.rank}: no word from rank {rank} within {self.timeout_s:g} s "
                                  f"({key}): it died, raised, or never started ({exc})") from None

    def all_gather(self, name: str, blob: bytes) -> list[bytes]:
        """Every rank's blob, in rank order. A rank's key of two rounds back is deleted: every rank has read it,
        since reaching this round needed everyone's blob of the last one."""
        round_, me = self._round, self.group.rank
        self._round += 1
        self.store.set(self._key(name, round_, me), blob)
        blobs = [blob if r == me else self._get(self._key(name, round_, r), r) for r in range(self.group.world_size)]
        if round_ >= 2:
            self.store.delete_key(self._key(name, round_ - 2, me))
        return blobs

    def broadcast(self, name: str, blob: bytes | None) -> bytes:
        """Rank 0's blob on every rank (the others pass None)."""
        round_ = self._round
        self._round += 1
        key = self._key(name, round_, 0)
        if self.group.is_root:
            if blob is None:
                raise ValueError("rank 0 must give the blob it broadcasts")
            self.store.set(key, blob)
            return blob
        return self._get(key, 0)

    def close(self):
        """Say this rank is done with the store; rank 0 (its host) waits for every rank before going."""
        if self._closed:
            return
        self._closed = True
        self.store.set(f"closed/{self.group.rank}", b"1")
        if self.group.is_root:
            for rank in range(1, self.group.world_size):
                self._get(f"closed/{rank}", rank)

    def check_same_config(self, fingerprint: dict):
        """Refuse to start unless every rank describes the same run: a mismatch names the rank and the field."""
        mine = json.loads(json.dumps(fingerprint, sort_keys=True))   # what the other ranks will see of it
        theirs = [json.loads(b) for b in self.all_gather("config", json.dumps(mine, sort_keys=True).encode())]
        for rank, other in enumerate(theirs):
            for field in sorted(set(mine) | set(theirs[0]) | set(other)):
                if other.get(field) != theirs[0].get(field):
                    raise ConfigError(f"rank {rank}'s configuration differs from rank 0's in {field!r}: "
                                      f"{_short(other.get(field))} vs {_short(theirs[0].get(field))}")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."
