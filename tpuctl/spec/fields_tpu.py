"""The `tpu` section of the field table: the slices and the node template they share."""

from __future__ import annotations

from tpuctl.spec.field import (
    DISK_PATTERN,
    GCE_NAME_PATTERN,
    KMS_KEY_PATTERN,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABELS,
    TOPOLOGY_PATTERN,
    Field,
)
from tpuctl.spec.model import (
    APIS,
    DISK_MODES,
    WORKLOAD_TYPES,
)
from tpuctl.topology import MAX_SLICES
from tpuctl.worker import RESERVED_LABELS

TPU_FIELDS = (
    Field(
        "api",
        "str",
        "Which API makes the slices: tpu (the Cloud TPU API's queued resources: v2 to v6e) "
        "or compute (Compute Engine: a TPU VM is an instance, a multi-host slice a bulk "
        "managed instance group; v5p, v6e and tpu7x, one slice). See docs/compute-engine.md.",
        default="tpu",
        enum=APIS,
    ),
    Field(
        "accelerator",
        "str",
        "Accelerator type of one slice, e.g. v4-16, v5p-8, v5litepod-16, v6e-8, tpu7x-8 (the "
        "number counts TensorCores for v2/v3/v4/v5p/tpu7x and chips for v5e/v6e). Give this, "
        "or type + topology.",
        example="v4-16",
    ),
    Field(
        "type",
        "str",
        "TPU generation for the accelerator_config form, used with topology: v2, v3, v4, v5p, "
        "v5litepod (v5e), v6e or (with api: compute) tpu7x.",
        example="v5litepod",
    ),
    Field(
        "topology",
        "str",
        "Chip topology of one slice for the accelerator_config form, e.g. 4x4 or 2x2x4.",
        pattern=TOPOLOGY_PATTERN,
        rule="dimensions joined by x, like 4x4 or 2x2x4",
        example="4x4",
    ),
    Field(
        "runtime",
        "str",
        "TPU VM runtime (software) version, e.g. tpu-ubuntu2204-base, v2-alpha-tpuv5-lite; "
        "with api: compute the boot disk's image: an image family of "
        "ubuntu-os-accelerator-images (e.g. ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e), or "
        "projects/P/global/images/NAME (or …/images/family/FAMILY).",
        required=True,
        example="tpu-ubuntu2204-base",
    ),
    Field(
        "slices",
        "int",
        f"Number of slices; more than 1 is Multislice (v4 and newer, at most {MAX_SLICES}).",
        default=1,
        minimum=1,
        maximum=MAX_SLICES,
    ),
    Field("network", "str", "VPC network of the TPU VMs.", example="default"),
    Field("subnetwork", "str", "Subnetwork of the TPU VMs.", example="my-subnet"),
    Field("external_ips", "bool", "Give every TPU VM an external IP address.", default=True),
    Field(
        "tags",
        "str_list",
        "Network tags (firewall rules) of every TPU VM.",
        default=[],
        pattern=GCE_NAME_PATTERN,
        rule="lowercase letters, digits and hyphens, starting with a letter, not ending with a "
        "hyphen",
        max_length=63,
        example=["tpu-job"],
    ),
    Field(
        "labels",
        "str_map",
        "Labels on every node: keys start with a lowercase letter, keys and values use "
        f"[a-z0-9_-] and at most 63 characters, at most {MAX_LABELS} labels; "
        f"{', '.join(RESERVED_LABELS)} are set by tpuctl.",
        default={},
        key_pattern=LABEL_KEY_PATTERN,
        key_rule="start with a lowercase letter, then lowercase letters, digits, _ or -, "
        "at most 63 characters",
        value_pattern=LABEL_VALUE_PATTERN,
        value_rule="lowercase letters, digits, _ or -, at most 63 characters",
        max_items=MAX_LABELS,
        forbidden_keys=RESERVED_LABELS,
        forbidden_hint="tpuctl sets this label to recognise its own resources; choose another key",
        example={"team": "ml"},
    ),
    Field(
        "service_account",
        "str",
        "Service account email the TPU VMs run as.",
        example="sa@my-project.iam.gserviceaccount.com",
    ),
    Field(
        "scopes",
        "str_list",
        "OAuth scopes of the service account.",
        default=[],
        example=["https://www.googleapis.com/auth/cloud-platform"],
    ),
    Field(
        "metadata",
        "str_map",
        "Extra node metadata. A startup-script here replaces tpuctl's (a warning says what "
        "that gives up); to run steps of your own before the job, use job.boot_script.",
        default={},
        example={"my-key": "my-value"},
    ),
    Field("description", "str", "Free text description of the nodes."),
    Field(
        "boot_disk",
        "section",
        "The boot disk of every TPU VM (the API's bootDiskConfig). size_gb and image are "
        "sent over the REST API (google-cloud-tpu lacks them, and gcloud has no flag for them).",
        children=(
            Field(
                "size_gb",
                "int",
                "Boot disk size in GB (the service's default when not given).",
                minimum=10,
                maximum=65536,
                example=200,
            ),
            Field(
                "image",
                "str",
                "Boot disk image (projects/P/global/images/NAME); the runtime version's "
                "when not given.",
                example="projects/my-project/global/images/my-tpu-image",
            ),
            Field(
                "kms_key",
                "str",
                "Cloud KMS key that encrypts the boot disk (customer-managed encryption).",
                pattern=KMS_KEY_PATTERN,
                rule="projects/P/locations/L/keyRings/R/cryptoKeys/K",
                example="projects/my-project/locations/us-east5/keyRings/ring/cryptoKeys/key",
            ),
            Field(
                "confidential_compute",
                "bool",
                "Create the boot disk in confidential-compute mode (Hyperdisk; needs kms_key).",
                default=False,
            ),
        ),
    ),
    Field(
        "data_disks",
        "sections",
        "Persistent disks attached to every TPU VM of every slice, in order (the API's "
        "dataDisks). A disk attached read-write can serve one VM only.",
        default=[],
        children=(
            Field(
                "source",
                "str",
                "The disk: a name in the TPU's zone, or projects/P/zones/ZONE/disks/NAME.",
                required=True,
                pattern=DISK_PATTERN,
                rule="a disk name (lowercase letters, digits and hyphens) or "
                "projects/P/zones/ZONE/disks/NAME",
                example="my-dataset",
            ),
            Field(
                "mode",
                "str",
                "How it is attached: read-write or read-only.",
                default_doc="read-write (the service's default: not sent)",
                enum=DISK_MODES,
            ),
        ),
    ),
    Field(
        "secure_boot",
        "bool",
        "Shielded VM secure boot on every TPU VM (shieldedInstanceConfig.enableSecureBoot).",
        default=False,
    ),
    Field(
        "workload_type",
        "str",
        "Multislice placement (slices > 1): throughput-optimized or availability-optimized "
        "(multiNodeParams.workloadType); the service's default when not given.",
        enum=WORKLOAD_TYPES,
    ),
)
