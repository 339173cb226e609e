"""The emulator's public face: the gRPC services clients call (Tpu, Operations, Locations in
service.py; OS Login; the admin service for faults and capacity), the Compute REST stub, and
server.py, which assembles them with a control plane and a worker plane on one port.

Imports control/ and vms/; nothing imports it but the CLI (`tpuctl emulator start`) and tests."""
