"""The zone claim of a first-active run: the one zone whose workers may run its job.

`<checkpoint.dir>/tpuctl/<run>/ZONE` (tpuctl.worker.zone_claim) holds a zone name. The startup
script of a spec whose zone_policy is first-active reads it at every boot and launches the job
only when it names the worker's own zone; tpuctl.jobs.zone_choice decides what it says. A
spec without a claim (any other spec) reads as unclaimed and cannot be claimed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.errors import NotFoundError
from tpuctl.worker import ZONE_FILE, record_dir, zone_claim

if TYPE_CHECKING:
    from tpuctl.spec.model import Spec
    from tpuctl.storage.storage import Storage


def _record(spec: Spec) -> Storage | None:
    from tpuctl.storage.locations import open_location

    record = record_dir(spec)
    if record is None or zone_claim(spec) is None:
        return None
    return open_location(record)


def claimed_zone(spec: Spec) -> str | None:
    """The zone the run is claimed for, or None (no claim, or none to make)."""
    record = _record(spec)
    if record is None:
        return None
    try:
        text = record.read_text(ZONE_FILE)
    except NotFoundError:
        return None
    return text.strip().splitlines()[0] if text.strip() else None


def claim_zone(spec: Spec, zone: str | None) -> bool:
    """Claim the run for `zone` (None: for no zone, so no worker starts it); False when the
    spec has no claim to make."""
    record = _record(spec)
    if record is None:
        return False
    if zone is None:
        record.delete(ZONE_FILE)
    else:
        record.write_text(ZONE_FILE, zone + "\n")
    return True
