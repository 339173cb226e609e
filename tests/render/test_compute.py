"""Compute Engine requests rendered from `tpu.api: compute` specs: every body of a matrix of
accelerators and tiers is valid against compute v1's discovery document (no unknown field,
every enum known, nothing read-only), with the machine type, hosts and topology of the
emulator's catalog; and the gcloud lines say what only the API carries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import invoke
from tpuctl.emulator.compute.catalog import machine_type, single_host, slice_of
from tpuctl.emulator.compute.discovery import problems
from tpuctl.render.compute import ComputePlan, compute_names, render_compute
from tpuctl.render.compute_gcloud import render_compute_gcloud
from tpuctl.spec.load import load_spec_text
from tpuctl.spec.model import Spec

PROJECT, ZONE = "my-project", "us-east5-b"
IMAGE = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
SCHEMAS = {
    "instances": "Instance",
    "resourcePolicies": "ResourcePolicy",
    "instanceTemplates": "InstanceTemplate",
    "instanceGroupManagers": "InstanceGroupManager",
}
TIERS = {
    "spot": "  tier: spot\n",
    "on-demand": "  tier: on-demand\n",
    "flex-start": "  tier: flex-start\n  max_run_duration: 4h\n  valid_until: 30m\n",
    "reserved": "  tier: reserved\n  reservation: my-reservation\n",
    "reservation-bound": "  tier: reservation-bound\n"
    "  reservation: projects/shared-project/locations/us-east5-b/reservations/calendar\n",
}
FLEX_DAY = "  tier: flex-start\n  max_run_duration: 1d\n"
MODELS = {
    "spot": "SPOT",
    "on-demand": "STANDARD",
    "flex-start": "FLEX_START",
    "reserved": "STANDARD",
    "reservation-bound": "RESERVATION_BOUND",
}


def spec_of(tpu: str, capacity: str = "", extra: str = "") -> Spec:
    text = (
        "apiVersion: tpuctl/v1\nname: run-1\ntpu:\n  api: compute\n"
        f"{tpu}  runtime: {IMAGE}\n{extra}"
        + (f"capacity:\n{capacity}" if capacity else "")
        + "job:\n  command: python3 train.py\n"
    )
    return load_spec_text(text).spec


def plan_of(spec: Spec, script: str | None = "#!/bin/bash\necho hi\n") -> ComputePlan:
    return render_compute(spec, project=PROJECT, zone=ZONE, run_name="run-1", startup_script=script)


def assert_valid(plan: ComputePlan) -> None:
    for request in plan.requests:
        assert request.method == "insert"
        found = problems(SCHEMAS[request.resource], request.body, output_only=False)
        assert found == [], f"{request.resource}: {[str(problem) for problem in found]}"


def vm_of(plan: ComputePlan) -> dict[str, Any]:
    """The body every VM is made from: the instance, or the template's properties."""
    body = plan.requests[0].body if plan.single_host else plan.requests[1].body["properties"]
    return body


CASES = [
    (f"v6e-{chips} {tier}", f"  accelerator: v6e-{chips}\n", TIERS[tier], tier)
    for chips in (1, 4, 8)
    for tier in TIERS
] + [
    ("v5p-16 flex-start", "  accelerator: v5p-16\n", FLEX_DAY, "flex-start"),
    ("tpu7x 2x2x2 spot", "  type: tpu7x\n  topology: 2x2x2\n", TIERS["spot"], "spot"),
    ("tpu7x-8 on-demand", "  accelerator: tpu7x-8\n", "", "on-demand"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("tpu", "capacity", "tier"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_request_is_valid_compute_v1(tpu: str, capacity: str, tier: str) -> None:
    plan = plan_of(spec_of(tpu, capacity))
    assert_valid(plan)
    scheduling = vm_of(plan)["scheduling"]
    assert scheduling["provisioningModel"] == MODELS[tier]
    assert scheduling["onHostMaintenance"] == "TERMINATE"  # TPU VMs cannot live-migrate
    # The emulator's catalog (its reading of Compute Engine's TPU machine types) agrees on the
    # machine type and the number of hosts.
    machine = machine_type(plan.machine_type, "machineType")
    expected = single_host(machine) if plan.single_host else slice_of(machine, plan.topology, "")
    assert (expected.hosts, expected.accelerator_type) == (plan.hosts, plan.accelerator)


@pytest.mark.parametrize(
    ("accelerator", "machine"),
    [
        ("v6e-1", "ct6e-standard-1t"),
        ("v6e-4", "ct6e-standard-4t"),
        ("v6e-8", "ct6e-standard-8t"),
        ("v5p-8", "ct5p-hightpu-4t"),
        ("tpu7x-8", "tpu7x-standard-4t"),
    ],
)
def test_a_single_host_is_one_instance_insert(accelerator: str, machine: str) -> None:
    plan = plan_of(spec_of(f"  accelerator: {accelerator}\n"))
    [request] = plan.requests
    assert (request.resource, request.scope) == ("instances", {"project": PROJECT, "zone": ZONE})
    assert (plan.single_host, plan.hosts, plan.machine_type) == (True, 1, machine)
    body = request.body
    assert body["name"] == plan.names.instance == "run-1"
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/{machine}"
    [boot] = body["disks"]
    assert boot["boot"] and boot["autoDelete"]
    assert boot["initializeParams"]["sourceImage"] == (
        f"projects/ubuntu-os-accelerator-images/global/images/family/{IMAGE}"
    )
    metadata = {item["key"]: item["value"] for item in body["metadata"]["items"]}
    assert metadata["startup-script"] == "#!/bin/bash\necho hi\n"
    assert metadata["enable-guest-attributes"] == "TRUE"
    assert body["labels"]["managed-by"] == "tpuctl"
    assert body["labels"]["tpuctl-job"] == "run-1"
    assert body["networkInterfaces"] == [
        {
            "network": "global/networks/default",
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
        }
    ]


def test_a_multi_host_slice_is_a_policy_a_template_and_a_bulk_group_in_that_order() -> None:
    plan = plan_of(spec_of("  type: tpu7x\n  topology: 2x2x2\n"))
    assert [request.resource for request in plan.requests] == [
        "resourcePolicies",
        "instanceTemplates",
        "instanceGroupManagers",
    ]
    policy, template, group = plan.requests
    names = compute_names("run-1")
    assert plan.names == names
    assert (plan.hosts, plan.machine_type, plan.single_host) == (2, "tpu7x-standard-4t", False)
    assert policy.scope == {"project": PROJECT, "region": "us-east5"}
    assert policy.body == {
        "name": names.policy,
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"},
    }
    assert template.scope == {"project": PROJECT}
    assert template.body["name"] == names.template
    assert template.body["properties"]["machineType"] == "tpu7x-standard-4t"  # a bare name
    assert group.scope == {"project": PROJECT, "zone": ZONE}
    assert group.body == {
        "name": "run-1",
        "baseInstanceName": "run-1",
        "instanceTemplate": f"projects/{PROJECT}/global/instanceTemplates/{names.template}",
        "targetSize": 2,
        "targetSizePolicy": {"mode": "BULK"},
        "resourcePolicies": {
            "workloadPolicy": f"projects/{PROJECT}/regions/us-east5/resourcePolicies/{names.policy}"
        },
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    }


def test_v6e_16_is_four_hosts_of_four_chips_in_a_4x4() -> None:
    plan = plan_of(spec_of("  accelerator: v6e-16\n"))
    assert (plan.hosts, plan.machine_type, plan.topology) == (4, "ct6e-standard-4t", "4x4")
    assert_valid(plan)


def test_capacity_fields() -> None:
    flex = vm_of(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["flex-start"])))
    assert flex["scheduling"]["maxRunDuration"] == {"seconds": "14400"}
    assert flex["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert flex["params"] == {"requestValidForDuration": {"seconds": "1800"}}
    spot = vm_of(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["spot"])))
    assert spot["scheduling"]["instanceTerminationAction"] == "STOP"
    assert "gracefulShutdown" not in spot["scheduling"]
    assert "params" not in spot and "reservationAffinity" not in spot
    reserved = vm_of(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["reserved"])))
    assert reserved["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["my-reservation"],
    }
    bound = vm_of(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["reservation-bound"])))
    assert bound["reservationAffinity"]["values"] == [
        "projects/shared-project/reservations/calendar"
    ]
    on_demand = vm_of(plan_of(spec_of("  accelerator: v6e-8\n")))
    assert on_demand["scheduling"]["gracefulShutdown"] == {
        "enabled": True,
        "maxDuration": {"seconds": "300"},
    }


def test_node_fields_on_every_vm() -> None:
    extra = (
        "  network: tpu-net\n  subnetwork: tpu-subnet\n  external_ips: false\n"
        "  tags: [tpu-job]\n  labels: {team: ml}\n  service_account: sa@p.iam.gserviceaccount.com\n"
        "  scopes: [https://www.googleapis.com/auth/devstorage.read_write]\n"
        "  metadata: {extra-key: v}\n  description: a run\n  secure_boot: true\n"
        "  boot_disk:\n    size_gb: 200\n    image: projects/p/global/images/mine\n"
        "    kms_key: projects/p/locations/us-east5/keyRings/r/cryptoKeys/k\n"
        "  data_disks:\n    - source: data\n      mode: read-only\n"
    )
    for accelerator in ("v6e-8", "v5p-16"):
        plan = plan_of(spec_of(f"  accelerator: {accelerator}\n", extra=extra))
        assert_valid(plan)
        vm = vm_of(plan)
        [interface] = vm["networkInterfaces"]
        assert interface == {
            "network": "global/networks/tpu-net",
            "subnetwork": "regions/us-east5/subnetworks/tpu-subnet",
        }
        assert vm["tags"] == {"items": ["tpu-job"]}
        assert vm["labels"]["team"] == "ml"
        assert vm["serviceAccounts"] == [
            {
                "email": "sa@p.iam.gserviceaccount.com",
                "scopes": ["https://www.googleapis.com/auth/devstorage.read_write"],
            }
        ]
        metadata = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
        assert metadata["extra-key"] == "v"
        assert vm["description"] == "a run"
        assert vm["shieldedInstanceConfig"] == {"enableSecureBoot": True}
        boot, data = vm["disks"]
        assert boot["initializeParams"] == {
            "sourceImage": "projects/p/global/images/mine",
            "diskSizeGb": "200",
        }
        assert boot["diskEncryptionKey"]["kmsKeyName"].endswith("/cryptoKeys/k")
        assert data == {
            "boot": False,
            "autoDelete": False,
            "source": f"projects/{PROJECT}/zones/{ZONE}/disks/data",
            "mode": "READ_ONLY",
        }


def test_without_a_given_script_the_spec_s_own_is_rendered() -> None:
    plan = plan_of(spec_of("  accelerator: v6e-8\n"), script=None)
    metadata = {item["key"]: item["value"] for item in vm_of(plan)["metadata"]["items"]}
    assert metadata["startup-script"].startswith("#!")
    assert "python3 train.py" in metadata["startup-script"]


def test_gcloud_lines_use_the_lowest_track_and_say_what_only_the_api_carries() -> None:
    single = render_compute_gcloud(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["flex-start"])))
    assert "gcloud alpha compute instances create run-1 \\\n" in single
    assert "--provisioning-model=FLEX_START" in single
    assert "--max-run-duration=4h" in single
    assert "# no gcloud flag for params.requestValidForDuration (30m)" in single
    assert "--metadata-from-file=startup-script=startup.sh" in single
    spot = render_compute_gcloud(plan_of(spec_of("  accelerator: v6e-8\n", TIERS["spot"])))
    assert spot.startswith("gcloud compute instances create run-1 \\\n")  # GA has every flag
    sliced = render_compute_gcloud(plan_of(spec_of("  type: tpu7x\n  topology: 2x2x2\n")))
    commands = [line for line in sliced.splitlines() if line.startswith("gcloud ")]
    assert commands == [
        "gcloud compute resource-policies create workload-policy run-1-wp \\",
        "gcloud beta compute instance-templates create run-1-tpl \\",
        "gcloud alpha compute instance-groups managed create run-1 \\",
    ]
    assert "--accelerator-topology=2x2x2" in sliced
    assert "--target-size-policy-mode=bulk" in sliced
    assert "no gcloud flag for instanceLifecyclePolicy.defaultActionOnFailure" in sliced


def test_tpuctl_render_prints_every_request_in_order(tmp_path: Any) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"apiVersion: tpuctl/v1\nname: run-1\ntpu:\n  api: compute\n  accelerator: v5p-16\n"
        f"  runtime: {IMAGE}\n",
        encoding="utf-8",
    )
    where = ["--project", PROJECT, "--zone", ZONE]
    raw = invoke(["render", str(spec), *where])
    assert raw.exit_code == 0, raw.stderr
    requests = json.loads(raw.stdout)
    assert [request["method"] for request in requests] == [
        "resourcePolicies.insert",
        "instanceTemplates.insert",
        "instanceGroupManagers.insert",
    ]
    assert requests[2]["body"]["targetSize"] == 2
    wrapped = invoke(["render", str(spec), *where, "--format", "json"]).json()
    assert (wrapped["kind"], wrapped["api"], wrapped["request"]) == ("Render", "compute", None)
    assert wrapped["requests"] == requests
    gcloud = invoke(["render", str(spec), *where, "--what", "gcloud"])
    assert gcloud.exit_code == 0
    assert "gcloud compute resource-policies create workload-policy run-1-wp" in gcloud.stdout


def test_the_cloud_tpu_request_is_refused_for_a_compute_spec() -> None:
    from tpuctl.errors import SpecError
    from tpuctl.render.request import render_request

    with pytest.raises(SpecError, match="made by Compute Engine"):
        render_request(spec_of("  accelerator: v6e-8\n"), project=PROJECT, zone=ZONE)
