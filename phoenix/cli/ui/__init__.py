"""`phoenix ui`: a read-only page drawing each pipeline as its DAG, live, from the PhoenixStages' status and their
Redis (docs/pipelines.md, "Live view")."""
