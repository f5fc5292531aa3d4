"""The runtime under every layer: the array backend (CuPy or NumPy), device memory, the flat parameters, kernel
compilation, the step's device state, precision policies and CUDA-graph capture."""
