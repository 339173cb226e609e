"""A fleet ready to connect to: the QR's workers (cloud), selected, our key made to work on them
(OS Login, or their nodes' `ssh-keys` metadata), their host keys from guest attributes, one
connection setting (fanout)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tpuctl.clock import format_duration
from tpuctl.cloud import nodes as cloud_nodes
from tpuctl.cloud import oslogin
from tpuctl.cloud.client import TpuApi
from tpuctl.errors import UnreachableError, UsageError, quoted
from tpuctl.fanout.bastion import Bastion, JumpHost, parse_jump
from tpuctl.fanout.connection import ConnectOptions
from tpuctl.fanout.keys import LocalKey, check_user, default_user, ensure_key
from tpuctl.fanout.known_hosts import CHECKING_MODES, HostKeyPins, default_path
from tpuctl.fanout.operations import Fleet, SshSettings
from tpuctl.fanout.routes import IapTunnel, Route, find_gcloud
from tpuctl.fanout.targets import WorkerTarget, select, ssh_port, worker_targets

Progress = Callable[[str], None]


def grant_access(
    api: TpuApi, node_ids: list[str], key: LocalKey, settings: SshSettings, say: Progress
) -> str:
    """Make our key work on the nodes, the way their project wants it; the user to log in as.

    OS Login (the node's `enable-oslogin`, else the project's): the key is imported for the
    caller through the OS Login API, expiring after `settings.key_ttl`, and the login is the
    caller's POSIX user; nothing is written to the nodes. Otherwise the key goes into each
    node's `ssh-keys` metadata for `--user` (default $USER), as gcloud does.
    """
    first = api.get_node(api.location.node_name(node_ids[0]))
    setting = oslogin.os_login_setting(
        first.metadata if first is not None else {}, api.location, impersonate=api.impersonate
    )
    if setting.unread is not None and not setting.emulator_unread:
        say(f"cannot read the project's metadata ({setting.unread}); OS Login taken as off")
    if not setting.enabled:
        user = check_user(default_user(settings.user))
        for node_id in node_ids:
            node_name = api.location.node_name(node_id)
            if cloud_nodes.add_ssh_key(api, node_name, user, key.algorithm, key.blob):
                say(f"published {user}'s key {key.path}.pub to {node_id}")
        return user
    account = oslogin.caller(api.impersonate)
    public_key = f"{key.algorithm} {key.blob} tpuctl"
    posix = oslogin.import_key(
        api.location,
        account,
        public_key,
        ttl_seconds=settings.key_ttl,
        impersonate=api.impersonate,
    )
    where = "the node" if setting.decided_by == "node" else "the project"
    say(
        f"OS Login ({where} turns it on): imported {key.path}.pub for {account}, expiring in "
        f"{format_duration(settings.key_ttl)}; logging in as {posix}"
    )
    if settings.user and settings.user != posix:
        say(f"--user {settings.user} does not apply with OS Login: logging in as {posix}")
    return check_user(posix)


def prepare_fleet(
    api: TpuApi,
    name: str,
    settings: SshSettings,
    *,
    nodes: str = "all",
    workers: str = "all",
    on_progress: Progress | None = None,
    on_warning: Progress | None = None,
) -> Fleet:
    """Resolve the QR's workers, select them, make sure our key is in their nodes' ssh-keys
    metadata, and read their host keys from guest attributes and tpuctl's known hosts (unless
    checking is off). Workers trusted on first use are named through `on_warning` (else
    `on_progress`) once their connections are set up."""
    say = on_progress or (lambda _message: None)
    warn = on_warning or say
    if settings.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    gcloud, jump = check_route(settings)  # before any request: a usage error costs nothing
    resolved = cloud_nodes.resolve_nodes(api, name)
    everyone = worker_targets(
        resolved.nodes,
        port=ssh_port(settings.ssh_port),
        # A bastion is inside the VPC: it reaches the workers at their internal addresses.
        internal_ip=settings.internal_ip or jump is not None,
    )
    targets = select(everyone, nodes=nodes, workers=workers)
    if not targets:
        raise UsageError(f"no workers selected in {name}")
    key = ensure_key(settings.key_path)
    if key.created:
        say(f"created SSH key {key.path} (ed25519)")
    node_ids = list(dict.fromkeys(target.node_id for target in targets))
    user = grant_access(api, node_ids, key, settings, say)
    targets, pins = host_key_checks(api, targets, settings, warn)
    route: Route | None = None
    if gcloud is not None:
        targets = with_instance_names(api, targets)
        route = IapTunnel(gcloud, api.location.project, api.location.zone)
        say(f"reaching {len(targets)} workers through IAP tunnels ({gcloud})")
    elif jump is not None:
        route = Bastion(
            jump,
            user=user,
            pkey=key.pkey,
            checking=settings.strict_host_key_checking,
            pins_path=settings.known_hosts or default_path(),
            known_hosts=Path(os.path.expanduser("~")) / ".ssh" / "known_hosts",
            connect_timeout=settings.connect_timeout,
            keepalive=settings.keepalive,
            warn=warn,
        )
        say(f"reaching {len(targets)} workers through the bastion {route.name}")
    options = ConnectOptions(
        user=user,
        pkey=key.pkey,
        connect_timeout=settings.connect_timeout,
        keepalive=settings.keepalive,
        verify_host_keys=pins is not None,
        pins=pins,
        route=route,
    )
    return Fleet(resolved.queued_resource, targets, options, key, user, settings)


def check_route(settings: SshSettings) -> tuple[str | None, JumpHost | None]:
    """(the gcloud to tunnel with, the bastion) as the flags ask; UsageError for a bad mix,
    a bad --proxy-jump, or --tunnel-through-iap with no gcloud to run."""
    if settings.tunnel_through_iap and settings.proxy_jump:
        raise UsageError(
            "--tunnel-through-iap and --proxy-jump are two ways to the same workers: pass one"
        )
    if settings.tunnel_through_iap and settings.internal_ip:
        raise UsageError(
            "--tunnel-through-iap and --internal-ip cannot be used together (as in gcloud): "
            "an IAP tunnel reaches the VM itself, whatever its addresses"
        )
    if settings.tunnel_through_iap:
        return find_gcloud(), None
    if settings.proxy_jump:
        return None, parse_jump(settings.proxy_jump)
    return None, None


def with_instance_names(api: TpuApi, targets: list[WorkerTarget]) -> list[WorkerTarget]:
    """The targets with their VM instance names (the `hostname` guest attribute), which IAP
    tunnels take; a worker without one cannot be tunnelled to, as with gcloud."""
    names = cloud_nodes.instance_names(api, list(dict.fromkeys(t.node_id for t in targets)))
    missing = [t for t in targets if (t.node_id, t.worker) not in names]
    if missing:
        labels = ", ".join(t.label for t in missing[:8]) + (" …" if len(missing) > 8 else "")
        raise UnreachableError(
            f"cannot tunnel through IAP to {len(missing)} of {len(targets)} workers ({labels}): "
            "their guest attributes publish no hostname (the VM instance name IAP takes)",
            hint="check that the compute.disableGuestAttributesAccess organization policy is "
            "not enforced and the node's metadata does not set enable-guest-attributes=FALSE, "
            "that the TPU was created after March 24, 2022, and that it is READY; or use "
            "--proxy-jump HOST",
        )
    return [replace(t, instance=names[(t.node_id, t.worker)]) for t in targets]


def host_key_checks(
    api: TpuApi, targets: list[WorkerTarget], settings: SshSettings, warn: Progress
) -> tuple[list[WorkerTarget], HostKeyPins | None]:
    """The targets with the host keys their guest attributes publish, and tpuctl's pins
    (~/.ssh/tpuctl_known_hosts) for the rest; (targets, None) with checking off."""
    checking = settings.strict_host_key_checking
    if checking not in CHECKING_MODES:
        raise UsageError(
            f"--strict-host-key-checking {quoted(checking)}: use {', '.join(CHECKING_MODES)}"
        )
    if checking == "no":
        return targets, None
    pins = HostKeyPins.load(settings.known_hosts or default_path(), checking, warn)
    keys = cloud_nodes.host_keys(api, list(dict.fromkeys(t.node_id for t in targets)))
    return [t.with_host_keys(keys.get((t.node_id, t.worker), [])) for t in targets], pins
