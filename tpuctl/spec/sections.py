"""What the spec's builder reads and how it speaks: a checked section (`Values`, absent keys
read as the field table's defaults) and the base of its rules (`Rules`: an error at a dotted
path, a warning, the time a request would be sent)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tpuctl.errors import SpecError
from tpuctl.spec.check import Checker
from tpuctl.spec.fields import field_at
from tpuctl.spec.yamlsource import join_path


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return dict(value)
    return value


class Values:
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

    def section(self, name: str) -> Values:
        return Values(self.data.get(name) or {}, join_path(self.path, name))


class Rules:
    """The state every group of the builder's rules shares."""

    def __init__(self, checker: Checker, values: Values, now: datetime | None = None) -> None:
        self.checker = checker
        self.values = values
        self.now = now  # when a request made from the spec would be sent; None: not judged
        self.warnings: list[str] = []

    def error(self, message: str, path: str, hint: str | None = None) -> SpecError:
        return self.checker.error(message, path, hint)

    def warn(self, message: str, path: str) -> None:
        self.warnings.append(self.checker.warning(message, path))
