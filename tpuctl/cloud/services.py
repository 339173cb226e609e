"""The Google APIs around the TPU API that `tpuctl doctor` asks: Service Usage (is the TPU API
enabled, and the project's number) and Cloud Quotas (TPU quota per tier), each through its own
client library, imported only when asked.

Each can be pointed at a local server instead of Google, as TPU_EMULATOR_HOST does for the TPU
API: TPUCTL_SERVICE_USAGE_ENDPOINT and TPUCTL_CLOUD_QUOTAS_ENDPOINT (`HOST:PORT`, plain gRPC,
anonymous credentials).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpuctl.topology import Accelerator

SERVICE_USAGE_ENV = "TPUCTL_SERVICE_USAGE_ENDPOINT"
CLOUD_QUOTAS_ENV = "TPUCTL_CLOUD_QUOTAS_ENDPOINT"
TPU_SERVICE = "tpu.googleapis.com"
READ_TIMEOUT = 20.0


def endpoint_override(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """`HOST:PORT` from the variable `name` (an `http://` prefix is dropped), else None."""
    env = os.environ if environ is None else environ
    value = env.get(name, "").strip()
    if not value:
        return None
    return value.split("://", 1)[-1].rstrip("/")


def _client(
    client_class: Any, variable: str, credentials: Any, environ: Mapping[str, str] | None
) -> Any:
    """A GAPIC client: plain gRPC to the local server `variable` names (anonymous), else
    Google's endpoint with `credentials`."""
    host = endpoint_override(variable, environ)
    if host:
        import grpc

        transport_class = client_class.get_transport_class("grpc")
        return client_class(transport=transport_class(channel=grpc.insecure_channel(host)))
    return client_class(credentials=credentials)


@dataclass(frozen=True)
class ServiceState:
    """What Service Usage says of one API for a project."""

    service: str
    state: str  # ENABLED | DISABLED | STATE_UNSPECIFIED
    project_number: str | None  # from the consumer name, projects/NUMBER

    @property
    def enabled(self) -> bool:
        return self.state == "ENABLED"


def service_state(
    project: str,
    credentials: Any,
    *,
    service: str = TPU_SERVICE,
    environ: Mapping[str, str] | None = None,
) -> ServiceState:
    """GetService(projects/P/services/S): its state and the project's number. Raises the
    client library's exceptions (google.api_core.exceptions)."""
    from google.cloud import service_usage_v1

    client = _client(service_usage_v1.ServiceUsageClient, SERVICE_USAGE_ENV, credentials, environ)
    with client:
        answer = client.get_service(
            request={"name": f"projects/{project}/services/{service}"}, timeout=READ_TIMEOUT
        )
    parent = str(answer.parent or "")
    number = parent.removeprefix("projects/") if parent.startswith("projects/") else None
    return ServiceState(service, service_usage_v1.State(answer.state).name, number or None)


# Cloud Quotas metrics of the TPU API per generation: on-demand as named, spot (and
# best-effort) with -preemptible, reserved with -reserved. Taken from public tools and the
# quota documentation, not read from the service: a name missing here is a warning, not a block.
QUOTA_METRIC_STEMS: dict[str, tuple[str, ...]] = {
    "v2": ("tpu-v2", "tpu-v2-pod"),
    "v3": ("tpu-v3", "tpu-v3-pod"),
    "v4": ("tpu-v4", "tpu-v4s"),
    "v5p": ("tpu-v5p",),
    "v5e": ("tpu-v5s-litepod",),
    "v6e": ("tpu-v6e",),
}
TIER_SUFFIX = {"on-demand": "", "spot": "-preemptible", "best-effort": "-preemptible"}


def quota_metrics(generation: str, tier: str) -> tuple[str, ...]:
    suffix = TIER_SUFFIX.get(tier, "-reserved")
    stems = QUOTA_METRIC_STEMS.get(generation, ())
    return tuple(f"{TPU_SERVICE}/{stem}{suffix}" for stem in stems)


@dataclass(frozen=True)
class QuotaLimit:
    """One TPU quota as Cloud Quotas states it for the zone: None for no limit."""

    metric: str
    quota_id: str
    limit: int | None
    unit: str  # chips | cores (TensorCores)
    applies_to: str  # the zone, the region, or "every location" (the default value)

    def needed(self, accelerator: Accelerator, slices: int) -> int:
        per_slice = accelerator.tensorcores if self.unit == "cores" else accelerator.chips
        return per_slice * slices


def tpu_quota(
    project: str,
    zone: str,
    generation: str,
    tier: str,
    credentials: Any,
    *,
    environ: Mapping[str, str] | None = None,
) -> QuotaLimit | None:
    """The quota the spec's tier draws from in `zone` (ListQuotaInfos of tpu.googleapis.com);
    None when no known metric is listed. Raises the client library's exceptions."""
    from google.cloud import cloudquotas_v1

    client = _client(cloudquotas_v1.CloudQuotasClient, CLOUD_QUOTAS_ENV, credentials, environ)
    wanted = quota_metrics(generation, tier)
    parent = f"projects/{project}/locations/global/services/{TPU_SERVICE}"
    with client:
        infos = [
            info
            for info in client.list_quota_infos(request={"parent": parent}, timeout=READ_TIMEOUT)
            if info.metric in wanted
        ]
    infos.sort(key=lambda info: wanted.index(info.metric))
    for info in infos:
        found = _limit_in_zone(info, zone)
        if found is not None:
            return found
    return None


def _limit_in_zone(info: Any, zone: str) -> QuotaLimit | None:
    """The most specific dimensions info of a quota that applies to `zone` (the zone's own, the
    region's, then the default one with no dimensions)."""
    region = zone.rsplit("-", 1)[0]
    words = f"{info.metric_unit} {info.quota_display_name} {info.metric_display_name}".lower()
    unit = "cores" if "core" in words else "chips"
    ranked: list[tuple[int, str, Any]] = []
    for item in info.dimensions_infos:
        dimensions = dict(item.dimensions)
        if dimensions.get("zone") == zone:
            ranked.append((0, zone, item))
        elif dimensions.get("region") == region and "zone" not in dimensions:
            ranked.append((1, region, item))
        elif not dimensions:
            ranked.append((2, "every location", item))
    if not ranked:
        return None
    _, where, item = min(ranked, key=lambda entry: entry[0])
    value = int(item.details.value)
    return QuotaLimit(info.metric, info.quota_id, None if value < 0 else value, unit, where)
