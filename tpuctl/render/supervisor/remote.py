"""The schedulers elsewhere: a Kubernetes CronJob (Workload Identity), a Cloud Run job started
by Cloud Scheduler, a GitHub Actions workflow (Workload Identity Federation). Each carries the
spec along (a ConfigMap, a variable, the repository) and reads the run's state from its
checkpoint.dir on gs://."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from tpuctl.render.supervisor.model import (
    CLOUD_RUN_SPEC,
    CONTAINER_SPEC_DIR,
    DEFAULT_PACKAGE,
    GITHUB_SPEC,
    IN_PROGRESS,
    STEP_DEADLINE_SECONDS,
    Schedule,
    Supervisor,
    SupervisorFile,
    SupervisorOptions,
    say_interval,
)
from tpuctl.spec.model import CLOUD_PLATFORM_SCOPE

# Seconds a container may spend on `pip install` before the step.
PIP_SECONDS = 180
# Beyond the step's own deadline, before its pod or task is stopped.
STOP_MARGIN_SECONDS = 30
CONTAINER_ENVIRONMENT = {
    "PYTHONUNBUFFERED": "1",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PIP_ROOT_USER_ACTION": "ignore",
}
# Kubernetes names: a CronJob's at most 52 characters (its Jobs add a suffix).
CRONJOB_NAME_LIMIT = 52


def step_script(
    options: SupervisorOptions, argv: Sequence[str], prelude: Sequence[str] = ()
) -> str:
    """The shell lines a container runs: install tpuctl if asked, one step, exit 12 → 0."""
    lines = list(prelude)
    package = options.pip_package
    if package:
        lines.append(f"pip install --quiet --no-cache-dir {shlex.quote(package)} || exit 1")
    lines += [
        shlex.join(argv),
        "rc=$?",
        f'[ "$rc" = {IN_PROGRESS} ] && exit 0',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def deadline_seconds(options: SupervisorOptions) -> int:
    """How long one container may run: the step's deadline, a margin, and pip when it installs."""
    pip = PIP_SECONDS if options.pip_package else 0
    return STEP_DEADLINE_SECONDS + STOP_MARGIN_SECONDS + pip


def _environment(options: SupervisorOptions) -> dict[str, str]:
    return {**CONTAINER_ENVIRONMENT, **options.environment}


def _yaml(document: Any) -> str:
    """YAML for people: keys in the order written, multi-line strings as `|` blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # the same labels twice are written twice, not as &anchor/*alias

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return str(yaml.dump(document, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100))


def _path(options: SupervisorOptions, name: str) -> str:
    return f"{options.directory.rstrip('/')}/{name}" if options.directory else name


# ------------------------------------------------------------------------------------ kubernetes


def kubernetes_name(options: SupervisorOptions) -> str:
    """The unit's name, or `tpuctl-NAME` where that is too long for a CronJob."""
    unit = options.unit
    return unit if len(unit) <= CRONJOB_NAME_LIMIT else f"tpuctl-{options.name}"


def render_kubernetes(
    options: SupervisorOptions, schedule: Schedule, argv: Sequence[str]
) -> Supervisor:
    """A ServiceAccount for Workload Identity, the spec in a ConfigMap mounted read-only, and a
    CronJob that never overlaps two steps (Forbid), never retries one (the next firing is the
    retry) and stops a pod a little after the step's own deadline."""
    name = kubernetes_name(options)
    namespace = options.namespace
    labels = {"app.kubernetes.io/name": "tpuctl-reconcile", "tpuctl/run": options.name}
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {"iam.gke.io/gcp-service-account": options.service_account},
        },
    }
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-spec", "namespace": namespace, "labels": labels},
        "data": {"spec.yaml": options.spec_text},
    }
    container = {
        "name": "reconcile",
        "image": options.container_image,
        "command": ["sh", "-c", step_script(options, argv)],
        "env": [{"name": key, "value": value} for key, value in _environment(options).items()],
        "volumeMounts": [{"name": "spec", "mountPath": CONTAINER_SPEC_DIR, "readOnly": True}],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "512Mi"},
        },
    }
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedule": schedule.cron,
            "concurrencyPolicy": "Forbid",
            # A firing missed by more than one interval is skipped: the next one will do.
            "startingDeadlineSeconds": schedule.seconds,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": deadline_seconds(options),
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "serviceAccountName": name,
                            "restartPolicy": "Never",
                            "containers": [container],
                            "volumes": [{"name": "spec", "configMap": {"name": f"{name}-spec"}}],
                        },
                    },
                }
            },
        },
    }
    header = (
        f"# {name}: one `tpuctl reconcile` step of run {options.name} every "
        f"{say_interval(schedule.seconds)}; exit {IN_PROGRESS} (the run goes on) is success.\n"
    )
    text = header + "---\n".join(_yaml(document) for document in (account, config, cronjob))
    file_name = f"{options.unit}.k8s.yaml"
    path = shlex.quote(_path(options, file_name))
    member = f"serviceAccount:{options.project}.svc.id.goog[{namespace}/{name}]"
    bind = (
        f"gcloud iam service-accounts add-iam-policy-binding {options.service_account} "
        f"--role roles/iam.workloadIdentityUser --member {shlex.quote(member)}"
    )
    return Supervisor(
        name=options.name,
        target="kubernetes",
        unit=name,
        every_seconds=schedule.seconds,
        schedule=schedule.cron,
        command=list(argv),
        files=[SupervisorFile(file_name, text)],
        install=[bind, f"kubectl apply -f {path}"],
        remove=[f"kubectl delete -f {path}"],
        notes=[
            *schedule.notes,
            f"Workload Identity: the binding names the pool {options.project}.svc.id.goog; "
            "use the cluster's project if it is another one",
        ],
    )


# ------------------------------------------------------------------------------------- cloud-run


def render_cloud_run(
    options: SupervisorOptions, schedule: Schedule, argv: Sequence[str]
) -> Supervisor:
    """A shell script with the gcloud commands: deploy a Cloud Run job (the spec and the step
    in variables, no retries, a task timeout a little over the step's deadline), let the service
    account run it, and create (or update) a Cloud Scheduler job that calls the Cloud Run Admin
    API's jobs:run with an OAuth token for that account."""
    unit = options.unit
    project, region, account = options.project or "", options.region or "", options.service_account
    prelude = [
        f"mkdir -p {CLOUD_RUN_SPEC.rsplit('/', 1)[0]}",
        f"printf '%s' \"$TPUCTL_SPEC\" > {CLOUD_RUN_SPEC}",
    ]
    step = step_script(options, argv, prelude)
    variables = {**_environment(options), "TPUCTL_SPEC": options.spec_text, "TPUCTL_STEP": step}
    where = f"--project {shlex.quote(project)} --region {shlex.quote(region)}"
    located = f"--project {shlex.quote(project)} --location {shlex.quote(region)}"
    uri = f"https://run.googleapis.com/v2/projects/{project}/locations/{region}/jobs/{unit}:run"
    timeout = deadline_seconds(options)
    lines = [
        "#!/bin/sh",
        f"# {unit}: one `tpuctl reconcile` step of run {options.name} every "
        f"{say_interval(schedule.seconds)}, as a Cloud Run job",
        "# that Cloud Scheduler starts through the Cloud Run Admin API (jobs:run). Run it again",
        "# to update both; the spec and the step travel as the job's variables.",
        "set -eu",
        'variables="$(mktemp)"',
        "trap 'rm -f \"$variables\"' EXIT",
        "cat >\"$variables\" <<'TPUCTL_VARIABLES'",
        _yaml(variables).rstrip("\n"),
        "TPUCTL_VARIABLES",
        "# shellcheck disable=SC2016  # $TPUCTL_STEP is the task's to expand, not this script's",
        f"gcloud run jobs deploy {unit} {where} \\",
        f"  --image {shlex.quote(options.container_image)} \\",
        "  --command sh --args='-c,eval \"$TPUCTL_STEP\"' \\",
        '  --env-vars-file "$variables" \\',
        f"  --service-account {shlex.quote(account or '')} \\",
        f"  --tasks 1 --parallelism 1 --max-retries 0 --task-timeout {timeout}s \\",
        "  --cpu 1 --memory 512Mi",
        f"gcloud run jobs add-iam-policy-binding {unit} {where} \\",
        f"  --member serviceAccount:{account} --role roles/run.invoker >/dev/null",
        f"if gcloud scheduler jobs describe {unit} {located} >/dev/null 2>&1; then",
        "  verb=update",
        "else",
        "  verb=create",
        "fi",
        f'gcloud scheduler jobs "$verb" http {unit} {located} \\',
        f"  --schedule {shlex.quote(schedule.cron)} --time-zone Etc/UTC \\",
        f"  --uri {shlex.quote(uri)} --http-method POST \\",
        f"  --oauth-service-account-email {shlex.quote(account or '')} \\",
        f"  --oauth-token-scope {CLOUD_PLATFORM_SCOPE}",
    ]
    name = f"{unit}.cloud-run.sh"
    return Supervisor(
        name=options.name,
        target="cloud-run",
        unit=unit,
        every_seconds=schedule.seconds,
        schedule=schedule.cron,
        command=list(argv),
        files=[SupervisorFile(name, "\n".join(lines) + "\n")],
        install=[f"sh {shlex.quote(_path(options, name))}"],
        remove=[
            f"gcloud scheduler jobs delete {unit} {located} --quiet",
            f"gcloud run jobs delete {unit} {where} --quiet",
        ],
        notes=list(schedule.notes),
    )


# ---------------------------------------------------------------------------------------- github

WORKFLOWS = ".github/workflows"
ACTIONS = {
    "checkout": "actions/checkout@v4",
    "auth": "google-github-actions/auth@v2",
    "python": "actions/setup-python@v5",
}


def render_github(
    options: SupervisorOptions, schedule: Schedule, argv: Sequence[str]
) -> Supervisor:
    """A workflow on a schedule: one run at a time per run (a concurrency group that never
    cancels a step in progress), Workload Identity Federation for credentials, tpuctl from pip,
    then the step with exit 12 mapped to success. The spec comes from the repository when it
    lives there, else it is carried in the workflow."""
    unit = options.unit
    steps: list[dict[str, Any]] = []
    if options.spec_in_repository:
        steps.append({"uses": ACTIONS["checkout"]})
    steps.append(
        {
            "id": "auth",
            "uses": ACTIONS["auth"],
            "with": {
                "workload_identity_provider": options.workload_identity_provider,
                "service_account": options.service_account,
            },
        }
    )
    steps.append({"uses": ACTIONS["python"], "with": {"python-version": "3.11"}})
    install = f"python -m pip install --quiet {shlex.quote(options.package or DEFAULT_PACKAGE)}"
    steps.append({"name": "Install tpuctl", "run": install})
    script: list[str] = []
    env = dict(options.environment)
    if not options.spec_in_repository:
        env["TPUCTL_SPEC"] = options.spec_text
        script.append(f"printf '%s' \"$TPUCTL_SPEC\" > {GITHUB_SPEC}")
    script += [
        "rc=0",
        f"{shlex.join(argv)} || rc=$?",
        f'if [ "$rc" = {IN_PROGRESS} ]; then exit 0; fi',
        'exit "$rc"',
    ]
    run_step: dict[str, Any] = {
        "name": f"One reconcile step (exit {IN_PROGRESS}, in progress, is success)"
    }
    if env:
        run_step["env"] = env
    run_step["run"] = "\n".join(script) + "\n"
    steps.append(run_step)
    workflow = {
        "name": f"tpuctl reconcile {options.name}",
        "on": {"schedule": [{"cron": schedule.cron}], "workflow_dispatch": {}},
        "concurrency": {"group": unit, "cancel-in-progress": False},
        "permissions": {"contents": "read", "id-token": "write"},
        "jobs": {
            "reconcile": {
                "runs-on": "ubuntu-latest",
                "timeout-minutes": 10,
                "steps": steps,
            }
        },
    }
    header = (
        f"# {unit}: one `tpuctl reconcile` step of run {options.name} every "
        f"{say_interval(schedule.seconds)}\n"
        "# (GitHub runs schedules on the default branch, at most every 5 minutes, often late).\n"
    )
    # YAML 1.1 reads a bare `on` as true, so PyYAML quotes the key; GitHub reads it bare.
    text = header + _yaml(workflow).replace("\n'on':\n", "\non:\n", 1)
    name = f"{unit}.yml"
    source = shlex.quote(_path(options, name))
    target = f"{WORKFLOWS}/{name}"
    return Supervisor(
        name=options.name,
        target="github",
        unit=unit,
        every_seconds=schedule.seconds,
        schedule=schedule.cron,
        command=list(argv),
        files=[SupervisorFile(name, text)],
        install=[
            f"mkdir -p {WORKFLOWS} && cp {source} {target}",
            f"git add {target} && git commit -m 'Supervise {options.name} with tpuctl reconcile' "
            "&& git push",
        ],
        remove=[f"git rm {target} && git commit -m 'Stop supervising {options.name}' && git push"],
        notes=list(schedule.notes),
    )
