"""Compute Engine's side of a `tpu.api: compute` spec: its TPU machine type offered in the
zone, its boot image (family) there to boot from, its reservation. Read through the
backend's Compute Engine client (tpuctl.cloud.compute.ComputeTpuClient: `machine_type`,
`image`, `reservation`, each None when Compute Engine has no such thing)."""

from __future__ import annotations

from typing import Any

from tpuctl.jobs.doctor.checks import Check, Inputs, blocked, noted, passed, warned
from tpuctl.render.compute import IMAGE_PROJECT, compute_accelerator, source_image
from tpuctl.topology import compute_machine_type


def compute_checks(inputs: Inputs) -> list[Check]:
    """Every Compute Engine check of one zone (one line each)."""
    reader = inputs.api.client
    return [
        *_guarded("machine-type", machine_type_check, inputs, reader),
        *_guarded("image", image_check, inputs, reader),
        *_guarded("reservation", reservation_check, inputs, reader),
    ]


def _guarded(name: str, check: Any, inputs: Inputs, reader: Any) -> list[Check]:
    from tpuctl.cloud.compute_ops import NotServed

    try:
        result: list[Check] = check(inputs, reader)
    except NotServed as error:  # the emulator's Compute Engine: not a TPU VM's part
        return [noted(name, f"skipped: this Compute Engine endpoint has no {error.message}")]
    except Exception as error:  # a read that failed: said, never a crash of the doctor
        reason = getattr(error, "message", None) or str(error) or type(error).__name__
        return [warned(name, f"could not check: {' '.join(str(reason).split())}")]
    return result


def machine_type_check(inputs: Inputs, reader: Any) -> list[Check]:
    machine = compute_machine_type(compute_accelerator(inputs.spec))
    if reader.machine_type(inputs.project, inputs.zone, machine) is not None:
        return [passed("machine-type", f"{machine} is offered in {inputs.zone}")]
    return [
        blocked(
            "machine-type",
            f"machine type {machine} is not offered in {inputs.zone}",
            "use a zone that offers it (gcloud compute machine-types list "
            f"--filter=name={machine}), or another accelerator",
        )
    ]


def image_check(inputs: Inputs, reader: Any) -> list[Check]:
    disk = inputs.spec.tpu.boot_disk
    image = source_image(disk.image if disk is not None and disk.image else inputs.spec.tpu.runtime)
    if reader.image(image) is not None:
        return [passed("image", f"{image} exists")]
    return [
        blocked(
            "image",
            f"no image {image}",
            "set tpu.runtime to an image family of "
            f"{IMAGE_PROJECT} (gcloud compute images list --project {IMAGE_PROJECT}) or a "
            "full image path",
        )
    ]


def reservation_check(inputs: Inputs, reader: Any) -> list[Check]:
    name = inputs.spec.capacity.reservation
    if not name:
        return [noted("reservation", "none named (capacity.reservation)")]
    short = name.rsplit("/", 1)[-1]
    found = reader.reservation(inputs.project, inputs.zone, short)
    if found is None:
        return [
            blocked(
                "reservation",
                f"no reservation {short} in {inputs.project}/{inputs.zone}",
                "name one that exists there (gcloud compute reservations list), or drop "
                "capacity.reservation",
            )
        ]
    status = str(found.get("status", "")) or "unknown"
    if status != "READY":
        return [warned("reservation", f"reservation {short} is {status}, not READY")]
    return [passed("reservation", f"reservation {short} is READY in {inputs.zone}")]
