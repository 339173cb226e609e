"""What `up` and `drill` decide with, as protocols, and their real implementations: job control
over SSH (FanoutJobOps) and the job's shared storage (StorageJobRecord).

The babysitter and the drill take these injected, so their decisions are unit-tested with fakes
and a fake clock; the CLI passes the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from tpuctl.errors import NotFoundError

if TYPE_CHECKING:
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.results import FanoutResult
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.spec.model import Spec
    from tpuctl.storage.checkpoints import CheckpointReport


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


class JobOps(Protocol):
    """The worker-side operations the babysitter and the drill need."""

    def deliver_and_start(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def job_status(self, fleet: Fleet, spec: Spec) -> Sequence[WorkerStatus]: ...

    def restart_job(self, fleet: Fleet, spec: Spec) -> FanoutResult: ...

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        """Worker `target`'s job log (`current.log`, or `boot-<boot>.log`); "" when absent."""
        ...


class JobRecord(Protocol):
    """The job's shared storage: the done marker and the checkpoint directory."""

    def is_done(self) -> bool: ...

    def latest_checkpoint(self) -> tuple[int, datetime | None] | None:
        """(step, committed_at) of the latest complete checkpoint, or None."""
        ...

    def complete_steps(self) -> tuple[int, ...]: ...


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

    def read_log(self, fleet: Fleet, spec: Spec, target: WorkerTarget, boot: int | None) -> str:
        from tpuctl.fanout.engine import run_fanout
        from tpuctl.jobs.scripts import read_log_script

        options = fleet.options(keep_output=True, timeout=30.0)
        result = run_fanout([target], read_log_script(spec.run_name, boot), fleet.connect, options)
        worker = result.results[0]
        if not worker.ok:
            return ""
        return worker.stdout.bytes().decode("utf-8", errors="replace")


class StorageJobRecord:
    """JobRecord over the spec's checkpoint dir (local path or gs://) and done marker."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def is_done(self) -> bool:
        from tpuctl.storage.checkpoints import is_done

        return is_done(self.spec)

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
