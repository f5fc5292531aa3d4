"""PyTorch's stronger captured reference, round by round: `torch_graph_best`, what the claims over PyTorch read.

PyTorch has two whole-step CUDA-graph references (gpuengine/reference/torch_common.py):
`torch_graph` (eager modules) and `torch_compile_graph` (the model compiled by
Inductor). Which is faster depends on the workload and the GPU, so a claim
over "PyTorch's whole step captured" reads the faster of the two in each round
of the same process: `torch_graph_best`'s round time is the smaller of the
two rounds (per sample, as every ratio), the engine's speed-up over it is
taken round by round like any reference's (benchmarking.Comparison), and the
run stores which candidate won each round and a label for the whole,
"torch_compile_graph in 7 of 9 rounds".

It exists only where the run settled both candidates: each timed, or found
unavailable here (`ReferenceUnavailable`: Inductor's step would not capture
for this workload, so torch_graph is PyTorch's strongest), at least one timed.
A run that timed torch_graph alone (the quick tier leaves torch_compile_graph
to the nightly one for the slow-compiling workloads: gpuengine/gate/tiers.py) has
no torch_graph_best, so it decides no rule that reads it
(gpuengine/gate/report/claims.py takes the newest run that has one).
"""
from __future__ import annotations

from collections import Counter
from typing import Collection

STRONGER = "torch_graph_best"
CANDIDATES = ("torch_graph", "torch_compile_graph")


def faster_per_round(per_sample_ms: dict[str, list[float]],
                     unavailable: Collection[str] = ()) -> tuple[list[float], list[str]] | None:
    """(per-round time of the faster candidate, which candidate that was) from the candidates' per-round times
    on one scale (per sample, or the engine's samples per round); None unless every candidate was timed or found
    unavailable, and one at least was timed. Ties go to the first candidate, torch_graph."""
    timed = [name for name in CANDIDATES if name in per_sample_ms]
    if not timed or any(name not in per_sample_ms and name not in unavailable for name in CANDIDATES):
        return None
    rounds = {len(per_sample_ms[name]) for name in timed}
    if len(rounds) != 1:
        raise ValueError(f"{STRONGER}: the candidates timed different numbers of rounds "
                         f"({', '.join(f'{n}: {len(per_sample_ms[n])}' for n in timed)})")
    times, winners = [], []
    for round_times in zip(*(per_sample_ms[name] for name in timed)):
        best = min(range(len(timed)), key=lambda i: round_times[i])
        times.append(round_times[best])
        winners.append(timed[best])
    return times, winners


def label(winners: list[str], unavailable: Collection[str] = ()) -> str:
    """'torch_compile_graph in 7 of 9 rounds' (the candidate that won most rounds), and any candidate found
    unavailable: 'torch_graph in 9 of 9 rounds; torch_compile_graph unavailable'."""
    if not winners:
        raise ValueError(f"{STRONGER}: no round to label")
    counts = Counter(winners)
    leader = max(CANDIDATES, key=lambda name: (counts[name], -CANDIDATES.index(name)))
    text = f"{leader} in {counts[leader]} of {len(winners)} rounds"
    missing = [name for name in CANDIDATES if name in unavailable]
    return text + "".join(f"; {name} unavailable" for name in missing)
