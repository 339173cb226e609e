"""The Compute Engine reads of `tpuctl doctor` (project metadata, firewalls) over REST against a
local server, and the verdict on which rules let SSH reach the TPU VMs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from tests.cloud_fakes import ComputeFake, compute_server
from tpuctl.cloud.compute_rest import firewall_rules, project_metadata, ssh_path
from tpuctl.cloud.oslogin import OsLoginSetting, os_login_setting
from tpuctl.cloud.resolve import Location
from tpuctl.jobs.doctor import Inputs, firewall_check, ssh_check
from tpuctl.spec.model import Spec, TpuSpec

NETWORK = "https://www.googleapis.com/compute/v1/projects/my-project/global/networks/"


def rule(name: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": name,
        "network": NETWORK + "default",
        "direction": "INGRESS",
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
        "sourceRanges": ["0.0.0.0/0"],
    }
    return {**base, **fields}


def test_which_rules_open_ssh() -> None:
    rules = [
        rule("default-allow-ssh"),
        rule("other-network", network=NETWORK + "train"),
        rule("off", disabled=True),
        rule("egress", direction="EGRESS"),
        rule("web", allowed=[{"IPProtocol": "tcp", "ports": ["80", "443"]}]),
        rule("range", allowed=[{"IPProtocol": "tcp", "ports": ["20-30"]}], sourceRanges=[]),
        rule("tagged", targetTags=["tpu"], sourceRanges=["35.235.240.0/20"]),
        rule("everything", allowed=[{"IPProtocol": "all"}], targetServiceAccounts=["a@b"]),
    ]
    untagged = ssh_path(rules, "default", [], None)
    assert untagged.rules == ("default-allow-ssh", "range")
    assert (untagged.sources, untagged.iap) == (("0.0.0.0/0",), True)  # 0.0.0.0/0 admits IAP
    tagged = ssh_path(rules, "default", ["tpu"], "a@b")
    assert tagged.rules == ("default-allow-ssh", "range", "tagged", "everything")
    only_iap = ssh_path([rule("iap", sourceRanges=["35.235.240.0/20"])], "default", [], None)
    assert only_iap.iap and only_iap.sources == ("35.235.240.0/20",)
    office = ssh_path([rule("office", sourceRanges=["203.0.113.0/24"])], "default", [], None)
    assert not office.iap
    assert ssh_path(rules, "train", [], None).rules == ("other-network",)


def test_reads_go_to_the_endpoint_override() -> None:
    fake = ComputeFake(metadata={"enable-oslogin": "TRUE"}, firewalls=[rule("a")])
    with compute_server(fake) as url:
        env = {"TPUCTL_COMPUTE_ENDPOINT": url}
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
        assert project_metadata("my-project", credentials, environ=env) == {
            "enable-oslogin": "TRUE"
        }
        assert [
            item["name"] for item in firewall_rules("my-project", credentials, environ=env)
        ] == ["a"]


def _inputs(env: dict[str, str], **tpu: Any) -> Inputs:
    spec = Spec(name="job", tpu=TpuSpec(accelerator="v4-8", runtime="tpu-ubuntu2204-base", **tpu))
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return Inputs(spec, Location("my-project", "us-central2-b"), None, credentials, env)  # type: ignore[arg-type]


def test_the_firewall_check_off_the_emulator() -> None:
    fake = ComputeFake(firewalls=[rule("office", sourceRanges=["203.0.113.0/24"])])
    with compute_server(fake) as url:
        env = {"TPUCTL_COMPUTE_ENDPOINT": url}
        [found] = firewall_check(_inputs(env))
        assert (found.ok, found.severity) == (True, "warning")
        assert found.message.startswith("tcp:22 on default open by office from 203.0.113.0/24")
        assert "35.235.240.0/20 not admitted (--tunnel-through-iap cannot get in)" in found.message
        [closed] = firewall_check(_inputs(env, network="train"))
        assert (closed.ok, closed.severity) == (False, "warning")
        assert closed.fix is not None and "--network train" in closed.fix
    [on_emulator] = firewall_check(_inputs({"TPU_EMULATOR_HOST": "127.0.0.1:1"}))
    assert on_emulator.ok and on_emulator.message.startswith("skipped on the emulator")


def test_one_reading_of_os_login_for_ssh_and_doctor() -> None:
    """The node's enable-oslogin wins, else the project's, else off; an unreadable project is
    off and says why. Doctor says what ssh will do, from the same reading."""
    location = Location("my-project", "us-central2-b")
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    fake = ComputeFake(metadata={"enable-oslogin": "TRUE"})
    with compute_server(fake) as url:
        env = {"TPUCTL_COMPUTE_ENDPOINT": url}

        def read(node: dict[str, str]) -> OsLoginSetting:
            return os_login_setting(node, location, credentials=credentials, environ=env)

        assert read({}) == OsLoginSetting(True, "project")
        assert read({"enable-oslogin": "false"}) == OsLoginSetting(False, "node")
        fake.metadata = {"enable-oslogin": "FALSE"}
        assert read({"enable-oslogin": "TRUE"}) == OsLoginSetting(True, "node")
        assert read({}) == OsLoginSetting(False, "project")
        fake.metadata = {}
        assert read({}) == OsLoginSetting(False, "default")
        [said] = ssh_check(_inputs(env, metadata={"enable-oslogin": "TRUE"}))
        assert said.message.startswith("OS Login (enable-oslogin TRUE in the spec's tpu.metadata)")
    emulator = {"TPU_EMULATOR_HOST": "127.0.0.1:1"}  # without the Compute Engine endpoint
    unread = os_login_setting({}, location, credentials=credentials, environ=emulator)
    assert not unread.enabled and unread.decided_by == "default"
    assert unread.unread is not None and "TPUCTL_COMPUTE_ENDPOINT is unset" in unread.unread
    [said] = ssh_check(_inputs(emulator))
    assert said.ok and said.message.startswith("ssh-keys in node metadata (project metadata unread")


def test_os_login_with_an_unreadable_gcloud_config_says_it_was_skipped(tmp_path: Path) -> None:
    """The account OS Login imports the key for may come from gcloud's [core] account; a
    configuration that cannot be read is named as skipped, not passed over in silence."""
    from tpuctl.cloud.oslogin import caller
    from tpuctl.errors import AuthError

    config = tmp_path / "gcloud"
    (config / "configurations").mkdir(parents=True)
    (config / "configurations" / "config_default").write_bytes(b"account = \xff\n")
    env = {"TPU_EMULATOR_HOST": "127.0.0.1:1", "CLOUDSDK_CONFIG": str(config)}
    with pytest.raises(AuthError) as raised:
        caller(environ=env)
    line = raised.value.one_line()
    assert "cannot tell which account" in line
    assert "cannot read the gcloud configuration" in line and "skipped" in line, line
    assert "config_default: not UTF-8" in line
    (config / "configurations" / "config_default").write_text("[core]\naccount = me@x.com\n")
    assert caller(environ=env) == "me@x.com"
