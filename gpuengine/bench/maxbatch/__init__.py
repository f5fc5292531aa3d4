"""The largest batch that fits under a memory cap, engine and PyTorch references.

One fresh process per trial (`trial`), per workload (`workloads`), searched by
`search`; `python -m gpuengine maxbatch mlp --cap-gib 6` prints the table.
"""
