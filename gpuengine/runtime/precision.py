"""Precision policy: the one place that decides dtypes and GEMM compute modes.

- fp32: IEEE single precision everywhere (cuBLASLt COMPUTE_32F).
- tf32: fp32 storage, tensor-core TF32 GEMMs (COMPUTE_32F_FAST_TF32).
- bf16: bf16 activations and GEMM operands with fp32 accumulation; fp32 master
  weights, gradients and Adam moments (mixed precision, Micikevicius et al. 2018).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import PRECISIONS, ConfigError
from .backend import bfloat16_dtype

# fp64 is not a toggle: gradient checks build NumPy layers in float64 with it.
CHECK_PRECISION = "fp64"


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str

    def __post_init__(self):
        if self.name not in PRECISIONS + (CHECK_PRECISION,):
            raise ConfigError(f"precision={self.name!r} is not accepted; use one of {', '.join(PRECISIONS)}")

    @property
    def master_dtype(self) -> np.dtype:
        """Weights, gradients and optimizer moments."""
        return np.dtype(np.float64 if self.name == CHECK_PRECISION else np.float32)

    @property
    def compute_dtype(self) -> np.dtype:
        """Activations, their gradients and GEMM operands."""
        if self.name == "bf16":
            return bfloat16_dtype()
        return self.master_dtype

    @property
    def needs_compute_copy(self) -> bool:
        """bf16 keeps a bf16 copy of the weights next to the fp32 masters."""
        return self.compute_dtype != self.master_dtype

    @property
    def tf32(self) -> bool:
        return self.name == "tf32"

    def gemm_compute_type(self):
        """The cuBLASLt compute type for this policy's GEMMs."""
        from nvmath.bindings import cublas
        if self.name == "tf32":
            return cublas.ComputeType.COMPUTE_32F_FAST_TF32
        return cublas.ComputeType.COMPUTE_32F


def policy_for(name: str) -> PrecisionPolicy:
    return PrecisionPolicy(name)
