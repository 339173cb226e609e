"""A real cron daemon for end-to-end tests: Debian's `cron`, run in the foreground in its own
mount namespace, where private directories are bound over its spool (/var/spool/cron/crontabs),
/etc/cron.d, /etc/crontab and /run (its pid file), so it never reads or changes this machine's
crontabs and never meets another test's daemon.

    with CronDaemon(tmp_path / "cron") as cron:
        cron.run(install_command)          # e.g. the `crontab -` line `tpuctl supervise` prints
        assert "tpuctl reconcile" in cron.crontab()
        lines = cron.wait_for(lambda: records(), what="two steps", firings=2)

cron fires at minute boundaries (and a line for `--every 15s` sleeps into the minute), so a
test waits up to `CronDaemon.wait_seconds(firings, offset)`: until the next minute starts, plus
a minute per further firing, plus the offset and a margin. It says so on stderr before waiting.
Where libfaketime is installed (scripts/bootstrap installs it), the daemon's clock runs ahead
of the real one by what makes its next minute start FIRST_MINUTE_SECONDS after it starts: a
test then waits about that long for the first firing, not up to a minute (half a minute on
average, which made these the suite's longest tests and the least predictable). Only the
daemon's clock is shifted: the jobs it starts get the environment of their crontab line.
Needs root (cron switches to the crontab's owner; the bind mounts need CAP_SYS_ADMIN), `cron`
(installed by scripts/bootstrap), and util-linux's unshare and nsenter: `skip_reason()` says
which is missing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

CRON = "/usr/sbin/cron"
# Seconds past the firing before a step is taken as missing: cron starts a job within a second
# or two of the minute; the margin is ten times that and covers a loaded machine.
MARGIN_SECONDS = 30.0
# Where the daemon reads from and writes to, each replaced by a private directory or file.
PRIVATE_DIRECTORIES = ("/var/spool/cron/crontabs", "/etc/cron.d", "/run")
PRIVATE_FILES = ("/etc/crontab",)
# With libfaketime: how long after the daemon starts its first minute begins (time to install
# a crontab first: a later one waits for the next minute, which wait_seconds allows for).
FIRST_MINUTE_SECONDS = 8.0
FAKETIME_LIBRARIES = "/usr/lib/*/faketime/libfaketime.so.1"


def skip_reason() -> str | None:
    """Why a cron daemon cannot be run here, or None."""
    if os.geteuid() != 0:
        return "a cron daemon needs root"
    if not os.access(CRON, os.X_OK):
        return "Debian's cron is not installed (scripts/bootstrap installs it)"
    for tool in ("unshare", "nsenter", "crontab"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    for path in PRIVATE_DIRECTORIES:
        if not os.path.isdir(path):
            return f"{path} does not exist"
    return None


class CronDaemon:
    """One cron daemon in its own mount namespace, its files under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "daemon.log"
        self.clock_offset = 0.0  # the daemon's clock minus the real one, in seconds

    # ----------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> CronDaemon:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        reason = skip_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        mounts = []
        for index, target in enumerate(PRIVATE_DIRECTORIES):
            private = self.root / f"dir{index}"
            private.mkdir(exist_ok=True)
            mounts.append(f"mount --bind {private} {target}")
        for index, target in enumerate(PRIVATE_FILES):
            private = self.root / f"file{index}"
            private.write_text("", encoding="utf-8")
            mounts.append(f"mount --bind {private} {target}")
        spool = self.root / "dir0"  # the crontab tool's own mode and group, as Debian sets them
        if _has_group("crontab"):
            shutil.chown(spool, group="crontab")
        spool.chmod(0o1730)
        # -f: stay in the foreground (our child); -L 15: log starts, ends, failures, pids.
        clock = ""
        libraries = sorted(glob.glob(FAKETIME_LIBRARIES))
        if libraries:
            # Whole seconds: a fraction's separator would follow the locale.
            self.clock_offset = float(round(-(time.time() + FIRST_MINUTE_SECONDS) % 60.0) % 60)
            clock = f"env LD_PRELOAD={libraries[0]} FAKETIME=+{self.clock_offset:.0f} "
        script = " && ".join([*mounts, f"exec {clock}{CRON} -f -L 15"])
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_until_running()

    def _wait_until_running(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cron exited {self.process.returncode}: {self._said()}")
            try:
                name = Path(f"/proc/{self.process.pid}/comm").read_text().strip()
            except OSError:
                name = ""
            if name == "cron":
                # cron rereads its spool when the directory's mtime changes, in whole seconds:
                # a crontab installed within the second it first read the spool would be missed.
                time.sleep(1.2)
                return
            time.sleep(0.05)
        raise RuntimeError(f"cron did not start within 20 s: {self._said()}")

    def _said(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip() or "(nothing on its output)"
        except OSError:
            return "(no output)"

    def stop(self) -> None:
        """Stop the daemon and every job it started: each process in its mount namespace (a
        job sleeping into the minute would otherwise outlive the test)."""
        if self.process is None:
            return
        members = self._namespace_members()
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def _namespace_members(self) -> list[int]:
        """The processes in the daemon's mount namespace (never this process's own)."""
        assert self.process is not None
        try:
            namespace = os.readlink(f"/proc/{self.process.pid}/ns/mnt")
        except OSError:
            return []
        if namespace == os.readlink("/proc/self/ns/mnt"):
            return []  # not yet unshared: only the daemon's own process is ours to end
        members = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == namespace:
                    members.append(int(entry))
            except OSError:
                continue
        return members

    # ---------------------------------------------------------------------------- inside it

    def run(
        self,
        command: str,
        *,
        input_text: str | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A shell command inside the daemon's mount namespace (where `crontab` edits the
        private spool), e.g. the install or remove command `tpuctl supervise` prints; `env`
        replaces this process's environment for it."""
        assert self.process is not None, "start the daemon first"
        argv = ["nsenter", "--target", str(self.process.pid), "--mount", "sh", "-c", command]
        done = subprocess.run(
            argv,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=None if env is None else dict(env),
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{command!r} exited {done.returncode}: {done.stderr.strip() or done.stdout}"
            )
        return done

    def install(self, crontab: str) -> None:
        """Replace root's crontab in the namespace with `crontab` (checked by `crontab`)."""
        self.run("crontab -", input_text=crontab)

    def crontab(self) -> str:
        """root's crontab in the namespace ('' when there is none)."""
        done = self.run("crontab -l", check=False)
        return done.stdout if done.returncode == 0 else ""

    # ------------------------------------------------------------------------------- waiting

    @staticmethod
    def wait_seconds(firings: int = 1, offset: float = 0.0, now: datetime | None = None) -> float:
        """The longest wait for `firings` minutes' worth of cron firings whose line sleeps
        `offset` seconds into the minute: to the next minute, a minute per further firing, the
        offset and MARGIN_SECONDS."""
        moment = now or datetime.now()
        to_next_minute = 60.0 - (moment.second + moment.microsecond / 1e6)
        return to_next_minute + 60.0 * (firings - 1) + offset + MARGIN_SECONDS

    def wait_for(
        self,
        predicate: Callable[[], T],
        *,
        what: str,
        firings: int = 1,
        offset: float = 0.0,
        interval: float = 0.5,
    ) -> T:
        """Poll `predicate` until it returns something true, within `wait_seconds`; say on
        stderr how long that may be."""
        budget = self.wait_seconds(
            firings, offset, datetime.now() + timedelta(seconds=self.clock_offset)
        )
        sys.stderr.write(
            f"cron fires at minute boundaries: waiting up to {budget:.0f} s for {what}\n"
        )
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.process is None or self.process.poll() is not None:
                raise AssertionError(f"cron stopped while waiting for {what}: {self._said()}")
            time.sleep(interval)
        raise AssertionError(
            f"cron did not give {what} within {budget:.0f} s; crontab:\n{self.crontab()}"
        )


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def crontab_syntax_errors(text: str, scratch: Path) -> str | None:
    """The real `crontab -n` (check the syntax, install nothing) on `text`, inside a mount
    namespace with a private spool, so not even its scratch file reaches the machine's; the
    tool's complaint, or None when the syntax is sound."""
    scratch.mkdir(parents=True, exist_ok=True)
    candidate = scratch / "candidate.cron"
    candidate.write_text(text, encoding="utf-8")
    spool = scratch / "spool"
    spool.mkdir(exist_ok=True)
    # By its name in the working directory: crontab keeps only so many characters of a path.
    script = f"mount --bind {spool} /var/spool/cron/crontabs && crontab -n {candidate.name}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


def crontab_fields(line: str) -> tuple[Sequence[str], str]:
    """A crontab line's five time fields and its command, as cron reads them: `\\%` becomes
    `%` (an unescaped `%` would end the command)."""
    parts = line.split(None, 5)
    assert len(parts) == 6, line
    command = parts[5]
    assert "%" not in command.replace("\\%", ""), f"an unescaped % in {line!r}"
    return parts[:5], command.replace("\\%", "%")
