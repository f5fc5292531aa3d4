"""Device operations the layers are built from: cuBLASLt GEMMs, reductions, cuDNN frontend graphs (convolution,
batch norm, fused attention), direct CUDA kernels, and the chooser that times two ways of one op."""
