"""`tpuctl drill`: rehearse a disruption and check the resume contract held, step by step.

1. Preflight: the QR is ACTIVE and the job runs on every worker; record the latest complete
   checkpoint and the step the observer (worker 0 of slice 0) has logged.
2. Trigger: maintenance through the real API (SimulateMaintenanceEvent); spot preemption and
   a slice's hardware failure through the emulator's admin interface (the real API has no way
   to cause them).
3. Recover: maintenance and slice failure reboot the workers and the startup script relaunches
   the job (the drill redelivers a local job.code to a replaced disk); after a preemption the
   drill deletes and recreates the QR itself, unless `external_recovery` (then `tpuctl up`
   must). Wait until every worker runs a new boot of the job and it logs steps again.
4. Judge: the step reached at the event (the last step the old boot logged), whether a
   checkpoint exists at that step, where the new boot resumed (`resumed from step N`, else its
   first step − 1), and how many steps are computed twice. Nothing may be lost beyond what the
   event allows: 0 steps for maintenance with autocheckpoint (and a checkpoint at the event
   step), else at most the steps since the last checkpoint before the event.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tpuctl.clock import Clock
from tpuctl.cloud.watcher import GONE, QUEUE_STATES, SUSPENDED_STATES, WatchPolicy
from tpuctl.errors import TpuctlError, UsageError, quoted
from tpuctl.jobs.adapters import (
    FanoutJobOps,
    JobOps,
    JobRecord,
    JournalLike,
    QueuedResourceOps,
    StorageJobRecord,
)
from tpuctl.jobs.drill_verdict import DrillReport, judge, judge_checkpoints
from tpuctl.jobs.drill_wait import DrillFleet, DrillWaits, WaitInputs
from tpuctl.storage.logs import compile_step_pattern

if TYPE_CHECKING:
    from tpuctl.fanout.operations import Fleet
    from tpuctl.fanout.targets import WorkerTarget
    from tpuctl.spec.model import Spec

DrillKind = Literal["maintenance", "preempt", "slice-failure"]
# The connect timeout for reading the old boot's log after a preemption (its VM is going down).
GOING_DOWN_CONNECT_TIMEOUT = 5.0
KINDS: tuple[DrillKind, ...] = ("maintenance", "preempt", "slice-failure")


class AdminLike(Protocol):
    """The emulator admin calls a drill uses (tpuctl.emulator.client.admin.AdminClient)."""

    def preempt(self, queued_resource: str) -> dict[str, Any]: ...

    def fail_slice(self, queued_resource: str, slice_index: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class DrillOptions:
    kind: DrillKind = "maintenance"
    worker: int = 0
    slice: int | None = None  # maintenance: node to maintain (0); slice-failure: the last one
    timeout: float = 600.0
    external_recovery: bool = False
    step_pattern: str | None = None
    poll: float = 0.5
    # How long the job may run on every worker with no step line in its log before the drill
    # reads progress from committed checkpoints instead, or (with none) gives up.
    progress_patience: float = 60.0


@dataclass(frozen=True)
class DrillEvent:
    at: datetime
    kind: str
    message: str


def check_kind(kind: str, *, on_emulator: bool) -> None:
    """A UsageError for a drill that cannot be triggered where tpuctl is pointed."""
    if kind not in KINDS:
        raise UsageError(f"unknown drill kind {quoted(kind)}; one of {', '.join(KINDS)}")
    if kind != "maintenance" and not on_emulator:
        raise UsageError(
            f"a {kind} drill cannot be triggered against the real Cloud TPU API: there is "
            "no API to preempt a spot VM or break a slice on purpose",
            hint="run it against the emulator (TPU_EMULATOR_HOST), or use "
            "--kind maintenance (SimulateMaintenanceEvent)",
        )


class Drill:
    """`Drill(api, name, spec, fleet_factory=…).run()` → DrillReport (see the module doc)."""

    def __init__(
        self,
        qr: QueuedResourceOps,
        spec: Spec | None,
        *,
        fleet_factory: Callable[[], Fleet],
        options: DrillOptions | None = None,
        admin: AdminLike | None = None,
        jobs: JobOps | None = None,
        record: JobRecord | None = None,
        journal: JournalLike | None = None,
        clock: Clock | None = None,
        on_event: Callable[[DrillEvent], None] | None = None,
    ) -> None:
        self.qr = qr
        name = self.name = qr.name
        self.spec = spec
        self.workers = DrillFleet(fleet_factory)
        self.options = options or DrillOptions()
        self.admin = admin
        self.jobs: JobOps = jobs or FanoutJobOps()
        self.record: JobRecord | None = record
        if self.record is None and spec is not None and spec.checkpoint.dir:
            self.record = StorageJobRecord(spec)
        self.journal = journal
        self.clock = clock or Clock()
        self.on_event = on_event or (lambda _event: None)
        try:
            self.pattern = compile_step_pattern(self.options.step_pattern)
        except re.error as error:
            raise UsageError(f"--step-pattern is not a regular expression: {error}") from None
        except ValueError as error:
            raise UsageError(f"--step-pattern: {error}") from None
        self._job_spec = spec if spec is not None else _bare_spec(name)
        self._waits: DrillWaits | None = None

    # ------------------------------------------------------------------------------ plumbing

    def emit(self, kind: str, message: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.append(kind, message=message, **fields)
        self.on_event(DrillEvent(self.clock.now(), kind, message))

    @property
    def fleet(self) -> Fleet:
        return self.workers.get()

    @property
    def waits(self) -> DrillWaits:
        assert self._waits is not None, "a drill waits only once it runs"
        return self._waits

    def _start_waits(self) -> None:
        """The waits of this run, given what they read, with the deadline from now."""
        options = self.options
        self._waits = DrillWaits(
            WaitInputs(
                name=self.name,
                clock=self.clock,
                deadline=self.clock.monotonic() + options.timeout,
                timeout=options.timeout,
                poll=options.poll,
                progress_patience=options.progress_patience,
                pattern=self.pattern,
                jobs=self.jobs,
                job_spec=self._job_spec,
                redeliver=None if options.external_recovery else self.spec,
                record=self.record,
                fleet=self.workers,
            )
        )

    # ------------------------------------------------------------------------------ the drill

    def run(self) -> DrillReport:
        options = self.options
        kind = options.kind
        check_kind(kind, on_emulator=self.admin is not None)
        if kind == "preempt" and self.spec is None and not options.external_recovery:
            raise UsageError(
                "a preempt drill recreates the queued resource from its spec: give SPEC, "
                "or --external-recovery when tpuctl up is babysitting it"
            )
        self._start_waits()
        waits = self.waits
        autocheckpoint = bool(self.spec and self.spec.checkpoint.autocheckpoint)
        report = DrillReport(
            name=self.name, run=self._job_spec.run_name, drill=kind, autocheckpoint=autocheckpoint
        )
        state = self.qr.observe().state
        while state in QUEUE_STATES or state == "PROVISIONING":  # still coming up: wait
            waits.left(f"{self.name} to be ACTIVE")
            self.clock.sleep(self.options.poll)
            state = self.qr.observe().state
        if state != "ACTIVE":
            raise TpuctlError(
                f"drill on {self.name}: the queued resource is {state}, not ACTIVE",
                hint="start the job first, e.g. with tpuctl up SPEC",
                name=self.name,
                state=state,
            )
        target_slice = self._target_slice()
        observer = self._observer(target_slice)
        report.observer = observer.label
        before = waits.preflight(report, observer)
        before_steps = set(self.record.complete_steps()) if self.record else set()
        report.checkpoint_before = max(before_steps) if before_steps else None
        self.emit(
            "drill.start",
            f"drill {kind} on {self.name}: job at step {report.step_before_trigger}; latest "
            f"checkpoint: {_step_or(report.checkpoint_before, 'none yet')}",
            drill=kind,
            step=report.step_before_trigger,
            checkpoint_step=report.checkpoint_before,
        )
        observer_status = before[observer.label]
        report.triggered_at = self.clock.now()
        triggered = self.clock.monotonic()
        self._trigger(target_slice)
        self.emit(
            "drill.triggered",
            f"triggered {kind} on {self.name}"
            + (f" (slice {target_slice}, worker {options.worker})" if kind != "preempt" else ""),
            drill=kind,
            slice=target_slice,
            worker=options.worker,
            step=report.step_before_trigger,
            checkpoint_step=report.checkpoint_before,
            step_seconds=report.step_seconds,
        )
        old_text = ""
        if kind == "preempt":
            old_text = self._recover_preemption()
        after = waits.wait_back(before)
        report.recovered_at = self.clock.now()
        report.recovery_seconds = self.clock.monotonic() - triggered
        report.boots_before = {label: boot for label, (boot, _pid) in before.items()}
        report.boots_after = {label: boot for label, (boot, _pid) in after.items()}
        if report.progress_from == "checkpoints":
            at_restart = set(self.record.complete_steps()) if self.record else set()
            resumed_from = max(at_restart) if at_restart else None
            self._recovered(report, resumed_from)
            waits.wait_new_checkpoint(resumed_from)
            judge_checkpoints(report, before_steps=before_steps, at_restart=at_restart)
        else:
            if kind != "preempt":
                old_text = waits.read(observer, observer_status[0])
            # The same worker, looked up again: after a preemption (or a replaced slice) it is
            # a new VM with a new host key, and the old target would fail verification.
            observer = self._observer(target_slice)
            new_facts = waits.wait_new_steps(observer)
            self._recovered(report, new_facts.resume_point)
            after_steps = set(self.record.complete_steps()) if self.record else set()
            judge(
                report,
                old_text=old_text,
                new=new_facts,
                before_steps=before_steps,
                after_steps=after_steps,
                pattern=self.pattern,
                has_record=self.record is not None,
            )
        self.emit(
            "drill.result",
            f"drill {kind}: {report.verdict}",
            drill=kind,
            ok=report.ok,
            step_at_event=report.step_at_event,
            resumed_from=report.resumed_from,
            recomputed_steps=report.recomputed_steps,
            allowed_steps=report.allowed_steps,
            checkpoint_at_event=report.checkpoint_at_event,
            step_seconds=report.step_seconds,
            recovery_seconds=round(report.recovery_seconds, 3),
        )
        return report

    def _recovered(self, report: DrillReport, resumed_from: int | None) -> None:
        self.emit(
            "drill.recovered",
            f"{self.name}: the job runs again ({report.recovery_seconds:.1f} s after the event)",
            drill=report.drill,
            recovery_seconds=round(report.recovery_seconds or 0.0, 3),
            resumed_from=resumed_from,
        )

    def _target_slice(self) -> int:
        slices = self.spec.tpu.slices if self.spec is not None else None
        if slices is None:
            slices = len({target.node_id for target in self.fleet.targets})
        if self.options.slice is not None:
            if not 0 <= self.options.slice < slices:
                raise UsageError(f"--slice {self.options.slice} is out of range 0-{slices - 1}")
            return self.options.slice
        if self.options.kind == "slice-failure":
            return slices - 1  # keep slice 0 (the observer's log) on its disk
        return 0

    def _observer(self, target_slice: int) -> WorkerTarget:
        """Worker 0 of slice 0, whose log says where the job is; another slice's worker 0 when
        slice 0 is the one whose disk a slice failure replaces."""
        targets = sorted(self.fleet.targets, key=lambda t: (t.slice_index, t.worker))
        if not targets:
            raise TpuctlError(f"{self.name} has no workers")
        if self.options.kind == "slice-failure":
            others = [t for t in targets if t.slice_index != target_slice]
            if others:
                return others[0]
        return targets[0]

    def _trigger(self, target_slice: int) -> None:
        kind = self.options.kind
        qr_name = self.qr.resource
        if kind == "maintenance":
            node_ids = sorted(
                {t.node_id for t in self.fleet.targets if t.slice_index == target_slice}
            )
            self.qr.simulate_maintenance(node_ids[0], self.options.worker)
        elif kind == "preempt":
            assert self.admin is not None
            self.admin.preempt(qr_name)
        else:
            assert self.admin is not None
            self.admin.fail_slice(qr_name, target_slice)

    def _recover_preemption(self) -> str:
        """Wait for SUSPENDED; read what the old boot logged; recreate (unless external)."""
        waits = self.waits
        seen_gone = False
        while True:
            waits.left("the queued resource to be SUSPENDED after the preemption")
            state = self.qr.observe().state
            if state in ("SUSPENDED", GONE) or (
                self.options.external_recovery and state not in ("ACTIVE", "SUSPENDING")
            ):
                seen_gone = state != "SUSPENDED"
                break
            self.clock.sleep(self.options.poll)
        observer = self._observer(0)
        # The old boot's log is a best effort from a VM that is going down: one that no longer
        # answers would hold the drill for the whole connect timeout (20 s), while tpuctl up
        # recreates the run and its job may even finish.
        old_text = (
            waits.read(observer, None, connect_timeout=GOING_DOWN_CONNECT_TIMEOUT)
            if not seen_gone
            else ""
        )
        if self.options.external_recovery:
            self.emit("drill.waiting", f"waiting for tpuctl up to recreate {self.name}")
            while True:
                waits.left("tpuctl up to recreate the queued resource (--external-recovery)")
                state = self.qr.observe().state
                if state not in SUSPENDED_STATES and state != GONE:
                    seen_gone = True
                if seen_gone and state == "ACTIVE":
                    break
                if state == GONE and self.record is not None and self.record.is_done():
                    raise TpuctlError(
                        f"drill on {self.name}: the run was recreated and its job finished "
                        "before the drill saw it run again",
                        hint="drill a job that runs longer after the event",
                        name=self.name,
                    )
                self.clock.sleep(self.options.poll)
            self.workers.forget()
            return old_text
        assert self.spec is not None  # preempt recovery needs the spec (checked by the CLI)
        self.qr.delete()
        self.emit("qr.deleted", f"deleted {self.name} to recreate it", reason="drill")
        self.qr.create()
        self.emit("qr.recreated", f"created {self.name} again (same run name)", drill=True)
        left = max(1.0, waits.inputs.deadline - self.clock.monotonic())
        policy = WatchPolicy(until="ACTIVE", overall_timeout=left)
        self.qr.wait(policy, keep_on_timeout=True, on_event=None, clock=self.clock)
        self.workers.forget()
        self.jobs.deliver_and_start(self.fleet, self.spec)
        self.emit("job.started", f"{self.name}: job delivered and started", drill=True)
        return old_text

    # ------------------------------------------------------------------------------ verdict


def _bare_spec(name: str) -> Spec:
    """For NAME without a spec: the run name is the QR name (tpuctl's default)."""
    from tpuctl.spec.model import JobSpec, Spec, TpuSpec

    return Spec(
        name=name,
        tpu=TpuSpec(accelerator="v4-8", runtime="unknown"),
        job=JobSpec(command=""),
        source=name,
    )


def _step_or(step: int | None, otherwise: str) -> str:
    """A step for a message, or what to say when there is none (never `None`)."""
    return otherwise if step is None else f"step {step}"
