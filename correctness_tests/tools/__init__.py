"""Tests of gpuengine.tools and the measurement modules it uses (memory, energy)."""
