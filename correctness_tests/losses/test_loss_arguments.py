"""Losses refuse a bad setting when made, and say what targets they can read (asked by Network.check_data).

The target checks themselves are data/checks.py's (tested in data/test_checks.py);
here: that each loss asks for the right one, with its vocabulary and padding id.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpuengine.checks import ArgumentError
from gpuengine.data.checks import DataError
from gpuengine.losses import MSELoss, SoftmaxCrossEntropy, TokenCrossEntropy


@pytest.mark.parametrize("pad_id", [-1, 1.0, True, "0"])
def test_a_padding_id_that_is_not_a_token_id_is_refused(pad_id):
    with pytest.raises(ArgumentError, match=rf"^pad_id={pad_id!r} is not accepted; use a token id \(a whole number "
                                            r">= 0\), or None for no padding$"):
        TokenCrossEntropy(pad_id=pad_id)


def test_token_targets_are_ids_of_the_logits_vocabulary_or_the_padding_id():
    loss = TokenCrossEntropy(pad_id=np.int64(40))
    assert loss.pad_id == 40 and type(loss.pad_id) is int
    loss.check_targets(np.array([[0, 9, 40]], np.float32), (3, 10))   # the padding id may lie outside the vocabulary
    with pytest.raises(DataError, match=r"^targets\[0, 1\]=10.0 is not accepted; use a whole number in 0\.\.9, or "
                                        r"the padding id 40"):
        loss.check_targets(np.array([[0, 10, 40]], np.float32), (3, 10))


def test_softmax_targets_are_probability_rows_and_mse_targets_anything_finite():
    SoftmaxCrossEntropy().check_targets(np.eye(3, dtype=np.float32), (3,))
    with pytest.raises(DataError, match=r"^targets\[1\] \(a row summing to 2\) is not accepted"):
        SoftmaxCrossEntropy().check_targets(np.array([[1.0, 0.0], [1.0, 1.0]], np.float32), (2,))
    assert not hasattr(MSELoss(), "check_targets")
