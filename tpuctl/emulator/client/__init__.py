"""The emulator's clients: AdminClient (admin.py), which injects faults and reads events over
the admin gRPC service, and EmulatorProcess (testing.py), which starts `tpuctl emulator start`
as a child process for tests, benchmarks and drills, and gcloud.py, the settings that point the
real gcloud at one.

Imports nothing else of the emulator: it talks to one over the network."""
