"""The spec's rules for `tpu.api: compute`: what Compute Engine offers a TPU slice, and each
field of the spec it has no equivalent for, refused with the fix (never dropped silently)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Protocol

from tpuctl.clock import format_duration
from tpuctl.errors import SpecError, quoted
from tpuctl.spec.model import CapacitySpec, CheckpointSpec
from tpuctl.topology import FAMILIES, Accelerator

# flex-start's queueing window on one instance (params.requestValidForDuration), as the
# emulator's Compute Engine fake bounds it (from public reports of runs; not documented).
MIN_REQUEST_VALID_FOR = timedelta(seconds=90)
MAX_REQUEST_VALID_FOR = timedelta(seconds=7200)
# Cloud TPU runtime versions: the Cloud TPU API's software versions, not Compute Engine images.
_RUNTIME_VERSIONS = frozenset(name for family in FAMILIES for name in family.runtimes)
IMAGE_EXAMPLE = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"


class Section(Protocol):
    """A checked section of the spec (tpuctl.spec.sections.Values): absent keys read as defaults."""

    def __getitem__(self, name: str) -> Any: ...


class Judge(Protocol):
    """What the rules need of the spec builder: an error at a dotted path."""

    def error(self, message: str, path: str, hint: str | None = None) -> SpecError: ...


def check_compute_tpu(judge: Judge, tpu: Section, accelerator: Accelerator) -> None:
    """The tpu section's rules: one slice, an image rather than a Cloud TPU runtime version,
    and no Cloud TPU-only fields."""
    if tpu["slices"] > 1:
        raise judge.error(
            "Multislice on Compute Engine has no documented procedure (Google's documentation "
            "runs multislice TPU jobs on GKE)",
            "tpu.slices",
            "use slices: 1 with api: compute; for several slices use api: tpu (v4 to v6e) or GKE",
        )
    runtime: str = tpu["runtime"]
    if runtime in _RUNTIME_VERSIONS:
        raise judge.error(
            f"{quoted(runtime)} is a Cloud TPU runtime version; on Compute Engine tpu.runtime "
            "names the boot disk's image",
            "tpu.runtime",
            f"give an image family of ubuntu-os-accelerator-images (e.g. {IMAGE_EXAMPLE}) or "
            "projects/P/global/images/NAME",
        )
    if tpu["workload_type"] is not None:
        raise judge.error(
            "workload_type places the slices of a Cloud TPU multislice request; Compute Engine "
            "has no such field",
            "tpu.workload_type",
            "remove it",
        )
    if accelerator.vms > 1:
        for index, disk in enumerate(tpu["data_disks"] or ()):
            if disk.get("mode") != "read-only":
                raise judge.error(
                    f"a read-write disk attaches to one VM, and a {accelerator.accelerator_type} "
                    f"is {accelerator.vms} VMs made from one instance template",
                    f"tpu.data_disks[{index}].mode",
                    "set mode: read-only",
                )


def check_compute_capacity(judge: Judge, capacity: CapacitySpec, accelerator: Accelerator) -> None:
    """Tiers and queueing as Compute Engine has them."""
    rungs = [
        (f"capacity.fallback[{index}]", rung.tier, rung.reservation or capacity.reservation)
        for index, rung in enumerate(capacity.fallback)
    ] or [("capacity", capacity.tier, capacity.reservation)]
    for path, tier, reservation in rungs:
        if tier == "best-effort":
            raise judge.error(
                "Compute Engine has no best-effort tier (it is the Cloud TPU API's)",
                f"{path}.tier",
                "use spot (preemptible and cheapest), or tpu.api: tpu",
            )
        if tier == "reserved" and reservation is None:
            raise judge.error(
                "on Compute Engine tpuctl draws from a reservation by name "
                "(reservationAffinity SPECIFIC_RESERVATION)",
                f"{path}.tier",
                f"add `reservation: NAME` under `{path}`",
            )
    if capacity.valid_after is not None:
        raise judge.error(
            "Compute Engine has no not-before time for a VM (the Cloud TPU API's valid_after)",
            "capacity.valid_after",
            "remove it and run create when the slice should start (cron, a scheduler), or use "
            "tpu.api: tpu",
        )
    if capacity.valid_until is not None:
        check_queueing_window(judge, capacity.valid_until, capacity.tier, accelerator)


def check_compute_checkpoint(judge: Judge, checkpoint: CheckpointSpec) -> None:
    """No Autocheckpoint: it is a Cloud TPU API field."""
    if checkpoint.autocheckpoint:
        raise judge.error(
            "Autocheckpoint is the Cloud TPU API's; Compute Engine has no such field",
            "checkpoint.autocheckpoint",
            "remove it: on Compute Engine a stop or delete gives the job SIGTERM and up to 5 "
            "minutes (graceful shutdown) to save; or use tpu.api: tpu",
        )


def check_queueing_window(
    judge: Judge, until: timedelta | datetime, tier: str, accelerator: Accelerator
) -> None:
    """capacity.valid_until: on Compute Engine only a flex-start instance waits for capacity,
    for 90 s to 2 h (params.requestValidForDuration)."""
    path = "capacity.valid_until"
    if tier != "flex-start":
        raise judge.error(
            f"on Compute Engine only a flex-start request waits for capacity; a {tier} insert "
            "fails at once when there is none",
            path,
            "remove it (deadlines.queue bounds how long create waits), or set tier: flex-start",
        )
    if accelerator.vms > 1:
        raise judge.error(
            f"a {accelerator.accelerator_type} is {accelerator.vms} VMs, a bulk managed instance "
            "group, which waits for capacity until it is deleted: its template has no queueing "
            "window",
            path,
            "remove it; deadlines.queue bounds how long create waits",
        )
    if isinstance(until, datetime):
        raise judge.error(
            "Compute Engine takes flex-start's queueing window as a duration "
            "(params.requestValidForDuration), not a time",
            path,
            "give a duration from 90s to 2h, e.g. 30m",
        )
    if not MIN_REQUEST_VALID_FOR <= until <= MAX_REQUEST_VALID_FOR:
        raise judge.error(
            f"{format_duration(until.total_seconds())} is not a queueing window Compute Engine "
            "takes (90s to 2h)",
            path,
            "give a duration from 90s to 2h, e.g. 30m",
        )
