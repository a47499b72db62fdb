"""Everything about a PhoenixStage's status: the conditions (conditions, readiness, durability), how status is
written (writer, patcher) and the periodic refresh (refresh). What the operator remembers of each stage between
events is not status: it is operator/stage_record.py."""
