"""The token corpus (data/formats/token_corpus.py): reading, bad lines named, the generator, teacher forcing, training.

Tests write their own small corpus files. A bad line (no tab, a non-integer,
an id outside the vocabulary, a side too long, a ragged side without a
padding id, an empty side) and an empty corpus are errors naming the file and
line; nothing is returned. The generated corpus is learnable: a few epochs of
the smoke-size model on the CPU bring the loss well down.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from gpuengine.config import EngineConfig
from gpuengine.data.checks import DataError
from gpuengine.data.formats.token_corpus import (BOS_ID, FIRST_CONTENT_ID, read_corpus, synthetic_corpus,
    teacher_forcing, write_corpus)
from gpuengine.trainer import Trainer
from gpuengine.workloads import transformer


def test_written_corpus_reads_back(tmp_path):
    source, target = synthetic_corpus(5, vocab=20, length=6, seed=1)
    write_corpus(tmp_path / "c.tsv", source, target)
    read_source, read_target = read_corpus(tmp_path / "c.tsv", vocab=20, length=6)
    np.testing.assert_array_equal(read_source, source)
    np.testing.assert_array_equal(read_target, target)


def test_short_lines_are_padded_when_a_padding_id_is_given(tmp_path):
    (tmp_path / "c.tsv").write_text("3 4\t5\n\n6 7 8\t9 9 9\n")
    source, target = read_corpus(tmp_path / "c.tsv", vocab=10, length=3, pad_id=0)
    np.testing.assert_array_equal(source, [[3, 4, 0], [6, 7, 8]])
    np.testing.assert_array_equal(target, [[5, 0, 0], [9, 9, 9]])


@pytest.mark.parametrize("text, pad_id, message", [
    ("2 3\t4 5\n2 3 4 5\n", None, r"c.tsv:2: expected source<TAB>target"),
    ("2 3\t4 x\n", None, r"c.tsv:1: target token 'x' is not an integer"),
    ("2 3\t4 5\n2 12\t4 5\n", None, r"c.tsv:2: source token 12 is outside the vocabulary 0..9"),
    ("2 -1\t4 5\n", None, r"c.tsv:1: source token -1 is outside"),
    ("2 3\t4 5 6\n", 0, r"c.tsv:1: the target side has 3 tokens, more than the sequence length 2"),
    ("2 3\t4 5\n2\t4 5\n", None, r"c.tsv:2: ragged line: the source side has 1 tokens, not 2"),
    ("2 3\t\n", 0, r"c.tsv:1: the target side is empty"),
    ("\n\n", None, r"c.tsv: the corpus is empty"),
])
def test_bad_corpus_is_an_error_naming_the_line(tmp_path, text, pad_id, message):
    (tmp_path / "c.tsv").write_text(text)
    with pytest.raises(DataError, match=message):
        read_corpus(tmp_path / "c.tsv", vocab=10, length=2, pad_id=pad_id)


@pytest.mark.parametrize("pad_id", [999, 10, -1, 2.0, True, "0"])
def test_a_padding_id_outside_the_vocabulary_is_refused_before_reading(tmp_path, pad_id):
    """999 and -1 were padded into the arrays unchecked; the source's padding reaches the embedding."""
    (tmp_path / "c.tsv").write_text("2 3\t4\n")
    with pytest.raises(DataError, match=rf"^pad_id={re.escape(repr(pad_id))} is not accepted; use a token id in "
                                        r"0\.\.9 \(padding is embedded like any token\), or None$"):
        read_corpus(tmp_path / "c.tsv", vocab=10, length=3, pad_id=pad_id)


@pytest.mark.parametrize("kwargs, given", [(dict(vocab="10", length=3), "vocab='10'"),
                                           (dict(vocab=10, length=0), "length=0")])
def test_vocab_and_length_are_whole_numbers(tmp_path, kwargs, given):
    with pytest.raises(DataError, match=rf"^{given} is not accepted; use a whole number >= 1$"):
        read_corpus(tmp_path / "c.tsv", **kwargs)
    with pytest.raises(DataError, match=rf"^{given} is not accepted"):
        synthetic_corpus(4, **kwargs)


def test_missing_corpus_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(DataError, match="missing.tsv: cannot read"):
        read_corpus(tmp_path / "missing.tsv", vocab=10, length=2)


def test_generated_target_is_a_fixed_substitution_of_the_source():
    source, target = synthetic_corpus(64, vocab=30, length=9, seed=2)
    assert source.min() >= FIRST_CONTENT_ID and source.max() < 30
    table = {}
    for s, t in zip(source.ravel(), target.ravel()):
        assert table.setdefault(s, t) == t
    assert len(set(table.values())) == len(table)   # a permutation: nothing is lost


def test_teacher_forcing_shifts_the_target_behind_bos():
    source = np.array([[2, 3, 4]])
    target = np.array([[5, 6, 7]])
    x, t = teacher_forcing(source, target)
    np.testing.assert_array_equal(x, [[2, 3, 4, BOS_ID, 5, 6]])
    np.testing.assert_array_equal(t, [[5, 6, 7]])
    assert x.dtype == t.dtype == np.float32


def test_bf16_refuses_a_vocabulary_its_ids_cannot_hold():
    from gpuengine.layers import TokenEmbedding
    from correctness_tests.layer_harness import run_layer
    with pytest.raises(ValueError, match="bf16"):
        run_layer(TokenEmbedding(300, 4, 0, 2, name="e"), np.zeros((1, 2)), np.zeros((1, 2, 4)), precision="bf16")


def test_the_generated_corpus_is_learnable_on_the_cpu():
    shape = transformer.SMOKE_SHAPE
    x, t = transformer.transformer_data(64, shape, seed=3)
    trainer = Trainer(transformer.build_transformer(shape), x, t, 16,
                      EngineConfig(device="cpu", precision="fp32", cuda_graph=0), lr=1e-2, seed=4)
    losses = trainer.train(40)
    assert losses[0] == pytest.approx(math.log(shape.vocab), abs=1.0)
    assert losses[-1] < 0.1 * math.log(shape.vocab), losses   # far below chance: the substitution was learnt
