"""`--set dotted.path=value` overrides and `${VAR}` expansion."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tpuctl.errors import SourceLocation, SpecError
from tpuctl.spec.load import LoadedSpec, load_spec_text

Load = Callable[..., LoadedSpec]


def test_override_is_typed_like_yaml_and_located(load: Load, minimal: str) -> None:
    loaded = load(minimal, overrides=["tpu.slices=2", "tpu.external_ips=false", "zone=us-east5-a"])
    assert loaded.spec.tpu.slices == 2
    assert loaded.spec.tpu.external_ips is False
    assert loaded.spec.zone == "us-east5-a"
    assert loaded.locations["tpu.slices"] == SourceLocation("--set tpu.slices=2")


def test_override_creates_missing_sections(load: Load, minimal: str) -> None:
    spec = load(
        minimal,
        overrides=[
            "capacity.tier=spot",
            "job.command=python3 train.py --steps=10",
            "job.parallelism.ici.fsdp=8",
            "tpu.labels.team=ml",
            "job.setup=[a, b]",
        ],
    ).spec
    assert spec.capacity.tier == "spot"
    assert spec.job is not None
    assert spec.job.command == "python3 train.py --steps=10"  # only the first = splits
    assert spec.job.parallelism is not None and spec.job.parallelism.ici == {"fsdp": 8}
    assert spec.job.setup == ("a", "b")
    assert spec.tpu.labels == {"team": "ml"}


def test_override_runs_before_validation(load: Load, minimal: str) -> None:
    # The file alone is invalid (slices 0); the override makes it valid.
    assert load(minimal + "  slices: 0\n", overrides=["tpu.slices=1"]).spec.tpu.slices == 1


def test_later_override_wins_and_replaces_whole_values(load: Load, minimal: str) -> None:
    text = minimal + "capacity:\n  tier: spot\n  valid_until: 1h\n"
    spec = load(text, overrides=["capacity={reserved: true}", "tpu.slices=3", "tpu.slices=4"]).spec
    assert spec.capacity.tier == "reserved" and spec.capacity.valid_until is None
    assert spec.tpu.slices == 4


def test_override_unknown_key_is_located_at_the_flag(minimal: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(minimal, overrides=["tpu.slise=2"])
    error = info.value
    assert error.exit_code == 2
    assert error.location == SourceLocation("--set tpu.slise=2")
    assert error.one_line() == "--set tpu.slise=2: tpu.slise: unknown key (did you mean 'slices'?)"


def test_override_unknown_section(minimal: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(minimal, overrides=["capacty.tier=spot"])
    assert info.value.path == "capacty"
    assert info.value.hint == "did you mean 'capacity'?"
    assert info.value.location == SourceLocation("--set capacty.tier=spot")


def test_override_bad_type_is_located_at_the_flag(minimal: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(minimal, overrides=["tpu.slices=two"])
    assert info.value.location == SourceLocation("--set tpu.slices=two")
    assert "expected an integer" in info.value.message


@pytest.mark.parametrize("override", ["tpu.slices", "=2", "tpu..slices=2", ".x=1", "tpu.=1", ""])
def test_malformed_override(minimal: str, override: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(minimal, overrides=[override])
    assert info.value.message == "malformed override"
    assert info.value.hint is not None and "--set dotted.path=value" in info.value.hint
    assert info.value.location == SourceLocation(f"--set {override}")


def test_override_through_a_scalar(minimal: str) -> None:
    with pytest.raises(SpecError, match=r"cannot set name\.x: name is a string"):
        load_spec_text(minimal, overrides=["name.x=1"])


def test_override_value_not_yaml(minimal: str) -> None:
    with pytest.raises(SpecError, match="override value is not valid YAML") as info:
        load_spec_text(minimal, overrides=["tpu.tags=[a"])
    assert info.value.location == SourceLocation("--set tpu.tags=[a")


# --- ${VAR} -----------------------------------------------------------------------------------


def test_variables_expand_from_environ(minimal: str) -> None:
    text = minimal + "zone: ${ZONE}\njob:\n  command: echo ${GREETING}, $HOME and $${LITERAL}\n"
    spec = load_spec_text(text, environ={"ZONE": "us-central2-b", "GREETING": "hi"}).spec
    assert spec.zone == "us-central2-b"
    assert spec.job is not None
    assert spec.job.command == "echo hi, $HOME and ${LITERAL}"


def test_a_loaded_spec_keeps_its_text_and_the_names_of_the_variables_it_expanded(
    minimal: str,
) -> None:
    """What a run keeps to load its spec again elsewhere: the text as read, and the names (not
    the values) of the variables the text and the overrides expanded, in order, once each."""
    text = minimal + "zone: ${ZONE}\n# ${IN_A_COMMENT}\njob:\n  command: echo ${A} ${A} $${B}\n"
    env = {"ZONE": "us-central2-b", "A": "secret", "C": "x", "UNUSED": "y"}
    loaded = load_spec_text(text, environ=env, overrides=["job.user=${C}"])
    assert loaded.text == text
    assert loaded.variables == ("ZONE", "A", "C")


def test_variables_default_to_os_environ(minimal: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUCTL_TEST_PROJECT", "proj-from-env")
    assert load_spec_text(minimal + "project: ${TPUCTL_TEST_PROJECT}\n").spec.project == (
        "proj-from-env"
    )


def test_unquoted_variable_is_typed_after_expansion(minimal: str) -> None:
    env = {"N": "4", "EXT": "false"}
    spec = load_spec_text(minimal + "  slices: ${N}\n  external_ips: ${EXT}\n", environ=env).spec
    assert spec.tpu.slices == 4 and spec.tpu.external_ips is False
    # Quoted, it stays a string, as YAML would have it.
    with pytest.raises(SpecError, match="expected an integer, got a string"):
        load_spec_text(minimal + "  slices: '${N}'\n", environ=env)


def test_variables_in_block_scalars_and_lists(minimal: str) -> None:
    text = minimal + "job:\n  command: |\n    run ${A}\n  setup: ['${A}', b]\n"
    job = load_spec_text(text, environ={"A": "x y"}).spec.job
    assert job is not None
    assert job.command == "run x y\n" and job.setup == ("x y", "b")


def test_unset_variable_names_variable_and_location(minimal: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(minimal + "job:\n  command: run ${MISSING}\n", source="s.yaml", environ={})
    error = info.value
    assert error.message == "environment variable MISSING is not set"
    assert error.location == SourceLocation("s.yaml", 7, 12)
    assert error.path == "job.command"


def test_variables_in_overrides(minimal: str) -> None:
    spec = load_spec_text(minimal, overrides=["tpu.slices=${N}"], environ={"N": "2"}).spec
    assert spec.tpu.slices == 2
    with pytest.raises(SpecError, match="MISSING is not set") as info:
        load_spec_text(minimal, overrides=["zone=${MISSING}"], environ={})
    assert info.value.location == SourceLocation("--set zone=${MISSING}")


def test_keys_are_not_expanded(minimal: str) -> None:
    with pytest.raises(SpecError, match="unknown key"):
        load_spec_text(minimal + "${KEY}: x\n", environ={"KEY": "zone"})
