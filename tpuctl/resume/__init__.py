"""Resume: reading checkpoint directories (local or gs://) and the job-level paths tpuctl keeps.

Import the submodules: `tpuctl.resume.checkpoints` and `tpuctl.resume.storage`.
"""
