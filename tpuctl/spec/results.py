"""The results of the offline spec commands: validate and render (plan's is tpuctl.plan.Plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tpuctl.envelope import Result

RenderWhat = Literal["request", "startup-script", "gcloud"]


@dataclass
class Validation(Result):
    """A spec that loaded without an error (any error is exit 2 instead)."""

    KIND: ClassVar[str] = "Validation"
    valid: bool
    name: str
    source: str
    accelerator: str
    slices: int
    tier: str
    warnings: list[str] = field(default_factory=list)
    api: str = "tpu"  # tpu.api: who makes the slices (tpu: Cloud TPU, compute: Compute Engine)


@dataclass
class Rendered(Result):
    """What `create` would send: the request (proto field names), the startup script, or the
    equivalent gcloud line; the other two are None. No credentials, no network. A
    `tpu.api: compute` spec's request is `requests` instead: every Compute Engine call in
    order, each {method, scope, body}."""

    KIND: ClassVar[str] = "Render"
    what: RenderWhat
    project: str | None = None
    zone: str | None = None
    request: dict[str, Any] | None = None
    startup_script: str | None = None
    gcloud: str | None = None
    api: str = "tpu"
    requests: list[dict[str, Any]] | None = None
