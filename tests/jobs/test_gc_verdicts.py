"""gc's decisions, pure: what a state, an age and the workers' job states make of a queued
resource, and how a garbage collection ends (exit code, the line on stderr)."""

from __future__ import annotations

import pytest

from tpuctl.cloud.zones import ZoneError
from tpuctl.errors import ExitCode
from tpuctl.jobs.control import WorkerJobStatus
from tpuctl.jobs.gc import Collectable, GarbageCollection, Verdict, job_verdict, verdict

DAY = 86400.0


def worker(state: str, *, index: int = 0, reachable: bool = True) -> WorkerJobStatus:
    return WorkerJobStatus(
        slice=0, node="job", worker=index, state=state, boot=1, pid=None, started=None,
        exit_code=None, heartbeat_age_s=None, reason=None, reachable=reachable,
        error=None if reachable else "connection refused",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("FAILED", "delete"),
        ("SUSPENDED", "delete"),
        ("WAITING_FOR_RESOURCES", "keep"),
        ("PROVISIONING", "keep"),
        ("SUSPENDING", "keep"),
        ("DELETING", "keep"),
        ("CREATING", "keep"),
        ("STATE_UNSPECIFIED", "keep"),
    ],
)
def test_the_state_alone_decides_all_but_active(state: str, expected: str) -> None:
    decided = verdict(state, age_seconds=2 * DAY, older_than=DAY)
    assert decided is not None and decided[0] == expected, decided


def test_active_needs_its_job_read_unless_it_has_none() -> None:
    assert verdict("ACTIVE", age_seconds=5.0, older_than=None) is None
    assert verdict("ACTIVE", age_seconds=5.0, older_than=None, has_job=False) == (
        "delete",
        "ACTIVE with no job (its spec has none)",
    )


def test_younger_than_older_than_is_kept_whatever_the_state() -> None:
    decided = verdict("FAILED", age_seconds=3600.0, older_than=DAY)
    assert decided is not None and decided[0] == "keep" and "younger than" in decided[1]
    unknown = verdict("FAILED", age_seconds=None, older_than=DAY)
    assert unknown is not None and unknown[0] == "keep" and "unknown" in unknown[1]
    assert verdict("FAILED", age_seconds=None, older_than=None) is not None


def test_failed_and_suspended_say_why() -> None:
    failed = verdict("FAILED", age_seconds=1.0, older_than=None, failure="no capacity")
    assert failed == ("delete", "FAILED: no capacity")
    preempted = verdict("SUSPENDED", age_seconds=1.0, older_than=None, initiator="SERVICE")
    assert preempted is not None and "preempted by the service" in preempted[1]


@pytest.mark.parametrize(
    ("states", "expected", "summary"),
    [
        (["done", "done"], "delete", "done"),
        (["none", "none"], "delete", "none"),
        (["running", "done"], "keep", "done,running"),
        (["done", "none"], "keep", "done,none"),
        (["exited", "exited"], "keep", "exited"),
        (["waiting-for-code"], "keep", "waiting-for-code"),
        (["setup-failed"], "keep", "setup-failed"),
    ],
)
def test_job_states_decide_an_active_one(states: list[str], expected: str, summary: str) -> None:
    statuses = [worker(state, index=index) for index, state in enumerate(states)]
    decided, reason, joined = job_verdict(statuses)
    assert (decided, joined) == (expected, summary), reason


def test_an_unreachable_or_unreadable_worker_keeps_it() -> None:
    unreachable = [worker("done"), worker("unknown", index=1, reachable=False)]
    decided, reason, _ = job_verdict(unreachable)
    assert decided == "keep" and "1 of 2 workers unreachable (0/1: connection refused)" in reason
    unreadable = [worker("done"), worker("unknown", index=1)]
    decided, reason, _ = job_verdict(unreadable)
    assert decided == "keep" and "could not be read" in reason


def row(name: str, *, verdict: Verdict = "delete", error: str | None = None) -> Collectable:
    return Collectable(
        name=name, zone="z", state="FAILED", create_time=None, age_seconds=None, job=None,
        job_state=None, verdict=verdict, reason="FAILED", deleted=error is None, error=error,
    )  # fmt: skip


def test_a_failed_delete_exits_1_and_names_it() -> None:
    result = GarbageCollection("p", ["z"], False, None, [row("a"), row("b", error="refused")])
    assert result.exit_code == ExitCode.ERROR
    error = result.exit_error()
    assert error is not None and "1 delete(s) failed: b (z): refused" in error.message
    assert result.summary is not None
    assert (result.summary.deleted, result.summary.failed) == (1, 1)


def test_a_zone_that_failed_exits_with_its_code_after_the_deletes() -> None:
    lost = ZoneError("y", "auth", "permission denied", int(ExitCode.AUTH))
    result = GarbageCollection("p", ["z", "y"], False, None, [row("a")], [lost])
    assert result.exit_code == ExitCode.AUTH
    error = result.exit_error()
    assert error is not None and "1 of 2 zones could not be asked (y)" in error.message
    everything_ok = GarbageCollection("p", ["z"], True, None, [row("a", verdict="keep")])
    assert everything_ok.exit_code == ExitCode.OK and everything_ok.exit_error() is None


def ended(state: str, code: int | None, *, index: int = 0, slice_index: int = 0) -> WorkerJobStatus:
    return WorkerJobStatus(
        slice=slice_index, node="job", worker=index, state=state, boot=1, pid=None,
        started=None, exit_code=code, heartbeat_age_s=600.0, reason=None, reachable=True,
    )  # fmt: skip


def test_a_job_that_exited_everywhere_is_kept_saying_how_to_collect_it() -> None:
    """Crashed, or finished without its marker: billed, and nothing will run on it again unless
    someone restarts it. Kept by default (the row says what --include-exited would do)."""
    crashed = [ended("exited", 1), ended("exited", 1, index=1)]
    decided, reason, joined = job_verdict(crashed)
    assert (decided, joined) == ("keep", "exited")
    assert "exited on every worker without being done (exit 1 on 0/0, 0/1)" in reason
    assert "--include-exited would delete it" in reason


@pytest.mark.parametrize(
    ("statuses", "codes"),
    [
        ([ended("exited", 137), ended("exited", 1, index=1)], "exit 137 on 0/0; exit 1 on 0/1"),
        ([ended("exited", 0), ended("done", None, index=1)], "exit 0 on 0/0; done on 0/1"),
        ([ended("setup-failed", 2), ended("setup-failed", 2, index=1)], "setup failed"),
    ],
)
def test_include_exited_deletes_a_job_ended_everywhere(
    statuses: list[WorkerJobStatus], codes: str
) -> None:
    decided, reason, _ = job_verdict(statuses, include_exited=True)
    assert decided == "delete", reason
    assert codes in reason
    assert "deleting it stops the bill; its checkpoints stay" in reason


def test_include_exited_never_takes_a_job_still_running_somewhere() -> None:
    statuses = [ended("exited", 1), ended("running", None, index=1)]
    decided, _reason, _ = job_verdict(statuses, include_exited=True)
    assert decided == "keep"
    assert job_verdict([ended("done", None)], include_exited=True)[0] == "delete"
    assert job_verdict([worker("none")], include_exited=True)[0] == "delete"
