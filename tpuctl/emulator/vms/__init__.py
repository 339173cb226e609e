"""The emulator's simulated TPU VMs: the worker plane (workers.py) with its nodes and workers
(plane_nodes.py), each a loopback address with a real SSH server (asyncssh in process, or
OpenSSH's sshd), a GCE-style metadata server, processes that carry markers (vm.py), who may
log in (access.py) and the firewall of a worker with no external IP (firewall.py).

Imports nothing else of the emulator: the control plane drives it through control/plane.py."""
