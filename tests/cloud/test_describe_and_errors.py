"""Pure parts of cloud/: proto → status dicts, spec-vs-existing differences, API error mapping."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import tpu_v2alpha1 as tpu

from tpuctl.cloud import describe
from tpuctl.cloud.client import AlreadyExistsError, api_errors, make_retry
from tpuctl.errors import AuthError, ExitCode, NotFoundError, TpuctlError

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
PARENT = "projects/p/locations/z"


def make_qr(
    *,
    slices: int = 2,
    accelerator: str = "v4-16",
    tier: str = "spot",
    state: str = "ACTIVE",
    spec_hash: str = "abc123",
) -> Any:
    node = tpu.Node(
        accelerator_type=accelerator,
        runtime_version="tpu-ubuntu2204-base",
        labels={"managed-by": "tpuctl", "tpuctl-job": "job", "tpuctl-spec-hash": spec_hash},
    )
    node_spec = tpu.QueuedResource.Tpu.NodeSpec(parent=PARENT, node=node)
    if slices > 1:
        node_spec.multi_node_params = tpu.QueuedResource.Tpu.NodeSpec.MultiNodeParams(
            node_count=slices, node_id_prefix="job"
        )
    else:
        node_spec.node_id = "job"
    qr = tpu.QueuedResource(
        name=f"{PARENT}/queuedResources/job",
        tpu=tpu.QueuedResource.Tpu(node_spec=[node_spec]),
        create_time=NOW - timedelta(minutes=10),
    )
    if tier == "spot":
        qr.spot = tpu.QueuedResource.Spot()
    elif tier == "reserved":
        qr.guaranteed = tpu.QueuedResource.Guaranteed(reserved=True)
    qr.state = tpu.QueuedResourceState(state=tpu.QueuedResourceState.State[state])
    return qr


def make_node(node_id: str, *, minutes_ago: float, workers: int = 2) -> Any:
    return tpu.Node(
        name=f"{PARENT}/nodes/{node_id}",
        state=tpu.Node.State.READY,
        health=tpu.Node.Health.HEALTHY,
        create_time=NOW - timedelta(minutes=minutes_ago),
        network_endpoints=[
            tpu.NetworkEndpoint(
                ip_address=f"10.0.0.{i}",
                access_config=tpu.AccessConfig(external_ip=f"34.0.0.{i}") if i == 0 else None,
            )
            for i in range(workers)
        ],
    )


def test_status_summary_has_slices_nodes_and_workers() -> None:
    qr = make_qr()
    nodes = {"job-0": make_node("job-0", minutes_ago=5), "job-1": make_node("job-1", minutes_ago=4)}
    summary = describe.queued_resource_summary(qr, project="p", zone="z", nodes=nodes, now=NOW)
    assert summary.state == "ACTIVE"
    assert summary.tier == "spot"
    assert summary.slices == 2
    assert summary.managed_by_tpuctl is True
    assert summary.spec_hash == "abc123"
    assert summary.state_since_source == "last_node_create_time"
    assert summary.in_state_seconds == 240.0
    assert [n.name for n in summary.nodes] == ["job-0", "job-1"]
    assert summary.to_dict()["nodes"][0]["workers"] == [
        {"worker": 0, "internal_ip": "10.0.0.0", "external_ip": "34.0.0.0"},
        {"worker": 1, "internal_ip": "10.0.0.1", "external_ip": None},
    ]
    assert summary.failure is None


def test_waiting_qr_counts_time_from_create_and_lists_missing_nodes() -> None:
    qr = make_qr(state="WAITING_FOR_RESOURCES")
    summary = describe.queued_resource_summary(qr, project="p", zone="z", now=NOW)
    assert summary.state_since_source == "create_time"
    assert summary.in_state_seconds == 600.0
    assert [n.state for n in summary.nodes] == [None, None]


def test_failure_reason_and_initiator() -> None:
    qr = make_qr(state="FAILED")
    qr.state.failed_data = tpu.QueuedResourceState.FailedData()
    qr.state.failed_data.error.code = 4
    qr.state.failed_data.error.message = "valid_until passed"
    assert describe.failure_of(qr) == {"code": 4, "message": "valid_until passed"}
    suspended = make_qr(state="SUSPENDED")
    suspended.state.state_initiator = tpu.QueuedResourceState.StateInitiator.SERVICE
    summary = describe.queued_resource_summary(suspended, project="p", zone="z", now=NOW)
    assert summary.state_initiator == "SERVICE"


def test_differences_name_each_changed_field() -> None:
    same = describe.differences(make_qr(), make_qr())
    assert same == []
    diffs = describe.differences(
        make_qr(), make_qr(slices=4, accelerator="v4-32", tier="reserved", spec_hash="ffff")
    )
    fields = [d["field"] for d in diffs]
    assert fields == ["accelerator", "tier", "slices", "spec_hash"]
    text = describe.format_differences(diffs)
    assert "slices: 2 → 4" in text and "tier: spot → reserved" in text


def test_single_slice_and_on_demand() -> None:
    template = describe.template_of(make_qr(slices=1, tier="on-demand"))
    assert (template.slices, template.node_ids, template.tier) == (1, ["job"], "on-demand")


@pytest.mark.parametrize(
    ("raised", "expected", "code"),
    [
        (api_exceptions.NotFound("gone"), NotFoundError, ExitCode.NOT_FOUND),
        (api_exceptions.PermissionDenied("no"), AuthError, ExitCode.AUTH),
        (api_exceptions.Unauthenticated("who"), AuthError, ExitCode.AUTH),
        (api_exceptions.InvalidArgument("bad"), TpuctlError, ExitCode.ERROR),
        (api_exceptions.AlreadyExists("dup"), AlreadyExistsError, ExitCode.ERROR),
        (api_exceptions.InternalServerError("boom"), TpuctlError, ExitCode.ERROR),
    ],
)
def test_api_errors_map_to_tpuctl_errors(
    raised: Exception, expected: type[TpuctlError], code: ExitCode
) -> None:
    with pytest.raises(expected) as caught, api_errors("get", "projects/p/x"):
        raise raised
    assert caught.value.exit_code is code


def test_failed_precondition_on_delete_says_use_force() -> None:
    with pytest.raises(TpuctlError) as caught, api_errors("delete", "q"):
        raise api_exceptions.FailedPrecondition("has 2 node(s) in state ACTIVE")
    assert "--force" in (caught.value.hint or "")
    assert caught.value.details["status"] == "FAILED_PRECONDITION"


def test_retry_predicates_retry_transient_only_and_resource_exhausted_on_reads() -> None:
    reads, writes = (
        make_retry(total_seconds=1, reads=True),
        make_retry(total_seconds=1, reads=False),
    )
    assert reads._predicate(api_exceptions.ServiceUnavailable("x"))
    assert reads._predicate(api_exceptions.DeadlineExceeded("x"))
    assert reads._predicate(api_exceptions.ResourceExhausted("x"))
    assert not writes._predicate(api_exceptions.ResourceExhausted("x"))
    assert writes._predicate(api_exceptions.ServiceUnavailable("x"))
    for never in (api_exceptions.PermissionDenied("x"), api_exceptions.Unauthenticated("x")):
        assert not reads._predicate(never)
        assert not writes._predicate(never)


def test_retry_exhaustion_is_one_clear_error() -> None:
    with pytest.raises(TpuctlError) as caught, api_errors("get", "q"):
        raise api_exceptions.RetryError("deadline", api_exceptions.ServiceUnavailable("down"))
    assert "kept failing" in caught.value.message and "down" in caught.value.message


@pytest.mark.parametrize("budget", [2.0, 5.0, 60.0])
def test_a_retry_budget_is_used_not_given_up_early(
    budget: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """google.api_core gives up when its next (random) sleep would pass the deadline: the
    backoff's cap keeps the last attempt in the budget's last quarter, whatever the draws."""
    from types import SimpleNamespace

    from google.api_core.retry import retry_base, retry_unary

    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    clock = SimpleNamespace(monotonic=lambda: now[0], sleep=sleep)
    monkeypatch.setattr(retry_unary, "time", clock)
    monkeypatch.setattr(retry_base, "time", clock)
    attempts: list[float] = []

    def down() -> None:
        attempts.append(now[0])
        raise api_exceptions.ServiceUnavailable("down")

    for _ in range(200):
        now[0] = 0.0
        attempts.clear()
        with pytest.raises(api_exceptions.RetryError):
            make_retry(total_seconds=budget, reads=True)(down)()
        assert budget * 3 / 4 <= attempts[-1] <= budget, attempts
