"""job.target_step and job.code as a local file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tpuctl.errors import SpecError
from tpuctl.spec.fields import field_at
from tpuctl.spec.load import LoadedSpec, load_spec, resolve_code_path
from tpuctl.spec.schema import json_schema

Load = Callable[..., LoadedSpec]
SpecErrorOf = Callable[..., SpecError]
CHECKPOINT = "checkpoint:\n  dir: gs://bucket/runs\n"


def test_target_step_loads_with_a_checkpoint_dir(load: Load, minimal: str) -> None:
    spec = load(minimal + CHECKPOINT + "job:\n  command: x\n  target_step: 500\n").spec
    assert spec.job is not None and spec.job.target_step == 500
    assert load(minimal + "job:\n  command: x\n").spec.job.target_step is None  # type: ignore[union-attr]


def test_target_step_needs_a_checkpoint_dir(spec_error: SpecErrorOf, minimal: str) -> None:
    error = spec_error(minimal + "job:\n  command: x\n  target_step: 500\n")
    assert error.path == "job.target_step"
    assert "checkpoint directory" in str(error)
    assert error.location is not None and error.location.line == 8


def test_target_step_must_be_a_positive_integer(spec_error: SpecErrorOf, minimal: str) -> None:
    for value, words in (("0", "at least 1"), ("true", "integer"), ("'5'", "integer")):
        error = spec_error(minimal + CHECKPOINT + f"job:\n  command: x\n  target_step: {value}\n")
        assert error.path == "job.target_step"
        assert words in str(error), str(error)


def test_target_step_is_documented_in_the_field_table() -> None:
    field = field_at("job.target_step")
    assert field is not None and field.minimum == 1 and "checkpoint.dir" in field.doc
    job = json_schema()["properties"]["job"]["properties"]
    assert job["target_step"]["type"] == "integer" and job["target_step"]["minimum"] == 1


def test_code_may_be_a_local_file_next_to_the_spec(tmp_path: Path, minimal: str) -> None:
    (tmp_path / "scripts").mkdir()
    trainer = tmp_path / "scripts" / "train.py"
    trainer.write_text("print('hi')\n")
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "spec.yaml"
    path.write_text(minimal + "job:\n  command: python3 train.py\n  code: ../scripts/train.py\n")
    loaded = load_spec(path)
    assert loaded.warnings == ()
    assert resolve_code_path(loaded.spec) == trainer.resolve()
