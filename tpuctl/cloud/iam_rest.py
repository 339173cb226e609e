"""testIamPermissions over REST (google-auth's AuthorizedSession): which of a list of
permissions the caller holds on a project (Resource Manager) or on a service account (IAM).
Each answers for whoever calls it, so the caller's own credentials are the ones checked.

TPUCTL_RESOURCE_MANAGER_ENDPOINT and TPUCTL_IAM_ENDPOINT (`http://HOST:PORT`) point them at
local servers, as TPUCTL_COMPUTE_ENDPOINT does for Compute Engine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

RESOURCE_MANAGER_ENV = "TPUCTL_RESOURCE_MANAGER_ENDPOINT"
IAM_ENV = "TPUCTL_IAM_ENDPOINT"
RESOURCE_MANAGER_API = "https://cloudresourcemanager.googleapis.com"
IAM_API = "https://iam.googleapis.com"
READ_TIMEOUT = 20.0


class IamError(Exception):
    """A testIamPermissions call that failed: the HTTP status (0: not reached) and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def endpoint(variable: str, default: str, environ: Mapping[str, str]) -> str:
    """The local server `variable` names (`http://` added when bare), else `default`."""
    override = environ.get(variable, "").strip().rstrip("/")
    if not override:
        return default
    return override if "://" in override else f"http://{override}"


def _granted(url: str, permissions: Sequence[str], credentials: Any) -> set[str]:
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    try:
        response = session.post(url, json={"permissions": list(permissions)}, timeout=READ_TIMEOUT)
    except OSError as error:  # requests' connection errors are OSErrors
        raise IamError(0, f"cannot reach {url.partition('/v1/')[0]}: {error}") from None
    finally:
        session.close()  # type: ignore[no-untyped-call]
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200] or response.reason
        raise IamError(response.status_code, str(message))
    return {str(permission) for permission in response.json().get("permissions") or []}


def project_missing(
    project: str,
    permissions: Sequence[str],
    credentials: Any,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """`permissions` the caller lacks on `project` (projects.testIamPermissions), in order."""
    env = os.environ if environ is None else environ
    base = endpoint(RESOURCE_MANAGER_ENV, RESOURCE_MANAGER_API, env)
    url = f"{base}/v1/projects/{quote(project, safe='')}:testIamPermissions"
    granted = _granted(url, permissions, credentials)
    return [permission for permission in permissions if permission not in granted]


def service_account_missing(
    email: str,
    permissions: Sequence[str],
    credentials: Any,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """`permissions` the caller lacks on the service account `email`
    (projects.serviceAccounts.testIamPermissions), in order."""
    env = os.environ if environ is None else environ
    base = endpoint(IAM_ENV, IAM_API, env)
    url = f"{base}/v1/projects/-/serviceAccounts/{quote(email, safe='@')}:testIamPermissions"
    granted = _granted(url, permissions, credentials)
    return [permission for permission in permissions if permission not in granted]
