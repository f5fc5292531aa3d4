"""gpuengine: a compact GPU deep-learning training engine and the perf gate that guards it."""
from .config import ConfigError, EngineConfig

__version__ = "0.1.0"
__all__ = ["ConfigError", "EngineConfig", "__version__"]
