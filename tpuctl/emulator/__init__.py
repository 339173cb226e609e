"""A local Cloud TPU: the v2alpha1 gRPC API, simulated TPU VMs over real SSH, and faults.

Its parts, each importing only those after it:
  client/   what tests, the CLI and drills use to start and steer an emulator (no server code)
  api/      the gRPC services and the server that assembles everything (`tpuctl emulator start`)
  control/  the control plane: queued resources, nodes, operations, their states and faults
  vms/      the simulated TPU VMs: worker plane, SSH servers, metadata server, access, firewall
"""
