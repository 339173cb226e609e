"""`tpuctl checkpoints` through CliRunner and the CLI's error boundary: table, JSON, exit codes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.storage.helpers import FakeGcs, GcsLayout, LocalLayout, metadata_json
from tests.support import invoke

SECOND = 1_000_000_000


def make_layout(layout: LocalLayout | GcsLayout) -> None:
    base = time.time_ns() - 3600 * SECOND
    for step, seconds in ((100, 2.5), (200, 1.5)):
        start = base + step * SECOND
        layout.put(f"{step}/default/array", "data")
        layout.put(
            f"{step}/_CHECKPOINT_METADATA", metadata_json(start, start + int(seconds * SECOND))
        )
        layout.put(f"{step}/commit_success.txt", "ok")
    layout.put("150.orbax-checkpoint-tmp-1700000000/default/array", "partial")
    layout.put("300.orbax-checkpoint-tmp/default/array", "partial")


def test_table(tmp_path: Path) -> None:
    layout = LocalLayout(tmp_path / "ckpt")
    layout.put("250/default/array", "an old Orbax save, no commit file")
    make_layout(layout)  # the tmp folders come later: 300 is newer than every commit
    outcome = invoke(["checkpoints", layout.url])
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stdout.splitlines()
    assert lines[0] == f"{layout.url} (local)"
    assert lines[1].split() == ["STEP", "NAME", "COMPLETE", "COMMITTED", "SAVE", "NOTES"]
    rows = {line.split()[0]: line for line in lines[2:] if line.split()[0].isdigit()}
    assert set(rows) == {"100", "150", "200", "250", "300"}
    assert "yes" in rows["100"] and "2.5s" in rows["100"]
    assert "1.5s" in rows["200"]
    assert "stale tmp folder" in rows["150"]
    assert "save in progress?" in rows["300"]
    assert "no commit_success.txt" in rows["250"]
    assert "latest complete step: 250" in lines
    assert "unfinished saves: none" in lines
    assert "stale tmp folders: 150.orbax-checkpoint-tmp-1700000000" in lines
    assert outcome.stderr == ""


def test_json(tmp_path: Path) -> None:
    layout = LocalLayout(tmp_path / "ckpt")
    make_layout(layout)
    outcome = invoke(["checkpoints", layout.url, "--format", "json"])
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert data["url"] == layout.url and data["storage"] == "local"
    assert data["latest_step"] == 200
    assert data["complete_steps"] == [100, 200]
    assert data["unfinished_steps"] == []
    assert data["stale_tmp_folders"] == ["150.orbax-checkpoint-tmp-1700000000"]
    assert [step["save_seconds"] for step in data["steps"]] == [2.5, 1.5]
    assert data["steps"][0]["committed_at"].endswith("Z")
    assert [(tmp["step"], tmp["stale"]) for tmp in data["tmp_folders"]] == [
        (150, True),
        (300, False),
    ]
    # The global option works as well.
    again = json.loads(invoke(["--format", "json", "checkpoints", layout.url]).stdout)
    assert again["steps"] == data["steps"] and again["tmp_folders"] == data["tmp_folders"]


def test_missing_directory_exits_5(tmp_path: Path) -> None:
    outcome = invoke(["checkpoints", str(tmp_path / "nope")])
    assert outcome.exit_code == 5
    assert invoke(["checkpoints", str(tmp_path), "--set", "job.run_name=x"]).exit_code == 2
    assert outcome.stdout == ""
    assert "does not exist" in outcome.stderr
    as_json = invoke(["checkpoints", str(tmp_path / "nope"), "--format", "json"])
    assert as_json.exit_code == 5
    assert json.loads(as_json.stdout)["error"]["kind"] == "not_found"


SPEC = """\
apiVersion: tpuctl/v1
name: demo
tpu: {{accelerator: v4-8, runtime: tpu-ubuntu2204-base}}
job:
  command: python3 -m MaxText.train
  framework: maxtext
  run_name: exp1
{checkpoint}"""


def test_spec_without_checkpoint_dir_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(checkpoint=""))
    outcome = invoke(["checkpoints", str(spec)])
    assert outcome.exit_code == 2
    assert "checkpoint.dir" in outcome.stderr and "no checkpoint directory" in outcome.stderr


def test_spec_reads_the_framework_checkpoint_root(tmp_path: Path) -> None:
    base = tmp_path / "out"
    layout = LocalLayout(base / "exp1" / "checkpoints")  # MaxText's <dir>/<run_name>/checkpoints
    make_layout(layout)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(checkpoint=f"checkpoint: {{dir: {base}}}\n"))
    outcome = invoke(["checkpoints", str(spec), "--format", "json"])
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert data["url"] == layout.url and data["latest_step"] == 200
    # --set overrides the spec like everywhere else; a missing root is exit 5.
    missing = invoke(["checkpoints", str(spec), "--set", "job.run_name=other"])
    assert missing.exit_code == 5
    assert str(base / "other" / "checkpoints") in missing.stderr


def test_gcs_url(fake_gcs: FakeGcs, gcs_bucket: str) -> None:
    layout = GcsLayout(fake_gcs.client(), gcs_bucket, "exp1/checkpoints")
    make_layout(layout)
    layout.put("250/default/array", "being written straight into the step folder")
    env = {"STORAGE_EMULATOR_HOST": fake_gcs.url}
    outcome = invoke(["checkpoints", layout.url, "--format", "json"], env=env)
    assert outcome.exit_code == 0, outcome.stderr
    data = json.loads(outcome.stdout)
    assert data["storage"] == "gcs"
    assert data["latest_step"] == 200 and data["unfinished_steps"] == [250]
    table = invoke(["checkpoints", layout.url], env=env)
    assert "unfinished saves: 250" in table.stdout.splitlines()
    missing = invoke(["checkpoints", f"gs://{gcs_bucket}/nothing/here"], env=env)
    assert missing.exit_code == 5
