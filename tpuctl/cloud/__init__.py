"""The Cloud TPU API: clients, retries, the queued-resource watcher and recovery."""
