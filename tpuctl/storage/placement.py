"""Where a checkpoint bucket lives, against the slices' region (the arithmetic of the verdict
is tpuctl.plan.judge_bucket): `plan --online` and create ask before buying capacity."""

from __future__ import annotations

from tpuctl.errors import TpuctlError
from tpuctl.plan import BucketPlacement, judge_bucket


def bucket_placement(url: str, zone: str) -> BucketPlacement | None:
    """The placement of the bucket of `url` (gs://bucket/…) for slices in `zone`; None for a
    location that is not in Cloud Storage. A bucket whose metadata cannot be read (no
    storage.buckets.get, no network) is a placement with a warning, not an error."""
    if not url.startswith("gs://"):
        return None
    name = url.removeprefix("gs://").split("/", 1)[0]
    bucket = f"gs://{name}"
    from tpuctl.storage.gcs import bucket_metadata

    try:
        location, location_type, data_locations = bucket_metadata(name)
    except TpuctlError as error:
        return judge_bucket(bucket, zone, location=None, error=error.message)
    return judge_bucket(
        bucket,
        zone,
        location=location,
        location_type=location_type,
        data_locations=data_locations,
    )
