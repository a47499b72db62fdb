"""The operator's side of Redis: the stage's connection from its Secrets (target), the shared clients (pool) and
the work it does there (ops: DLQ replay requests, the deletion of a stage's own keys, delete_owned.lua)."""
