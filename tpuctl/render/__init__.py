"""Pure functions from a Spec to what tpuctl sends: the request, the startup script, gcloud."""
