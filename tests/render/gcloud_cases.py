"""The specs that ask for what each recorded gcloud case asks for (tests/emulator/
gcloud_bodies.json), and the one normalisation that makes the two bodies comparable: what
gcloud alpha adds to every body by default, whatever the flags.

What gcloud 528 adds by default (create.yaml's hooks, util.CreateNodeSpec): `provisioningModel:
STANDARD` when --provisioning-model is not given, `autocheckpointEnabled: false`, `metadata:
{}`, `serviceAccount: {}` and `networkConfig.network: "default"`. tpuctl leaves those out: the
service's defaults are the same. Nothing else is normalised.
"""

from __future__ import annotations

import copy
from typing import Any

from tpuctl.spec.load import load_spec_text
from tpuctl.spec.model import Spec

HEAD = """apiVersion: tpuctl/v1
name: {name}
tpu:
  accelerator: v6e-4
  runtime: v2-alpha-tpuv6e
"""
KMS_KEY = "projects/{project}/locations/us-east5/keyRings/ring/cryptoKeys/key"

# case → the spec's text after HEAD ({project} and {zone} filled in by `spec_for`).
CASES: dict[str, str] = {
    "best-effort": "capacity: {{tier: best-effort}}\n",
    "reserved": "capacity: {{tier: reserved}}\n",
    "spot": "capacity: {{tier: spot}}\n",
    "flex-start": "capacity: {{tier: flex-start, max_run_duration: 1d}}\n",
    "reservation-bound": "capacity: {{tier: reservation-bound, reservation: calendar}}\n",
    "boot-disk": (f"  boot_disk:\n    kms_key: {KMS_KEY}\n    confidential_compute: true\n"),
    "data-disks": (
        "  data_disks:\n"
        "    - {{source: 'projects/{project}/zones/{zone}/disks/data', mode: read-only}}\n"
        "    - {{source: 'projects/{project}/zones/{zone}/disks/scratch'}}\n"
    ),
    "secure-boot": "  secure_boot: true\n",
    "workload-type": "  slices: 2\n  workload_type: availability-optimized\n",
    "node-settings": (
        "  external_ips: false\n"
        "  metadata: {{startup-script: 'true'}}\n"
        "  labels: {{team: ml}}\n"
        "  tags: [tpu]\n"
        "  description: run\n"
        "capacity: {{valid_until: 2h}}\n"
        "checkpoint: {{dir: 'gs://bucket/run', autocheckpoint: true}}\n"
    ),
}
# The node id (or prefix) each recorded case gave gcloud, where it is not the case's name.
NAMES = {"workload-type": "workload"}
# Recorded cases no spec asks for: the GA track (tpuctl speaks v2alpha1), and
# --provisioning-model=spot (tpuctl's spot is `spot: {}`, gcloud's --spot).
NOT_TPUCTLS = frozenset({"ga-spot", "spot-model"})


def spec_for(case: str, *, project: str, zone: str, name: str | None = None) -> Spec:
    """The spec of `case`, named `name` (the case by default)."""
    text = HEAD.format(name=name or NAMES.get(case, case)) + CASES[case].format(
        project=project, zone=zone
    )
    # node-settings brings a startup script of its own: it warns, which is what it means.
    return load_spec_text(text, environ={}).spec


def without_gcloud_defaults(body: dict[str, Any]) -> dict[str, Any]:
    """`body` (gcloud's) without what gcloud alpha adds to every body (the module doc)."""
    body = copy.deepcopy(body)
    if body.get("provisioningModel") == "STANDARD":
        del body["provisioningModel"]
    for node_spec in body.get("tpu", {}).get("nodeSpec", []):
        node = node_spec.get("node", {})
        for key, default in (("autocheckpointEnabled", False), ("metadata", {})):
            if node.get(key) == default:
                del node[key]
        if node.get("serviceAccount") == {}:
            del node["serviceAccount"]
        network = node.get("networkConfig", {})
        if network.get("network") == "default":
            del network["network"]
    return body


def without_labels(body: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """`body` (tpuctl's) without `labels` (tpuctl's own, which the recorded runs of gcloud
    were not given); a node left with no label has no `labels` at all, as gcloud sends it."""
    body = copy.deepcopy(body)
    for node_spec in body.get("tpu", {}).get("nodeSpec", []):
        node = node_spec.get("node", {})
        kept = {k: v for k, v in node.get("labels", {}).items() if k not in labels}
        if kept:
            node["labels"] = kept
        else:
            node.pop("labels", None)
    return body
