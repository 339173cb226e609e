"""A real cron daemon runs what `tpuctl supervise --on cron` renders: installed with the printed
commands (the step script into the state directory, the lines with the real `crontab`), it
starts the step at the minute and again 15 s into it, with the environment the script
carries, appends the step's output to the log, and the printed remove commands take it out
again. The step here is a recorder standing in for `tpuctl reconcile`
(passed as --tpuctl): it writes down its arguments and environment and exits 12, in progress."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cron import CronDaemon, skip_reason
from tests.support import invoke, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]

RECORDER = """#!/bin/sh
# Stands in for tpuctl: one JSON line per call (the environment as this shell got it), then
# "in progress".
python3 - "$HOME" "${{SUPERVISE_MARK:-}}" "$PATH" "$@" <<'PY' >>"{record}"
import json, os, sys
home, mark, path, *argv = sys.argv[1:]
preload = os.environ.get("LD_PRELOAD", "")
print(json.dumps({{"argv": argv, "home": home, "mark": mark, "path": path, "preload": preload}}))
PY
echo "step output from the recorder"
exit 12
"""


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_cron_runs_the_rendered_line_every_15_seconds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    record = tmp_path / "record.jsonl"
    recorder = tmp_path / "recorder.sh"
    recorder.write_text(RECORDER.format(record=record), encoding="utf-8")
    recorder.chmod(0o755)
    spec = tmp_path / "cronrun.yaml"
    spec.write_text(
        "apiVersion: tpuctl/v1\nname: cronrun\nproject: my-project\nzone: us-central2-b\n"
        "tpu:\n  accelerator: v4-8\n  runtime: tpu-ubuntu2204-base\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    env = {"HOME": str(home), "XDG_STATE_HOME": None, "PATH": os.environ["PATH"]}
    outcome = invoke(
        [
            "supervise",
            str(spec),
            "--on",
            "cron",
            "--every",
            "15s",
            "--tpuctl",
            str(recorder),
            "--env",
            "SUPERVISE_MARK=from-the-line",
            "--output-dir",
            str(out),
            "--format",
            "json",
        ],
        env,
    )
    assert outcome.exit_code == 0, outcome.stderr
    document = outcome.json()
    state = home / ".local" / "state" / "tpuctl" / "supervise"
    log = state / "tpuctl-reconcile-cronrun.log"

    with CronDaemon(tmp_path / "cron") as cron:
        for command in document["install"]:  # the step script into place, then the crontab
            cron.run(command)
        installed = cron.crontab()
        assert installed.count("# tpuctl-reconcile-cronrun\n") == 4, installed
        # The first firing at the minute, the next 15 s into it (the line sleeps).
        first = cron.wait_for(lambda: records(record)[:1], what="the first step", firings=1)
        both = cron.wait_for(
            lambda: records(record)[1:2] and records(record), what="the 15 s step", offset=15
        )
        for command in document["remove"]:
            cron.run(command)
        assert cron.crontab().strip() == ""
        assert not (state / "tpuctl-reconcile-cronrun.sh").exists()

    assert first[0]["argv"] == ["reconcile", str(spec)]
    for step in both:
        assert step["argv"] == ["reconcile", str(spec)]
        assert step["mark"] == "from-the-line"
        # cron's own HOME is root's and its PATH /usr/bin:/bin: the line carries this one's.
        assert step["home"] == str(home)
        assert step["path"] == os.environ["PATH"]
        assert step["preload"] == ""  # the daemon's shifted clock (cron.py) is not the job's
    assert log.read_text(encoding="utf-8").count("step output from the recorder\n") >= 2


def test_cron_takes_a_detached_run_to_its_end(make_job: Any, tmp_path: Path) -> None:
    """`tpuctl up --detach` gets the job running and hands it over with the exact `tpuctl
    supervise` command to run; that command (asked to step every 5 s), run in cron's
    namespace, installs the step, and a real cron daemon runs real `tpuctl reconcile` steps
    (with the options up was given, which the run keeps) until the run is done and nothing is
    left. cron fires at minute boundaries: the whole test takes about a minute and a half."""
    import sys
    import time

    from tests.e2e.conftest import FAST_UP

    started = time.monotonic()
    job = make_job(steps=40, slices=1, accelerator="v4-8", conventionless=True)
    outcome = job.cli("up", str(job.spec), *FAST_UP, "--settle", "2", "--no-preflight",
                      "--detach", "--format", "json")  # fmt: skip
    assert outcome.exit_code == 0, outcome.stderr
    document = outcome.json()
    assert document["outcome"] == "detached" and job.qr_exists()
    handover = document["supervisor"]
    assert handover["command"] == f"tpuctl supervise {job.spec} --on cron --install"
    assert not handover["installed"] and "run.done" not in job.journal_kinds()

    environ = job.child_env()
    environ["PATH"] = f"{Path(sys.executable).parent}:{environ['PATH']}"  # where tpuctl is
    with CronDaemon(tmp_path / "cron") as cron:
        installed = cron.run(f"{handover['command']} --every 5s", env=environ)
        assert "installed: tpuctl-reconcile-" in installed.stderr, installed.stderr
        assert cron.crontab().count(f"# tpuctl-reconcile-{job.name}\n") == 12
        cron.wait_for(
            lambda: "run.done" in job.journal_kinds(), what="the run to be done", firings=2
        )
        # Read while the daemon runs: stopping it kills a step it may have just started, and
        # that step's shell then adds "Killed" to the log (the test's doing, not the run's).
        log = Path(environ["HOME"]) / ".local/state/tpuctl/supervise"
        said = wait_for(
            lambda: _ends_done(log / f"tpuctl-reconcile-{job.name}.log", job.name),
            60,
            "the step that saw the run done to say so",
        )
    sys.stderr.write(f"up --detach to done under cron: {time.monotonic() - started:.0f} s\n")
    kinds = job.journal_kinds()
    assert kinds.count("job.started") == 1 and "job.failed" not in kinds, kinds
    assert not job.qr_exists()
    assert (job.checkpoint_dir / "final.json").read_bytes() == job.uninterrupted_final(tmp_path)
    runs = job.cli("runs", "--bucket", str(job.project.tmp_path), "--format", "json").json()
    [row] = runs["runs"]
    assert row["state"] == "done" and row["last_reconciled"]["by"] == "reconcile", row
    assert "the job ended on every worker" in said and said.endswith(f"{job.name}: done\n")


def _ends_done(log: Path, name: str) -> str:
    """The step log's text once its last line says the run is done, else ""."""
    try:
        text = log.read_text()
    except FileNotFoundError:
        return ""
    return text if text.endswith(f"{name}: done\n") else ""
