"""Orchestration, the only layer that combines the others: job control, up, drill, report."""
