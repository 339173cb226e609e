"""`tpuctl doctor`: what would stop a spec's run, found before money is spent. Read-only.

Each check is one line: the credentials and account; the TPU API enabled (Service Usage); the
accelerator type and runtime version offered in the zone and, for `tier: reserved`, the
reservation (TPU API); TPU quota for the tier (Cloud Quotas); the checkpoint bucket's existence,
region and the VMs' service account's access (Cloud Storage); how SSH will authenticate and
whether a firewall rule lets it in (Compute Engine). Independent reads run side by side.

`create` and `up` run the PREFLIGHT subset (TPU API and bucket) first. A check that cannot be
read is a warning, never a block: only a definite answer blocks.

`--as-supervisor` checks instead that the account a scheduler runs `tpuctl reconcile` as holds
every permission a step uses (tpuctl.jobs.doctor.supervisor).
"""

from tpuctl.jobs.doctor.access import firewall_check, ssh_check
from tpuctl.jobs.doctor.checks import Check, Inputs, PreflightError
from tpuctl.jobs.doctor.run import Doctor, run_doctor
from tpuctl.jobs.doctor.supervisor import run_supervisor_doctor

__all__ = [
    "Check",
    "Doctor",
    "Inputs",
    "PreflightError",
    "firewall_check",
    "run_doctor",
    "run_supervisor_doctor",
    "ssh_check",
]
