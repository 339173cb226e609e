"""How a table gives way on a narrow terminal: free text is shortened first, then the less
important columns are left out, and short values (states, durations, numbers) are never cut;
a cell never shows two ellipses; what a worker or the API wrote reaches a cell escaped."""

from __future__ import annotations

import pytest

from tpuctl.cli.views.table import ELLIPSIS, Column, clean, display_width, render

# ps --job's columns, as its view declares them (the view is the subject of the last test).
WORKER = Column("WORKER", identity=True)
NOTE = "bad bytes and a long line the trainer printed at its last step, cut mark at the end…"
ROWS = [
    ["0/0", "running", "1", "15008", "51s ago", "-", "12m30s ago", NOTE],
    ["1/1", "setup-failed", "2", "9", "2h03m ago", "1", "3s ago", "no job log for run x"],
]


def _ps_job_columns() -> tuple[Column, ...]:
    from tpuctl.cli.views.fanout import PROBE_HEAD, PROBE_TAIL, PROBES

    middle, _fill = PROBES["job-status"]
    return (*PROBE_HEAD, *middle, *PROBE_TAIL)


def _table(width: int) -> list[str]:
    columns = _ps_job_columns()
    shown = [c for c in columns if not c.wide]
    assert [c.header for c in shown][:2] == ["WORKER", "STATE"]
    rows = [[row[0], "x", "x", *row[1:7], "0.1s", row[7]] for row in ROWS]
    return render(columns, rows, width=width).splitlines()


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


@pytest.mark.parametrize("width", range(30, 121, 3))
def test_short_values_stay_whole_and_less_important_columns_go_first(width: int) -> None:
    lines = _table(width)
    assert all(display_width(line) <= width for line in lines), lines
    header, *rows = lines
    for line in rows:
        for cell in _cells(line):
            assert cell.count(ELLIPSIS) <= 1, (width, line)
            # Only the free text (the last output) is ever shortened.
            if ELLIPSIS in cell and not NOTE.endswith(cell[-10:]):
                assert cell.startswith(("bad", "no job")), (width, cell)
    # The state is what a person reads first: whole, at every width.
    assert "running" in rows[0] and "setup-failed" in rows[1], (width, lines)
    # A duration is either whole or not shown.
    shown = " ".join(rows)
    assert "12m30s ago" in shown or "HEARTBEAT" not in header, (width, lines)
    assert "12m" not in shown or "12m30s ago" in shown, (width, lines)


def test_at_60_columns_the_state_is_whole_and_a_detail_column_made_room() -> None:
    header, *rows = _table(60)
    assert "run…ng" not in "".join(rows)
    assert rows[0].split()[1] == "running"
    assert len(_cells(header)) < 8, header  # something less important was left out


def test_a_value_that_is_already_cut_is_cut_at_its_own_ellipsis() -> None:
    text = render([Column("A", identity=True), Column("NOTE", shrink=True)],
                  [["x", "a" * 40 + ELLIPSIS]], width=25)  # fmt: skip
    cell = text.splitlines()[1].split("  ", 1)[1]
    assert cell.count(ELLIPSIS) == 1 and cell.endswith(ELLIPSIS), cell


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mRED\x1b[0m", "\\x1b[31mRED\\x1b[0m"),
        ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
        ("csi\x9b31m", "csi\\x9b31m"),
        ("title \x1b]0;pwned\x07", "title \\x1b]0;pwned\\x07"),
        ("evil \u202eabc", "evil \\u202eabc"),
        ("bytes \udcff\udcfe", "bytes \\xff\\xfe"),  # undecodable bytes, surrogate-escaped
        ("10%\r20%\r30%", "30%"),  # what a terminal shows of a progress bar
        ("two\nlines\ttabbed", "two lines tabbed"),
        ("plain text, café, 漢字", "plain text, café, 漢字"),
    ],
)
def test_cells_show_control_characters_escaped(raw: str, shown: str) -> None:
    assert clean(raw) == shown
    line = render([Column("NOTE")], [[raw]], width=None).splitlines()[1]
    assert line == shown and line.isprintable()


def test_wide_on_a_terminal_is_every_column_whole() -> None:
    """--format wide asks for everything: nothing left out, shortened or cut, as in a pipe."""
    columns = _ps_job_columns()
    rows = [[row[0], "x", "x", *row[1:7], "0.1s", row[7]] for row in ROWS]
    wide = render(columns, rows, width=40, wide=True)
    assert wide == render(columns, rows, width=None, wide=True)
    assert ELLIPSIS + "\n" in wide and wide.count(ELLIPSIS) == 1  # the note's own cut mark
