"""No-op workers of other Python task queues, run by `make bench-peers` from their own virtualenv (.cache/)."""
