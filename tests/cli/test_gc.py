"""`tpuctl gc` and the zones of `tpuctl list`, against the session emulator: queued resources in
two zones of one project, each in a state gc must collect or keep, with real jobs read over SSH.
"""

from __future__ import annotations

import datetime
import json
import os
import pty
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.cloud.tpu_v2alpha1.types import cloud_tpu

from tests.cli.test_output_contract import check
from tests.harness import ZONE, Project, unique
from tests.support import wait_for
from tpuctl.cloud import lifecycle
from tpuctl.cloud.client import TpuApi, connect
from tpuctl.cloud.describe import template_of
from tpuctl.cloud.resolve import Location
from tpuctl.jobs.provision import create_request
from tpuctl.spec.load import load_spec

pytestmark = pytest.mark.emulator

OTHER_ZONE = "europe-west4-a"  # beside tests.harness.ZONE (us-central2-b); both are known zones
ZONES = f"{ZONE},{OTHER_ZONE}"
# More v4 chips than the emulator's whole pool (16,384): it queues until its window closes.
NEVER_FITS = {"accelerator": "v4-8192", "runtime": "tpu-ubuntu2204-base", "slices": 5}
V4_8 = {"accelerator": "v4-8", "runtime": "tpu-ubuntu2204-base"}


def api_in(project: Project, zone: str) -> TpuApi:
    return connect(Location(project.name, zone), environ=project.env)


def create_in(project: Project, zone: str, document: dict[str, Any]) -> str:
    """Create a spec's queued resource in `zone` through tpuctl's library (not waited for)."""
    name = unique(document.pop("prefix"))
    path = project.write_spec({"name": name, "zone": zone, **document})
    spec = load_spec(path, environ=project.env).spec
    api = api_in(project, zone)
    lifecycle.create(api, create_request(spec, api.location))
    return name


def state_of(project: Project, zone: str, name: str) -> str | None:
    found = api_in(project, zone).find_queued_resource(name)
    return None if found is None else str(found.state.state.name)


def wait_state(project: Project, zone: str, name: str, state: str, timeout: float = 60) -> None:
    wait_for(lambda: state_of(project, zone, name) == state, timeout, f"{name} {state}")


def job_states(project: Project, zone: str, name: str) -> set[str]:
    outcome = project.cli("status", name, "--zone", zone, "--jobs", "--format", "json")
    assert outcome.exit_code == 0, outcome.stderr
    return {job["state"] for job in outcome.json()["jobs"]}


@dataclass
class Mix:
    """One test's queued resources, by role, with their zones."""

    live: str  # ACTIVE, its job running                          (ZONE)
    done: str  # ACTIVE, its job done                             (OTHER_ZONE)
    no_job: str  # ACTIVE, its spec has no job                    (ZONE)
    suspended: str  # a spot one, preempted                       (OTHER_ZONE)
    failed: str  # its queueing window closed                     (ZONE)
    waiting: str  # still queueing                                (OTHER_ZONE)
    foreign: str  # not tpuctl's (no labels): never touched       (ZONE)

    def zone_of(self, name: str) -> str:
        ours = (self.live, self.no_job, self.failed, self.foreign)
        return ZONE if name in ours else OTHER_ZONE

    @property
    def collectable(self) -> set[str]:
        return {self.done, self.no_job, self.suspended, self.failed}

    @property
    def kept(self) -> set[str]:
        return {self.live, self.waiting}


def _foreign(project: Project) -> str:
    """A queued resource someone else made with the plain client: no tpuctl labels (it may
    start in ten emulated hours, so it stays queued)."""
    client = api_in(project, ZONE).client
    parent = f"projects/{project.name}/locations/{ZONE}"
    node = {"accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"}
    queued_resource = cloud_tpu.QueuedResource(
        tpu={"node_spec": [{"parent": parent, "node_id": unique("theirs"), "node": node}]},
        queueing_policy={"valid_after_duration": datetime.timedelta(hours=10)},
    )
    qr_id = unique("theirs")
    request = {"parent": parent, "queued_resource_id": qr_id, "queued_resource": queued_resource}
    client.create_queued_resource(request=request).result(timeout=30)
    return qr_id


def _job(prefix: str, command: str) -> dict[str, Any]:
    return {"prefix": prefix, "tpu": V4_8, "job": {"command": command}}


@pytest.fixture
def mix(project: Project, emulator: Any) -> Iterator[Mix]:
    spot = {"prefix": "spot", "tpu": V4_8, "capacity": {"tier": "spot"}}
    late = {"prefix": "late", "tpu": NEVER_FITS, "capacity": {"valid_until": "30s"}}
    made = Mix(
        live=create_in(project, ZONE, _job("live", "sleep 600")),
        # A job says it is done with the marker (an exit 0 alone says nothing).
        done=create_in(project, OTHER_ZONE, _job("done", 'touch "$TPUCTL_DONE_MARKER"')),
        no_job=create_in(project, ZONE, {"prefix": "nojob", "tpu": V4_8}),
        suspended=create_in(project, OTHER_ZONE, spot),
        failed=create_in(project, ZONE, late),
        waiting=create_in(project, OTHER_ZONE, {"prefix": "queued", "tpu": NEVER_FITS}),
        foreign=_foreign(project),
    )
    try:
        for name in (made.live, made.done, made.no_job, made.suspended):
            wait_state(project, made.zone_of(name), name, "ACTIVE")
        suspended = api_in(project, OTHER_ZONE).qr_name(made.suspended)
        emulator.admin.preempt(suspended)
        wait_state(project, OTHER_ZONE, made.suspended, "SUSPENDED")
        wait_state(project, ZONE, made.failed, "FAILED")
        wait_state(project, OTHER_ZONE, made.waiting, "WAITING_FOR_RESOURCES")
        wait_for(lambda: job_states(project, ZONE, made.live) == {"running"}, 30, "a live job")
        wait_for(lambda: job_states(project, OTHER_ZONE, made.done) == {"done"}, 30, "done")
        yield made
    finally:
        delete_all(project, OTHER_ZONE)  # the harness deletes what is left in its own zone


def delete_all(project: Project, zone: str) -> None:
    api = api_in(project, zone)
    for queued_resource in api.list_queued_resources():
        lifecycle.delete(
            api, queued_resource.name, force=True, wait_until_gone=False, ignore_missing=True
        )


def rows_by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in document["queued_resources"]}


def test_gc_keeps_what_runs_and_deletes_only_what_nothing_will_use(
    project: Project, mix: Mix, emulator: Any
) -> None:
    everything = mix.collectable | mix.kept | {mix.foreign}

    def existing() -> set[str]:
        return {name for name in everything if state_of(project, mix.zone_of(name), name)}

    # No terminal and no --yes: refused in one line, before anything is read or deleted.
    refused = project.cli("gc", "--zones", ZONES)
    assert refused.exit_code == 2
    assert refused.stdout == ""
    [line] = refused.stderr.splitlines()
    assert "--yes" in line and "--dry-run" in line
    assert existing() == everything

    # Dry run: every verdict, with why; nothing deleted; the foreign one is not even listed.
    dry = project.cli("gc", "--zones", ZONES, "--dry-run", "--format", "json")
    assert dry.exit_code == 0, dry.stderr
    document = dry.json()
    check(document, "gc", "gc --dry-run")
    assert document["dry_run"] is True and document["zones"] == [ZONE, OTHER_ZONE]
    rows = rows_by_name(document)
    assert set(rows) == mix.collectable | mix.kept
    assert {name for name, row in rows.items() if row["verdict"] == "delete"} == mix.collectable
    assert not any(row["deleted"] for row in rows.values())
    for name, row in rows.items():
        assert row["zone"] == mix.zone_of(name), name
        assert row["age_seconds"] is not None and row["age_seconds"] >= 0
    assert (rows[mix.live]["state"], rows[mix.live]["job_state"]) == ("ACTIVE", "running")
    assert "not done" in rows[mix.live]["reason"]
    assert (rows[mix.done]["job_state"], rows[mix.done]["job"]) == ("done", mix.done)
    assert "done on every worker" in rows[mix.done]["reason"]
    assert rows[mix.no_job]["job"] is None and "no job" in rows[mix.no_job]["reason"]
    assert rows[mix.suspended]["state"] == "SUSPENDED"
    assert "preempted by the service" in rows[mix.suspended]["reason"]
    assert rows[mix.failed]["state"] == "FAILED" and "valid_until" in rows[mix.failed]["reason"]
    assert rows[mix.waiting]["state"] == "WAITING_FOR_RESOURCES"
    assert document["summary"] == {
        "queued_resources": 6,
        "delete": 4,
        "keep": 2,
        "deleted": 0,
        "failed": 0,
    }
    assert existing() == everything

    # The table in a pipe: a header and one whole line per queued resource, zones shown.
    table = project.cli("gc", "--zones", ZONES, "--dry-run")
    assert table.exit_code == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "ZONE", "STATE"]
    assert sorted(line.split()[0] for line in lines) == sorted(rows)
    assert "dry run: would delete 4, keep 2" in table.stderr

    # A worker that refuses SSH: the job is unknown, so its queued resource is kept, saying why.
    api = api_in(project, ZONE)
    [node_id] = template_of(api.get_queued_resource(mix.live)).node_ids
    emulator.admin.ssh_fault(api.location.node_name(node_id), 0, "refuse")
    try:
        blind = project.cli("gc", "--dry-run", "--format", "json")  # the harness's zone only
    finally:
        emulator.admin.ssh_fault(api.location.node_name(node_id), 0, None)
    assert blind.exit_code == 0, blind.stderr
    row = rows_by_name(blind.json())[mix.live]
    assert (row["verdict"], row["job_state"]) == ("keep", "unknown")
    assert "1 of 1 workers unreachable" in row["reason"]

    # Younger than --older-than: kept, whatever the state.
    young = project.cli(
        "gc", "--zones", ZONES, "--dry-run", "--older-than", "1d", "--format", "json"
    )
    assert {row["verdict"] for row in young.json()["queued_resources"]} == {"keep"}

    # For real: exactly the collectable ones go, checked through the API.
    done = project.cli("gc", "--zones", ZONES, "--yes", "--format", "json")
    assert done.exit_code == 0, done.stderr
    document = done.json()
    check(document, "gc")
    rows = rows_by_name(document)
    assert {name for name, row in rows.items() if row["deleted"]} == mix.collectable
    assert all(row["error"] is None for row in rows.values())
    assert document["summary"]["deleted"] == 4
    assert existing() == mix.kept | {mix.foreign}
    assert state_of(project, ZONE, mix.live) == "ACTIVE"


def test_list_across_zones_and_a_zone_that_fails(project: Project, emulator: Any) -> None:
    here = create_in(project, ZONE, {"prefix": "here", "tpu": NEVER_FITS})
    there = create_in(project, OTHER_ZONE, {"prefix": "there", "tpu": NEVER_FITS})
    try:
        _list_across_zones(project, emulator, here, there)
    finally:
        delete_all(project, OTHER_ZONE)


def _list_across_zones(project: Project, emulator: Any, here: str, there: str) -> None:

    # One zone at a time: only that zone's; the table has no ZONE column.
    alone = project.cli("list", "--format", "json")
    assert [entry["name"] for entry in alone.json()["queued_resources"]] == [here]
    assert "ZONE" not in project.cli("list").stdout.splitlines()[0].split()

    for flags in (("--zones", ZONES), ("--all-zones",)):
        listed = project.cli("list", *flags, "--format", "json")
        assert listed.exit_code == 0, listed.stderr
        document = listed.json()
        check(document, "list", f"list {flags[0]}")
        assert document["zone"] is None and {ZONE, OTHER_ZONE} <= set(document["zones"])
        found = {entry["name"]: entry["zone"] for entry in document["queued_resources"]}
        assert found == {here: ZONE, there: OTHER_ZONE}
        assert document["zone_errors"] == []
        table = project.cli("list", *flags)
        assert table.stdout.splitlines()[0].split()[-1] == "ZONE"

    # One zone refuses (the next API call is PERMISSION_DENIED, never retried): a warning, the
    # other zone still listed, exit 8.
    emulator.admin.api_fault(code="PERMISSION_DENIED", count=1)
    try:
        partial = project.cli("list", "--zones", ZONES, "--format", "json")
    finally:
        emulator.admin.api_fault(code="UNAVAILABLE", count=0)
    assert partial.exit_code == 8, partial.stderr
    document = partial.json()
    [error] = document["zone_errors"]
    assert error["kind"] == "auth" and error["exit_code"] == 8
    answered = OTHER_ZONE if error["zone"] == ZONE else ZONE
    assert [entry["zone"] for entry in document["queued_resources"]] == [answered]
    assert f"warning: zone {error['zone']}: " in partial.stderr
    assert "1 of 2 zones could not be asked" in partial.stderr

    # --zone with --zones is a usage error.
    both = project.cli("list", "--zone", ZONE, "--zones", ZONES)
    assert both.exit_code == 2 and "exclude one another" in both.stderr


def test_gc_asks_on_a_terminal_and_deletes_only_when_told_yes(project: Project) -> None:
    late = {"prefix": "late", "tpu": NEVER_FITS, "capacity": {"valid_until": "30s"}}
    failed = create_in(project, ZONE, late)
    wait_state(project, ZONE, failed, "FAILED")
    for answer, code in (("n", 1), ("y", 0)):
        outcome = gc_at_a_terminal(project, answer)
        assert outcome.returncode == code, outcome.stderr
        assert "Delete 1 queued resource(s)" in outcome.stderr and failed in outcome.stderr
        if answer == "n":
            assert "nothing deleted (you declined)" in outcome.stderr
            assert state_of(project, ZONE, failed) == "FAILED"
        else:
            assert json.loads(outcome.stdout)["summary"]["deleted"] == 1
            assert state_of(project, ZONE, failed) is None


def gc_at_a_terminal(project: Project, answer: str) -> subprocess.CompletedProcess[str]:
    """`tpuctl gc` as a process whose stdin is a terminal (a pty) that answers `answer`."""
    controller, terminal = pty.openpty()
    try:
        process = project.spawn("gc", "--format", "json", stdin=terminal)
        os.close(terminal)
        terminal = -1
        os.write(controller, f"{answer}\n".encode())
        out, err = process.communicate(timeout=60)
    finally:
        os.close(controller)
        if terminal != -1:
            os.close(terminal)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_include_exited_collects_a_job_that_crashed_everywhere_unless_up_babysits_it(
    project: Project,
) -> None:
    """What a dead laptop or CI run leaves billed: an ACTIVE queued resource whose job exited
    on every worker without being done. Kept by default, its row saying the exit code and what
    --include-exited would do; collected with it; kept anyway while a live tpuctl up holds
    the run's lease (that up decides)."""
    from tpuctl.storage.lease import Lease, path_of
    from tpuctl.worker import lease_location

    checkpoints = project.tmp_path / "ckpt-crash"
    name = create_in(
        project,
        ZONE,
        {"prefix": "crash", "tpu": V4_8, "checkpoint": {"dir": str(checkpoints)}}
        | {"job": {"command": "exit 3"}},
    )
    wait_state(project, ZONE, name, "ACTIVE")
    wait_for(lambda: job_states(project, ZONE, name) == {"exited"}, 60, "the job to exit")

    def row(*flags: str) -> dict[str, Any]:
        outcome = project.cli("gc", "--dry-run", "--format", "json", *flags)
        assert outcome.exit_code == 0, outcome.stderr
        check(outcome.json(), "gc", "gc --dry-run")
        return rows_by_name(outcome.json())[name]

    kept = row()
    assert (kept["verdict"], kept["job_state"], kept["exit_codes"]) == ("keep", "exited", [3])
    assert (
        "exit 3 on 0/0" in kept["reason"] and "--include-exited would delete it" in kept["reason"]
    )
    chosen = row("--include-exited")
    assert chosen["verdict"] == "delete" and "deleting it stops the bill" in chosen["reason"]

    spec = load_spec(project.tmp_path / f"{name}.yaml", environ=project.env).spec
    url = lease_location(spec)
    assert url is not None
    lease = Lease(*path_of(url), command="tpuctl up crash.yaml")
    lease.acquire()
    try:
        babysat = row("--include-exited")
    finally:
        lease.release()
    assert babysat["verdict"] == "keep" and "a tpuctl up babysits it" in babysat["reason"]

    collected = project.cli("gc", "--yes", "--include-exited", "--format", "json")
    assert collected.exit_code == 0, collected.stderr
    assert rows_by_name(collected.json())[name]["deleted"] is True
    assert state_of(project, ZONE, name) is None


def test_gc_forgets_the_host_key_pins_of_the_nodes_it_deletes(project: Project) -> None:
    """Pins in tpuctl's own known-hosts file of a node gc deleted are pruned (said, and in the
    JSON); --dry-run only says what it would prune; a pin of any other node stays."""
    name = create_in(project, ZONE, {"prefix": "pinned", "tpu": V4_8})  # no job: collectable
    wait_state(project, ZONE, name, "ACTIVE")
    assert project.cli("ssh", name, "--", "true").exit_code == 0  # pins its one worker
    known_hosts = project.home / ".ssh" / "tpuctl_known_hosts"
    node = api_in(project, ZONE).get_node(api_in(project, ZONE).location.node_name(name))
    alias = f"tpu.{node.id}-0"
    other = "tpu.987654321-0 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBtlCXeqh9Y7jAPAmMt4cH1S other"
    with known_hosts.open("a", encoding="utf-8") as pins:
        pins.write(other + "\n")
    before = known_hosts.read_text(encoding="utf-8")
    assert alias in before

    dry = project.cli("gc", "--dry-run", "--format", "json")
    assert dry.exit_code == 0, dry.stderr
    assert dry.json()["pins"] == [alias]
    assert f"dry run: would prune 1 host-key pin of deleted nodes from {known_hosts}" in dry.stderr
    assert known_hosts.read_text(encoding="utf-8") == before

    done = project.cli("gc", "--yes", "--format", "json")
    assert done.exit_code == 0, done.stderr
    assert done.json()["pins"] == [alias]
    assert f"pruned 1 host-key pin of deleted nodes from {known_hosts} ({alias})" in done.stderr
    after = known_hosts.read_text(encoding="utf-8")
    assert alias not in after and other in after
