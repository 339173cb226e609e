"""render_gcloud: the equivalent gcloud command, checked word for word through a real shell."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from tpuctl.render.gcloud import gcloud_duration, render_gcloud
from tpuctl.spec.load import spec_fingerprint
from tpuctl.spec.model import CapacitySpec, CheckpointSpec, JobSpec, Spec, TpuSpec

PROJECT, ZONE = "my-project", "us-central2-b"


def argv(command: str) -> list[str]:
    """The words a POSIX shell passes to gcloud for `command`."""
    shim = "gcloud() { printf '%s\\0' \"$@\"; }\n"
    out = subprocess.run(
        ["sh", "-c", shim + command], capture_output=True, check=True
    ).stdout.decode()
    return out.split("\0")[:-1]


def test_multislice_reserved_with_job() -> None:
    spec = Spec(
        name="ms",
        tpu=TpuSpec(
            accelerator="v4-16",
            runtime="tpu-ubuntu2204-base",
            slices=2,
            network="net",
            subnetwork="sub",
            tags=("a", "b"),
            service_account="sa@p.iam.gserviceaccount.com",
            scopes=("s1", "s2"),
            metadata={"note": "it's, fine"},
            description="two words",
        ),
        capacity=CapacitySpec(tier="reserved", reservation="res", valid_until=timedelta(hours=6)),
        checkpoint=CheckpointSpec(dir="gs://b", autocheckpoint=True),
        job=JobSpec(command="true", run_name="ms"),
    )
    text = render_gcloud(spec, project=PROJECT, zone=ZONE)
    assert text.startswith("gcloud alpha compute tpus queued-resources create ms \\\n")
    assert argv(text) == [
        "alpha", "compute", "tpus", "queued-resources", "create", "ms",
        f"--project={PROJECT}",
        f"--zone={ZONE}",
        "--accelerator-type=v4-16",
        "--runtime-version=tpu-ubuntu2204-base",
        "--node-count=2",
        "--node-prefix=ms",
        "--reserved",
        # gcloud expands a bare name to this project and zone, and drops a whole one.
        "--reservation=res",
        "--valid-until-duration=6h",
        "--network=net",
        "--subnetwork=sub",
        "--tags=a,b",
        f"--labels=managed-by=tpuctl,tpuctl-job=ms,tpuctl-spec-hash={spec_fingerprint(spec)},"
        "tpuctl-run=ms",
        "--service-account=sa@p.iam.gserviceaccount.com",
        "--scopes=s1,s2",
        "--metadata-from-file=startup-script=startup.sh",
        # A comma in a value switches to gcloud's alternate delimiter syntax; the run's
        # record location travels beside the user's metadata.
        "--metadata=^|^note=it's, fine|tpuctl-record=gs://b/tpuctl/ms",
        "--autocheckpoint-enabled",
        "--description=two words",
    ]  # fmt: skip


def test_single_slice_spot_internal_ips_and_times() -> None:
    spec = Spec(
        name="one",
        tpu=TpuSpec(accelerator="v5litepod-16", runtime="v2-alpha-tpuv5-lite", external_ips=False),
        capacity=CapacitySpec(
            tier="spot",
            valid_after=datetime(2030, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),
            valid_until=datetime(2030, 1, 1, 6, tzinfo=timezone.utc),
        ),
    )
    words = argv(render_gcloud(spec, project=PROJECT, zone=ZONE))
    assert "--node-id=one" in words and "--spot" in words and "--internal-ips" in words
    assert "--valid-after-time=2030-01-01T00:00:00Z" in words
    assert "--valid-until-time=2030-01-01T06:00:00Z" in words
    assert not any(word.startswith("--metadata") for word in words)
    assert "--autocheckpoint-enabled" not in words


def test_type_topology_best_effort_and_on_demand() -> None:
    spec = Spec(
        name="cfg",
        tpu=TpuSpec(accelerator="v5litepod-16", runtime="r", type="v5litepod", topology="4x4"),
        capacity=CapacitySpec(tier="best-effort"),
    )
    words = argv(render_gcloud(spec, project=PROJECT, zone=ZONE))
    assert "--type=v5litepod" in words and "--topology=4x4" in words
    assert "--best-effort" in words
    assert not any(word.startswith("--accelerator-type") for word in words)
    on_demand = argv(
        render_gcloud(replace(spec, capacity=CapacitySpec()), project=PROJECT, zone=ZONE)
    )
    assert not {"--spot", "--reserved", "--best-effort"} & set(on_demand)


def test_hostile_values_are_quoted_for_the_shell() -> None:
    spec = Spec(
        name="q",
        tpu=TpuSpec(accelerator="v4-8", runtime="r", description="$(rm -rf /) `x` 'y' \"z\"\n"),
    )
    words = argv(render_gcloud(spec, project="p;echo", zone="z"))
    assert "--description=$(rm -rf /) `x` 'y' \"z\"\n" in words
    assert "--project=p;echo" in words


def test_gcloud_duration() -> None:
    assert gcloud_duration(timedelta(hours=6)) == "6h"
    assert gcloud_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert gcloud_duration(timedelta(days=2, seconds=5)) == "2d5s"
    assert gcloud_duration(timedelta(0)) == "0s"
