"""The data path on the CPU: Feistel shuffles, resident vs streamed batches, Rosenbrock, bf16 storage.

Resident and streamed data sets must deliver the same batch at every step for
the same seed (one shuffle, two delivery mechanisms); the checks drive both
through the trainer's launch protocol (before_launch, load_batch and end_step per step,
after_launch) with a real StepState, across epoch boundaries.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpuengine.data.resident import ResidentDataset
from gpuengine.data.rosenbrock import make_rosenbrock, rosenbrock
from gpuengine.data.shuffle import batch_rows, epoch_order, half_bits
from gpuengine.data.streamed import StreamedDataset
from gpuengine.runtime.backend import Backend
from gpuengine.runtime.memory import Allocator
from gpuengine.runtime.precision import policy_for
from gpuengine.runtime.step_state import StepState

# -- shuffle ---------------------------------------------------------------------------

SIZES = list(range(1, 70)) + [127, 128, 129, 255, 256, 1000, 4095, 4096, 4097, 65537]


@pytest.mark.parametrize("n", SIZES)
def test_every_epoch_order_is_a_permutation(n):
    for seed, epoch in ((0, 0), (1, 0), (0, 7), (12345, 99)):
        np.testing.assert_array_equal(np.sort(epoch_order(n, seed, epoch)), np.arange(n))


def test_orders_differ_across_epochs_and_seeds():
    n = 1000
    orders = {(seed, epoch): tuple(epoch_order(n, seed, epoch)) for seed in range(3) for epoch in range(5)}
    assert len(set(orders.values())) == len(orders)
    assert orders[(0, 0)] != tuple(range(n))


def test_orders_are_well_mixed():
    """A shuffle that moved little (or only in blocks) would pass the permutation test."""
    n = 4096
    order = epoch_order(n, seed=0, epoch=0)
    assert np.mean(order == np.arange(n)) < 0.01                        # few fixed points
    assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.1            # position says little about the row
    for a, b in ((0, 1), (0, 2)):
        assert np.mean(epoch_order(n, 0, a)[:100, None] == epoch_order(n, 0, b)[None, :100]) < 0.05


def test_orders_are_deterministic():
    np.testing.assert_array_equal(epoch_order(777, 3, 2), epoch_order(777, 3, 2))


@pytest.mark.parametrize("n,batch", [(100, 10), (103, 10), (64, 64), (9, 4)])
def test_batch_rows_walk_through_the_epoch_order(n, batch):
    steps_per_epoch = n // batch
    for seed, epoch in ((0, 0), (5, 3)):
        order = epoch_order(n, seed, epoch)
        steps = range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
        rows = np.concatenate([batch_rows(n, seed, s, batch, steps_per_epoch) for s in steps])
        np.testing.assert_array_equal(rows, order[:steps_per_epoch * batch])


@pytest.mark.parametrize("n", [0, -1, 1 << 31])
def test_shuffle_domain_is_checked(n):
    with pytest.raises(ValueError, match="shuffle domain"):
        half_bits(n)


# -- resident vs streamed --------------------------------------------------------------

def make_dataset(kind, x, t, batch, seed, precision="fp32", pool=2):
    backend = Backend("cpu")
    allocator = Allocator(backend)
    state = StepState(backend, allocator, steps_per_epoch=len(x) // batch)
    policy = policy_for(precision)
    if kind == "resident":
        return ResidentDataset(backend, allocator, policy, state, x, t, batch, seed)
    return StreamedDataset(backend, allocator, policy, state, x, t, batch, seed, pool=pool)


def delivered_batches(data, steps: int, per_launch: int):
    """(x, t) copies of the batch buffers at each step, launched `per_launch` steps at a time."""
    out = []
    for first in range(0, steps, per_launch):
        n = min(per_launch, steps - first)
        data.before_launch(first, n)
        for step in range(first, first + n):
            data.state.step[0] = step
            data.load_batch()
            out.append((data.batch_x.copy(), data.batch_t.copy()))
            data.end_step()
        data.after_launch(first, n)
    return out


def sample_data(samples=103, features=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    return x, np.arange(samples, dtype=np.float32)[:, None]   # targets are row numbers: easy to read back


@pytest.mark.parametrize("pool,per_launch", [(1, 1), (1, 3), (2, 1), (2, 3), (2, 4)])
def test_resident_and_streamed_deliver_the_same_batches(pool, per_launch):
    x, t = sample_data()
    batch, seed, steps = 10, 7, 25          # 10 steps per epoch: crosses two epoch boundaries
    resident = delivered_batches(make_dataset("resident", x, t, batch, seed), steps, per_launch)
    streamed = delivered_batches(make_dataset("streamed", x, t, batch, seed, pool=pool), steps, per_launch)
    for step, ((rx, rt), (sx, st)) in enumerate(zip(resident, streamed)):
        rows = batch_rows(len(x), seed, step, batch, len(x) // batch)
        np.testing.assert_array_equal(rt[:, 0], rows, err_msg=f"resident step {step}")
        np.testing.assert_array_equal(st[:, 0], rows, err_msg=f"streamed step {step}")
        np.testing.assert_array_equal(rx, x[rows])
        np.testing.assert_array_equal(sx, rx)


def test_each_epoch_sees_every_kept_sample_once():
    x, t = sample_data()
    batch = 10
    batches = delivered_batches(make_dataset("resident", x, t, batch, seed=1), 20, 1)
    for epoch in range(2):
        seen = np.concatenate([bt[:, 0] for _, bt in batches[epoch * 10:(epoch + 1) * 10]])
        assert len(np.unique(seen)) == 100
    assert not np.array_equal(batches[0][1], batches[10][1])


def test_different_seeds_give_different_batches():
    x, t = sample_data()
    a = delivered_batches(make_dataset("resident", x, t, 10, seed=1), 1, 1)[0][1]
    b = delivered_batches(make_dataset("resident", x, t, 10, seed=2), 1, 1)[0][1]
    assert not np.array_equal(a, b)


def test_rows_of_step_is_what_load_batch_gathers():
    x, t = sample_data()
    for kind in ("resident", "streamed"):
        data = make_dataset(kind, x, t, 10, seed=3)
        for step, (_, bt) in enumerate(delivered_batches(data, 12, 1)):
            np.testing.assert_array_equal(data.rows_of_step(step), bt[:, 0], err_msg=f"{kind} step {step}")


def test_resident_gather_also_writes_the_batch_innermost_when_asked():
    x, t = sample_data()
    data = make_dataset("resident", x, t, 10, seed=4)
    x_t = data.batch_innermost_input()
    assert x_t.shape == (6, 10) and data.batch_innermost_input() is x_t   # asked twice: one buffer
    for step in range(3):
        data.state.step[0] = step
        data.load_batch()
        np.testing.assert_array_equal(x_t, x[data.rows_of_step(step)].T)


def test_a_data_set_that_is_the_batch_is_copied_batch_innermost_once():
    x, t = sample_data()
    data = make_dataset("resident", x, t, len(x), seed=4)
    x_t = data.batch_innermost_input()
    assert data.batch_innermost_input() is x_t
    data.load_batch()
    np.testing.assert_array_equal(x_t, x.T)


@pytest.mark.parametrize("kind, precision", [("streamed", "fp32"), ("resident", "bf16")],
                         ids=["rows-from-the-host", "not-float32"])
def test_no_batch_innermost_copy_where_the_gather_cannot_write_it(kind, precision):
    x, t = sample_data()
    assert make_dataset(kind, x, t, 10, seed=4, precision=precision).batch_innermost_input() is None


# -- Rosenbrock ------------------------------------------------------------------------

def test_rosenbrock_known_values():
    x = np.array([[1.0, 1.0], [0.0, 0.0], [-1.0, 1.0], [1.0, 1.5]])
    np.testing.assert_allclose(rosenbrock(x), [0.0, 1.0, 4.0, 25.0])
    # Three inputs: two terms, (1 - 0.5)^2 and (1 - 0.25)^2; both curvature terms vanish.
    np.testing.assert_allclose(rosenbrock(np.array([[0.5, 0.25, 0.0625]])), [0.25 + 0.5625])


def test_rosenbrock_data_shape_dtype_and_standardisation():
    x, t = make_rosenbrock(5000, 10, seed=0)
    assert x.shape == (5000, 10) and x.dtype == np.float32
    assert t.shape == (5000, 1) and t.dtype == np.float32
    assert x.min() >= -1 and x.max() <= 1 and x.min() < -0.99 and x.max() > 0.99
    assert abs(float(t.mean())) < 1e-5 and abs(float(t.std()) - 1) < 1e-5
    raw = rosenbrock(x)
    np.testing.assert_allclose(t[:, 0], (raw - raw.mean()) / raw.std(), rtol=1e-5, atol=1e-5)


def test_rosenbrock_data_is_deterministic_per_seed():
    a, b, c = make_rosenbrock(50, 4, seed=1), make_rosenbrock(50, 4, seed=1), make_rosenbrock(50, 4, seed=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("samples,inputs,message", [(1, 4, "samples=1 is not accepted; use a whole number >= 2"),
                                                    (10, 1, "inputs=1 is not accepted; use a whole number >= 2"),
                                                    (10.0, 4, "samples=10.0 is not accepted")])
def test_rosenbrock_refuses_degenerate_sizes(samples, inputs, message):
    with pytest.raises(ValueError, match=message):
        make_rosenbrock(samples, inputs)


# -- bf16 storage ----------------------------------------------------------------------

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_bf16_storage_rounds_to_nearest_even():
    # bf16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (ties to even: 1),
    # 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 (ties to even: 1 + 2^-6).
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -12, -(1 + 2 ** -8)], np.float32)
    x = np.tile(values, (4, 1))
    t = np.arange(4, dtype=np.float32)[:, None] + 0.1
    for kind in ("resident", "streamed"):
        data = make_dataset(kind, x, t, batch=4, seed=0, precision="bf16")
        bx, bt = delivered_batches(data, 1, 1)[0]
        assert bx.dtype == BF16
        np.testing.assert_array_equal(bx.astype(np.float32)[0], [1.0, 1 + 2 ** -6, 1 + 2 ** -7, -1.0])
        np.testing.assert_array_equal(np.sort(bt[:, 0]), t[:, 0])   # targets stay float32, exact


def test_bf16_storage_error_is_half_an_ulp():
    x, t = make_rosenbrock(64, 8, seed=0)
    data = make_dataset("resident", x, t, batch=64, seed=0, precision="bf16")
    stored = data.x.astype(np.float32)
    np.testing.assert_array_equal(stored, x.astype(BF16).astype(np.float32))
    assert np.all(np.abs(stored - x) <= np.abs(x) * 2.0 ** -8)
    assert np.any(stored != x)
