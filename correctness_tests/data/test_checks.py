"""What the data checks refuse (data/checks.py), and that the trainer and predictor ask them where data enters.

Token ids index an embedding table and the logits' vocabulary: ids >= vocab
were a raw IndexError on NumPy (and a read past the table on a GPU), and -1
and 3.5 trained silently (NumPy wraps -1 to the last row, the kernels truncate
3.5). Softmax cross-entropy targets are probability rows: a negative entry or
a row summing to 5 trained silently. Each is now a DataError naming the array,
the first bad element's index and value, and what is accepted, raised on the
host once, before anything is allocated. The accepted forms stay accepted:
ids in any integer dtype, or integral floats (the engine's float32 format).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.data.checks import DataError, check_ids, check_probability_rows
from gpuengine.inference import Predictor, ResidentPredictor
from gpuengine.layers import Dense
from gpuengine.losses import SoftmaxCrossEntropy
from gpuengine.model.network import Sequential
from gpuengine.runtime.memory import Allocator
from gpuengine.trainer import Trainer
from gpuengine.workloads.transformer import SMOKE_SHAPE, build_transformer, transformer_data

CPU = EngineConfig(device="cpu", precision="fp32", cuda_graph=0)
VOCAB, LENGTH = SMOKE_SHAPE.vocab, SMOKE_SHAPE.length


@pytest.fixture
def no_allocation(monkeypatch):
    """Any device allocation fails loudly: a check that raised its own error ran before allocating."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("allocated before validating")
    monkeypatch.setattr(Allocator, "zeros", refuse)


# -- the checks ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float32,
                                   np.float64, ml_dtypes.bfloat16])
def test_ids_in_range_pass_in_every_storage(dtype):
    check_ids(np.arange(10).reshape(2, 5).astype(dtype), "ids", 10)


@pytest.mark.parametrize("bad, shown", [(10, "10"), (-1, "-1"), (3.5, "3.5"), (np.nan, "nan"), (np.inf, "inf")])
def test_an_id_outside_the_vocabulary_is_named_with_its_index_and_value(bad, shown):
    ids = np.zeros((3, 4), np.float32)
    ids[2, 1] = bad
    with pytest.raises(DataError, match=rf"^ids\[2, 1\]={shown}(\.0)? is not accepted; use a whole number in 0\.\.9 "
                                        r"\(the reader\); 1 bad value in all$"):
        check_ids(ids, "ids", 10, "the reader")


def test_the_padding_id_may_lie_outside_the_vocabulary_and_offsets_shift_the_index():
    check_ids(np.array([[1, 99]]), "targets", 10, pad_id=99)
    with pytest.raises(DataError, match=r"^inputs\[0, 6\]=12 is not accepted; .*, or the padding id 99; "
                                        r"2 bad values in all$"):
        check_ids(np.array([[12, 13]]), "inputs", 10, pad_id=99, offset=(0, 6))


def test_probability_rows():
    check_probability_rows(np.array([[0.25, 0.75], [1.0, 0.0]], np.float32))
    check_probability_rows(np.full((2, 3), 1 / 3, ml_dtypes.bfloat16))   # bf16 rounding is within tolerance
    with pytest.raises(DataError, match=r"^targets\[1, 0\]=-1.0 is not accepted; use rows of class probabilities"):
        check_probability_rows(np.array([[0.0, 1.0], [-1.0, 2.0]]))
    with pytest.raises(DataError, match=r"^targets\[0\] \(a row summing to 5\) is not accepted; use rows of class "
                                        r"probabilities, each entry >= 0 and each row summing to 1"):
        check_probability_rows(np.array([[5.0, 0.0], [0.0, 1.0]]))


# -- where data enters: the trainer and the predictor ------------------------------------

@pytest.fixture
def corpus():
    return transformer_data(32, SMOKE_SHAPE, seed=1)


def with_value(array, index, value):
    changed = array.copy()
    changed[index] = value
    return changed


@pytest.mark.parametrize("bad", [VOCAB, 999, -1, 3.5])
def test_a_trainer_refuses_input_ids_outside_the_vocabulary(corpus, no_allocation, bad):
    x, t = corpus
    with pytest.raises(DataError, match=rf"^inputs\[3, 2\]={bad}(\.0)? is not accepted; use a whole number in "
                                        rf"0\.\.{VOCAB - 1} \(src_embed reads columns 0\.\.{LENGTH - 1} of each "
                                        "input row as token ids\\)"):
        Trainer(build_transformer(SMOKE_SHAPE), with_value(x, (3, 2), bad), t, 8, CPU)
    with pytest.raises(DataError, match=rf"^inputs\[4, {LENGTH + 1}\]=.* \(tgt_embed reads columns {LENGTH}\.\."):
        Trainer(build_transformer(SMOKE_SHAPE), with_value(x, (4, LENGTH + 1), bad), t, 8, CPU)


@pytest.mark.parametrize("bad", [VOCAB, -1, 3.5])
def test_a_trainer_refuses_target_ids_outside_the_vocabulary(corpus, no_allocation, bad):
    x, t = corpus
    with pytest.raises(DataError, match=rf"^targets\[3, 2\]={bad}(\.0)? is not accepted; use a whole number in "
                                        rf"0\.\.{VOCAB - 1}, or the padding id 0 \(token ids into the vocabulary"):
        Trainer(build_transformer(SMOKE_SHAPE), x, with_value(t, (3, 2), bad), 8, CPU)


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.int64, np.float32])
def test_ids_of_any_integer_dtype_or_integral_floats_train(corpus, dtype):
    x, t = corpus
    losses = Trainer(build_transformer(SMOKE_SHAPE), x.astype(dtype), t.astype(dtype), 8, CPU).train(1)
    assert np.isfinite(losses).all()


def test_a_predictor_refuses_bad_ids_and_stays_usable(corpus):
    x, _ = corpus
    predictor = Predictor(build_transformer(SMOKE_SHAPE), CPU)
    expected = predictor.predict(x[:4])
    with pytest.raises(DataError, match=r"^inputs\[1, 0\]=-1.0 is not accepted; use a whole number in"):
        predictor.predict(with_value(x[:4], (1, 0), -1))
    workspace = ResidentPredictor(predictor, 4)
    with pytest.raises(DataError, match=rf"^inputs\[0, 3\]={VOCAB}.0 is not accepted"):
        workspace.load(with_value(x[:4], (0, 3), VOCAB))
    np.testing.assert_array_equal(predictor.predict(x[:4]), expected)


def classifier_data(samples: int = 40, classes: int = 3):
    rng = np.random.default_rng(2)
    labels = np.arange(samples) % classes
    return rng.standard_normal((samples, 6)).astype(np.float32), np.eye(classes, dtype=np.float32)[labels]


@pytest.mark.parametrize("row, match", [([-1.0, 2.0, 0.0], r"^targets\[5, 0\]=-1.0 is not accepted"),
                                        ([5.0, 0.0, 0.0], r"^targets\[5\] \(a row summing to 5\) is not accepted")])
def test_a_trainer_refuses_softmax_targets_that_are_not_probabilities(no_allocation, row, match):
    x, t = classifier_data()
    with pytest.raises(DataError, match=match):
        Trainer(Sequential([Dense(3)], SoftmaxCrossEntropy(), (6,)), x, with_value(t, 5, row), 8, CPU)


def test_one_hot_and_soft_targets_train():
    x, t = classifier_data()
    soft = 0.9 * t + 0.1 / 3   # label smoothing: still rows of probabilities
    for targets in (t, soft):
        trainer = Trainer(Sequential([Dense(3)], SoftmaxCrossEntropy(), (6,)), x, targets, 8, CPU)
        assert np.isfinite(trainer.train(1)).all()
