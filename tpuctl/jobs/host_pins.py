"""The host-key pins of deleted nodes, forgotten: tpuctl's own known-hosts file
(tpuctl.fanout.known_hosts) pins each worker as `tpu.<node id>-<worker>`, the node's unique
numeric id, so the pins of a node tpuctl saw deleted can be told apart from every other line
and removed. Only those: a pin says neither project nor zone, so a node tpuctl did not see go
may be another project's, alive, and its pin is kept."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from pathlib import Path

from tpuctl.fanout.known_hosts import KnownHostsFile
from tpuctl.files import locked, write_atomic

_ALIAS = re.compile(r"^tpu\.(\d+)-\d+$")


def pins_of(path: Path, node_uids: Collection[int]) -> list[str]:
    """The aliases pinned in `path` for the nodes whose numeric ids are `node_uids`, sorted.
    Raises AuthError for a file tpuctl refuses to read (as every SSH command would)."""
    wanted = {str(uid) for uid in node_uids if uid}
    return sorted(
        alias
        for alias in KnownHostsFile(path).read()
        if (match := _ALIAS.match(alias)) and match.group(1) in wanted
    )


def forget(path: Path, aliases: Sequence[str]) -> list[str]:
    """Remove every line pinning only `aliases` from `path`, under the lock every tpuctl
    writing it takes, in one atomic rewrite; the aliases that were there."""
    gone = set(aliases)
    if not gone or not path.exists():
        return []
    KnownHostsFile(path).read()  # its ownership and mode checked, as for any use
    with locked(path):  # the lock every tpuctl writing the file takes
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        kept, removed = [], set()
        for line in lines:
            fields = line.split()
            hosts = set(fields[0].split(",")) if len(fields) >= 3 else set()
            if hosts and not line.startswith(("#", "@", "|")) and hosts <= gone:
                removed |= hosts
                continue
            kept.append(line)
        if removed:
            write_atomic(path, "".join(line + "\n" for line in kept), mode=0o600)
    return sorted(removed)
