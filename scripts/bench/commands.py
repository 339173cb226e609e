#!/usr/bin/env python3
"""Whole tpuctl commands as users run them, each its own process, against one emulator.

fanout.py times tpuctl's fan-out engine inside a prepared process; this times what a user
waits for: interpreter start, imports, spec, the TPU API (resolve the QR, its nodes, their
host keys), SSH to every worker, rendering. For each size (64, 256, 1,024 workers: N/16
slices of v4-128) it creates a queued resource with `tpuctl create --wait` from a spec it
writes, and then times, round-robin over --repeat rounds, each command as a separate process
(os.wait4: that process's user+sys CPU and peak RSS, with the children it waited for):

  ssh --format json -- true      ssh -- true (table; stdout is a pipe)
  ssh --detach -- sleep 1        ps, logs (of a detached run that printed 20 lines)
  status --jobs                  upload of a 10 MB tree (100 files × 100 KB, incompressible)
  download --all of a 1.4 KB file from every worker
  asyncssh client                scripts/bench/asyncssh_client.py: the baseline "whole
                                 process": interpreter, google-cloud-tpu node list and host
                                 keys, `true` on every worker over asyncssh, 64 set-ups in
                                 flight (tpuctl's --batch-size), host keys verified

Untimed per size: `tpuctl create --wait`; a first `tpuctl ssh` that publishes the user's key
to the nodes' metadata (a one-time cost per QR) and writes the file `download` fetches; the
detached run that gives ps and logs their 20 lines. The spec has no job, so no startup script
runs on 1,024 emulated VMs (that would keep the 2 cores busy for minutes); `status --jobs`
still probes every worker over SSH and gets "none" from each.

Targets, judged at 1,024 workers: `ssh -- true` ≤ 1.1× the asyncssh client's wall time;
client CPU ≤ 3 ms per worker (not upload, which encrypts 10 MB for every worker); ps, logs
and status --jobs ≤ 1.2× `ssh -- true`; peak RSS ≤ 150 MB. The emulator (gRPC API and every
worker's SSH server and shell, one process) shares the machine's cores with the client: its
CPU during each command is in the table ('emu CPU'); 'other' is the rest of the machine's busy
CPU meanwhile: other sessions on a shared machine, and the detached runs' own processes, which
leave the emulator's process tree (setsid) and so are not in its figure.

    scripts/bench/commands.py [--workers 64,256,1024] [--quick] [--repeat 3] [--json FILE]
        [--skip upload,...]
        [--profile DIR]

--profile DIR also runs `ssh -- true`, `ssh --format json -- true`, `ssh --detach -- sleep 1`,
`ps` and `download --all` once more at the largest size under scripts/bench/profile_threads.py
(cProfile in every thread, thread CPU clock), writes DIR/{ssh,ssh-json,detach,ps,download}-N.prof
and their top entries to DIR/{…}-N.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

from tpuctl.emulator.client.testing import EmulatorProcess  # noqa: E402

PROJECT = "tpuctl-bench"
ZONE = "us-central2-b"
USER = "bench"
WORKERS_PER_SLICE = 16  # v4-128
SPEED = "20"  # as the test suite and scripts/bench/emulator.py: 1,024 workers ACTIVE in seconds
BATCH_SIZE = 64  # tpuctl's default --batch-size; the asyncssh client uses the same
TREE_FILES, TREE_FILE_BYTES = 100, 100 * 1024
SMALL_FILE = "~/bench-small.txt"
LOG_LINES = 20
COMMAND_TIMEOUT = 1800.0
TARGET_SIZE = 1024
TARGET_VS_ASYNCSSH = 1.1
TARGET_VS_SSH = 1.2
TARGET_CPU_MS = 3.0
TARGET_RSS_MB = 150.0

# Variables that would change what tpuctl or google-auth does in the children: dropped, then
# set to what the bench means (as tests/support.py does for the suite).
AMBIENT_PREFIXES = ("TPUCTL_", "CLOUDSDK_", "MEGASCALE_", "GCE_METADATA_")
AMBIENT = ("TPU_EMULATOR_HOST", "STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")
OFFLINE = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
}


@dataclass
class Sample:
    wall_s: float
    cpu_s: float
    rss_mb: float
    emulator_cpu_s: float
    other_cpu_s: float  # the machine's busy CPU less the client's and the emulator's


@dataclass
class Row:
    key: str
    label: str
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples]
        return statistics.median(values) if values else None

    def peak_rss(self) -> float | None:
        return max((s.rss_mb for s in self.samples), default=None)


# ---------------------------------------------------------------------------- processes


def emulator_cpu(pid: int) -> float:
    """The emulator's CPU so far (its threads, and the children it reaped: workers' shells)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed(
    argv: list[str], env: dict[str, str], cwd: Path, emulator_pid: int
) -> tuple[int, bytes, bytes, Sample]:
    """Run argv to the end, stdout and stderr to pipes; its exit code, output and figures."""
    cpu0, busy0 = emulator_cpu(emulator_pid), machine_busy()
    start = time.perf_counter()
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=cwd,
    )  # fmt: skip
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    def drain(stream: Any, into: list[bytes]) -> None:
        for block in iter(lambda: stream.read1(65536), b""):
            into.append(block)

    readers = [
        threading.Thread(target=drain, args=(process.stdout, chunks["stdout"]), daemon=True),
        threading.Thread(target=drain, args=(process.stderr, chunks["stderr"]), daemon=True),
    ]
    for reader in readers:
        reader.start()
    # Our own child, by its pid, if it outlives the deadline.
    watchdog = threading.Timer(COMMAND_TIMEOUT, lambda: os.kill(process.pid, 9))
    watchdog.start()
    try:
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        watchdog.cancel()
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    emulator_s, busy = emulator_cpu(emulator_pid) - cpu0, machine_busy() - busy0
    for reader in readers:
        reader.join()
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    process.stderr.close()
    cpu = usage.ru_utime + usage.ru_stime
    sample = Sample(
        wall_s=wall,
        cpu_s=cpu,
        rss_mb=usage.ru_maxrss / 1024,  # kilobytes on Linux
        emulator_cpu_s=emulator_s,
        other_cpu_s=max(0.0, busy - cpu - emulator_s),
    )
    return process.returncode, b"".join(chunks["stdout"]), b"".join(chunks["stderr"]), sample


def tpuctl_argv() -> list[str]:
    """The `tpuctl` console script a user runs (python -m tpuctl if it is not installed)."""
    script = Path(sys.executable).parent / "tpuctl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tpuctl"]


def child_environment(emulator: EmulatorProcess, home: Path) -> dict[str, str]:
    environ = {
        name: value
        for name, value in os.environ.items()
        if name not in AMBIENT and not name.startswith(AMBIENT_PREFIXES) and name != "NO_COLOR"
    }
    environ.update(OFFLINE)
    environ.update(emulator.environment())
    environ.update({"HOME": str(home), "USER": USER, "PYTHONPATH": str(REPO)})
    return environ


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit, for the emulator (1,024 SSH servers and their
    sessions' pipes) and the clients (1,024 sockets), which inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ---------------------------------------------------------------------------------- bench


class SizeBench:
    """One QR of `workers` workers, and the timed commands against it."""

    def __init__(
        self,
        emulator: EmulatorProcess,
        workers: int,
        work: Path,
        repeat: int,
        skip: frozenset[str] = frozenset(),
    ) -> None:
        self.emulator = emulator
        self.skip = skip
        self.workers = workers
        self.slices = workers // WORKERS_PER_SLICE
        self.work = work
        self.repeat = repeat
        self.home = work / "home"
        self.home.mkdir(exist_ok=True)
        self.env = child_environment(emulator, self.home)
        self.name = f"bench-{workers}"
        self.spec = work / f"{self.name}.yaml"
        self.spec.write_text(
            "apiVersion: tpuctl/v1\n"
            f"name: {self.name}\nproject: {PROJECT}\nzone: {ZONE}\n"
            "tpu:\n  accelerator: v4-128\n  runtime: tpu-ubuntu2204-base\n"
            f"  slices: {self.slices}\n",
            encoding="utf-8",
        )
        self.tree = work / "tree"
        self.rows: dict[str, Row] = {}
        self.setup_errors: list[str] = []
        self.setup_s: dict[str, float] = {}
        self.pid = emulator.process.pid if emulator.process else 0

    # -- plumbing ----------------------------------------------------------------------------
    def tpuctl(self, *args: str) -> list[str]:
        return [*tpuctl_argv(), *args]

    def untimed(self, what: str, argv: list[str]) -> bool:
        code, out, err, sample = timed(argv, self.env, self.work, self.pid)
        self.setup_s[what] = round(sample.wall_s, 3)
        if code != 0:
            message = f"{self.workers} workers, setup {what}: exit {code}: {tail(err or out)}"
            self.setup_errors.append(message)
            print(f"BENCH ERROR {message}", file=sys.stderr, flush=True)
            return False
        return True

    def measure(self, key: str, label: str, argv: list[str], check: Any = None) -> None:
        if key in self.skip:
            return
        row = self.rows.setdefault(key, Row(key, label))
        print(f"  {self.workers:5} {label}", file=sys.stderr, flush=True)
        code, out, err, sample = timed(argv, self.env, self.work, self.pid)
        problem = f"exit {code}: {tail(err or out)}" if code != 0 else None
        if problem is None and check is not None:
            problem = check(out)
        if problem:
            message = f"{self.workers} workers, {label}: {problem}"
            row.errors.append(message)
            print(f"BENCH ERROR {message}", file=sys.stderr, flush=True)
            return
        row.samples.append(sample)

    # -- checks that the command did its work, beyond exit 0 ---------------------------------
    def all_ok_json(self, out: bytes) -> str | None:
        try:
            ok = json.loads(out)["summary"]["ok"]
        except (ValueError, KeyError, TypeError) as error:
            return f"unreadable JSON ({error})"
        return None if ok == self.workers else f"{ok}/{self.workers} ok"

    def asyncssh_ok(self, out: bytes) -> str | None:
        try:
            ok = json.loads(out.splitlines()[-1])["ok"]
        except (ValueError, KeyError, IndexError) as error:
            return f"unreadable output ({error})"
        return None if ok == self.workers else f"{ok}/{self.workers} ok"

    def logs_complete(self, out: bytes) -> str | None:
        last = out.count(f"line {LOG_LINES}\n".encode())
        return None if last == self.workers else f"{last}/{self.workers} workers' last log line"

    def downloaded(self, directory: Path) -> Any:
        def check(_out: bytes) -> str | None:
            found = len(list(directory.glob(f"*/{Path(SMALL_FILE).name}")))
            return None if found == self.workers else f"{found}/{self.workers} files"

        return check

    # -- the run -----------------------------------------------------------------------------
    def setup(self) -> bool:
        if not self.tree.exists():
            self.tree.mkdir()
            rng = random.Random(1024)  # incompressible, and the same bytes every run
            for index in range(TREE_FILES):
                (self.tree / f"f{index:03d}.bin").write_bytes(rng.randbytes(TREE_FILE_BYTES))
        print(f"  {self.workers:5} create --wait ({self.slices} × v4-128)", file=sys.stderr)
        if not self.untimed("create", self.tpuctl("create", str(self.spec), "--wait")):
            return False
        # Publishes the key to every node's metadata (once per QR), writes the download's file.
        write = f"head -c 1024 /dev/urandom | base64 > {SMALL_FILE}"
        return self.untimed("first ssh", self.tpuctl("ssh", str(self.spec), "--", write))

    def round(self, index: int) -> None:
        spec = str(self.spec)
        self.measure(
            "ssh", "ssh -- true", self.tpuctl("ssh", spec, "--", "true")
        )  # fmt: skip
        self.measure(
            "asyncssh", "asyncssh client (baseline)",
            [sys.executable, str(HERE / "asyncssh_client.py"), PROJECT, ZONE, self.name, USER,
             str(self.home / ".ssh" / "google_compute_engine"),
             "--batch-size", str(BATCH_SIZE), "--command", "true"],
            self.asyncssh_ok,
        )  # fmt: skip
        self.measure(
            "ssh-json", "ssh --format json -- true",
            self.tpuctl("ssh", spec, "--format", "json", "--", "true"), self.all_ok_json,
        )  # fmt: skip
        self.measure(
            "detach", "ssh --detach -- sleep 1",
            self.tpuctl("ssh", spec, "--detach", "--", "sleep", "1"),
        )  # fmt: skip
        # The run ps and logs read: the latest on every worker, LOG_LINES lines, exited.
        lines = f"for i in $(seq 1 {LOG_LINES}); do echo line $i; done"
        self.untimed("log run", self.tpuctl("ssh", spec, "--detach", "--", lines))
        time.sleep(2.0)  # its lines written, and every `sleep 1` above over
        self.measure("ps", "ps", self.tpuctl("ps", spec))
        self.measure("logs", "logs", self.tpuctl("logs", spec), self.logs_complete)
        self.measure("status-jobs", "status --jobs", self.tpuctl("status", spec, "--jobs"))
        target = self.work / f"download-{index}"
        self.measure(
            "download", "download --all (1.4 KB each)",
            self.tpuctl("download", spec, SMALL_FILE, str(target), "--all"),
            self.downloaded(target),
        )  # fmt: skip
        shutil.rmtree(target, ignore_errors=True)
        self.measure(
            "upload", "upload 10 MB tree",
            self.tpuctl("upload", spec, str(self.tree), "bench-tree"),
        )  # fmt: skip

    def teardown(self) -> None:
        self.untimed("delete", self.tpuctl("delete", str(self.spec), "--force", "--yes"))

    def run(self, profile: Path | None = None) -> list[str]:
        """Set up, the timed rounds, then the profiles (if asked); the .prof files."""
        written: list[str] = []
        try:
            if self.setup():
                for index in range(self.repeat):
                    self.round(index)
                if profile is not None:
                    written = self.profile(profile)
        finally:
            self.teardown()
        return written

    def profile(self, directory: Path) -> list[str]:
        """The commands with targets under profile_threads.py; the .prof files written."""
        written = []
        directory.mkdir(parents=True, exist_ok=True)
        spec = str(self.spec)
        into = str(self.work / "download-profiled")
        commands = (
            ("ssh", ["ssh", spec, "--", "true"]),
            ("ssh-json", ["ssh", spec, "--format", "json", "--", "true"]),
            ("detach", ["ssh", spec, "--detach", "--", "sleep 1"]),
            ("ps", ["ps", spec]),
            ("download", ["download", spec, SMALL_FILE, into, "--all"]),
        )
        for what, args in commands:
            out = directory / f"{what}-{self.workers}.prof"
            argv = [sys.executable, str(HERE / "profile_threads.py"), str(out), "--", *args]
            print(f"  {self.workers:5} profile {what}", file=sys.stderr, flush=True)
            code, _out, err, _ = timed(argv, self.env, self.work, self.pid)
            if code != 0:
                message = f"{self.workers} workers, profile {what}: exit {code}: {tail(err)}"
                self.setup_errors.append(message)
                print(f"BENCH ERROR {message}", file=sys.stderr, flush=True)
                continue
            written.append(str(out))
        return written


def tail(data: bytes, limit: int = 600) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text[-limit:].replace("\n", " | ")


# --------------------------------------------------------------------------------- report

ORDER = ("asyncssh", "ssh", "ssh-json", "detach", "ps", "logs", "status-jobs", "download", "upload")
VS_SSH = ("ps", "logs", "status-jobs")


def figures(bench: SizeBench) -> dict[str, Any]:
    rows = bench.rows
    base = rows.get("asyncssh")
    ssh = rows.get("ssh")
    base_wall = base.median("wall_s") if base else None
    ssh_wall = ssh.median("wall_s") if ssh else None
    out: dict[str, Any] = {}
    for key in ORDER:
        row = rows.get(key)
        if row is None:
            continue
        wall, cpu = row.median("wall_s"), row.median("cpu_s")
        entry: dict[str, Any] = {
            "label": row.label,
            "runs": len(row.samples),
            "errors": row.errors,
            "wall_s": wall,
            "cpu_s": cpu,
            "cpu_ms_per_worker": cpu * 1000 / bench.workers if cpu is not None else None,
            "peak_rss_mb": row.peak_rss(),
            "emulator_cpu_s": row.median("emulator_cpu_s"),
            "other_cpu_s": row.median("other_cpu_s"),
            "vs_asyncssh": wall / base_wall if wall is not None and base_wall else None,
            "vs_ssh": wall / ssh_wall if key in VS_SSH and wall is not None and ssh_wall else None,
            "samples": [asdict(s) for s in row.samples],
        }
        entry["verdicts"] = verdicts(key, entry) if bench.workers == TARGET_SIZE else {}
        out[key] = entry
    return out


def verdicts(key: str, entry: dict[str, Any]) -> dict[str, bool | None]:
    """Target → met (None: no figure, the command failed); only tpuctl's own commands."""
    if key == "asyncssh":
        return {}
    judged: dict[str, Any] = {}

    def judge(name: str, value: float | None, limit: float) -> None:
        judged[name] = None if value is None else value <= limit

    judge(f"RSS≤{TARGET_RSS_MB:g}MB", entry["peak_rss_mb"], TARGET_RSS_MB)
    if key != "upload":  # 10 MB encrypted per worker: not a per-worker overhead
        judge(f"CPU≤{TARGET_CPU_MS:g}ms/w", entry["cpu_ms_per_worker"], TARGET_CPU_MS)
    if key == "ssh":
        judge(f"≤{TARGET_VS_ASYNCSSH:g}×asyncssh", entry["vs_asyncssh"], TARGET_VS_ASYNCSSH)
    if key in VS_SSH:
        judge(f"≤{TARGET_VS_SSH:g}×ssh", entry["vs_ssh"], TARGET_VS_SSH)
    return judged


def number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(bench: SizeBench, table: dict[str, Any], load: str) -> None:
    print(
        f"\n{bench.workers:,} workers ({bench.slices} × v4-128), median of {bench.repeat} "
        f"(peak RSS: the largest); load average before: {load}"
    )
    print(
        f"  setup, untimed: create --wait {bench.setup_s.get('create', 0):.1f} s, first ssh "
        f"(publishes the key to {bench.slices} nodes) {bench.setup_s.get('first ssh', 0):.1f} s"
    )
    header = (
        f"  {'command':30} {'wall s':>7} {'CPU s':>6} {'ms/w':>6} {'RSS MB':>7} "
        f"{'emu CPU':>7} {'other':>6} {'×async':>6} {'×ssh':>5}  targets"
    )
    print(header)
    for key in ORDER:
        entry = table.get(key)
        if entry is None:
            continue
        if not entry["runs"]:
            print(f"  {entry['label']:30} ERROR: {entry['errors'][0]}")
            continue
        marks = "  ".join(
            f"{name} {'-' if ok is None else ('ok' if ok else 'MISSED')}"
            for name, ok in entry["verdicts"].items()
        )
        if entry["errors"]:
            marks += f"  ({len(entry['errors'])} run(s) failed)"
        print(
            f"  {entry['label']:30} {number(entry['wall_s'], '7.2f')} "
            f"{number(entry['cpu_s'], '6.2f')} {number(entry['cpu_ms_per_worker'], '6.2f')} "
            f"{number(entry['peak_rss_mb'], '7.1f')} {number(entry['emulator_cpu_s'], '7.2f')} "
            f"{number(entry['other_cpu_s'], '6.2f')} {number(entry['vs_asyncssh'], '6.2f')} "
            f"{number(entry['vs_ssh'], '5.2f')}  {marks}"
        )


def git_head() -> str:
    """The commit measured, and whether tpuctl/ differs from it (others edit the tree too); in
    a tree exported with `git archive`, what BENCH_REVISION says."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    if not (REPO / ".git").exists():
        return os.environ.get("BENCH_REVISION", "unknown (not a git checkout)")
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "tpuctl")
    return f"{head} + uncommitted changes in tpuctl/" if dirty else head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="64,256,1024", help="sizes (64,256,1024)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 workers, once")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every command (3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--profile", type=Path, help="profile ssh and ps at the largest size")
    parser.add_argument(
        "--skip",
        default="",
        help=f"commands not to time, comma-separated (of {','.join(ORDER)}; upload is 2 min "
        "a round at 1,024 workers)",
    )
    args = parser.parse_args()
    skip = frozenset(filter(None, args.skip.split(",")))
    if skip - set(ORDER):
        parser.error(f"--skip: no command {', '.join(sorted(skip - set(ORDER)))}")
    sizes = [64] if args.quick else [int(s) for s in args.workers.split(",")]
    repeat = 1 if args.quick and args.repeat == 3 else args.repeat
    for size in sizes:
        if size % WORKERS_PER_SLICE or size <= 0:
            parser.error(f"--workers: {size} is not a multiple of {WORKERS_PER_SLICE}")
    fd_limit = raise_fd_limit()
    # The emulator and every client import this tree's tpuctl, whatever the current directory.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    cores = os.cpu_count() or 0
    revision = git_head()
    print(
        f"tpuctl {revision}, Python {platform.python_version()}, {cores} cores, "
        f"RLIMIT_NOFILE {fd_limit}"
    )
    print(
        f"The emulator (one process: the gRPC API and every worker's SSH server and shell)\n"
        f"shares these {cores} cores with each client: 'emu CPU' is its CPU during the command,\n"
        f"and wall times include waiting for it (on Cloud TPU every worker has its own host).\n"
        f"'other' is CPU used meanwhile by anything else on the machine.\n"
        f"Every command is its own process (os.wait4: 'CPU s' is its user+sys, 'RSS MB' its\n"
        f"peak); 'ms/w' is CPU per worker; '×async' is wall time over the asyncssh client's,\n"
        f"'×ssh' over `ssh -- true`'s."
    )
    report: dict[str, Any] = {
        "head": revision, "python": platform.python_version(), "cores": cores,
        "repeat": repeat, "sizes": {}, "errors": [],
    }  # fmt: skip
    missed = errors = 0
    with tempfile.TemporaryDirectory(prefix="tpuctl-bench-commands-") as tmp:
        work = Path(tmp)
        chips = max(sizes) // WORKERS_PER_SLICE * 64 * 2  # v4-128 is 64 chips; room to spare
        with EmulatorProcess(
            work / "state", "--speed", SPEED, "--capacity", f"v4={max(chips, 16384)}"
        ) as emulator:
            print(f"emulator {emulator.host}, speed {SPEED}, SSH port {emulator.ssh_port}")
            profiles: list[str] = []
            for size in sizes:
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                bench = SizeBench(emulator, size, work, repeat, skip)
                try:
                    profiles += bench.run(args.profile if size == max(sizes) else None)
                finally:
                    table = figures(bench)
                    print_table(bench, table, load)
                    sys.stdout.flush()
                report["sizes"][str(size)] = {
                    "slices": bench.slices, "setup_s": bench.setup_s,
                    "load_average_before": load, "commands": table,
                }  # fmt: skip
                report["errors"] += bench.setup_errors
                report["errors"] += [e for entry in table.values() for e in entry["errors"]]
                missed += sum(
                    ok is False for entry in table.values() for ok in entry["verdicts"].values()
                )
    errors = len(report["errors"])
    if TARGET_SIZE in sizes:
        print(f"\nTargets at {TARGET_SIZE:,} workers: {missed} missed.")
    else:
        print(f"\nTargets are judged at {TARGET_SIZE:,} workers (not run).")
    if errors:
        print(f"{errors} bench error(s), not timings:")
        for message in report["errors"]:
            print(f"  {message}")
    for path in profiles:
        summary = Path(path).with_suffix(".txt")
        show = [sys.executable, str(HERE / "profile_threads.py"), "--show", path]
        with summary.open("w", encoding="utf-8") as handle:
            subprocess.run(show, stdout=handle, check=False)
        print(f"profile {path}: top entries in {summary}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if errors or missed else 0


if __name__ == "__main__":
    sys.exit(main())
