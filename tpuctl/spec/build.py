"""Checked values → the typed `Spec`: the rules that span fields (tiers, topology, multislice,
parallelism products, code locations) and the warnings worth showing."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from tpuctl.clock import format_duration, rfc3339
from tpuctl.errors import SpecError, quoted
from tpuctl.spec.check import Checker
from tpuctl.spec.command import CommandShape, analyse, command_line, given_flags
from tpuctl.spec.compute import check_compute_capacity, check_compute_checkpoint, check_compute_tpu
from tpuctl.spec.fields import field_at
from tpuctl.spec.frameworks import (
    Checkpointing,
    PresetFlag,
    adopt_given_flags,
    autocheckpoint_warning,
    preset_flags,
)
from tpuctl.spec.model import (
    RESERVATION_TIERS,
    TIERS,
    BootDiskSpec,
    CapacitySpec,
    CheckpointSpec,
    DataDiskSpec,
    DeadlinesSpec,
    JobSpec,
    ParallelismSpec,
    RecoverySpec,
    RungSpec,
    Spec,
    Tier,
    TpuSpec,
)
from tpuctl.spec.yamlsource import join_path
from tpuctl.topology import (
    COMPUTE_WHY,
    IRONWOOD_WHY,
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


# flex-start's maximum run duration (runDuration.maxRunDuration), as the service bounds it.
MIN_RUN_DURATION = timedelta(minutes=10)
MAX_RUN_DURATION = timedelta(days=7)
# The generations Cloud TPU offers flex-start for.
FLEX_START_GENERATIONS = ("v5e", "v6e")

_CODE_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
# job.env names that hold a secret, by the words people use for them.
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(OR)?D|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH", re.IGNORECASE
)


T = TypeVar("T")


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
    def __init__(self, checker: Checker, values: Values, now: datetime | None = None) -> None:
        self.checker = checker
        self.values = values
        self.now = now  # when a request made from the spec would be sent; None: not judged
        self.warnings: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> SpecError:
        return self.checker.error(message, path, hint)

    def warn(self, message: str, path: str) -> None:
        self.warnings.append(self.checker.warning(message, path))

    def build(self) -> Spec:
        """The Spec. Every rule is judged whose fields are right (a rule over a section with
        a mistake in it would only repeat that mistake), and every mistake, the checker's and
        these, is raised together."""
        values = self.values
        wrong = set(self.checker.wrong_sections())
        name: str = values["name"]
        built = self._attempt(lambda: self.tpu(values.section("tpu")), {"tpu"}, wrong, "tpu")
        checkpoint = self._attempt(
            lambda: self.checkpoint(values.section("checkpoint")),
            {"checkpoint"},
            wrong,
            "checkpoint",
        )
        job = None
        if "job" in values:

            def make_job() -> tuple[JobSpec, CheckpointSpec]:
                assert built is not None and checkpoint is not None
                tpu, accelerator = built
                return self.job(values.section("job"), name, accelerator, tpu.slices, checkpoint)

            made = self._attempt(make_job, {"job", "name", "tpu", "checkpoint"}, wrong, "job")
            if made is not None:
                job, checkpoint = made
            if built is not None and built[0].metadata.get("startup-script") is not None:
                self.warn(
                    "tpu.metadata.startup-script replaces tpuctl's startup script: the job "
                    "section is not run by it, and up, drill and done detection then rely on "
                    "your script keeping tpuctl's worker contract (status file, done marker)",
                    "tpu.metadata.startup-script",
                )
        if checkpoint is not None:
            settled = checkpoint
            self._attempt(lambda: self.check_checkpoint(settled), {"checkpoint", "job"}, wrong)
        deadlines = values.section("deadlines")
        for key in ("queue", "provision"):
            if "deadlines" not in wrong and key in deadlines and deadlines[key] <= timedelta(0):
                self.checker.record(
                    self.error(
                        "a deadline must be longer than zero",
                        f"deadlines.{key}",
                        "give a duration such as 30m or 2h, or leave it out for the default",
                    )
                )
        recovery = values.section("recovery")
        capacity = self._attempt(
            lambda: self.capacity(values.section("capacity")), {"capacity"}, wrong, "capacity"
        )

        def zone_of() -> str | None:
            assert capacity is not None
            return self.zone(values, capacity)

        zone = self._attempt(zone_of, {"capacity", "zone"}, wrong, "zone")

        def across_fields() -> None:
            assert capacity is not None and checkpoint is not None and built is not None
            self.check_zone_policy(capacity, job, checkpoint, built[0])
            if built[0].api == "compute":
                check_compute_checkpoint(self, checkpoint)
            if job is not None and job.target_step is not None and not checkpoint.dir:
                raise self.error(
                    "target_step needs a checkpoint directory to find the committed steps in",
                    "job.target_step",
                    "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
                )

        self._attempt(across_fields, {"capacity", "job", "checkpoint", "tpu"}, wrong)

        def capacity_for_tpu() -> None:
            assert capacity is not None and built is not None
            if built[0].api == "tpu":
                self.check_capacity_for(capacity, built[1])
            else:
                check_compute_capacity(self, capacity, built[1])

        self._attempt(capacity_for_tpu, {"capacity", "tpu"}, wrong)
        self.checker.raise_recorded()
        assert built is not None and checkpoint is not None and capacity is not None
        return Spec(
            name=name,
            tpu=built[0],
            capacity=capacity,
            checkpoint=checkpoint,
            job=job,
            deadlines=DeadlinesSpec(queue=deadlines["queue"], provision=deadlines["provision"]),
            recovery=RecoverySpec(
                max_preemptions=recovery["max_preemptions"],
                max_failures=recovery["max_failures"],
            ),
            project=values["project"],
            zone=zone,
            source=self.checker.document.source,
        )

    def _attempt(
        self, step: Callable[[], T], needs: set[str], wrong: set[str], makes: str | None = None
    ) -> T | None:
        """`step`'s result, or None: when a section it `needs` is `wrong` (it is not judged),
        or when it finds a mistake (recorded). Either way what it `makes` is wrong too."""
        if needs & wrong:
            if makes:
                wrong.add(makes)
            return None
        try:
            return step()
        except SpecError as error:
            self.checker.record(error)
            if makes:
                wrong.add(makes)
            return None

    def tpu(self, tpu: Values) -> tuple[TpuSpec, Accelerator]:
        type_name: str | None = None
        topology: str | None = None
        api: str = tpu["api"]
        try:
            if "accelerator" in tpu:
                accelerator = parse_accelerator(tpu["accelerator"], api=api)
            else:
                accelerator = from_type_topology(tpu["type"], tpu["topology"], api=api)
                type_name, topology = accelerator.family.prefix, accelerator.topology
        except AcceleratorError as exc:
            if "accelerator" in tpu:
                path = "tpu.accelerator"
            else:
                unknown = str(exc).startswith(("unknown TPU type", IRONWOOD_WHY, COMPUTE_WHY))
                path = "tpu.type" if unknown else "tpu.topology"
            examples = (
                "v5p-8, v6e-8 or tpu7x-8"
                if api == "compute"
                else "v4-16, v5p-8, v5litepod-16 or v6e-8"
            )
            hint = exc.fix or f"e.g. {examples}"
            raise self.error(str(exc), path, hint) from None
        slices: int = tpu["slices"]
        if api == "compute":
            check_compute_tpu(self, tpu, accelerator)
        if slices > 1 and not accelerator.supports_multislice:
            raise self.error(
                f"multislice is not available on {accelerator.generation}",
                "tpu.slices",
                "use slices: 1, or a v4 or newer accelerator for several slices",
            )
        warning = runtime_warning(accelerator, tpu["runtime"]) if api == "tpu" else None
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
            **self.node_settings(tpu, slices),
            api=tpu["api"],
        )
        return spec, accelerator

    def node_settings(self, tpu: Values, slices: int) -> dict[str, Any]:
        """The boot disk, data disks, secure boot and the multislice workload type."""
        settings: dict[str, Any] = {"secure_boot": tpu["secure_boot"]}
        if "boot_disk" in tpu:
            disk = tpu.section("boot_disk")
            if disk["confidential_compute"] and disk["kms_key"] is None:
                raise self.error(
                    "a confidential-compute boot disk needs a customer-managed key",
                    "tpu.boot_disk.confidential_compute",
                    "add kms_key: projects/P/locations/L/keyRings/R/cryptoKeys/K",
                )
            settings["boot_disk"] = BootDiskSpec(
                size_gb=disk["size_gb"],
                image=disk["image"],
                kms_key=disk["kms_key"],
                confidential_compute=disk["confidential_compute"],
            )
        disks = tuple(
            DataDiskSpec(source=item["source"], mode=item.get("mode")) for item in tpu["data_disks"]
        )
        for index, data_disk in enumerate(disks):
            name = _disk_name(data_disk.source)
            if any(name == _disk_name(other.source) for other in disks[:index]):
                raise self.error(
                    f"{data_disk.source} is attached twice",
                    f"tpu.data_disks[{index}].source",
                    "attach each disk once",
                )
        settings["data_disks"] = disks
        if tpu["workload_type"] is not None and slices < 2:
            raise self.error(
                "a workload type places the slices of a multislice request: it needs slices > 1",
                "tpu.workload_type",
                "remove it, or ask for several slices",
            )
        settings["workload_type"] = tpu["workload_type"]
        return settings

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
                    "keep one: tier: " + " | ".join(TIERS),
                )
        tier = cast(Tier, chosen[0][0] if chosen else capacity["tier"])
        for key, flag_tier in _TIER_FLAGS:
            if key in capacity and capacity[key] is False and flag_tier == tier and chosen:
                raise self.error(
                    f"contradicts {chosen[0][1]}, which asks for {tier}",
                    f"capacity.{key}",
                    f"remove capacity.{key}",
                )
        fallback = self.fallback(capacity, chosen)
        if fallback:
            first = fallback[0]
            tier = first.tier
            reservation, max_run = _rung_needs(first, capacity)
        else:
            reservation, max_run = capacity["reservation"], capacity["max_run_duration"]
            self.check_tier(tier, reservation, max_run, "capacity")
        until, after = capacity["valid_until"], capacity["valid_after"]
        if self.now is not None and isinstance(until, datetime) and until <= self.now:
            ago = format_duration((self.now - until).total_seconds())
            raise self.error(
                f"{rfc3339(until)} was {ago} ago: the request would give up queueing before "
                "it is sent",
                "capacity.valid_until",
                "give a later time, or a duration such as 6h (counted from the create)",
            )
        if (
            until is not None
            and after is not None
            and type(until) is type(after)
            and after >= until
        ):
            raise self.error(
                "valid_after is not before valid_until: the request could never be served",
                "capacity.valid_after",
                "make valid_after earlier than valid_until",
            )
        zones: tuple[str, ...] = capacity["zones"] or ()
        if "zones" in capacity and not zones:
            raise self.error(
                "an empty list of zones", "capacity.zones", "give at least one zone, or remove it"
            )
        for index, zone in enumerate(zones):
            if zone in zones[:index]:
                raise self.error(
                    f"{zone} is listed twice", f"capacity.zones[{index}]", "list each zone once"
                )
        return CapacitySpec(
            tier=tier,
            reservation=reservation,
            valid_until=until,
            valid_after=after,
            max_run_duration=max_run,
            zones=zones,
            zone_policy=capacity["zone_policy"],
            fallback=fallback,
        )

    def check_tier(
        self, tier: str, reservation: str | None, max_run: timedelta | None, path: str
    ) -> None:
        """What a tier needs and allows: flex-start a maximum run duration, the reservation
        tiers a reservation, and nothing else either."""
        where = "capacity" if path == "capacity" else path
        if tier == "flex-start" and max_run is None:
            raise self.error(
                "a flex-start run lasts a limited time: flex-start needs max_run_duration",
                f"{path}.tier",
                f"add `max_run_duration: 1d` under `{where}` (10m to 7d)",
            )
        if max_run is not None and tier != "flex-start":
            raise self.error(
                f"max_run_duration is flex-start's (the service takes the run back then), "
                f"not {tier}'s",
                f"{path}.max_run_duration",
                "remove it, or set tier: flex-start",
            )
        if max_run is not None and not MIN_RUN_DURATION <= max_run <= MAX_RUN_DURATION:
            raise self.error(
                f"{format_duration(max_run.total_seconds())} is not a run duration the service "
                "takes (10m to 7d)",
                f"{path}.max_run_duration",
                "give a duration from 10m to 7d",
            )
        if tier == "reservation-bound" and reservation is None:
            raise self.error(
                "a reservation-bound run runs in a reservation's window: it needs reservation",
                f"{path}.tier",
                f"add `reservation: NAME` under `{where}` (a calendar-mode reservation)",
            )
        if reservation is not None and tier not in RESERVATION_TIERS:
            raise self.error(
                f"a reservation needs the reserved or reservation-bound tier, not {tier}",
                f"{path}.reservation",
                f"set {path}.tier: reserved or reservation-bound, or remove {path}.reservation",
            )

    def fallback(self, capacity: Values, chosen: list[tuple[str, str]]) -> tuple[RungSpec, ...]:
        """capacity.fallback: each rung checked as a tier is, the first one the capacity's."""
        items: list[dict[str, Any]] = capacity["fallback"] or []
        if "fallback" in capacity and not items:
            raise self.error(
                "an empty capacity ladder", "capacity.fallback", "give its rungs, or remove it"
            )
        if items and chosen and chosen[0][0] != items[0]["tier"]:
            raise self.error(
                f"{chosen[0][1]} asks for {chosen[0][0]}, but the ladder's first rung is "
                f"{items[0]['tier']}",
                chosen[0][1],
                f"remove {chosen[0][1]}: with capacity.fallback the first rung is the tier",
            )
        rungs: list[RungSpec] = []
        for index, item in enumerate(items):
            path = f"capacity.fallback[{index}]"
            rung = RungSpec(
                tier=cast(Tier, item["tier"]),
                max_run_duration=item.get("max_run_duration"),
                reservation=item.get("reservation"),
                zones=tuple(item.get("zones") or ()),
            )
            reservation, max_run = _rung_needs(rung, capacity)
            self.check_tier(rung.tier, reservation, max_run, path)
            if "zones" in item and not rung.zones:
                raise self.error(
                    "an empty list of zones", f"{path}.zones", "give zones, or remove the key"
                )
            if rung in rungs:
                raise self.error(
                    f"rung {index + 1} repeats rung {rungs.index(rung) + 1}",
                    path,
                    "list each rung once",
                )
            rungs.append(rung)
        return tuple(rungs)

    def check_capacity_for(self, capacity: CapacitySpec, accelerator: Accelerator) -> None:
        """flex-start only for the generations Cloud TPU offers it for."""
        tiers = [
            (f"capacity.fallback[{index}].tier", rung.tier)
            for index, rung in enumerate(capacity.fallback)
        ] or [("capacity.tier", capacity.tier)]
        for path, tier in tiers:
            if tier == "flex-start" and accelerator.generation not in FLEX_START_GENERATIONS:
                raise self.error(
                    f"Cloud TPU offers flex-start for {' and '.join(FLEX_START_GENERATIONS)}, "
                    f"not {accelerator.generation}",
                    path,
                    "use a v5e or v6e accelerator, or another tier (spot waits for capacity "
                    "too, with preemptions)",
                )

    def zone(self, values: Values, capacity: CapacitySpec) -> str | None:
        """The spec's one zone: `zone`, or the first of capacity.zones (never both)."""
        if capacity.zones and "zone" in values:
            raise self.error(
                "give zone or capacity.zones, not both",
                "capacity.zones",
                f"list {values['zone']} in capacity.zones and remove zone (the first of the "
                "zones is the one every single-zone command uses)",
            )
        return capacity.zones[0] if capacity.zones else values["zone"]

    def check_zone_policy(
        self,
        capacity: CapacitySpec,
        job: JobSpec | None,
        checkpoint: CheckpointSpec,
        tpu: TpuSpec,
    ) -> None:
        """first-active holds the job back in every zone but the one claimed beside its
        checkpoints, which needs tpuctl's startup script and a shared checkpoint.dir."""
        if capacity.zone_policy != "first-active" or job is None:
            return
        if "startup-script" in tpu.metadata:
            raise self.error(
                "first-active needs tpuctl's startup script: it keeps the job from starting "
                "in any zone but the chosen one, and tpu.metadata.startup-script replaces it",
                "capacity.zone_policy",
                "use zone_policy: sequential (one zone at a time), or job.boot_script for "
                "your own boot steps",
            )
        if not checkpoint.dir:
            raise self.error(
                "first-active needs checkpoint.dir: the claim naming the zone the job may run "
                "in is kept there, where every zone's workers read it",
                "capacity.zone_policy",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME, or use zone_policy: sequential",
            )

    def checkpoint(self, checkpoint: Values) -> CheckpointSpec:
        return CheckpointSpec(
            dir=checkpoint["dir"],
            autocheckpoint=checkpoint["autocheckpoint"],
            continuous=checkpoint["continuous"],
            keep=checkpoint["keep"],
        )

    def check_checkpoint(self, checkpoint: CheckpointSpec) -> None:
        """What needs a checkpoint directory (given in the spec, or by the command's flags)."""
        if checkpoint.dir:
            return
        for key in ("autocheckpoint", "continuous"):
            if getattr(checkpoint, key):
                raise self.error(
                    f"{key} needs a checkpoint directory",
                    f"checkpoint.{key}",
                    "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
                )

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


def _rung_needs(rung: RungSpec, capacity: Values) -> tuple[str | None, timedelta | None]:
    """A rung's reservation and maximum run duration: its own, else the capacity's where its
    tier takes one."""
    reservation = rung.reservation
    if reservation is None and rung.tier in RESERVATION_TIERS:
        reservation = capacity["reservation"]
    max_run = rung.max_run_duration
    if max_run is None and rung.tier == "flex-start":
        max_run = capacity["max_run_duration"]
    return reservation, max_run


def _disk_name(source: str) -> str:
    return source.rsplit("/", 1)[-1]


def resolve_local(code: str, source: str) -> Path:
    path = Path(code).expanduser()
    if path.is_absolute() or source.startswith("<"):
        return path.resolve() if not path.is_absolute() else path
    return (Path(source).parent / path).resolve()
