"""A PhoenixStage's life in the operator, one verb a module: reconcile (create, change), delete, the requests people
make by annotation, its children (Deployment, KEDA objects, PDB) and their drift, and the two loops over every
stage: the converger (repairs, requests, KEDA re-checks) and the status refresh (queue figures)."""
