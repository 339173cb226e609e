"""End to end: the same `tpuctl up` run survives a spot preemption whatever the way in to its
workers is: OS Login turned on by the project, workers that publish no host key (guest
attributes turned off), or workers with no external IP reached through IAP tunnels (a stand-in
gcloud), each reaching every worker of 2 slices before and after the recreate."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Job
from tests.fanout.gcloud_standin import install
from tests.fanout.test_access import ACCOUNT, POSIX
from tests.harness import ZONE, by_label
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

# path → (project metadata, environment, tpuctl flags)
PATHS: dict[str, tuple[dict[str, str], dict[str, str], tuple[str, ...]]] = {
    "os-login": ({"enable-oslogin": "TRUE"}, {"TPUCTL_ACCOUNT": ACCOUNT}, ()),
    "no-published-host-key": ({"enable-guest-attributes": "FALSE"}, {}, ()),
    "iap-tunnel": ({}, {}, ("--tunnel-through-iap",)),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_up_survives_a_preemption_through_the_access_path(
    path: str, make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    metadata, environ, flags = PATHS[path]
    job = make_job(steps=160, checkpoint_every=10, max_preemptions=2)
    job.environ.update(environ)
    if path == "iap-tunnel":  # no external IPs: only the tunnel gets through the firewall
        text = job.spec.read_text(encoding="utf-8")
        job.spec.write_text(text.replace("  slices: 2\n", "  slices: 2\n  external_ips: false\n"))
        job.environ["TPUCTL_GCLOUD"] = str(install(tmp_path / "bin"))
        job.environ["GCLOUD_STANDIN_LOG"] = str(tmp_path / "tunnels.log")
    project = job.env["TPUCTL_PROJECT"]
    emulator.admin.project_metadata(project, metadata)
    job.start_up(*flags)
    job.wait_running()
    wait_for(lambda: any(step >= 20 for step in job.complete_steps()), what="steps 20+")
    if path == "iap-tunnel":  # the workers really have no address the tunnel could skip
        api = job.project.api()
        ends = [
            endpoint
            for node in api.list_nodes()
            if node.name.rsplit("/", 1)[-1] in job.node_ids()
            for endpoint in node.network_endpoints
        ]
        assert len(ends) == 4 and not any(end.access_config.external_ip for end in ends)
    before = job.cli("ssh", str(job.spec), *flags, "--format", "json", "--", "echo $USER")
    assert before.exit_code == 0, before.stderr
    rows = by_label(before)
    assert sorted(rows) == ["0/0", "0/1", "1/0", "1/1"]
    users = {row["stdout_tail"] for row in rows.values()}
    if path == "os-login":
        assert users == {POSIX}
    after = job.cli("ssh", str(job.spec), *flags, "--format", "json", "--", "true")
    assert after.exit_code == 0, after.stderr
    emulator.admin.preempt(f"projects/{project}/locations/{ZONE}/queuedResources/{job.name}")
    code, log = job.wait_up(timeout=240)
    assert code == 0, log
    assert json.loads((job.checkpoint_dir / "final.json").read_text())["step"] == job.steps
    assert job.journal_kinds().count("qr.recreated") == 1
    if path == "os-login":
        assert "ssh-keys" not in log and f"logging in as {POSIX}" in log
    elif path == "no-published-host-key":  # the first boot's workers and the recreated ones,
        # each pinned once, named in a warning (the recreated ones may come up in two batches)
        warning = r"workers? published no host key in guest attributes: .*\(([^)]*)\)"
        warned = re.findall(warning, log)
        labels = sorted(label for line in warned for label in line.split(", "))
        assert labels == sorted(["0/0", "0/1", "1/0", "1/1"] * 2), log
    else:  # every connection of up and of the ssh commands went through a tunnel
        tunnels = (tmp_path / "tunnels.log").read_text().splitlines()
        assert len(tunnels) >= 4 + 4 + 4, len(tunnels)
