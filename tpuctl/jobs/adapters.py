"""What `up` and `drill` decide with, as protocols, and their real implementations: job control
over SSH (FanoutJobOps) and the job's shared storage (StorageJobRecord).

The babysitter and the drill take these injected, so their decisions are unit-tested with fakes
and a fake clock; the CLI passes the real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl.errors import NotFoundError

if TYPE_CHECKING:
    from tpuctl.clock import Clock
    from tpuctl.cloud.client import TpuApi
    from tpuctl.cloud.results import CreateResult, DeleteResult, WaitResult
    from tpuctl.cloud.watcher import Observation, WatchEvent, WatchPolicy, WatchResult
    from tpuctl.errors import TpuctlError
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.spec.model import Spec
    from tpuctl.storage.checkpoints import CheckpointReport
    from tpuctl.storage.lease import Holder


class QueuedResourceOps(Protocol):
    """The queued-resource operations the babysitter and the drill need, for one spec's QR in
    one zone (`in_zone` gives the same spec's QR in another)."""

    name: str
    resource: str  # projects/P/locations/Z/queuedResources/NAME
    zone: str

    def in_zone(self, zone: str) -> QueuedResourceOps:
        """The same spec's queued resource in `zone` (which may not exist)."""
        ...

    def observe(self) -> Observation:
        """One poll: its state (DELETED when Get says NOT_FOUND), initiator, failure."""
        ...

    def create(self) -> CreateResult:
        """Create it from the spec (a new request id), or accept the same spec's."""
        ...

    def wait(
        self,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        on_event: Callable[[WatchEvent], None] | None,
        clock: Clock | None,
    ) -> WaitResult | None:
        """Wait for `policy.until`; raises DeadlineError, QueuedResourceFailed, PreemptedError."""
        ...

    def give_up(
        self,
        result: WatchResult,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        clock: Clock | None,
    ) -> TpuctlError:
        """The error a wait that ended with `result` (not reached) raises, as `wait` would: at
        a deadline it deletes the QR first, unless `keep_on_timeout`."""
        ...

    def delete(self) -> DeleteResult:
        """Delete it with its nodes and wait until it is gone (gone already is fine)."""
        ...

    def node_disruption(self, node_ids: Sequence[str]) -> str | None:
        """Why the nodes are not settled (restarting, maintenance announced…), or None."""
        ...

    def simulate_maintenance(self, node_id: str, worker: int) -> None: ...

    def delete_command(self) -> str:
        """The command a person runs to delete it."""
        ...


class ApiQueuedResource:
    """QueuedResourceOps through the TPU API (tpuctl.cloud)."""

    def __init__(self, api: TpuApi, spec: Spec | None, name: str | None = None) -> None:
        self.api = api
        self.spec = spec
        self.name = name or (spec.name if spec is not None else "")
        self.resource = api.qr_name(self.name)
        self.zone = api.location.zone

    def in_zone(self, zone: str) -> ApiQueuedResource:
        if zone == self.zone:
            return self
        return ApiQueuedResource(self.api.in_zone(zone), self.spec, self.name)

    def observe(self) -> Observation:
        """One poll, retried briefly: the babysitter rides a longer outage out itself."""
        from tpuctl.cloud import lifecycle, queries

        polling = self.api.with_retry(min(self.api.retry_total, lifecycle.POLL_RETRY_SECONDS))
        return queries.observe(polling, self.name)

    def create(self) -> CreateResult:
        from tpuctl.cloud import lifecycle
        from tpuctl.jobs.provision import create_request

        assert self.spec is not None, "creating a queued resource needs its spec"
        return lifecycle.create(self.api, create_request(self.spec, self.api.location))

    def wait(
        self,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        on_event: Callable[[WatchEvent], None] | None,
        clock: Clock | None,
    ) -> WaitResult:
        from tpuctl.cloud import lifecycle

        options = lifecycle.WaitOptions(policy=policy, keep_on_timeout=keep_on_timeout)
        return lifecycle.wait(self.api, self.name, options, on_event=on_event, clock=clock)

    def give_up(
        self,
        result: WatchResult,
        policy: WatchPolicy,
        *,
        keep_on_timeout: bool,
        clock: Clock | None,
    ) -> TpuctlError:
        from tpuctl.cloud import lifecycle

        options = lifecycle.WaitOptions(policy=policy, keep_on_timeout=keep_on_timeout)
        return lifecycle.wait_failure(self.api, self.name, options, result, clock=clock)

    def delete(self) -> DeleteResult:
        from tpuctl.cloud import lifecycle

        return lifecycle.delete(
            self.api, self.name, force=True, wait_until_gone=True, ignore_missing=True
        )

    def node_disruption(self, node_ids: Sequence[str]) -> str | None:
        from tpuctl.cloud.nodes import node_disruption

        return node_disruption(self.api, node_ids)

    def simulate_maintenance(self, node_id: str, worker: int) -> None:
        from tpuctl.cloud.nodes import simulate_maintenance

        simulate_maintenance(self.api, self.api.location.node_name(node_id), worker)

    def delete_command(self) -> str:
        from tpuctl.cloud import queries

        return queries.delete_command(self.api, self.name)


class WorkerStatus(Protocol):
    """What `tpuctl.jobs.control.job_status` reports for one worker (the fields used here)."""

    @property
    def label(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def boot(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def exit_code(self) -> int | None: ...

    @property
    def reachable(self) -> bool: ...

    @property
    def signalled(self) -> bool:
        """The supervisor itself forwarded a SIGTERM/SIGINT (a graceful shutdown)."""
        ...


class JobOps(Protocol):
    """The worker-side operations the babysitter and the drill need."""

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def job_status(self, fleet: Fleet, spec: Spec) -> Sequence[WorkerStatus]: ...

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def mark_done(self, fleet: Fleet, spec: Spec, reason: str) -> FanoutResult:
        """Write the done marker on every worker's disk (a spec without checkpoint.dir)."""
        ...

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        """Worker `target`'s job log (`current.log`, or `boot-<boot>.log`); "" when absent."""
        ...

    def log_tails(self, fleet: Fleet, spec: Spec, lines: int) -> dict[str, str]:
        """Every worker's job log, its last `lines`, by label (workers that answered)."""
        ...


class JobRecord(Protocol):
    """The job's shared storage: the done marker and the checkpoint directory."""

    @property
    def location(self) -> str:
        """Where the checkpoints are looked for ("" when the spec has no checkpoint.dir)."""
        ...

    def is_done(self) -> bool: ...

    def write_done(self, reason: str) -> bool:
        """Write the done marker beside the checkpoints; False when the spec has no
        checkpoint.dir (the marker then lives on the workers' disks: JobOps.mark_done)."""
        ...

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        """(step, committed_at) of the latest complete checkpoint, or None."""
        ...

    def complete_steps(self) -> tuple[int, ...]: ...

    def claimed_zone(self) -> str | None:
        """The zone the run is claimed for (zone_policy first-active), or None."""
        ...

    def claim_zone(self, zone: str | None) -> bool:
        """Claim the run for `zone` (None: for none); False when the spec has no claim."""
        ...


class LeaseLike(Protocol):
    """The run's lease (tpuctl.storage.lease.Lease): one `tpuctl up` at a time."""

    def acquire(
        self, *, wait: bool = False, on_wait: Callable[[Holder], None] | None = None
    ) -> Holder | None: ...

    def renew_if_due(self) -> None: ...

    def release(self) -> None: ...


class JournalLike(Protocol):
    def append(self, kind: str, **fields: Any) -> object: ...


class FanoutJobOps:
    """JobOps over SSH: tpuctl.jobs.control, plus log reads through the fan-out engine."""

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        from tpuctl.jobs import control

        return control.deliver_and_start(fleet, spec)

    def job_status(self, fleet: Fleet, spec: Spec) -> Sequence[WorkerStatus]:
        from tpuctl.jobs import control

        return control.job_status(fleet, spec)

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult:
        from tpuctl.jobs import control

        return control.restart_job(fleet, spec)

    def mark_done(self, fleet: Fleet, spec: Spec, reason: str) -> FanoutResult:
        from tpuctl.jobs import control

        return control.mark_done(fleet, spec, reason)

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        from tpuctl.fanout.engine import run_fanout
        from tpuctl.jobs.scripts import read_log_script

        options = fleet.options(keep_output=True, timeout=30.0)
        result = run_fanout([target], read_log_script(spec.run_name, boot), fleet.connect, options)
        worker = result.results[0]
        if not worker.ok:
            return ""
        return worker.stdout.bytes().decode("utf-8", errors="replace")

    def log_tails(self, fleet: Fleet, spec: Spec, lines: int) -> dict[str, str]:
        from tpuctl.fanout.engine import run_fanout
        from tpuctl.jobs.scripts import job_log_script

        options = fleet.options(keep_output=True, timeout=30.0)
        script = job_log_script(spec.run_name, lines, follow=False)
        result = run_fanout(fleet.targets, script, fleet.connect, options)
        return {
            worker.target.label: worker.stdout.bytes().decode("utf-8", errors="replace")
            for worker in result
            if worker.ok
        }


class StorageJobRecord:
    """JobRecord over the spec's checkpoint dir (local path or gs://) and done marker."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    @property
    def location(self) -> str:
        from tpuctl.worker import checkpoint_root

        return checkpoint_root(self.spec) or ""

    def is_done(self) -> bool:
        from tpuctl.storage.checkpoints import is_done

        return is_done(self.spec)

    def write_done(self, reason: str) -> bool:
        from tpuctl.storage.checkpoints import write_done

        return write_done(self.spec, reason)

    def _report(self) -> CheckpointReport | None:
        from tpuctl.storage.checkpoints import inspect_checkpoints
        from tpuctl.worker import checkpoint_root

        root = checkpoint_root(self.spec)
        if root is None:
            return None
        try:
            return inspect_checkpoints(root)
        except NotFoundError:
            return None

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        report = self._report()
        if report is None or report.latest_step is None:
            return None
        return int(report.latest_step), report.latest_committed_at

    def complete_steps(self) -> tuple[int, ...]:
        report = self._report()
        return () if report is None else tuple(int(step) for step in report.complete_steps)

    def claimed_zone(self) -> str | None:
        from tpuctl.storage.zone_claim import claimed_zone

        return claimed_zone(self.spec)

    def claim_zone(self, zone: str | None) -> bool:
        from tpuctl.storage.zone_claim import claim_zone

        return claim_zone(self.spec, zone)
