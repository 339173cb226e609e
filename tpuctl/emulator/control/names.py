"""Resource names (`projects/P/locations/Z/{queuedResources,nodes,operations}/ID`) and the
worker ids of a node, as requests spell them."""

from __future__ import annotations

import re

from tpuctl.emulator.control.status import invalid

PROJECT = re.compile(r"^projects/([^/]+)$")
PARENT = re.compile(r"^projects/([^/]+)/locations/([^/]+)$")
_CHILD = re.compile(r"^projects/([^/]+)/locations/([^/]+)/([A-Za-z]+)/([^/]+)$")
QR_ID = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
NODE_ID = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # GCE naming


def parse_project(name: str) -> str:
    """`projects/p` → p (the name ListLocations takes); INVALID_ARGUMENT otherwise."""
    match = PROJECT.match(name)
    if match is None:
        raise invalid(f'Invalid name "{name}": expected projects/PROJECT')
    return match.group(1)


def parse_parent(parent: str) -> tuple[str, str]:
    """`projects/p/locations/z` → (p, z); INVALID_ARGUMENT otherwise."""
    match = PARENT.match(parent)
    if match is None:
        raise invalid(f'Invalid parent "{parent}": expected projects/PROJECT/locations/ZONE')
    return match.group(1), match.group(2)


def parse_child(name: str, collection: str) -> tuple[str, str, str]:
    """`projects/p/locations/z/<collection>/id` → (p, z, id); INVALID_ARGUMENT otherwise."""
    match = _CHILD.match(name)
    if match is None or match.group(3) != collection:
        raise invalid(
            f'Invalid resource name "{name}": expected projects/PROJECT/locations/ZONE/'
            f"{collection}/ID"
        )
    return match.group(1), match.group(2), match.group(4)


def parent_matches(pattern: str, parent: str) -> bool:
    """List parents may use `-` for any project or zone, as Google APIs do."""
    want = pattern.split("/")
    have = parent.split("/")
    return len(want) == len(have) and all(w in ("-", h) for w, h in zip(want, have, strict=True))


def worker_indexes(worker_ids: list[str], count: int, *, allow_all: bool) -> list[int]:
    """Worker ids as sent ("0", "3") → indexes of a node with `count` workers; none sent means
    every worker when `allow_all`, else none."""
    if not worker_ids:
        return list(range(count)) if allow_all else []
    result = []
    for text in worker_ids:
        if not text.strip().isdigit() or int(text) >= count:
            raise invalid(f'Invalid worker id "{text}": the node has workers 0-{count - 1}')
        result.append(int(text))
    return result
