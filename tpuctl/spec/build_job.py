"""The builder's job rules: the command and the framework's flags, the code location, the
parallelism mesh, and the warnings worth showing about a job."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from tpuctl.errors import quoted
from tpuctl.spec.command import CommandShape, analyse, command_line, given_flags
from tpuctl.spec.frameworks import (
    Checkpointing,
    PresetFlag,
    adopt_given_flags,
    autocheckpoint_warning,
    preset_flags,
)
from tpuctl.spec.model import CheckpointSpec, JobSpec, ParallelismSpec
from tpuctl.spec.sections import Rules, Values
from tpuctl.topology import Accelerator, mesh_product

_CODE_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
# job.env names that hold a secret, by the words people use for them.
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH", re.IGNORECASE
)


class JobRules(Rules):
    def job(
        self,
        job: Values,
        name: str,
        accelerator: Accelerator,
        slices: int,
        checkpoint: CheckpointSpec,
    ) -> tuple[JobSpec, CheckpointSpec]:
        """The job, and the checkpoint section as the command's own flags complete it."""
        line = command_line(job["command"])
        if not line.strip():
            raise self.error("the command is empty", "job.command", "give the command to run")
        try:
            shape = analyse(line)
        except ValueError as error:
            raise self.error(str(error), "job.command", "check its quotes") from None
        framework = job["framework"]
        settings = Checkpointing(
            checkpoint.autocheckpoint, checkpoint.continuous, checkpoint.keep, slices > 1
        )
        adopted = adopt_given_flags(
            framework,
            given_flags(shape.words),
            run_name=job["run_name"],
            checkpoint_dir=checkpoint.dir,
            settings=settings,
        )
        for conflict in adopted.conflicts:
            raise self.error(conflict.message, conflict.path, conflict.hint)
        for path, note in adopted.notes:
            self.warn(note, path)
        if adopted.checkpoint_dir and not checkpoint.dir:
            checkpoint = replace(checkpoint, dir=adopted.checkpoint_dir)
        flags = preset_flags(framework, settings, command_words=shape.words)
        if flags and shape.needs_placement:
            self.refuse_compound(shape, framework, flags)
        self.job_warnings(job, framework, checkpoint)
        code: str | None = job["code"]
        if code is not None:
            self.code(code)
        parallelism = None
        if "parallelism" in job:
            parallelism = self.parallelism(job.section("parallelism"), accelerator, slices)
        target_step = job["target_step"]
        if target_step is None and adopted.target_step is not None and checkpoint.dir:
            target_step = adopted.target_step
        spec = JobSpec(
            command=line,
            framework=framework,
            run_name=job["run_name"] or adopted.run_name or name,
            user=job["user"],
            workdir=job["workdir"],
            code=code,
            setup=job["setup"],
            env=job["env"],
            parallelism=parallelism,
            target_step=target_step,
            boot_script=job["boot_script"],
        )
        return spec, checkpoint

    def refuse_compound(
        self, shape: CommandShape, framework: str, flags: tuple[PresetFlag, ...]
    ) -> None:
        shown = " ".join(flag.name for flag in flags[:2]) + (" …" if len(flags) > 2 else "")
        raise self.error(
            f"the command is {shape.compound}, so the {framework} flags ({shown}) would be "
            "appended to its end and reach the last command, not the trainer",
            "job.command",
            "mark where they go with {flags}, e.g. "
            "`{ python3 train.py {flags}; } 2>&1 | tee train.log`, or write the command as a "
            "list of words",
        )

    def job_warnings(self, job: Values, framework: str, checkpoint: CheckpointSpec) -> None:
        if job["user"] == "root":
            self.warn("the job runs as root; a dedicated user is safer", "job.user")
        warning = autocheckpoint_warning(framework, autocheckpoint=checkpoint.autocheckpoint)  # type: ignore[arg-type]
        if warning:
            self.warn(warning, "checkpoint.autocheckpoint")
        for key in job["env"]:
            if _SECRET_NAME.search(key):
                self.warn(
                    f"{key} looks like a secret: its value goes into the startup script in the "
                    "node metadata, which anyone with tpu.nodes.get can read; fetch it on the "
                    "workers instead (e.g. from Secret Manager in job.setup)",
                    f"job.env.{key}",
                )

    def code(self, code: str) -> None:
        if "://" in code:
            if not code.startswith("gs://"):
                raise self.error(
                    f"unsupported code location {quoted(code)}",
                    "job.code",
                    "give a local directory or file, or gs://bucket/path/code.tar.gz",
                )
            if not code.endswith(_CODE_ARCHIVE_SUFFIXES):
                raise self.error(
                    "code in Cloud Storage must be a .tar.gz or .tgz archive",
                    "job.code",
                    "e.g. gs://my-bucket/code.tar.gz",
                )
            return
        local = resolve_local(code, self.checker.document.source)
        if not local.exists():
            self.warn(f"local code {code} does not exist (looked at {local})", "job.code")
        elif not (local.is_dir() or local.is_file()):
            self.warn(
                f"local code {code} is neither a directory nor a file (looked at {local})",
                "job.code",
            )

    def parallelism(
        self, parallelism: Values, accelerator: Accelerator, slices: int
    ) -> ParallelismSpec:
        ici: dict[str, int] = dict(parallelism.section("ici").data)
        dcn: dict[str, int] = dict(parallelism.section("dcn").data)
        layers = (
            ("ici", ici, accelerator.chips, f"chips in one {accelerator.accelerator_type} slice"),
            ("dcn", dcn, slices, "slices"),
        )
        for layer, axes, expected, what in layers:
            product = mesh_product(axes)
            if axes and product != expected:
                shown = " × ".join(f"{axis} {size}" for axis, size in axes.items())
                raise self.error(
                    f"{layer} axes multiply to {product} ({shown}), "
                    f"but there are {expected} {what}",
                    f"job.parallelism.{layer}",
                    f"make the {layer} product {expected}",
                )
        if dcn.get("tensor", 1) > 1:
            self.warn(
                "tensor parallelism across slices (DCN) is slow; keep dcn.tensor at 1 and use "
                "data or fsdp across slices",
                "job.parallelism.dcn.tensor",
            )
        return ParallelismSpec(ici=ici, dcn=dcn)


def resolve_local(code: str, source: str) -> Path:
    path = Path(code).expanduser()
    if path.is_absolute() or source.startswith("<"):
        return path.resolve() if not path.is_absolute() else path
    return (Path(source).parent / path).resolve()
