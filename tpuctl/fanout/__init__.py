"""SSH fan-out to every worker of every slice of a queued resource."""
