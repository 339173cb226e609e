"""What `tpuctl render` asks for equals what the real gcloud sends for the same flags (the
bodies gcloud 528 sent, recorded in tests/emulator/gcloud_bodies.json by the end-to-end tests),
once gcloud's own defaults are set aside (tests/render/gcloud_cases.py says which); and what
gcloud cannot send (the boot disk's size and image) fits the discovery document's schema."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.render.gcloud_cases import (
    CASES,
    NOT_TPUCTLS,
    spec_for,
    without_gcloud_defaults,
    without_labels,
)
from tpuctl.render.gcloud import render_gcloud
from tpuctl.render.request import render_request, request_as_dict, tpuctl_labels
from tpuctl.spec.load import load_spec_text

BODIES = Path(__file__).resolve().parents[1] / "emulator" / "gcloud_bodies.json"
PROJECT, ZONE = "{project}", "{zone}"  # the recorded bodies' placeholders
RECORDED = json.loads(BODIES.read_text())["cases"]


def test_every_recorded_case_has_a_spec_or_a_reason() -> None:
    assert set(RECORDED) == set(CASES) | NOT_TPUCTLS


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_rendered_body_is_the_one_gcloud_sends(case: str) -> None:
    spec = spec_for(case, project=PROJECT, zone=ZONE)
    request = render_request(spec, project=PROJECT, zone=ZONE)
    ours = without_labels(request.rest_body(), tpuctl_labels(spec))
    theirs = without_gcloud_defaults(RECORDED[case]["body"])
    assert ours == theirs


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_gcloud_line_has_the_recorded_flags(case: str) -> None:
    """`render --what gcloud` gives gcloud the flags the recorded case gave it (the labels
    tpuctl adds and the node id or prefix aside)."""
    spec = spec_for(case, project=PROJECT, zone=ZONE)
    line = render_gcloud(spec, project=PROJECT, zone=ZONE)
    words = shlex.split(line.replace("\\\n", " "))
    ours = {w for w in words[7:] if not w.startswith(("--labels=", "--project=", "--zone="))}
    [labels] = [w.removeprefix("--labels=") for w in words if w.startswith("--labels=")]
    own = tpuctl_labels(spec)
    users = [pair for pair in labels.split(",") if pair.split("=", 1)[0] not in own]
    if users:
        ours.add("--labels=" + ",".join(users))
    theirs = set(RECORDED[case]["flags"])
    assert ours == theirs, f"{case}: {sorted(ours ^ theirs)}"


def test_the_rest_body_is_what_render_prints_in_json_names() -> None:
    spec = spec_for("flex-start", project="my-project", zone="us-east5-a")
    request = render_request(spec, project="my-project", zone="us-east5-a")
    printed = request_as_dict(request)["queued_resource"]
    assert printed["provisioning_model"] == "FLEX_START"
    assert printed["run_duration"] == {"max_run_duration": "86400s"}
    body = request.rest_body()
    assert body["provisioningModel"] == "FLEX_START"
    assert body["runDuration"] == {"maxRunDuration": "86400s"}
    node = body["tpu"]["nodeSpec"][0]["node"]
    # Map keys are the user's: tpuctl's labels keep their dashes and underscores.
    assert node["labels"] == printed["tpu"]["node_spec"][0]["node"]["labels"]
    assert request.needs_rest and not request.grpc.queued_resource.spot


def test_the_boot_disks_size_and_image_fit_the_discovery_document() -> None:
    from tests.emulator.discovery import problems

    text = (
        "apiVersion: tpuctl/v1\nname: big-disk\ntpu:\n  accelerator: v6e-4\n"
        "  runtime: v2-alpha-tpuv6e\n  boot_disk:\n    size_gb: 500\n"
        "    image: projects/my-project/global/images/my-image\n"
        "    kms_key: projects/my-project/locations/us-east5/keyRings/r/cryptoKeys/k\n"
    )
    spec = load_spec_text(text, environ={}).spec
    request = render_request(spec, project="my-project", zone="us-east5-a")
    body = request.rest_body()
    disk = body["tpu"]["nodeSpec"][0]["node"]["bootDiskConfig"]
    assert disk == {
        "diskSizeGb": "500",
        "sourceImage": "projects/my-project/global/images/my-image",
        "customerEncryptionKey": {
            "kmsKeyName": "projects/my-project/locations/us-east5/keyRings/r/cryptoKeys/k"
        },
    }
    assert problems("v2alpha1", "QueuedResource", body) == []
    assert request.needs_rest  # google-cloud-tpu has no field for them
    line = render_gcloud(spec, project="my-project", zone="us-east5-a")
    assert line.startswith("# gcloud has no flag for tpu.boot_disk.size_gb and image")


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_body_fits_the_discovery_document(case: str) -> None:
    from tests.emulator.discovery import problems

    spec = spec_for(case, project="my-project", zone="us-east5-a")
    body = render_request(spec, project="my-project", zone="us-east5-a").rest_body()
    assert problems("v2alpha1", "QueuedResource", body, case) == []
