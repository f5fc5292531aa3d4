"""optim.gradient_rows: the table by which Adam reads bf16 gradients where the convolutions left them, covering the
flat buffer in order with rows that start on multiples of four, and spans that do not fit refused by name."""
from __future__ import annotations

import pytest

from gpuengine.optim import gradient_rows


def covered(rows) -> list[int]:
    return [i for first, count, _ in rows for i in range(first, first + count)]


def test_rows_cover_the_buffer_in_order_and_narrow_spans_carry_their_own_addresses():
    rows = gradient_rows(200, [(64, 27, 0x1000), (128, 40, 0x2000)], row=16)
    assert covered(rows) == list(range(200))
    assert all(first % 4 == 0 or count < 4 for first, count, _ in rows)
    assert all(count <= 16 for _, count, _ in rows)
    # the first span: rows of 16 and 11 values, each address 2 bytes a value further on
    assert rows[4:6] == [(64, 16, 0x1000), (80, 11, 0x1000 + 32)]
    # its end at 91 leaves the gap's first row unaligned: that row's lead of one value goes alone
    assert rows[6] == (91, 1, 0) and rows[7] == (92, 16, 0)
    assert [row for row in rows if row[0] == 128] == [(128, 16, 0x2000)]
    assert rows[-2:] == [(168, 16, 0), (184, 16, 0)]   # the second span ends aligned: no lead


def test_no_narrow_spans_is_the_buffer_in_rows_of_its_own_gradient():
    assert gradient_rows(10, [], row=4) == [(0, 4, 0), (4, 4, 0), (8, 2, 0)]


@pytest.mark.parametrize("spans", [[(2, 8, 0x1000)], [(0, 8, 0x1000), (4, 8, 0x2000)], [(64, 200, 0x1000)],
                                   [(8, 0, 0x1000)]])
def test_a_span_off_four_overlapping_or_past_the_end_is_refused(spans):
    with pytest.raises(ValueError, match="does not fit the flat buffer of 200"):
        gradient_rows(200, spans)
