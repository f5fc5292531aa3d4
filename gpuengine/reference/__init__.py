"""PyTorch references the engine is measured against (docs/architecture.md, "The references we compare against").

Importing this package does not import torch; the modules inside do, so a suite
without torch can skip them with `pytest.importorskip("torch")`. What the
package itself holds is `ReferenceUnavailable`, so that the perf harness can
leave out a reference that cannot run without importing torch.
"""


class ReferenceUnavailable(RuntimeError):
    """This reference cannot run on this machine; the suite leaves it out and records the message."""
