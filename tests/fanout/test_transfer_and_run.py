"""upload to every worker, download from one, and `tpuctl run` (the multihost_runner flow)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.fanout.helpers import pid_alive
from tests.harness import QR, Project
from tests.support import wait_for


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_upload_is_byte_identical_on_every_worker(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    source = tmp_path / "code"
    (source / "pkg").mkdir(parents=True)
    (source / "train.py").write_text("print('hi')\n")
    (source / "pkg" / "weights.bin").write_bytes(os.urandom(200_000))
    (source / "name with 'quotes' $x.txt").write_text("odd\n")
    out = tpuctl("upload", qr.name, str(source), "~/up/code")
    assert out.exit_code == 0, out.stderr
    expected = _tree(source)
    for s in range(len(qr.node_ids)):
        for w in range(qr.workers_per_node):
            assert _tree(qr.home(s, w) / "up" / "code") == expected


def test_download_from_one_worker(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    home = qr.home(1, 1)
    (home / "results").mkdir(parents=True, exist_ok=True)
    (home / "results" / "metrics.json").write_text('{"loss": 1.5}\n')
    target = tmp_path / "got"
    out = tpuctl("download", qr.name, "--node", "1", "--worker", "1", "results", str(target))
    assert out.exit_code == 0, out.stderr
    assert (target / "results" / "metrics.json").read_text() == '{"loss": 1.5}\n'


def test_run_frees_the_tpu_and_starts_the_job(tpuctl: Project, qr: QR, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.sh").write_text('echo "job ran with GREETING=$GREETING in $(pwd)"\n')
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"apiVersion: tpuctl/v1\nname: {qr.name}\n"
        "tpu:\n  accelerator: v4-16\n  runtime: tpu-ubuntu2204-base\n  slices: 2\n"
        "job:\n  user: tester\n  workdir: ~/job\n  code: ./code\n"
        "  setup:\n    - echo setup-done > setup.marker\n"
        "  command: bash job.sh\n"
        '  env:\n    GREETING: "it\'s \\"quoted\\" $HOME `x`"\n'
    )
    vm = qr.vm_root(0, 0)
    lockfile = vm / "tmp" / "libtpu_lockfile"
    lockfile.write_text("")
    # A stale process holding the TPU device open on worker 0/0.
    holder = subprocess.Popen(
        ["bash", "-c", f"exec 3<{vm / 'dev' / 'accel0'}; exec sleep 120"],
        start_new_session=True,
    )
    try:
        wait_for(lambda: any(
            os.path.realpath(f"/proc/{holder.pid}/fd/{fd}") == str(vm / "dev" / "accel0")
            for fd in os.listdir(f"/proc/{holder.pid}/fd")
        ), 5, "the holder to open the device")  # fmt: skip
        out = tpuctl("run", str(spec), "--no-follow", "--format", "json")
        assert out.exit_code == 0, out.stderr
        holder.wait(timeout=10)  # killed by the run
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert not lockfile.exists()
    data = out.json()
    run_id = data["run"]
    home = qr.home(0, 0)
    assert (home / "job" / "setup.marker").read_text() == "setup-done\n"
    log = home / ".tpuctl" / "runs" / f"{run_id}.log"
    wait_for(lambda: log.exists() and "job ran" in log.read_text(), 10, "the job's output")
    assert 'GREETING=it\'s "quoted" $HOME `x` in ' in log.read_text()
    assert log.read_text().strip().endswith("/job")
    assert not pid_alive(holder.pid)


def test_run_follows_the_log_on_stdout_and_puts_its_table_on_stderr(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    spec = tmp_path / "short.yaml"
    spec.write_text(
        f"apiVersion: tpuctl/v1\nname: {qr.name}\n"
        "tpu:\n  accelerator: v4-16\n  runtime: tpu-ubuntu2204-base\n  slices: 2\n"
        "job:\n  user: tester\n  command: echo short job ran; sleep 1\n"
    )
    out = tpuctl("run", str(spec))
    assert out.exit_code == 0, out.stderr
    assert out.stdout.splitlines() == ["[0/0] short job ran"], (out.stdout, out.stderr)
    assert "WORKER  STATUS" in out.stderr


def test_an_upload_nowhere_says_why_per_worker_and_claims_nothing(
    tpuctl: Project, qr: QR, tmp_path: Path
) -> None:
    for s in range(len(qr.node_ids)):
        for w in range(qr.workers_per_node):
            qr.home(s, w).mkdir(parents=True, exist_ok=True)
            (qr.home(s, w) / "blocker").write_text("a file, not a directory\n")
    source = tmp_path / "code"
    source.mkdir()
    (source / "a.txt").write_text("a\n")
    out = tpuctl("upload", qr.name, str(source), "~/blocker/code")
    assert out.exit_code == 3
    assert "uploaded" not in out.stderr, out.stderr  # nothing was
    rows = [line for line in out.stdout.splitlines() if " FAILED " in line]
    assert len(rows) == 4 and all("Not a directory" in row for row in rows), out.stdout
