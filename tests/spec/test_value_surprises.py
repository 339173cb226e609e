"""Values that YAML or a lax check would turn into something else without a word: a null that
became the default, 010 that became 8, a zone with a newline, a deadline already gone. Each is
an error at file:line with the dotted field and what to write instead."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

from tpuctl.errors import ExitCode, SourceLocation, SpecError
from tpuctl.spec.load import LoadedSpec, load_spec_text

SpecErrorOf = Callable[..., SpecError]
Load = Callable[..., LoadedSpec]


def _override_error(minimal: str, override: str) -> SpecError:
    with pytest.raises(SpecError) as raised:
        load_spec_text(minimal, overrides=[override])
    assert raised.value.exit_code is ExitCode.USAGE
    return raised.value


# --- null is not "the default" ----------------------------------------------------------------


@pytest.mark.parametrize("written", ["slices: null", "slices:", "slices: ~", "slices: ${EMPTY}"])
def test_a_null_integer_is_an_error_not_the_default(
    spec_error: SpecErrorOf, minimal: str, written: str
) -> None:
    error = spec_error(minimal + f"  {written}\n", environ={"EMPTY": ""})
    assert error.path == "tpu.slices"
    assert error.location is not None and error.location.line == 6
    line = error.one_line()
    assert "has no value" in line
    assert "the default is 1" in line and "leave the key out" in line


@pytest.mark.parametrize("section", ["capacity", "job", "deadlines"])
def test_an_empty_section_is_an_error(spec_error: SpecErrorOf, minimal: str, section: str) -> None:
    error = spec_error(minimal + f"{section}:\n")
    assert error.path == section and "has no value" in error.message


def test_an_empty_override_is_an_error_not_the_default(minimal: str) -> None:
    error = _override_error(minimal + "  slices: 3\n", "tpu.slices=")
    assert error.path == "tpu.slices"
    assert error.location == SourceLocation("--set tpu.slices=")
    assert "has no value" in error.message and "the default is 1" in (error.hint or "")


def test_null_in_a_list_or_map_is_still_an_error(spec_error: SpecErrorOf, minimal: str) -> None:
    assert spec_error(minimal + "  tags: [a, null]\n").path == "tpu.tags[1]"
    assert spec_error(minimal + "job:\n  command: x\n  env: {A: null}\n").path == "job.env.A"


# --- integers are decimal -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "reading"),
    [("010", "8"), ("0o10", "8"), ("0x10", "16"), ("0b10", "2"), ("1:30", "90"), ("-010", "-8")],
)
def test_an_integer_field_refuses_other_bases(
    spec_error: SpecErrorOf, minimal: str, written: str, reading: str
) -> None:
    error = spec_error(minimal + f"  slices: {written}\n")
    assert error.path == "tpu.slices"
    assert error.location is not None and error.location.line == 6
    assert f"{written!r} is not a decimal integer" in error.message
    assert reading in error.message  # what YAML 1.1 would have made of it
    assert "write it in decimal" in (error.hint or "")


def test_an_override_in_another_base_is_an_error(minimal: str) -> None:
    error = _override_error(minimal, "tpu.slices=010")
    assert error.path == "tpu.slices"
    assert error.location == SourceLocation("--set tpu.slices=010")
    assert "'010' is not a decimal integer" in error.message


def test_decimal_integers_still_read(load: Load, minimal: str) -> None:
    assert load(minimal + "  slices: 4\n").spec.tpu.slices == 4
    assert load_spec_text(minimal, overrides=["tpu.slices=+2"]).spec.tpu.slices == 2
    assert load(minimal + "recovery: {max_failures: 0}\n").spec.recovery.max_failures == 0


def test_a_string_value_keeps_what_was_written(load: Load, minimal: str) -> None:
    spec = load(minimal + "job:\n  command: x\n  env: {MODE: 010, MASK: 0x1F}\n").spec
    assert spec.job is not None
    assert spec.job.env == {"MODE": "010", "MASK": "0x1F"}


# --- project and zone in their real formats ------------------------------------------------------


@pytest.mark.parametrize(
    "zone", ['"us-central2-b\\n"', '"us-central2-b\\nrm -rf ~"', "us_central2_b", "z", "US-EAST1-D"]
)
def test_a_zone_that_cannot_be_one_is_an_error(
    spec_error: SpecErrorOf, minimal: str, zone: str
) -> None:
    error = spec_error(minimal + f"zone: {zone}\n")
    assert error.path == "zone"
    assert error.location is not None and error.location.line == 6
    line = error.one_line()
    assert "is not a valid zone" in line and "us-central2-b" in line
    assert "\n" not in line


@pytest.mark.parametrize(
    "project",
    [
        '"$(touch /tmp/owned)"',
        "my_project",
        "short",
        "1project",
        "my-project-",
        "a" * 31,
        "P-roject",
        '"my-project\\n"',
        "example.com:x",
    ],
)
def test_a_project_that_cannot_be_one_is_an_error(
    spec_error: SpecErrorOf, minimal: str, project: str
) -> None:
    error = spec_error(minimal + f"project: {project}\n")
    assert error.path == "project"
    line = error.one_line()
    assert "is not a valid project" in line
    assert "6 to 30" in line and "example.com:my-project" in line


@pytest.mark.parametrize(
    ("project", "zone"),
    [
        ("my-project", "us-central2-b"),
        ("example.com:my-project", "northamerica-northeast1-a"),
        ("a" * 30, "europe-west4-a"),
        ("proj-1", "me-central2-a"),
    ],
)
def test_real_projects_and_zones_load(load: Load, minimal: str, project: str, zone: str) -> None:
    spec = load(minimal + f"project: {project}\nzone: {zone}\n").spec
    assert (spec.project, spec.zone) == (project, zone)


# --- a queueing deadline already gone ----------------------------------------------------------

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=timezone.utc)


def test_a_valid_until_in_the_past_says_how_long_ago(spec_error: SpecErrorOf, minimal: str) -> None:
    text = minimal + "capacity:\n  tier: spot\n  valid_until: 2030-05-30T09:00:00Z\n"
    error = spec_error(text, now=NOW)
    assert error.path == "capacity.valid_until"
    assert error.location is not None and error.location.line == 8
    line = error.one_line()
    assert "2030-05-30T09:00:00Z" in line and "2d03h ago" in line
    assert "a later time" in line and "6h" in line


def test_a_valid_until_in_the_future_or_relative_is_fine(load: Load, minimal: str) -> None:
    later = (NOW + timedelta(minutes=5)).isoformat()
    for bound in (later, "6h"):
        text = minimal + f"capacity:\n  tier: spot\n  valid_until: {bound}\n"
        assert load(text, now=NOW).spec.capacity.valid_until is not None


def test_without_a_time_the_deadline_is_not_judged(load: Load, minimal: str) -> None:
    # Commands that look at an existing queued resource (status, logs, delete) load its spec
    # long after it was queued: a deadline that has passed is no mistake there.
    text = minimal + "capacity:\n  tier: spot\n  valid_until: 2020-01-01T00:00:00Z\n"
    assert load(text).spec.capacity.valid_until == datetime(2020, 1, 1, tzinfo=timezone.utc)
