"""What the fan-out commands do: resolve workers, make keys work, run, detach, probe, copy."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import TpuctlError, UsageError
from tpuctl.fanout import remote
from tpuctl.fanout.connection import ConnectOptions
from tpuctl.fanout.engine import (
    DEFAULT_BATCH_SIZE,
    EventCallback,
    FanoutOptions,
    OutputCallback,
    run_fanout,
)
from tpuctl.fanout.keys import LocalKey, check_user, default_user, ensure_key, publish_key
from tpuctl.fanout.results import FanoutResult
from tpuctl.fanout.targets import (
    WorkerTarget,
    fetch_host_keys,
    resolve_nodes,
    select,
    ssh_port,
    worker_targets,
)

if TYPE_CHECKING:
    from tpuctl.cloud.client import TpuApi
    from tpuctl.spec.model import Spec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SshSettings:
    """How to reach workers; every field has the CLI flag of the same name."""

    user: str | None = None
    internal_ip: bool = False
    ssh_port: int | None = None
    strict_host_key_checking: bool = True
    connect_timeout: float = 20.0
    keepalive: float = 15.0
    key_path: Path | None = None
    batch_size: int = DEFAULT_BATCH_SIZE


@dataclass
class Fleet:
    """The selected workers of one QR, ready to connect to (keys published, host keys known)."""

    queued_resource: str
    targets: list[WorkerTarget]
    connect: ConnectOptions
    key: LocalKey
    user: str
    settings: SshSettings = field(default_factory=SshSettings)

    def options(self, **overrides: object) -> FanoutOptions:
        return replace(FanoutOptions(batch_size=self.settings.batch_size), **overrides)  # type: ignore[arg-type]

    def only(self, targets: Sequence[WorkerTarget]) -> Fleet:
        return replace(self, targets=list(targets))


def prepare_fleet(
    api: TpuApi,
    name: str,
    settings: SshSettings,
    *,
    nodes: str = "all",
    workers: str = "all",
    on_progress: Progress | None = None,
) -> Fleet:
    """Resolve the QR's workers, select them, make sure our key is in their nodes' ssh-keys
    metadata, and read their host keys from guest attributes (unless checking is off)."""
    if settings.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    resolved = resolve_nodes(api, name)
    port = ssh_port(settings.ssh_port)
    everyone = worker_targets(resolved, port=port, internal_ip=settings.internal_ip)
    targets = select(everyone, nodes=nodes, workers=workers)
    if not targets:
        raise UsageError(f"no workers selected in {name}")
    user = check_user(default_user(settings.user))
    key = ensure_key(settings.key_path)
    if key.created and on_progress is not None:
        on_progress(f"created SSH key {key.path} (ed25519)")
    node_names = [api.location.node_name(n) for n in dict.fromkeys(t.node_id for t in targets)]
    publish_key(api, node_names, user, key, on_progress=on_progress)
    if settings.strict_host_key_checking:
        targets = fetch_host_keys(api, targets)
    options = ConnectOptions(
        user=user,
        pkey=key.pkey,
        connect_timeout=settings.connect_timeout,
        keepalive=settings.keepalive,
        verify_host_keys=settings.strict_host_key_checking,
    )
    return Fleet(resolved.queued_resource, targets, options, key, user, settings)


# ------------------------------------------------------------------------------- commands


def run_command(
    fleet: Fleet,
    command: str,
    *,
    timeout: float | None = None,
    on_output: OutputCallback | None = None,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """Run `command` attached on every worker; output streams through `on_output`."""
    return run_fanout(
        fleet.targets,
        command,
        fleet.connect,
        fleet.options(timeout=timeout),
        on_output=on_output,
        on_event=on_event,
    )


def start_detached(
    fleet: Fleet,
    command: str,
    *,
    run_id: str | None = None,
    workdir: str | None = None,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """Start `command` in its own session on every worker (run dir ~/.tpuctl/runs/<id>) and
    return once it has started everywhere; `extra["run_id"]` names the run."""
    chosen = remote.check_run_id(run_id) if run_id else remote.new_run_id()
    script = remote.start_script(chosen, command, workdir=workdir)
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(), on_event=on_event)
    for worker in result:
        pid = _started_pid(worker.stdout.text())
        worker.detail = {"run": chosen, "pid": pid}
        if worker.ok and pid is None:
            worker.status = "failed"
            worker.error = "the run did not report a pid"
    result.extra["run_id"] = chosen
    return result


def _started_pid(output: str) -> int | None:
    for line in output.splitlines():
        word, _, value = line.partition(" ")
        if word == "started" and value.strip().isdigit():
            return int(value)
    return None


def run_status(fleet: Fleet, run_id: str | None) -> FanoutResult:
    """Each worker's run: running, exited (with its code), stopped, unknown or none."""
    result = run_fanout(fleet.targets, remote.status_script(run_id), fleet.connect, fleet.options())
    return _with_states(result)


def stop_run(fleet: Fleet, run_id: str | None, *, grace: float = 10.0) -> FanoutResult:
    """SIGTERM to each run's process group and session, SIGKILL after `grace` seconds."""
    options = fleet.options(timeout=grace + 30.0)
    result = run_fanout(fleet.targets, remote.stop_script(run_id, grace), fleet.connect, options)
    return _with_states(result)


def _with_states(result: FanoutResult) -> FanoutResult:
    for worker in result:
        state = remote.parse_state(worker.stdout.text())
        if state is not None:
            worker.detail = state.to_dict()
        elif worker.ok:
            worker.status = "failed"
            worker.error = "no state reported"
    return result


def run_logs(
    fleet: Fleet,
    run_id: str | None,
    *,
    lines: int = 20,
    follow: bool = False,
    on_output: OutputCallback | None = None,
) -> FanoutResult:
    """The last `lines` of every worker's run log, or `follow` them until the runs end."""
    script = remote.logs_script(run_id, lines, follow=follow)
    return run_fanout(fleet.targets, script, fleet.connect, fleet.options(), on_output=on_output)


# ------------------------------------------------------------------------------ transfers


def pack_local(path: Path) -> bytes:
    """A directory's contents, or one file under its own name, as tar.gz, packed once for every
    worker. mtime 0 in the gzip header: the same input always packs to the same bytes."""
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    if path.is_dir():
        members = [(item, str(item.relative_to(path))) for item in sorted(path.rglob("*"))]
    else:
        members = [(path, path.name)]
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0) as compressed,
        tarfile.open(fileobj=compressed, mode="w") as archive,
    ):
        for item, name in members:
            archive.add(item, arcname=name, recursive=False)
    return buffer.getvalue()


def upload(
    fleet: Fleet,
    local_dir: Path,  # a directory (its contents) or one file
    remote_dir: str,
    *,
    on_event: EventCallback | None = None,
) -> FanoutResult:
    """Pack `local_dir` once and stream it to every worker's `remote_dir` (tar over stdin),
    which checks the sha256 before extracting."""
    archive = pack_local(local_dir)
    digest = hashlib.sha256(archive).hexdigest()
    script = remote.upload_script(remote_dir, digest)
    result = run_fanout(
        fleet.targets, script, fleet.connect, fleet.options(stdin=archive), on_event=on_event
    )
    for worker in result:
        if worker.exit_code == remote.UPLOAD_CHECKSUM_EXIT:
            worker.error = "checksum mismatch after transfer"
    result.extra.update({"sha256": digest, "bytes": len(archive), "remote_dir": remote_dir})
    return result


def download(fleet: Fleet, remote_path: str, local_dir: Path) -> FanoutResult:
    """Copy one file or directory from the (single) selected worker into `local_dir`."""
    if len(fleet.targets) != 1:
        raise UsageError(
            f"download reads from one worker, but {len(fleet.targets)} are selected",
            hint="pass --node N --worker W",
        )
    script = remote.download_script(remote_path)
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(keep_output=True))
    worker = result.results[0]
    if worker.ok:
        local_dir.mkdir(parents=True, exist_ok=True)
        try:
            names = _extract(worker.stdout.bytes(), local_dir)
        except (tarfile.TarError, OSError) as error:
            raise TpuctlError(f"cannot unpack what {worker.target.label} sent: {error}") from None
        result.extra.update({"files": len(names), "local_dir": str(local_dir)})
    worker.stdout = type(worker.stdout)()  # the archive is not output anyone wants to see
    return result


def _extract(data: bytes, destination: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = archive.getmembers()
        root = destination.resolve()
        for member in members:
            target = (destination / member.name).resolve()
            if (root not in target.parents and target != root) or member.islnk():
                raise TpuctlError(f"refusing to write {member.name!r} outside {destination}")
        if hasattr(tarfile, "data_filter"):
            archive.extractall(destination, filter="data")
        else:  # pragma: no cover - Python < 3.10.12
            archive.extractall(destination)
    return [member.name for member in members]


# ------------------------------------------------------------------------------ `tpuctl run`


@dataclass
class JobRun:
    """The steps of `tpuctl run`, each a FanoutResult; `result` is the last one that ran."""

    steps: dict[str, FanoutResult] = field(default_factory=dict)
    run_id: str | None = None

    @property
    def result(self) -> FanoutResult:
        return list(self.steps.values())[-1]


def run_job(
    fleet: Fleet,
    spec: Spec,
    *,
    code_dir: Path | None,
    on_progress: Progress | None = None,
    on_event: EventCallback | None = None,
) -> JobRun:
    """multihost_runner on an ACTIVE QR: upload job.code, run job.setup, free the TPU (kill
    device holders, remove the libtpu lockfile), start job.command detached with job.env.
    Stops at the first step that did not succeed everywhere."""
    job = spec.job
    if job is None:
        raise UsageError(f"{spec.source} has no job section: nothing to run")
    say = on_progress or (lambda _message: None)
    run = JobRun()
    workdir = job.workdir
    if code_dir is not None:
        say(f"uploading {code_dir} to {workdir} on {len(fleet.targets)} workers")
        run.steps["upload"] = upload(fleet, code_dir, workdir, on_event=on_event)
        if run.result.exit_code:
            return run
    else:
        run.steps["workdir"] = run_command(fleet, f"mkdir -p -- {remote.remote_path(workdir)}")
        if run.result.exit_code:
            return run
    for index, line in enumerate(job.setup):
        say(f"setup {index + 1}/{len(job.setup)}: {line}")
        command = f"cd {remote.remote_path(workdir)} && bash -c {_quote(line)}"
        run.steps[f"setup[{index}]"] = run_command(fleet, command, on_event=on_event)
        if run.result.exit_code:
            return run
    say("freeing the TPU (device holders, libtpu lockfile)")
    run.steps["free-tpu"] = run_command(fleet, remote.free_tpu_script(), on_event=on_event)
    if run.result.exit_code:
        return run
    command = remote.env_exports(job.env) + f"exec bash -c {_quote(job.command)}"
    say(f"starting: {job.command}")
    started = start_detached(fleet, command, workdir=workdir, on_event=on_event)
    run.steps["start"] = started
    run.run_id = str(started.extra["run_id"])
    return run


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
