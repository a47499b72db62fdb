"""Pure status logic for what can hold records back or lose them: the Backpressure and RedisRisk conditions."""

from __future__ import annotations

from phoenix.crds import Condition, ConditionType
from phoenix.operator.status.conditions import new_condition
from phoenix.worker_runtime.redis_risk import RedisRisk


def backpressure_condition(unfinished: int | None, generation: int | None = None) -> Condition:
    """True while a worker of the stage reports it stopped reading (`unfinished`: its output's unfinished entries)."""
    if unfinished is None:
        return new_condition(
            ConditionType.BACKPRESSURE,
            False,
            "OutputBelowHighWater",
            "the stage reads its input",
            observed_generation=generation,
        )
    message = (
        f"the output stream holds {unfinished} unfinished entries, over OUTPUT_HIGH_WATER: the stage "
        "stopped reading its input until the next stage catches up"
    )
    return new_condition(
        ConditionType.BACKPRESSURE, True, "OutputOverHighWater", message, observed_generation=generation
    )


def redis_risk_condition(risk: RedisRisk, generation: int | None = None) -> Condition:
    """True when the server's settings can lose acknowledged data; Unknown when it refused to tell."""
    if not risk.checked:
        return new_condition(
            ConditionType.REDIS_RISK, None, "CannotCheck", risk.describe(), observed_generation=generation
        )
    if risk.problems:
        return new_condition(
            ConditionType.REDIS_RISK, True, "DataLossPossible", risk.describe(), observed_generation=generation
        )
    return new_condition(ConditionType.REDIS_RISK, False, "Durable", risk.describe(), observed_generation=generation)
