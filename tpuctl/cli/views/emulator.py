"""The emulator's admin replies as results, and how they read: status, faults, capacity.

The emulator is tpuctl's test double of Cloud TPU, driven through its own admin service; these
results carry that service's JSON replies as they are (their keys are in docs/output.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpuctl.cli.format import Style
from tpuctl.cli.views.table import Column, render
from tpuctl.envelope import Result

POOL_COLUMNS = (
    Column("GENERATION", identity=True),
    Column("USED", align="right"),
    Column("TOTAL", align="right"),
)
QR_COLUMNS = (
    Column("NAME", identity=True),
    Column("STATE"),
    Column("NODES", align="right"),
    Column("ACCELERATOR"),
)


@dataclass
class AdminReply(Result):
    KIND: ClassVar[str] = "EmulatorReply"
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


@dataclass
class EmulatorStatus(AdminReply):
    KIND: ClassVar[str] = "EmulatorStatus"


@dataclass
class EmulatorFault(AdminReply):
    """What a fault command did (preempt, fail-slice, maintenance, ssh-fault, api-fault)."""

    KIND: ClassVar[str] = "EmulatorFault"


@dataclass
class EmulatorCapacity(AdminReply):
    """Chips per generation pool: {"pools": {"v4": {"total", "used", "free"}, …}}."""

    KIND: ClassVar[str] = "EmulatorCapacity"

    def to_dict(self) -> dict[str, Any]:
        return {"pools": dict(self.data)}


def status_view(result: EmulatorStatus, style: Style) -> str:
    data = result.data
    text = f"emulator {data['host']}, ssh port {data['ssh_port']}, speed {data['speed']}\n"
    text += capacity_view(EmulatorCapacity(data["capacity"]), style)
    rows = [
        [qr["name"], qr["state"], qr["nodes"], qr["accelerator_type"]]
        for qr in data["queued_resources"]
    ]
    if rows:
        text += render(QR_COLUMNS, rows, width=style.width)
    faults = data["api_faults"]
    pending = ", ".join(f"{key} {value}" for key, value in faults.items()) or "none"
    return text + f"workers: {data['workers']}; api faults: {pending}\n"


def fault_view(result: EmulatorFault, _style: Style) -> str:
    return "".join(f"{key}: {value}\n" for key, value in result.data.items())


def capacity_view(result: EmulatorCapacity, style: Style) -> str:
    rows = [[gen, pool["used"], pool["total"]] for gen, pool in result.data.items()]
    return render(POOL_COLUMNS, rows, width=style.width)
