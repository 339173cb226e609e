"""Detached runs: start everywhere, ps, logs, stop (children included)."""

from __future__ import annotations

from tests.fanout.helpers import pid_alive
from tests.harness import QR, Project, by_label
from tests.support import wait_for, wait_for_bytes

SPAWNS_A_CHILD = "sleep 300 & echo $! > child.pid; echo started $TPUCTL_EMULATED_WORKER; wait"


def test_detached_run_ps_logs_and_stop_with_children(tpuctl: Project, qr: QR) -> None:
    started = tpuctl("ssh", qr.name, "--detach", "--format", "json", "--", SPAWNS_A_CHILD)
    assert started.exit_code == 0, started.stderr
    data = started.json()
    run_id = data["run"]
    pids = {label: row["detail"]["pid"] for label, row in by_label(started).items()}
    assert set(pids) == set(qr.labels()) and all(pids.values())
    homes = {f"{s}/{w}": qr.home(s, w) for s in range(2) for w in range(qr.workers_per_node)}
    runs = {label: home / ".tpuctl" / "runs" for label, home in homes.items()}
    children = {
        label: int(wait_for_bytes(home / "child.pid", 10, f"{label}'s child"))
        for label, home in homes.items()
    }
    assert all(pid_alive(pid) for pid in [*pids.values(), *children.values()])
    assert (runs["0/0"] / f"{run_id}.command").read_text() == SPAWNS_A_CHILD + "\n"

    ps = tpuctl("ps", qr.name, "--format", "json")  # the latest run
    assert ps.exit_code == 0, ps.stderr
    assert {row["detail"]["state"] for row in ps.json()["workers"]} == {"running"}
    assert {row["detail"]["run"] for row in ps.json()["workers"]} == {run_id}

    logs = tpuctl("logs", qr.name, "--run", run_id, "-n", "5")
    assert logs.exit_code == 0, logs.stderr
    for slice_index, node_id in enumerate(qr.node_ids):
        assert f"[{slice_index}/1] started {node_id}/1" in logs.stdout

    stopped = tpuctl("stop", qr.name, "--grace", "2", "--format", "json")
    assert stopped.exit_code == 0, stopped.stderr
    assert {row["detail"]["state"] for row in stopped.json()["workers"]} == {"stopped"}
    wait_for(
        lambda: not any(pid_alive(p) for p in [*pids.values(), *children.values()]),
        10,
        "the run and its children to be gone",
    )
    after = tpuctl("ps", qr.name, "--run", run_id, "--format", "json")
    states = {row["detail"]["state"] for row in after.json()["workers"]}
    # The wrapper records the status (143 after SIGTERM) unless it had to be killed.
    assert states <= {"exited", "stopped"}, states


def test_exit_status_of_a_finished_run_is_reported(tpuctl: Project, qr: QR) -> None:
    started = tpuctl(
        "ssh", qr.name, "--worker", "0", "--detach", "--format", "json", "--", "exit 5"
    )
    assert started.exit_code == 0, started.stderr
    run_id = started.json()["run"]

    def finished() -> bool:
        ps = tpuctl("ps", qr.name, "--worker", "0", "--run", run_id, "--format", "json")
        return all(row["detail"]["state"] == "exited" for row in ps.json()["workers"])

    wait_for(finished, 10, "the run to exit")
    ps = tpuctl("ps", qr.name, "--worker", "0", "--run", run_id, "--format", "json")
    assert {row["detail"]["exit_code"] for row in ps.json()["workers"]} == {5}
