"""Which state changes the emulator makes, as tables, and the two setters that apply them.

Every change of a queued resource's or a node's state goes through `set_qr_state` or
`set_node_state`, which refuse a change their table does not list. Each row says why the
change happens and which code makes it (module.function; `state` is the CloudTpu facade), so
"where may a QR go from ACTIVE to SUSPENDING?" is answered here. QRs and nodes are born
CREATING (records.py); DELETING is final (the record is then removed), and a FAILED or
SUSPENDED QR can only be deleted.
"""

from __future__ import annotations

from typing import NamedTuple

from tpuctl.emulator.control.events import EventLog
from tpuctl.emulator.control.records import (
    Initiator,
    NodeRecord,
    NodeState,
    QrState,
    QueuedResourceRecord,
)


class Transition(NamedTuple):
    source: int
    target: int
    why: str  # what happened, and the code that makes the change


class IllegalTransition(RuntimeError):
    """A state change no table row allows: a bug in the emulator, never a client's mistake."""


_DELETE_QR = "DeleteQueuedResource (state.delete_queued_resource)"
_LOSE_RESOURCES = (
    "spot/best-effort preempted by the admin or a capacity reclaim (faults.begin_preemption),"
    " one of its nodes deleted (state.delete_node), or its run duration or reservation ended"
    " (flows.run_out)"
)

QR_TRANSITIONS: tuple[Transition, ...] = (
    # Creation, in order.
    Transition(
        QrState.CREATING,
        QrState.WAITING_FOR_RESOURCES,
        "the create delay passed; the create operation ends here (flows.create)",
    ),
    Transition(
        QrState.WAITING_FOR_RESOURCES,
        QrState.PROVISIONING,
        "capacity allocated once valid_after and the least wait passed (flows.provision)",
    ),
    Transition(
        QrState.PROVISIONING,
        QrState.ACTIVE,
        "every VM created and booted (flows.provision)",
    ),
    # Failures.
    Transition(
        QrState.WAITING_FOR_RESOURCES,
        QrState.FAILED,
        "valid_until passed before the capacity was free (flows.await_capacity)",
    ),
    Transition(
        QrState.PROVISIONING,
        QrState.FAILED,
        "the worker plane could not create the VMs (flows.provision)",
    ),
    # Losing the resources: preemption (initiator SERVICE) or a deleted node (USER).
    Transition(
        QrState.PROVISIONING,
        QrState.SUSPENDING,
        _LOSE_RESOURCES,
    ),
    Transition(
        QrState.ACTIVE,
        QrState.SUSPENDING,
        _LOSE_RESOURCES,
    ),
    Transition(
        QrState.SUSPENDING,
        QrState.SUSPENDED,
        "the VMs are stopped (or deleted) and the capacity released (flows.preempt, "
        "flows.delete_node, flows.take_back)",
    ),
    # Deletion, from any state it can be found in (without force only when it has no nodes
    # or is SUSPENDED or FAILED; a second delete returns the first one's operation).
    Transition(QrState.CREATING, QrState.DELETING, _DELETE_QR),
    Transition(QrState.WAITING_FOR_RESOURCES, QrState.DELETING, _DELETE_QR),
    Transition(QrState.PROVISIONING, QrState.DELETING, _DELETE_QR),
    Transition(QrState.ACTIVE, QrState.DELETING, _DELETE_QR),
    Transition(QrState.SUSPENDING, QrState.DELETING, _DELETE_QR),
    Transition(QrState.SUSPENDED, QrState.DELETING, _DELETE_QR),
    Transition(QrState.FAILED, QrState.DELETING, _DELETE_QR),
)

_DELETE_NODE = (
    "its QR or the node itself deleted (state.delete_queued_resource, state.delete_node), or "
    "its QR's run ended (flows.run_out)"
)
_PREEMPT_NODE = "its QR preempted (flows.preempt)"
_STOP_NODE = "a sibling node was deleted, so its QR is suspended (flows.delete_node)"

# A node "moving" to the state it is in is no transition: the setters allow it (health may
# change, as when a READY node under maintenance comes back HEALTHY) and emit nothing.
NODE_TRANSITIONS: tuple[Transition, ...] = (
    Transition(NodeState.CREATING, NodeState.READY, "its VMs booted (flows.provision)"),
    # Restarts: reset, maintenance and repair stop every VM of the QR and boot them again.
    Transition(
        NodeState.READY,
        NodeState.RESTARTING,
        "a reset, maintenance or slice repair restarts every VM of its QR (flows.restart,"
        " faults.fail_slice)",
    ),
    Transition(
        NodeState.READY,
        NodeState.REPAIRING,
        "its slice failed (faults.fail_slice)",
    ),
    Transition(
        NodeState.RESTARTING,
        NodeState.REPAIRING,
        "its slice failed during a restart (faults.fail_slice)",
    ),
    Transition(
        NodeState.REPAIRING,
        NodeState.RESTARTING,
        "a later reset or slice failure superseded its repair (flows.restart, faults.fail_slice)",
    ),
    Transition(
        NodeState.RESTARTING,
        NodeState.READY,
        "the restart booted its VMs (flows.restart)",
    ),
    Transition(
        NodeState.REPAIRING,
        NodeState.READY,
        "the repair booted its fresh VMs (flows.restart)",
    ),
    # StopNode and StartNode (reset, repair and maintenance wait until no node is stopped).
    Transition(NodeState.READY, NodeState.STOPPING, "StopNode (state.stop_node)"),
    Transition(
        NodeState.STOPPING,
        NodeState.STOPPED,
        "its VMs shut down (flows.stop), or a sibling node was deleted (flows.delete_node)",
    ),
    Transition(NodeState.STOPPED, NodeState.STARTING, "StartNode (state.start_node)"),
    Transition(NodeState.STARTING, NodeState.READY, "its VMs booted (flows.start)"),
    # Losing the resources.
    Transition(NodeState.CREATING, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.READY, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.RESTARTING, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.REPAIRING, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.STOPPING, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.STOPPED, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.STARTING, NodeState.PREEMPTED, _PREEMPT_NODE),
    Transition(NodeState.CREATING, NodeState.STOPPED, _STOP_NODE),
    Transition(NodeState.READY, NodeState.STOPPED, _STOP_NODE),
    Transition(NodeState.RESTARTING, NodeState.STOPPED, _STOP_NODE),
    Transition(NodeState.REPAIRING, NodeState.STOPPED, _STOP_NODE),
    Transition(NodeState.STARTING, NodeState.STOPPED, _STOP_NODE),
    # Deletion, from every state but DELETING.
    Transition(NodeState.CREATING, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.READY, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.RESTARTING, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.REPAIRING, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.PREEMPTED, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.STOPPING, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.STOPPED, NodeState.DELETING, _DELETE_NODE),
    Transition(NodeState.STARTING, NodeState.DELETING, _DELETE_NODE),
)

_QR_TABLE = {(row.source, row.target): row for row in QR_TRANSITIONS}
_NODE_TABLE = {(row.source, row.target): row for row in NODE_TRANSITIONS}


def qr_transition(source: int, target: int) -> Transition:
    """The QR_TRANSITIONS row for `source` → `target`; IllegalTransition when there is none."""
    row = _QR_TABLE.get((source, target))
    if row is None:
        raise IllegalTransition(
            f"a queued resource may not go from {QrState(source).name} to "
            f"{QrState(target).name} (see QR_TRANSITIONS)"
        )
    return row


def node_transition(source: int, target: int) -> Transition:
    """The NODE_TRANSITIONS row for `source` → `target`; IllegalTransition when there is none."""
    row = _NODE_TABLE.get((source, target))
    if row is None:
        raise IllegalTransition(
            f"a node may not go from {NodeState(source).name} to {NodeState(target).name} "
            "(see NODE_TRANSITIONS)"
        )
    return row


def set_qr_state(
    qr: QueuedResourceRecord,
    state: int,
    events: EventLog,
    initiator: int = Initiator.STATE_INITIATOR_UNSPECIFIED,
) -> None:
    """Move `qr` to `state` (checked against QR_TRANSITIONS) and log a qr.state event."""
    qr_transition(qr.state, state)
    qr.state = state
    qr.initiator = initiator
    events.emit("qr.state", qr=qr.name, detail=QrState(state).name)


def set_node_state(
    node: NodeRecord, state: int, events: EventLog, health: int | None = None
) -> None:
    """Move `node` to `state` (checked against NODE_TRANSITIONS unless it is already there),
    set its health if given, and log a node.state event when the state changed."""
    changed = node.state != state
    if changed:
        node_transition(node.state, state)
    node.state = state
    if health is not None:
        node.health = health
    if changed:
        events.emit("node.state", qr=node.qr_name, node=node.name, detail=NodeState(state).name)
