"""The TPU API's side: enabled (Service Usage), accelerator type and runtime offered in the
zone, the reservation, quota (Cloud Quotas)."""

from __future__ import annotations

import difflib
from typing import Any

from tpuctl.errors import quoted
from tpuctl.jobs.doctor.checks import (
    Check,
    Inputs,
    blocked,
    noted,
    passed,
    warned,
)
from tpuctl.plan import accelerator_of
from tpuctl.spec.model import Spec
from tpuctl.topology import AcceleratorError, runtime_warning

# ------------------------------------------------------------------------- service usage


def service_check(inputs: Inputs) -> tuple[list[Check], str | None]:
    """The TPU API enabled for the project; the project's number (for the default service
    account) as a by-product."""
    from tpuctl.cloud.services import SERVICE_USAGE_ENV, endpoint_override, service_state

    name = "tpu-api"
    if inputs.emulator and endpoint_override(SERVICE_USAGE_ENV, inputs.environ) is None:
        return [noted(name, f"skipped on the emulator (set {SERVICE_USAGE_ENV} to ask one)")], None
    try:
        state = service_state(inputs.project, inputs.credentials, environ=inputs.environ)
    except Exception as error:
        return [
            warned(
                name,
                f"cannot read whether tpu.googleapis.com is enabled: {_api_reason(error)}",
                "grant serviceusage.services.get (roles/serviceusage.serviceUsageViewer)",
            )
        ], None
    if state.enabled:
        return [passed(name, f"tpu.googleapis.com is enabled in {inputs.project}")], (
            state.project_number
        )
    return [
        blocked(
            name,
            f"tpu.googleapis.com is {state.state} in project {inputs.project}",
            f"gcloud services enable tpu.googleapis.com --project {inputs.project}",
        )
    ], state.project_number


def _api_reason(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    code = getattr(error, "grpc_status_code", None) or getattr(error, "code", None)
    prefix = f"{getattr(code, 'name', code)}: " if code is not None else ""
    return f"{prefix}{' '.join(str(message).split())}"


# ------------------------------------------------------------------------------ TPU API


def accelerator_check(inputs: Inputs) -> list[Check]:
    spec = inputs.spec
    try:
        accelerator = accelerator_of(spec)
    except AcceleratorError as error:
        return [blocked("accelerator", str(error), "fix tpu.accelerator (tpuctl validate)")]
    wanted = accelerator.accelerator_type
    offered = inputs.api.get_accelerator_type(wanted)
    if offered is not None:
        topologies = sorted({config.topology for config in offered.accelerator_configs})
        shape = f" (topology {', '.join(topologies)})" if topologies else ""
        if spec.tpu.topology and topologies and spec.tpu.topology not in topologies:
            return [
                blocked(
                    "accelerator",
                    f"{wanted} is offered in {inputs.zone} with topology "
                    f"{', '.join(topologies)}, not {spec.tpu.topology}",
                    f"set tpu.topology to {topologies[0]}",
                )
            ]
        return [passed("accelerator", f"{wanted} is offered in {inputs.zone}{shape}")]
    same_family = [
        name
        for name in inputs.api.list_accelerator_types()
        if name.rpartition("-")[0] == wanted.rpartition("-")[0]
    ]
    fix = (
        f"use a type offered there ({_some(same_family)}) or another zone"
        if same_family
        else f"use another zone: {inputs.zone} offers no {accelerator.generation}"
    )
    return [blocked("accelerator", f"{wanted} is not offered in {inputs.zone}", fix)]


def _some(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


def runtime_checks(inputs: Inputs) -> list[Check]:
    runtime = inputs.spec.tpu.runtime
    offered = inputs.api.list_runtime_versions()
    if runtime not in offered:
        close = difflib.get_close_matches(runtime, offered, n=1, cutoff=0.6)
        fix = (
            f"set tpu.runtime to {close[0]} (the closest offered)"
            if close
            else f"set tpu.runtime to one of: {_some(sorted(offered), 12)}"
        )
        message = f"runtime version {quoted(runtime)} is not offered in {inputs.zone}"
        return [blocked("runtime", message, fix)]
    checks = [passed("runtime", f"{runtime} is offered in {inputs.zone}")]
    try:
        mismatch = runtime_warning(accelerator_of(inputs.spec), runtime)
    except AcceleratorError:
        mismatch = None
    if mismatch:
        checks.append(warned("runtime", mismatch))
    return checks


def reservation_checks(inputs: Inputs) -> list[Check]:
    """For `tier: reserved`: the named reservation (or any) exists, is ACTIVE and has room."""
    spec = inputs.spec
    if spec.capacity.tier != "reserved":
        return []
    wanted = spec.capacity.reservation
    reservations = inputs.api.list_reservations()
    found = [r for r in reservations if wanted is None or _names(r.name, wanted)]
    where = f"{inputs.project}/{inputs.zone}"
    if not found:
        what = f"reservation {quoted(wanted)}" if wanted else "TPU reservation"
        names = [r.name.rsplit("/", 1)[-1] for r in reservations]
        listed = f" (there: {_some(names)})" if names else ""
        fix = (
            f"set capacity.reservation to one of: {_some(names)}"
            if names
            else "ask Google for a reservation in this zone, or use tier spot or on-demand"
        )
        return [blocked("reservation", f"no {what} in {where}{listed}", fix)]
    reservation = found[0]
    short = reservation.name.rsplit("/", 1)[-1]
    state = type(reservation).State(reservation.state).name
    if state != "ACTIVE":
        return [warned("reservation", f"reservation {short} is {state}, not ACTIVE")]
    return [passed("reservation", _reservation_room(inputs.spec, short, reservation))]


def _names(name: str, wanted: str) -> bool:
    return name == wanted or name.rsplit("/", 1)[-1] == wanted.rsplit("/", 1)[-1]


def _reservation_room(spec: Spec, short: str, reservation: Any) -> str:
    standard = reservation.standard
    if not standard.size:
        return f"reservation {short} is ACTIVE"
    units = type(standard).CapacityUnits(standard.capacity_units).name.lower()
    accelerator = accelerator_of(spec)
    per_slice = accelerator.tensorcores if units == "cores" else accelerator.chips
    need = per_slice * spec.tpu.slices
    free = standard.size - standard.usage.total
    return f"reservation {short} is ACTIVE: {free} of {standard.size} {units} free, {need} needed"


# ------------------------------------------------------------------------------- quota


def quota_check(inputs: Inputs) -> list[Check]:
    from tpuctl.cloud.services import CLOUD_QUOTAS_ENV, endpoint_override, tpu_quota

    name = "quota"
    if inputs.emulator and endpoint_override(CLOUD_QUOTAS_ENV, inputs.environ) is None:
        return [noted(name, f"skipped on the emulator (set {CLOUD_QUOTAS_ENV} to ask one)")]
    spec = inputs.spec
    accelerator = accelerator_of(spec)
    tier = spec.capacity.tier
    try:
        limit = tpu_quota(
            inputs.project,
            inputs.zone,
            accelerator.generation,
            tier,
            inputs.credentials,
            environ=inputs.environ,
        )
    except Exception as error:
        return [
            warned(
                name,
                f"cannot read TPU quota: {_api_reason(error)}",
                "grant cloudquotas.quotas.get (roles/cloudquotas.viewer) to check it",
            )
        ]
    if limit is None:
        return [
            warned(
                name, f"no {accelerator.generation} {tier} TPU quota is listed for {inputs.zone}"
            )
        ]
    need = limit.needed(accelerator, spec.tpu.slices)
    if limit.limit is None:
        return [passed(name, f"{limit.metric}: no limit in {limit.applies_to}")]
    said = f"{limit.metric} is {limit.limit} {limit.unit} in {limit.applies_to}"
    if limit.limit < need:
        return [
            blocked(
                name,
                f"{said}; {spec.tpu.slices} × {accelerator.accelerator_type} needs {need}",
                "request more in the console's Quotas page "
                f"(https://console.cloud.google.com/iam-admin/quotas?project={inputs.project})",
            )
        ]
    return [passed(name, f"{said}, {need} needed (what other TPUs use is not counted)")]
