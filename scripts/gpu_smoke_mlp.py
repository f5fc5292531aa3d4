"""GPU smoke check of the MLP engine path: kernels compile, numbers agree with
the NumPy backend, every toggle trains, and a first timing of the step.
Development aid for a device run; the suite's real checks live in the tests.
"""
import sys
import time
import traceback

import numpy as np

from gpuengine.config import EngineConfig
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.trainer import Trainer
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data


def check(name, fn):
    try:
        print(f"{name}: {fn()}", flush=True)
    except Exception:
        print(f"{name}: FAILED", flush=True)
        traceback.print_exc()


def parity():
    shape = MLPShape(inputs=64, hidden=96)
    net = build_mlp(shape)
    x, t = mlp_data(2048, shape)
    out = {}
    for prec in ("fp32", "tf32", "bf16"):
        for fuse in (True, False):
            cpu = Trainer(net, x, t, 256, EngineConfig(device="cpu", precision="fp32", cuda_graph=0), fuse=fuse)
            gpu = Trainer(net, x, t, 256, EngineConfig(device="cuda", precision=prec, cuda_graph=0), fuse=fuse)
            cpu.warm_up(); gpu.warm_up()
            a, b = cpu.params.state_dict(), gpu.params.state_dict()
            out[f"{prec}-fuse{int(fuse)}"] = max(float(np.abs(a[k] - b[k]).max() / (np.abs(a[k]).max() + 1e-12)) for k in a)
    return out


def toggles():
    shape = MLPShape(inputs=256, hidden=512)
    net = build_mlp(shape)
    x, t = mlp_data(8192, shape)
    out = {}
    for prec in ("tf32", "bf16", "fp32"):
        for resident in (True, False):
            for graph in (0, 1, 4):
                cfg = EngineConfig(device="cuda", precision=prec, cuda_graph=graph, resident_data=resident, batch_pool=4)
                losses = Trainer(net, x, t, 1024, cfg).train(4)
                out[f"{prec}-res{int(resident)}-g{graph}"] = [round(v, 5) for v in losses]
    return out


def timing():
    import cupy
    net = build_mlp()
    res = {}
    for prec in ("tf32", "fp32", "bf16"):
        for bpe in (1, 50):
            x, t = mlp_data(8000 * bpe)
            for graph in (0, 1, 8):
                tr = Trainer(net, x, t, 8000, EngineConfig(precision=prec, cuda_graph=graph))
                tr.warm_up()
                tr.run_epochs(2)
                tr.synchronize()
                pool = cupy.get_default_memory_pool()
                used = pool.used_bytes()
                epochs = max(2, 100 // bpe)
                t0 = time.perf_counter()
                tr.run_epochs(epochs)
                tr.synchronize()
                dt = time.perf_counter() - t0
                assert pool.used_bytes() == used, "steady-state allocation"
                res[f"{prec}-bpe{bpe}-g{graph}"] = f"{epochs * bpe * 8000 / dt / 1e6:.3f} M/s, {dt / (epochs * bpe) * 1e3:.4f} ms/step"
            print(res, flush=True)
        tr.config.__class__  # keep last trainer for profile
        res[f"{prec}-profile"] = {k: round(v, 4) for k, v in tr.profile(20).items()}
    return res


def infer_timing():
    net = build_mlp()
    res = {}
    for prec in ("tf32", "bf16"):
        pred = Predictor(net, EngineConfig(precision=prec, cuda_graph=1))
        for batch in (512, 2000, 8000, 32000):
            rp = ResidentPredictor(pred, batch)
            rp.load(np.random.default_rng(0).standard_normal((batch, 1000)).astype(np.float32))
            for _ in range(10):
                rp.run()
            rp.synchronize()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                rp.run()
            rp.synchronize()
            dt = (time.perf_counter() - t0) / n
            res[f"{prec}-b{batch}"] = f"{batch / dt / 1e6:.2f} M/s ({dt * 1e3:.4f} ms)"
    return res


def kernels():
    """Device time of each piece of a tf32 batch-8000 step, each captured alone in a graph."""
    import cupy
    net = build_mlp()
    x, t = mlp_data(8000 * 4)
    out = {}
    from gpuengine.network import TrainingProgram
    tuned = TrainingProgram.autotune
    for prec, autotune in (("tf32", True), ("tf32", False), ("bf16", True)):
        TrainingProgram.autotune = tuned if autotune else (lambda self: None)
        tr = Trainer(net, x, t, 8000, EngineConfig(precision=prec, cuda_graph=0))
        tr.warm_up()
        prec = f"{prec}-tuned{int(autotune)}"
        prog = tr.program
        pieces = {"gather": tr.data.load_batch, "dense1_fwd": prog.body[0].forward, "head": prog.loss.forward_backward,
                  "dense1_dW": prog.body[0].backward, "adam": tr.optimizer.step, "whole_step": tr.step}
        stream = tr.backend.stream
        for name, fn in pieces.items():
            with stream:
                stream.begin_capture()
                for _ in range(20):
                    fn()
                g = stream.end_capture()
                g.launch(stream)
                s, e = cupy.cuda.Event(), cupy.cuda.Event()
                s.record(stream)
                for _ in range(5):
                    g.launch(stream)
                e.record(stream)
                e.synchronize()
            out[f"{prec}-{name}"] = round(cupy.cuda.get_elapsed_time(s, e) / 100, 4)
    return out


def torch_graph_train():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Tanh(), torch.nn.Linear(1000, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True, capturable=True)
    x, t = mlp_data(8000 * 50)
    X, T = torch.tensor(x).cuda(), torch.tensor(t).cuda()
    sx, st = torch.empty(8000, 1000, device="cuda"), torch.empty(8000, 1, device="cuda")
    idx = torch.randperm(8000 * 50, device="cuda")[:8000]

    def step():
        torch.index_select(X, 0, idx, out=sx)
        torch.index_select(T, 0, idx, out=st)
        loss = torch.nn.functional.mse_loss(model(sx), st)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    n = 400
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n
    return f"torch_graph tf32 bpe-any: {8000 / dt / 1e6:.3f} M/s, {dt * 1e3:.4f} ms/step"


if __name__ == "__main__":
    for name in sys.argv[1:] or ["kernels", "timing", "infer_timing", "torch_graph_train"]:
        check(name, globals()[name])
