"""The worker contract, in one place: what the startup script leaves on a TPU VM and beside the
checkpoints, and the labels tpuctl puts on its resources. Pure: names and paths only.

Everything that writes these (the startup script, tpuctl.render.startup) and everything that
reads them (job control, `up`, `drill`, `report`, `status --jobs`) takes them from here.

On a worker (under $TPUCTL_VM_ROOT on an emulated one):
    <STATE_ROOT>/startup.lock               held by the startup run and its trainer
    <STATE_ROOT>/<run>/status               KEY=value lines (STATUS_KEYS), replaced by rename
    <STATE_ROOT>/<run>/boot                 the boot count
    <STATE_ROOT>/<run>/command              the command line as launched
    <STATE_ROOT>/<run>/DONE                 the done marker when the spec has no checkpoint.dir
    <LOG_ROOT>/<run>/boot-<N>.log           one log per boot; current.log links to the latest
    <workdir>/<CODE_READY_MARKER>           created last by a code upload
Beside the checkpoints (shared storage, outlives a repaired worker's disk):
    <checkpoint.dir>/tpuctl/<run>/DONE      the done marker
    <checkpoint.dir>/tpuctl/<run>/journal/  the job's journal (tpuctl.storage.journal)
    <checkpoint.dir>/tpuctl/<run>/ZONE      zone_policy first-active: the one zone whose workers
                                            may run the job (tpuctl.storage.zone_claim)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tpuctl.errors import quoted

if TYPE_CHECKING:
    from tpuctl.spec.model import Spec

# --------------------------------------------------------------------------- on the worker

VM_ROOT_ENV = "TPUCTL_VM_ROOT"  # set only on the emulator's workers
STATE_ROOT = "/var/lib/tpuctl"
LOG_ROOT = "/var/log/tpuctl"
STARTUP_LOCK = f"{STATE_ROOT}/startup.lock"
# With a local job.code, the upload creates <workdir>/<CODE_READY_MARKER> last, then runs the
# startup script again; the script launches nothing before the marker exists.
CODE_READY_MARKER = ".tpuctl-uploaded"
# Where the checkpoint dir points when the spec names none: on the worker's disk, per user.
DEFAULT_CHECKPOINT_DIR = "~/checkpoints"
# Set by tpuctl when it runs the startup script again in the same boot (not a new boot).
STARTUP_RERUN_ENV = "TPUCTL_STARTUP_RERUN"

STATUS_KEYS = ("state", "boot", "pid", "started", "exit_code", "heartbeat", "reason", "signalled")
# Cloud TPU waits up to this long after the autocheckpoint SIGTERM before maintaining the VM; a
# trainer's systemd unit gets it as its stop timeout.
AUTOCHECKPOINT_GRACE_SECONDS = 300
NOFILE_LIMIT = 1048576
# The states the startup script writes, in the order a healthy boot goes through them.
JOB_STATES = (
    "starting",
    "setup",
    "waiting-for-code",
    "waiting-for-zone",  # first-active: another zone (or none yet) is claimed for the run
    "running",
    "exited",
    "done",
    "setup-failed",
)
NO_STATUS = "none"  # this run never started on the worker (no status file)
UNREADABLE = "unknown"  # the worker could not be read
LIVE_STATES = frozenset({"starting", "setup", "running"})
ENDED_STATES = frozenset({"exited", "setup-failed"})


def state_dir(run_name: str) -> str:
    return f"{STATE_ROOT}/{check_run_name(run_name)}"


def log_dir(run_name: str) -> str:
    return f"{LOG_ROOT}/{check_run_name(run_name)}"


def log_path(run_name: str, boot: int | None = None) -> str:
    """A run's log on a worker: `current.log` (the latest boot), or `boot-<boot>.log`."""
    name = "current.log" if boot is None else f"boot-{int(boot)}.log"
    return f"{log_dir(run_name)}/{name}"


# ------------------------------------------------------------------------------ names

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A run name becomes a directory name and a MaxText run key on every worker.
RUN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
_RUN_NAME = re.compile(RUN_NAME_PATTERN)


def is_env_name(name: str) -> bool:
    return _ENV_NAME.match(name) is not None and "\n" not in name


def check_run_name(run_name: str) -> str:
    """The run name, or ValueError: it is a path component on every worker."""
    if _RUN_NAME.match(run_name) is None or "\n" in run_name:
        raise ValueError(f"{quoted(run_name)} is not a run name (letters, digits, '.', '_', '-')")
    return run_name


# ------------------------------------------------------------------------------ labels

MANAGED_BY_LABEL = "managed-by"
JOB_LABEL = "tpuctl-job"
SPEC_HASH_LABEL = "tpuctl-spec-hash"
RUN_LABEL = "tpuctl-run"
# tpuctl labels its own resources with these; a user value would break "is this mine?" checks.
RESERVED_LABELS = (MANAGED_BY_LABEL, JOB_LABEL, SPEC_HASH_LABEL, RUN_LABEL)
MANAGER = "tpuctl"
_LABEL_MAX = 63
_NOT_LABEL_CHARS = re.compile(r"[^a-z0-9_-]+")


def label_value(text: str) -> str:
    """`text` made into a valid GCE label value: lowercase letters, digits, `_` and `-`, ≤ 63."""
    return _NOT_LABEL_CHARS.sub("-", text.lower())[:_LABEL_MAX]


# ------------------------------------------------------------ beside the checkpoints

RECORD_DIR = "tpuctl"
DONE_FILE = "DONE"
JOURNAL_DIR = "journal"
LEASE_FILE = "lease.json"  # who babysits the run (tpuctl up), renewed while it does
ZONE_FILE = "ZONE"  # the zone a first-active run's job may run in
WORKERS_DIR = "workers"  # each worker's job state, `<slice>-<worker>.json`, kept by its VM
# Node metadata naming the run's record directory, so `tpuctl reconcile --all --project` and
# `tpuctl runs --project` find a run from its queued resource.
RECORD_METADATA_KEY = "tpuctl-record"


def join_location(base: str, *parts: str) -> str:
    """`base/part/…` for a local path or a gs:// URL, without doubled or trailing slashes."""
    pieces = [part.strip("/") for part in parts if part.strip("/")]
    if not pieces:
        return base
    stripped = base.rstrip("/")
    if not stripped:  # the base was "/" itself
        stripped = "" if base.startswith("/") else base
    return "/".join([stripped, *pieces])


def checkpoint_root(spec: Spec) -> str | None:
    """Where the framework keeps its Orbax steps, or None when the spec names no checkpoint.dir.

    maxtext: `<dir>/<run_name>/checkpoints`; pax: `<dir>/checkpoints` (its --job_log_dir is
    `<dir>`); orbax and custom programs: `<dir>` (TPUCTL_CHECKPOINT_DIR) itself.
    """
    directory = spec.checkpoint.dir
    if not directory:
        return None
    framework = spec.job.framework if spec.job is not None else "custom"
    if framework == "maxtext":
        return join_location(directory, spec.run_name, "checkpoints")
    if framework == "pax":
        return join_location(directory, "checkpoints")
    return directory.rstrip("/") or directory


def record_dir(spec: Spec) -> str | None:
    """`<checkpoint.dir>/tpuctl/<run_name>`: what must outlive a repaired worker's disk and be
    readable from any machine (the done marker, the journal). None without checkpoint.dir."""
    directory = spec.checkpoint.dir
    if not directory:
        return None
    return join_location(directory, RECORD_DIR, spec.run_name)


def lease_location(spec: Spec) -> str | None:
    """`<record dir>/lease.json`: the one `tpuctl up` babysitting the run. None without
    checkpoint.dir."""
    record = record_dir(spec)
    return None if record is None else join_location(record, LEASE_FILE)


def done_marker(spec: Spec) -> str | None:
    """`<record dir>/DONE`, written when the job has finished for good."""
    record = record_dir(spec)
    return None if record is None else join_location(record, DONE_FILE)


def zone_claim(spec: Spec) -> str | None:
    """`<record dir>/ZONE` for a spec whose job runs only in a claimed zone (Spec.claims_zone:
    zone_policy first-active), where its startup script reads which zone that is; else None."""
    record = record_dir(spec)
    return None if record is None or not spec.claims_zone else join_location(record, ZONE_FILE)


def worker_states_dir(spec: Spec) -> str | None:
    """`<record dir>/workers/`: each worker's job state object (`<slice>-<worker>.json`), which
    its startup script keeps up to date, so a supervisor can read the job without SSH. None
    without checkpoint.dir."""
    record = record_dir(spec)
    return None if record is None else join_location(record, WORKERS_DIR)


def worker_state_name(slice_index: int, worker_index: int) -> str:
    return f"{slice_index}-{worker_index}.json"


def journal_dir(spec: Spec) -> str | None:
    record = record_dir(spec)
    return None if record is None else join_location(record, JOURNAL_DIR)
