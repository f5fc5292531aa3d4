"""The perf gate: the perf session's pytest plugins, the A/B session and its workers, the stored runs, the tiers.

Above the engine, the workloads, the references and gpuengine/bench (the instruments); nothing below imports
it. docs/architecture.md ("The gate's house") says what is to move here next and in what order.
"""
