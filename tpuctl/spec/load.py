"""Loading a YAML job spec into a validated `Spec`, with file:line:col errors and warnings."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from tpuctl.errors import SourceLocation, SpecError
from tpuctl.spec.durations import (
    DURATION_HINT,
    TIME_BOUND_HINT,
    parse_duration,
    parse_time_bound,
)
from tpuctl.spec.fields import (
    ROOT,
    Field,
    field_at,
    json_schema,
    reference_markdown,
)
from tpuctl.spec.model import (
    CapacitySpec,
    CheckpointSpec,
    DeadlinesSpec,
    JobSpec,
    ParallelismSpec,
    RecoverySpec,
    Spec,
    Tier,
    TpuSpec,
)
from tpuctl.spec.yamlsource import (
    Document,
    compose_document,
    expand_variables,
    join_path,
    load_value,
)
from tpuctl.topology import (
    Accelerator,
    AcceleratorError,
    from_type_topology,
    mesh_product,
    parse_accelerator,
    runtime_warning,
)

__all__ = [
    "LoadedSpec",
    "json_schema",
    "load_spec",
    "load_spec_text",
    "parse_duration",
    "parse_time_bound",
    "reference_markdown",
    "resolve_code_path",
    "spec_fingerprint",
]

_TIER_FLAGS = (
    ("spot", "spot"),
    ("reserved", "reserved"),
    ("on_demand", "on-demand"),
    ("best_effort", "best-effort"),
)
_CODE_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
_STDIN_SOURCE = "<stdin>"


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec, the warnings worth showing, and where each dotted path came from."""

    spec: Spec
    warnings: tuple[str, ...]
    locations: Mapping[str, SourceLocation]


def load_spec(
    path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> LoadedSpec:
    """Read and validate the spec at `path` ("-" reads stdin). Raises SpecError (exit 2)."""
    name = os.fspath(path)
    if name == "-":
        return load_spec_text(
            sys.stdin.read(), source=_STDIN_SOURCE, overrides=overrides, environ=environ
        )
    try:
        with open(name, encoding="utf-8") as stream:
            text = stream.read()
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"spec file is not UTF-8 text ({exc.reason} at byte {exc.start})",
            location=SourceLocation(name),
            hint="save the file as UTF-8",
        ) from None
    except OSError as exc:
        raise SpecError(
            f"cannot read spec file: {exc.strerror or exc}",
            location=SourceLocation(name),
            hint="check the path; pass - to read the spec from stdin",
        ) from None
    return load_spec_text(text, source=name, overrides=overrides, environ=environ)


def load_spec_text(
    text: str,
    *,
    source: str = "<spec>",
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> LoadedSpec:
    """Validate spec text; `source` names it in messages and becomes `Spec.source`."""
    env = os.environ if environ is None else environ
    document = compose_document(text, source, env)
    if document is None or document.data is None:
        raise SpecError(
            "the spec is empty",
            location=SourceLocation(source),
            hint="a spec needs at least apiVersion: tpuctl/v1, name and tpu",
        )
    if not isinstance(document.data, dict):
        raise SpecError(
            f"the spec must be a mapping of keys (apiVersion, name, tpu, …), "
            f"not {_describe(document.data)}",
            location=document.value_location(""),
            hint="start the file with `apiVersion: tpuctl/v1`",
        )
    for override in overrides:
        _apply_override(document, override, env)
    checker = _Checker(document)
    values = checker.root()
    builder = _Builder(checker, _Values(values, ""))
    spec = builder.build()
    locations = {path: where for path, where in document.values.items() if path}
    return LoadedSpec(
        spec=spec,
        warnings=tuple(builder.warnings),
        locations=MappingProxyType(locations),
    )


def resolve_code_path(spec: Spec) -> Path | None:
    """The local directory or file `job.code` names, resolved against the spec file's
    directory (None for gs:// code or none)."""
    if spec.job is None or spec.job.code is None or "://" in spec.job.code:
        return None
    return _resolve_local(spec.job.code, spec.source)


def spec_fingerprint(spec: Spec) -> str:
    """12 hex characters of sha256 over the spec's content, ignoring source, project and zone."""
    content = {
        item.name: _canonical(getattr(spec, item.name))
        for item in fields(spec)
        if item.name not in ("source", "project", "zone")
    }
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _canonical(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: _canonical(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, timedelta):
        return {"seconds": value.total_seconds()}
    if isinstance(value, datetime):
        return {"time": value.astimezone(timezone.utc).isoformat()}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    return value


# --- overrides --------------------------------------------------------------------------------


def _apply_override(document: Document, override: str, environ: Mapping[str, str]) -> None:
    """`--set dotted.path=value`: the value is typed as YAML; missing sections are created."""
    where = SourceLocation(f"--set {override}")
    dotted, equals, raw = override.partition("=")
    dotted = dotted.strip()
    parts = dotted.split(".")
    if not equals or not dotted or not all(parts):
        raise SpecError(
            "malformed override",
            location=where,
            hint="write --set dotted.path=value, e.g. --set tpu.slices=2",
        )
    expanded = expand_variables(raw, environ, location=where, path=dotted)
    value = load_value(expanded, location=where, path=dotted)
    node: dict[str, Any] = document.data
    path = ""
    for part in parts[:-1]:
        path = join_path(path, part)
        child = node.get(part)
        if child is None:
            child = node[part] = {}
            document.keys[path] = document.values[path] = where
        elif not isinstance(child, dict):
            raise SpecError(
                f"cannot set {dotted}: {path} is {_describe(child)}, not a mapping",
                location=where,
                path=path,
            )
        node = child
    node[parts[-1]] = value
    stale = [key for key in document.values if key.startswith((dotted + ".", dotted + "["))]
    for key in stale:
        document.values.pop(key, None)
        document.keys.pop(key, None)
    document.keys[dotted] = where
    _record(document, value, dotted, where)


def _record(document: Document, value: Any, path: str, where: SourceLocation) -> None:
    document.values[path] = where
    if isinstance(value, dict):
        for key, item in value.items():
            document.keys[join_path(path, key)] = where
            _record(document, item, join_path(path, key), where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _record(document, item, f"{path}[{index}]", where)


# --- generic checks from the field table ------------------------------------------------------


def _describe(value: object) -> str:
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
        return f"a string ({shown!r})"
    if isinstance(value, (datetime, date)):
        return f"a timestamp ({value.isoformat()})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _closest(word: str, choices: Sequence[str]) -> str | None:
    import difflib  # only on the error path

    for choice in choices:
        if choice.lower() == word.lower() or choice.replace("_", "-") == word:
            return choice
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return matches[0] if matches else None


class _Checker:
    """Checks plain data against the field table; returns typed values for the present keys."""

    def __init__(self, document: Document) -> None:
        self.document = document

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
            raise self.error(f"expected a mapping, got {_describe(data)}", path)
        names = [child.name for child in section.children]
        for key in data:
            if section.child(key) is None:
                close = _closest(key, names)
                hint = f"did you mean {close!r}?" if close else f"valid keys: {', '.join(names)}"
                raise self.error("unknown key", join_path(path, key), hint, at_key=True)
        result: dict[str, Any] = {}
        for child in section.children:
            child_path = join_path(path, child.name)
            value = data.get(child.name)
            if value is None:  # `key:` with nothing after it means "use the default"
                if child.required:
                    raise self._missing(child, path)
                continue
            result[child.name] = self.value(child, value, child_path)
        if section.one_of:
            self._one_of(section, result, path)
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
        if kind == "str":
            return self.string(field, value, path)
        if kind == "int":
            return self.integer(field, value, path)
        if kind == "bool":
            if not isinstance(value, bool):
                hint = "write true or false, without quotes" if isinstance(value, str) else None
                raise self.error(f"expected true or false, got {_describe(value)}", path, hint)
            return value
        if kind in ("duration", "time_bound"):
            return self.time(kind, value, path)
        if kind in ("str_list", "commands"):
            return self.strings(field, value, path)
        return self.string_map(field, value, path)

    def string(self, field: Field, value: object, path: str) -> str:
        if not isinstance(value, str):
            hint = "quote it" if isinstance(value, (int, float, datetime, date)) else None
            raise self.error(f"expected a string, got {_describe(value)}", path, hint)
        if field.enum and value not in field.enum:
            close = _closest(value, field.enum)
            hint = f"did you mean {close!r}?" if close else None
            raise self.error(
                f"{value!r} is not a valid {field.name}; expected one of {', '.join(field.enum)}",
                path,
                hint,
            )
        self.match(field, value, path)
        return value

    def match(self, field: Field, value: str, path: str) -> None:
        if field.max_length is not None and len(value) > field.max_length:
            raise self.error(
                f"{value!r} is {len(value)} characters, more than {field.max_length}",
                path,
                "shorten it" + ("; node ids are <name>-<i>" if path == "name" else ""),
            )
        if field.pattern and not re.fullmatch(field.pattern, value):
            rule = field.rule or f"it must match {field.pattern}"
            raise self.error(f"{value!r} is not a valid {field.name}", path, f"use {rule}")

    def integer(self, field: Field, value: object, path: str) -> int:
        # bool is an int subclass in Python; `slices: true` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "write a whole number without quotes" if isinstance(value, str) else None
            raise self.error(f"expected an integer, got {_describe(value)}", path, hint)
        low, high = field.minimum, field.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            if high is None:
                bounds = f"at least {low}"
            elif low is None:
                bounds = f"at most {high}"
            else:
                bounds = f"between {low} and {high}"
            raise self.error(f"must be {bounds}, got {value}", path)
        return value

    def time(self, kind: str, value: object, path: str) -> timedelta | datetime:
        try:
            if kind == "duration":
                if isinstance(value, bool) or not isinstance(value, (int, str)):
                    raise ValueError(f"expected a duration, got {_describe(value)}")
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
            raise self.error(f"expected {shape}, got {_describe(value)}", path)
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            if not isinstance(item, str):
                raise self.error(f"expected a string, got {_describe(item)}", item_path, "quote it")
            self.match(field, item, item_path)
        return tuple(value)

    def string_map(self, field: Field, value: object, path: str) -> dict[str, str]:
        if not isinstance(value, dict):
            raise self.error(f"expected a mapping of strings, got {_describe(value)}", path)
        if field.max_items is not None and len(value) > field.max_items:
            raise self.error(f"{len(value)} entries, more than {field.max_items}", path)
        result: dict[str, str] = {}
        for key, item in value.items():
            item_path = join_path(path, key)
            if key in field.forbidden_keys:
                raise self.error(
                    f"{key!r} is reserved for tpuctl", item_path, field.forbidden_hint, at_key=True
                )
            if field.key_pattern and not re.fullmatch(field.key_pattern, key):
                raise self.error(
                    f"{key!r} is not a valid key", item_path, field.key_rule, at_key=True
                )
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                hint = None
                if isinstance(item, bool):
                    hint = "YAML reads yes/no/true/false/on/off as booleans; quote the value"
                raise self.error(
                    f"expected a string or number, got {_describe(item)}", item_path, hint
                )
            text = item if isinstance(item, str) else str(item)
            if field.value_pattern and not re.fullmatch(field.value_pattern, text):
                raise self.error(f"{text!r} is not a valid value", item_path, field.value_rule)
            result[key] = text
        return result


# --- building the Spec: cross-field rules and warnings ----------------------------------------


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


class _Values:
    """A checked section; absent keys read as the field table's default."""

    def __init__(self, data: Mapping[str, Any], path: str) -> None:
        self.data = data
        self.path = path

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def __getitem__(self, name: str) -> Any:
        if name in self.data:
            return self.data[name]
        field = field_at(join_path(self.path, name))
        assert field is not None, f"{self.path}.{name} is not in the field table"
        return _freeze(field.default)

    def section(self, name: str) -> _Values:
        return _Values(self.data.get(name) or {}, join_path(self.path, name))


class _Builder:
    def __init__(self, checker: _Checker, values: _Values) -> None:
        self.checker = checker
        self.values = values
        self.warnings: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> SpecError:
        return self.checker.error(message, path, hint)

    def warn(self, message: str, path: str) -> None:
        self.warnings.append(self.checker.warning(message, path))

    def build(self) -> Spec:
        values = self.values
        name: str = values["name"]
        tpu, accelerator = self.tpu(values.section("tpu"))
        job = (
            self.job(values.section("job"), name, accelerator, tpu.slices)
            if "job" in values
            else None
        )
        deadlines = values.section("deadlines")
        for key in ("queue", "provision"):
            if key in deadlines and deadlines[key] <= timedelta(0):
                raise self.error("a deadline must be longer than zero", f"deadlines.{key}")
        recovery = values.section("recovery")
        checkpoint = self.checkpoint(values.section("checkpoint"))
        if job is not None and job.target_step is not None and not checkpoint.dir:
            raise self.error(
                "target_step needs a checkpoint directory to find the committed steps in",
                "job.target_step",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
            )
        return Spec(
            name=name,
            tpu=tpu,
            capacity=self.capacity(values.section("capacity")),
            checkpoint=checkpoint,
            job=job,
            deadlines=DeadlinesSpec(queue=deadlines["queue"], provision=deadlines["provision"]),
            recovery=RecoverySpec(
                max_preemptions=recovery["max_preemptions"],
                max_failures=recovery["max_failures"],
            ),
            project=values["project"],
            zone=values["zone"],
            source=self.checker.document.source,
        )

    def tpu(self, tpu: _Values) -> tuple[TpuSpec, Accelerator]:
        type_name: str | None = None
        topology: str | None = None
        try:
            if "accelerator" in tpu:
                accelerator = parse_accelerator(tpu["accelerator"])
            else:
                accelerator = from_type_topology(tpu["type"], tpu["topology"])
                type_name, topology = accelerator.family.prefix, accelerator.topology
        except AcceleratorError as exc:
            if "accelerator" in tpu:
                path = "tpu.accelerator"
            else:
                path = "tpu.type" if str(exc).startswith("unknown TPU type") else "tpu.topology"
            raise self.error(str(exc), path, "e.g. v4-16, v5p-8, v5litepod-16 or v6e-8") from None
        slices: int = tpu["slices"]
        if slices > 1 and not accelerator.supports_multislice:
            raise self.error(
                f"multislice is not available on {accelerator.generation}",
                "tpu.slices",
                "use slices: 1, or a v4 or newer accelerator for several slices",
            )
        warning = runtime_warning(accelerator, tpu["runtime"])
        if warning:
            self.warn(warning, "tpu.runtime")
        spec = TpuSpec(
            accelerator=accelerator.accelerator_type,
            runtime=tpu["runtime"],
            type=type_name,
            topology=topology,
            slices=slices,
            network=tpu["network"],
            subnetwork=tpu["subnetwork"],
            external_ips=tpu["external_ips"],
            tags=tpu["tags"],
            labels=tpu["labels"],
            service_account=tpu["service_account"],
            scopes=tpu["scopes"],
            metadata=tpu["metadata"],
            description=tpu["description"],
        )
        return spec, accelerator

    def capacity(self, capacity: _Values) -> CapacitySpec:
        chosen: list[tuple[str, str]] = []  # (tier, the key that asked for it)
        if "tier" in capacity:
            chosen.append((capacity["tier"], "capacity.tier"))
        for key, tier in _TIER_FLAGS:
            if capacity.data.get(key):
                chosen.append((tier, f"capacity.{key}"))
        for tier, path in chosen[1:]:
            if tier != chosen[0][0]:
                raise self.error(
                    f"two capacity tiers: {chosen[0][1]} asks for {chosen[0][0]}, "
                    f"{path} for {tier}",
                    path,
                    "keep one: tier: spot | reserved | on-demand | best-effort",
                )
        tier = cast(Tier, chosen[0][0] if chosen else capacity["tier"])
        for key, flag_tier in _TIER_FLAGS:
            if key in capacity and capacity[key] is False and flag_tier == tier and chosen:
                raise self.error(
                    f"contradicts {chosen[0][1]}, which asks for {tier}",
                    f"capacity.{key}",
                    f"remove capacity.{key}",
                )
        if "reservation" in capacity and tier != "reserved":
            raise self.error(
                f"a reservation needs the reserved tier, not {tier}",
                "capacity.reservation",
                "set capacity.tier: reserved, or remove reservation",
            )
        until, after = capacity["valid_until"], capacity["valid_after"]
        if (
            until is not None
            and after is not None
            and type(until) is type(after)
            and after >= until
        ):
            raise self.error(
                "valid_after is not before valid_until: the request could never be served",
                "capacity.valid_after",
            )
        return CapacitySpec(
            tier=tier, reservation=capacity["reservation"], valid_until=until, valid_after=after
        )

    def checkpoint(self, checkpoint: _Values) -> CheckpointSpec:
        if checkpoint["autocheckpoint"] and not checkpoint["dir"]:
            raise self.error(
                "autocheckpoint needs a checkpoint directory",
                "checkpoint.autocheckpoint",
                "set checkpoint.dir, e.g. gs://my-bucket/runs/NAME",
            )
        return CheckpointSpec(dir=checkpoint["dir"], autocheckpoint=checkpoint["autocheckpoint"])

    def job(self, job: _Values, name: str, accelerator: Accelerator, slices: int) -> JobSpec:
        command: str = job["command"]
        if not command.strip():
            raise self.error("the command is empty", "job.command", "give the command to run")
        if job["user"] == "root":
            self.warn("the job runs as root; a dedicated user is safer", "job.user")
        code: str | None = job["code"]
        if code is not None:
            self.code(code)
        parallelism = None
        if "parallelism" in job:
            parallelism = self.parallelism(job.section("parallelism"), accelerator, slices)
        return JobSpec(
            command=command,
            framework=job["framework"],
            run_name=job["run_name"] or name,
            user=job["user"],
            workdir=job["workdir"],
            code=code,
            setup=job["setup"],
            env=job["env"],
            parallelism=parallelism,
            target_step=job["target_step"],
        )

    def code(self, code: str) -> None:
        if "://" in code:
            if not code.startswith("gs://"):
                raise self.error(
                    f"unsupported code location {code!r}",
                    "job.code",
                    "give a local directory or file, or gs://bucket/path/code.tar.gz",
                )
            if not code.endswith(_CODE_ARCHIVE_SUFFIXES):
                raise self.error(
                    "code in Cloud Storage must be a .tar.gz or .tgz archive",
                    "job.code",
                    "e.g. gs://my-bucket/code.tar.gz",
                )
            return
        local = _resolve_local(code, self.checker.document.source)
        if not local.exists():
            self.warn(f"local code {code} does not exist (looked at {local})", "job.code")
        elif not (local.is_dir() or local.is_file()):
            self.warn(
                f"local code {code} is neither a directory nor a file (looked at {local})",
                "job.code",
            )

    def parallelism(
        self, parallelism: _Values, accelerator: Accelerator, slices: int
    ) -> ParallelismSpec:
        ici: dict[str, int] = dict(parallelism.section("ici").data)
        dcn: dict[str, int] = dict(parallelism.section("dcn").data)
        layers = (
            ("ici", ici, accelerator.chips, f"chips in one {accelerator.accelerator_type} slice"),
            ("dcn", dcn, slices, "slices"),
        )
        for layer, axes, expected, what in layers:
            product = mesh_product(axes)
            if axes and product != expected:
                shown = " × ".join(f"{axis} {size}" for axis, size in axes.items())
                raise self.error(
                    f"{layer} axes multiply to {product} ({shown}), "
                    f"but there are {expected} {what}",
                    f"job.parallelism.{layer}",
                    f"make the {layer} product {expected}",
                )
        if dcn.get("tensor", 1) > 1:
            self.warn(
                "tensor parallelism across slices (DCN) is slow; keep dcn.tensor at 1 and use "
                "data or fsdp across slices",
                "job.parallelism.dcn.tensor",
            )
        return ParallelismSpec(ici=ici, dcn=dcn)


def _resolve_local(code: str, source: str) -> Path:
    path = Path(code).expanduser()
    if path.is_absolute() or source.startswith("<"):
        return path.resolve() if not path.is_absolute() else path
    return (Path(source).parent / path).resolve()
