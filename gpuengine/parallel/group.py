"""Who this process is in a data-parallel run: the launcher variables torchrun and `gpuengine.parallel.launch` set.

RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are the names PyTorch's
elastic launcher documents (torch.distributed.run), so either launcher starts
the engine's ranks. Bad or missing values are refused naming the variable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import ConfigError

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ProcessGroup:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    def __post_init__(self):
        if self.world_size < 1:
            raise ConfigError(f"WORLD_SIZE must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"RANK must be in 0..{self.world_size - 1} (WORLD_SIZE={self.world_size}), "
                              f"got {self.rank}")
        if self.local_rank < 0:
            raise ConfigError(f"LOCAL_RANK must be >= 0, got {self.local_rank}")
        if not 0 < self.master_port < 65536:
            raise ConfigError(f"MASTER_PORT must be in 1..65535, got {self.master_port}")
        if not self.master_addr:
            raise ConfigError("MASTER_ADDR is empty")

    @classmethod
    def from_env(cls, environ=None) -> "ProcessGroup":
        env = os.environ if environ is None else environ
        missing = [name for name in VARIABLES if name not in env]
        if missing:
            raise ConfigError(f"data-parallel launch variables missing: {', '.join(missing)} "
                              "(start with `python -m gpuengine.parallel.launch --gpus N ...` or torchrun)")
        return cls(rank=_whole(env, "RANK"), world_size=_whole(env, "WORLD_SIZE"),
                   local_rank=_whole(env, "LOCAL_RANK"), master_addr=env["MASTER_ADDR"].strip(),
                   master_port=_whole(env, "MASTER_PORT"))

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def local_batch(self, global_batch: int) -> int:
        """This rank's share of a global batch; the global batch must split evenly over the ranks."""
        if global_batch % self.world_size:
            raise ConfigError(f"global batch {global_batch} is not divisible by WORLD_SIZE={self.world_size}: "
                              "every rank must train on the same number of rows")
        return global_batch // self.world_size


def _whole(env, name: str) -> int:
    text = env[name].strip()
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {env[name]!r}") from None
