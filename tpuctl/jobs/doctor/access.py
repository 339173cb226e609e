"""SSH access as it will be used: OS Login or metadata keys, and a firewall path for port 22."""

from __future__ import annotations

from tpuctl.jobs.doctor.checks import (
    Check,
    Inputs,
    noted,
    passed,
    warned,
)

# --------------------------------------------------------------------------- SSH access


def ssh_check(inputs: Inputs) -> list[Check]:
    """How SSH will authenticate: OS Login when node or project metadata turns it on (the
    node's own value wins), else keys in the node's ssh-keys metadata."""
    from tpuctl.cloud.oslogin import os_login_setting

    setting = os_login_setting(
        inputs.spec.tpu.metadata,
        inputs.location,
        credentials=inputs.credentials,
        environ=inputs.environ,
    )
    if setting.unread is not None and not inputs.emulator:
        return [
            warned(
                "ssh",
                f"cannot read project metadata ({setting.unread}): assuming ssh-keys in node "
                "metadata, unless the project turns OS Login on",
                "grant compute.projects.get (roles/compute.viewer) to check it",
            )
        ]
    source = {
        "node": "the spec's tpu.metadata",
        "project": "project metadata",
        "default": "no enable-oslogin set",
    }[setting.decided_by]
    if setting.unread is not None:  # the emulator, without its Compute Engine endpoint
        source = f"project metadata unread: {setting.unread}"
    return [_ssh_line(setting.enabled, source)]


def _ssh_line(os_login: bool, source: str) -> Check:
    if os_login:
        return noted(
            "ssh",
            f"OS Login (enable-oslogin TRUE in {source}): the key goes to the OS Login profile",
        )
    return noted("ssh", f"ssh-keys in node metadata ({source}), key ~/.ssh/google_compute_engine")


def firewall_check(inputs: Inputs) -> list[Check]:
    """A rule that lets tcp:22 reach the VMs: any source counts (tpuctl connects directly, or
    through a bastion); whether IAP's range is admitted (--tunnel-through-iap) is said too."""
    from tpuctl.cloud.compute_rest import IAP_RANGE, ComputeError, firewall_rules, ssh_path

    name = "firewall"
    if inputs.emulator:
        return [noted(name, "skipped on the emulator (it has no firewalls)")]
    tpu = inputs.spec.tpu
    network = (tpu.network or "default").rsplit("/", 1)[-1]
    try:
        rules = firewall_rules(inputs.project, inputs.credentials, environ=inputs.environ)
    except ComputeError as error:
        return [
            warned(
                name,
                f"cannot list firewall rules: {error.message}",
                "grant compute.firewalls.list (roles/compute.viewer) to check them",
            )
        ]
    path = ssh_path(rules, network, tpu.tags, tpu.service_account)
    if not path.rules:
        return [
            warned(
                name,
                f"no firewall rule on network {network} lets tcp:22 in to the TPU VMs",
                f"gcloud compute firewall-rules create allow-ssh --project {inputs.project} "
                f"--network {network} --direction INGRESS --allow tcp:22 "
                "--source-ranges YOUR_IP/32",
            )
        ]
    iap = "admitted" if path.iap else "not admitted (--tunnel-through-iap cannot get in)"
    sources = ", ".join(path.sources) or "no source ranges"
    return [
        passed(
            name,
            f"tcp:22 on {network} open by {', '.join(path.rules)} from {sources}; IAP's "
            f"{IAP_RANGE} {iap}; deny rules not weighed",
            "warning",
        )
    ]
