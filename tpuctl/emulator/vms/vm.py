"""One emulated TPU VM on the local machine: its root directory, processes, startup script."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

# Every process of a worker carries both markers in its environment. Environment survives
# setsid, nohup and double forks (process groups and sessions do not), so scanning
# /proc/*/environ finds everything a worker started, however it detached.
EMULATOR_MARKER = "TPUCTL_EMULATOR_ID"
WORKER_MARKER = "TPUCTL_EMULATED_WORKER"

BASH = shutil.which("bash") or "/bin/bash"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs the startup script the way google_metadata_script_runner does (bash, output to a log),
# then records its exit status atomically so a reader never sees a half-written file.
_STARTUP_WRAPPER = 'bash "$1"; status=$?; echo "$status" > "$2.tmp" && mv -f "$2.tmp" "$2"'


def raise_nofile_limit() -> None:
    """1,024 workers need two listeners each plus connections: lift the soft fd limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        # On failure keep the old limit; creating workers then fails loudly if it is too low.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


_VM_DIRS = ("home", "root", "tmp", "dev", "var", "var/log", "var/log/startup-script", "var/lib",
            "var/lib/google")  # fmt: skip


def create_vm_root(root: Path, chips: int) -> None:
    """Lay out a fresh boot disk: home/, root/, tmp/, dev/accel*, var/log/, var/lib/."""
    # One syscall per entry: creating 1,024 VMs is mostly this.
    root.mkdir(parents=True, exist_ok=True)
    for sub in _VM_DIRS:
        with contextlib.suppress(FileExistsError):
            os.mkdir(root / sub)
    os.chmod(root / "tmp", 0o1777)
    for index in range(chips):
        os.close(os.open(root / "dev" / f"accel{index}", os.O_CREAT | os.O_WRONLY, 0o666))


def remove_tree(path: Path) -> None:
    """rm -rf that tolerates files vanishing while it runs (a killed process's last writes)."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():  # a second pass catches files created during the first
        shutil.rmtree(path, ignore_errors=True)


def bump_boot_count(root: Path) -> int:
    """Count one more boot of this disk and return the new count."""
    path = root / "var/lib/google/boot-count"
    try:
        count = int(path.read_text().strip() or "0")
    except (FileNotFoundError, ValueError):
        count = 0
    count += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{count}\n")
    return count


def start_startup_script(
    root: Path, boot: int, script: str, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start `script` with bash in its own session; output to boot-<n>.log, status to .exit."""
    script_path = root / "var/lib/google/startup-script"
    script_path.write_text(script)
    script_path.chmod(0o700)
    log_dir = root / "var/log/startup-script"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"boot-{boot}.log", "ab") as log:
        return subprocess.Popen(
            [BASH, "-c", _STARTUP_WRAPPER, "startup-script", str(script_path),
             str(log_dir / f"boot-{boot}.exit")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=env.get("HOME", str(root / "root")),
            env=dict(env),
            start_new_session=True,
        )  # fmt: skip


def scan_processes(emulator_id: str) -> dict[int, str]:
    """pid → worker marker ("node/worker") of every live process of one emulator instance."""
    wanted = f"{EMULATOR_MARKER}={emulator_id}".encode()
    worker_prefix = f"{WORKER_MARKER}=".encode()
    me = os.getpid()
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue  # exited, or not ours to read
        if wanted not in environ:
            continue
        fields = environ.split(b"\0")
        if wanted not in fields:
            continue
        for item in fields:
            if item.startswith(worker_prefix):
                found[pid] = item[len(worker_prefix) :].decode(errors="replace")
                break
    return found


def signal_pids(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


# Where a TPU program holds its chips open on a TPU VM (relative to the VM's root).
DEVICE_PATTERNS = ("dev/accel", "dev/vfio/")


def device_holders(pids: Iterable[int], vm_roots: Iterable[Path]) -> set[int]:
    """The pids among `pids` that hold one of these VMs' accelerator devices open."""
    prefixes = tuple(f"{root}/{pattern}" for root in vm_roots for pattern in DEVICE_PATTERNS)
    held: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # exited, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(prefixes):
                held.add(pid)
                break
    return held


def stop_processes(
    emulator_id: str,
    select: Callable[[str], bool],
    grace: float | None,
    *,
    vm_roots: Iterable[Path] = (),
    shutdown: float = 0.0,
) -> None:
    """Stop a VM's processes the way the platform does, or kill them at once (`grace` None).

    With a grace (an autocheckpoint maintenance): SIGTERM goes only to the processes holding
    one of the VMs' accelerator devices open (the TPU program); once none holds them, or the
    grace is over, the VM shuts down gracefully: SIGTERM (+SIGCONT) to everything left, up to
    `shutdown` seconds for it to exit (systemd's stop timeout), then SIGKILL. TERM goes once to
    what exists at the start of each phase (a cleanup handler may start helpers that must not
    be hit); KILL goes to everything left, including processes started meanwhile.
    """

    def live() -> set[int]:
        return {pid for pid, marker in scan_processes(emulator_id).items() if select(marker)}

    def wait_until(done: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    if grace is not None:
        roots = list(vm_roots)
        holders = device_holders(live(), roots) if grace > 0 and roots else set()
        if holders:
            signal_pids(holders, signal.SIGTERM)
            signal_pids(holders, signal.SIGCONT)  # a stopped process must wake to see the TERM
            wait_until(lambda: not device_holders(live(), roots), grace)
        everything = live()
        signal_pids(everything, signal.SIGTERM)
        signal_pids(everything, signal.SIGCONT)
        wait_until(lambda: not live(), shutdown)
    # A process may fork between scan and kill: rescan until a pass finds nothing.
    for _ in range(200):
        pids = live()
        if not pids:
            return
        signal_pids(pids, signal.SIGKILL)
        time.sleep(0.01)


def descendants(root_pid: int) -> list[int]:
    """Every live descendant of `root_pid` (via /proc/<pid>/stat parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # Field 4 is the parent pid; the command name in field 2 may hold spaces and ')'.
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    result: list[int] = []
    stack = [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            result.append(child)
            stack.append(child)
    return result


class ChildReaper:
    """Reaps this emulator's children from its event loop through pidfds.

    No thread and no SIGCHLD handler per child (asyncio's default watcher starts a thread per
    process), and no waitpid(-1) that would steal other code's children.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: dict[int, subprocess.Popen[bytes]] = {}

    def watch(
        self, proc: subprocess.Popen[bytes], on_exit: Callable[[int], None] | None = None
    ) -> None:
        """Call from the loop thread; `on_exit(returncode)` runs there once the child is reaped."""
        pidfd = os.pidfd_open(proc.pid)
        self._pending[pidfd] = proc
        self._loop.add_reader(pidfd, self._exited, pidfd, on_exit)

    def _exited(self, pidfd: int, on_exit: Callable[[int], None] | None) -> None:
        self._loop.remove_reader(pidfd)
        os.close(pidfd)
        proc = self._pending.pop(pidfd)
        code = proc.wait()
        if on_exit is not None:
            on_exit(code)

    async def settle(self, timeout: float) -> None:
        """Wait until every watched child has been reaped, or `timeout` passed."""
        deadline = self._loop.time() + timeout
        while self._pending and self._loop.time() < deadline:
            await asyncio.sleep(0.01)

    def reap_remaining(self) -> None:
        """Blocking last resort at shutdown: reap what the loop did not (after SIGKILL)."""
        for pidfd, proc in list(self._pending.items()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                self._loop.remove_reader(pidfd)
            with contextlib.suppress(OSError):
                os.close(pidfd)
        self._pending.clear()
