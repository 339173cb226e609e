"""Where a checkpoint bucket is against the slices' region: the verdict, pure (reading the
bucket's metadata is tpuctl.storage.placement)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BucketPlacement:
    """Where the checkpoint bucket is against the slices' region (`plan --online`, create)."""

    bucket: str  # gs://name
    region: str  # the slices' region, from the zone
    location: str | None  # e.g. US-CENTRAL1, US, NAM4; None when it could not be read
    location_type: str | None  # region | dual-region | multi-region
    ok: bool
    warning: str | None = None


def region_of(zone: str) -> str:
    """`us-central2-b` → `us-central2`."""
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone


def judge_bucket(
    bucket: str,
    zone: str,
    *,
    location: str | None,
    location_type: str | None = None,
    data_locations: tuple[str, ...] = (),
    error: str | None = None,
) -> BucketPlacement:
    """ok when the bucket is in the slices' region (a regional bucket there, or a dual-region
    one that includes it); else a warning saying what each save and restore then costs."""
    region = region_of(zone)
    if location is None:
        return BucketPlacement(
            bucket,
            region,
            None,
            None,
            ok=False,
            warning=f"could not read the location of {bucket}: {error or 'unknown'}",
        )
    places = {location.lower(), *(place.lower() for place in data_locations)}
    ok = region.lower() in places
    kind = (location_type or "").lower() or "location"
    warning = None
    if not ok:
        warning = (
            f"checkpoint bucket {bucket} is in {location} ({kind}), the slices in {region}: "
            "every save and restore crosses regions (slower, and billed as network egress); "
            f"use a bucket in {region}"
        )
    return BucketPlacement(bucket, region, location, location_type, ok=ok, warning=warning)
