"""The rendezvous and the store all-reduce, with ranks as threads of this process (one TCP store, real sockets)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch.distributed", reason="the rendezvous uses torch's TCPStore; torch is not installed")

from gpuengine.config import ConfigError  # noqa: E402
from gpuengine.parallel.launch import free_port  # noqa: E402
from gpuengine.parallel import ProcessGroup, Rendezvous, RendezvousError, StoreAllReduce  # noqa: E402


def run_ranks(world, body, timeout_s=10.0):
    """body(rank, rendezvous) on `world` threads; their results, or the first exception raised."""
    port = free_port()
    results, errors = [None] * world, [None] * world

    def rank_main(rank):
        rdv = Rendezvous(ProcessGroup(rank, world, rank, "127.0.0.1", port), timeout_s)
        try:
            results[rank] = body(rank, rdv)
        except Exception as exc:   # handed to the test thread
            errors[rank] = exc
        finally:
            rdv.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 20)
    return results, errors


def test_all_gather_and_broadcast_hand_every_rank_the_same_blobs():
    def body(rank, rdv):
        first = rdv.all_gather("x", f"r{rank}".encode())
        second = rdv.all_gather("x", f"again{rank}".encode())   # a second round must not read the first
        return first, second, rdv.broadcast("b", b"root" if rank == 0 else None)

    results, errors = run_ranks(3, body)
    assert errors == [None] * 3
    for first, second, root in results:
        assert first == [b"r0", b"r1", b"r2"] and second == [b"again0", b"again1", b"again2"] and root == b"root"


def test_the_store_all_reduce_averages_in_rank_order_and_broadcasts_rank_0():
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]

    def body(rank, rdv):
        reducer = StoreAllReduce(rdv)
        averaged = data[rank].copy()
        reducer.sum_into(averaged[100:250])
        weights = np.full(5, rank, np.float32)
        reducer.broadcast(weights)
        return averaged, weights

    results, errors = run_ranks(3, body)
    assert errors == [None] * 3
    expected = ((data[0][100:250] + data[1][100:250]) + data[2][100:250]) * np.float32(1 / 3)
    for rank, (averaged, weights) in enumerate(results):
        np.testing.assert_array_equal(averaged[100:250], expected)   # bit-identical on every rank
        np.testing.assert_array_equal(averaged[:100], data[rank][:100])   # outside the slice: untouched
        np.testing.assert_array_equal(weights, np.zeros(5, np.float32))


def test_a_rank_with_another_configuration_is_refused_by_name_and_field():
    def body(rank, rdv):
        rdv.check_same_config({"batch": 64 if rank != 2 else 32, "precision": "fp32"})

    _, errors = run_ranks(3, body)
    for error in errors:
        assert isinstance(error, ConfigError)
        assert "rank 2's configuration differs from rank 0's in 'batch': 32 vs 64" in str(error)


def test_a_rank_that_never_comes_is_named_after_the_timeout():
    def body(rank, rdv):
        if rank == 0:
            return rdv.all_gather("x", b"hello")

    _, errors = run_ranks(2, body, timeout_s=1.0)
    assert isinstance(errors[0], RendezvousError)
    assert "no word from rank 1 within 1 s" in str(errors[0])


def test_a_store_nobody_hosts_is_named_by_address():
    with pytest.raises(RendezvousError, match=r"rank 1 could not reach the rendezvous store at "
                                              r"MASTER_ADDR:MASTER_PORT=127\.0\.0\.1:\d+"):
        Rendezvous(ProcessGroup(1, 2, 1, "127.0.0.1", free_port()), timeout_s=1.0)


def test_a_port_another_program_holds_is_named_by_rank_0():
    import socket
    with socket.socket() as holder:   # some other program listens on MASTER_PORT
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RendezvousError, match=rf"rank 0 could not host the rendezvous store at "
                                                  rf"MASTER_ADDR:MASTER_PORT=127\.0\.0\.1:{port}"):
            Rendezvous(ProcessGroup(0, 2, 0, "127.0.0.1", port), timeout_s=1.0)
