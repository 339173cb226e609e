"""The one declarative table of job spec keys; validation, JSON Schema and the docs all read it.
The `tpu` section's keys are tpuctl.spec.fields_tpu; what a key is, tpuctl.spec.field."""

from __future__ import annotations

from collections.abc import Iterator

from tpuctl.spec.field import (
    GCE_NAME_PATTERN,
    MAX_NAME_LENGTH,
    POSIX_USER_PATTERN,
    PROJECT_PATTERN,
    PROJECT_RULE,
    RESERVATION_PATTERN,
    RESERVATION_RULE,
    ZONE_PATTERN,
    ZONE_RULE,
    Field,
)
from tpuctl.spec.fields_tpu import TPU_FIELDS
from tpuctl.spec.model import (
    API_VERSION,
    FRAMEWORKS,
    TIERS,
    ZONE_POLICIES,
)
from tpuctl.topology import MESH_AXES
from tpuctl.worker import ENV_NAME_PATTERN, RUN_NAME_PATTERN


def _axes(layer: str, meaning: str) -> tuple[Field, ...]:
    return tuple(
        Field(axis, "int", f"{layer} {axis} parallelism ({meaning}).", minimum=1, example=2)
        for axis in MESH_AXES
    )


_DURATION_DOC = "a duration (90s, 10m, 2h, 1d, 1h30m; a plain number is seconds)"
_BOUND_DOC = _DURATION_DOC + " or an RFC 3339 time with a timezone"

CAPACITY_FIELDS = (
    Field(
        "tier",
        "str",
        "Capacity tier: spot, reserved, on-demand, best-effort, flex-start (waits for "
        "capacity, then runs at most max_run_duration; v5e and v6e) or reservation-bound "
        "(runs in a calendar-mode reservation's window; needs reservation). The gcloud-style "
        "booleans below are accepted instead; give only one.",
        default="on-demand",
        enum=TIERS,
    ),
    Field("spot", "bool", "Same as tier: spot.", default=False),
    Field("reserved", "bool", "Same as tier: reserved.", default=False),
    Field("on_demand", "bool", "Same as tier: on-demand.", default=False),
    Field("best_effort", "bool", "Same as tier: best-effort.", default=False),
    Field(
        "reservation",
        "str",
        "Reservation to draw from (a name or projects/P/locations/Z/reservations/NAME); "
        "with the reserved or reservation-bound tier.",
        pattern=RESERVATION_PATTERN,
        rule=RESERVATION_RULE,
        example="my-reservation",
    ),
    Field(
        "valid_until",
        "time_bound",
        f"Give up queueing after this: {_BOUND_DOC}.",
        example="6h",
    ),
    Field(
        "valid_after",
        "time_bound",
        f"Do not provision before this: {_BOUND_DOC}.",
        example="10m",
    ),
    Field(
        "max_run_duration",
        "duration",
        f"How long a flex-start run may last before the service takes it back: "
        f"{_DURATION_DOC}, 10m to 7d (flex-start needs it; the queueing window still "
        "applies). A job that is not done by then is resumed by a new run.",
        example="1d",
    ),
    Field(
        "zones",
        "str_list",
        "Zones to queue in, in order of preference, instead of `zone` (whose value is then the "
        "first of them, for every command that needs one zone); `up` and `create --wait` try "
        "them as zone_policy says, deadlines.queue applying to each zone in turn. --zones on "
        "the command line replaces them.",
        pattern=ZONE_PATTERN,
        rule=ZONE_RULE,
        example=["us-central2-b", "us-central1-a"],
    ),
    Field(
        "zone_policy",
        "str",
        "How `zones` are tried: sequential (queue in one zone, move on to the next when its "
        "queueing deadline passes, deleting what is left) or first-active (queue in every zone "
        "at once, keep the first to become ACTIVE, delete the others; the job runs only in the "
        "zone claimed in checkpoint.dir, so it needs one).",
        default="sequential",
        enum=ZONE_POLICIES,
    ),
    Field(
        "fallback",
        "sections",
        "A capacity ladder, cheapest first: `up` asks for the first rung and climbs to the "
        "next when a rung's queueing deadline passes in every zone or its preemption budget "
        "is spent (deleting what it leaves); up --prefer-cheapest starts each new bring-up "
        "from the first rung again. The first rung is the capacity's own: tier then comes "
        "from it. Each rung may change the zones and the reservation too.",
        default=[],
        example=[{"tier": "spot"}, {"tier": "flex-start", "max_run_duration": "1d"}],
        children=(
            Field("tier", "str", "The rung's capacity tier.", required=True, enum=TIERS),
            Field(
                "max_run_duration",
                "duration",
                f"flex-start's maximum run duration: {_DURATION_DOC}, 10m to 7d.",
                example="1d",
            ),
            Field(
                "reservation",
                "str",
                "The rung's reservation (reserved, reservation-bound); the capacity's when "
                "not given.",
                pattern=RESERVATION_PATTERN,
                rule=RESERVATION_RULE,
            ),
            Field(
                "zones",
                "str_list",
                "The rung's zones, in order of preference; the capacity's when not given.",
                pattern=ZONE_PATTERN,
                rule=ZONE_RULE,
            ),
        ),
    ),
)

CHECKPOINT_FIELDS = (
    Field(
        "dir",
        "str",
        "Checkpoint directory (gs://bucket/path or a path on the workers).",
        example="gs://my-bucket/runs/llama-cpt",
    ),
    Field(
        "autocheckpoint",
        "bool",
        "Enable Cloud TPU Autocheckpoint: SIGTERM and up to 5 minutes to save before "
        "maintenance; the framework preset sets the matching training flags. Needs dir.",
        default=False,
    ),
    Field(
        "continuous",
        "bool",
        "Save continuously (a new save as soon as the last one commits): MaxText's "
        "enable_continuous_checkpointing; Orbax and custom jobs get "
        "TPUCTL_CONTINUOUS_CHECKPOINTING=1. Needs dir.",
        default=False,
    ),
    Field(
        "keep",
        "int",
        "How many committed checkpoints to keep (MaxText's max_num_checkpoints_to_keep; "
        "TPUCTL_CHECKPOINTS_TO_KEEP for Orbax and custom jobs).",
        minimum=1,
        example=3,
    ),
)

JOB_FIELDS = (
    Field(
        "framework",
        "str",
        "Framework preset for the checkpoint flags: maxtext, pax, orbax or custom.",
        default="custom",
        enum=FRAMEWORKS,
    ),
    Field(
        "run_name",
        "str",
        "Run name, kept the same on every restart (the resume key).",
        default_doc="the spec's name",
        pattern=RUN_NAME_PATTERN,
        rule="letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128",
    ),
    Field(
        "user",
        "str",
        "POSIX user that runs the command on the workers.",
        default="tpuctl",
        pattern=POSIX_USER_PATTERN,
        rule="a POSIX user name: lowercase letters, digits, '_' and '-', starting with a "
        "letter or '_', at most 32 characters",
    ),
    Field("workdir", "str", "Working directory on every worker.", default="~/job"),
    Field(
        "code",
        "str",
        "Code to ship into the workdir: a local directory (its contents) or file (relative "
        "to the spec file), or gs://…/code.tar.gz (.tar.gz or .tgz).",
        example="./src",
    ),
    Field(
        "setup",
        "commands",
        "Set-up commands run before the job on every boot: a list, or one string.",
        default=[],
        example=["pip install -r requirements.txt"],
    ),
    Field(
        "env",
        "str_map",
        "Environment variables of the command; values are strings or numbers (quote yes/no/true).",
        default={},
        key_pattern=ENV_NAME_PATTERN,
        key_rule="letters, digits and _, not starting with a digit",
        example={"WANDB_MODE": "offline"},
    ),
    Field(
        "command",
        "command",
        "The training command, run on every worker as `user` in `workdir`: one shell line, or "
        "a list of words (an argv). The framework's flags go at its end, or where it says "
        "{flags}; a pipeline or list (|, ;, &&, &, # comment) needs {flags} or the list form.",
        required=True,
        example="python3 train.py --steps 10000",
    ),
    Field(
        "boot_script",
        "str",
        "Shell commands run as root on every boot before tpuctl's part (drivers, mounts, "
        "your own startup steps); the job is not started when they fail.",
        example="mount /dev/sdb /mnt/data",
    ),
    Field(
        "target_step",
        "int",
        "The job is done once a committed checkpoint at this step or later exists: when the "
        "command exits, the startup script looks at the checkpoints and writes the done "
        "marker, so no later boot relaunches it. Needs checkpoint.dir.",
        minimum=1,
        example=10000,
    ),
    Field(
        "parallelism",
        "section",
        "Mesh axes; the ici product must equal the chips per slice and the dcn product the "
        "number of slices.",
        children=(
            Field(
                "ici",
                "section",
                "Parallelism within a slice (ICI).",
                children=_axes("ICI", "within a slice"),
            ),
            Field(
                "dcn",
                "section",
                "Parallelism across slices (DCN).",
                children=_axes("DCN", "across slices"),
            ),
        ),
    ),
)

DEADLINE_FIELDS = (
    Field(
        "queue",
        "duration",
        f"Give up when the QR is still queued after this: {_DURATION_DOC}.",
        example="2h",
    ),
    Field(
        "provision",
        "duration",
        f"Give up when provisioning takes longer than this: {_DURATION_DOC}.",
        example="30m",
    ),
)

RECOVERY_FIELDS = (
    Field(
        "max_preemptions",
        "int",
        "Recreate the QR after at most this many spot preemptions or suspensions.",
        default=10,
        minimum=0,
    ),
    Field(
        "max_failures",
        "int",
        "Recreate the QR after at most this many failures (FAILED QR or job crash).",
        default=0,
        minimum=0,
    ),
)

SPEC_FIELDS: tuple[Field, ...] = (
    Field(
        "apiVersion",
        "str",
        f"Spec format version; must be {API_VERSION}.",
        required=True,
        enum=(API_VERSION,),
        example=API_VERSION,
    ),
    Field(
        "name",
        "str",
        "Queued resource id; the node id for one slice, the node id prefix (<name>-<i>) for "
        "several. Lowercase letters, digits and hyphens, starting with a letter, at most "
        f"{MAX_NAME_LENGTH} characters.",
        required=True,
        pattern=GCE_NAME_PATTERN,
        rule="lowercase letters, digits and hyphens, starting with a letter, not ending with a "
        "hyphen",
        max_length=MAX_NAME_LENGTH,
        example="llama-cpt",
    ),
    Field(
        "project",
        "str",
        "Google Cloud project id (e.g. my-project, or the legacy example.com:my-project); "
        "otherwise from --project or the environment.",
        pattern=PROJECT_PATTERN,
        rule=PROJECT_RULE,
        example="my-project",
    ),
    Field(
        "zone",
        "str",
        "Zone of the TPUs (e.g. us-central2-b); otherwise from --zone or the environment. "
        "Give this or capacity.zones, not both.",
        pattern=ZONE_PATTERN,
        rule=ZONE_RULE,
        example="us-central2-b",
    ),
    Field(
        "tpu",
        "section",
        "The slices and the node template they share.",
        required=True,
        children=TPU_FIELDS,
        one_of=(("accelerator",), ("type", "topology")),
    ),
    Field("capacity", "section", "How capacity is obtained.", children=CAPACITY_FIELDS),
    Field(
        "checkpoint", "section", "Where and how the job checkpoints.", children=CHECKPOINT_FIELDS
    ),
    Field(
        "job",
        "section",
        "The training job the startup script runs on every worker (optional).",
        children=JOB_FIELDS,
    ),
    Field(
        "deadlines",
        "section",
        "Client-side deadlines of `tpuctl create`.",
        children=DEADLINE_FIELDS,
    ),
    Field(
        "recovery",
        "section",
        "Separate retry budgets for preemptions and failures.",
        children=RECOVERY_FIELDS,
    ),
)

ROOT = Field("", "section", "A tpuctl job spec.", children=SPEC_FIELDS)


def walk_fields(
    fields: tuple[Field, ...] = SPEC_FIELDS, prefix: str = ""
) -> Iterator[tuple[str, Field]]:
    """Every field with its dotted path, parents before children, in table order."""
    for field in fields:
        path = f"{prefix}.{field.name}" if prefix else field.name
        yield path, field
        yield from walk_fields(field.children, f"{path}[]" if field.kind == "sections" else path)


def field_at(path: str) -> Field | None:
    """The field at a dotted path (`capacity.tier`; an item of a list of sections as
    `capacity.fallback[0].tier` or `capacity.fallback[].tier`), or None."""
    field: Field | None = ROOT
    for part in path.split("."):
        name = part.split("[", 1)[0]
        field = field.child(name) if field is not None else None
    return field
