"""Everything about a PhoenixStage's status: what the operator remembers of each stage (registry), the conditions
(conditions, readiness), how status is written (writer, patcher) and the periodic refresh (refresh)."""
