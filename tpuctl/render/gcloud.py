"""Spec → the equivalent `gcloud alpha compute tpus queued-resources create` command line."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

from tpuctl import topology
from tpuctl.errors import SpecError
from tpuctl.render.request import (
    STARTUP_SCRIPT_KEY,
    data_disk_source,
    node_labels,
    node_metadata,
    reservation_name,
)
from tpuctl.spec.model import Spec

# The file `--metadata-from-file` reads: `tpuctl render` writes the startup script next to it.
STARTUP_SCRIPT_FILE = "startup.sh"
# gcloud's list/dict flags split on commas unless the value starts with ^DELIM^ (gcloud topic
# escaping); these are tried in order when an item itself holds a comma.
_DELIMITERS = ("|", ";", "~", "#", "@", "!")


def render_gcloud(spec: Spec, *, project: str, zone: str) -> str:
    """The gcloud command that asks for what `render_request` asks for, one flag per line.

    Every word is quoted for a POSIX shell. The startup script is passed as a file
    (`startup.sh`), as one would by hand. What gcloud has no flag for (the boot disk's size
    and image, a reservation of another project) is said in comment lines above it.
    """
    tpu = spec.tpu
    words: list[str] = [f"--project={project}", f"--zone={zone}"]
    if tpu.type and tpu.topology:
        accelerator = topology.from_type_topology(tpu.type, tpu.topology)
        words += [f"--type={accelerator.family.prefix}", f"--topology={accelerator.topology}"]
    else:
        words.append(f"--accelerator-type={tpu.accelerator}")
    words.append(f"--runtime-version={tpu.runtime}")
    if tpu.slices > 1:
        words += [f"--node-count={tpu.slices}", f"--node-prefix={spec.name}"]
        if tpu.workload_type:
            words.append(f"--workload-type={tpu.workload_type.replace('-', '_').upper()}")
    else:
        words.append(f"--node-id={spec.name}")
    unsaid: list[str] = []
    words += _capacity_flags(spec, project=project, zone=zone, unsaid=unsaid)
    if tpu.network:
        words.append(f"--network={tpu.network}")
    if tpu.subnetwork:
        words.append(f"--subnetwork={tpu.subnetwork}")
    if not tpu.external_ips:
        words.append("--internal-ips")
    if tpu.tags:
        words.append(f"--tags={_gcloud_list(tpu.tags)}")
    words.append(f"--labels={_gcloud_dict(node_labels(spec))}")
    if tpu.service_account:
        words.append(f"--service-account={tpu.service_account}")
    if tpu.scopes:
        words.append(f"--scopes={_gcloud_list(tpu.scopes)}")
    # The script itself is long; it travels as a file (startup.sh, rendered beside this).
    metadata = node_metadata(spec, startup_script="")
    if spec.job is not None:
        metadata.pop(STARTUP_SCRIPT_KEY)
        words.append(f"--metadata-from-file={STARTUP_SCRIPT_KEY}={STARTUP_SCRIPT_FILE}")
    if metadata:
        words.append(f"--metadata={_gcloud_dict(metadata)}")
    if spec.checkpoint.autocheckpoint:
        words.append("--autocheckpoint-enabled")
    if tpu.description:
        words.append(f"--description={tpu.description}")
    words += _node_flags(spec, project=project, zone=zone, unsaid=unsaid)

    command = "gcloud alpha compute tpus queued-resources create " + shlex.quote(spec.name)
    comments = "".join(f"# {line}\n" for line in unsaid)
    return comments + " \\\n    ".join([command, *(shlex.quote(word) for word in words)]) + "\n"


def _node_flags(spec: Spec, *, project: str, zone: str, unsaid: list[str]) -> list[str]:
    tpu = spec.tpu
    words: list[str] = []
    disk = tpu.boot_disk
    if disk is not None:
        parts = [f"kms-key={disk.kms_key}"] if disk.kms_key else []
        if disk.confidential_compute:
            parts.append("confidential-compute=true")
        if parts:
            words.append("--boot-disk=" + ",".join(parts))
        missing = [
            name
            for name, value in (("size_gb", disk.size_gb), ("image", disk.image))
            if value is not None
        ]
        if missing:
            unsaid.append(
                f"gcloud has no flag for tpu.boot_disk.{' and '.join(missing)} (the API's "
                "bootDiskConfig): this command leaves the service's default; tpuctl create "
                "sends it over the REST API"
            )
    for data_disk in tpu.data_disks:
        source = data_disk_source(data_disk.source, project=project, zone=zone)
        mode = f",mode={data_disk.mode}" if data_disk.mode else ""
        words.append(f"--data-disk=source={source}{mode}")
    if tpu.secure_boot:
        words.append("--shielded-secure-boot")
    if tpu.workload_type == "throughput-optimized":
        unsaid.append(
            "gcloud sends --workload-type only for AVAILABILITY_OPTIMIZED: this command "
            "leaves the service's default placement, which tpuctl create asks for by name"
        )
    return words


# The gcloud flags of the tiers that have one; flex-start and reservation-bound are
# provisioning models.
_TIER_FLAGS = {"spot": "--spot", "reserved": "--reserved", "best-effort": "--best-effort"}


def _capacity_flags(spec: Spec, *, project: str, zone: str, unsaid: list[str]) -> list[str]:
    capacity = spec.capacity
    words = [_TIER_FLAGS[capacity.tier]] if capacity.tier in _TIER_FLAGS else []
    if capacity.tier in ("flex-start", "reservation-bound"):
        words.append(f"--provisioning-model={capacity.tier}")
    if capacity.max_run_duration is not None:
        words.append(f"--max-run-duration={gcloud_duration(capacity.max_run_duration)}")
    if capacity.reservation:
        words += _reservation_flags(capacity.reservation, project=project, zone=zone, unsaid=unsaid)
    if capacity.fallback:
        unsaid.append(
            "the first rung of capacity.fallback; tpuctl up climbs the ladder itself "
            "(gcloud has no such thing)"
        )
    # gcloud itself turns a pair of bounds into the API's valid_interval.
    for flag, bound in (("until", capacity.valid_until), ("after", capacity.valid_after)):
        if isinstance(bound, timedelta):
            words.append(f"--valid-{flag}-duration={gcloud_duration(bound)}")
        elif isinstance(bound, datetime):
            words.append(f"--valid-{flag}-time={_rfc3339(bound)}")
    return words


def _reservation_flags(
    reservation: str, *, project: str, zone: str, unsaid: list[str]
) -> list[str]:
    """gcloud's --reservation takes a bare name and makes it projects/P/locations/ZONE/…; a
    whole name (another project's reservation) it silently drops, so none is written."""
    name = reservation_name(reservation, project=project, zone=zone)
    own = f"projects/{project}/locations/{zone}/reservations/"
    if name.startswith(own):
        return [f"--reservation={name.removeprefix(own)}"]
    unsaid.append(
        f"gcloud's --reservation takes a reservation of this project and zone only: {name} "
        "is not sent by this command; tpuctl create asks for it by name"
    )
    return []


def gcloud_duration(duration: timedelta) -> str:
    """A duration in gcloud's syntax: 6h, 1h30m, 2d, 45s (whole seconds; at least 0s)."""
    seconds = max(0, int(duration.total_seconds()))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:  # a naive time in a spec means UTC, as in render_request
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _gcloud_list(items: Iterable[str]) -> str:
    values = list(items)
    return _with_delimiter(values, values)


def _gcloud_dict(mapping: dict[str, str]) -> str:
    return _with_delimiter(
        [f"{key}={value}" for key, value in mapping.items()], [*mapping, *mapping.values()]
    )


def _with_delimiter(items: list[str], parts: list[str]) -> str:
    if not any("," in part for part in parts):
        return ",".join(items)
    for delimiter in _DELIMITERS:
        if not any(delimiter in part for part in parts):
            return f"^{delimiter}^" + delimiter.join(items)
    raise SpecError(
        "cannot write these values as one gcloud flag: each candidate delimiter "
        f"({' '.join(_DELIMITERS)}) occurs in them"
    )
