"""OS Login, decided and used the way gcloud does it for TPU VMs.

A node uses OS Login when its metadata says `enable-oslogin: TRUE`, or says nothing and the
project's common instance metadata (Compute Engine's `projects.get`) says TRUE; a node's FALSE
wins. Then tpuctl imports the public key through the OS Login API for the caller (the
impersonated service account, the credentials' service account, else gcloud's account), with
an expiry so nothing permanent is left behind, and logs in as the POSIX user of the caller's
login profile; the node's `ssh-keys` metadata is never written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tpuctl.cloud.client import (
    CallBudget,
    api_errors,
    make_retry,
    retry_seconds,
)
from tpuctl.cloud.credentials import load_credentials
from tpuctl.cloud.resolve import EMULATOR_ENV, Location, active_gcloud_config, is_emulator
from tpuctl.errors import AuthError, TpuctlError

OS_LOGIN = "enable-oslogin"
ACCOUNT_ENV = "TPUCTL_ACCOUNT"  # whom OS Login imports keys for, when nothing else says
DEFAULT_KEY_TTL = 24 * 3600.0


def flag(value: object) -> bool | None:
    """`enable-oslogin` as Compute Engine reads it: True, False, or None when unset."""
    text = str(value or "").strip()
    if not text:
        return None
    return text.upper() in ("TRUE", "1", "YES")


def node_setting(metadata: Any) -> bool | None:
    """A node's own `enable-oslogin` (its metadata, or the spec's tpu.metadata for one to be)."""
    return flag(dict(metadata).get(OS_LOGIN))


def project_setting(
    location: Location,
    *,
    credentials: Any = None,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[bool | None, str | None]:
    """The project's `enable-oslogin` (common instance metadata), and why it could not be
    read (None when it was). Unreadable is not fatal: a node's own setting may decide."""
    from tpuctl.cloud.compute_rest import COMPUTE_ENV, ComputeError, project_metadata

    env = os.environ if environ is None else environ
    if is_emulator(env) and not env.get(COMPUTE_ENV):
        return None, f"{COMPUTE_ENV} is unset; the emulator announces it"
    try:
        if credentials is None:
            credentials = load_credentials(impersonate=impersonate, environ=env)
        metadata = project_metadata(location.project, credentials, environ=env)
    except TpuctlError as error:
        return None, error.message
    except ComputeError as error:
        return None, f"projects.get {location.project}: {error.message}"
    return flag(metadata.get(OS_LOGIN)), None


@dataclass(frozen=True)
class OsLoginSetting:
    """Whether SSH to a node goes through OS Login, and what decided it."""

    enabled: bool
    decided_by: Literal["node", "project", "default"]  # default: neither says, so off
    unread: str | None = None  # why the project's metadata could not be read (then off)
    # Unread because this is the emulator without its Compute Engine endpoint: its usual
    # set-up (its projects have OS Login off unless one is turned on), not worth a line on
    # every command; `tpuctl doctor` notes it.
    emulator_unread: bool = False


def os_login_setting(
    node_metadata: Any,
    location: Location,
    *,
    credentials: Any = None,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> OsLoginSetting:
    """The one reading of OS Login, for ssh and doctor alike: the node's `enable-oslogin`
    wins; else the project's; else off (also when the project's metadata cannot be read,
    which `unread` says). The project is read only when the node says nothing."""
    node = node_setting(node_metadata)
    if node is not None:
        return OsLoginSetting(node, "node")
    from tpuctl.cloud.compute_rest import COMPUTE_ENV

    project, unread = project_setting(
        location, credentials=credentials, impersonate=impersonate, environ=environ
    )
    env = os.environ if environ is None else environ
    return OsLoginSetting(
        bool(project),
        "project" if project is not None else "default",
        unread,
        emulator_unread=unread is not None and is_emulator(env) and not env.get(COMPUTE_ENV),
    )


def caller(impersonate: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The account OS Login imports the key for: the impersonated service account, the
    credentials' own service account, TPUCTL_ACCOUNT, else gcloud's `[core] account`."""
    env = os.environ if environ is None else environ
    if impersonate:
        return impersonate
    explicit = env.get(ACCOUNT_ENV, "").strip()
    if explicit:
        return explicit
    if not is_emulator(env):
        credentials = load_credentials(environ=env)
        email = getattr(credentials, "service_account_email", None)
        if isinstance(email, str) and "@" in email:
            return email
    gcloud = active_gcloud_config(env)
    if gcloud.account:
        return gcloud.account
    skipped = (
        f" (cannot read the gcloud configuration, {gcloud.problem}; skipped)"
        if gcloud.problem is not None
        else ""
    )
    raise AuthError(
        "OS Login is on, and tpuctl cannot tell which account to import the SSH key for" + skipped,
        hint=f"set {ACCOUNT_ENV}=you@example.com, run 'gcloud config set account ACCOUNT', "
        "or pass --impersonate-service-account",
    )


def import_key(
    location: Location,
    account: str,
    public_key: str,
    *,
    ttl_seconds: float = DEFAULT_KEY_TTL,
    impersonate: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Import `public_key` ("ssh-ed25519 AAAA… comment") for `account`, expiring after
    `ttl_seconds`; the POSIX user name to log in as (the login profile's primary account)."""
    env = os.environ if environ is None else environ
    from google.cloud import oslogin_v1
    from google.cloud.oslogin_v1 import common

    client = _client(impersonate, env)
    expires = int((time.time() + ttl_seconds) * 1_000_000)
    parent = f"users/{account}"
    request = oslogin_v1.ImportSshPublicKeyRequest(
        parent=parent,
        ssh_public_key=common.SshPublicKey(key=public_key, expiration_time_usec=expires),
        project_id=location.project,
    )
    budget = retry_seconds(env)
    retry = make_retry(total_seconds=budget, reads=False)
    with api_errors("import the SSH key through OS Login for", account):
        response = client.import_ssh_public_key(
            request=request, retry=retry, timeout=CallBudget(budget, 60.0)
        )
    accounts = list(response.login_profile.posix_accounts)
    primary = next((a for a in accounts if a.primary), accounts[0] if accounts else None)
    if primary is None or not primary.username:
        raise AuthError(
            f"OS Login gave {account} no POSIX account to log in as",
            hint="the account needs roles/compute.osLogin (or osAdminLogin) on the project",
        )
    return str(primary.username)


def _client(impersonate: str | None, env: Mapping[str, str]) -> Any:
    from google.cloud import oslogin_v1

    host = env.get(EMULATOR_ENV)
    if host:
        import grpc
        from google.cloud.oslogin_v1.services.os_login_service.transports import (
            OsLoginServiceGrpcTransport,
        )

        transport = OsLoginServiceGrpcTransport(channel=grpc.insecure_channel(host))
        return oslogin_v1.OsLoginServiceClient(transport=transport)
    credentials = load_credentials(impersonate=impersonate, environ=env)
    return oslogin_v1.OsLoginServiceClient(credentials=credentials)
