"""The job's shared journal: one JSON object per entry beside the checkpoints, local or gs://."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpuctl.errors import UsageError
from tpuctl.spec.model import CheckpointSpec, JobSpec, Spec, TpuSpec
from tpuctl.storage.journal import Journal


def _spec(checkpoint_dir: str | None, run_name: str = "llama-7b") -> Spec:
    return Spec(
        name="journal-demo",
        tpu=TpuSpec(accelerator="v4-8", runtime="tpu-ubuntu2204-base"),
        checkpoint=CheckpointSpec(dir=checkpoint_dir),
        job=JobSpec(command="true", run_name=run_name),
    )


def _exercise(spec: Spec) -> None:
    """What every backend must do: ordered entries, seen by another writer, fields kept."""
    first = Journal(spec, hostname="laptop")
    other = Journal(spec, hostname="ci runner #7")  # cleaned into a name-safe host
    assert first.enabled and first.entries() == []
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    written = [
        first.append("qr.created", name="q1", slices=2, at=at),
        other.append("job.started", workers=[0, 1], note='ünïcødé "quoted"\nline'),
        first.append("qr.preempted", count=1, reason=None),
    ]
    entries = Journal(spec).entries()
    assert [entry.kind for entry in entries] == ["qr.created", "job.started", "qr.preempted"]
    assert [entry.name for entry in entries] == [entry.name for entry in written]
    assert entries[0].fields == {"name": "q1", "slices": 2, "at": "2026-01-02T03:04:05.000000Z"}
    assert entries[1].fields["note"] == 'ünïcødé "quoted"\nline'
    assert entries[1].host == "ci-runner-7" and entries[0].host == "laptop"
    assert entries[0].timestamp <= entries[1].timestamp <= entries[2].timestamp
    assert entries[0].timestamp.tzinfo is timezone.utc
    assert [e.kind for e in first.entries(kind="qr.preempted")] == ["qr.preempted"]


def test_local_journal_lives_beside_the_checkpoints(tmp_path: Path) -> None:
    spec = _spec(str(tmp_path / "ckpt"))
    _exercise(spec)
    folder = tmp_path / "ckpt" / "tpuctl" / "llama-7b" / "journal"
    names = sorted(path.name for path in folder.iterdir())
    assert len(names) == 3 and all(name.endswith(".json") for name in names)
    document = json.loads((folder / names[0]).read_text())
    assert document["kind"] == "qr.created" and document["version"] == 1
    # Something that is not an entry (a stray file, a writer's temp file) is skipped.
    (folder / ".tmp-half-written").write_text("{")
    (folder / "notes.txt").write_text("hello")
    assert len(Journal(spec).entries()) == 3


def test_gcs_journal(gcs_bucket: str) -> None:
    """Against fake-gcs-server (tests/resume's fixture) through google-cloud-storage."""
    _exercise(_spec(f"gs://{gcs_bucket}/runs"))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    journal = Journal(_spec(str(tmp_path)), hostname="same-host")

    def write(thread: int) -> None:
        for index in range(20):
            journal.append("tick", thread=thread, index=index)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = journal.entries()
    assert len(entries) == 100
    assert len({entry.name for entry in entries}) == 100
    for thread in range(5):  # each writer's own entries stay in order
        mine = [e.fields["index"] for e in entries if e.fields["thread"] == thread]
        assert mine == list(range(20))


def test_without_checkpoint_dir_the_journal_is_disabled(tmp_path: Path) -> None:
    journal = Journal(_spec(None))
    assert not journal.enabled and journal.url is None
    entry = journal.append("qr.created", name="q1")
    assert entry.kind == "qr.created" and entry.fields == {"name": "q1"}
    assert journal.entries() == []
    with pytest.raises(UsageError):
        _ = journal.storage


def test_bad_kinds_and_values_are_usage_errors(tmp_path: Path) -> None:
    journal = Journal(_spec(str(tmp_path)))
    for kind in ("", "Has Spaces", "x" * 80):
        with pytest.raises(UsageError):
            journal.append(kind)
    with pytest.raises(UsageError):
        journal.append("ok", value=object())
    assert journal.entries() == []
