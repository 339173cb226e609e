"""What runs `tpuctl reconcile SPEC` on a schedule, rendered for five schedulers: a crontab, a
systemd service and timer, a Kubernetes CronJob, a Cloud Run job started by Cloud Scheduler, and
a GitHub Actions workflow. Pure text from the options: no I/O, no credentials, no network."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tpuctl.errors import UsageError
from tpuctl.render.supervisor.local import render_cron, render_systemd
from tpuctl.render.supervisor.model import (
    CLOUD_RUN_SPEC,
    CONTAINER_SPEC,
    GITHUB_SPEC,
    REMOTE_TARGETS,
    TARGETS,
    Schedule,
    Supervisor,
    SupervisorFile,
    SupervisorOptions,
    Target,
    schedule_for,
)
from tpuctl.render.supervisor.remote import render_cloud_run, render_github, render_kubernetes

__all__ = [
    "REMOTE_TARGETS",
    "TARGETS",
    "Supervisor",
    "SupervisorFile",
    "SupervisorOptions",
    "Target",
    "local_environment",
    "reconcile_argv",
    "render_supervisor",
]

Renderer = Callable[[SupervisorOptions, Schedule, list[str]], Supervisor]
RENDERERS: dict[Target, Renderer] = {
    "cron": render_cron,
    "systemd": render_systemd,
    "kubernetes": render_kubernetes,
    "cloud-run": render_cloud_run,
    "github": render_github,
}

# What a step on this machine keeps from the environment it was set up in: where the APIs and
# credentials are, the gcloud configuration, the state directory (the journal and lease of a run
# without checkpoint.dir live there) and tpuctl's own settings. cron starts with almost nothing.
LOCAL_VARIABLES = (
    "PATH",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "NO_GCE_CHECK",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "CLOUDSDK_CONFIG",
    "CLOUDSDK_ACTIVE_CONFIG_NAME",
    "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_COMPUTE_ZONE",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "TPU_EMULATOR_HOST",
    "STORAGE_EMULATOR_HOST",
    "TPUCTL_PROJECT",
    "TPUCTL_ZONE",
    "TPUCTL_ACCOUNT",
    "TPUCTL_GCLOUD",
    "TPUCTL_SSH_PORT",
    "TPUCTL_API_RETRY_SECONDS",
    "TPUCTL_COMPUTE_ENDPOINT",
    "TPUCTL_IMPERSONATE_SERVICE_ACCOUNT",
)


def local_environment(
    environ: Mapping[str, str], *, home: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables of LOCAL_VARIABLES set in `environ`, HOME when it is not the account's own
    (`home`: the one a scheduler would give), then `extra` (--env)."""
    chosen = {name: environ[name] for name in LOCAL_VARIABLES if environ.get(name)}
    if environ.get("HOME") and environ["HOME"] != home:
        chosen["HOME"] = environ["HOME"]
    chosen.update(extra or {})
    return chosen


def reconcile_argv(options: SupervisorOptions) -> list[str]:
    """The step each firing runs: `tpuctl reconcile SPEC ARGS`, with the spec where the target
    finds it."""
    spec = {
        "cron": options.spec_path,
        "systemd": options.spec_path,
        "kubernetes": CONTAINER_SPEC,
        "cloud-run": CLOUD_RUN_SPEC,
        "github": options.spec_in_repository or GITHUB_SPEC,
    }[options.target]
    command = options.tpuctl if options.target in ("cron", "systemd") else ("tpuctl",)
    return [*command, "reconcile", spec, *options.reconcile_args]


def render_supervisor(options: SupervisorOptions) -> Supervisor:
    """The files and commands that run one reconcile step of the run every
    `options.every_seconds` on `options.target`. UsageError when the target cannot reach the
    run's state or lacks what it needs (a service account, a provider, a region)."""
    _check(options)
    schedule = schedule_for(options.target, options.every_seconds)
    result = RENDERERS[options.target](options, schedule, reconcile_argv(options))
    code = options.job_code
    if options.target in REMOTE_TARGETS and code and not code.startswith("gs://"):
        result.notes.append(
            f"job.code {code} is a local path: a step on {options.target} cannot upload it to a "
            "new worker disk; put it at gs://…/code.tar.gz"
        )
    return result


def _check(options: SupervisorOptions) -> None:
    target = options.target
    if target not in REMOTE_TARGETS:
        return
    state = options.checkpoint_dir
    if not (state and state.startswith("gs://")):
        where = f"checkpoint.dir is {state}, on the workers" if state else "no checkpoint.dir"
        raise UsageError(
            f"--on {target} cannot reach the run's state ({where}): its journal and lease must "
            "be on gs://",
            hint="set checkpoint.dir: gs://BUCKET/PATH in the spec, or supervise from this "
            "machine with --on cron or --on systemd",
        )
    needs = {
        "kubernetes": [("--service-account", options.service_account)],
        "cloud-run": [
            ("--service-account", options.service_account),
            ("--region (or a zone to take it from)", options.region),
            ("--project", options.project),
        ],
        "github": [
            ("--workload-identity-provider", options.workload_identity_provider),
            ("--service-account", options.service_account),
        ],
    }[target]
    if target == "kubernetes":
        needs.append(("--project", options.project))
    missing = [flag for flag, value in needs if not value]
    if missing:
        raise UsageError(
            f"--on {target} needs {' and '.join(missing)}",
            hint=_NEEDS_HINT[target],
        )
    if target == "github" and not options.spec_in_repository and "${{" in options.spec_text:
        raise UsageError(
            "the spec holds '${{', which GitHub would evaluate in the workflow",
            hint="keep the spec in the repository that runs the workflow",
        )


_NEEDS_HINT = {
    "kubernetes": "--service-account names the Google service account the CronJob acts as "
    "through Workload Identity (docs/supervision.md)",
    "cloud-run": "--service-account names the account the job runs as and Cloud Scheduler "
    "calls it with (docs/supervision.md)",
    "github": "--workload-identity-provider projects/NUMBER/locations/global/"
    "workloadIdentityPools/POOL/providers/PROVIDER and --service-account EMAIL "
    "(docs/supervision.md)",
}
