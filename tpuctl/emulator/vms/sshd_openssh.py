"""A real OpenSSH sshd for one emulated worker: its own config, host key and authorized keys."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import asyncssh

from tpuctl.emulator.vms import sshd, vm

# sshd starts sessions in the OS user's passwd home with HOME set from SetEnv. HOME points
# at this shim directory: bash sources its .bashrc (`bash -c` run by sshd) or .bash_profile
# (login shells), which move to the worker's home and hand over to the user's own files. No
# ForceCommand: sshd refuses signal requests for forced-command sessions.
_SHIM_ENTER = """\
# tpuctl emulator: enter this worker's home instead of the OS user's.
export HOME="$TPUCTL_VM_ROOT/home/$USER"
mkdir -p "$HOME" && cd "$HOME"
"""
SHIM_FILES = {
    ".bashrc": _SHIM_ENTER + '[ -f "$HOME/.bashrc" ] && . "$HOME/.bashrc"\n',
    ".bash_profile": _SHIM_ENTER
    + "for profile in .bash_profile .bash_login .profile; do\n"
    + '  if [ -f "$HOME/$profile" ]; then . "$HOME/$profile"; break; fi\n'
    + "done\n",
}


def write_shim_home(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in SHIM_FILES.items():
        (directory / name).write_text(text)


def _quote_config(value: str) -> str:
    if any(c in value for c in '"\n'):
        raise ValueError(f"cannot put {value!r} in sshd_config")
    return f'"{value}"'


class OpenSshEndpoint:
    """A real /usr/sbin/sshd for one worker, with its own config, host key and keys files.

    sshd only logs in users that exist on this machine, and runs sessions as that user;
    tests use the current OS user.
    """

    def __init__(
        self,
        *,
        ip: str,
        port: int,
        host_key: asyncssh.SSHKey,
        workdir: Path,
        session_env: Mapping[str, str],
        shim_home: Path,
        homes: Path,
        sshd: str = "/usr/sbin/sshd",
    ) -> None:
        self.ip = ip
        self.port = port
        self.workdir = workdir
        self._host_key = host_key
        self._session_env = dict(session_env)
        self._shim_home = shim_home
        self._homes = homes
        self._sshd = sshd
        self._proc: subprocess.Popen[bytes] | None = None
        self.fault: str | None = None

    def write_authorized_keys(self, keys: Mapping[str, list[str]]) -> None:
        """One file per user (regenerated on every metadata change), and their homes.

        The guest agent creates an account with a home when a key is published; here that
        lets sftp-server start in it before any shell has run.
        """
        for user in keys:
            (self._homes / user).mkdir(parents=True, exist_ok=True)
        directory = self.workdir / "authorized_keys"
        directory.mkdir(parents=True, exist_ok=True)
        for existing in directory.iterdir():
            if existing.name not in keys and not existing.name.endswith(".tmp"):
                existing.unlink(missing_ok=True)
        for user, lines in keys.items():
            tmp = directory / f"{user}.tmp"
            tmp.write_text("".join(line + "\n" for line in lines))
            tmp.replace(directory / user)

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        key_path = self.workdir / "ssh_host_ed25519_key"
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(self._host_key.export_private_key("openssh"))
        env = {**self._session_env, "HOME": str(self._shim_home)}
        setenv = " ".join(f"{key}={_quote_config(value)}" for key, value in sorted(env.items()))
        config = f"""\
ListenAddress {self.ip}:{self.port}
HostKey {key_path}
PidFile {self.workdir / "sshd.pid"}
AuthorizedKeysFile {self.workdir / "authorized_keys"}/%u
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
AcceptEnv LANG LC_*
Subsystem sftp {sshd.SFTP_SERVER} -d {self._homes}/%u
SetEnv {setenv}
"""
        path = self.workdir / "sshd_config"
        path.write_text(config)
        return path

    async def start(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)  # privilege separation
        config = self._write_config()
        log = open(self.workdir / "sshd.log", "ab")  # noqa: SIM115 - sshd owns it from here
        try:
            self._proc = subprocess.Popen(
                [self._sshd, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        """Until sshd sends its banner; fails with sshd's own log if it exits."""
        assert self._proc is not None
        for _ in range(200):
            if self._proc.poll() is not None:
                log = (self.workdir / "sshd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sshd for {self.ip}:{self.port} exited: {log}")
            try:
                reader, writer = await asyncio.open_connection(self.ip, self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            try:
                banner = await asyncio.wait_for(reader.readline(), 5)
            finally:
                writer.close()
            if banner.startswith(b"SSH-"):
                return
            await asyncio.sleep(0.02)
        raise RuntimeError(f"sshd for {self.ip}:{self.port} did not start")

    def _sshd_pids(self) -> list[int]:
        """The listener and its per-connection children (not the user's processes)."""
        if self._proc is None:
            return []
        pids = [self._proc.pid]
        for pid in vm.descendants(self._proc.pid):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name.startswith("sshd"):
                pids.append(pid)
        return pids

    async def _stop_sshd(self) -> None:
        if self._proc is None:
            return
        vm.signal_pids(self._sshd_pids()[:1], signal.SIGCONT)
        vm.signal_pids([self._proc.pid], signal.SIGTERM)
        for _ in range(250):
            if self._proc.poll() is not None:
                break
            await asyncio.sleep(0.02)
        else:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    async def set_fault(self, mode: str | None) -> None:
        if mode == self.fault:
            return
        previous, self.fault = self.fault, mode
        if previous == "hang" and self._proc is not None:
            vm.signal_pids([self._proc.pid], signal.SIGCONT)
        if mode == "hang":
            if self._proc is None:
                await self.start()
            # A stopped sshd: the kernel still completes handshakes into the backlog, but
            # nobody sends a banner.
            vm.signal_pids([self._proc.pid] if self._proc else [], signal.SIGSTOP)
        elif mode == "refuse":
            await self._stop_sshd()
        elif self._proc is None:
            await self.start()

    async def set_host_key(self, host_key: asyncssh.SSHKey) -> None:
        """Serve a new host key: sshd reads its key at start, so a running one is restarted
        (a hung one is stopped again); connections already open keep theirs."""
        self._host_key = host_key
        if self._proc is None:  # refusing: start() writes the new key
            return
        hung = self.fault == "hang"
        await self._stop_sshd()
        await self.start()
        if hung and self._proc is not None:
            vm.signal_pids([self._proc.pid], signal.SIGSTOP)

    def drop_connections(self) -> None:
        if self._proc is not None:
            vm.signal_pids(self._sshd_pids()[1:], signal.SIGKILL)

    async def close(self) -> None:
        self.drop_connections()
        await self._stop_sshd()
