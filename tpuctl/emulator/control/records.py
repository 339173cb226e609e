"""Records of the emulator's queued resources, nodes and operations, and their state names.

Plain data: which state changes are allowed, and who makes them, is transitions.py's business.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.cloud.tpu_v2alpha1.types import cloud_tpu
from google.protobuf.message import Message
from google.rpc import status_pb2

from tpuctl.emulator.control.plane import WorkerInfoLike
from tpuctl.emulator.control.validation import CreatePlan
from tpuctl.topology import Accelerator

QrState = cloud_tpu.QueuedResourceState.State
Initiator = cloud_tpu.QueuedResourceState.StateInitiator
NodeState = cloud_tpu.Node.State
Health = cloud_tpu.Node.Health

PREEMPTIBLE_TIERS = ("spot", "best-effort")
Extras = dict[str, Any]
"""Fields the REST API carries and the gRPC client's messages lack (provisioningModel,
runDuration, bootDiskConfig.diskSizeGb, …), as JSON laid out like the resource's own JSON
(`{"tpu": {"nodeSpec": [{"node": {"bootDiskConfig": {"diskSizeGb": "100"}}}]}}`); lists hold
an entry per element of the resource's list, `{}` where an element has none."""


@dataclass
class OperationRecord:
    name: str
    target: str
    verb: str
    create_time: datetime
    end_time: datetime | None = None
    done: bool = False
    response: Message | None = None
    error: status_pb2.Status | None = None
    cancel_requested: bool = False
    status_detail: str = ""
    # The response's fields only the REST API carries, as a JSON overlay (see Extras below).
    response_extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class NodeRecord:
    name: str
    node_id: str  # its key in the worker plane: the node id, qualified when reused elsewhere
    parent: str
    qr_name: str
    slice_index: int
    num_slices: int
    template: cloud_tpu.Node  # as sent; metadata, labels, tags, description updated in place
    accelerator: Accelerator
    preemptible: bool
    tier: str
    numeric_id: int
    create_time: datetime
    state: int = NodeState.CREATING  # changed only through transitions.set_node_state
    health: int = Health.HEALTH_UNSPECIFIED
    workers: list[WorkerInfoLike] = field(default_factory=list)
    in_plane: bool = False  # the worker plane holds its VMs
    # Workers whose host key is not in the guest attributes (the hostkey fault "missing").
    unpublished_host_keys: set[int] = field(default_factory=set)
    metadata_version: int = 0
    maintenance: cloud_tpu.UpcomingMaintenance | None = None
    extras: Extras = field(default_factory=dict)  # its template's REST-only fields
    termination_time: datetime | None = None  # when the service takes it back

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.template.metadata)


@dataclass
class QueuedResourceRecord:
    plan: CreatePlan
    spec: cloud_tpu.QueuedResource  # as sent, with name and create_time set
    node_names: list[str]
    create_time: datetime
    state: int = QrState.CREATING  # changed only through transitions.set_qr_state
    initiator: int = Initiator.STATE_INITIATOR_UNSPECIFIED
    error: status_pb2.Status | None = None
    # Bumped by every action that supersedes the running flow; see runtime.py.
    epoch: int = 0
    delete_operation: str | None = None
    flow_lock: threading.Lock = field(default_factory=threading.Lock)
    extras: Extras = field(default_factory=dict)  # the REST-only fields as sent
    # The end of its run duration, fixed when provisioning starts (runDuration.terminationTime),
    # and when the service takes the nodes back: that, or its reservation's end if earlier.
    run_end: datetime | None = None
    termination_time: datetime | None = None

    @property
    def name(self) -> str:
        return self.plan.name
