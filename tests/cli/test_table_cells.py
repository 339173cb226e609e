"""Table cells measured as a terminal draws them (rich's cell width): a wide CJK character takes
two columns, a combining accent none, so columns stay aligned and shortened text fits."""

from __future__ import annotations

import pytest

from tpuctl.cli.views.table import Column, display_width, render, shorten_end, shorten_middle

COMBINING = "cafe\u0301"  # "café" with a combining acute accent: 5 code points, 4 columns
WIDE = "漢字"  # 2 code points, 4 columns


@pytest.mark.parametrize(
    ("text", "columns"),
    [("plain", 5), (COMBINING, 4), (WIDE, 4), ("a\u200bb", 2), ("", 0)],
)
def test_display_width_is_the_terminals(text: str, columns: int) -> None:
    assert display_width(text) == columns


def test_columns_stay_aligned_past_wide_and_combining_characters() -> None:
    rows = [(COMBINING, "one"), (WIDE, "two"), ("plain", "three")]
    lines = render([Column("NAME"), Column("NOTE")], rows, width=None).splitlines()
    body = zip(lines[1:], rows, strict=True)
    starts = {display_width(line[: line.index(note)]) for line, (_, note) in body}
    assert starts == {display_width("plain  ")}, lines  # one start, after the widest NAME


def test_shortened_text_fits_its_columns() -> None:
    text = WIDE * 10 + COMBINING * 5
    for width in range(2, 30):
        assert display_width(shorten_middle(text, width)) <= width
        assert display_width(shorten_end(text, width)) <= width
    assert shorten_middle(COMBINING, 4) == COMBINING  # fits: nothing cut
