"""The Compute Engine reads `tpuctl doctor` makes over REST (google-auth's AuthorizedSession):
the project's common instance metadata (does it turn OS Login on?) and its firewall rules (can
SSH reach the TPU VMs?); and the pure verdict on those rules.

TPUCTL_COMPUTE_ENDPOINT (`http://HOST:PORT`) points them at a local server, with anonymous
credentials; the emulator announces one that answers the project resource.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COMPUTE_ENV = "TPUCTL_COMPUTE_ENDPOINT"
COMPUTE_API = "https://compute.googleapis.com"
IAP_RANGE = "35.235.240.0/20"  # where IAP's TCP forwarding connects from
READ_TIMEOUT = 20.0


class ComputeError(Exception):
    """A Compute Engine read that failed: the HTTP status (0: not reached) and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _base(environ: Mapping[str, str]) -> str:
    override = environ.get(COMPUTE_ENV, "").strip().rstrip("/")
    if not override:
        return COMPUTE_API
    return override if "://" in override else f"http://{override}"


def _get(url: str, credentials: Any, params: dict[str, str] | None = None) -> dict[str, Any]:
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    try:
        response = session.get(url, params=params, timeout=READ_TIMEOUT)
    except OSError as error:  # requests' connection errors are OSErrors
        raise ComputeError(0, f"cannot reach Compute Engine: {error}") from None
    finally:
        session.close()  # type: ignore[no-untyped-call]
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200] or response.reason
        raise ComputeError(response.status_code, str(message))
    data: dict[str, Any] = response.json()
    return data


def project_metadata(
    project: str, credentials: Any, *, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """projects.get → commonInstanceMetadata as a dict (needs compute.projects.get)."""
    env = os.environ if environ is None else environ
    data = _get(f"{_base(env)}/compute/v1/projects/{project}", credentials)
    items = (data.get("commonInstanceMetadata") or {}).get("items") or []
    return {str(item.get("key")): str(item.get("value", "")) for item in items}


def firewall_rules(
    project: str, credentials: Any, *, environ: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """firewalls.list, every page (needs compute.firewalls.list)."""
    env = os.environ if environ is None else environ
    url = f"{_base(env)}/compute/v1/projects/{project}/global/firewalls"
    rules: list[dict[str, Any]] = []
    token = ""
    while True:
        data = _get(url, credentials, {"pageToken": token} if token else None)
        rules.extend(data.get("items") or [])
        token = str(data.get("nextPageToken") or "")
        if not token:
            return rules


@dataclass(frozen=True)
class SshPath:
    """The enabled ingress rules that let tcp:22 reach the VMs, and from where."""

    rules: tuple[str, ...]
    sources: tuple[str, ...]
    iap: bool  # some rule admits IAP's range


def _allows_ssh(rule: Mapping[str, Any]) -> bool:
    for allowed in rule.get("allowed") or []:
        protocol = str(allowed.get("IPProtocol", "")).lower()
        if protocol not in ("tcp", "6", "all"):
            continue
        ports = allowed.get("ports") or []
        if not ports or any(_port_in(22, str(port)) for port in ports):
            return True
    return False


def _port_in(port: int, spec: str) -> bool:
    low, _, high = spec.partition("-")
    try:
        return int(low) <= port <= int(high or low)
    except ValueError:
        return False


def _covers(sources: Sequence[str], target: str) -> bool:
    wanted = ipaddress.ip_network(target)
    for source in sources:
        try:
            network = ipaddress.ip_network(source, strict=False)
        except ValueError:
            continue
        if network.version == wanted.version and wanted.subnet_of(network):  # type: ignore[arg-type]
            return True
    return False


def ssh_path(
    rules: Sequence[Mapping[str, Any]],
    network: str,
    tags: Sequence[str],
    service_account: str | None,
) -> SshPath:
    """Which allow rules open tcp:22 to VMs on `network` with `tags` (and `service_account`).
    Deny rules and priorities are not weighed: a deny rule can still close what this finds."""
    names: list[str] = []
    sources: list[str] = []
    for rule in rules:
        if rule.get("disabled") or str(rule.get("direction", "INGRESS")) != "INGRESS":
            continue
        if str(rule.get("network", "")).rsplit("/", 1)[-1] != network:
            continue
        targets = rule.get("targetTags") or []
        if targets and not set(targets) & set(tags):
            continue
        accounts = rule.get("targetServiceAccounts") or []
        if accounts and service_account not in accounts:
            continue
        if not _allows_ssh(rule):
            continue
        names.append(str(rule.get("name")))
        sources.extend(str(source) for source in rule.get("sourceRanges") or [])
    unique = tuple(dict.fromkeys(sources))
    return SshPath(tuple(names), unique, _covers(unique, IAP_RANGE))
