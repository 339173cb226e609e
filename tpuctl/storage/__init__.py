"""Checkpoint directories (local or gs://), the Orbax layout, the job journal, job logs."""
