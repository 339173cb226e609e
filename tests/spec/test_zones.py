"""capacity.zones and capacity.zone_policy: the zones a run may queue in, and how they are tried."""

from __future__ import annotations

import pytest

from tpuctl.errors import SpecError
from tpuctl.spec.load import load_spec_text, spec_fingerprint
from tpuctl.spec.model import Spec

HEAD = """\
apiVersion: tpuctl/v1
name: demo
tpu:
  accelerator: v4-16
  runtime: tpu-ubuntu2204-base
"""
JOB = "checkpoint:\n  dir: gs://bucket/runs/demo\njob:\n  command: python3 train.py\n"


def load(text: str, *overrides: str) -> Spec:
    return load_spec_text(HEAD + text, overrides=overrides, environ={}).spec


def error(text: str) -> SpecError:
    with pytest.raises(SpecError) as raised:
        load(text)
    return raised.value


def test_zones_in_order_and_the_first_is_the_spec_s_zone() -> None:
    spec = load("capacity:\n  zones: [us-central2-b, us-central1-a]\n")
    assert spec.capacity.zones == ("us-central2-b", "us-central1-a")
    assert spec.zone == "us-central2-b" and spec.zones == spec.capacity.zones
    assert spec.capacity.zone_policy == "sequential"
    assert load("zone: europe-west4-a\n").zones == ("europe-west4-a",)
    assert load("").zones == ()


def test_zone_and_zones_together_are_refused_with_the_fix() -> None:
    failure = error("zone: us-central2-b\ncapacity:\n  zones: [us-central1-a]\n")
    assert failure.path == "capacity.zones" and "not both" in failure.message
    assert failure.hint is not None and "us-central2-b" in failure.hint


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ("capacity:\n  zones: []\n", "capacity.zones", "empty"),
        ("capacity:\n  zones: [us-central2-b, us-central2-b]\n", "capacity.zones[1]", "twice"),
        ("capacity:\n  zones: [us-central2-b, Central]\n", "capacity.zones[1]", "not a valid"),
        ("capacity:\n  zones: us-central2-b\n", "capacity.zones", "list of strings"),
        ("capacity:\n  zone_policy: first-actve\n", "capacity.zone_policy", "not a valid"),
    ],
)
def test_bad_zones_are_errors_at_their_key(text: str, path: str, fragment: str) -> None:
    failure = error(text)
    assert failure.path == path and fragment in failure.message


def test_first_active_needs_a_checkpoint_dir_and_tpuctl_s_startup_script() -> None:
    policy = "capacity:\n  zones: [us-central2-b, us-central1-a]\n  zone_policy: first-active\n"
    no_dir = error(policy + "job:\n  command: python3 train.py\n")
    assert no_dir.path == "capacity.zone_policy" and "checkpoint.dir" in no_dir.message
    text = (
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  accelerator: v4-8\n"
        "  runtime: tpu-ubuntu2204-base\n  metadata: {startup-script: echo hi}\n" + policy + JOB
    )
    with pytest.raises(SpecError) as raised:
        load_spec_text(text, environ={})
    assert raised.value.path == "capacity.zone_policy"
    assert "startup script" in raised.value.message
    # With the checkpoint dir it is a job whose zone is claimed; without a job nothing runs.
    spec = load(policy + JOB)
    assert spec.claims_zone and spec.capacity.zone_policy == "first-active"
    assert not load(policy).claims_zone
    assert not load("capacity:\n  zones: [us-central2-b]\n" + JOB).claims_zone


def test_zones_on_the_command_line_through_set() -> None:
    spec = load(JOB, "capacity.zones=[us-east5-a, us-south1-a]")
    assert spec.capacity.zones == ("us-east5-a", "us-south1-a") and spec.zone == "us-east5-a"


def test_where_a_spec_queues_is_not_part_of_its_fingerprint_but_its_policy_is() -> None:
    plain = load(JOB)
    assert spec_fingerprint(plain) == spec_fingerprint(load("zone: us-central2-b\n" + JOB))
    zoned = load("capacity:\n  zones: [us-central2-b, us-central1-a]\n" + JOB)
    other = load("capacity:\n  zones: [us-east5-a]\n  zone_policy: sequential\n" + JOB)
    assert spec_fingerprint(plain) == spec_fingerprint(zoned) == spec_fingerprint(other)
    racing = load("capacity:\n  zones: [us-east5-a]\n  zone_policy: first-active\n" + JOB)
    assert spec_fingerprint(racing) != spec_fingerprint(plain)
