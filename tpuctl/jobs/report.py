"""`tpuctl report`: a run's report assembled from its journal and its checkpoint directory,
and the spec facts a report needs read back from a queued resource (for NAME instead of SPEC).
The arithmetic is tpuctl.jobs.goodput."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.errors import TpuctlError, UsageError
from tpuctl.jobs.goodput import JobReport, build_report, checkpoint_step_seconds

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.spec.model import Spec

__all__ = ["JobReport", "report_for", "spec_of_queued_resource"]


def report_for(spec: Spec) -> JobReport:
    """The report of the spec's run, from its journal and its checkpoint directory."""
    from tpuctl.storage.journal import Journal

    journal = Journal(spec)
    if not journal.enabled:
        raise UsageError(
            f"{spec.name} has no checkpoint.dir, so it has no journal to report from",
            hint="set checkpoint.dir in the spec (a gs:// bucket) and run it with tpuctl up",
        )
    entries = journal.entries()
    latest_step, step_seconds = _checkpoint_facts(spec)
    from tpuctl.spec.ladder import rung_names

    rungs = rung_names(spec)
    report = build_report(
        entries,
        name=spec.name,
        run=spec.run_name,
        latest_step=latest_step,
        checkpoint_step_seconds=step_seconds,
        first_rung=rungs[0] if rungs else None,
    )
    if not entries:
        report.notes.append(
            f"the journal of run {spec.run_name} is empty: was it started with tpuctl up?"
        )
    return report


def _checkpoint_facts(spec: Spec) -> tuple[int | None, float | None]:
    from tpuctl.storage.checkpoints import inspect_checkpoints
    from tpuctl.worker import checkpoint_root

    root = checkpoint_root(spec)
    if root is None:
        return None, None
    try:
        found = inspect_checkpoints(root)
    except TpuctlError:
        return None, None
    commits = [(folder.step, folder.committed_at) for folder in found.steps if folder.complete]
    return found.latest_step, checkpoint_step_seconds(commits)


def spec_of_queued_resource(api: TpuApi, name: str) -> Spec:
    """The spec facts a report needs (checkpoint dir, run name, framework), read back from the
    startup script in the queued resource's node template."""
    from tpuctl.render.startup import read_values
    from tpuctl.spec.model import CheckpointSpec, JobSpec, Spec, TpuSpec

    queued_resource = api.get_queued_resource(name)
    values: dict[str, str] = {}
    accelerator = "unknown"
    for node_spec in queued_resource.tpu.node_spec:
        node = node_spec.node
        accelerator = node.accelerator_type or accelerator
        values.update(read_values(node.metadata.get("startup-script", "")))
    directory = values.get("CHECKPOINT_DIR_SPEC")
    if not directory or "RUN_NAME" not in values or not directory.startswith(("gs://", "/")):
        raise UsageError(
            f"cannot tell the checkpoint dir of {name} from its queued resource",
            hint="give the spec file instead of the name",
        )
    framework = values.get("FRAMEWORK", "custom")
    return Spec(
        name=values.get("SPEC_NAME", name),
        tpu=TpuSpec(accelerator=accelerator, runtime="unknown"),
        checkpoint=CheckpointSpec(dir=directory),
        job=JobSpec(command="", run_name=values["RUN_NAME"], framework=framework),  # type: ignore[arg-type]
        source=name,
    )
