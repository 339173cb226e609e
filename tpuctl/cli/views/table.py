"""Tables that read at any width: one line per row, always.

On a terminal the table is sized to its width: columns that do not fit are shortened in the
middle (`projects/…/nodes/x-0`), never wrapped, and identifying columns (a name, slice/worker)
are never shortened. In a pipe every value is whole and every row is one line, columns padded
with spaces, the way `kubectl get` prints, so `grep` and `awk` see whole rows. Plain string
work (rich only measures text that is not ASCII): a table of 1,024 rows draws in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ELLIPSIS = "…"
GAP = "  "
# Control characters (a worker's output may hold terminal escapes) never reach a cell as such.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b.")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Column:
    header: str
    identity: bool = False  # names and slice/worker: never shortened
    align: Literal["left", "right"] = "left"
    wide: bool = False  # shown only with --format wide
    minimum: int = 6  # shortest a shortened column gets
    # Left out on a terminal too narrow for the table even with every column shortened, the
    # highest first (0: never); --format wide or a pipe shows it.
    drop: int = 0


def clean(value: object) -> str:
    """A cell's text on one line: terminal escapes dropped, control characters as spaces."""
    text = str(value)
    if not text.isprintable():
        text = _CONTROL.sub(" ", _ANSI.sub("", text))
    return text


def display_width(text: str) -> int:
    """Columns the text takes on a terminal: rich's cell width (wide East Asian characters
    take two, combining and zero-width ones none)."""
    if text.isascii():  # printable ASCII (clean() drops the rest): one column each
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


def shorten_middle(text: str, width: int) -> str:
    """`text` in at most `width` columns, its middle replaced by `…`."""
    if display_width(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    keep = width - 1
    head = text[: (keep + 1) // 2]
    tail = text[len(text) - keep // 2 :] if keep // 2 else ""
    while display_width(head) + display_width(tail) > keep and (head or tail):
        if len(head) >= len(tail) and head:
            head = head[:-1]
        else:
            tail = tail[1:]
    return head + ELLIPSIS + tail


def render(
    columns: Sequence[Column],
    rows: Sequence[Sequence[object]],
    *,
    width: int | None,
    wide: bool = False,
) -> str:
    """The table as text, one line per row plus the header. `width` is the terminal's, or
    None in a pipe (full values). `wide` shows the wide-only columns too. On a terminal the
    columns are shortened to fit, then droppable ones left out, and a line that still does not
    fit (identifying columns alone wider than the terminal) ends in `…` at the edge."""
    shown = [i for i, column in enumerate(columns) if wide or not column.wide]
    cells_all = [[clean(value) for value in row] for row in rows]
    while True:
        heads = [columns[i] for i in shown]
        cells = [[row[i] for i in shown] for row in cells_all]
        natural = [
            max([display_width(column.header)] + [display_width(row[k]) for row in cells])
            for k, column in enumerate(heads)
        ]
        if width is None:
            widths = natural
            break
        widths = _fit(heads, natural, width)
        droppable = [i for i in shown if columns[i].drop and not wide]
        if _total(widths) <= width or not droppable:
            break
        shown.remove(max(droppable, key=lambda i: columns[i].drop))
    lines = [_line([c.header for c in heads], heads, widths, natural)]
    lines += [_line(row, heads, widths, natural) for row in cells]
    if width is not None:
        lines = [
            line if display_width(line) <= width else shorten_end(line, width) for line in lines
        ]
    return "\n".join(lines) + "\n"


def _total(widths: Sequence[int]) -> int:
    return sum(widths) + len(GAP) * (len(widths) - 1)


def shorten_end(text: str, width: int) -> str:
    """`text` cut to `width` columns, ending in `…`."""
    kept, used = [], 0
    for ch in text:
        used += display_width(ch)
        if used > width - 1:
            break
        kept.append(ch)
    return "".join(kept) + ELLIPSIS


def _fit(columns: Sequence[Column], natural: list[int], width: int) -> list[int]:
    """Column widths within `width`: the widest shortenable columns give up room first."""
    widths = list(natural)
    budget = width - len(GAP) * (len(widths) - 1)
    excess = sum(widths) - budget
    flexible = [k for k, column in enumerate(columns) if not column.identity]
    while excess > 0:
        candidates = [
            k for k in flexible if widths[k] > max(columns[k].minimum, len(columns[k].header))
        ]
        if not candidates:
            break  # the identifying columns alone do not fit: let the terminal cut the line
        widest = max(candidates, key=lambda k: widths[k])
        floor = max(columns[widest].minimum, len(columns[widest].header))
        others = [widths[k] for k in candidates if k != widest]
        target = max(floor, max(others) if others else floor, widths[widest] - excess)
        if target >= widths[widest]:
            target = widths[widest] - 1
        excess -= widths[widest] - target
        widths[widest] = target
    return widths


def _line(
    values: Sequence[str], columns: Sequence[Column], widths: list[int], natural: list[int]
) -> str:
    parts = []
    last = len(values) - 1
    for k, (value, column) in enumerate(zip(values, columns, strict=True)):
        text = value if widths[k] >= natural[k] else shorten_middle(value, widths[k])
        pad = widths[k] - display_width(text)
        if column.align == "right":
            parts.append(" " * pad + text)
        elif k == last:
            parts.append(text)  # no trailing spaces
        else:
            parts.append(text + " " * pad)
    return GAP.join(parts).rstrip()


def pairs(items: Sequence[tuple[str, object]]) -> str:
    """`what  value` lines, the names padded to one width (a record, not a table)."""
    if not items:
        return ""
    width = max(display_width(name) for name, _ in items)
    return "".join(
        f"{name}{' ' * (width - display_width(name))}{GAP}{clean(item)}".rstrip() + "\n"
        for name, item in items
    )


def fit_lines(text: str, width: int) -> str:
    """A view's text for a terminal of `width` columns: table rows fit already (render); any
    longer line is prose (a headline, a note, a verdict), wrapped at spaces with its
    indentation kept and continuation lines indented two more. A pipe gets the text as is."""
    import textwrap

    out = []
    for line in text.split("\n"):
        if display_width(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip(" "))]
        wrapped = textwrap.wrap(
            line.strip(),
            width=width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
        )
        out.extend(shorten_end(piece, width) if display_width(piece) > width else piece
                   for piece in wrapped)  # fmt: skip
    return "\n".join(out)
