"""Gathering from every worker: `logs --all` (the job's whole log, prefixed or one file per
worker), `download --all` (into LOCAL/<slice>-<worker>/, streamed to disk), and `ps` showing
what a person asks of a run, on 2 slices × 2 workers."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import QR, Project, by_label
from tests.support import wait_for

RUN = "gather"


def _spec(tpuctl: Project, qr: QR) -> Path:
    """A spec for the module's QR whose job has run name `gather`."""
    path = tpuctl.tmp_path / "gather.yaml"
    path.write_text(
        f"apiVersion: tpuctl/v1\nname: {qr.name}\n"
        "tpu: {accelerator: v4-16, runtime: tpu-ubuntu2204-base, slices: 2}\n"
        f"job: {{command: python3 train.py, run_name: {RUN}}}\n",
        encoding="utf-8",
    )
    return path


def _job_logs(qr: QR) -> dict[str, str]:
    """Write a job log on every worker, as the startup script would, and return them."""
    written = {}
    for s in range(len(qr.node_ids)):
        for w in range(qr.workers_per_node):
            directory = qr.vm_root(s, w) / "var/log/tpuctl" / RUN
            directory.mkdir(parents=True, exist_ok=True)
            lines = [f"boot 1 line {i} of {s}/{w}" for i in range(300)]
            text = "\n".join(lines) + "\n"
            (directory / "current.log").write_text(text, encoding="utf-8")
            written[f"{s}/{w}"] = text
    return written


def test_logs_all_gathers_every_workers_whole_job_log(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    written = _job_logs(qr)
    spec = _spec(tpuctl, qr)
    prefixed = tpuctl("logs", str(spec), "--job", "--all")
    assert prefixed.exit_code == 0, prefixed.stderr
    for label, text in written.items():
        mine = [line for line in prefixed.stdout.splitlines() if line.startswith(f"[{label}] ")]
        assert mine == [f"[{label}] {line}" for line in text.splitlines()]  # all 300, in order

    out = tmp_path / "out"
    to_files = tpuctl("logs", str(spec), "--job", "--all", "--output-dir", str(out))
    assert to_files.exit_code == 0, to_files.stderr
    assert sorted(p.name for p in out.iterdir()) == ["0-0.log", "0-1.log", "1-0.log", "1-1.log"]
    for label, text in written.items():
        assert (out / f"{label.replace('/', '-')}.log").read_text() == text  # byte for byte
    assert "[0/0]" not in to_files.stdout  # nothing prefixed when it goes to files

    tail = tpuctl("logs", str(spec), "--job", "-n", "2", "--node", "0", "--worker", "0")
    assert tail.exit_code == 0, tail.stderr
    assert tail.stdout.splitlines() == [
        "[0/0] boot 1 line 298 of 0/0",
        "[0/0] boot 1 line 299 of 0/0",
    ]


def test_logs_all_says_which_workers_have_no_job_log(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    _job_logs(qr)
    missing = qr.vm_root(1, 1) / "var/log/tpuctl" / RUN / "current.log"
    missing.unlink()
    outcome = tpuctl("logs", str(_spec(tpuctl, qr)), "--job", "--all", "--format", "json")
    assert outcome.exit_code == 3, outcome.stderr  # one worker failed
    rows = by_label(outcome)
    assert rows["1/1"]["status"] == "failed" and "no job log for run gather" in str(
        rows["1/1"]["stderr_tail"]
    )
    assert all(rows[label]["status"] == "ok" for label in ("0/0", "0/1", "1/0"))


def test_logs_all_as_json_carries_every_workers_whole_log(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    written = _job_logs(qr)
    odd = b"not UTF-8: \xff\xfe, an escape \x1b[31m, a NUL \x00 and the end\n"
    (qr.vm_root(1, 0) / "var/log/tpuctl" / RUN / "current.log").write_bytes(odd)
    outcome = tpuctl("logs", str(_spec(tpuctl, qr)), "--job", "--all", "--format", "json")
    assert outcome.exit_code == 0, outcome.stderr
    rows = by_label(outcome)
    for label, text in written.items():
        log = rows[label]["detail"]
        if label == "1/0":
            assert base64.b64decode(log["log_base64"]) == odd  # every byte, as sent
            assert log["log"] == odd.decode("utf-8", errors="replace")
            assert (log["bytes"], log["cut_bytes"]) == (len(odd), 0)
            continue
        assert log["log"] == text and len(log["log"].splitlines()) == 300  # not the last 20
        assert (log["log_base64"], log["bytes"], log["cut_bytes"]) == (None, len(text), 0)
    tail = tpuctl("logs", str(_spec(tpuctl, qr)), "--job", "-n", "50", "--format", "json")
    assert tail.exit_code == 0, tail.stderr
    assert (
        by_label(tail)["0/0"]["detail"]["log"].splitlines() == (written["0/0"].splitlines()[-50:])
    )


def test_logs_and_logs_all_read_the_same_log(tpuctl: Project, qr: QR) -> None:
    """Without --job or --run both read the latest detached run; --job, the job's, both ways."""
    written = _job_logs(qr)
    spec = str(_spec(tpuctl, qr))
    lines = "; ".join(f"echo detached line {i}" for i in range(30))
    started = tpuctl("ssh", qr.name, "--detach", "--format", "json", "--", f"{lines}; sleep 30")
    assert started.exit_code == 0, started.stderr
    run = started.json()["run"]

    def latest() -> bool:
        rows = by_label(tpuctl("ps", qr.name, "--format", "json")).values()
        return all(row["detail"]["run"] == run and row["detail"]["last_line"] for row in rows)

    wait_for(latest, 15, "the run to be the latest everywhere")
    try:
        tail = tpuctl("logs", spec, "-n", "2", "--node", "0", "--worker", "0")
        whole = tpuctl("logs", spec, "--all", "--node", "0", "--worker", "0")
        assert tail.stdout.splitlines() == ["[0/0] detached line 28", "[0/0] detached line 29"]
        assert whole.stdout.splitlines() == [f"[0/0] detached line {i}" for i in range(30)]
        job_tail = tpuctl("logs", spec, "--job", "-n", "1", "--node", "0", "--worker", "0")
        job_whole = tpuctl("logs", spec, "--job", "--all", "--node", "0", "--worker", "0")
        assert job_tail.stdout == "[0/0] boot 1 line 299 of 0/0\n"
        assert job_whole.stdout.splitlines() == [
            f"[0/0] {line}" for line in written["0/0"].splitlines()
        ]
    finally:
        tpuctl("stop", qr.name, "--run", run, "--grace", "1")


def test_logs_of_no_detached_run_says_where_the_job_log_is(tpuctl: Project, qr: QR) -> None:
    fresh = ("--node", "1", "--worker", "1")
    runs = qr.home(1, 1) / ".tpuctl" / "runs"
    latest = runs / "latest"
    latest.unlink(missing_ok=True)  # no detached run there (others may have left one)
    for args in ((), ("--all",)):
        outcome = tpuctl("logs", qr.name, *fresh, *args)
        assert outcome.exit_code == 3, outcome.stderr
        assert outcome.stdout == ""  # nothing that looks like a log line
        assert "no detached run" in outcome.stderr and "--job" in outcome.stderr


def test_logs_refuses_all_with_follow_and_job_with_run(tpuctl: Project, qr: QR) -> None:
    both = tpuctl("logs", qr.name, "--all", "--follow")
    assert both.exit_code == 2 and "choose one" in both.stderr
    job_and_run = tpuctl("logs", qr.name, "--job", "--run", "x")
    assert job_and_run.exit_code == 2


# 24 MiB from each of 4 workers: a client that held one whole archive in memory would peak
# 24 MiB above the same download of a tiny file, so staying within 16 MiB of it proves it
# streams (and within 150 MiB in all). The two peaks differ by about 2 MiB.
BIG = 24 * 1024 * 1024
# Runs tpuctl as its child and prints the child's peak RSS (KiB) on its own last line.
PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(code)\n"
)


@pytest.mark.slow
def test_download_all_streams_from_each_worker_in_flat_memory(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    digests = {}
    chunk = 4 * 1024 * 1024
    for s in range(len(qr.node_ids)):
        for w in range(qr.workers_per_node):
            home = qr.home(s, w)
            home.mkdir(parents=True, exist_ok=True)
            (home / "tiny.bin").write_bytes(b"x")
            digest = hashlib.sha256()
            with open(home / "big.bin", "wb") as handle:
                for _ in range(BIG // chunk):
                    block = os.urandom(chunk)
                    digest.update(block)
                    handle.write(block)
            digests[f"{s}-{w}"] = digest.hexdigest()

    def peak_kib(name: str) -> int:
        """The peak RSS of `tpuctl download --all` of `name` from every worker."""
        out = tmp_path / name.replace(".bin", "")
        command = [sys.executable, "-m", "tpuctl", "download", qr.name, name, str(out), "--all"]
        measured = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, *command],
            env=tpuctl.child_env(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert measured.returncode == 0, measured.stderr
        return int(measured.stdout.splitlines()[-1])

    tiny_kib, big_kib = peak_kib("tiny.bin"), peak_kib("big.bin")
    out = tmp_path / "big"
    try:
        assert sorted(p.name for p in out.iterdir()) == ["0-0", "0-1", "1-0", "1-1"]  # no .part
        for label, expected in digests.items():
            got = hashlib.sha256()
            with open(out / label / "big.bin", "rb") as handle:
                while block := handle.read(chunk):
                    got.update(block)
            assert got.hexdigest() == expected, label
        said = f"client peak RSS {big_kib / 1024:.0f} MiB, {tiny_kib / 1024:.0f} for 1 byte"
        print(said)
        assert big_kib - tiny_kib < 16 * 1024 and big_kib < 150 * 1024, said
    finally:
        for s in range(len(qr.node_ids)):
            for w in range(qr.workers_per_node):
                (qr.home(s, w) / "big.bin").unlink(missing_ok=True)
                (qr.home(s, w) / "tiny.bin").unlink(missing_ok=True)


def test_download_all_fails_only_the_worker_without_the_file(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    for s in range(len(qr.node_ids)):
        for w in range(qr.workers_per_node):
            if (s, w) != (1, 0):
                (qr.home(s, w) / "results").mkdir(parents=True, exist_ok=True)
                (qr.home(s, w) / "results" / "m.json").write_text(f'{{"w": "{s}/{w}"}}\n')
    out = tmp_path / "results-all"
    outcome = tpuctl("download", qr.name, "results", str(out), "--all", "--format", "json")
    assert outcome.exit_code == 3, outcome.stderr
    rows = by_label(outcome)
    assert rows["1/0"]["status"] == "failed"
    assert sorted(p.name for p in out.iterdir()) == ["0-0", "0-1", "1-1"]
    assert (out / "1-1" / "results" / "m.json").read_text() == '{"w": "1/1"}\n'
    assert outcome.json()["transfer"]["files"] == 6  # a directory and a file from each of 3
    one = tpuctl("download", qr.name, "results", str(tmp_path / "one"))  # worker 0/0 only
    assert one.exit_code == 0, one.stderr
    assert (tmp_path / "one" / "results" / "m.json").read_text() == '{"w": "0/0"}\n'


def test_download_says_each_workers_reason_and_no_empty_summary(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    missing = tpuctl("download", qr.name, "no-such-results", str(tmp_path / "none"))
    assert missing.exit_code == 3
    assert "downloaded" not in missing.stderr  # not "downloaded 0 entries", before the reason
    row = next(line for line in missing.stdout.splitlines() if line.startswith("0/0 "))
    assert "no-such-results: no such file or directory" in row, row
    assert "exited with" not in row  # the exit code has its column; the reason is the note

    qr.home(0, 1).mkdir(parents=True, exist_ok=True)  # made at a first login otherwise
    (qr.home(0, 1) / "some.txt").write_text("here\n")
    some = tpuctl("download", qr.name, "some.txt", str(tmp_path / "some"), "--all")
    assert some.exit_code == 3
    assert "downloaded 1 entries from 1 of 4 workers into" in some.stderr, some.stderr
    failed = [line for line in some.stdout.splitlines() if " FAILED " in line]
    assert len(failed) == 3 and all("no such file or directory" in line for line in failed)


def test_a_failed_commands_note_is_its_last_words_not_its_exit_code(
    tpuctl: Project, qr: QR
) -> None:
    files = str(tpuctl.home / "o")
    command = "echo working; echo 'disk full' >&2; exit 7"
    one = ("--node", "0", "--worker", "0")
    out = tpuctl("ssh", qr.name, *one, "--output-dir", files, "--", command)
    row = next(line for line in out.stdout.splitlines() if line.startswith("0/0 "))
    assert row.split()[1:3] == ["FAILED", "7"] and row.endswith("disk full"), row


def test_ps_shows_the_run_not_the_status_file(tpuctl: Project, qr: QR) -> None:
    started = tpuctl("ssh", qr.name, "--detach", "--", "echo first; echo 'last words'; sleep 30")
    assert started.exit_code == 0, started.stderr

    def logged() -> bool:
        rows = by_label(tpuctl("ps", qr.name, "--format", "json"))
        return all(row["detail"]["last_line"] == "last words" for row in rows.values())

    wait_for(logged, 15, "every run's last line")
    data = tpuctl("ps", qr.name, "--format", "json").json()
    for row in data["workers"]:
        assert row["detail"]["state"] == "running" and row["detail"]["started"].endswith("Z")
    table = tpuctl("ps", qr.name)  # a pipe: one line per row, whole values
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "WORKER",
        "RUN",
        "STATE",
        "PID",
        "STARTED",
        "EXIT",
        "LAST",
        "OUTPUT",
    ]
    rows = lines[1:5]
    assert len(rows) == 4 and all(row.endswith("last words") for row in rows)
    assert all(" running " in row and "state=" not in row for row in rows)
    tpuctl("stop", qr.name, "--grace", "1")
