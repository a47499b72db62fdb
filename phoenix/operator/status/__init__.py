"""Everything about a PhoenixStage's status: the conditions (conditions, readiness, durability) and how status is
written (writer; its HTTP patch is kube/status_patcher.py). The periodic refresh of the queue figures is a loop
over every stage, stage/refresh.py; what the operator remembers of each stage between events is not status:
it is operator/record.py."""
