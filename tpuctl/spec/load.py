"""Loading a YAML job spec into a validated `Spec`, with file:line:col errors and warnings."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any, TextIO

from tpuctl.errors import SourceLocation, SpecError
from tpuctl.spec.build import Builder
from tpuctl.spec.build_job import resolve_local
from tpuctl.spec.check import Checker, describe_value
from tpuctl.spec.durations import parse_duration, parse_time_bound
from tpuctl.spec.model import Spec
from tpuctl.spec.overrides import apply_override
from tpuctl.spec.schema import json_schema, reference_markdown
from tpuctl.spec.sections import Values
from tpuctl.spec.yamlsource import MAX_SPEC_CHARS, compose_document, spec_too_large

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

_STDIN_SOURCE = "<stdin>"


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec, the warnings worth showing, and where each dotted path came from;
    `text` is the spec as read (before `${VAR}`s and overrides) and `variables` the names of
    the `${VAR}`s it and its overrides expanded, so the same spec can be loaded again
    elsewhere (tpuctl reconcile --all) without carrying their values."""

    spec: Spec
    warnings: tuple[str, ...]
    locations: Mapping[str, SourceLocation]
    text: str = ""
    variables: tuple[str, ...] = ()


def load_spec(
    path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> LoadedSpec:
    """Read and validate the spec at `path` ("-" reads stdin). Raises SpecError (exit 2).

    `now`: when a request made from it would be sent (validate, render, create, up); an
    absolute capacity.valid_until before it is then an error. Commands that look at a queued
    resource made long ago leave it None."""
    name = os.fspath(path)
    source = _STDIN_SOURCE if name == "-" else name
    return load_spec_text(
        _read_spec(name, source), source=source, overrides=overrides, environ=environ, now=now
    )


def _read_spec(name: str, source: str) -> str:
    """The text of the spec file (or stdin), read no further than MAX_SPEC_CHARS + 1
    characters: /dev/zero, a FIFO or `yes |` is refused at the limit, never read to its end."""
    try:
        if name == "-":
            return _read_bounded(sys.stdin, source)
        with open(name, encoding="utf-8") as stream:
            return _read_bounded(stream, source)
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"spec file is not UTF-8 text ({exc.reason} at byte {exc.start})",
            location=SourceLocation(source),
            hint="save the file as UTF-8",
        ) from None
    except OSError as exc:
        raise SpecError(
            f"cannot read spec file: {exc.strerror or exc}",
            location=SourceLocation(source),
            hint="check the path; pass - to read the spec from stdin",
        ) from None


def _read_bounded(stream: TextIO, source: str) -> str:
    text = stream.read(MAX_SPEC_CHARS + 1)
    if len(text) > MAX_SPEC_CHARS:
        raise spec_too_large(source)
    return text


def load_spec_text(
    text: str,
    *,
    source: str = "<spec>",
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> LoadedSpec:
    """Validate spec text; `source` names it in messages and becomes `Spec.source`; `now` as
    for load_spec."""
    env = _Recording(os.environ if environ is None else environ)
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
            f"not {describe_value(document.data)}",
            location=document.value_location(""),
            hint="start the file with `apiVersion: tpuctl/v1`",
        )
    for override in overrides:
        apply_override(document, override, env)
    checker = Checker(document)
    values = checker.root()
    builder = Builder(checker, Values(values, ""), now)
    spec = builder.build()  # raises every mistake the checker and the builder recorded
    locations = {path: where for path, where in document.values.items() if path}
    return LoadedSpec(
        spec=spec,
        warnings=tuple(builder.warnings),
        locations=MappingProxyType(locations),
        text=text,
        variables=tuple(env.read),
    )


class _Recording(Mapping[str, str]):
    """An environment that remembers which names were read from it (the `${VAR}`s expanded),
    in the order first read."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.read: dict[str, None] = {}

    def __getitem__(self, name: str) -> str:
        value = self.environ[name]
        self.read.setdefault(name, None)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.environ)

    def __len__(self) -> int:
        return len(self.environ)

    def __contains__(self, name: object) -> bool:
        return name in self.environ


def resolve_code_path(spec: Spec) -> Path | None:
    """The local directory or file `job.code` names, resolved against the spec file's
    directory (None for gs:// code or none)."""
    if spec.job is None or spec.job.code is None or "://" in spec.job.code:
        return None
    return resolve_local(spec.job.code, spec.source)


def spec_fingerprint(spec: Spec) -> str:
    """12 hex characters of sha256 over the spec's content, ignoring source and where it runs
    (project, zone, capacity.zones): the same spec queued in two zones is the same spec. The
    default zone_policy is left out too, so fingerprints from before it existed still match."""
    content = {
        item.name: _canonical(getattr(spec, item.name))
        for item in fields(spec)
        if item.name not in ("source", "project", "zone")
    }
    capacity = content["capacity"]
    del capacity["zones"]
    if capacity["zone_policy"] == "sequential":
        del capacity["zone_policy"]
    # Keys added later are left out at their defaults, so older fingerprints still match.
    for section, defaults in _LATER_DEFAULTS.items():
        for key, default in defaults.items():
            if content[section].get(key) == default:
                del content[section][key]
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


_LATER_DEFAULTS: dict[str, dict[str, Any]] = {
    "capacity": {"max_run_duration": None, "fallback": []},
    "tpu": {
        "boot_disk": None,
        "data_disks": [],
        "secure_boot": False,
        "workload_type": None,
        "api": "tpu",
    },
}


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


# --- generic checks from the field table ------------------------------------------------------


# --- building the Spec: cross-field rules and warnings ----------------------------------------
