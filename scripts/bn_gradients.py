"""Which gradients of the reduced ResNet step differ from float32 NumPy, with cuDNN's batch norm and the engine's.

On a GPU, from the repository root: python3 scripts/bn_gradients.py. For TF32 and fp32 and each batch norm: the
whole gradient's cosine to NumPy's, then the worst gradients' relative errors."""
import sys
import numpy as np
sys.path.insert(0, ".")
from correctness_tests.layer_harness import run_network
from correctness_tests.workloads.test_gpu_resnet import numeric, smoke_batch, smoke_weights
from gpuengine.workloads import resnet

x, t = smoke_batch()
weights = smoke_weights(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=True), "tf32")
cpu = numeric(run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=True), x, t, precision="fp32", weights=weights))
grads = sorted(k for k in cpu if k.startswith("grad:"))
theirs = np.concatenate([cpu[k].ravel() for k in grads])
for precision in ("tf32", "fp32"):
    for bn in ("cudnn", "engine"):
        gpu = numeric(run_network(resnet.build_resnet(resnet.SMOKE_SHAPE, fused=True), x, t, device="cuda",
                                  precision=precision, weights=weights, batchnorm=bn))
        ours = np.concatenate([gpu[k].ravel() for k in grads])
        cos = ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs))
        rel = {k: float(np.linalg.norm(gpu[k] - cpu[k]) / max(np.linalg.norm(cpu[k]), 1e-30)) for k in grads}
        worst = sorted(rel.items(), key=lambda kv: -kv[1])[:8]
        fwd = {k: float(np.linalg.norm(gpu[k] - cpu[k]) / max(np.linalg.norm(cpu[k]), 1e-30))
               for k in cpu if not k.startswith("grad:")}
        worst_forward = sorted(fwd.items(), key=lambda kv: -kv[1])[:3]
        print(f"== {precision} batchnorm={bn}: cosine {cos:.6f}; forward rel {worst_forward}")
        for k, v in worst:
            print(f"   {k:50s} rel {v:.4g}  norm {np.linalg.norm(cpu[k]):.4g}")
