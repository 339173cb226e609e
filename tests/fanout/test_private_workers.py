"""Workers with no external IP, as Cloud TPU makes them with `enable_external_ips: false`: the
emulator's firewall lets SSH in only from IAP's range and from its own workers, so tpuctl gets
in through an IAP tunnel (`--tunnel-through-iap`: a stand-in gcloud, tests/fanout/
gcloud_standin.py, that resolves the instance through the TPU API) or a bastion
(`--proxy-jump`: an emulated worker that has an external IP), and says how when it cannot."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fanout.gcloud_standin import BACKEND_FAILED, NO_CREDENTIALS, install
from tests.harness import QR, USER, Project, by_label, project_in, unique
from tests.support import wait_for
from tpuctl.fanout.bastion import JumpHost, parse_jump
from tpuctl.fanout.routes import check_instance


@dataclass
class Private:
    """A two-slice QR whose workers have no external IP, and a bastion (a v4-8 QR with
    one) in the same project."""

    qr: QR
    bastion_ip: str


@pytest.fixture(scope="module")
def private(emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    with project_in(emulator, tmp_path_factory.mktemp("private")) as owner:
        qr = owner.create_from_spec(
            owner.write_spec(
                {
                    "name": unique("private"),
                    "tpu": {
                        "accelerator": "v4-16",
                        "runtime": "tpu-ubuntu2204-base",
                        "slices": 2,
                        "external_ips": False,
                    },
                    "job": {"user": USER, "command": "echo job ran on $TPUCTL_EMULATED_WORKER"},
                }
            )
        )
        bastion = owner.create_qr(accelerator="v4-8", slices=1)
        api = owner.api()
        node = api.get_node(api.location.node_name(bastion.node_ids[0]))
        yield Private(qr, node.network_endpoints[0].access_config.external_ip)


@pytest.fixture
def tpuctl(
    emulator: Any, private: Private, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Project:
    """tpuctl in the private QR's project with its own HOME; a stand-in gcloud first on PATH,
    logging its runs."""
    project = Project(emulator, tmp_path, private.qr.project)
    for name, value in project.env.items():
        monkeypatch.setenv(name, value)
    bin_dir = tmp_path / "bin"
    install(bin_dir)
    monkeypatch.delenv("TPUCTL_GCLOUD", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GCLOUD_STANDIN_LOG", str(tmp_path / "gcloud.log"))
    return project


def _tunnels(project: Project) -> list[dict[str, Any]]:
    log = project.tmp_path / "gcloud.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _hostnames(project: Project, qr: QR) -> dict[str, str]:
    """slice/worker → the `hostname` guest attribute, read with the plain client."""
    api = project.api()
    names = {}
    for slice_index, node_id in enumerate(qr.node_ids):
        response = api.client.get_guest_attributes(
            request={"name": api.location.node_name(node_id)}
        )
        for worker, attributes in enumerate(response.guest_attributes):
            [value] = [i.value for i in attributes.query_value.items if i.key == "hostname"]
            names[f"{slice_index}/{worker}"] = value
    return names


def _assert_reaped(pids: list[int]) -> None:
    """Every tunnel process is gone, none left a zombie (an unreaped child of this process
    would still be in /proc, in state Z)."""
    assert pids
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 5, "tunnels gone")


def test_iap_tunnels_reach_every_worker_with_no_external_ip(
    tpuctl: Project, private: Private, emulator: Any
) -> None:
    qr = private.qr
    out = tpuctl(
        "ssh", qr.name, "--tunnel-through-iap", "--format", "json", "--",
        "echo $TPUCTL_EMULATED_WORKER from $SSH_CLIENT",
    )  # fmt: skip
    assert out.exit_code == 0, out.stderr
    rows = by_label(out)
    assert sorted(rows) == qr.labels()
    for label, row in rows.items():
        slice_index, worker = map(int, label.split("/"))
        node, source = row["stdout_tail"].split(" from ")
        assert node == f"{qr.node_ids[slice_index]}/{worker}"
        assert source.startswith("127.235.24"), source  # in through IAP's range
    names = _hostnames(tpuctl, qr)
    assert all(re.fullmatch(r"t1v-n-[0-9a-f]{8}-w-[01]", name) for name in names.values())
    runs = _tunnels(tpuctl)
    # One gcloud per worker, with exactly the flags gcloud puts in its own ProxyCommand.
    assert sorted(run["argv"][2] for run in runs) == sorted(names.values())
    for run in runs:
        assert run["argv"] == [
            "compute", "start-iap-tunnel", run["argv"][2], str(emulator.ssh_port),
            "--listen-on-stdin", f"--project={qr.project}", "--zone=us-central2-b",
            "--verbosity=warning",
        ]  # fmt: skip
    assert "through IAP tunnels" in out.stderr
    _assert_reaped([run["pid"] for run in runs])


def test_without_a_route_they_are_unreachable_and_the_error_says_how(
    tpuctl: Project, private: Private
) -> None:
    for extra in ((), ("--internal-ip",)):
        out = tpuctl(
            "ssh", private.qr.name, *extra, "--connect-timeout", "1", "--format", "json",
            "--", "true",
        )  # fmt: skip
        assert out.exit_code == 10, out.stderr
        rows = by_label(out)
        assert {row["status"] for row in rows.values()} == {"unreachable"}
        assert all("has no external IP" in row["error"] for row in rows.values())
        error = json.loads(out.stderr)["error"] if out.stderr.startswith("{") else None
        hint = error["hint"] if error else out.stderr
        assert "--tunnel-through-iap" in hint and "--proxy-jump" in hint
    assert not _tunnels(tpuctl)


def test_a_bastion_reaches_every_worker(tpuctl: Project, private: Private, emulator: Any) -> None:
    from tpuctl.cloud import nodes as cloud_nodes
    from tpuctl.fanout.keys import ensure_key

    qr = private.qr
    key = ensure_key(tpuctl.home / ".ssh" / "google_compute_engine")
    api = tpuctl.api()
    bastion_node = next(
        node.name for node in api.list_nodes() if node.queued_resource != api.qr_name(qr.name)
    )
    cloud_nodes.add_ssh_key(api, bastion_node, USER, key.algorithm, key.blob)
    jump = f"{USER}@{private.bastion_ip}:{emulator.ssh_port}"

    strict = tpuctl("ssh", qr.name, "--proxy-jump", jump, "--strict-host-key-checking", "yes",
                    "--", "true")  # fmt: skip
    assert strict.exit_code == 8, strict.stderr  # an unknown bastion is refused under `yes`
    alias = f"[{private.bastion_ip}]:{emulator.ssh_port}"
    said = strict.stdout + strict.stderr  # the table goes to stderr when output streamed
    # Labelled unknown, not a mismatch: nothing was known for it to mismatch with.
    assert "HOSTKEY-UNKNOWN" in said and "MISMATCH" not in said
    assert f"bastion {alias} has an unknown host key" in said
    assert "--strict-host-key-checking accept-new" in strict.stderr

    out = tpuctl("ssh", qr.name, "--proxy-jump", jump, "--format", "json", "--",
                 "echo $TPUCTL_EMULATED_WORKER from $SSH_CLIENT")  # fmt: skip
    assert out.exit_code == 0, out.stderr
    rows = by_label(out)
    assert sorted(rows) == qr.labels()
    for label, row in rows.items():
        slice_index, worker = map(int, label.split("/"))
        assert row["stdout_tail"].startswith(f"{qr.node_ids[slice_index]}/{worker} from ")
        # The bastion's channel leaves from the bastion VM's own address.
        assert row["stdout_tail"].split(" from ")[1].startswith(private.bastion_ip + " ")
    assert "trusted its host key" in out.stderr and "on first use" in out.stderr
    pinned = (tpuctl.home / ".ssh" / "tpuctl_known_hosts").read_text()
    assert f"[{private.bastion_ip}]:{emulator.ssh_port} ssh-ed25519 " in pinned

    again = tpuctl("ssh", qr.name, "--proxy-jump", jump, "--strict-host-key-checking", "yes",
                   "--", "true")  # fmt: skip
    assert again.exit_code == 0, again.stderr  # pinned now
    assert "trusted its host key" not in again.stderr
    assert not _tunnels(tpuctl)

    # A changed key is refused, and the fix names the file that holds the pin (tpuctl's),
    # not ~/.ssh/known_hosts, where nothing was pinned.
    pins = tpuctl.home / ".ssh" / "tpuctl_known_hosts"
    other = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    pins.write_text(pinned.replace(f"{alias} ssh-ed25519 ", f"{alias} ssh-ed25519 {other} #"))
    changed = tpuctl("ssh", qr.name, "--proxy-jump", jump, "--", "true")
    assert changed.exit_code == 8, changed.stderr
    assert f"HOST KEY CHANGED for bastion {alias}" in changed.stdout + changed.stderr
    assert f"ssh-keygen -R '{alias}' -f {pins}" in changed.stderr
    assert "known_hosts " not in changed.stderr.replace("tpuctl_known_hosts", "")


def test_a_tunnel_that_dies_fails_its_worker_with_what_gcloud_said(
    tpuctl: Project, private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    qr = private.qr
    doomed = _hostnames(tpuctl, qr)["1/1"]
    monkeypatch.setenv("GCLOUD_STANDIN_FAIL", doomed)
    out = tpuctl("ssh", qr.name, "--tunnel-through-iap", "--format", "json", "--", "true")
    assert out.exit_code == 10, out.stderr
    rows = by_label(out)
    assert [label for label, row in rows.items() if row["status"] != "ok"] == ["1/1"]
    error = rows["1/1"]["error"]
    assert rows["1/1"]["status"] == "unreachable"
    assert f"the IAP tunnel to {doomed} port" in error and "exited with 1" in error
    assert BACKEND_FAILED in error
    runs = _tunnels(tpuctl)
    assert sum(run["argv"][2] == doomed for run in runs) == 3  # set-up is retried
    _assert_reaped([run["pid"] for run in runs])


def test_a_tunnel_that_never_answers_is_given_up_at_the_connect_timeout(
    tpuctl: Project, private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCLOUD_STANDIN_HANG", "*")
    out = tpuctl(
        "ssh", private.qr.name, "--tunnel-through-iap", "--connect-timeout", "1",
        "--format", "json", "--", "true",
    )  # fmt: skip
    # Unreachable (exit 10), as a silent worker dialled directly is: nothing answered.
    assert out.exit_code == 10, out.stderr
    rows = by_label(out)
    assert {row["status"] for row in rows.values()} == {"unreachable"}
    assert all(row["duration_s"] < 5 for row in rows.values())
    runs = _tunnels(tpuctl)
    assert len(runs) == len(rows)  # a timeout is not retried
    _assert_reaped([run["pid"] for run in runs])  # ended, though they never exited by themselves


def test_a_tunnel_refused_for_want_of_credentials_is_exit_8_with_what_gcloud_said(
    tpuctl: Project, private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not retried, not `unreachable`: a login is what it takes, and the worker's error says so
    in gcloud's words; the other workers fail the same way without running gcloud again."""
    monkeypatch.setenv("GCLOUD_STANDIN_NO_LOGIN", "1")
    out = tpuctl("ssh", private.qr.name, "--tunnel-through-iap", "--batch-size", "1",
                 "--format", "json", "--", "true")  # fmt: skip
    assert out.exit_code == 8, out.stderr
    rows = by_label(out)
    assert {row["status"] for row in rows.values()} == {"auth-failed"}
    first_line = NO_CREDENTIALS.splitlines()[0]
    assert all(first_line in row["error"] for row in rows.values()), rows
    assert "run `gcloud auth login`" in out.stderr  # the fix, on the error line
    runs = _tunnels(tpuctl)
    assert len(runs) == 1  # one gcloud said it; no retry, no gcloud per worker
    _assert_reaped([run["pid"] for run in runs])


def test_run_ps_and_logs_go_through_the_tunnel_too(tpuctl: Project, private: Private) -> None:
    qr = private.qr
    assert qr.spec_path is not None
    run = tpuctl("run", str(qr.spec_path), "--tunnel-through-iap", "--no-follow",
                 "--format", "json")  # fmt: skip
    assert run.exit_code == 0, run.stderr
    run_id = run.json()["run"]

    def exited() -> bool:
        ps = tpuctl("ps", qr.name, "--run", run_id, "--tunnel-through-iap", "--format", "json")
        assert ps.exit_code == 0, ps.stderr
        return all(w["detail"]["state"] == "exited" for w in ps.json()["workers"])

    wait_for(exited, 20, "the runs to exit")
    logs = tpuctl("logs", qr.name, "--run", run_id, "--tunnel-through-iap", "--format", "json")
    assert logs.exit_code == 0, logs.stderr
    for label, row in by_label(logs).items():
        slice_index, worker = map(int, label.split("/"))
        assert row["stdout_tail"] == f"job ran on {qr.node_ids[slice_index]}/{worker}"
    _assert_reaped([entry["pid"] for entry in _tunnels(tpuctl)])


def test_a_worker_publishing_no_hostname_cannot_be_tunnelled_to(
    tpuctl: Project, private: Private
) -> None:
    """As with gcloud: no `hostname` guest attribute (guest attributes turned off), no tunnel,
    and the checks gcloud suggests."""
    api = tpuctl.api()
    node_name = api.location.node_name(private.qr.node_ids[1])

    def set_metadata(extra: dict[str, str], drop: str = "") -> None:
        metadata = dict(api.get_node(node_name).metadata) | extra
        metadata.pop(drop, None)
        api.client.update_node(
            request={
                "node": {"name": node_name, "metadata": metadata},
                "update_mask": {"paths": ["metadata"]},
            }
        ).result(timeout=30)

    set_metadata({"enable-guest-attributes": "FALSE"})
    try:
        out = tpuctl("ssh", private.qr.name, "--tunnel-through-iap", "--", "true")
    finally:
        set_metadata({}, drop="enable-guest-attributes")
    assert out.exit_code == 10, out.stderr
    assert "cannot tunnel through IAP to 2 of 4 workers (1/0, 1/1)" in out.stderr
    assert "compute.disableGuestAttributesAccess" in out.stderr
    assert not _tunnels(tpuctl)


def test_routes_are_checked_before_anything_is_asked(
    tpuctl: Project, private: Private, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = private.qr.name
    both = tpuctl("ssh", name, "--tunnel-through-iap", "--proxy-jump", "host", "--", "true")
    assert both.exit_code == 2 and "pass one" in both.stderr
    internal = tpuctl("ssh", name, "--tunnel-through-iap", "--internal-ip", "--", "true")
    assert internal.exit_code == 2 and "cannot be used together" in internal.stderr
    bad = tpuctl("ssh", name, "--proxy-jump", "me@-oProxyCommand=x", "--", "true")
    assert bad.exit_code == 2 and "not [USER@]HOST[:PORT]" in bad.stderr
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = tpuctl("ssh", name, "--tunnel-through-iap", "--", "true")
    assert missing.exit_code == 2
    assert "there is no gcloud on PATH" in missing.stderr and "TPUCTL_GCLOUD" in missing.stderr
    monkeypatch.setenv("TPUCTL_GCLOUD", str(tpuctl.tmp_path / "nowhere" / "gcloud"))
    named = tpuctl("ssh", name, "--tunnel-through-iap", "--", "true")
    assert named.exit_code == 2 and "is not an executable program" in named.stderr
    assert not _tunnels(tpuctl)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("bastion", JumpHost("bastion")),
        ("me@10.0.0.2:2222", JumpHost("10.0.0.2", 2222, "me")),
        ("[::1]:2200", JumpHost("::1", 2200)),
        ("ops.example.com:22", JumpHost("ops.example.com")),
    ],
)
def test_proxy_jump_values(text: str, parsed: JumpHost) -> None:
    assert parse_jump(text) == parsed


@pytest.mark.parametrize(
    "text", ["", "a,b", "host:0", "host:x", "-oProxyCommand=sh", "us er@host", "[::1", "h:"]
)
def test_bad_proxy_jump_values(text: str) -> None:
    from tpuctl.errors import UsageError

    with pytest.raises(UsageError):
        parse_jump(text)


def test_an_instance_name_is_never_a_flag() -> None:
    from tpuctl.fanout.handshake import SetupError

    assert check_instance("t1v-n-0123abcd-w-0") == "t1v-n-0123abcd-w-0"
    for name in ("--zone=evil", "a b", "", "x;y"):
        with pytest.raises(SetupError):
            check_instance(name)


def test_an_iap_refusal_is_remembered_for_one_fan_out_only() -> None:
    from tpuctl.fanout.handshake import SetupError
    from tpuctl.fanout.routes import IapTunnel
    from tpuctl.fanout.targets import WorkerTarget

    tunnel = IapTunnel("gcloud", "p", "z")
    target = WorkerTarget(0, "n", 0, "10.0.0.2", instance="t1v-n-0123abcd-w-0")
    with tunnel.hold():
        tunnel._refused.append(SetupError("auth-failed", "no login", hint="log in"))
        with pytest.raises(SetupError) as refused:
            tunnel.open(target, 1.0)  # no gcloud is started: it would be refused the same
        assert refused.value.kind == "auth-failed" and refused.value.hint == "log in"
    assert tunnel._refused == []  # the next fan-out tries again
