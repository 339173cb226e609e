"""`tpuctl run`: MaxText's multihost_runner workflow on an ACTIVE QR, one fan-out per step."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuctl.errors import UsageError
from tpuctl.fanout import remote
from tpuctl.fanout.engine import EventCallback
from tpuctl.fanout.operations import Fleet, run_command, start_detached, upload
from tpuctl.fanout.results import FanoutResult
from tpuctl.spec.command import FLAGS_PLACEHOLDER, place_flags
from tpuctl.spec.model import Spec

Progress = Callable[[str], None]


@dataclass
class JobRun:
    """The steps of `tpuctl run`, each a FanoutResult; `result` is the last one that ran."""

    steps: dict[str, FanoutResult] = field(default_factory=dict)
    run_id: str | None = None

    @property
    def result(self) -> FanoutResult:
        """The last step's result, naming the step (and the run, once started)."""
        step, result = list(self.steps.items())[-1]
        result.operation, result.step, result.run = "run", step, self.run_id
        return result


def run_job(
    fleet: Fleet,
    spec: Spec,
    *,
    code_dir: Path | None,
    on_progress: Progress | None = None,
    on_event: EventCallback | None = None,
) -> JobRun:
    """multihost_runner on an ACTIVE QR: upload job.code, run job.setup, free the TPU (kill
    device holders, remove the libtpu lockfile), start job.command detached with job.env.
    Stops at the first step that did not succeed everywhere."""
    job = spec.job
    if job is None:
        raise UsageError(f"{spec.source} has no job section: nothing to run")
    say = on_progress or (lambda _message: None)
    run = JobRun()
    workdir = job.workdir
    if code_dir is not None:
        say(f"uploading {code_dir} to {workdir} on {len(fleet.targets)} workers")
        run.steps["upload"] = upload(fleet, code_dir, workdir, on_event=on_event)
        if run.result.exit_code:
            return run
    else:
        run.steps["workdir"] = run_command(fleet, f"mkdir -p -- {remote.remote_path(workdir)}")
        if run.result.exit_code:
            return run
    for index, line in enumerate(job.setup):
        say(f"setup {index + 1}/{len(job.setup)}: {line}")
        command = f"cd {remote.remote_path(workdir)} && bash -c {shlex.quote(line)}"
        run.steps[f"setup[{index}]"] = run_command(fleet, command, on_event=on_event)
        if run.result.exit_code:
            return run
    say("freeing the TPU (device holders, libtpu lockfile)")
    run.steps["free-tpu"] = run_command(fleet, remote.free_tpu_script(), on_event=on_event)
    if run.result.exit_code:
        return run
    line = job.command
    if FLAGS_PLACEHOLDER in line:
        # Like multihost_runner, run adds no framework flags: {flags} is for the startup script.
        say(f"{FLAGS_PLACEHOLDER} left empty: tpuctl run adds no framework flags (tpuctl up does)")
        line = place_flags(line, "")
    command = remote.env_exports(job.env) + f"exec bash -c {shlex.quote(line)}"
    say(f"starting: {line}")
    started = start_detached(fleet, command, workdir=workdir, on_event=on_event)
    run.steps["start"] = started
    run.run_id = started.run
    return run
