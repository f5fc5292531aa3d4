"""On one GPU: the NCCL path (gpuengine/parallel/nccl.py) at world size 1, eager and captured in CUDA graphs.

World size 1 is the most a one-GPU machine can run of NCCL: the unique id
through the rendezvous, a communicator, all-reduce and broadcast on the
communication stream forked from and joined to the engine stream, the same
inside a captured graph replayed several times, and the trainer with a
world-1 NCCL sync training bit for bit like the trainer without one (the
mean over one rank multiplies by exactly 1.0). What it cannot cover (two GPUs
needed: correctness_tests/parallel/test_launch.py's gpu test, the perf test):
sums over ranks, the id reaching another process, bucket overlap across GPUs,
a peer dying inside an NCCL collective, torch_ddp over NCCL.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.runtime.backend import gpu_visible


def nccl_importable() -> bool:
    try:
        from cupy.cuda import nccl  # noqa: F401
        return nccl.get_version() > 0
    except Exception:   # no cupy, or cupy without an NCCL library to load
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_visible(), reason="no CUDA GPU visible (CuPy missing or no device)"),
              pytest.mark.skipif(gpu_visible() and not nccl_importable(),
                                 reason="cupy.cuda.nccl does not load (no NCCL library for CuPy)")]
pytest.importorskip("torch.distributed", reason="the rendezvous uses torch's TCPStore; torch is not installed")

from gpuengine.config import EngineConfig  # noqa: E402
from gpuengine.runtime.backend import get_backend  # noqa: E402
from gpuengine.parallel.launch import free_port  # noqa: E402
from gpuengine.parallel import ProcessGroup, Rendezvous, data_parallel  # noqa: E402
from gpuengine.trainer import Trainer  # noqa: E402
from gpuengine.workloads.mlp import MLPShape, build_mlp, mlp_data  # noqa: E402

GPU = EngineConfig(device="cuda", precision="fp32", cuda_graph=0)


def world_one_env() -> dict:
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


@pytest.fixture
def reducer():
    from gpuengine.parallel.nccl import NcclAllReduce
    rendezvous = Rendezvous(ProcessGroup.from_env(world_one_env()), timeout_s=30)
    yield NcclAllReduce(rendezvous, get_backend(GPU))
    rendezvous.close()


def one_behind_matmuls(xp, count: int):
    """A device 0-d array holding exactly 1.0, computed behind `count` 2048^3 matmuls on the current stream."""
    a = xp.ones((2048, 2048), xp.float32)
    for _ in range(count):
        a = a @ a * np.float32(1 / 2048)   # ones stay ones: 2048 * (1/2048) is exact
    return a[0, 0]


def slow_fill(backend, buf, value):
    """buf[...] = value on the engine stream, behind ~tens of ms of matmuls: a missing wait reads stale data."""
    xp = backend.xp
    with backend.activate():
        buf[...] = xp.float32(value) + one_behind_matmuls(xp, 20) - xp.float32(1)


def halving(reducer):
    """At world size 1 NCCL's sum leaves the data as it is; a scale of 0.5 (in place of 1/world) makes the
    communication stream's own write visible, so a wait missing in either direction changes the result."""
    reducer._scale = 0.5
    return reducer


def test_all_reduce_and_broadcast_at_world_one_follow_the_engine_stream_both_ways(reducer):
    backend = halving(reducer).backend
    xp = backend.xp
    expected = np.full(4096, 7.0, np.float32)
    expected[1024:3072] = 3.5
    with backend.activate():
        buf = xp.zeros(4096, xp.float32)

    def halve_middle_then_double():
        """Sum (halve, at world one) the middle of buf on the communication stream, then double all of it."""
        reducer.sum_into(buf[1024:3072])
        reducer.wait()
        with backend.activate():
            out = buf * 2
        np.testing.assert_array_equal(backend.to_host(out), expected)

    # Fork: the engine stream is slow to fill; the communication stream must halve the 3.5s, not the zeros.
    slow_fill(backend, buf, 3.5)
    halve_middle_then_double()
    # Join: now the communication stream is the slow one; the engine stream must wait for its halving.
    with reducer.comm_stream:
        pad = one_behind_matmuls(xp, 40)
    with backend.activate():
        buf[...] = xp.float32(3.5)
    halve_middle_then_double()
    with reducer.comm_stream:
        assert float(pad) == 1.0            # read on its own stream (the default stream does not order it)
    slow_fill(backend, buf, -1.25)
    reducer.broadcast(buf)
    np.testing.assert_array_equal(backend.to_host(buf), np.full(4096, -1.25, np.float32))
    with pytest.raises(TypeError, match="float32 gradients, got float64"):
        reducer.sum_into(xp.zeros(8, xp.float64))


def test_all_reduce_captured_in_a_graph_replays_correctly(reducer):
    backend = halving(reducer).backend
    xp = backend.xp
    with backend.activate():
        buf, out = xp.zeros(1 << 16, xp.float32), xp.zeros(1 << 16, xp.float32)
        reducer.sum_into(buf)               # first collective outside capture (NCCL sets up its resources)
        reducer.wait()
        backend.stream.synchronize()
        stream = backend.stream
        stream.begin_capture()
        try:
            buf += 1
            reducer.sum_into(buf[: 1 << 15])
            reducer.sum_into(buf[1 << 15:])
            reducer.wait()
            xp.multiply(buf, 3, out=out)    # no temporary: nothing allocated inside the capture
        finally:
            graph = stream.end_capture()
        for _ in range(4):
            graph.launch(stream)
    # Each replay: buf = (buf + 1) / 2, from 0: 0.5, 0.75, 0.875, 0.9375 (exact in float32).
    np.testing.assert_array_equal(backend.to_host(buf), np.full(1 << 16, 0.9375, np.float32))
    np.testing.assert_array_equal(backend.to_host(out), np.full(1 << 16, 2.8125, np.float32))


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("graph", [0, 4])
def test_a_world_one_nccl_sync_trains_like_no_sync(graph, fuse):
    # 512 bytes splits this MLP's 25.9 KB of gradients in three (4096 left one: dense1's weight closes the bucket);
    # unfused, dense2's bucket starts after backward step 0 and overlaps the two steps still to run
    shape = MLPShape(inputs=64, hidden=96)
    x, t = mlp_data(2048, shape)
    config = EngineConfig(device="cuda", precision="fp32", cuda_graph=graph)
    plain = Trainer(build_mlp(shape), x, t, 128, config, fuse=fuse)
    expected = plain.train(3)
    sync = data_parallel(config, bucket_bytes=512, environ=world_one_env())
    try:
        synced = Trainer(build_mlp(shape), x, t, 128, config, fuse=fuse, sync=sync)
        losses = synced.train(3)
        starts = sorted({b.ready_after for b in sync.buckets})
        assert len(sync.buckets) > 1, "the small bucket cap must split the gradients"
        assert fuse or len(starts) > 1, f"unfused, a bucket must start before backward ends (starts {starts})"
        assert losses == expected
        for name, value in plain.params.state_dict().items():
            np.testing.assert_array_equal(synced.params.state_dict()[name], value, err_msg=name)
    finally:
        sync.rendezvous.close()
