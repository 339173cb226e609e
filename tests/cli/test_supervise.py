"""`tpuctl supervise`: every artefact checked by the real tool for its format (crontab -n,
systemd-analyze verify, kubernetes-validate, actionlint and GitHub's workflow schema, shellcheck
and gcloud's own help for every flag rendered), and run where it can be run here: the cron line
and each container's or workflow's step script with a stand-in tpuctl, so exit 12 (in progress)
is seen becoming success and a given-up code is seen passing through."""

from __future__ import annotations

import calendar
import fcntl
import functools
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_output_contract import check as check_contract
from tests.e2e.cron import crontab_fields, crontab_syntax_errors, skip_reason
from tests.support import Outcome, invoke

VENV_BIN = Path(sys.executable).parent
ACCOUNT = "supervisor@my-project.iam.gserviceaccount.com"
PROVIDER = "projects/123456789012/locations/global/workloadIdentityPools/gh/providers/gh"
SPEC = """\
apiVersion: tpuctl/v1
name: nightly
project: my-project
zone: us-central2-b
tpu:
  accelerator: v4-8
  runtime: tpu-ubuntu2204-base
capacity:
  tier: spot
checkpoint:
  dir: {checkpoint}
job:
  command: python3 train.py --note '50% done, $HOME'
"""
# A stand-in for tpuctl: records its arguments and the spec it was given, exits $FAKE_RC (12).
FAKE_TPUCTL = """#!/bin/sh
python3 - "$@" <<'PY' >>"$FAKE_RECORD"
import json, pathlib, sys
argv = sys.argv[1:]
spec = pathlib.Path(argv[1]).read_text() if len(argv) > 1 else None
print(json.dumps({"argv": argv, "spec": spec}))
PY
exit "${FAKE_RC:-12}"
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def write_spec(tmp_path: Path, checkpoint: str = "gs://ckpt-bucket/runs") -> Path:
    path = tmp_path / "nightly.yaml"
    path.write_text(SPEC.format(checkpoint=checkpoint), encoding="utf-8")
    return path


def supervise(home: Path, *args: str, env: Mapping[str, str | None] | None = None) -> Outcome:
    base: dict[str, str | None] = {"HOME": str(home), "XDG_STATE_HOME": None}
    return invoke(["supervise", *args], {**base, **(env or {})})


def rendered(home: Path, spec: Path, target: str, *args: str) -> dict[str, Any]:
    """The Supervisor document, its files written to home/out."""
    out = home / "out"
    outcome = supervise(
        home, str(spec), "--on", target, "--output-dir", str(out), "--format", "json", *args
    )
    assert outcome.exit_code == 0, outcome.stderr
    document: dict[str, Any] = outcome.json()
    check_contract(document, "supervise")
    return document


def file_of(document: dict[str, Any], suffix: str) -> Path:
    (found,) = [Path(f["path"]) for f in document["files"] if f["name"].endswith(suffix)]
    assert found.read_text(encoding="utf-8") == next(
        f["content"] for f in document["files"] if f["name"].endswith(suffix)
    )
    return found


@pytest.fixture
def fake_tpuctl(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A bin directory holding the stand-in `tpuctl`, and the file it records to."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    tool = bin_dir / "tpuctl"
    tool.write_text(FAKE_TPUCTL, encoding="utf-8")
    tool.chmod(0o755)
    yield bin_dir, tmp_path / "record.jsonl"


def tool(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """A tool run to its end, its output captured as text (its exit code is the test's to check)."""
    options.setdefault("timeout", 120)
    return subprocess.run(argv, capture_output=True, text=True, check=False, **options)


def calls(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def run_script(argv: list[str], bin_dir: Path, record: Path, rc: int, cwd: Path, **env: str) -> int:
    environ = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_RECORD": str(record),
        "FAKE_RC": str(rc),
        **env,
    }
    done = tool(argv, env=environ, cwd=cwd, timeout=60)
    return done.returncode


# ------------------------------------------------------------------------------------------ cron


@pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
@pytest.mark.parametrize("every", ["1m", "15s", "5m"])
def test_the_crontab_passes_crontab_n(tmp_path: Path, home: Path, every: str) -> None:
    document = rendered(home, write_spec(tmp_path), "cron", "--every", every)
    text = file_of(document, ".cron").read_text(encoding="utf-8")
    assert crontab_syntax_errors(text, tmp_path / "check") is None
    assert crontab_syntax_errors("61 * * * * true\n", tmp_path / "bad") is not None  # control
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == {"1m": 1, "15s": 4, "5m": 1}[every]
    fields, _command = crontab_fields(lines[0])
    assert " ".join(fields) == {"1m": "* * * * *", "15s": "* * * * *", "5m": "*/5 * * * *"}[every]
    assert document["every_seconds"] == {"1m": 60, "15s": 15, "5m": 300}[every]


def cron_command(document: dict[str, Any]) -> str:
    """The first line's command as cron hands it to /bin/sh, once the printed install command
    has put the step script in place."""
    subprocess.run(["sh", "-c", document["install"][0]], check=True, timeout=60)
    text = file_of(document, ".cron").read_text()
    line = next(x for x in text.splitlines() if not x.startswith("#"))
    assert len(line) <= 1000  # Debian's cron refuses longer commands
    return crontab_fields(line)[1]


def test_the_cron_line_maps_12_to_success_and_never_overlaps(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path]
) -> None:
    bin_dir, record = fake_tpuctl
    spec = write_spec(tmp_path)
    document = rendered(home, spec, "cron", "--tpuctl", str(bin_dir / "tpuctl"))
    command = cron_command(document)
    state = home / ".local" / "state" / "tpuctl" / "supervise"

    # As cron runs it: /bin/sh, with cron's bare environment.
    def cron_sh(rc: int) -> subprocess.Popen[str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "FAKE_RECORD": str(record)}
        env["FAKE_RC"] = str(rc)
        return subprocess.Popen(["/bin/sh", "-c", command], env=env, text=True)

    assert cron_sh(12).wait(timeout=60) == 0
    assert cron_sh(3).wait(timeout=60) == 3  # a given-up run keeps failing
    assert cron_sh(0).wait(timeout=60) == 0
    steps = calls(record)
    assert [step["argv"] for step in steps] == [["reconcile", str(spec)]] * 3
    assert steps[0]["spec"] == spec.read_text()
    assert (state / "tpuctl-reconcile-nightly.log").exists()

    # A step still running holds the lock: the next firing returns at once, as in progress.
    with (state / "tpuctl-reconcile-nightly.lock").open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # flock(1) takes the same flock(2) lock
        assert cron_sh(3).wait(timeout=60) == 0
    assert len(calls(record)) == 3


def test_cron_keeps_odd_characters_and_the_environment_intact(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path]
) -> None:
    bin_dir, record = fake_tpuctl
    spec = write_spec(tmp_path)
    odd = "job.env.NOTE=50% of it, 'quoted' \"twice\" $HOME `no`"
    document = rendered(
        home, spec, "cron", "--tpuctl", str(bin_dir / "tpuctl"), "--set", odd,
        "--env", "FAKE_RC=12", "--env", "FAKE_RECORD=" + str(record),
    )  # fmt: skip
    command = cron_command(document)
    assert "%" not in command
    done = tool(["/bin/sh", "-c", command], env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls(record)[0]["argv"] == ["reconcile", str(spec), "--set", odd]


# --------------------------------------------------------------------------------------- systemd


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
@pytest.mark.parametrize("scope", ["user", "system"])
def test_the_systemd_units_pass_systemd_analyze_verify(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path], scope: str
) -> None:
    bin_dir, _record = fake_tpuctl
    odd = 'job.env.NOTE=50% of $HOME "quoted"'
    args = ["--tpuctl", str(bin_dir / "tpuctl"), "--set", odd, "--every", "15s"]
    if scope == "system":
        args.append("--system")
    document = rendered(home, write_spec(tmp_path), "systemd", *args)
    service, timer = file_of(document, ".service"), file_of(document, ".timer")
    assert service.name == "tpuctl-reconcile-nightly.service"
    verify = ["systemd-analyze", "verify", "--man=no"]
    if scope == "user":
        verify.insert(2, "--user")

    def complaints(*units: Path) -> tuple[int, list[str]]:
        """verify's exit code and what it says of our units (it also loads, and may complain
        of, the machine's own units that timers.target pulls in, and still exits 0)."""
        # A user manager wants a runtime directory; short, as its sockets' paths must be.
        with tempfile.TemporaryDirectory(prefix="sd", dir="/tmp") as runtime:
            env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
            done = tool([*verify, *map(str, units)], env=env)
        ours = [line for line in done.stderr.splitlines() if "tpuctl-reconcile" in line]
        return done.returncode, ours

    assert complaints(service, timer) == (0, [])
    # A control: a key systemd does not know is said (and verify still exits 0).
    bogus = tmp_path / "bogus" / service.name
    bogus.parent.mkdir()
    bogus.write_text(service.read_text() + "Bogus=1\n")
    _code, said = complaints(bogus, timer)
    assert any("Unknown key 'Bogus'" in line for line in said), said
    text = service.read_text()
    assert "Type=oneshot\n" in text and "SuccessExitStatus=12\n" in text
    assert f"User={os.environ.get('USER') or ''}" in text or scope == "user"
    assert '"job.env.NOTE=50%% of $$HOME \\"quoted\\""' in text  # specifiers, variables, quotes
    # A control: a unit systemd cannot run is reported.
    broken = tmp_path / "broken.service"
    broken.write_text(text.replace(str(bin_dir / "tpuctl"), "/nonexistent/tpuctl"))
    failed = tool(["systemd-analyze", "verify", "--man=no", str(broken)])
    assert failed.returncode != 0 and "/nonexistent/tpuctl" in failed.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd is not installed")
@pytest.mark.parametrize(("every", "step"), [("15s", 15), ("1m", 60), ("10m", 600)])
def test_the_timer_fires_at_the_interval(tmp_path: Path, home: Path, every: str, step: int) -> None:
    document = rendered(home, write_spec(tmp_path), "systemd", "--every", every)
    timer = file_of(document, ".timer").read_text()
    on_calendar = re.search(r"^OnCalendar=(.+)$", timer, re.M)
    assert on_calendar is not None and "Persistent=true" in timer
    done = tool(
        ["systemd-analyze", "calendar", "--iterations", "3", on_calendar.group(1)],
        env={**os.environ, "TZ": "UTC", "LC_ALL": "C"},
    )
    assert done.returncode == 0, done.stderr
    moments = re.findall(r"(?:Next elapse|Iter\. #\d): \w+ (\S+ \S+) UTC", done.stdout)
    assert len(moments) == 3, done.stdout
    seconds = [calendar.timegm(time.strptime(moment, "%Y-%m-%d %H:%M:%S")) for moment in moments]
    assert [b - a for a, b in itertools.pairwise(seconds)] == [step, step]


# ------------------------------------------------------------------------------------ kubernetes


def test_the_kubernetes_manifests_pass_kubernetes_validate(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path]
) -> None:
    spec = write_spec(tmp_path)
    document = rendered(home, spec, "kubernetes", "--service-account", ACCOUNT)
    manifest = file_of(document, ".k8s.yaml")
    validate = [str(VENV_BIN / "kubernetes-validate"), "--strict", "--quiet", str(manifest)]
    done = tool(validate)
    assert done.returncode == 0, done.stdout + done.stderr
    account, config, cronjob = yaml.safe_load_all(manifest.read_text())
    assert account["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": ACCOUNT}
    assert config["data"]["spec.yaml"] == spec.read_text()
    cron = cronjob["spec"]
    assert (cron["schedule"], cron["concurrencyPolicy"]) == ("* * * * *", "Forbid")
    job = cron["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] > 60
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["volumeMounts"][0]["readOnly"] is True
    assert "pip install --quiet --no-cache-dir tpuctl==" in container["command"][2]
    # A control: an unknown field is refused.
    cronjob["spec"]["concurrencyPolice"] = "Forbid"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cronjob))
    refused = tool([*validate[:-1], str(bad)])
    assert refused.returncode != 0

    # The container's command, with an image that has tpuctl (no pip) and a stand-in tpuctl.
    bin_dir, record = fake_tpuctl
    document = rendered(
        home, spec, "kubernetes", "--service-account", ACCOUNT, "--image", "example/tpuctl:1"
    )
    (*_, cronjob) = yaml.safe_load_all(file_of(document, ".k8s.yaml").read_text())
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert "pip" not in command[2]
    script = command[2].replace("/etc/tpuctl/spec.yaml", str(spec))  # the ConfigMap's mount
    assert run_script(["sh", "-c", script], bin_dir, record, 12, tmp_path) == 0
    assert run_script(["sh", "-c", script], bin_dir, record, 4, tmp_path) == 4
    assert calls(record)[0]["argv"] == ["reconcile", str(spec)]


# ------------------------------------------------------------------------------------- cloud-run


@functools.cache
def gcloud_tree() -> dict[str, Any] | None:
    """The installed gcloud's own tree of commands and flags (the one its shell completion
    reads, data/cli/gcloud_completions.py), or None when this SDK ships none."""
    import runpy

    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    table = Path(gcloud).resolve().parents[1] / "data" / "cli" / "gcloud_completions.py"
    if not table.is_file():
        return None
    tree: dict[str, Any] = runpy.run_path(str(table))["STATIC_COMPLETION_CLI_TREE"]
    return tree


@functools.cache
def gcloud_help(path: tuple[str, ...], config: str) -> str:
    """What gcloud knows of the flags of `path`: from its own command tree (a lookup), else
    from `gcloud PATH --help` (a second of CPU per command)."""
    tree = gcloud_tree()
    if tree is not None:
        node, flags = tree, set(tree.get("flags", {}))
        for word in path:
            node = node["commands"][word]
            flags |= set(node.get("flags", {}))
        return "\n".join(sorted(flags))
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": config,
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
    }
    gcloud = shutil.which("gcloud") or "gcloud"
    done = tool([gcloud, *path, "--help"], env=env)
    assert done.returncode == 0, (path, done.stderr)
    return done.stdout


def gcloud_calls(script: str) -> list[list[str]]:
    """Every gcloud command in a script, as words after `gcloud`, up to the end of the command."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        while "gcloud" in words:
            rest = words[words.index("gcloud") + 1 :]
            end = next(
                (i for i, w in enumerate(rest) if w in (";", "then", "&&", "||") or ">" in w),
                len(rest),
            )
            found.append(rest[:end])
            words = rest[end:]
    return found


def check_gcloud_flags(commands: list[list[str]], config: Path) -> int:
    """Every flag of every command appears in that command's own `--help`; the number checked."""
    checked = 0
    for words in commands:
        first_flag = next(i for i, w in enumerate(words) if w.startswith("--"))
        path = words[: first_flag - 1]  # the last word before the flags is the resource's name
        paths = [path]
        if "$verb" in path:
            paths = [[("create" if w == "$verb" else w) for w in path]]
            paths.append([("update" if w == "$verb" else w) for w in path])
        for one in paths:
            text = gcloud_help(tuple(one), str(config))
            for word in words[first_flag:]:
                if word.startswith("--"):
                    flag = word.split("=", 1)[0]
                    assert re.search(rf"{re.escape(flag)}(?![\w-])", text), (one, flag)
                    checked += 1
    return checked


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_every_gcloud_flag_rendered_exists(tmp_path: Path, home: Path) -> None:
    spec = write_spec(tmp_path)
    document = rendered(home, spec, "cloud-run", "--service-account", ACCOUNT)
    script = file_of(document, ".cloud-run.sh").read_text()
    commands = gcloud_calls(script) + [c for r in document["remove"] for c in gcloud_calls(r)]
    assert [c[:3] for c in commands] == [
        ["run", "jobs", "deploy"],
        ["run", "jobs", "add-iam-policy-binding"],
        ["scheduler", "jobs", "describe"],
        ["scheduler", "jobs", "$verb"],
        ["scheduler", "jobs", "delete"],
        ["run", "jobs", "delete"],
    ]
    kubernetes = rendered(home, spec, "kubernetes", "--service-account", ACCOUNT)
    commands += [c for r in kubernetes["install"] for c in gcloud_calls(r)]
    assert check_gcloud_flags(commands, tmp_path / "gcloud") >= 30
    deploy = commands[0]
    assert "--max-retries" in deploy and deploy[deploy.index("--max-retries") + 1] == "0"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_cloud_run_script_deploys_what_runs_one_step(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path]
) -> None:
    spec = write_spec(tmp_path)
    document = rendered(
        home, spec, "cloud-run", "--service-account", ACCOUNT, "--image", "example/tpuctl:1"
    )
    script = file_of(document, ".cloud-run.sh")
    assert os.access(script, os.X_OK)
    lint = tool(["shellcheck", "--shell=sh", str(script)])
    assert lint.returncode == 0, lint.stdout
    # Run it with a gcloud that records its arguments and keeps the variables file it is given.
    bin_dir, record = fake_tpuctl
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(
        "#!/bin/sh\n"
        'printf "%s\\n" "$*" >>"$GCLOUD_LOG"\n'
        'for a in "$@"; do [ "$previous" = --env-vars-file ] && cp "$a" "$GCLOUD_VARS"; '
        'previous="$a"; done\n'
        '[ "$3" = describe ] && exit 1\n'
        "exit 0\n"
    )
    gcloud.chmod(0o755)
    log, variables = tmp_path / "gcloud.log", tmp_path / "vars.yaml"
    env = {"GCLOUD_LOG": str(log), "GCLOUD_VARS": str(variables)}
    assert run_script(["sh", str(script)], bin_dir, record, 0, tmp_path, **env) == 0
    said = log.read_text().splitlines()
    assert said[0].startswith("run jobs deploy tpuctl-reconcile-nightly --project my-project")
    assert said[-1].startswith("scheduler jobs create http tpuctl-reconcile-nightly")
    assert (
        "--uri https://run.googleapis.com/v2/projects/my-project/locations/us-central2/jobs/"
        "tpuctl-reconcile-nightly:run --http-method POST" in said[-1]
    )
    assert f"--oauth-service-account-email {ACCOUNT}" in said[-1]
    values = yaml.safe_load(variables.read_text())
    assert values["TPUCTL_SPEC"] == spec.read_text()
    # The task: `sh -c 'eval "$TPUCTL_STEP"'` with the job's variables, as Cloud Run starts it.
    task = ["sh", "-c", 'eval "$TPUCTL_STEP"']
    step_env = {k: str(v) for k, v in values.items()}
    assert run_script(task, bin_dir, record, 12, tmp_path, **step_env) == 0
    assert run_script(task, bin_dir, record, 7, tmp_path, **step_env) == 7
    first = calls(record)[0]
    assert first["argv"] == ["reconcile", "/tmp/tpuctl/spec.yaml"]
    assert first["spec"] == spec.read_text()


# ---------------------------------------------------------------------------------------- github


@pytest.mark.parametrize("where", ["repository", "embedded"])
def test_the_workflow_passes_actionlint_and_the_schema(
    tmp_path: Path, home: Path, fake_tpuctl: tuple[Path, Path], where: str
) -> None:
    if where == "repository":
        (tmp_path / ".git").mkdir()
    spec = write_spec(tmp_path)
    document = rendered(
        home,
        spec,
        "github",
        "--service-account",
        ACCOUNT,
        "--workload-identity-provider",
        PROVIDER,
    )
    assert document["notes"][0].startswith("--every 1m rounded up to 5m")
    workflow = file_of(document, ".yml")
    path = f"{os.pathsep}".join([str(VENV_BIN), os.environ["PATH"]])
    lint = tool(
        [str(VENV_BIN / "actionlint"), "-no-color", str(workflow)],
        env={**os.environ, "PATH": path},
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    schema = tool(
        [
            str(VENV_BIN / "check-jsonschema"),
            "--builtin-schema",
            "vendor.github-workflows",
            str(workflow),
        ],
    )
    assert schema.returncode == 0, schema.stdout + schema.stderr
    text = workflow.read_text()
    assert "\non:\n" in text
    loaded = yaml.safe_load(text.replace("\non:\n", "\n'on':\n"))
    assert loaded["on"]["schedule"] == [{"cron": "*/5 * * * *"}]
    assert loaded["concurrency"] == {
        "group": "tpuctl-reconcile-nightly",
        "cancel-in-progress": False,
    }
    assert loaded["permissions"] == {"contents": "read", "id-token": "write"}
    steps = loaded["jobs"]["reconcile"]["steps"]
    auth = next(step for step in steps if step.get("id") == "auth")
    assert auth["with"] == {"workload_identity_provider": PROVIDER, "service_account": ACCOUNT}
    checkout = [step for step in steps if step.get("uses", "").startswith("actions/checkout")]
    assert len(checkout) == (1 if where == "repository" else 0)
    # The step as GitHub runs it: bash -e, in the workspace (the repository, or an empty one).
    bin_dir, record = fake_tpuctl
    last = steps[-1]
    workspace = tmp_path if where == "repository" else tmp_path / "workspace"
    workspace.mkdir(exist_ok=True)
    env = {k: str(v) for k, v in (last.get("env") or {}).items()}
    bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", last["run"]]
    assert run_script(bash, bin_dir, record, 12, workspace, **env) == 0
    assert run_script(bash, bin_dir, record, 6, workspace, **env) == 6
    first = calls(record)[0]
    assert first["argv"][:2] == [
        "reconcile",
        "nightly.yaml" if where == "repository" else "tpuctl-spec.yaml",
    ]
    assert first["spec"] == spec.read_text()


# -------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("target", ["kubernetes", "cloud-run", "github"])
@pytest.mark.parametrize("checkpoint", [None, "/mnt/checkpoints"])
def test_a_remote_target_needs_the_state_on_gcs(
    tmp_path: Path, home: Path, target: str, checkpoint: str | None
) -> None:
    spec = write_spec(tmp_path, checkpoint or "/mnt/checkpoints")
    if checkpoint is None:
        spec.write_text(spec.read_text().replace("checkpoint:\n  dir: /mnt/checkpoints\n", ""))
    outcome = supervise(home, str(spec), "--on", target, "--service-account", ACCOUNT)
    assert outcome.exit_code == 2
    assert outcome.stdout == ""
    (line,) = outcome.stderr.splitlines()
    assert line.startswith(f"error: --on {target} cannot reach the run's state")
    assert "set checkpoint.dir: gs://BUCKET/PATH in the spec" in line
    # On this machine the same spec is fine.
    assert supervise(home, str(spec), "--on", "cron").exit_code == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--on", "github", "--service-account", ACCOUNT], "--on github needs"),
        (["--on", "kubernetes"], "--on kubernetes needs --service-account"),
        (["--on", "cron", "--every", "7s"], "--every 7s does not divide a minute"),
        (["--on", "cron", "--every", "7m"], "--every 7m does not divide an hour"),
        (["--on", "cron", "--every", "2h"], "--every 2h does not divide an hour"),
        (["--on", "cron", "--env", "1X=2"], "--env '1X=2' is not NAME=VALUE"),
        (["--on", "cron", "--zone", "us-central2-b", "--zones", "a-b-c"], "exclude one another"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(
    tmp_path: Path, home: Path, args: list[str], said: str
) -> None:
    outcome = supervise(home, str(write_spec(tmp_path)), *args)
    assert outcome.exit_code == 2, outcome.stderr
    (line,) = outcome.stderr.splitlines()
    assert said in line and "(" in line  # the fix, in parentheses


def test_printed_files_and_the_commands_on_stderr(tmp_path: Path, home: Path) -> None:
    spec = write_spec(tmp_path)
    outcome = supervise(home, str(spec), "--on", "kubernetes", "--service-account", ACCOUNT)
    assert outcome.exit_code == 0, outcome.stderr
    documents = list(yaml.safe_load_all(outcome.stdout))
    assert [d["kind"] for d in documents] == ["ServiceAccount", "ConfigMap", "CronJob"]
    assert "save the output as tpuctl-reconcile-nightly.k8s.yaml" in outcome.stderr
    assert "  kubectl apply -f tpuctl-reconcile-nightly.k8s.yaml\n" in outcome.stderr
    assert "remove:\n  kubectl delete -f tpuctl-reconcile-nightly.k8s.yaml\n" in outcome.stderr
    assert "note: Workload Identity: the binding names the pool my-project.svc.id.goog" in (
        outcome.stderr
    )
    quiet = invoke(["--quiet", "supervise", str(spec), "--on", "cron"], {"HOME": str(home)})
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert quiet.stdout.startswith("# ---- tpuctl-reconcile-nightly.cron ----\n")
    assert "\n# ---- tpuctl-reconcile-nightly.sh ----\n#!/bin/sh\n" in quiet.stdout


def test_the_step_gets_the_project_and_zone_the_spec_lacks(tmp_path: Path, home: Path) -> None:
    spec = tmp_path / "bare.yaml"
    spec.write_text(
        "apiVersion: tpuctl/v1\nname: bare\ntpu:\n  accelerator: v4-8\n"
        "  runtime: tpu-ubuntu2204-base\ncheckpoint:\n  dir: gs://b/runs\n"
    )
    env = {"TPUCTL_PROJECT": "env-project", "TPUCTL_ZONE": "us-east5-a"}
    outcome = supervise(
        home, str(spec), "--on", "kubernetes", "--service-account", ACCOUNT,
        "--set", "tpu.slices=2", "--impersonate-service-account", ACCOUNT,
        "--format", "json", env=env,
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.json()["command"] == [
        "tpuctl", "reconcile", "/etc/tpuctl/spec.yaml", "--set", "tpu.slices=2",
        "--project", "env-project", "--zone", "us-east5-a",
        "--impersonate-service-account", ACCOUNT,
    ]  # fmt: skip
    cloud_run = supervise(
        home, str(spec), "--on", "cloud-run", "--service-account", ACCOUNT, "--format", "json",
        env=env,
    )  # fmt: skip
    assert "--region us-east5 " in cloud_run.json()["files"][0]["content"]


def test_help_lists_every_target(home: Path) -> None:
    outcome = invoke(["supervise", "--help"], {"HOME": str(home)})
    assert outcome.exit_code == 0
    for target in ("cron", "systemd", "kubernetes", "cloud-run", "github"):
        assert target in outcome.stdout
