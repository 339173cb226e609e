"""`tpuctl reconcile`'s one run or every run (--all), `tpuctl runs` and `up --supervise`:
what goes together and what does not, refused with exit 2 and the fix, before anything is
read or sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import invoke


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["reconcile"], "give SPEC, or --all"),
        (["reconcile", "--all"], "--all needs --bucket or --project"),
        (["reconcile", "--all", "job.yaml", "--bucket", "gs://b"], "SPEC, --set, --zone"),
        (["reconcile", "--all", "--bucket", "gs://b", "--zone", "z"], "SPEC, --set, --zone"),
        (["reconcile", "--all", "--bucket", "gs://b", "--set", "a=b"], "SPEC, --set, --zone"),
        (["reconcile", "job.yaml", "--bucket", "gs://b"], "--bucket goes with --all"),
        (["runs"], "needs --bucket or --project"),
        (["supervise", "job.yaml", "--on", "kubernetes", "--install"], "not kubernetes"),
        (["supervise", "job.yaml", "--on", "cron", "--install", "--output-dir", "d"],
         "exclude one another"),
    ],
)  # fmt: skip
def test_what_does_not_go_together_is_refused(
    args: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(
        "apiVersion: tpuctl/v1\nname: job\nzone: us-central2-b\nproject: p\n"
        "tpu:\n  accelerator: v4-8\n  runtime: tpu-ubuntu2204-base\n"
        "checkpoint:\n  dir: gs://b/job\njob:\n  command: 'true'\n"
    )
    outcome = invoke(args)
    assert outcome.exit_code == 2, outcome.stderr
    assert said in outcome.stderr


def test_runs_under_a_location_without_runs_says_so(tmp_path: Path) -> None:
    outcome = invoke(["runs", "--bucket", str(tmp_path)])
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout == f"no runs in {tmp_path}\n"
    steps = invoke(["reconcile", "--all", "--bucket", str(tmp_path), "--format", "json"])
    assert steps.exit_code == 0, steps.stderr
    assert steps.json()["runs"] == [] and steps.json()["code"] == 0
