"""End to end: the same `tpuctl up` run survives a spot preemption whatever the way in to its
workers is: OS Login turned on by the project, or workers that publish no host key (guest
attributes turned off), each reaching every worker of 2 slices before and after the recreate."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import Job
from tests.fanout.test_access import ACCOUNT, POSIX
from tests.harness import ZONE, by_label
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

PATHS = {
    "os-login": ({"enable-oslogin": "TRUE"}, {"TPUCTL_ACCOUNT": ACCOUNT}),
    "no-published-host-key": ({"enable-guest-attributes": "FALSE"}, {}),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_up_survives_a_preemption_through_the_access_path(
    path: str, make_job: Callable[..., Job], emulator: Any
) -> None:
    metadata, environ = PATHS[path]
    job = make_job(steps=160, checkpoint_every=10, max_preemptions=2)
    job.environ.update(environ)
    project = job.env["TPUCTL_PROJECT"]
    emulator.admin.project_metadata(project, metadata)
    job.start_up()
    job.wait_running()
    wait_for(lambda: any(step >= 20 for step in job.complete_steps()), what="steps 20+")
    before = job.cli("ssh", str(job.spec), "--format", "json", "--", "echo $USER")
    assert before.exit_code == 0, before.stderr
    rows = by_label(before)
    assert sorted(rows) == ["0/0", "0/1", "1/0", "1/1"]
    users = {row["stdout_tail"] for row in rows.values()}
    if path == "os-login":
        assert users == {POSIX}
    after = job.cli("ssh", str(job.spec), "--format", "json", "--", "true")
    assert after.exit_code == 0, after.stderr
    emulator.admin.preempt(f"projects/{project}/locations/{ZONE}/queuedResources/{job.name}")
    code, log = job.wait_up(timeout=240)
    assert code == 0, log
    assert json.loads((job.checkpoint_dir / "final.json").read_text())["step"] == job.steps
    assert job.journal_kinds().count("qr.recreated") == 1
    if path == "os-login":
        assert "ssh-keys" not in log and f"logging in as {POSIX}" in log
    else:  # the first boot's workers and the recreated ones, each pinned once with a warning
        assert log.count("published no host key in guest attributes") == 2, log
