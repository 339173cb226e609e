"""Checking a composed spec document against the field table (tpuctl.spec.fields): unknown keys
with "did you mean", types, enums, patterns and ranges, each error at its file:line:col. Every
mistake is recorded, not only the first: `raise_recorded` reports them all at once."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

from tpuctl.clock import DURATION_HINT
from tpuctl.errors import SpecError, SpecErrors, quoted
from tpuctl.spec.durations import TIME_BOUND_HINT, parse_duration, parse_time_bound
from tpuctl.spec.field import Field
from tpuctl.spec.fields import ROOT
from tpuctl.spec.yamlsource import Document, join_path, other_base_integer


def describe_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({quoted(shown)})"
    if isinstance(value, (datetime, date)):
        return f"a timestamp ({value.isoformat()})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def closest(word: str, choices: Sequence[str]) -> str | None:
    import difflib  # only on the error path

    for choice in choices:
        if choice.lower() == word.lower() or choice.replace("_", "-") == word:
            return choice
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


class _Recorded(Exception):
    """A value whose mistakes are recorded already (a list or mapping with several bad items):
    its key is left out of the result."""


class Checker:
    """Checks plain data against the field table; returns typed values for the present keys,
    leaving out each key whose value is wrong and recording why (`errors`)."""

    def __init__(self, document: Document) -> None:
        self.document = document
        self.errors: list[SpecError] = []
        # Keys not judged because a misspelling was meant for them (tpu for `tp:`).
        self.misspelt_for: set[str] = set()

    def record(self, error: SpecError) -> None:
        self.errors.append(error)

    def wrong_sections(self) -> frozenset[str]:
        """The top-level keys some recorded mistake is under (`tpu` for tpu.slcies), or a
        misspelt key was meant for (`tpu` for `tp:`)."""
        paths = [str(error.path) for error in self.errors] + sorted(self.misspelt_for)
        return frozenset(path.split(".", 1)[0].split("[", 1)[0] for path in paths)

    def raise_recorded(self) -> None:
        """Raise what was recorded, in file order: the one SpecError, or SpecErrors."""
        if not self.errors:
            return
        ordered = sorted(self.errors, key=_file_order)
        raise ordered[0] if len(ordered) == 1 else SpecErrors(ordered)

    def error(
        self, message: str, path: str, hint: str | None = None, *, at_key: bool = False
    ) -> SpecError:
        where = self.document.key_location(path) if at_key else self.document.value_location(path)
        return SpecError(message, location=where, path=path or None, hint=hint)

    def warning(self, message: str, path: str) -> str:
        return f"{self.document.value_location(path)}: {path}: {message}"

    def root(self) -> dict[str, Any]:
        data: dict[str, Any] = self.document.data
        # A spec written for another version is told so before any of its keys is judged.
        version_field = ROOT.child("apiVersion")
        if data.get("apiVersion") is not None and version_field is not None:
            self.value(version_field, data["apiVersion"], "apiVersion")
        return self.section(ROOT, data, "")

    def section(self, section: Field, data: object, path: str) -> dict[str, Any]:
        if not isinstance(data, dict):
            hint = f"indent its keys under `{path or 'the top'}`, one `key: value` a line"
            raise self.error(f"expected a mapping, got {describe_value(data)}", path, hint)
        names = [child.name for child in section.children]
        meant: set[str] = set()  # what misspelt keys were meant to be: not missing, misspelt
        for key in data:
            if section.child(key) is None:
                close = closest(key, names)
                hint = (
                    f"did you mean {quoted(close)}?" if close else f"valid keys: {', '.join(names)}"
                )
                self.record(self.error("unknown key", join_path(path, key), hint, at_key=True))
                if close:
                    meant.add(close)
                    self.misspelt_for.add(join_path(path, close))
        result: dict[str, Any] = {}
        for child in section.children:
            child_path = join_path(path, child.name)
            value = data.get(child.name)
            if value is None:
                if child.name in data:  # `key:`, `key: null`, `--set key=`: never the default
                    self.record(self._no_value(child, child_path))
                elif child.required and child.name not in meant:
                    self.record(self._missing(child, path))
                continue
            try:
                result[child.name] = self.value(child, value, child_path)
            except _Recorded:
                pass
            except SpecError as error:
                self.record(error)
        if section.one_of:
            try:
                # Given keys count as given even when their value was wrong: that mistake is
                # recorded already, and "missing required key" would be a second, false one.
                given = {name: True for name in [*data, *meant] if name in names}
                self._one_of(section, given, path)
            except SpecError as error:
                self.record(error)
        return result

    def _missing(self, child: Field, path: str) -> SpecError:
        example = f" {child.example}" if isinstance(child.example, (str, int)) else ""
        where = f" under `{path}`" if path else ""
        return SpecError(
            "missing required key",
            location=self.document.key_location(path) if path else self.document.value_location(""),
            path=join_path(path, child.name),
            hint=f"add `{child.name}:{example}`{where}",
        )

    def _no_value(self, child: Field, path: str) -> SpecError:
        if child.kind in ("section", "sections"):
            hint = "give its keys, or leave the key out"
        elif child.default not in (None, [], {}) or child.default_doc:
            default = child.default_doc or json.dumps(child.default).strip('"')
            hint = f"give a value (the default is {default}), or leave the key out for the default"
        elif child.required:
            example = f", e.g. {child.example}" if isinstance(child.example, (str, int)) else ""
            hint = f"give a value{example}"
        else:
            hint = "give a value, or leave the key out"
        return self.error("has no value", path, hint, at_key=True)

    def _one_of(self, section: Field, result: dict[str, Any], path: str) -> None:
        def spell(group: tuple[str, ...]) -> str:
            return " + ".join(join_path(path, name) for name in group)

        given = [group for group in section.one_of if any(name in result for name in group)]
        choices = " or ".join(spell(group) for group in section.one_of)
        if not given:
            first = section.one_of[0][0]
            raise SpecError(
                "missing required key",
                location=self.document.key_location(path),
                path=join_path(path, first),
                hint=f"give {choices}",
            )
        if len(given) > 1:
            second = next(name for name in given[1] if name in result)
            raise self.error(
                f"give either {choices}, not both",
                join_path(path, second),
                f"remove {spell(given[1])} or {spell(given[0])}",
                at_key=True,
            )
        for name in given[0]:
            if name not in result:
                present = next(other for other in given[0] if other in result)
                raise self.error(
                    f"{join_path(path, present)} needs {join_path(path, name)}",
                    join_path(path, present),
                    f"add `{name}:` under `{path}`",
                    at_key=True,
                )

    def value(self, field: Field, value: object, path: str) -> Any:
        kind = field.kind
        if kind == "section":
            return self.section(field, value, path)
        if kind == "sections":
            return self.sections(field, value, path)
        if kind == "str":
            return self.string(field, value, path)
        if kind == "int":
            return self.integer(field, value, path)
        if kind == "bool":
            if not isinstance(value, bool):
                hint = "write true or false" + (
                    ", without quotes" if isinstance(value, str) else ""
                )
                raise self.error(f"expected true or false, got {describe_value(value)}", path, hint)
            return value
        if kind in ("duration", "time_bound"):
            return self.time(kind, value, path)
        if kind in ("str_list", "commands"):
            return self.strings(field, value, path)
        if kind == "command":
            if isinstance(value, str):
                return value
            if isinstance(value, list) and value:
                return self.strings(field, value, path)
            raise self.error(
                f"expected a command line or a list of words, got {describe_value(value)}",
                path,
                'e.g. command: python3 train.py, or command: ["python3", "train.py"]',
            )
        return self.string_map(field, value, path)

    def sections(self, field: Field, value: object, path: str) -> list[dict[str, Any]]:
        """A list of mappings, each checked against the field's children."""
        if not isinstance(value, list):
            example = ", ".join(f"{child.name}: …" for child in field.children if child.required)
            raise self.error(
                f"expected a list of mappings, got {describe_value(value)}",
                path,
                f"write one `- {example}` line per item",
            )
        before = len(self.errors)
        items: list[dict[str, Any]] = []
        for index, item in enumerate(value):
            try:
                items.append(self.section(field, item, f"{path}[{index}]"))
            except SpecError as error:
                self.record(error)
        if len(self.errors) > before:
            raise _Recorded
        return items

    def string(self, field: Field, value: object, path: str) -> str:
        if not isinstance(value, str):
            hint = (
                "quote it"
                if isinstance(value, (int, float, datetime, date))
                else "give one string (quote it if it holds ': ' or ' #')"
            )
            raise self.error(f"expected a string, got {describe_value(value)}", path, hint)
        if field.enum and value not in field.enum:
            close = closest(value, field.enum)
            hint = (
                f"did you mean {quoted(close)}?"
                if close
                else f"write one of {', '.join(field.enum)}"
            )
            raise self.error(
                f"{quoted(value)} is not a valid {field.name}; "
                f"expected one of {', '.join(field.enum)}",
                path,
                hint,
            )
        self.match(field, value, path)
        return value

    def match(self, field: Field, value: str, path: str) -> None:
        if field.max_length is not None and len(value) > field.max_length:
            raise self.error(
                f"{quoted(value)} is {len(value)} characters, more than {field.max_length}",
                path,
                "shorten it" + ("; node ids are <name>-<i>" if path == "name" else ""),
            )
        if field.pattern and not re.fullmatch(field.pattern, value):
            rule = field.rule or f"it must match {field.pattern}"
            raise self.error(f"{quoted(value)} is not a valid {field.name}", path, f"use {rule}")

    def integer(self, field: Field, value: object, path: str) -> int:
        if isinstance(value, str) and (reading := other_base_integer(value)) is not None:
            # YAML 1.1 reads 010 as 8 and 0x10 as 16; the spec's loader leaves them strings.
            raise self.error(
                f"{quoted(value)} is not a decimal integer (YAML may read it as {reading})",
                path,
                "write it in decimal, without a leading 0 or a base prefix",
            )
        # bool is an int subclass in Python; `slices: true` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "write a whole number" + (" without quotes" if isinstance(value, str) else "")
            raise self.error(f"expected an integer, got {describe_value(value)}", path, hint)
        low, high = field.minimum, field.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            if high is None:
                bounds = f"at least {low}"
            elif low is None:
                bounds = f"at most {high}"
            else:
                bounds = f"between {low} and {high}"
            raise self.error(f"must be {bounds}, got {value}", path, f"give a number {bounds}")
        return value

    def time(self, kind: str, value: object, path: str) -> timedelta | datetime:
        try:
            if kind == "duration":
                if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                    raise ValueError(f"expected a duration, got {describe_value(value)}")
                return parse_duration(value)
            return parse_time_bound(value)
        except ValueError as exc:
            hint = DURATION_HINT if kind == "duration" else TIME_BOUND_HINT
            raise self.error(str(exc), path, hint) from None

    def strings(self, field: Field, value: object, path: str) -> tuple[str, ...]:
        if field.kind == "commands" and isinstance(value, str):
            return (value,)
        if not isinstance(value, list):
            shape = "a list of strings" + (" or one string" if field.kind == "commands" else "")
            example = f"[{value}]" if isinstance(value, (str, int, float)) else "[a, b]"
            hint = f"write a list, e.g. {example}"
            raise self.error(f"expected {shape}, got {describe_value(value)}", path, hint)
        before = len(self.errors)
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            try:
                if not isinstance(item, str):
                    raise self.error(
                        f"expected a string, got {describe_value(item)}", item_path, "quote it"
                    )
                self.match(field, item, item_path)
            except SpecError as error:
                self.record(error)
        if len(self.errors) > before:
            raise _Recorded
        return tuple(value)

    def string_map(self, field: Field, value: object, path: str) -> dict[str, str]:
        if not isinstance(value, dict):
            hint = "write `KEY: value` lines under it, or {KEY: value}"
            raise self.error(
                f"expected a mapping of strings, got {describe_value(value)}", path, hint
            )
        if field.max_items is not None and len(value) > field.max_items:
            raise self.error(
                f"{len(value)} entries, more than {field.max_items}", path, "remove some"
            )
        result: dict[str, str] = {}
        before = len(self.errors)
        for key, item in value.items():
            try:
                result[key] = self._map_item(field, key, item, join_path(path, key))
            except SpecError as error:
                self.record(error)
        if len(self.errors) > before:
            raise _Recorded
        return result

    def _map_item(self, field: Field, key: str, item: object, item_path: str) -> str:
        """One entry of a string map, checked; its text."""
        if key in field.forbidden_keys:
            raise self.error(
                f"{quoted(key)} is reserved for tpuctl",
                item_path,
                field.forbidden_hint,
                at_key=True,
            )
        if field.key_pattern and not re.fullmatch(field.key_pattern, key):
            raise self.error(
                f"{quoted(key)} is not a valid key", item_path, field.key_rule, at_key=True
            )
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            hint = "give one string or number"
            if isinstance(item, bool):
                hint = "YAML reads yes/no/true/false/on/off as booleans; quote the value"
            raise self.error(
                f"expected a string or number, got {describe_value(item)}", item_path, hint
            )
        text = item if isinstance(item, str) else str(item)
        if field.value_pattern and not re.fullmatch(field.value_pattern, text):
            raise self.error(f"{quoted(text)} is not a valid value", item_path, field.value_rule)
        return text


def _file_order(error: SpecError) -> tuple[int, int]:
    where = error.location
    if where is None or where.line is None:
        return (1 << 30, 0)  # a --set override or the file as a whole: after the lines
    return (where.line, where.column or 0)
