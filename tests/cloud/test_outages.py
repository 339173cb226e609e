"""A TPU API outage never leaves a queued resource behind in silence: waits ride it out until
their own deadlines and say so, single calls say what they retry, and whatever is left at the
end is named with the command that removes it."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest

from tests.harness import Project
from tpuctl.cloud.client import TpuApi
from tpuctl.cloud.resolve import Location
from tpuctl.errors import ApiUnavailableError, ExitCode

pytestmark = pytest.mark.emulator


@pytest.fixture
def outage(emulator: Any) -> Iterator[Callable[[], None]]:
    """Turn the emulator's TPU API UNAVAILABLE (every call); the value ends the outage."""
    admin = emulator.admin

    def end() -> None:
        admin.api_fault("UNAVAILABLE", 0)

    try:
        yield lambda: admin.api_fault("UNAVAILABLE", 1_000_000)
    finally:
        end()
        admin.api_fault("UNAVAILABLE", 0)


def test_a_queue_deadline_during_an_outage_names_what_is_left(
    project: Project, no_v4_capacity: Any, outage: Callable[[], None], emulator: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    created = project.cli("create", str(spec))  # queues: no v4 chips
    assert created.exit_code == 0, created.stderr
    outage()
    env = {"TPUCTL_API_RETRY_SECONDS": "2"}
    waited = project.cli("wait", name, "--queue-timeout", "4s", "--format", "json", env=env)
    emulator.admin.api_fault("UNAVAILABLE", 0)
    assert waited.exit_code == ExitCode.DEADLINE, waited.stderr
    assert "the TPU API is unavailable (UNAVAILABLE)" in waited.stderr  # said while it lasted
    error = waited.json()["error"]
    assert error["deleted"] is False and error["api_unavailable"] is True
    assert "could not delete it" in error["message"] and "may still exist" in error["message"]
    assert error["hint"] == f"delete it with: {error['delete_command']}"
    assert error["delete_command"].startswith(f"tpuctl delete {name} ")
    # It is true: the queued resource is still there, queueing.
    status = project.cli("status", name, "--format", "json")
    assert status.json()["state"] == "WAITING_FOR_RESOURCES"


def test_a_deadline_after_the_outage_ended_deletes_as_usual(
    project: Project, no_v4_capacity: Any, emulator: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    assert project.cli("create", str(spec)).exit_code == 0
    # A short outage at the start of the wait: twenty failed calls outlast a read's 2 s of
    # retries (so the wait says so: the retries' random sleeps, up to 0.5 s each, add up to
    # about 5 s), and end a few seconds in even on a loaded machine, well before the queueing
    # deadline.
    emulator.admin.api_fault("UNAVAILABLE", 20)
    try:
        env = {"TPUCTL_API_RETRY_SECONDS": "2"}
        waited = project.cli("wait", name, "--queue-timeout", "12s", "--format", "json", env=env)
    finally:
        emulator.admin.api_fault("UNAVAILABLE", 0)
    assert waited.exit_code == ExitCode.DEADLINE, waited.stderr
    assert waited.json()["error"]["deleted"] is True
    assert "the TPU API answers again" in waited.stderr
    assert project.cli("status", name).exit_code == ExitCode.NOT_FOUND


def test_a_single_call_says_what_it_retries_then_exits_11(
    project: Project, outage: Callable[[], None]
) -> None:
    outage()
    env = {"TPUCTL_API_RETRY_SECONDS": "5"}
    status = project.cli("status", "anything", env=env)
    assert status.exit_code == ExitCode.API_UNAVAILABLE == 11, status.stderr
    assert "the TPU API is unavailable (UNAVAILABLE" in status.stderr
    assert "retrying for up to 5 s" in status.stderr
    assert "gave up retrying" in status.stderr


def test_an_operation_poll_is_bounded_and_says_so() -> None:
    """The client library's operation poll retries without end; tpuctl's is the API's budget."""
    from google.api_core import exceptions

    said: list[str] = []
    api = TpuApi(client=None, location=Location("p", "z"), retry_total=1.0, on_retry=said.append)

    class Pending:
        def done(self, retry: Any) -> bool:
            def unavailable() -> bool:
                raise exceptions.ServiceUnavailable("connection refused")

            return bool(retry(unavailable)())

    with (
        mock.patch("tpuctl.cloud.client.NOTICE_AFTER", 0.0),
        pytest.raises(ApiUnavailableError) as raised,
    ):
        api.wait_operation(Pending(), timeout=600, action="create", target="qr")
    assert raised.value.exit_code == 11 and "gave up retrying" in raised.value.message
    assert said and "waiting for the create of qr" in said[0]


def test_ctrl_c_during_a_delete_that_retries_prints_its_one_json_object(
    project: Project, no_v4_capacity: Any, outage: Callable[[], None], read_until: Any
) -> None:
    spec = project.spec()
    name = spec.stem
    assert project.cli("create", str(spec)).exit_code == 0
    outage()
    process = project.spawn("delete", name, "--force", "--yes", "--format", "json")
    seen: list[str] = []
    try:
        # The delete says what it retries after a few seconds; interrupt it then.
        assert read_until(process.stderr, "retrying for up to", seen), "".join(seen)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, "".join(seen) + err
    document = json.loads(out)  # exactly one JSON object on stdout
    assert document["kind"] == "Error" and document["error"]["kind"] == "interrupted"


def test_an_operation_is_polled_quickly_at_first_then_once_a_second() -> None:
    """Most operations end within a second: the first polls come after 0.1 s, 0.2 s, 0.4 s…,
    and a slow one is never asked more than once a second."""
    api = TpuApi(client=None, location=Location("p", "z"))
    pauses: list[float] = []

    class Slow:
        polls = 0

        def done(self, retry: Any) -> bool:
            self.polls += 1
            return self.polls > 7

        def result(self, timeout: float) -> None:
            return None

    with mock.patch("tpuctl.cloud.client.time.sleep", pauses.append):
        assert api.wait_operation(Slow(), timeout=600, action="create", target="qr")
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
