"""Checked values → the typed `Spec`: the rules that span fields (tiers, topology, multislice,
parallelism products, code locations) and the warnings worth showing. The capacity rules are
`tpuctl.spec.build_capacity`, the job's `tpuctl.spec.build_job`, what they share
`tpuctl.spec.sections`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from tpuctl.errors import SpecError
from tpuctl.spec.build_capacity import CapacityRules
from tpuctl.spec.build_job import JobRules
from tpuctl.spec.compute import check_compute_capacity, check_compute_checkpoint, check_compute_tpu
from tpuctl.spec.model import (
    BootDiskSpec,
    CheckpointSpec,
    DataDiskSpec,
    DeadlinesSpec,
    JobSpec,
    RecoverySpec,
    Spec,
    TpuSpec,
)
from tpuctl.spec.sections import Values
from tpuctl.topology import (
    COMPUTE_WHY,
    IRONWOOD_WHY,
    Accelerator,
    AcceleratorError,
    from_type_topology,
    parse_accelerator,
    runtime_warning,
)

T = TypeVar("T")


class Builder(CapacityRules, JobRules):
    """Checked values → the Spec, a section at a time in the order of the spec reference; the
    capacity and job sections' rules are build_capacity's and build_job's."""

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


def _disk_name(source: str) -> str:
    return source.rsplit("/", 1)[-1]
