"""Checked values → the typed `Spec`: the rules that span fields (tiers, topology, multislice,
parallelism products, code locations) and the warnings worth showing."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from tpuctl.errors import SpecError
from tpuctl.spec.check import Checker
from tpuctl.spec.fields import field_at
from tpuctl.spec.model import (
    CapacitySpec,
    CheckpointSpec,
    DeadlinesSpec,
    JobSpec,
    ParallelismSpec,
    RecoverySpec,
    Spec,
    Tier,
    TpuSpec,
)
from tpuctl.spec.yamlsource import join_path
from tpuctl.topology import (
    Accelerator,
    AcceleratorError,
    from_type_topology,
    mesh_product,
    parse_accelerator,
    runtime_warning,
)

_TIER_FLAGS = (
    ("spot", "spot"),
    ("reserved", "reserved"),
    ("on_demand", "on-demand"),
    ("best_effort", "best-effort"),
)


_CODE_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


class Values:
    """A checked section; absent keys read as the field table's default."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data = data
        self.path = path

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def __getitem__(self, name: str) -> Any:
        if name in self.data:
            return self.data[name]
        field = field_at(join_path(self.path, name))
        assert field is not None, f"{self.path}.{name} is not in the field table"
        return _freeze(field.default)

    def section(self, name: str) -> Values:
        return Values(self.data.get(name) or {}, join_path(self.path, name))


class Builder:
    def __init__(self, checker: Checker, values: Values) -> None:
        self.checker = checker
        self.values = values
        self.warnings: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> SpecError:
        return self.checker.error(message, path, hint)

    def warn(self, message: str, path: str) -> None:
        self.warnings.append(self.checker.warning(message, path))

    def build(self) -> Spec:
        values = self.values
        name: str = values["name"]
        tpu, accelerator = self.tpu(values.section("tpu"))
        job = (
            self.job(values.section("job"), name, accelerator, tpu.slices)
            if "job" in values
            else None
        )
        deadlines = values.section("deadlines")
        for key in ("queue", "provision"):
            if key in deadlines and deadlines[key] <= timedelta(0):
                raise self.error("a deadline must be longer than zero", f"deadlines.{key}")
        recovery = values.section("recovery")
        checkpoint = self.checkpoint(values.section("checkpoint"))
        if job is not None and job.target_step is not None and not checkpoint.dir:
            raise self.error(
                "target_step needs a checkpoint directory to find the committed steps in",
                "job.target_step",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
            )
        return Spec(
            name=name,
            tpu=tpu,
            capacity=self.capacity(values.section("capacity")),
            checkpoint=checkpoint,
            job=job,
            deadlines=DeadlinesSpec(queue=deadlines["queue"], provision=deadlines["provision"]),
            recovery=RecoverySpec(
                max_preemptions=recovery["max_preemptions"],
                max_failures=recovery["max_failures"],
            ),
            project=values["project"],
            zone=values["zone"],
            source=self.checker.document.source,
        )

    def tpu(self, tpu: Values) -> tuple[TpuSpec, Accelerator]:
        type_name: str | None = None
        topology: str | None = None
        try:
            if "accelerator" in tpu:
                accelerator = parse_accelerator(tpu["accelerator"])
            else:
                accelerator = from_type_topology(tpu["type"], tpu["topology"])
                type_name, topology = accelerator.family.prefix, accelerator.topology
        except AcceleratorError as exc:
            if "accelerator" in tpu:
                path = "tpu.accelerator"
            else:
                path = "tpu.type" if str(exc).startswith("unknown TPU type") else "tpu.topology"
            raise self.error(str(exc), path, "e.g. v4-16, v5p-8, v5litepod-16 or v6e-8") from None
        slices: int = tpu["slices"]
        if slices > 1 and not accelerator.supports_multislice:
            raise self.error(
                f"multislice is not available on {accelerator.generation}",
                "tpu.slices",
                "use slices: 1, or a v4 or newer accelerator for several slices",
            )
        warning = runtime_warning(accelerator, tpu["runtime"])
        if warning:
            self.warn(warning, "tpu.runtime")
        spec = TpuSpec(
            accelerator=accelerator.accelerator_type,
            runtime=tpu["runtime"],
            type=type_name,
            topology=topology,
            slices=slices,
            network=tpu["network"],
            subnetwork=tpu["subnetwork"],
            external_ips=tpu["external_ips"],
            tags=tpu["tags"],
            labels=tpu["labels"],
            service_account=tpu["service_account"],
            scopes=tpu["scopes"],
            metadata=tpu["metadata"],
            description=tpu["description"],
        )
        return spec, accelerator

    def capacity(self, capacity: Values) -> CapacitySpec:
        chosen: list[tuple[str, str]] = []  # (tier, the key that asked for it)
        if "tier" in capacity:
            chosen.append((capacity["tier"], "capacity.tier"))
        for key, tier in _TIER_FLAGS:
            if capacity.data.get(key):
                chosen.append((tier, f"capacity.{key}"))
        for tier, path in chosen[1:]:
            if tier != chosen[0][0]:
                raise self.error(
                    f"two capacity tiers: {chosen[0][1]} asks for {chosen[0][0]}, "
                    f"{path} for {tier}",
                    path,
                    "keep one: tier: spot | reserved | on-demand | best-effort",
                )
        tier = cast(Tier, chosen[0][0] if chosen else capacity["tier"])
        for key, flag_tier in _TIER_FLAGS:
            if key in capacity and capacity[key] is False and flag_tier == tier and chosen:
                raise self.error(
                    f"contradicts {chosen[0][1]}, which asks for {tier}",
                    f"capacity.{key}",
                    f"remove capacity.{key}",
                )
        if "reservation" in capacity and tier != "reserved":
            raise self.error(
                f"a reservation needs the reserved tier, not {tier}",
                "capacity.reservation",
                "set capacity.tier: reserved, or remove reservation",
            )
        until, after = capacity["valid_until"], capacity["valid_after"]
        if (
            until is not None
            and after is not None
            and type(until) is type(after)
            and after >= until
        ):
            raise self.error(
                "valid_after is not before valid_until: the request could never be served",
                "capacity.valid_after",
            )
        return CapacitySpec(
            tier=tier, reservation=capacity["reservation"], valid_until=until, valid_after=after
        )

    def checkpoint(self, checkpoint: Values) -> CheckpointSpec:
        if checkpoint["autocheckpoint"] and not checkpoint["dir"]:
            raise self.error(
                "autocheckpoint needs a checkpoint directory",
                "checkpoint.autocheckpoint",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
            )
        return CheckpointSpec(dir=checkpoint["dir"], autocheckpoint=checkpoint["autocheckpoint"])

    def job(self, job: Values, name: str, accelerator: Accelerator, slices: int) -> JobSpec:
        command: str = job["command"]
        if not command.strip():
            raise self.error("the command is empty", "job.command", "give the command to run")
        if job["user"] == "root":
            self.warn("the job runs as root; a dedicated user is safer", "job.user")
        code: str | None = job["code"]
        if code is not None:
            self.code(code)
        parallelism = None
        if "parallelism" in job:
            parallelism = self.parallelism(job.section("parallelism"), accelerator, slices)
        return JobSpec(
            command=command,
            framework=job["framework"],
            run_name=job["run_name"] or name,
            user=job["user"],
            workdir=job["workdir"],
            code=code,
            setup=job["setup"],
            env=job["env"],
            parallelism=parallelism,
            target_step=job["target_step"],
        )

    def code(self, code: str) -> None:
        if "://" in code:
            if not code.startswith("gs://"):
                raise self.error(
                    f"unsupported code location {code!r}",
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
