"""Every spec problem is a SpecError (exit 2) naming the file, line, column, key and the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from tpuctl.errors import ExitCode, SourceLocation, SpecError, SpecErrors
from tpuctl.spec.load import load_spec, load_spec_text

HEAD = """\
apiVersion: tpuctl/v1
name: demo
tpu:
  accelerator: v4-16
  runtime: tpu-ubuntu2204-base
"""  # lines 1-5; a case's own lines start at line 6


class Case(NamedTuple):
    text: str
    path: str | None
    line: int
    column: int
    message: str  # a fragment of the message
    hint: str | None  # a fragment of the hint (the fix)


CASES: dict[str, Case] = {
    # --- YAML itself ---
    "yaml-syntax": Case(
        "apiVersion: tpuctl/v1\nname: [demo\ntpu: {}\n", None, 3, 4, "invalid YAML", "quote"
    ),
    "yaml-tab": Case("apiVersion: tpuctl/v1\n\tname: demo\n", None, 2, 1, "invalid YAML", "tabs"),
    "yaml-two-documents": Case(HEAD + "---\nname: x\n", None, 6, 1, "invalid YAML", None),
    "duplicate-key": Case(
        HEAD + "  accelerator: v4-8\n",
        "tpu.accelerator",
        6,
        3,
        "duplicate key 'accelerator' (first at line 4)",
        "silently keep only the last",
    ),
    "duplicate-top-level": Case(
        HEAD + "name: other\n", "name", 6, 1, "duplicate key 'name' (first at line 2)", "remove"
    ),
    "top-level-list": Case(
        "- apiVersion: tpuctl/v1\n", None, 1, 1, "must be a mapping", "apiVersion"
    ),
    "top-level-scalar": Case("just text\n", None, 1, 1, "must be a mapping", None),
    "custom-tag": Case(HEAD + "zone: !zone us\n", "zone", 6, 7, "unsupported YAML tag", "remove"),
    "recursive-alias": Case(
        HEAD + "capacity: &a\n  tier: spot\n  reservation: *a\n",
        "capacity.reservation",
        6,
        11,  # the anchor: composed YAML keeps no position for the alias itself
        "refers to its own parent",
        None,
    ),
    # --- apiVersion ---
    "missing-api-version": Case(
        "name: demo\ntpu:\n  accelerator: v4-8\n  runtime: x\n",
        "apiVersion",
        1,
        1,
        "missing required key",
        "apiVersion: tpuctl/v1",
    ),
    "wrong-api-version": Case(
        HEAD.replace("tpuctl/v1", "tpuctl/v2"),
        "apiVersion",
        1,
        13,
        "'tpuctl/v2' is not a valid apiVersion; expected one of tpuctl/v1",
        "did you mean 'tpuctl/v1'?",
    ),
    "wrong-api-version-before-unknown-keys": Case(
        "apiVersion: v9\nnewfangled: 1\n", "apiVersion", 1, 13, "not a valid apiVersion", None
    ),
    # --- unknown keys ---
    "unknown-capacity-key": Case(
        HEAD + "capacity:\n  teir: spot\n",
        "capacity.teir",
        7,
        3,
        "unknown key",
        "did you mean 'tier'?",
    ),
    "misspelled-spot": Case(
        HEAD + "capacity:\n  spto: true\n", "capacity.spto", 7, 3, "unknown key", "'spot'"
    ),
    "unknown-top-level-key": Case(
        HEAD + "jobs:\n  command: x\n", "jobs", 6, 1, "unknown key", "did you mean 'job'?"
    ),
    "unknown-key-no-close-match": Case(
        HEAD + "recovery:\n  zzzzz: 1\n",
        "recovery.zzzzz",
        7,
        3,
        "unknown key",
        "valid keys: max_preemptions, max_failures",
    ),
    "unknown-axis": Case(
        HEAD + "job:\n  command: x\n  parallelism:\n    ici: {fsdpp: 8}\n",
        "job.parallelism.ici.fsdpp",
        9,
        11,
        "unknown key",
        "did you mean 'fsdp'?",
    ),
    # --- types ---
    "slices-not-int": Case(
        HEAD + "  slices: two\n",
        "tpu.slices",
        6,
        11,
        "expected an integer, got a string ('two')",
        "whole number",
    ),
    "slices-bool": Case(
        HEAD + "  slices: True\n",
        "tpu.slices",
        6,
        11,
        "expected an integer, got a boolean (true)",
        None,
    ),
    "labels-list": Case(
        HEAD + "  labels: [a]\n",
        "tpu.labels",
        6,
        11,
        "expected a mapping of strings, got a list",
        None,
    ),
    "tags-string": Case(
        HEAD + "  tags: web\n", "tpu.tags", 6, 9, "expected a list of strings", None
    ),
    "bool-as-string": Case(
        HEAD + "  external_ips: 'yes'\n",
        "tpu.external_ips",
        6,
        17,
        "expected true or false",
        "without quotes",
    ),
    "section-not-mapping": Case(
        HEAD + "capacity: spot\n", "capacity", 6, 11, "expected a mapping", None
    ),
    "name-number": Case(
        "apiVersion: tpuctl/v1\nname: 42\ntpu: {accelerator: v4-8, runtime: x}\n",
        "name",
        2,
        7,
        "expected a string, got an integer (42)",
        "quote it",
    ),
    "setup-item-not-string": Case(
        HEAD + "job:\n  command: x\n  setup: [1]\n",
        "job.setup[0]",
        8,
        11,
        "expected a string",
        "quote",
    ),
    # --- required keys ---
    "missing-name": Case(
        "apiVersion: tpuctl/v1\ntpu: {accelerator: v4-8, runtime: x}\n",
        "name",
        1,
        1,
        "missing required key",
        "add `name: llama-cpt`",
    ),
    "missing-tpu": Case(
        "apiVersion: tpuctl/v1\nname: demo\n", "tpu", 1, 1, "missing required key", "add `tpu:`"
    ),
    "missing-runtime": Case(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  accelerator: v4-8\n",
        "tpu.runtime",
        3,
        1,
        "missing required key",
        "add `runtime: tpu-ubuntu2204-base` under `tpu`",
    ),
    "missing-accelerator": Case(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  runtime: x\n",
        "tpu.accelerator",
        3,
        1,
        "missing required key",
        "give tpu.accelerator or tpu.type + tpu.topology",
    ),
    "type-without-topology": Case(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  runtime: x\n  type: v5litepod\n",
        "tpu.type",
        5,
        3,
        "tpu.type needs tpu.topology",
        "add `topology:`",
    ),
    "missing-command": Case(
        HEAD + "job:\n  framework: maxtext\n",
        "job.command",
        6,
        1,
        "missing required key",
        "add `command:",
    ),
    "empty-command": Case(
        HEAD + "job:\n  command: ' '\n", "job.command", 7, 12, "command is empty", None
    ),
    # --- capacity ---
    "two-tiers-tier-and-flag": Case(
        HEAD + "capacity:\n  tier: spot\n  reserved: true\n",
        "capacity.reserved",
        8,
        13,
        "two capacity tiers: capacity.tier asks for spot, capacity.reserved for reserved",
        "keep one",
    ),
    "two-tiers-flags": Case(
        HEAD + "capacity:\n  spot: true\n  best_effort: true\n",
        "capacity.best_effort",
        8,
        16,
        "two capacity tiers",
        "keep one",
    ),
    "tier-contradicted-by-false-flag": Case(
        HEAD + "capacity:\n  tier: spot\n  spot: false\n",
        "capacity.spot",
        8,
        9,
        "contradicts capacity.tier",
        "remove",
    ),
    "unknown-tier": Case(
        HEAD + "capacity:\n  tier: spto\n",
        "capacity.tier",
        7,
        9,
        "'spto' is not a valid tier; expected one of spot, reserved, on-demand, best-effort",
        "did you mean 'spot'?",
    ),
    "reservation-without-reserved": Case(
        HEAD + "capacity:\n  tier: spot\n  reservation: r1\n",
        "capacity.reservation",
        8,
        16,
        "a reservation needs the reserved or reservation-bound tier, not spot",
        "set capacity.tier: reserved",
    ),
    "bad-valid-until": Case(
        HEAD + "capacity:\n  valid_until: soon\n",
        "capacity.valid_until",
        7,
        16,
        "neither a duration nor an RFC 3339 time",
        "RFC 3339",
    ),
    "valid-until-naive-time": Case(
        HEAD + "capacity:\n  valid_until: 2030-01-01T10:00:00\n",
        "capacity.valid_until",
        7,
        16,
        "no timezone",
        None,
    ),
    "valid-after-after-until": Case(
        HEAD + "capacity:\n  valid_until: 1h\n  valid_after: 2h\n",
        "capacity.valid_after",
        8,
        16,
        "never be served",
        None,
    ),
    # --- accelerator ---
    "unknown-accelerator": Case(
        HEAD.replace("v4-16", "v9-16"),
        "tpu.accelerator",
        4,
        16,
        "unknown accelerator type 'v9-16'; known families: "
        "v2-N, v3-N, v4-N, v5p-N, v5litepod-N, v6e-N",
        "v4-16",
    ),
    "bad-accelerator-size": Case(
        HEAD.replace("v4-16", "v4-12"), "tpu.accelerator", 4, 16, "not a v4 size", None
    ),
    "both-accelerator-forms": Case(
        HEAD + "  type: v4\n  topology: 2x2x2\n",
        "tpu.type",
        6,
        3,
        "give either tpu.accelerator or tpu.type + tpu.topology, not both",
        "remove",
    ),
    "unknown-type": Case(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  runtime: x\n  type: v9\n  topology: 4x4\n",
        "tpu.type",
        5,
        9,
        "unknown TPU type 'v9'",
        None,
    ),
    "bad-topology-shape": Case(
        "apiVersion: tpuctl/v1\nname: demo\ntpu:\n  runtime: x\n  type: v4\n  topology: 4x4\n",
        "tpu.topology",
        6,
        13,
        "not valid for v4",
        None,
    ),
    "multislice-v3": Case(
        HEAD.replace("v4-16", "v3-8") + "  slices: 2\n",
        "tpu.slices",
        6,
        11,
        "multislice is not available on v3",
        "slices: 1",
    ),
    "too-many-slices": Case(
        HEAD + "  slices: 257\n", "tpu.slices", 6, 11, "between 1 and 256, got 257", None
    ),
    "zero-slices": Case(
        HEAD + "  slices: 0\n", "tpu.slices", 6, 11, "between 1 and 256, got 0", None
    ),
    # --- names ---
    "name-uppercase": Case(
        HEAD.replace("name: demo", "name: Demo"),
        "name",
        2,
        7,
        "'Demo' is not a valid name",
        "lowercase",
    ),
    "name-trailing-dash": Case(
        HEAD.replace("name: demo", "name: demo-"), "name", 2, 7, "not a valid name", "not ending"
    ),
    "name-too-long": Case(
        HEAD.replace("name: demo", "name: " + "a" * 41),
        "name",
        2,
        7,
        "41 characters, more than 40",
        "<name>-<i>",
    ),
    # --- labels and metadata ---
    "label-key-uppercase": Case(
        HEAD + "  labels: {Team: ml}\n",
        "tpu.labels.Team",
        6,
        12,
        "'Team' is not a valid key",
        "lowercase letter",
    ),
    "label-value-invalid": Case(
        HEAD + "  labels: {team: ML Team}\n",
        "tpu.labels.team",
        6,
        18,
        "'ML Team' is not a valid value",
        "lowercase",
    ),
    "label-value-too-long": Case(
        HEAD + "  labels: {team: " + "a" * 64 + "}\n",
        "tpu.labels.team",
        6,
        18,
        "not a valid value",
        "63",
    ),
    "label-reserved": Case(
        HEAD + "  labels:\n    managed-by: me\n",
        "tpu.labels.managed-by",
        7,
        5,
        "'managed-by' is reserved for tpuctl",
        "choose another key",
    ),
    "label-reserved-spec-hash": Case(
        HEAD + "  labels: {tpuctl-spec-hash: abc}\n",
        "tpu.labels.tpuctl-spec-hash",
        6,
        12,
        "reserved",
        None,
    ),
    "too-many-labels": Case(
        HEAD + "  labels: {" + ", ".join(f"k{i}: v" for i in range(65)) + "}\n",
        "tpu.labels",
        6,
        11,
        "65 entries, more than 64",
        None,
    ),
    "tag-invalid": Case(
        HEAD + "  tags: [Web_Tag]\n",
        "tpu.tags[0]",
        6,
        10,
        "'Web_Tag' is not a valid tags",
        "lowercase",
    ),
    # --- durations and budgets ---
    "bad-deadline": Case(
        HEAD + "deadlines:\n  queue: 2 hours\n",
        "deadlines.queue",
        7,
        10,
        "not a duration: '2 hours'",
        "1h30m",
    ),
    "zero-deadline": Case(
        HEAD + "deadlines:\n  provision: 0s\n",
        "deadlines.provision",
        7,
        14,
        "longer than zero",
        None,
    ),
    "negative-deadline": Case(
        HEAD + "deadlines:\n  queue: -5\n", "deadlines.queue", 7, 10, "cannot be negative", None
    ),
    "negative-preemptions": Case(
        HEAD + "recovery:\n  max_preemptions: -1\n",
        "recovery.max_preemptions",
        7,
        20,
        "at least 0, got -1",
        None,
    ),
    "negative-failures": Case(
        HEAD + "recovery:\n  max_failures: -3\n",
        "recovery.max_failures",
        7,
        17,
        "at least 0, got -3",
        None,
    ),
    # --- parallelism ---
    "ici-product": Case(
        HEAD + "job:\n  command: x\n  parallelism: {ici: {fsdp: 4}}\n",
        "job.parallelism.ici",
        8,
        22,
        "ici axes multiply to 4 (fsdp 4), but there are 8 chips in one v4-16 slice",
        "make the ici product 8",
    ),
    "dcn-product": Case(
        HEAD
        + "  slices: 2\njob:\n  command: x\n  parallelism:\n    ici: {fsdp: 4, tensor: 2}\n"
        + "    dcn: {data: 4}\n",
        "job.parallelism.dcn",
        11,
        10,
        "dcn axes multiply to 4 (data 4), but there are 2 slices",
        "make the dcn product 2",
    ),
    "axis-zero": Case(
        HEAD + "job:\n  command: x\n  parallelism: {ici: {data: 0}}\n",
        "job.parallelism.ici.data",
        8,
        29,
        "at least 1, got 0",
        None,
    ),
    # --- checkpoint ---
    "autocheckpoint-without-dir": Case(
        HEAD + "checkpoint:\n  autocheckpoint: true\n",
        "checkpoint.autocheckpoint",
        7,
        19,
        "autocheckpoint needs a checkpoint directory",
        "set checkpoint.dir",
    ),
    # --- job ---
    "env-bad-name": Case(
        HEAD + "job:\n  command: x\n  env:\n    1BAD: x\n",
        "job.env.1BAD",
        9,
        5,
        "'1BAD' is not a valid key",
        "letters, digits",
    ),
    "env-bool": Case(
        HEAD + "job:\n  command: x\n  env:\n    DEBUG: yes\n",
        "job.env.DEBUG",
        9,
        12,
        "expected a string or number, got a boolean (true)",
        "quote the value",
    ),
    "env-list": Case(
        HEAD + "job:\n  command: x\n  env: {A: [1]}\n",
        "job.env.A",
        8,
        12,
        "expected a string or number, got a list",
        None,
    ),
    "user-invalid": Case(
        HEAD + "job:\n  command: x\n  user: Bad User\n",
        "job.user",
        8,
        9,
        "'Bad User' is not a valid user",
        "POSIX",
    ),
    "framework-enum": Case(
        HEAD + "job:\n  command: x\n  framework: maxtxt\n",
        "job.framework",
        8,
        14,
        "not a valid framework; expected one of maxtext, pax, orbax, custom",
        "did you mean 'maxtext'?",
    ),
    "code-gcs-not-archive": Case(
        HEAD + "job:\n  command: x\n  code: gs://b/code.zip\n",
        "job.code",
        8,
        9,
        ".tar.gz or .tgz",
        "gs://",
    ),
    "code-other-scheme": Case(
        HEAD + "job:\n  command: x\n  code: s3://b/c.tar.gz\n",
        "job.code",
        8,
        9,
        "unsupported code location",
        None,
    ),
    "run-name-invalid": Case(
        HEAD + "job:\n  command: x\n  run_name: a b\n",
        "job.run_name",
        8,
        13,
        "not a valid run_name",
        None,
    ),
    # --- ${VAR} expansion ---
    "unset-variable": Case(
        HEAD + "zone: ${TPUCTL_TEST_UNSET_VAR}\n",
        "zone",
        6,
        7,
        "environment variable TPUCTL_TEST_UNSET_VAR is not set",
        "$${TPUCTL_TEST_UNSET_VAR}",
    ),
    "bad-variable-reference": Case(
        HEAD + "zone: ${not valid}\n", "zone", 6, 7, "invalid variable reference", "$${"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_spec_error(case: Case, spec_error: Callable[..., SpecError], tmp_path: Path) -> None:
    error = spec_error(case.text, environ={})
    assert isinstance(error, SpecError)
    assert error.exit_code == ExitCode.USAGE
    assert error.location == SourceLocation(str(tmp_path / "spec.yaml"), case.line, case.column), (
        error.one_line()
    )
    assert error.path == case.path
    assert case.message in error.message
    if case.hint is not None:
        assert error.hint is not None and case.hint in error.hint, error.hint
    one_line = error.one_line()
    assert one_line.startswith(f"{tmp_path / 'spec.yaml'}:{case.line}:{case.column}: ")
    assert error.to_dict()["exit_code"] == 2


def test_one_line_reads_like_a_compiler_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spec.yaml").write_text(
        HEAD + "capacity:\n  teir: spot\n", encoding="utf-8"
    )  # teir on line 7, column 3
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec("spec.yaml")
    assert info.value.one_line() == (
        "spec.yaml:7:3: capacity.teir: unknown key (did you mean 'tier'?)"
    )
    assert info.value.to_dict()["path"] == "capacity.teir"


def test_misspelled_spot_never_becomes_on_demand() -> None:
    with pytest.raises(SpecError, match="unknown key"):
        load_spec_text(HEAD + "capacity:\n  spto: true\n")
    with pytest.raises(SpecError, match="unknown key"):
        load_spec_text(HEAD + "spot: true\n")


def test_empty_file(spec_error: Callable[..., SpecError]) -> None:
    for text in ("", "\n\n", "# only a comment\n", "---\n"):
        error = spec_error(text)
        assert "the spec is empty" in error.message
        assert error.hint is not None and "apiVersion: tpuctl/v1" in error.hint


def test_null_document_is_empty(spec_error: Callable[..., SpecError]) -> None:
    assert "the spec is empty" in spec_error("~\n").message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    assert info.value.exit_code == 2
    assert info.value.location == SourceLocation(str(missing))
    assert str(missing) in info.value.one_line()
    assert "cannot read spec file" in info.value.message


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec file"):
        load_spec(tmp_path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="not UTF-8") as info:
        load_spec(path)
    assert info.value.location == SourceLocation(str(path))


def test_control_character_is_a_yaml_error() -> None:
    with pytest.raises(SpecError, match="invalid YAML"):
        load_spec_text("apiVersion: tpuctl/v1\nname: a\x00b\n")


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    with pytest.raises(SpecError, match="runaway YAML aliases"):
        load_spec_text("\n".join(lines) + "\n")


def test_deep_nesting_is_a_spec_error_not_a_crash() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, "- " * 50_000 + "x\n", "[" * 40 + "]" * 40):
        with pytest.raises(SpecError):
            load_spec_text(text)


def test_huge_file_is_refused() -> None:
    with pytest.raises(SpecError, match="too large"):
        load_spec_text("# " + "x" * (2 << 20))


# Three typos and eight values of the wrong type: every one is reported, in file order.
MANY = (
    HEAD
    + """\
  slcies: 2
  external_ips: "no"
  tags: web
capacity:
  teir: spot
  spot: yes please
deadlines:
  queue: soon
checkpoint:
  keep: "3"
  autocheckpoint: 1
job:
  comand: python3 train.py
  env: {A: [1]}
  target_step: lots
recovry:
  max_failures: 2
"""
)
MANY_PATHS = [
    "tpu.slcies",
    "tpu.external_ips",
    "tpu.tags",
    "capacity.teir",
    "capacity.spot",
    "deadlines.queue",
    "checkpoint.keep",
    "checkpoint.autocheckpoint",
    "job.comand",
    "job.env.A",
    "job.target_step",
    "recovry",
]


def test_every_mistake_of_a_spec_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(MANY, encoding="utf-8")
    with pytest.raises(SpecErrors) as info:
        load_spec(path)
    error = info.value
    assert error.exit_code == ExitCode.USAGE
    assert [mistake.path for mistake in error.errors] == MANY_PATHS
    lines = MANY.splitlines()
    for mistake in error.errors:
        assert mistake.location is not None and mistake.location.file == str(path)
        key = str(mistake.path).rsplit(".", 1)[-1]
        assert key in lines[int(mistake.location.line or 0) - 1], mistake.one_line()
        assert mistake.location.column is not None
    hints = {str(m.path): m.hint for m in error.errors}
    assert hints["tpu.slcies"] == "did you mean 'slices'?"
    assert hints["capacity.teir"] == "did you mean 'tier'?"
    assert hints["job.comand"] == "did you mean 'command'?"
    assert hints["recovry"] == "did you mean 'recovery'?"
    shown = error.one_line().splitlines()
    assert shown[0] == f"{path}: 12 mistakes"
    assert shown[1:] == [f"  {mistake.one_line()}" for mistake in error.errors]
    document = error.to_dict()
    assert (document["kind"], document["path"], document["line"]) == ("spec", "tpu.slcies", 6)
    assert [item["path"] for item in document["errors"]] == MANY_PATHS
    assert all(
        {"message", "file", "line", "column", "path"} <= set(item) for item in document["errors"]
    )


def test_rules_across_fields_are_reported_together_once_the_fields_are_right() -> None:
    text = HEAD.replace("v4-16", "v9-16") + (
        "capacity:\n  tier: spot\n  reservation: pool\ndeadlines:\n  queue: 0s\n"
    )
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text)
    paths = [mistake.path for mistake in info.value.errors]
    assert paths == ["tpu.accelerator", "capacity.reservation", "deadlines.queue"], paths


def test_one_mistake_is_reported_as_before() -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(HEAD + "capacity:\n  teir: spot\n")
    assert not isinstance(info.value, SpecErrors)
    assert info.value.path == "capacity.teir"


def test_a_value_is_quoted_as_written_not_as_python_writes_it() -> None:
    """A backslash stays one backslash (Python's repr doubles it), and a quote inside picks the
    other quotes: copying the value out of the message gives what the file holds."""
    with pytest.raises(SpecError) as info:
        load_spec_text(HEAD + "capacity:\n  tier: 'C:\\spot'\n")
    assert info.value.message.startswith("'C:\\spot' is not a valid tier;"), info.value.message
    with pytest.raises(SpecError) as info:
        load_spec_text(HEAD + 'capacity:\n  tier: "it\'s spot"\n')
    assert info.value.message.startswith('"it\'s spot" is not a valid tier;'), info.value.message


def test_a_misspelt_section_is_not_judged_as_if_it_were_empty() -> None:
    """`tp:` is meant for tpu: tpu is neither said to be missing nor built from defaults."""
    with pytest.raises(SpecError) as info:
        load_spec_text("apiVersion: tpuctl/v1\nname: x\ntp:\n  accelerator: v4-8\n")
    assert not isinstance(info.value, SpecErrors) and info.value.path == "tp"  # the one mistake
