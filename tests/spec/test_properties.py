"""Property tests: whatever the input, loading either succeeds or raises SpecError, promptly."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuctl.errors import SpecError
from tpuctl.spec.fields import walk_fields
from tpuctl.spec.load import LoadedSpec, load_spec_text

MINIMAL: dict[str, Any] = {
    "apiVersion": "tpuctl/v1",
    "name": "demo",
    "tpu": {"accelerator": "v4-16", "runtime": "tpu-ubuntu2204-base"},
}
# Real key names make the generated data reach deep validation, not only "unknown key".
KEY_NAMES = sorted({field.name for _, field in walk_fields()})
keys = st.one_of(st.sampled_from(KEY_NAMES), st.text(max_size=8))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["v4-16", "spot", "1h30m", "2030-01-01T00:00:00Z", "${X}", "$${X}", "4x4"]),
)
nested = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=20,
)
# Hypothesis's default of 100 examples a property; every run of the suite draws new ones.
SETTINGS = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _load(text: str, **kwargs: Any) -> LoadedSpec | None:
    try:
        return load_spec_text(text, environ={"X": "1"}, **kwargs)
    except SpecError as error:
        assert error.exit_code == 2
        assert error.location is not None
        assert error.one_line()  # renders without raising
        return None


@SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    _load(text)


@SETTINGS
@given(
    st.lists(
        st.sampled_from(
            [
                "apiVersion: tpuctl/v1\n",
                "name: demo\n",
                "tpu:\n",
                "  accelerator: v4-8\n",
                "  runtime: r\n",
                "  - x\n",
                "job: {command: x}\n",
                "[",
                "{",
                "&a ",
                "*a",
                "<<: ",
                "!!binary ",
                "? ",
                ": ",
                "\t",
                "#",
                "'",
                '"',
                "${",
                "---\n",
                "\n",
                "  ",
            ]
        ),
        max_size=30,
    ).map("".join)
)
def test_yaml_shaped_text(text: str) -> None:
    _load(text)


@SETTINGS
@given(st.dictionaries(keys, nested, max_size=6))
def test_arbitrary_dumped_data(data: dict[str, Any]) -> None:
    _load(yaml.safe_dump(data))


@SETTINGS
@given(
    st.fixed_dictionaries(
        {},
        optional={
            name: st.dictionaries(keys, nested, max_size=5)
            for name in ("tpu", "capacity", "checkpoint", "job", "deadlines", "recovery")
        },
    )
)
def test_sections_of_a_valid_spec(sections: dict[str, Any]) -> None:
    data = {**MINIMAL, **sections}
    if "tpu" in sections:
        data["tpu"] = {**MINIMAL["tpu"], **sections["tpu"]}
    loaded = _load(yaml.safe_dump(data))
    if loaded is not None:
        assert loaded.spec.name == "demo"


@SETTINGS
@given(st.lists(st.text(max_size=30), max_size=3))
def test_arbitrary_overrides(overrides: list[str]) -> None:
    _load(yaml.safe_dump(MINIMAL), overrides=overrides)


@SETTINGS
@given(st.text(max_size=40))
def test_any_command_string_survives_loading(command: str) -> None:
    data = {**MINIMAL, "job": {"command": command}}
    loaded = _load(yaml.safe_dump(data))
    if loaded is not None and "${" not in command:
        assert loaded.spec.job is not None and loaded.spec.job.command == command
