"""The job spec: typed model, YAML loading with positions, strict keys, JSON Schema."""
