"""A local Cloud TPU: the v2alpha1 gRPC API, simulated TPU VMs over real SSH, and faults."""
