"""PyTorch references the engine is measured against (docs/architecture.md, "The references we compare against").

Importing this package does not import torch; the modules inside do, so a suite
without torch can skip them with `pytest.importorskip("torch")`.
"""
