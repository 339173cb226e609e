"""Tables that read at any width: one line per row, always.

On a terminal the table is sized to its width: columns that do not fit are shortened in the
middle (`projects/…/nodes/x-0`), never wrapped, and identifying columns (a name, slice/worker)
are never shortened. In a pipe every value is whole and every row is one line, columns padded
with spaces, the way `kubectl get` prints, so `grep` and `awk` see whole rows. Plain string
work, no rich: a table of 1,024 rows draws in milliseconds.
"""

from __future__ import annotations

import re
import unicodedata
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


def clean(value: object) -> str:
    """A cell's text on one line: terminal escapes dropped, control characters as spaces."""
    text = str(value)
    if not text.isprintable():
        text = _CONTROL.sub(" ", _ANSI.sub("", text))
    return text


def display_width(text: str) -> int:
    """Columns the text takes on a terminal (wide East Asian characters take two)."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


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
    None in a pipe (full values). `wide` shows the wide-only columns too."""
    shown = [i for i, column in enumerate(columns) if wide or not column.wide]
    heads = [columns[i] for i in shown]
    cells = [[clean(row[i]) for i in shown] for row in rows]
    natural = [
        max([display_width(column.header)] + [display_width(row[k]) for row in cells])
        for k, column in enumerate(heads)
    ]
    widths = natural if width is None else _fit(heads, natural, width)
    lines = [_line([c.header for c in heads], heads, widths, natural)]
    lines += [_line(row, heads, widths, natural) for row in cells]
    return "\n".join(lines) + "\n"


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
