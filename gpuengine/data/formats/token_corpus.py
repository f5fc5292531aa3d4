"""The tab-separated token corpus of seed note 004: reader, learnable generator, teacher forcing.

One sample per line: the source token ids, a tab, the target token ids, each
side space-separated integers. The reader checks everything before anything is
returned, and a bad line is an error naming the file, the line and the value:
a missing tab, a token that is not an integer or lies outside the vocabulary,
a side longer than the sequence length, ragged sides (shorter than the
sequence length where no padding id is given), and an empty corpus. The
arguments are checked first: vocab and length whole numbers >= 1, and the
padding id a token id in the vocabulary, since padding is read like any token.

Ids 0 and 1 are reserved by convention: PAD_ID pads short sides, BOS_ID starts
the decoder input. The generator writes a corpus the model can learn: the
target is a fixed substitution of the source, position by position
(target[i] = table[source[i]]), so cross-attention can drive the loss far
below ln(vocab). Teacher forcing (Vaswani et al. 2017; Williams & Zipser 1989)
feeds the decoder the target shifted right behind BOS and asks it for the
target itself: the network's input row is [source | BOS, target[:-1]] and its
target row is the target (data arrays of float32 ids, the engine's input format).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import checks
from ..checks import DataError

PAD_ID, BOS_ID = 0, 1
FIRST_CONTENT_ID = 2   # ids below are reserved


def _parse_side(text: str, path, number: int, side: str, vocab: int, length: int, pad_id) -> list[int]:
    tokens = []
    for word in text.split():
        try:
            token = int(word)
        except ValueError:
            raise DataError(f"{path}:{number}: {side} token {word!r} is not an integer") from None
        if not 0 <= token < vocab:
            raise DataError(f"{path}:{number}: {side} token {token} is outside the vocabulary 0..{vocab - 1}")
        tokens.append(token)
    if not tokens:
        raise DataError(f"{path}:{number}: the {side} side is empty")
    if len(tokens) > length:
        raise DataError(f"{path}:{number}: the {side} side has {len(tokens)} tokens, more than the sequence "
                        f"length {length}")
    if len(tokens) < length and pad_id is None:
        raise DataError(f"{path}:{number}: ragged line: the {side} side has {len(tokens)} tokens, not {length} "
                        "(give a padding id to pad short lines)")
    return tokens + [pad_id] * (length - len(tokens))


def read_corpus(path, vocab: int, length: int, pad_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) int32 arrays (samples, length); short sides padded with `pad_id` if given."""
    vocab, length = checks.whole("vocab", vocab, error=DataError), checks.whole("length", length, error=DataError)
    if pad_id is not None and not (checks.is_whole(pad_id) and 0 <= pad_id < vocab):
        # The source's padding reaches the embedding: an id outside the table cannot be read.
        checks.refuse("pad_id", pad_id, f"a token id in 0..{vocab - 1} (padding is embedded like any token), or None",
                      DataError)
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read the corpus: {exc}") from exc
    sources, targets = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise DataError(f"{path}:{number}: expected source<TAB>target, found {len(parts) - 1} tabs")
        sources.append(_parse_side(parts[0], path, number, "source", vocab, length, pad_id))
        targets.append(_parse_side(parts[1], path, number, "target", vocab, length, pad_id))
    if not sources:
        raise DataError(f"{path}: the corpus is empty (no sample lines)")
    return np.array(sources, np.int32), np.array(targets, np.int32)


def write_corpus(path, source: np.ndarray, target: np.ndarray):
    """One `source<TAB>target` line per sample (the reader's format)."""
    lines = [" ".join(map(str, s)) + "\t" + " ".join(map(str, t)) for s, t in zip(source, target)]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def synthetic_corpus(samples: int, vocab: int, length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random sources over the content ids and their fixed position-wise substitution as targets."""
    samples, length = checks.whole("samples", samples, error=DataError), checks.whole("length", length, error=DataError)
    vocab, seed = checks.whole("vocab", vocab, error=DataError), checks.seed("seed", seed, DataError)
    if vocab <= FIRST_CONTENT_ID:
        raise DataError(f"vocab {vocab} leaves no content ids (0..{FIRST_CONTENT_ID - 1} are reserved)")
    rng = np.random.default_rng(seed)
    content = np.arange(FIRST_CONTENT_ID, vocab)
    table = np.zeros(vocab, np.int64)
    table[content] = rng.permutation(content)
    source = rng.integers(FIRST_CONTENT_ID, vocab, (samples, length))
    return source.astype(np.int32), table[source].astype(np.int32)


def teacher_forcing(source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x = [source | BOS, target[:-1]] and t = target, float32 ids (the engine's data arrays)."""
    if source.ndim != 2 or target.ndim != 2 or len(source) != len(target):
        raise DataError(f"source {source.shape} and target {target.shape} must be (samples, length) of one count")
    shifted = np.concatenate([np.full((len(target), 1), BOS_ID), target[:, :-1]], axis=1)
    x = np.concatenate([source, shifted], axis=1).astype(np.float32)
    return x, target.astype(np.float32)
