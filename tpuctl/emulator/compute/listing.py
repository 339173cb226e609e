"""List responses of the fake Compute Engine: the simple form of its `filter` expressions, and a
page of `maxResults` from `pageToken`, which every list method answers with."""

from __future__ import annotations

import json
from typing import Any

from tpuctl.emulator.compute.errors import invalid

PAGE_SIZE = 500


def page(
    kind: str, self_link: str, items: list[dict[str, Any]], query: dict[str, str]
) -> dict[str, Any]:
    """A list response: `filter` applied, then a page of `maxResults` from `pageToken`."""
    items = [item for item in items if matches(item, query.get("filter", ""))]
    try:
        size = min(int(query.get("maxResults") or PAGE_SIZE), PAGE_SIZE)
        start = int(query.get("pageToken") or 0)
    except ValueError:
        raise invalid("Invalid value for field 'pageToken' or 'maxResults'.") from None
    if size <= 0 or start < 0:
        raise invalid("Invalid value for field 'maxResults'.")
    page = items[start : start + size]
    body: dict[str, Any] = {"kind": kind, "id": self_link, "items": page, "selfLink": self_link}
    if start + size < len(items):
        body["nextPageToken"] = str(start + size)
    return body


def matches(item: dict[str, Any], expression: str) -> bool:
    """Compute Engine's list filter, the simple form: `field = value` or `field != value`
    (quotes optional, a dotted path into the resource), several joined by spaces or AND."""
    import re
    import shlex

    if not expression.strip():
        return True
    try:
        words = [w for w in shlex.split(expression.replace("(", " ").replace(")", " "))]
    except ValueError:
        raise invalid(f"Invalid value for field 'filter': '{expression}'.") from None
    words = [w for w in words if w.upper() != "AND"]
    joined = " ".join(words)
    for field, op, value in re.findall(r"([\w.]+)\s*(!=|=|eq|ne)\s*(\S+)", joined):
        current: Any = item
        for part in field.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        text = json.dumps(current) if isinstance(current, bool) else str(current)
        equal = text == value or (isinstance(current, bool) and text == value.lower())
        if (op in ("=", "eq")) != equal:
            return False
    return True
