"""The typed job spec (`apiVersion: tpuctl/v1`): frozen dataclasses with their defaults.

Loading, validation and source positions live in `tpuctl.spec.load`; this module only says what
a valid spec is made of, so render/ and cloud/ can depend on it without YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

API_VERSION = "tpuctl/v1"

Tier = Literal["spot", "reserved", "on-demand", "best-effort", "flex-start", "reservation-bound"]
TIERS: tuple[Tier, ...] = (
    "spot",
    "reserved",
    "on-demand",
    "best-effort",
    "flex-start",
    "reservation-bound",
)
# Tiers that draw from a named reservation.
RESERVATION_TIERS: tuple[Tier, ...] = ("reserved", "reservation-bound")

# Which Google API makes the slices: the Cloud TPU API's queued resources, or Compute Engine
# (a TPU VM is an instance; a multi-host slice a bulk managed instance group).
Api = Literal["tpu", "compute"]
APIS: tuple[Api, ...] = ("tpu", "compute")

# Multislice: how the service places the slices (MultiNodeParams.workload_type).
WorkloadType = Literal["throughput-optimized", "availability-optimized"]
WORKLOAD_TYPES: tuple[WorkloadType, ...] = ("throughput-optimized", "availability-optimized")
# The OAuth scope of all Google Cloud APIs: what a TPU VM's service account gets when
# `tpu.scopes` names none (as Cloud TPU gives it), and what tpuctl's own credentials ask for.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
DiskMode = Literal["read-write", "read-only"]
DISK_MODES: tuple[DiskMode, ...] = ("read-write", "read-only")

Framework = Literal["maxtext", "pax", "orbax", "custom"]
FRAMEWORKS: tuple[Framework, ...] = ("maxtext", "pax", "orbax", "custom")

# How capacity.zones are tried (tpuctl.jobs.zone_choice).
ZonePolicy = Literal["sequential", "first-active"]
ZONE_POLICIES: tuple[ZonePolicy, ...] = ("sequential", "first-active")

# A queueing bound: a relative duration ("6h") or an absolute RFC 3339 time.
TimeBound = timedelta | datetime


@dataclass(frozen=True)
class BootDiskSpec:
    """The boot disk of every TPU VM (bootDiskConfig): size and image travel over REST only."""

    size_gb: int | None = None
    image: str | None = None
    kms_key: str | None = None  # a Cloud KMS key: the disk is encrypted with it (CMEK)
    confidential_compute: bool = False


@dataclass(frozen=True)
class DataDiskSpec:
    """A persistent disk attached to every TPU VM (dataDisks)."""

    source: str  # a disk name in the zone, or projects/P/zones/Z/disks/NAME
    mode: DiskMode | None = None  # None: not sent, the service's default (read-write)


@dataclass(frozen=True)
class TpuSpec:
    """The slices to ask for and the node template every slice shares."""

    accelerator: str  # canonical accelerator type, e.g. "v4-16" or "v5litepod-16"
    runtime: str
    # Set when the spec used `type` + `topology` (rendered as accelerator_config).
    type: str | None = None
    topology: str | None = None
    slices: int = 1
    network: str | None = None
    subnetwork: str | None = None
    external_ips: bool = True
    tags: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None
    scopes: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    description: str | None = None
    boot_disk: BootDiskSpec | None = None
    data_disks: tuple[DataDiskSpec, ...] = ()
    secure_boot: bool = False  # shielded VM secure boot
    workload_type: WorkloadType | None = None  # multislice only
    api: Api = "tpu"


@dataclass(frozen=True)
class RungSpec:
    """One rung of a capacity ladder (capacity.fallback): what it changes of the capacity."""

    tier: Tier
    max_run_duration: timedelta | None = None
    reservation: str | None = None
    zones: tuple[str, ...] = ()  # empty: the capacity's own


@dataclass(frozen=True)
class CapacitySpec:
    tier: Tier = "on-demand"
    reservation: str | None = None  # a name, or projects/P/locations/Z/reservations/NAME
    valid_until: TimeBound | None = None
    valid_after: TimeBound | None = None
    # How long the slices may run before the platform takes them back (flex-start's
    # runDuration.maxRunDuration).
    max_run_duration: timedelta | None = None
    zones: tuple[str, ...] = ()  # in order of preference; empty: the one zone of Spec.zone
    zone_policy: ZonePolicy = "sequential"
    # A capacity ladder, first rung first (the first is this capacity's own tier): climbed
    # when a rung finds no capacity in time or its preemption budget is spent.
    fallback: tuple[RungSpec, ...] = ()


@dataclass(frozen=True)
class CheckpointSpec:
    dir: str | None = None  # gs://bucket/path or a path on the worker
    autocheckpoint: bool = False
    continuous: bool = False  # a new save as soon as the last one commits
    keep: int | None = None  # committed checkpoints to keep (None: the framework's default)


@dataclass(frozen=True)
class ParallelismSpec:
    """Mesh axes by name (data, fsdp, tensor, …); products are checked against the topology."""

    ici: dict[str, int] = field(default_factory=dict)
    dcn: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSpec:
    # The shell line (a list form is rendered word by word, quoted); `{flags}` marks where the
    # framework's flags go (tpuctl.spec.command).
    command: str
    framework: Framework = "custom"
    run_name: str = ""  # defaults to the spec name at load time
    user: str = "tpuctl"
    workdir: str = "~/job"
    code: str | None = None  # local directory or file, or gs://…/code.tar.gz
    setup: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    parallelism: ParallelismSpec | None = None
    # Done once a committed checkpoint at this step or later exists (needs checkpoint.dir).
    target_step: int | None = None
    boot_script: str | None = None  # run as root on every boot before tpuctl's part


@dataclass(frozen=True)
class DeadlinesSpec:
    queue: timedelta | None = None  # WAITING_FOR_RESOURCES / ACCEPTED
    provision: timedelta | None = None  # PROVISIONING → ACTIVE


@dataclass(frozen=True)
class RecoverySpec:
    max_preemptions: int = 10
    max_failures: int = 0


@dataclass(frozen=True)
class Spec:
    name: str
    tpu: TpuSpec
    capacity: CapacitySpec = field(default_factory=CapacitySpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    job: JobSpec | None = None
    deadlines: DeadlinesSpec = field(default_factory=DeadlinesSpec)
    recovery: RecoverySpec = field(default_factory=RecoverySpec)
    project: str | None = None
    zone: str | None = None
    # Where the spec came from (a path, "<stdin>"), for messages; not rendered.
    source: str = "<spec>"

    @property
    def own_startup_script(self) -> bool:
        """The spec brings its own startup script (tpu.metadata), which replaces tpuctl's."""
        return "startup-script" in self.tpu.metadata

    @property
    def zones(self) -> tuple[str, ...]:
        """The zones to queue in: capacity.zones, else the spec's zone, else none (the
        environment's zone then)."""
        if self.capacity.zones:
            return self.capacity.zones
        return (self.zone,) if self.zone else ()

    @property
    def claims_zone(self) -> bool:
        """zone_policy first-active with a job in tpuctl's startup script: the job runs only
        in the zone claimed beside its checkpoints (tpuctl.worker.zone_claim)."""
        return (
            self.capacity.zone_policy == "first-active"
            and self.job is not None
            and not self.own_startup_script
        )

    @property
    def run_name(self) -> str:
        """The run name the job keeps on every boot (MaxText's resume key): job.run_name, else
        the spec's name."""
        if self.job is not None and self.job.run_name:
            return self.job.run_name
        return self.name
