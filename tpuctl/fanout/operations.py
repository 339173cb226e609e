"""What the fan-out commands do: resolve workers, make keys work, run, detach, probe, copy."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

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
from tpuctl.fanout.keys import LocalKey
from tpuctl.fanout.results import FanoutResult, Transfer
from tpuctl.fanout.targets import WorkerTarget


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
    return once it has started everywhere; `run` names the run."""
    chosen = remote.check_run_id(run_id) if run_id else remote.new_run_id()
    script = remote.start_script(chosen, command, workdir=workdir)
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(), on_event=on_event)
    for worker in result:
        pid = _started_pid(worker.stdout.text())
        worker.detail = remote.RunState("started", chosen, pid, None)
        if worker.ok and pid is None:
            worker.status = "failed"
            worker.error = "the run did not report a pid"
    result.operation, result.run = "detach", chosen
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
    result.operation, result.run = "ps", run_id
    return _with_states(result)


def stop_run(fleet: Fleet, run_id: str | None, *, grace: float = 10.0) -> FanoutResult:
    """SIGTERM to each run's process group and session, SIGKILL after `grace` seconds."""
    options = fleet.options(timeout=grace + 30.0)
    result = run_fanout(fleet.targets, remote.stop_script(run_id, grace), fleet.connect, options)
    result.operation, result.run = "stop", run_id
    return _with_states(result)


def _with_states(result: FanoutResult) -> FanoutResult:
    for worker in result:
        state = remote.parse_state(worker.stdout.text())
        if state is not None:
            worker.detail = state
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
    result = run_fanout(fleet.targets, script, fleet.connect, fleet.options(), on_output=on_output)
    result.operation, result.run = "logs", run_id
    return result


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
    result.operation = "upload"
    result.transfer = Transfer(digest, len(archive), str(local_dir), remote_dir)
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
        result.transfer = Transfer(source=remote_path, destination=str(local_dir), files=len(names))
    result.operation = "download"
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
