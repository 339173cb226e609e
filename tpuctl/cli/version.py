"""`tpuctl --version`: the version line for people, a `Version` document with --format json or
yaml (docs/output.md)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import ClassVar

from tpuctl import __version__
from tpuctl.cli.format import Style
from tpuctl.cli.output import emit
from tpuctl.envelope import Result


@dataclass
class Version(Result):
    KIND: ClassVar[str] = "Version"

    version: str
    python: str


def version_view(result: Version, _style: Style) -> str:
    return f"tpuctl, version {result.version}\n"


def show_version() -> None:
    emit(Version(__version__, platform.python_version()), version_view)
