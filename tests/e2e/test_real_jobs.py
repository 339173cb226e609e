"""End to end: the jobs people really bring, under `tpuctl up` in the emulator.

A trainer that prints nothing tpuctl parses, writes no done marker, has no target_step and keeps
its checkpoints where its own flags say: `up` decides it is done from every worker's exit and
the nodes' calm, and a maintenance SIGTERM it answers by saving and exiting 0 is never taken for
the end. A Pax-style pipeline gets its flags where the command marks them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_output_contract import check
from tests.e2e.conftest import Job
from tests.harness import ZONE, Project
from tests.support import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


def test_a_trainer_that_just_exits_0_is_resumed_after_a_preemption_and_ends_up(
    make_job: Callable[..., Job], emulator: Any, tmp_path: Path
) -> None:
    job = make_job(steps=200, checkpoint_every=10, conventionless=True, max_preemptions=2)
    job.start_up()
    wait_for(lambda: any(step >= 30 for step in job.complete_steps()), what="steps 30+")
    emulator.admin.preempt(
        f"projects/{job.env['TPUCTL_PROJECT']}/locations/{ZONE}/queuedResources/{job.name}"
    )
    code, log = job.wait_up(timeout=180)
    assert code == 0, log
    # Resumed from its own checkpoints, and the result is that of a run never interrupted.
    final = (job.checkpoint_dir / "final.json").read_bytes()
    assert final == job.uninterrupted_final(tmp_path)
    assert json.loads(final)["history"] == [[1, job.steps]]
    assert not job.qr_exists()
    # Done was decided by up, from the exits and a calm settle period, and recorded.
    done = [entry for entry in job.journal() if entry.kind == "job.done"]
    assert len(done) == 1, job.journal_kinds()
    assert "every worker of every slice exited 0" in str(done[0].fields.get("reason"))
    assert job.journal_kinds().count("qr.recreated") == 1
    assert "job.failed" not in job.journal_kinds()
    from tpuctl.spec.load import load_spec
    from tpuctl.storage.checkpoints import is_done

    assert is_done(load_spec(str(job.spec)).spec)  # the marker, for the next `up` or boot


def test_an_autocheckpoint_exit_0_is_a_disruption_not_the_end(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(
        steps=400,
        slices=1,
        accelerator="v4-8",
        checkpoint_every=25,
        conventionless=True,
        elsewhere=False,
    )
    job.start_up()
    job.wait_running()
    outcome = job.cli("drill", str(job.spec), "--format", "json", "--timeout", "120")
    assert outcome.exit_code == 0, outcome.stdout + outcome.stderr
    report = outcome.json()
    check(report, "drill")
    # No step lines: the drill read progress from the committed checkpoints instead.
    assert report["progress_from"] == "checkpoints"
    saved = report["step_at_event"]
    # The state at the event was committed: usually off the period, by the save on the
    # SIGTERM. One event in 25 lands during a step that ends on the period: that step's
    # periodic save then holds it (the save on the SIGTERM finds it committed). That the
    # trainer saves on the SIGTERM is seen in its log in test_drills.py's maintenance test.
    assert isinstance(saved, int) and 0 < saved < job.steps
    assert report["resumed_from"] == saved and report["recomputed_steps"] == 0
    code, log = job.wait_up(timeout=180)
    assert code == 0, log
    kinds = job.journal_kinds()
    assert kinds.count("job.done") == 1
    assert kinds.index("job.relaunched") < kinds.index("job.done")  # not done at the SIGTERM
    assert json.loads((job.checkpoint_dir / "final.json").read_text())["step"] == job.steps
    assert not job.qr_exists()


PAX_STAND_IN = '''\
"""Records its argv and identity, like paxml/main.py would start from them; prints a line."""
import json, os, sys
record = os.path.join(os.environ["ARGV_RECORD"], "%s-%s.json" % (
    os.environ["TPUCTL_SLICE_ID"], os.environ["TPUCTL_WORKER_ID"]))
with open(record, "w") as handle:
    json.dump(sys.argv[1:], handle)
print("pax stand-in ran with %d flags" % (len(sys.argv) - 1))
'''


def test_a_pax_pipeline_gets_its_flags_where_the_command_marks_them(
    project: Project, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "paxml").mkdir(parents=True)
    (code / "paxml" / "main.py").write_text(PAX_STAND_IN, encoding="utf-8")
    record = tmp_path / "argv"
    record.mkdir()
    record.chmod(0o777)
    checkpoints = tmp_path / "ckpt"
    command = (
        "{ python3 paxml/main.py --exp=tasks.lm.params.c4.C4SpmdGpt3AdamOrgHP {flags}; } "
        "2>&1 | tee pax_logs.txt"
    )
    name = "pax-pipe"

    def document(spec_name: str, line: str) -> dict[str, Any]:
        return {
            "name": spec_name,
            "tpu": {"accelerator": "v4-16", "runtime": "tpu-ubuntu2204-base", "slices": 2},
            "checkpoint": {"dir": str(checkpoints), "autocheckpoint": True},
            "job": {
                "framework": "pax",
                "code": str(code),
                "command": line,
                "env": {"ARGV_RECORD": str(record)},
            },
        }

    spec = project.write_spec(document(name, command))
    valid = project.cli("validate", str(spec))
    assert valid.exit_code == 0, valid.stderr
    unmarked = project.write_spec(document("pax-unmarked", command.replace(" {flags}", "")))
    refused = project.cli("validate", str(unmarked))
    assert refused.exit_code == 2
    assert "job.command" in refused.stderr and "{flags}" in refused.stderr

    fast = ("--poll", "0.5", "--job-check-every", "1", "--settle", "1")
    up = project.cli("up", str(spec), *fast, "--keep")  # keep the disks to read tee's file
    assert up.exit_code == 0, up.stderr
    recorded = {path.stem: json.loads(path.read_text()) for path in record.iterdir()}
    assert sorted(recorded) == ["0-0", "0-1", "1-0", "1-1"]
    indices = set()
    for label, argv in recorded.items():
        flags = dict(arg.split("=", 1) for arg in argv)
        assert flags["--exp"] == "tasks.lm.params.c4.C4SpmdGpt3AdamOrgHP"  # the user's own
        assert flags["--job_log_dir"] == str(checkpoints)
        assert flags["--jax_fully_async_checkpoint"] == "1"
        assert flags["--exit_after_ondemand_checkpoint"] == "1"
        assert flags["--num_hosts"] == "4"
        host, _, port = flags["--server_addr"].rpartition(":")
        assert host and port.isdigit(), flags
        indices.add(flags["--host_idx"])
        assert len(argv) == 7, (label, argv)  # nothing went to tee
    assert indices == {"0", "1", "2", "3"}
    # tee got the program's output in the workdir: the pipeline ran as written.
    logs = list(Path(project.emulator.state_dir).glob(f"vms/{name}-*/*/home/*/**/pax_logs.txt"))
    assert len(logs) == 4 and all("pax stand-in ran with 7 flags" in p.read_text() for p in logs)
    assert shlex.split(command)  # the command stays a valid shell line
