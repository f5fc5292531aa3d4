"""The workload table: every tool that picks a workload by name reads it here.

Each module of this package that declares a `WORKLOAD` (workload.py) is an
entry; nothing lists them by hand, so a new workload module is found as it
is. `ENTRIES` holds all of them in their order, the zoo's family included;
`WORKLOADS` those built by name (a network builder of their own), which the
data-parallel ranks (`data_parallel.py`, bench/dp_worker.py) and the max-batch
trials (bench/maxbatch/) train. The profile command, the report's titles and
the gate's regression profiles read `ENTRIES`.
"""
from __future__ import annotations

import importlib
import pkgutil

from .workload import SHAPE_KINDS, Workload

# This package's modules that are not workloads; data_parallel.py imports this table, so importing it here would
# go round in a circle.
NOT_WORKLOADS = frozenset({"data_parallel", "registry", "workload"})


def discover(package: str, skip=frozenset()) -> dict[str, Workload]:
    """The WORKLOAD of each module of `package` (but `skip`) that declares one, by name, in their order."""
    found = []
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if module.name in skip:
            continue
        entry = getattr(importlib.import_module(f"{package}.{module.name}"), "WORKLOAD", None)
        if isinstance(entry, Workload):
            found.append(entry)
    names = [entry.name for entry in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two workload modules of {package} declare one name: {sorted(names)}")
    return {entry.name: entry for entry in sorted(found, key=lambda entry: (entry.order, entry.name))}


ENTRIES = discover(__package__, NOT_WORKLOADS)
WORKLOADS = {name: entry for name, entry in ENTRIES.items() if entry.build is not None}
__all__ = ["ENTRIES", "SHAPE_KINDS", "WORKLOADS", "Workload", "get_workload"]


def get_workload(name: str) -> Workload:
    """A workload built by name (not a family: the zoo's networks are chosen with their own names)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]
