"""The A/B session: the base's checkout (or another lock's stack), the two sides' worker processes, their rounds.

checkout.py resolves `--against REV|DIR|auto` into a folder; stack.py the
`--against-stack LOCK` base; sides.py starts and drives the two workers;
worker.py is the script each side runs (self-contained: the head's file on
the base's packages); session.py is the perf session's plugin that ties
them to the tests.
"""
