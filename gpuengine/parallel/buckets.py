"""Gradient buckets: contiguous slices of the flat gradient buffer, each all-reduced as soon as backward wrote it.

PyTorch DDP's scheme (Li et al. 2020, "PyTorch Distributed: Experiences on
Accelerating Data Parallel Training", section 3.2.3; 25 MiB buckets by
default): parameters are grouped in the reverse of their forward order, the
order backward produces their gradients, and a bucket's all-reduce starts
once its last gradient is written, overlapping the rest of backward. Here the
gradients already live in one flat buffer (params.py), so a bucket is a plain
slice of it, padding included: the buckets tile the whole buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Bucket:
    start: int          # first element of the slice of the flat gradient buffer
    stop: int           # one past its last element
    ready_after: int    # index of the backward step after which every gradient in it is written


def plan_buckets(offsets: dict, size: int, ready: dict[str, int], itemsize: int,
                 cap_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Buckets in launch order (highest offsets first). offsets: FlatParameters.offsets; ready: parameter name ->
    index of the backward step that completes its gradient. A bucket closes once it holds >= cap_bytes."""
    if cap_bytes < 1:
        raise ValueError(f"bucket cap must be >= 1 byte, got {cap_bytes}")
    missing = set(offsets) - set(ready)
    if missing:
        raise ValueError(f"no backward step writes the gradients of {sorted(missing)}")
    buckets, stop, first_ready, names = [], size, -1, sorted(offsets, key=lambda n: offsets[n][0], reverse=True)
    for i, name in enumerate(names):
        first_ready = max(first_ready, ready[name])
        start = offsets[name][0] if i + 1 < len(names) else 0   # the lowest bucket reaches down to element 0
        if (stop - start) * itemsize >= cap_bytes or i + 1 == len(names):
            buckets.append(Bucket(start, stop, first_ready))
            stop, first_ready = start, -1
    return buckets


def backward_ready_steps(net, program) -> dict[str, int]:
    """Parameter name -> the index (0-based) of the backward step of `program` after which its gradient is final.
    Parameters of nodes the program fused into its loss head are written before any backward step: step 0."""
    step_of_node = {name: index for index, name in enumerate(program.backward_nodes)}
    return {spec.name: step_of_node.get(node.name, 0)
            for node in net.nodes for spec in node.layer.param_specs(*net.input_shapes(node))}


def launches_by_step(buckets: list[Bucket], steps: int) -> list[list[Bucket]]:
    """For each backward step, the buckets whose all-reduce starts right after it."""
    out: list[list[Bucket]] = [[] for _ in range(steps)]
    for bucket in buckets:
        out[max(bucket.ready_after, 0)].append(bucket)
    return out
