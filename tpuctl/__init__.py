"""tpuctl: orchestrate Google Cloud TPU Queued Resources from one YAML job spec."""

__version__ = "0.1.0"
