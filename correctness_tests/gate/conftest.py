"""The gate's own tests take the perf suite's fixtures: `compare` times stand-in runners as a perf test times
the engine (perf_tests/conftest.py).

In-process inner sessions (pytester) drop the modules they imported first when they end, and a C extension
(numpy.fft, which the change points' ruptures pulls in through scipy) cannot load twice in one process: the
change points' library is imported here, before any inner session, so that a later test can import it too."""
from perf_tests.conftest import compare, gemm_peak_tflops, references  # noqa: F401

from gpuengine.gate import changepoints

changepoints.available()
