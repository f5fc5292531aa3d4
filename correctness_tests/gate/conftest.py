"""The gate's own tests take the perf suite's fixtures: `compare` times stand-in runners as a perf test times
the engine (perf_tests/conftest.py)."""
from perf_tests.conftest import compare, gemm_peak_tflops, references  # noqa: F401
