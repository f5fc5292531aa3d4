"""Tests of gpuengine.bench: timing, ratios, thresholds, energy, device memory, the max-batch search."""
