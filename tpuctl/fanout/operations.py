"""What the fan-out commands do: resolve workers, make keys work, run, detach, probe, copy."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from tpuctl.errors import TpuctlError, UsageError, quoted
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
from tpuctl.fanout.known_hosts import Checking
from tpuctl.fanout.results import FanoutResult, Transfer
from tpuctl.fanout.targets import WorkerTarget


@dataclass(frozen=True)
class SshSettings:
    """How to reach workers; every field has the CLI flag of the same name."""

    user: str | None = None
    internal_ip: bool = False
    tunnel_through_iap: bool = False  # each connection through `gcloud compute start-iap-tunnel`
    proxy_jump: str | None = None  # [USER@]HOST[:PORT]: a bastion, one direct-tcpip per worker
    ssh_port: int | None = None
    strict_host_key_checking: Checking = "accept-new"
    known_hosts: Path | None = None  # tpuctl's pinned host keys (default ~/.ssh/tpuctl_known_hosts)
    connect_timeout: float = 20.0
    keepalive: float = 15.0
    key_path: Path | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    key_ttl: float = 24 * 3600.0  # an OS Login key expires after this long


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

    def connecting_within(self, seconds: float) -> Fleet:
        """This fleet, giving up on a connection after `seconds` when that is sooner."""
        if seconds >= self.connect.connect_timeout:
            return self
        return replace(self, connect=replace(self.connect, connect_timeout=seconds))


# ------------------------------------------------------------------------------- commands


def run_command(
    fleet: Fleet,
    command: str,
    *,
    timeout: float | None = None,
    on_output: OutputCallback | None = None,
    on_event: EventCallback | None = None,
    raw: bool = False,
    stdin: bytes | None = None,
) -> FanoutResult:
    """Run `command` attached on every worker; output streams through `on_output`, as lines,
    or (`raw`) byte for byte as it arrives (files that must hold exactly what was sent). Each
    command reads `stdin`, the same bytes everywhere, then EOF (None: EOF at once)."""
    return run_fanout(
        fleet.targets,
        command,
        fleet.connect,
        fleet.options(timeout=timeout, raw_output=raw, stdin=stdin),
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
    """Start `command` in a process group of its own on every worker (its files:
    ~/.tpuctl/runs/<id>.*) and return once it has started everywhere; `run` names the run."""
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
    lines: int | None = 20,
    follow: bool = False,
    on_output: OutputCallback | None = None,
    raw: bool = False,
) -> FanoutResult:
    """The last `lines` of every worker's run log (None: all of it), or `follow` them until the
    runs end; `raw`: byte for byte to `on_output` (files), not as lines."""
    script = remote.logs_script(run_id, lines, follow=follow)
    options = fleet.options(raw_output=raw)
    result = run_fanout(fleet.targets, script, fleet.connect, options, on_output=on_output)
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
    import gzip  # here: a step or a command that packs nothing does not pay for it
    import tarfile

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


def download(
    fleet: Fleet,
    remote_path: str,
    local_dir: Path,
    *,
    every_worker: bool = False,
    on_event: EventCallback | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> FanoutResult:
    """Copy one file or directory from the selected worker into `local_dir`, or (every_worker)
    from each selected worker into `local_dir/<slice>-<worker>/`, all at once.

    Each worker's archive is written to disk as it arrives and unpacked from there, so memory
    stays flat whatever the size; a worker whose archive cannot be unpacked is failed.
    """
    if not every_worker and len(fleet.targets) != 1:
        raise UsageError(
            f"download reads from one worker, but {len(fleet.targets)} are selected",
            hint="pass --node N --worker W, or --all for every worker",
        )
    local_dir.mkdir(parents=True, exist_ok=True)
    sinks = _ArchiveSinks(local_dir, on_bytes)
    options = fleet.options(raw_output=True)
    import tarfile

    try:
        script = remote.download_script(remote_path)
        result = run_fanout(
            fleet.targets, script, fleet.connect, options, on_output=sinks.write, on_event=on_event
        )
    finally:
        sinks.close()
    files = received = 0
    for worker in result:
        part = sinks.path(worker.target)
        if worker.ok:
            destination = local_dir / _worker_dir(worker.target) if every_worker else local_dir
            try:
                files += len(_extract(part, destination))
                received += part.stat().st_size
            except (tarfile.TarError, OSError, TpuctlError) as error:
                worker.status = "failed"
                worker.error = f"cannot unpack what it sent: {error}"
        part.unlink(missing_ok=True)
        worker.stdout = type(worker.stdout)()  # the archive's tail is not output to show
    result.operation = "download"
    result.transfer = Transfer(
        bytes=received, source=remote_path, destination=str(local_dir), files=files
    )
    return result


def _worker_dir(target: WorkerTarget) -> str:
    return f"{target.slice_index}-{target.worker}"


class _ArchiveSinks:
    """One file per worker that the worker's stdout (its tar.gz) streams into."""

    def __init__(self, directory: Path, on_bytes: Callable[[int], None] | None) -> None:
        self.directory = directory
        self.on_bytes = on_bytes
        self._open: dict[int, BinaryIO] = {}

    def path(self, target: WorkerTarget) -> Path:
        return self.directory / f".tpuctl-download-{_worker_dir(target)}.tar.gz"

    def write(self, target: WorkerTarget, stream: str, data: bytes) -> None:
        if stream != "stdout":
            return
        sink = self._open.get(id(target))
        if sink is None:
            sink = self._open[id(target)] = open(self.path(target), "wb")  # noqa: SIM115
        sink.write(data)
        if self.on_bytes is not None:
            self.on_bytes(len(data))

    def close(self) -> None:
        for sink in self._open.values():
            sink.close()
        self._open.clear()


def _extract(archive_path: Path, destination: Path) -> list[str]:
    """Unpack a tar.gz, refusing members that would land outside `destination` and hard links
    (tarfile.TarError or TpuctlError; nothing is written then)."""
    import tarfile

    with tarfile.open(archive_path, mode="r:gz") as archive:
        members = archive.getmembers()
        linked = [member.name for member in members if member.islnk()]
        if linked:
            raise TpuctlError(f"refusing to write the hard link {quoted(linked[0])}")
        if hasattr(tarfile, "data_filter"):
            # The data filter refuses, before writing anything, a member whose path or link
            # would leave `destination` (absolute, ../, through a symlink), as the check below
            # does by hand; it resolves each path once, so it is not done twice.
            archive.extractall(destination, filter="data")
        else:  # pragma: no cover - Python < 3.10.12
            root = destination.resolve()
            for member in members:
                target = (destination / member.name).resolve()
                if root not in target.parents and target != root:
                    raise TpuctlError(
                        f"refusing to write {quoted(member.name)} outside {destination}"
                    )
            archive.extractall(destination)
    return [member.name for member in members]
