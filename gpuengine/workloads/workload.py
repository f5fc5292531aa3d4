"""One entry of the workload table: what every tool that picks a workload by name needs to know of it.

Each workload module declares its own `WORKLOAD` (registry.py collects
them), so that a new workload is its module, its PyTorch twin, its perf test
and its thresholds: four files (docs/architecture.md, "A new workload").

- The engine side: the network builder, the data generator, the shapes
  ("seed": the seed note's sizes, measured on a GPU; "smoke": the CPU tier's
  small ones, which exercise the code, not the GPU) and the learning rate.
  A family of networks chosen by name (the zoo: `zoo:alexnet`) has none of
  these here; its `members` are the names and its module builds them.
- The gate's side: the title and seed note the report gives its perf tests,
  which of those tests the profile command can replay (training steps), the
  perf tests' batch on a GPU and on the CPU tier, and the module of its
  PyTorch twin. The twin is named, not imported: the engine's packages never
  import the references (correctness_tests/test_layering.py), and torch is
  optional; bench/profile resolves it and calls its `twin_train_runner`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

SHAPE_KINDS = ("seed", "smoke")


@dataclass(frozen=True)
class Workload:
    name: str
    title: str                           # as the report names it ("ResNet-50")
    seed_note: str | None                # the benchmark note it reproduces ("002"), None for none
    tests: dict[str, str]                # its perf tests by function, each with what it measures ("training")
    profiled: tuple[str, ...]            # those whose cases the profile command replays (training steps)
    batch: int                           # the perf tests' batch on a GPU: the profile's default
    smoke_batch: int                     # theirs on the CPU tier
    twin: str                            # the module of its PyTorch twin, which offers twin_train_runner
    lr: float
    order: int                           # its place in listings
    build: Callable | None = None        # shape -> Network
    data: Callable | None = None         # (samples, shape, seed=0) -> (x, t) host arrays
    seed_shape: object = None
    smoke_shape: object = None
    members: tuple[str, ...] = field(default=())   # a family's networks, chosen by name (no build here)

    def __post_init__(self):
        if (self.build is None) == (not self.members):
            raise ValueError(f"workload {self.name!r}: a network builder or a family's members, one of the two")
        unknown = set(self.profiled) - set(self.tests)
        if unknown:
            raise ValueError(f"workload {self.name!r}: profiled tests {sorted(unknown)} are not among its tests")

    def shape(self, kind: str):
        """The workload's "seed" (GPU) or "smoke" (CPU tier) shape."""
        if kind not in SHAPE_KINDS:
            raise ValueError(f"shape must be one of {', '.join(SHAPE_KINDS)}, got {kind!r}")
        return self.seed_shape if kind == "seed" else self.smoke_shape

    def test_title(self, test: str) -> str:
        """The report's name of one of its perf tests: "ResNet-50 training (seed 002)"."""
        note = f" (seed {self.seed_note})" if self.seed_note else ""
        return f"{self.title} {self.tests[test]}{note}"
