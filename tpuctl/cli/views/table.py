"""Tables that read at any width: one line per row, always.

On a terminal the table is sized to its width, giving way in this order: free text (a last
output line, a reason, a fix) is shortened in the middle (`step 120/…loss=2.31`) down to its
floor; then the less important columns are left out (each column says how soon, `drop`; then
from the right); and only when the identifying columns alone are wider than the terminal is a
line cut at its edge. Short values (states, durations, numbers, times) are never shortened,
identifying columns (a name, slice/worker) never shortened nor left out, and a cell never
shows two ellipses. In a pipe, and with `--format wide` (every column, asked for: as
`kubectl -o wide`, however long the lines), every value is whole and every row is one line,
columns padded with spaces, the way `kubectl get` prints, so `grep` and `awk` see whole rows.

What a worker or the API wrote reaches a cell escaped (`\\x1b[31m`, `\\x07`, `\\u202e`): a table
never sends a terminal a control sequence. Plain string work (rich only measures text that is
not ASCII): a table of 1,024 rows draws in milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ELLIPSIS = "…"
GAP = "  "
# Shown escaped in a cell: C0 and C1 control characters (ESC starts every terminal escape
# sequence), DEL, the bidirectional overrides that reorder the rest of a line, and lone
# surrogates (bytes that were not UTF-8, decoded with surrogateescape).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
FREE_TEXT_MINIMUM = 12  # free text is never shortened below this many columns


@dataclass(frozen=True)
class Column:
    header: str
    identity: bool = False  # names and slice/worker: never shortened, never left out
    align: Literal["left", "right"] = "left"
    wide: bool = False  # shown only with --format wide
    # Free text (a last output line, a reason, a fix): shortened in the middle to fit, down
    # to `minimum`. Other columns (states, durations, numbers, ids) are whole or not shown.
    shrink: bool = False
    minimum: int = FREE_TEXT_MINIMUM
    # Left out on a terminal too narrow for the table once its free text is as short as it
    # goes, the highest first; columns with 0 go after those, from the right. --format wide
    # or a pipe shows every column.
    drop: int = 0


def clean(value: object) -> str:
    """A cell's text on one line, safe for a terminal: line breaks and tabs as spaces, a
    carriage return's overwritten text left out (a progress bar shows its last state), and
    every other control character escaped (`\\x1b`)."""
    text = str(value)
    if text.isprintable():
        return text
    lines = text.replace("\r\n", "\n").split("\n")
    text = " ".join(_after_carriage_return(line) for line in lines).replace("\t", " ")
    return _UNSAFE.sub(_escaped, text)


def _after_carriage_return(line: str) -> str:
    stripped = line.rstrip("\r")
    return stripped.rsplit("\r", 1)[-1]


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """Prose (a note, a message, an error line) safe for a terminal: each line that holds a
    control character as `clean` makes a cell; the line breaks stay."""
    if text.isprintable():
        return text
    return "\n".join(line if line.isprintable() else clean(line) for line in text.split("\n"))


def display_width(text: str) -> int:
    """Columns the text takes on a terminal: rich's cell width (wide East Asian characters
    take two, combining and zero-width ones none)."""
    if text.isascii():  # printable ASCII (clean() escapes the rest): one column each
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


def shorten_middle(text: str, width: int) -> str:
    """`text` in at most `width` columns, its middle replaced by `…`; a text already cut
    (holding an ellipsis) loses more around that ellipsis, so one ellipsis is ever shown."""
    if display_width(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    keep = width - 1
    if ELLIPSIS in text:
        head, _, tail = text.partition(ELLIPSIS)
        tail = tail.replace(ELLIPSIS, "")
    else:
        head = text[: (keep + 1) // 2]
        tail = text[len(text) - keep // 2 :] if keep // 2 else ""
    while display_width(head) + display_width(tail) > keep and (head or tail):
        if (len(head) >= len(tail) and head) or not tail:
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
    None in a pipe (full values). `wide` shows the wide-only columns too, every value whole
    as in a pipe. How a table fits a terminal: the module docstring."""
    if wide:
        width = None
    shown = [i for i, column in enumerate(columns) if wide or not column.wide]
    cells_all = [[clean(value) for value in row] for row in rows]
    natural_all = [
        max([display_width(column.header)] + [display_width(row[i]) for row in cells_all])
        for i, column in enumerate(columns)
    ]
    leaving = [] if width is None else _leaving_order(columns, shown)
    while True:
        heads = [columns[i] for i in shown]
        natural = [natural_all[i] for i in shown]
        widths = natural if width is None else _fit(heads, natural, width)
        if width is None or _total(widths) <= width or not leaving:
            break
        shown.remove(leaving.pop(0))
    cells = [[row[i] for i in shown] for row in cells_all]
    lines = [_line([c.header for c in heads], heads, widths, natural)]
    lines += [_line(row, heads, widths, natural) for row in cells]
    if width is not None:
        # Only identifying columns are left, and they are wider than the terminal.
        lines = [
            line if display_width(line) <= width else shorten_end(line, width) for line in lines
        ]
    return "\n".join(lines) + "\n"


def _leaving_order(columns: Sequence[Column], shown: list[int]) -> list[int]:
    """The columns a narrow terminal leaves out, first to last: by `drop`, the highest first,
    then the rest from the right; never an identifying column."""
    ranked = [i for i in shown if columns[i].drop and not columns[i].identity]
    ranked.sort(key=lambda i: -columns[i].drop)
    rest = [i for i in reversed(shown) if not columns[i].drop and not columns[i].identity]
    return ranked + rest


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
    """Column widths within `width`: the widest free-text columns give up room first, none
    below its floor (its `minimum`, or its header)."""
    widths = list(natural)
    budget = width - len(GAP) * (len(widths) - 1)
    excess = sum(widths) - budget
    flexible = [k for k, column in enumerate(columns) if column.shrink and not column.identity]
    while excess > 0:
        candidates = [k for k in flexible if widths[k] > _floor(columns[k])]
        if not candidates:
            break  # free text is as short as it goes: the caller leaves a column out
        widest = max(candidates, key=lambda k: widths[k])
        floor = _floor(columns[widest])
        others = [widths[k] for k in candidates if k != widest]
        target = max(floor, max(others) if others else floor, widths[widest] - excess)
        if target >= widths[widest]:
            target = widths[widest] - 1
        excess -= widths[widest] - target
        widths[widest] = target
    return widths


def _floor(column: Column) -> int:
    return max(column.minimum, display_width(column.header))


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
