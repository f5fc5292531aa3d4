"""Stacks as the gate handles them: what a stack A/B compares (change), the base's environment of another lock
(env), and the command lines of ./gate lock and ./gate wheels (cli). The lock a run measures is recorded by
gpuengine/bench/stack_lock.py, an instrument every checkout brings."""
