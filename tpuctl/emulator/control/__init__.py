"""The emulator's control plane: what Cloud TPU keeps and decides. Queued resources and nodes
(state.py, records.py), their allowed state changes (transitions.py) and the flows that drive
them over time (flows.py, runtime.py), long-running operations, capacity, injected faults,
request validation, the catalog of accelerator types and locations, the event log, the clock,
and the emulator's configuration.

It reaches the simulated VMs only through the WorkerPlaneAPI Protocol (plane.py), and imports
from vms/ nothing but the metadata server's names and ports."""
