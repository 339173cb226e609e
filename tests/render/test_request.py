"""render_request: the v2alpha1 request, field for field against Cloud TPU's own examples."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tpuctl.errors import SpecError
from tpuctl.render.request import (
    label_value,
    render_request,
    request_as_dict,
    request_as_json,
)
from tpuctl.render.startup import render_startup_script
from tpuctl.spec.load import spec_fingerprint
from tpuctl.spec.model import CapacitySpec, CheckpointSpec, JobSpec, Spec, TpuSpec

PROJECT, ZONE = "my-project", "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
STARTUP = "#!/bin/bash\necho hello from the multislice overview\n"


def overview_spec(tier: str = "reserved") -> Spec:
    """The Cloud TPU Multislice overview's curl example, written as a tpuctl Spec (no job: the
    example brings its own startup-script)."""
    return Spec(
        name="my-qr",
        tpu=TpuSpec(
            accelerator="v4-128",
            runtime="tpu-ubuntu2204-base",
            slices=4,
            network="my-network",
            subnetwork="my-subnetwork",
            external_ips=True,
            tags=("tpu-vm", "multislice"),
            metadata={"startup-script": STARTUP},
        ),
        capacity=CapacitySpec(tier=tier),  # type: ignore[arg-type]
    )


def overview_body(spec: Spec, tier: dict[str, Any]) -> dict[str, Any]:
    """The documented request body, plus the labels tpuctl adds (spelled out here on purpose)."""
    return {
        **tier,
        "tpu": {
            "node_spec": [
                {
                    "parent": PARENT,
                    "node": {
                        "accelerator_type": "v4-128",
                        "runtime_version": "tpu-ubuntu2204-base",
                        "network_config": {
                            "network": "my-network",
                            "subnetwork": "my-subnetwork",
                            "enable_external_ips": True,
                        },
                        "tags": ["tpu-vm", "multislice"],
                        "metadata": {"startup-script": STARTUP},
                        "labels": {
                            "managed-by": "tpuctl",
                            "tpuctl-job": "my-qr",
                            "tpuctl-spec-hash": spec_fingerprint(spec),
                        },
                    },
                    "multi_node_params": {"node_count": 4, "node_id_prefix": "my-qr"},
                }
            ]
        },
    }


@pytest.mark.parametrize(
    ("tier", "tier_fields"),
    [
        ("reserved", {"guaranteed": {"reserved": True}}),
        ("spot", {"spot": {}}),
        ("on-demand", {}),
        ("best-effort", {"best_effort": {}}),
    ],
)
def test_multislice_overview_example_field_for_field(
    tier: str, tier_fields: dict[str, Any]
) -> None:
    spec = overview_spec(tier)
    data = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))
    assert data == {
        "parent": PARENT,
        "queued_resource_id": "my-qr",
        "queued_resource": overview_body(spec, tier_fields),
    }


def test_single_slice_uses_node_id_and_job_adds_startup_script_and_run_label() -> None:
    job = JobSpec(command="python3 train.py", run_name="Run.One_2")
    spec = Spec(
        name="one",
        tpu=TpuSpec(
            accelerator="v4-8",
            runtime="tpu-ubuntu2204-base",
            labels={"team": "ml"},
            metadata={"k": "v"},
            description="d",
        ),
        checkpoint=CheckpointSpec(dir="gs://b/x", autocheckpoint=True),
        job=job,
    )
    node_spec = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))[
        "queued_resource"
    ]["tpu"]["node_spec"][0]
    assert node_spec["node_id"] == "one"
    assert "multi_node_params" not in node_spec
    node = node_spec["node"]
    # The run's record is named by its run name (so `reconcile --all --project` finds it).
    assert node["metadata"] == {
        "k": "v",
        "startup-script": render_startup_script(spec),
        "tpuctl-record": "gs://b/x/tpuctl/Run.One_2",
    }
    assert node["labels"] == {
        "team": "ml",
        "managed-by": "tpuctl",
        "tpuctl-job": "one",
        "tpuctl-spec-hash": spec_fingerprint(spec),
        "tpuctl-run": "run-one_2",
    }
    assert node["autocheckpoint_enabled"] is True
    assert node["description"] == "d"


def test_external_ips_false_is_explicit_and_network_only_what_is_set() -> None:
    spec = Spec(name="x", tpu=TpuSpec(accelerator="v4-8", runtime="r", external_ips=False))
    node = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))["queued_resource"][
        "tpu"
    ]["node_spec"][0]["node"]
    assert node["network_config"] == {"enable_external_ips": False}
    assert "autocheckpoint_enabled" not in node
    assert "service_account" not in node


def test_service_account_and_scopes() -> None:
    spec = Spec(
        name="x",
        tpu=TpuSpec(
            accelerator="v4-8",
            runtime="r",
            service_account="sa@p.iam.gserviceaccount.com",
            scopes=("https://www.googleapis.com/auth/cloud-platform",),
        ),
    )
    node = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))["queued_resource"][
        "tpu"
    ]["node_spec"][0]["node"]
    assert node["service_account"] == {
        "email": "sa@p.iam.gserviceaccount.com",
        "scope": ["https://www.googleapis.com/auth/cloud-platform"],
    }


def test_accelerator_config_form() -> None:
    spec = Spec(
        name="x",
        tpu=TpuSpec(
            accelerator="v5litepod-16",
            runtime="v2-alpha-tpuv5-lite",
            type="v5litepod",
            topology="4x4",
        ),
    )
    node = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))["queued_resource"][
        "tpu"
    ]["node_spec"][0]["node"]
    assert node["accelerator_config"] == {"type": "V5LITE_POD", "topology": "4x4"}
    assert "accelerator_type" not in node
    request = render_request(spec, project=PROJECT, zone=ZONE)
    config = request.queued_resource.tpu.node_spec[0].node.accelerator_config
    assert config.type_.name == "V5LITE_POD"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("my-res", f"projects/{PROJECT}/locations/{ZONE}/reservations/my-res"),
        (
            "projects/other/locations/us-east5-a/reservations/r",
            "projects/other/locations/us-east5-a/reservations/r",
        ),
    ],
)
def test_reservation_name_expansion(given: str, expected: str) -> None:
    spec = replace(overview_spec(), capacity=CapacitySpec(tier="reserved", reservation=given))
    data = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))
    assert data["queued_resource"]["reservation_name"] == expected
    assert data["queued_resource"]["guaranteed"] == {"reserved": True}


def policy_for(capacity: CapacitySpec, now: datetime | None = None) -> Any:
    spec = replace(overview_spec(), capacity=capacity)
    data = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE, now=now))
    return data["queued_resource"].get("queueing_policy")


def test_queueing_policy_durations_and_times() -> None:
    assert policy_for(CapacitySpec()) is None
    assert policy_for(CapacitySpec(valid_until=timedelta(hours=6))) == {
        "valid_until_duration": "21600s"
    }
    assert policy_for(CapacitySpec(valid_after=timedelta(minutes=10))) == {
        "valid_after_duration": "600s"
    }
    until = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert policy_for(CapacitySpec(valid_until=until)) == {
        "valid_until_time": "2030-01-02T01:04:05Z"
    }
    after = datetime(2030, 1, 1, 0, 0, 0, tzinfo=timezone.utc)
    assert policy_for(CapacitySpec(valid_after=after)) == {
        "valid_after_time": "2030-01-01T00:00:00Z"
    }


def test_both_bounds_become_one_valid_interval() -> None:
    after = datetime(2030, 1, 1, tzinfo=timezone.utc)
    until = datetime(2030, 1, 1, 6, tzinfo=timezone.utc)
    assert policy_for(CapacitySpec(valid_after=after, valid_until=until)) == {
        "valid_interval": {"start_time": "2030-01-01T00:00:00Z", "end_time": "2030-01-01T06:00:00Z"}
    }
    # A relative bound needs the caller's clock, as gcloud does it.
    mixed = CapacitySpec(valid_after=after, valid_until=timedelta(hours=8))
    with pytest.raises(SpecError) as caught:
        policy_for(mixed)
    assert caught.value.path == "capacity.valid_until"
    assert policy_for(mixed, now=datetime(2030, 1, 1, tzinfo=timezone.utc)) == {
        "valid_interval": {"start_time": "2030-01-01T00:00:00Z", "end_time": "2030-01-01T08:00:00Z"}
    }


def test_request_id_and_json_is_stable() -> None:
    request = render_request(overview_spec(), project=PROJECT, zone=ZONE, request_id="abc-123")
    assert request.request_id == "abc-123"
    text = request_as_json(request)
    assert text == request_as_json(
        render_request(overview_spec(), project=PROJECT, zone=ZONE, request_id="abc-123")
    )
    assert json.loads(text) == request_as_dict(request)
    assert text.endswith("}\n") and '\n  "parent"' in text
    keys = list(json.loads(text))
    assert keys == sorted(keys)


def test_a_startup_script_of_the_specs_own_replaces_tpuctls() -> None:
    spec = replace(overview_spec(), job=JobSpec(command="true"))
    own = spec.tpu.metadata["startup-script"]
    request = render_request(spec, project=PROJECT, zone=ZONE)
    node = request.queued_resource.tpu.node_spec[0].node
    assert node.metadata["startup-script"] == own


@pytest.mark.parametrize(
    ("text", "value"),
    [("demo", "demo"), ("My.Run_1", "my-run_1"), ("a" * 80, "a" * 63), ("é+x", "-x")],
)
def test_label_value(text: str, value: str) -> None:
    assert label_value(text) == value


def test_the_record_location_is_in_the_metadata_only_for_a_job_with_checkpoint_dir() -> None:
    tpu = TpuSpec(accelerator="v4-8", runtime="tpu-ubuntu2204-base", metadata={"k": "v"})

    def metadata(spec: Spec) -> dict[str, str]:
        node = request_as_dict(render_request(spec, project=PROJECT, zone=ZONE))["queued_resource"][
            "tpu"
        ]["node_spec"][0]["node"]
        return {key: value for key, value in node["metadata"].items() if key != "startup-script"}

    job = JobSpec(command="true")
    with_dir = CheckpointSpec(dir="/mnt/ckpt")
    assert metadata(Spec(name="a", tpu=tpu, job=job, checkpoint=with_dir)) == {
        "k": "v",
        "tpuctl-record": "/mnt/ckpt/tpuctl/a",
    }
    assert metadata(Spec(name="a", tpu=tpu, job=job)) == {"k": "v"}  # its record is local
    assert metadata(Spec(name="a", tpu=tpu, checkpoint=with_dir)) == {"k": "v"}  # no run
